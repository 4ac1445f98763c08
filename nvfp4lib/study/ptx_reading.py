"""Reading compiled PTX: which instructions a kernel got, how many of each, and where.

The CuTe kernels compile for any target without a GPU (`nvfp4lib.cute.gemv.compile_ptx` and
`compile_cubin`), so the PTX is evidence that can be checked on any machine: whether a target
decodes FP4 with the hardware conversion, a register lookup or integer bit operations, whether
loads are 128 bits wide, how many shuffles the warp reduction takes; the cubin says how many
registers ptxas gave the kernel and whether it spilled. Counts here are static (each
instruction once, as written: a loop body counts once however often it runs).
"""

from __future__ import annotations

import re
import struct
from collections import Counter

_COMMENT = re.compile(r"//.*")
_PREDICATE = re.compile(r"^@!?%?\w+\s+")
_OPCODE = re.compile(r"^[a-z][a-z0-9_]*(\.[A-Za-z0-9_:]+)*$")

# (kind, pattern on the opcode); the first match wins, unmatched opcodes are "other".
KINDS = (
    ("FP4 convert (cvt e2m1x2)", re.compile(r"^cvt\..*e2m1")),
    ("FP8 convert (cvt e4m3x2)", re.compile(r"^cvt\..*e4m3")),
    ("integer bit ops", re.compile(r"^(shl|shr|and|or|xor|not|prmt|lop3|bfe|bfi)\.(?!pred)")),
    ("packed fp16 math", re.compile(r"^(fma|add|mul|sub)\.[\w.]*f16x2$")),
    ("integer dot products (dp4a)", re.compile(r"^dp[24]a\.")),
    ("fp32 math", re.compile(r"^(fma|add|mul|sub)\.[\w.]*f32$")),
    ("global loads", re.compile(r"^ld\.global")),
    ("warp shuffles", re.compile(r"^shfl\.")),
)
OTHER = "other (moves, addresses, control)"


def instructions(ptx: str) -> list[tuple[str, str]]:
    """Every instruction in order, inline-asm blocks included, as (opcode, operands).

    Directives (``.reg``, ``.param``...), labels, comments and braces are dropped, and a guard
    predicate (``@p``) is removed from the front.
    """
    found = []
    for line in ptx.splitlines():
        for statement in _COMMENT.sub("", line).split(";"):
            words = _PREDICATE.sub("", statement.strip().lstrip("{} \t")).split(None, 1)
            if words and _OPCODE.match(words[0]):
                found.append((words[0], words[1].strip() if len(words) > 1 else ""))
    return found


def operands(text: str) -> list[str]:
    """The operands of an instruction (the text after its opcode, as `instructions` gives it), split at
    the top-level commas: a vector ``{a, b}`` or an address ``[p+8]`` stays one operand."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "{[" and 1 or ch in "}]" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return parts + [current.strip()] if current.strip() else parts


def registers(operand: str) -> list[str]:
    """The names an operand holds: each element of a vector ``{a, b}``, else the operand itself."""
    return [name.strip() for name in operand.strip("{}").split(",")]


def opcode_counts(ptx: str) -> Counter:
    """How often each full opcode (e.g. ``ld.global.nc.v4.u32``) appears."""
    return Counter(op for op, _ in instructions(ptx))


def kind_of(opcode: str) -> str:
    """The kind of ``KINDS`` an opcode belongs to (the first whose pattern matches)."""
    return next((kind for kind, pattern in KINDS if pattern.match(opcode)), OTHER)


def kind_counts(ptx: str) -> dict[str, int]:
    """Instruction counts per kind of ``KINDS`` (all kinds present, in that order, then other)."""
    counts = Counter(kind_of(op) for op, _ in instructions(ptx))
    return {kind: counts.get(kind, 0) for kind in [k for k, _ in KINDS] + [OTHER]}


WORK = re.compile(r"^(ld\.global|st\.global|ld\.shared|st\.shared|bar\.|shfl\.sync\.bfly|cvt\.[\w.]*(e2m1|e4m3)|"
                  r"prmt|dp[24]a|(fma|add|mul|sub)\.[\w.]*(f16x2|f32)$)")
"""The opcodes that do a GEMV kernel's work: its memory accesses, barriers and reduction shuffles, FP4/FP8
conversions, lookups, integer products and floating-point math. Address arithmetic and moves are left out:
each CuTe DSL release lowers those through its own LLVM, in its own way."""


def work_counts(ptx: str) -> dict[str, int]:
    """How often each full opcode of `WORK` appears: what must match between two builds of one kernel."""
    return dict(sorted(Counter(op for op, _ in instructions(ptx) if WORK.match(op)).items()))


def excerpt(ptx: str, needle: str, before: int = 4, after: int = 12) -> str:
    """The lines around the first line containing ``needle``, comment-only lines left out."""
    lines = [ln.rstrip() for ln in ptx.splitlines() if _COMMENT.sub("", ln).strip()]
    hit = next((i for i, ln in enumerate(lines) if needle in ln), None)
    if hit is None:
        raise ValueError(f"needle: {needle!r} does not occur in the PTX")
    start, stop = max(0, hit - before), min(len(lines), hit + after + 1)
    return "\n".join(lines[start:stop])


# Attributes of a cubin's .nv.info section (ELF), per kernel: (format 0x04, code, size, symbol, value).
_EIATTR = {0x2F: "registers", 0x11: "frame_bytes", 0x12: "min_stack_bytes"}


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """Registers per thread and local-memory frame (spills) of the kernel in a cubin.

    Read from the ELF's ``.nv.info`` section, so no CUDA tool is needed: a frame of 0 bytes
    means no spills and no local arrays; the register count sets how many blocks fit per SM.
    """
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    for name_at, _, _, _, offset, size, *_ in headers:
        if cubin[names_at + name_at:cubin.index(b"\0", names_at + name_at)] == b".nv.info":
            info, found, i = cubin[offset:offset + size], {}, 0
            while i < len(info):
                fmt, code, length = info[i], info[i + 1], struct.unpack_from("<H", info, i + 2)[0]
                if fmt == 0x04 and code in _EIATTR and length == 8:
                    found[_EIATTR[code]] = struct.unpack_from("<I", info, i + 8)[0]
                i += 4 + (length if fmt == 0x04 else 0)
            return found
    raise ValueError("cubin: no .nv.info section (not a CUDA ELF?)")
