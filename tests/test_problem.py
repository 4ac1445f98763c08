"""generate_input reproduces the leaderboard's layouts exactly, with full-range data."""

import pytest
import torch

from nvfp4lib.formats import decode_e4m3, fp4_bytes
from nvfp4lib.problem import (
    B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, TEST_SHAPES, Shape, bytes_moved, generate_input)
from nvfp4lib.validate import NVFP4InputError

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


def test_full_mode_has_every_code_in_both_nibbles():
    a, b, sfa, sfb, *_ = generate_input(128, 256, 1, mode="full")
    for t in (a, b[:1]):  # b: the vector row alone must be full-range too
        low, high = codes_by_nibble(t)
        assert low == set(range(16)) and high == set(range(16))
    for s in (sfa, sfb):
        values = decode_e4m3(s)
        assert torch.isfinite(values).all() and (values >= 0).all()
        assert (values == 0).any(), "some exact zero scales"
        assert (values > 0).float().mean() > 0.9
    sfa_values = decode_e4m3(sfa)
    assert sfa_values[sfa_values > 0].min() < 2.0 ** -5 and sfa_values.max() > 2.0 ** 5
    assert len(sfa.view(torch.uint8).unique()) > 64, "many distinct E4M3 exponents and mantissas"


def test_leaderboard_mode_matches_reference_generator():
    a, b, sfa, sfb, *_ = generate_input(256, 512, 2, mode="leaderboard")
    for t in (a, b):
        assert set(fp4_bytes(t).unique().tolist()) == {0, 1, 2, 3}
    for s in (sfa, sfb):
        assert set(decode_e4m3(s).unique().tolist()) == {0.0, 1.0, 2.0}


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
    for s in TEST_SHAPES + BENCHMARK_SHAPES:
        assert isinstance(s, Shape) and s.m % 128 == 0 and s.k % 64 == 0
    assert len(TEST_SHAPES) == 9 and set(B200_SPEED_OF_LIGHT_US) == set(BENCHMARK_SHAPES)


def test_bytes_moved_matches_the_problem_statement():
    megabytes = [round(bytes_moved(s) / 1e6, 1) for s in BENCHMARK_SHAPES]
    assert megabytes == [66.1, 132.2, 33.1]
    m, k, l = 128, 256, 1
    assert bytes_moved(Shape(m, k, l)) == m * k // 2 + m * k // 16 + k // 2 + k // 16 + 2 * m
