"""Reading compiled PTX: which instructions a kernel got, how many of each, and where.

The CuTe kernels compile for any target without a GPU (``cute_gemv.compile_ptx``), so the PTX
is evidence that can be checked on any machine: whether a target decodes FP4 with the hardware
conversion or with integer bit operations, whether loads are 128 bits wide, how many shuffles
the warp reduction takes. Counts here are static (each instruction once, as written: a loop
body counts once however often it runs).
"""

from __future__ import annotations

import re
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


def excerpt(ptx: str, needle: str, before: int = 4, after: int = 12) -> str:
    """The lines around the first line containing ``needle``, comment-only lines left out."""
    lines = [ln.rstrip() for ln in ptx.splitlines() if _COMMENT.sub("", ln).strip()]
    hit = next((i for i, ln in enumerate(lines) if needle in ln), None)
    if hit is None:
        raise ValueError(f"needle: {needle!r} does not occur in the PTX")
    start, stop = max(0, hit - before), min(len(lines), hit + after + 1)
    return "\n".join(lines[start:stop])
