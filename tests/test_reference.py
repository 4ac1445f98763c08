"""The exact reference against a naive loop, and the checker against planted errors."""

import math
import re

import pytest
import torch

from nvfp4lib.problem import generate_input
from nvfp4lib.reference import TOLERANCE, check, poison_, reference_gemv


def e2m1(code: int) -> float:
    mag = 0.5 * (code & 1) if not code & 0b110 else 2.0 ** (((code >> 1) & 3) - 1) * (1 + 0.5 * (code & 1))
    return -mag if code & 8 else mag


def e4m3(byte: int) -> float:
    exp, man = (byte >> 3) & 0xF, byte & 7
    mag = man / 8 * 2.0 ** -6 if exp == 0 else 2.0 ** (exp - 7) * (1 + man / 8)
    return -mag if byte & 0x80 else mag


def naive_gemv(data):
    """The formula of the problem statement, one element at a time, from raw bits."""
    a, b, sfa, sfb = (t.view(torch.uint8).tolist() for t in data[:4])
    m, half_k, l = data[0].shape
    out = [[0.0] * l for _ in range(m)]
    for batch in range(l):
        for row in range(m):
            acc = 0.0
            for kk in range(2 * half_k):
                shift = 4 * (kk % 2)
                av = e2m1((a[row][kk // 2][batch] >> shift) & 0xF) * e4m3(sfa[row][kk // 16][batch])
                bv = e2m1((b[0][kk // 2][batch] >> shift) & 0xF) * e4m3(sfb[0][kk // 16][batch])
                acc += av * bv
            out[row][batch] = acc
    return torch.tensor(out, dtype=torch.float64).unsqueeze(1)


@pytest.mark.parametrize("mode", ["full", "leaderboard"])
@pytest.mark.parametrize("m, k, l", [(3, 32, 2), (130, 64, 1), (5, 128, 3)])
def test_reference_matches_naive_loop(m, k, l, mode):
    data = generate_input(m, k, l, seed=m + k + l, mode=mode)
    got = reference_gemv(data)
    assert got.shape == (m, 1, l) and got.dtype == torch.float32
    want = naive_gemv(data)
    assert want.abs().max() > 1.0  # not trivially zero
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def test_reference_reads_plain_tensors_only():
    data = list(generate_input(256, 128, 2))
    before = reference_gemv(data)
    data[4].view(torch.uint8).zero_()
    assert torch.equal(reference_gemv(data), before)


def test_reference_is_chunk_independent(monkeypatch):
    data = generate_input(300, 256, 2)
    whole = reference_gemv(data)
    monkeypatch.setattr("nvfp4lib.reference._CHUNK_ELEMENTS", 1000)  # a few rows per chunk
    assert torch.equal(reference_gemv(data), whole)


def fp16_answer(data):
    return reference_gemv(data).half()


@pytest.mark.parametrize("m, k, l", [(128, 256, 1), (512, 1536, 2), (256, 7168, 1)])
def test_check_accepts_correctly_rounded_fp16(m, k, l):
    data = generate_input(m, k, l)
    result = check(fp16_answer(data), data)
    assert result.ok and result.n_bad == 0 and bool(result)


def test_check_catches_one_wrong_element():
    data = generate_input(256, 256, 2, seed=1)
    out = fp16_answer(data)
    out[77, 0, 1] += 1 + 0.01 * out[77, 0, 1].abs()  # off by more than 1, whatever its sign
    result = check(out, data)
    assert not result.ok and result.n_bad == 1 and result.max_abs_err >= 1
    assert re.search(r"\(m=77, l=1\): got", result.message)
    assert f"(rtol={TOLERANCE}, atol={TOLERANCE})" in result.message


def test_check_reports_unwritten_elements():
    data = generate_input(256, 128, 2)
    out = fp16_answer(data)
    out[200:, :, 0] = math.nan
    result = check(out, data)
    assert not result.ok and result.n_bad == 56
    assert "NaN (unwritten?)" in result.message and "(m=200, l=0)" in result.message


def hand_built(a_bytes, sfa_bytes, rows: int = 4, k: int = 64):
    """A 7-tuple (rows, K, L = 1) with A from one byte value per row, the vector all code 7 (6.0)
    and every vector scale 448; sfa_bytes[r] is row r's scale for every block."""
    data = list(generate_input(rows, k, 1, seed=3))
    data[0].view(torch.uint8)[:, :, 0] = torch.tensor(a_bytes, dtype=torch.uint8).unsqueeze(1)
    data[1].view(torch.uint8)[0] = 0x77
    data[2].view(torch.uint8)[:, :, 0] = torch.tensor(sfa_bytes, dtype=torch.uint8).unsqueeze(1)
    data[3].view(torch.uint8)[0] = 0x7E
    return tuple(data)


def test_check_treats_matching_infinities_as_equal():
    """Rows 0 and 1 sum to +-64 * 6 * 448 * 6 * 448 = +-4.6e8, beyond fp16: the leaderboard's fp16
    expected value is +-inf there, and an output of the same infinity matches it."""
    data = hand_built([0x77, 0xFF, 0x77, 0x11], [0x7E, 0x7E, 0x08, 0x08])  # 6 | -6 at 448; 6 | 0.5 at 2^-6
    exact = reference_gemv(data)[:, 0, 0]
    assert exact.tolist() == [64 * 36 * 448.0 ** 2, -64 * 36 * 448.0 ** 2, 64 * 36 * 7.0, 64 * 3 * 7.0]
    out = exact.half().unsqueeze(-1).unsqueeze(-1)
    assert out[0].isposinf().all() and out[1].isneginf().all()
    assert check(out, data).ok
    for row, wrong in ((0, -math.inf), (1, math.inf), (0, 65504.0), (1, math.nan), (2, math.inf)):
        bad = out.clone()
        bad[row] = wrong
        result = check(bad, data)
        assert not result.ok and result.n_bad == 1, (row, wrong)
    # a float32 output has the range: 4.6e8 is finite there, and inf is wrong
    assert check(exact.unsqueeze(-1).unsqueeze(-1), data).ok
    assert not check(out.float(), data).ok


def test_check_treats_nan_where_the_reference_is_nan_as_equal():
    """A NaN scale (E4M3 0x7F) makes its row NaN in the reference, as in a GEMM; only NaN matches
    it, and NaN elsewhere (an unwritten element) is still a mismatch."""
    data = hand_built([0x77, 0x12, 0x34, 0x56], [0x7F, 0x38, 0x30, 0x40])
    expected = reference_gemv(data)
    assert expected[0].isnan().all() and not expected[1:].isnan().any()
    out = expected.half()
    assert check(out, data).ok
    bad = out.clone()
    bad[0] = 1.0
    assert not check(bad, data).ok
    bad = out.clone()
    bad[2] = math.nan
    result = check(bad, data)
    assert not result.ok and result.n_bad == 1 and "(m=2, l=0): got NaN (unwritten?)" in result.message


def test_check_rejects_wrong_shape():
    data = generate_input(128, 64, 1)
    result = check(torch.zeros(128, 1), data)
    assert not result.ok and "expected shape (128, 1, 1)" in result.message


def test_poison_fills_the_real_output_in_place():
    data = generate_input(128, 64, 2)
    c = data[6]
    assert poison_(c) is c
    assert torch.isnan(c).all()
    assert check(c, data).n_bad == 128 * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_on_cuda_equals_cpu():
    cpu = reference_gemv(generate_input(256, 512, 2, seed=5))
    gpu = reference_gemv(generate_input(256, 512, 2, seed=5, device="cuda"))
    assert gpu.is_cuda
    assert torch.equal(gpu.cpu(), cpu)  # both the exact sum, rounded once
