"""The batched NVFP4 GEMV problem: shapes, byte counts, and the input generator.

generate_input builds the leaderboard's 7-tuple with exactly its shapes, dtypes and strides, but
(in the default "full" mode) with data that exercises every E2M1 code in both nibbles and, given enough scale
blocks, every finite E4M3 scale in both sfa and sfb, which the leaderboard's own data does not."""

from __future__ import annotations

import numbers

import torch

from nvfp4lib.contract import BLOCK_SIZE, B_ROWS, GemvInput, NVFP4InputError, Shape
from nvfp4lib.formats import decode_e4m3
from nvfp4lib.layouts import to_permuted


TEST_SHAPES = [Shape(*s) for s in (
    (128, 256, 1), (128, 1536, 1), (128, 3072, 1), (256, 7168, 1), (2432, 4608, 2),
    (384, 7168, 2), (512, 512, 2), (512, 4096, 2), (512, 1536, 2))]
EXTRA_SHAPES = [Shape(*s) for s in (
    (128, 64, 1), (128, 192, 3), (1024, 4096, 8), (16384, 1024, 8), (16384, 2048, 8))]
"""Beyond the leaderboard's: the smallest K (64: the 4 scale columns of one atom), a K that is not a
multiple of 128, and large M with many batches; kernel tests and the sanitizer run these too."""
BENCHMARK_SHAPES = [Shape(7168, 16384, 1), Shape(4096, 7168, 8), Shape(7168, 2048, 4)]
B200_SPEED_OF_LIGHT_US = {
    Shape(7168, 16384, 1): 8.622, Shape(4096, 7168, 8): 17.275, Shape(7168, 2048, 4): 4.317}

MODES = ("full", "leaderboard")
# "full" mode's scales. Every K block (one scale column) is either "A-wide": sfa draws from every
# finite E4M3 code (both signs, zeros, subnormals, up to 448) and sfb from the narrow codes, or
# "B-wide", the other way round; half of each per batch. The narrow codes are E4M3's zeros and
# subnormals (|s| <= 7 * 2^-9), which also pairs every subnormal with large partners. Bounds:
# - a product of scales is at most 448 * 7 * 2^-9 = 6.125, a block term (scales times the sum of
#   16 code products, |sum| <= 576) at most 3528, each exact in fp32;
# - with random codes a block's code sum has rms 34.25, the wide scales rms 100.1, the narrow
#   ones rms 0.0082, so a block term has rms 28 and c (n = K/16 terms) a standard deviation of
#   28 * sqrt(n): 896 at K = 16384, the largest |c| of the test and benchmark shapes about 3700,
#   far inside fp16's 65504;
# - fp32 accumulation of the exact block terms rounds each partial sum (of the order of c) by at
#   most 2^-24 of it: relative to the sum of |terms| at most n * 2^-24 = 6e-5, 16x under rtol;
#   absolute (what matters where c cancels to near 0 and only atol = 1e-3 is left) about
#   0.3 * 2^-24 * sqrt(n) * 896 = 5e-4 for one sequential sum over all 1024 blocks of K = 16384.
#   Measured (3 seeds, every test and benchmark shape): the worst fp32 error is 0.11 of the
#   tolerance on the test shapes and 0.42 on the benchmark shapes for one sequential sum; 0.18
#   when 32 lanes split K and a tree adds their sums, as the CuTe kernels do.
_E4M3_VALUES = decode_e4m3(torch.arange(256, dtype=torch.uint8))
_FINITE_E4M3 = torch.arange(256, dtype=torch.uint8)[~torch.isnan(_E4M3_VALUES)]  # 254 codes
_NARROW_MAX = 7 * 2.0 ** -9
_NARROW_E4M3 = _FINITE_E4M3[_E4M3_VALUES[_FINITE_E4M3.long()].abs() <= _NARROW_MAX]
# The NVFP4 format's block scales are never negative, and Blackwell's block-scaled tensor cores and
# cuBLAS read them as unsigned (UE4M3): `negative_scales=False` keeps to the 127 codes with the
# sign bit clear, for checks of those paths and of submissions (the leaderboard's data has none).
_SIGN_BIT = 0x80


