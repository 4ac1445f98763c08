"""The reference GEMV is exact: the true sum rounded once to float32, checked against integer
arithmetic written here from the bit definitions, on a cancellation that float32 accumulation gets
wrong and on random data with every FP4 code in both nibbles and every finite E4M3 scale."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from nvfp4lib import reference
from tests.bitdefs import e2m1_value, e4m3_value, round_to_float32
from tests.test_fuzz_formats import leaderboard_tuple, unpack_bytes

FINITE_SCALES = np.array([b for b in range(256) if not math.isnan(e4m3_value(b))], dtype=np.uint8)
CODE_UNITS = [int(2 * e2m1_value(c)) for c in range(16)]  # E2M1 values are n / 2
SCALE_UNITS = [None if math.isnan(e4m3_value(b)) else int(e4m3_value(b) * 2 ** 9) for b in range(256)]


def integer_gemv(a, b, sfa, sfb) -> np.ndarray:
    """float32 [M, L]: the exact sum in Python integers (units of 2^-20), rounded once; NaN where
    a scale the row uses is NaN. Inputs are byte arrays in storage order (L, rows, cols)."""
    l, m = a.shape[:2]
    out = np.zeros((m, l), dtype=np.float32)
    for batch in range(l):
        b_codes = unpack_bytes(b[batch, 0]).tolist()
        sb = [SCALE_UNITS[s] for s in sfb[batch, 0].tolist()]
        for row in range(m):
            sa = [SCALE_UNITS[s] for s in sfa[batch, row].tolist()]
            if None in sa or None in sb:
                out[row, batch] = np.nan
                continue
            total = sum(CODE_UNITS[x] * CODE_UNITS[y] * sa[k // 16] * sb[k // 16]
                        for k, (x, y) in enumerate(zip(unpack_bytes(a[batch, row]).tolist(), b_codes)))
            out[row, batch] = round_to_float32(Fraction(total, 2 ** 20))
    return out


def reference_of(a, b, sfa, sfb) -> np.ndarray:
    c = np.zeros((a.shape[0], a.shape[1], 1), dtype=np.float16)
    return reference.reference_gemv(leaderboard_tuple(a, b, sfa, sfb, c))[:, 0, :].numpy()


def same_floats(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, NaN where NaN."""
    nan = np.isnan(want)
    return np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.int32), want[~nan].view(np.int32))


