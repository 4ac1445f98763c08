"""The sm_100a fast kernel's pairing of bytes and scales, read back from the operands of its PTX.

Test code (tests/test_decode_models.py): `hw_pairing_from_ptx` follows every register of the
hardware-decode fast kernel's PTX back to the loads it came from, and `expected_hw_pairing` is what
it finds if the kernel pairs A bytes, B bytes and scale bytes as the model says
(`nvfp4lib.study.decode_models.HW_BLOCK`). PTX is parsed with `nvfp4lib.study.ptx_reading`.
"""

from __future__ import annotations

import re
from collections import defaultdict

from nvfp4lib.study.decode_models import HW_BLOCK
from nvfp4lib.study.ptx_reading import instructions, operands, registers

_REGISTER = re.compile(r"%?[A-Za-z_][\w$]*")


class _Dataflow:
    """Where the values of the hardware-decode fast kernel's PTX come from.

    Loads are identified by their place in a stage: per unroll step u, B's 16 bytes then its scales,
    then for each row r A's 16 bytes and scales (as cute.gemv stages them); the prologue and the loop body
    each issue one stage. A register written in several places (a loop-carried value, or a
    predicated load and the zero it defaults to) must come from one load either way.
    """

    def __init__(self, ptx: str, rows: int, unroll: int):
        self.ins = instructions(ptx)
        self.rows, self.unroll = rows, unroll
        self.defs: dict[str, list[int]] = defaultdict(list)
        self.loads: dict[int, tuple] = {}
        per_stage = unroll * (rows + 1)
        counters = {"v4": 0, "u16": 0}
        for index, (op, args) in enumerate(self.ins):
            if op.startswith(("st.", "bra", "ret", "setp", "bar")):
                continue
            parts = operands(args)
            if parts:
                for name in registers(parts[0]):
                    self.defs[name].append(index)
            if op.startswith("ld.global"):
                kind = "v4" if ".v4." in op else "u16"
                position = counters[kind] % per_stage
                counters[kind] += 1
                u, q = divmod(position, rows + 1)
                role = "B" if q == 0 else "A"
                if kind == "v4" and (role == "A") != ("L1::no_allocate" in op):
                    raise ValueError(f"load {counters[kind] - 1} ({op}) is not where a stage puts {role}'s load")
                self.loads[index] = (role, q - 1 if q else None, u)
        if counters["v4"] != 2 * per_stage or counters["u16"] != 2 * per_stage:
            raise ValueError(f"expected 2 stages of {per_stage} 128-bit and 16-bit loads, found {counters}")

    def origin(self, name: str, at: int):
        """What the value of `name` read by instruction `at` is, as a nested tuple."""
        if not _REGISTER.fullmatch(name):
            return ("const", name)
        defs = self.defs.get(name, [])
        if not name.startswith("%"):  # an inline-asm block's own name: its latest definition
            defs = [max(i for i in defs if i < at)]
        found = {self._origin_of(i, name) for i in defs}
        if len(found) > 1:
            found.discard(("const", "0"))  # the default of a predicated load
        if len(found) != 1:
            raise ValueError(f"{name} (read by instruction {at}) has several origins: {sorted(map(str, found))}")
        return found.pop()

    def _origin_of(self, index: int, name: str):
        op, args = self.ins[index]
        parts = operands(args)
        written = registers(parts[0])
        if index in self.loads:
            role, row, u = self.loads[index]
            return ("load", role, row, u, written.index(name)) if ".v4." in op else ("scales", role, row, u)
        if op in ("mov.b32", "mov.b16"):
            if parts[0].startswith("{"):
                return ("part", self.origin(parts[1], index), written.index(name))
            return self.origin(parts[1], index)
        if op in ("cvt.rn.f16x2.e2m1x2", "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "cvt.rn.f16.f32"):
            return (op, self.origin(parts[1], index))
        if op == "fma.rn.f16x2":
            return (op, *(self.origin(x, index) for x in parts[1:]))
        if op in ("add.f32", "mul.f32"):
            return (op, frozenset(self.origin(x, index) for x in parts[1:]))
        return ("other", op)


def _cvt_byte(origin) -> tuple:
    """(role, row, u, word, byte) of the FP4 byte a ``cvt.rn.f16x2.e2m1x2`` result decodes."""
    op, part = origin
    if op != "cvt.rn.f16x2.e2m1x2" or part[0] != "part" or part[1][0] != "load":
        raise ValueError(f"not the hardware decode of a loaded byte: {origin}")
    _, role, row, u, word = part[1]
    return role, row, u, word, part[2]


def _scale_half(origin) -> tuple:
    """(role, row, u, half) of the scale a ``cvt.f32.f16`` of a ``cvt.rn.f16x2.e4m3x2`` half is."""
    op, part = origin
    if op != "cvt.f32.f16" or part[0] != "part" or part[1][0] != "cvt.rn.f16x2.e4m3x2":
        raise ValueError(f"not a decoded scale: {origin}")
    _, role, row, u = part[1][1]
    return role, row, u, part[2]


def _fma_chain(origin) -> list:
    """The (A operand, B operand) of each ``fma.rn.f16x2`` of a chain that starts from 0, in order."""
    chain = []
    while origin != ("const", "0"):
        op, a, b, acc = origin
        if op != "fma.rn.f16x2":
            raise ValueError(f"a block sum that is not a chain of fma.rn.f16x2 from 0: {origin}")
        chain.append((_cvt_byte(a), _cvt_byte(b)))
        origin = acc
    return chain[::-1]


def hw_pairing_from_ptx(ptx: str, rows: int, unroll: int) -> set:
    """The pairing the sm_100a fast kernel's PTX computes, one entry per block of every (row, unroll
    step): (r, u, A's scale (row, u, half), B's scale (u, half), ((A word, byte), (B word, byte)) of
    each fma in order). Read from the operands of every ``fma.rn.f32 d, p, s, acc``: p is a product
    of two decoded scale halves, s the lo + hi of a chain of ``fma.rn.f16x2`` over decoded bytes."""
    flow = _Dataflow(ptx, rows, unroll)
    found = set()
    for index, (op, args) in enumerate(flow.ins):
        if op != "fma.rn.f32":
            continue
        _, p, s, _ = operands(args)
        scale_op, scales = flow.origin(p, index)
        sum_op, halves = flow.origin(s, index)
        if scale_op != "mul.f32" or sum_op != "add.f32" or len(scales) != 2 or len(halves) != 2:
            raise ValueError(f"instruction {index}: fma.rn.f32 of {scale_op} and {sum_op}, not a scaled block sum")
        by_role = {h[0]: h for h in map(_scale_half, scales)}
        parts = sorted((h[1][2], h[1][1]) for h in halves if h[0] == "cvt.f32.f16" and h[1][0] == "part")
        if set(by_role) != {"A", "B"} or [i for i, _ in parts] != [0, 1] or parts[0][1] != parts[1][1]:
            raise ValueError(f"instruction {index}: not A's scale x B's scale x (lo + hi) of one fp16 block sum")
        chain = _fma_chain(parts[0][1])
        a_loads = {a[:3] for a, _ in chain}  # (role, row, u)
        b_loads = {b[:3] for _, b in chain}
        if len(a_loads) != 1 or len(b_loads) != 1 or a_loads.pop()[0] != "A" or b_loads.pop()[0] != "B":
            raise ValueError(f"instruction {index}: a block's first operands are not one load of A and its "
                             f"second operands one load of B: {chain}")
        row, u = chain[0][0][1], chain[0][0][2]
        _, sa_row, sa_u, sa_half = by_role["A"]
        _, _, sb_u, sb_half = by_role["B"]
        found.add((row, u, (sa_row, sa_u, sa_half), (sb_u, sb_half),
                   tuple(((a[3], a[4]), (b[3], b[4])) for a, b in chain)))
    return found


def expected_hw_pairing(rows: int, unroll: int) -> set:
    """`hw_pairing_from_ptx`'s answer if the kernel pairs bytes and scales as `HW_BLOCK` says."""
    return {(r, u, (r, u, j), (u, j), tuple(((2 * j + wa, ia), (2 * j + wb, ib)) for (wa, ia), (wb, ib) in HW_BLOCK))
            for r in range(rows) for u in range(unroll) for j in range(2)}