def bytes_moved(shape: Shape) -> int:
    """Bytes a GEMV must move at least: A codes + A scales + the B vector + its scales + c (fp16)."""
    m, k, l = shape
    return l * (m * k // 2 + m * k // BLOCK_SIZE + k // 2 + k // BLOCK_SIZE + 2 * m)


def _random_bytes(shape, mode: str, gen: torch.Generator) -> torch.Tensor:
    high = 256 if mode == "full" else 4
    return torch.randint(0, high, shape, generator=gen, dtype=torch.uint8)


def _leaderboard_scales(shape, gen: torch.Generator) -> torch.Tensor:
    """E4M3 bit patterns of the leaderboard's scales: values drawn from {0, 1, 2}."""
    values = torch.randint(0, 3, shape, generator=gen).float()
    return values.to(torch.float8_e4m3fn).view(torch.uint8)


def _every_code_at(mask: torch.Tensor, codes: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Codes for the True positions of `mask`, in row-major order: each run of len(codes)
    positions holds every one of `codes` once, in random order."""
    n = int(mask.sum())
    runs = -(-n // len(codes))
    order = torch.rand((runs, len(codes)), generator=gen).argsort(-1)
    return codes[order.reshape(-1)[:n]]


def _full_range_scales(l: int, m: int, k_blocks: int, gen: torch.Generator, negative_scales: bool):
    """(sfa, sfb) E4M3 bit patterns, (L, M, K/16) and (L, 128, K/16), with A-wide and B-wide
    K blocks (see the note above _E4M3_VALUES), half of each per batch, chosen at random."""
    wide, narrow = _FINITE_E4M3, _NARROW_E4M3
    if not negative_scales:
        wide, narrow = wide[wide < _SIGN_BIT], narrow[narrow < _SIGN_BIT]
    a_wide = torch.rand((l, 1, k_blocks), generator=gen).argsort(-1) < (k_blocks + 1) // 2
    sfa = narrow[torch.randint(len(narrow), (l, m, k_blocks), generator=gen)]
    mask = a_wide.expand(l, m, k_blocks)
    sfa[mask] = _every_code_at(mask, wide, gen)
    # sfb is filled row by row across the batches, so that row 0 (the vector; rows 1.. are
    # padding) alone receives every code once it has 254 B-wide blocks in all
    sfb = narrow[torch.randint(len(narrow), (B_ROWS, l, k_blocks), generator=gen)]
    mask = ~a_wide.transpose(0, 1).expand(B_ROWS, l, k_blocks)
    sfb[mask] = _every_code_at(mask, wide, gen)
    return sfa, sfb.transpose(0, 1).contiguous()


def generate_input(m: int, k: int, l: int, seed: int = 0, mode: str = "full", device="cpu", *,
                   negative_scales: bool = True):
    """Return (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c) as the leaderboard lays them out.
    `negative_scales=False` (full mode only) draws only the scale codes with the sign bit clear: the unsigned UE4M3
    scales of the NVFP4 format, which is all cuBLAS's FP4 GEMM reads.

    Random numbers are drawn on the CPU and then moved, so one seed gives identical data on every device. M need not
    be a multiple of 128 (scales are zero padded)."""
    if mode not in MODES:
        raise NVFP4InputError(f"mode: expected one of {MODES}, got {mode!r}")
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (m, k, l)):
        raise NVFP4InputError(f"(m, k, l): expected integers, got {(m, k, l)!r}")
    if m < 1 or l < 1 or k < 16 or k % 16:
        raise NVFP4InputError(f"(m, k, l): expected m, l >= 1 and k a positive multiple of 16, got {(m, k, l)}")
    gen = torch.Generator().manual_seed(seed)
    a_bytes = _random_bytes((l, m, k // 2), mode, gen)
    b_bytes = _random_bytes((l, B_ROWS, k // 2), mode, gen)
    if mode == "leaderboard":
        sfa_bytes = _leaderboard_scales((l, m, k // BLOCK_SIZE), gen)
        sfb_bytes = _leaderboard_scales((l, B_ROWS, k // BLOCK_SIZE), gen)
    else:
        sfa_bytes, sfb_bytes = _full_range_scales(l, m, k // BLOCK_SIZE, gen, bool(negative_scales))
    sign = torch.randint(0, 2, (l, m, 1), generator=gen) * 2 - 1
    c_values = (sign * (0.5 + torch.rand((l, m, 1), generator=gen))).half()

    def plain(buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return buffer.to(device).view(dtype).permute(1, 2, 0)

    a = plain(a_bytes, torch.float4_e2m1fn_x2)
    b = plain(b_bytes, torch.float4_e2m1fn_x2)
    sfa = plain(sfa_bytes, torch.float8_e4m3fn)
    sfb = plain(sfb_bytes, torch.float8_e4m3fn)
    c = plain(c_values, torch.float16)
    return GemvInput(a, b, sfa, sfb, to_permuted(sfa), to_permuted(sfb), c)