def cancellation(big_blocks: int, small_a: int, small_b: int, small_scale: int):
    """One row: `big_blocks` blocks of +16 * 6 * 448 * 6 * 448, one block holding a single small
    term (codes small_a, small_b, both scales small_scale), then the big blocks negated. Returns
    (a, b, sfa, sfb) bytes and the terms in K order."""
    rng = np.random.default_rng(big_blocks)
    k_blocks = 2 * big_blocks + 1
    a = np.zeros((1, 1, 8 * k_blocks), dtype=np.uint8)
    b = rng.integers(0, 256, (1, 128, 8 * k_blocks), dtype=np.uint8)  # rows 1.. are padding: never read
    b[0, 0] = 0
    big, small = slice(0, 8 * big_blocks), 8 * big_blocks
    a[0, 0, big] = a[0, 0, small + 8:] = b[0, 0, big] = 0x77  # code 7 = 6.0 in both nibbles
    b[0, 0, small + 8:] = 0xFF  # code 15 = -6.0
    a[0, 0, small], b[0, 0, small] = small_a, small_b  # the low nibble: k = 16 * big_blocks
    sfa = np.full((1, 1, k_blocks), 0x7E, dtype=np.uint8)  # 448
    sfb = rng.choice(FINITE_SCALES, (1, 128, k_blocks))
    sfb[0, 0] = 0x7E
    sfa[0, 0, big_blocks] = sfb[0, 0, big_blocks] = small_scale
    terms = [e2m1_value(x) * e4m3_value(sfa[0, 0, k // 16]) * e2m1_value(y) * e4m3_value(sfb[0, 0, k // 16])
             for k, (x, y) in enumerate(zip(unpack_bytes(a[0, 0]), unpack_bytes(b[0, 0])))]
    return (a, b, sfa, sfb), terms


@pytest.mark.parametrize("big_blocks, small_a, small_b, small_scale, exact, lost_in", [
    # 1 * 2 at scales 1: after the first block a float32 running sum is 115605504, spaced 8 apart
    (1, 0x02, 0x04, 0x38, Fraction(2), (np.float32,)),
    # 0.5 * 0.5 at scales 2^-9, i.e. 2^-20: next to 2^38.8 float64 (spaced 2^-14) drops it, and
    # still next to 2^34.8 if the sum is split 16 ways (as vectorized dot products do)
    (4096, 0x01, 0x01, 0x01, Fraction(1, 2 ** 20), (np.float32, np.float64)),
])
def test_cancellation_that_floating_point_accumulation_loses(big_blocks, small_a, small_b, small_scale, exact,
                                                             lost_in):
    (a, b, sfa, sfb), terms = cancellation(big_blocks, small_a, small_b, small_scale)
    assert sum(Fraction(t) for t in terms) == exact
    for dtype in lost_in:
        assert np.cumsum(np.array(terms, dtype=dtype), dtype=dtype)[-1] == 0.0
    assert reference_of(a, b, sfa, sfb).tolist() == [[float(exact)]]
    data = leaderboard_tuple(a, b, sfa, sfb, np.zeros((1, 1, 1), dtype=np.float16))
    assert reference.check(torch.full((1, 1, 1), float(exact), dtype=torch.float16), data).ok
    if exact > 1e-3:  # (2^-20 is inside atol: any answer near 0 passes the checker)
        assert not reference.check(torch.zeros((1, 1, 1), dtype=torch.float16), data).ok


def every_scale(rng, shape) -> np.ndarray:
    """Scale bytes in random order, each finite E4M3 code once per 254 entries."""
    return rng.permutation(np.resize(FINITE_SCALES, int(np.prod(shape)))).reshape(shape)


def random_case(m, k, l, seed):
    rng = np.random.default_rng(seed)
    sfb = rng.choice(FINITE_SCALES, (l, 128, k // 16))
    sfb[:, 0] = every_scale(rng, (l, k // 16))
    return (rng.integers(0, 256, (l, m, k // 2), dtype=np.uint8), rng.integers(0, 256, (l, 128, k // 2), dtype=np.uint8),
            every_scale(rng, (l, m, k // 16)), sfb)


@pytest.mark.parametrize("m, k, l, seed", [(3, 16, 2, 0), (5, 64, 1, 1), (2, 512, 2, 2), (3, 4096, 1, 3)])
def test_random_full_range_is_exact(m, k, l, seed):
    """Every byte of A and B, every finite E4M3 scale (both signs, zeros, subnormals, 448): in sfa
    and in the vector's sfb once there are 254 of them."""
    a, b, sfa, sfb = random_case(m, k, l, seed)
    if k == 4096:
        assert set(sfa.flat) == set(sfb[:, 0].flat) == set(FINITE_SCALES.tolist())
    assert same_floats(reference_of(a, b, sfa, sfb), integer_gemv(a, b, sfa, sfb))


def test_sums_beyond_float64_precision_are_rounded_once():
    """Codes +4 / +6 against +6 with scales in E4M3's top binade: the sums exceed 2^53 units of
    2^-20, where a float64 sum would already round."""
    rng = np.random.default_rng(7)
    top = np.arange(0x70, 0x7F, dtype=np.uint8)  # 256 .. 448
    a = rng.choice(np.array([0x66, 0x67, 0x76, 0x77], dtype=np.uint8), (1, 4, 4096))  # K = 8192
    b = np.full((1, 128, 4096), 0x77, dtype=np.uint8)
    sfa, sfb = rng.choice(top, (1, 4, 512)), rng.choice(top, (1, 128, 512))
    want = integer_gemv(a, b, sfa, sfb)
    assert (np.abs(want.astype(np.float64)) * 2 ** 20 > 2 ** 53).all()
    assert same_floats(reference_of(a, b, sfa, sfb), want)


def test_nan_scales_give_nan_rows():
    a, b, sfa, sfb = random_case(4, 64, 2, 11)
    sfa[0, 2, 1] = 0x7F  # row 2 of batch 0
    sfb[1, 0, 3] = 0xFF  # the vector of batch 1: every row
    sfb[0, 5, 0] = 0x7F  # a padding row: never read
    got, want = reference_of(a, b, sfa, sfb), integer_gemv(a, b, sfa, sfb)
    assert np.isnan(got[2, 0]) and np.isnan(got[:, 1]).all() and not np.isnan(got[[0, 1, 3], 0]).any()
    assert same_floats(got, want)


def test_int64_budget_covers_the_problem():
    """The largest block term, from the bit definitions, times the number of blocks of
    MAX_EXACT_K fits int64, and MAX_EXACT_K reaches the leaderboard's K = 16384."""
    largest_block = 16 * max(abs(u) for u in CODE_UNITS) ** 2 * max(abs(u) for u in SCALE_UNITS if u is not None) ** 2
    assert reference.MAX_EXACT_K // 16 * largest_block < 2 ** 63 <= (reference.MAX_EXACT_K // 16 + 1) * largest_block
    assert reference.MAX_EXACT_K >= 16384


def test_k_beyond_the_budget_is_refused(monkeypatch):
    a, b, sfa, sfb = random_case(2, 64, 1, 0)
    monkeypatch.setattr(reference, "MAX_EXACT_K", 32)
    with pytest.raises(reference.NVFP4InputError, match=r"^a: expected K <= 32 .*got K = 64"):
        reference_of(a, b, sfa, sfb)
