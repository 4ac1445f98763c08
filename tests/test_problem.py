"""generate_input reproduces the leaderboard's layouts exactly, with full-range data."""

import math

import numpy as np
import pytest
import torch

from nvfp4lib.contract import NVFP4InputError, Shape
from nvfp4lib.formats import decode_e4m3, fp4_bytes
from nvfp4lib.problem import (B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, EXTRA_SHAPES, TEST_SHAPES, bytes_moved,
                              generate_input)
from nvfp4lib.reference import TOLERANCE, reference_gemv
from tests.bitdefs import e2m1_value, e4m3_value

SMALL = [(128, 64, 1), (256, 128, 2), (200, 96, 3), (384, 256, 1)]


@pytest.mark.parametrize("mode", ["full", "leaderboard"])
@pytest.mark.parametrize("m, k, l", SMALL)
def test_shapes_dtypes_strides(m, k, l, mode):
    a, b, sfa, sfb, sfap, sfbp, c = generate_input(m, k, l, mode=mode)
    rest_m, rest_k = -(-m // 128), -(-(k // 16) // 4)
    expected = [  # (tensor, shape, dtype, strides of the documented storage)
        (a, (m, k // 2, l), torch.float4_e2m1fn_x2, (k // 2, 1, m * k // 2)),
        (b, (128, k // 2, l), torch.float4_e2m1fn_x2, (k // 2, 1, 128 * k // 2)),
        (sfa, (m, k // 16, l), torch.float8_e4m3fn, (k // 16, 1, m * k // 16)),
        (sfb, (128, k // 16, l), torch.float8_e4m3fn, (k // 16, 1, 128 * k // 16)),
        (sfap, (32, 4, rest_m, 4, rest_k, l), torch.float8_e4m3fn,
         (16, 4, rest_k * 512, 1, 512, rest_m * rest_k * 512)),
        (sfbp, (32, 4, 1, 4, rest_k, l), torch.float8_e4m3fn, (16, 4, rest_k * 512, 1, 512, rest_k * 512)),
        (c, (m, 1, l), torch.float16, (1, 1, m)),
    ]
    for t, shape, dtype, strides in expected:
        assert tuple(t.shape) == shape and t.dtype == dtype
        assert all(s == 1 or got == want for s, got, want in zip(shape, t.stride(), strides)), (shape, t.stride())
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


@pytest.mark.parametrize("m, k, l", [(256, 128, 2), (200, 64, 1)])
def test_permuted_scales_follow_the_index_formula(m, k, l):
    _, _, sfa, sfb, sfap, sfbp, _ = generate_input(m, k, l)
    for plain, perm in ((sfa, sfap), (sfb, sfbp)):
        plain_bytes = plain.view(torch.uint8).tolist()
        perm_bytes = perm.view(torch.uint8).tolist()
        rows, cols = plain.shape[:2]
        for i in range(rows):
            for j in range(cols):
                for b in range(l):
                    got = perm_bytes[i % 32][(i % 128) // 32][i // 128][j % 4][j // 4][b]
                    assert got == plain_bytes[i][j][b], (i, j, b)
    # rows past M in the last 128-row tile are zero padding
    if m % 128:
        pad = [sfap[i % 32, (i % 128) // 32, i // 128].view(torch.uint8) for i in range(m, 128 * -(-m // 128))]
        assert not torch.stack(pad).any()


def bits(t):
    """Comparable bits of any input tensor (torch.equal does not support the fp4/fp8 dtypes)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def codes_by_nibble(t):
    raw = fp4_bytes(t)
    return set((raw & 0xF).unique().tolist()), set((raw >> 4).unique().tolist())


FINITE_E4M3 = {byte for byte in range(256) if not math.isnan(e4m3_value(byte))}
E4M3 = np.array([e4m3_value(byte) for byte in range(256)])
E2M1 = np.array([e2m1_value(code) for code in range(16)])
NARROW = 7 * 2.0 ** -9  # the largest E4M3 subnormal


def test_full_mode_has_every_code_in_both_nibbles_and_every_scale():
    """(512, 4096, 2) has 2 * 128 "B-wide" K blocks: enough for every scale in the vector's row."""
    a, b, sfa, sfb, *_ = generate_input(512, 4096, 2, mode="full")
    for t in (a, b[:1]):  # b: the vector row alone must be full-range too
        low, high = codes_by_nibble(t)
        assert low == set(range(16)) and high == set(range(16))
    for name, s in (("sfa", sfa), ("sfb", sfb[:1])):  # sfb: the vector row alone, not the padding
        got = set(s.view(torch.uint8).unique().tolist())
        assert got == FINITE_E4M3, f"{name}: missing {sorted(FINITE_E4M3 - got)}, extra {sorted(got - FINITE_E4M3)}"
        values = E4M3[s.view(torch.uint8).numpy()]
        assert (values < 0).any() and (values == 448).any() and ((values != 0) & (np.abs(values) < 2.0 ** -6)).any()


def test_unsigned_scales_are_every_non_negative_finite_code():
    """negative_scales=False: the 127 codes with the sign bit clear (UE4M3), each in sfa and sfb[0]."""
    _, _, sfa, sfb, *_ = generate_input(512, 4096, 2, mode="full", negative_scales=False)
    unsigned = {c for c in FINITE_E4M3 if c < 0x80}
    for name, s in (("sfa", sfa), ("sfb", sfb)):
        got = set(s.view(torch.uint8).unique().tolist())
        assert got <= unsigned, f"{name}: codes with the sign bit set: {sorted(got - unsigned)}"
    for name, s in (("sfa", sfa), ("sfb", sfb[:1])):
        assert set(s.view(torch.uint8).unique().tolist()) == unsigned, name


@pytest.mark.parametrize("m, k, l", [(128, 256, 1), (200, 1536, 3), (512, 4096, 2)])
def test_full_mode_pairs_wide_scales_with_narrow_ones(m, k, l):
    """Per K block either every A scale or the vector's scale is at most the largest subnormal, so
    no product of scales exceeds 448 * 7 * 2^-9; no scale is NaN."""
    _, _, sfa, sfb, *_ = generate_input(m, k, l, seed=m + k)
    sa, sb = E4M3[sfa.view(torch.uint8).numpy()], E4M3[sfb.view(torch.uint8).numpy()[:1]]  # [M, K/16, L], [1, ...]
    assert not np.isnan(sa).any() and not np.isnan(E4M3[sfb.view(torch.uint8).numpy()]).any()
    narrow_a = (np.abs(sa) <= NARROW).all(axis=0)  # [K/16, L]
    narrow_b = np.abs(sb[0]) <= NARROW
    assert (narrow_a | narrow_b).all()
    assert (np.abs(sa * sb) <= 448 * NARROW).all()


def block_terms(data, l: int) -> np.ndarray:
    """float64 [M, K/16]: each block's exact term (scales times the sum of 16 code products), from
    the bit definitions."""
    a, b, sfa, sfb = (t.view(torch.uint8)[..., l].numpy() for t in data[:4])
    def codes(raw):
        return np.stack((raw & 0xF, raw >> 4), axis=-1).reshape(*raw.shape[:-1], -1)
    products = E2M1[codes(a)] * E2M1[codes(b[:1])]
    return products.reshape(a.shape[0], -1, 16).sum(-1) * E4M3[sfa] * E4M3[sfb[:1]]


@pytest.mark.parametrize("shape", TEST_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_full_mode_stays_inside_fp16_and_fp32_accumulation(shape):
    """|c| well inside fp16, and one sequential fp32 sum over the exact block terms (the longest
    chain of roundings a kernel summing per-16-block partial sums can have), rounded to fp16,
    within rtol = atol = 1e-3 of the exact reference."""
    data = generate_input(*shape, seed=shape.m + shape.k)
    exact = reference_gemv(data)[:, 0, :].double().numpy()
    assert np.abs(exact).max() < 65504 / 8
    for l in range(shape.l):
        terms = block_terms(data, l).astype(np.float32)  # exact: at most 20 significant bits each
        fp32 = np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]
        err = np.abs(fp32.astype(np.float16).astype(np.float64) - exact[:, l])
        assert (err <= TOLERANCE + TOLERANCE * np.abs(exact[:, l])).all()


@pytest.mark.slow
@pytest.mark.parametrize("shape", BENCHMARK_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_full_mode_stays_inside_fp16_on_benchmark_shapes(shape):
    assert reference_gemv(generate_input(*shape, seed=shape.m + shape.k)).abs().max() < 65504 / 8


def test_leaderboard_mode_matches_reference_generator():
    a, b, sfa, sfb, *_ = generate_input(256, 512, 2, mode="leaderboard")
    for t in (a, b):
        assert set(fp4_bytes(t).unique().tolist()) == {0, 1, 2, 3}
    for s in (sfa, sfb):
        assert set(decode_e4m3(s).unique().tolist()) == {0.0, 1.0, 2.0}


def test_leaderboard_mode_draws_as_the_leaderboard_does():
    """Bytes of A and B from 0..3, then scales from {0, 1, 2}, from one generator in that order."""
    m, k, l, seed = 256, 512, 2, 5
    a, b, sfa, sfb, *_ = generate_input(m, k, l, seed=seed, mode="leaderboard")
    gen = torch.Generator().manual_seed(seed)
    want = [torch.randint(0, 4, (l, rows, k // 2), generator=gen, dtype=torch.uint8) for rows in (m, 128)]
    want += [torch.randint(0, 3, (l, rows, k // 16), generator=gen).float() for rows in (m, 128)]
    for got, w in zip((a, b), want[:2]):
        assert torch.equal(fp4_bytes(got).permute(2, 0, 1), w)
    for got, w in zip((sfa, sfb), want[2:]):
        assert torch.equal(decode_e4m3(got).permute(2, 0, 1), w)


def test_b_filler_rows_and_c_are_random():
    _, b, _, sfb, _, _, c = generate_input(128, 128, 2)
    assert fp4_bytes(b[1:]).any() and sfb[1:].view(torch.uint8).any()
    assert torch.isfinite(c).all() and (c != 0).all() and c.unique().numel() > 100


def test_seeded_and_deterministic():
    first, again, other = generate_input(128, 64, 2, seed=3), generate_input(128, 64, 2, seed=3), \
        generate_input(128, 64, 2, seed=4)
    for x, y, z in zip(first, again, other):
        assert torch.equal(bits(x), bits(y))
        assert not torch.equal(bits(x), bits(z))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_data_equals_cpu_data():
    cpu, gpu = generate_input(256, 128, 2, seed=7), generate_input(256, 128, 2, seed=7, device="cuda")
    for x, y in zip(cpu, gpu):
        assert y.is_cuda and y.stride() == x.stride()
        assert torch.equal(bits(x), bits(y.cpu()))


def test_generate_input_errors():
    with pytest.raises(NVFP4InputError, match="^mode: "):
        generate_input(128, 64, 1, mode="random")
    with pytest.raises(NVFP4InputError, match=r"^\(m, k, l\): "):
        generate_input(128, 40, 1)


def test_shape_tables():
    for s in TEST_SHAPES + EXTRA_SHAPES + BENCHMARK_SHAPES:
        assert isinstance(s, Shape) and s.m % 128 == 0 and s.k % 64 == 0
    assert len(TEST_SHAPES) == 9 and set(B200_SPEED_OF_LIGHT_US) == set(BENCHMARK_SHAPES)
    assert EXTRA_SHAPES == [(128, 64, 1), (128, 192, 3), (1024, 4096, 8), (16384, 1024, 8), (16384, 2048, 8)]
    assert not set(EXTRA_SHAPES) & set(TEST_SHAPES + BENCHMARK_SHAPES), "beyond the leaderboard's shapes"


def test_bytes_moved_matches_the_problem_statement():
    megabytes = [round(bytes_moved(s) / 1e6, 1) for s in BENCHMARK_SHAPES]
    assert megabytes == [66.1, 132.2, 33.1]
    m, k, l = 128, 256, 1
    assert bytes_moved(Shape(m, k, l)) == m * k // 2 + m * k // 16 + k // 2 + k // 16 + 2 * m
