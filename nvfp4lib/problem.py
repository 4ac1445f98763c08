"""The batched NVFP4 GEMV problem: shapes, byte counts, and the input generator.

generate_input builds the leaderboard's 7-tuple with exactly its shapes, dtypes and strides,
but (in the default "full" mode) with data that exercises every E2M1 code in both nibbles
and many E4M3 exponents, which the leaderboard's own data does not.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from nvfp4lib.layouts import to_permuted
from nvfp4lib.validate import B_ROWS, NVFP4InputError


class Shape(NamedTuple):
    m: int
    k: int
    l: int


TEST_SHAPES = [Shape(*s) for s in (
    (128, 256, 1), (128, 1536, 1), (128, 3072, 1), (256, 7168, 1), (2432, 4608, 2),
    (384, 7168, 2), (512, 512, 2), (512, 4096, 2), (512, 1536, 2))]
BENCHMARK_SHAPES = [Shape(7168, 16384, 1), Shape(4096, 7168, 8), Shape(7168, 2048, 4)]
B200_SPEED_OF_LIGHT_US = {
    Shape(7168, 16384, 1): 8.622, Shape(4096, 7168, 8): 17.275, Shape(7168, 2048, 4): 4.317}

MODES = ("full", "leaderboard")
_ZERO_SCALE_PROBABILITY = 1 / 32
# E4M3 exponent fields (bias 7) drawn for the scales in "full" mode. Field 0 gives the
# subnormals; sfa reaches 2^6 * 1.875 and sfb stops at 2^-2 * 1.875 so that sums over
# K = 16384 stay well inside fp16 (typical |c| in the thousands, max 65504).
_SFA_EXPONENT_FIELDS = (0, 13)
_SFB_EXPONENT_FIELDS = (0, 5)


def bytes_moved(shape: Shape) -> int:
    """Bytes a GEMV must move at least: A codes + A scales + the B vector + its scales + c (fp16)."""
    m, k, l = shape
    return l * (m * k // 2 + m * k // 16 + k // 2 + k // 16 + 2 * m)


def _random_bytes(shape, mode: str, gen: torch.Generator) -> torch.Tensor:
    high = 256 if mode == "full" else 4
    return torch.randint(0, high, shape, generator=gen, dtype=torch.uint8)


def _random_scales(shape, mode: str, exponent_fields: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """E4M3 bit patterns: leaderboard {0, 1, 2}; full: random positive values and some zeros."""
    if mode == "leaderboard":
        values = torch.randint(0, 3, shape, generator=gen).float()
        return values.to(torch.float8_e4m3fn).view(torch.uint8)
    lo, hi = exponent_fields
    exponent = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.uint8)
    mantissa = torch.randint(0, 8, shape, generator=gen, dtype=torch.uint8)
    zero = torch.rand(shape, generator=gen) < _ZERO_SCALE_PROBABILITY
    return torch.where(zero, 0, (exponent << 3) | mantissa).to(torch.uint8)


def generate_input(m: int, k: int, l: int, seed: int = 0, mode: str = "full", device="cpu"):
    """Return (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c) as the leaderboard lays them out.

    Random numbers are drawn on the CPU and then moved, so one seed gives identical
    data on every device. M need not be a multiple of 128 (scales are zero padded).
    """
    if mode not in MODES:
        raise NVFP4InputError(f"mode: expected one of {MODES}, got {mode!r}")
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (m, k, l)):
        raise NVFP4InputError(f"(m, k, l): expected integers, got {(m, k, l)!r}")
    if m < 1 or l < 1 or k < 16 or k % 16:
        raise NVFP4InputError(f"(m, k, l): expected m, l >= 1 and k a positive multiple of 16, got {(m, k, l)}")
    gen = torch.Generator().manual_seed(seed)
    a_bytes = _random_bytes((l, m, k // 2), mode, gen)
    b_bytes = _random_bytes((l, B_ROWS, k // 2), mode, gen)
    sfa_bytes = _random_scales((l, m, k // 16), mode, _SFA_EXPONENT_FIELDS, gen)
    sfb_bytes = _random_scales((l, B_ROWS, k // 16), mode, _SFB_EXPONENT_FIELDS, gen)
    sign = torch.randint(0, 2, (l, m, 1), generator=gen) * 2 - 1
    c_values = (sign * (0.5 + torch.rand((l, m, 1), generator=gen))).half()

    def plain(buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return buffer.to(device).view(dtype).permute(1, 2, 0)

    a = plain(a_bytes, torch.float4_e2m1fn_x2)
    b = plain(b_bytes, torch.float4_e2m1fn_x2)
    sfa = plain(sfa_bytes, torch.float8_e4m3fn)
    sfb = plain(sfb_bytes, torch.float8_e4m3fn)
    c = plain(c_values, torch.float16)
    return a, b, sfa, sfb, to_permuted(sfa), to_permuted(sfb), c
