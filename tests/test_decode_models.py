"""The sm_100a FP4 decode, modelled bit for bit: the conversion against the format table, the
kernel's pairing of bytes and scales against the sm_100a PTX, and the whole fast kernel against
the models of the two decodes the H200 runs."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from nvfp4lib.contract import Shape
from nvfp4lib.formats import E2M1_VALUES, byte_values
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check
from nvfp4lib.study import decode_models as dm
from nvfp4lib.study.ptx_reading import instructions, operands, registers
from tests.ptx_pairing import expected_hw_pairing, hw_pairing_from_ptx

DECODES = ("hw", "lut", "bitops")
_rng = np.random.default_rng(20250)


def _f16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint16)


# ----------------------------------------------------------------------------------- formats


def test_cvt_e2m1x2_gives_both_codes_of_every_byte_low_nibble_in_the_low_half():
    every_byte = np.arange(256)
    lo, hi = dm.halves(dm.cvt_f16x2_e2m1x2(every_byte))
    table = np.array(E2M1_VALUES)
    # bit patterns, so the sign of zero (code 8 is -0) counts too
    assert np.array_equal(lo.view(np.uint16), _f16_bits(table[every_byte & 0xF]))
    assert np.array_equal(hi.view(np.uint16), _f16_bits(table[every_byte >> 4]))
    assert dm.cvt_f16x2_e2m1x2(0x71) == _f16_bits(0.5) | _f16_bits(6.0).astype(np.uint32) << 16


def test_e4m3_model_decodes_every_byte_as_pytorch_does():
    every_byte = torch.arange(256, dtype=torch.uint8)
    expected = every_byte.view(torch.float8_e4m3fn).float().numpy()
    got = dm.e4m3_f32(every_byte.numpy())
    assert np.array_equal(got, expected, equal_nan=True)
    finite = ~np.isnan(expected)
    assert np.array_equal(np.signbit(got[finite]), np.signbit(expected[finite]))  # -0 is 0x80
    lo, hi = dm.cvt_e4m3x2_f32(np.array([0x38 | 0xC0 << 8]))  # 1.0 in the low byte, -2.0 in the high
    assert (lo[0], hi[0]) == (1.0, -2.0)


def test_unpack_takes_byte_zero_from_the_low_bits():
    assert [int(b) for b in dm.unpack_bytes(np.uint32(0x44332211))] == [0x11, 0x22, 0x33, 0x44]


# ------------------------------------------------------------------------------ instructions


def _nearest_even(exact: Fraction, dtype):
    """The dtype value nearest to `exact`, ties to the even bit pattern, found by comparing fractions."""
    guess = np.asarray(float(exact), dtype=dtype)
    bits = np.uint16 if dtype == np.float16 else np.uint32
    candidates = [guess, np.nextafter(guess, dtype(np.inf)), np.nextafter(guess, dtype(-np.inf))]
    return min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.asarray(v).view(bits)) & 1))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fma_rounds_once(dtype):
    """Random bit patterns, and for float32 sums just below a halfway point that float64 cannot
    hold: rounding the float64 sum and then to float32 would round twice, up instead of down."""
    bits = np.uint16 if dtype == np.float16 else np.uint32
    a, b, c = (_rng.integers(0, np.iinfo(bits).max, 4000, dtype=bits).view(dtype) for _ in range(3))
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and the like are dropped just below
        exact64 = a.astype(np.float64) * b + c
    keep = np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & (np.abs(exact64) < np.finfo(dtype).max)
    cases = list(zip(a[keep], b[keep], c[keep]))
    if dtype == np.float32:  # (1 + 2^-23) * (2^-24 - 2^-47) + (1 + 2^-23) = 1 + 2^-23 + 2^-24 - 2^-70
        odd, below_half = dtype(1 + 2**-23), dtype(2**-24 - 2**-47)
        cases += [(odd, below_half, odd), (-odd, below_half, -odd)]
    for x, y, z in cases:
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        got, want = dm.fma_rn(x, y, z, dtype), _nearest_even(exact, dtype)
        if exact == 0:  # the sign of an exact zero follows the operands' signs, not the nearest value
            assert got == 0
        else:
            assert np.asarray(got).view(bits) == np.asarray(want, dtype=dtype).view(bits), (x, y, z)
    if dtype == np.float32:
        assert dm.fma_rn(odd, below_half, odd, dtype) == odd  # rounded down to 1 + 2^-23, not up to 1 + 2^-22


def test_prmt_and_dp4a_follow_the_isa():
    a, b = np.uint32(0x03020100), np.uint32(0x8C080604)
    assert dm.prmt(a, b, 0x7654) == 0x8C080604  # bytes 4-7: all of b
    assert dm.prmt(a, b, 0x000F) == 0x000000FF  # byte 7 (0x8C) with its sign replicated
    assert dm.prmt(a, b, 0x0008) == 0x00000000  # byte 0 (0x00): sign 0
    assert dm.dp4a(np.uint32(0xFF020304), np.uint32(0x01FF0101), 10) == 10 + 4 + 3 - 2 - 1


# ------------------------------------------------------------------------------------ decodes


@pytest.mark.parametrize("decode", DECODES)
def test_block_sums_are_exact_for_every_pair_of_bytes_at_every_position(decode):
    """Every (A byte, B byte) pair at each of the 8 byte positions of a 16-code block, the other
    bytes random: the modelled block sum, undone by its decode factor, is the exact dot product."""
    pairs = np.stack(np.meshgrid(np.arange(256), np.arange(256), indexing="ij"), -1).reshape(-1, 2)
    values = np.array(E2M1_VALUES)
    for position in range(8):
        a = _rng.integers(0, 256, (len(pairs), 8), dtype=np.uint8)
        b = _rng.integers(0, 256, (len(pairs), 8), dtype=np.uint8)
        a[:, position], b[:, position] = pairs[:, 0], pairs[:, 1]
        got = dm.block_sum(list(a.view("<u4").T), list(b.view("<u4").T), decode).astype(np.float64)
        codes = lambda x: np.stack([values[x & 15], values[x >> 4]], -1).reshape(len(x), 16)  # noqa: E731
        assert np.array_equal(got * dm.DECODE_FACTOR[decode], (codes(a) * codes(b)).sum(1)), position


def _every_byte_at_every_position() -> tuple[np.ndarray, np.ndarray]:
    """(uint32 words, float64 [n, 8] values of their codes in K order): each of the 256 byte values at
    each of the 4 byte positions of a word, the other bytes random; values from formats' exact decode."""
    word_bytes = _rng.integers(0, 256, (4, 256, 4), dtype=np.uint8)
    for position in range(4):
        word_bytes[position, :, position] = np.arange(256)
    word_bytes = word_bytes.reshape(-1, 4)
    values = byte_values().double().numpy()[word_bytes].reshape(-1, 8)  # byte i -> codes 2i, 2i + 1
    return word_bytes.view("<u4")[:, 0], values


def _same_bits(got, expected) -> bool:
    """Equal as fp16 bit patterns: values and the sign of zero (code 8 is -0)."""
    return np.array_equal(_f16_bits(got), _f16_bits(expected))


@pytest.mark.parametrize("decode", ["hw", "bitops"])
def test_fp16_decodes_give_every_code_of_every_byte_in_k_order(decode):
    """Each fp16 decode of a word, its half2 put back in K order (`codes_in_order`), against the
    exact decode: true values (hardware), value * 2^-14 (bit trick on A), bit for bit, and true
    values again after B's multiply by 2^14 (bit trick on B; ``fma.rn`` of -0 * 2^14 + 0 is +0, so
    there -0 comes out as +0, which no product or sum can tell apart)."""
    words, expected = _every_byte_at_every_position()
    decoder = {"hw": dm.decode_word_hw, "bitops": dm.decode_word_bitops}[decode]
    got = dm.codes_in_order(decoder(words), decode).astype(np.float64)
    assert _same_bits(got * dm.DECODE_FACTOR[decode], expected)
    if decode == "bitops":
        b_values = dm.codes_in_order(dm.decode_b_word_bitops(words), "bitops").astype(np.float64)
        assert np.array_equal(b_values, expected)
        assert not np.signbit(b_values[expected == 0]).any()


def test_codes_in_order_sees_a_wrong_half2_order(monkeypatch):
    words, expected = _every_byte_at_every_position()
    swapped = dict(dm.HALF2_CODES, bitops=((0, 4), (2, 6), (3, 7), (1, 5)))
    monkeypatch.setattr(dm, "HALF2_CODES", swapped)
    got = dm.codes_in_order(dm.decode_word_bitops(words), "bitops").astype(np.float64)
    assert not _same_bits(got * dm.DECODE_FACTOR["bitops"], expected)


def _signed_bytes(words) -> np.ndarray:
    """[n] uint32 words -> int64 [n, 4], their bytes as signed values (byte 0 first)."""
    return np.ascontiguousarray(words, dtype="<u4").view(np.int8).reshape(-1, 4).astype(np.int64)


def test_lookup_decodes_every_code_of_every_byte():
    """`decode_word_lut` gives 2|v| split by sign, `decode_b_word_lut` 2v and -2v as signed bytes: the
    4 words of each hold codes 0-3 then 4-7, 4 bits of the word per byte (code j in byte j % 4)."""
    words, expected = _every_byte_at_every_position()
    codes = np.stack([(words >> (4 * j)) & 0xF for j in range(8)], -1)  # code j = nibble j of the word
    values = expected  # [n, 8], codes in K order
    pos_lo, pos_hi, neg_lo, neg_hi = (_signed_bytes(w) for w in dm.decode_word_lut(words))
    positive, negative = np.concatenate([pos_lo, pos_hi], 1), np.concatenate([neg_lo, neg_hi], 1)
    assert np.array_equal(positive - negative, 2 * values)
    assert np.array_equal(np.where(codes >= 8, positive, negative), np.zeros_like(positive))  # one side is 0
    b_lo, b_hi, minus_lo, minus_hi = (_signed_bytes(w) for w in dm.decode_b_word_lut(words))
    assert np.array_equal(np.concatenate([b_lo, b_hi], 1), 2 * values)
    assert np.array_equal(np.concatenate([minus_lo, minus_hi], 1), -2 * values)


def test_negate_bytes_negates_each_byte_without_borrow():
    v = np.arange(129, dtype=np.uint32)
    words = v | v[::-1] << 8 | (v // 2) << 16 | (128 - v // 3) << 24
    got = _signed_bytes(dm.negate_bytes(words))
    bytes_in = np.stack([v, v[::-1], v // 2, 128 - v // 3], -1).astype(np.int64)
    assert np.array_equal(got, np.where(bytes_in == 128, -128, -bytes_in))  # -128 is its own negation


def test_hardware_decode_halves_hold_consecutive_codes():
    word = np.uint32(0x76543210 ^ 0x88008800)  # bytes 0x10, 0xba, 0x54, 0xfe: every code once
    got = [v for h in dm.decode_word_hw(word) for v in dm.halves(h)]
    codes = [(int(word) >> (4 * i)) & 0xF for i in range(8)]
    assert np.array_equal(_f16_bits([float(v) for v in got]), _f16_bits([E2M1_VALUES[c] for c in codes]))


# ------------------------------------------------------------------------- pairing in the PTX


def test_operands_keep_vectors_and_addresses_whole():
    assert operands("{%r1, %r2}, [%rd3+16], 0") == ["{%r1, %r2}", "[%rd3+16]", "0"]
    assert operands("") == [] and registers("{%r1, %r2}") == ["%r1", "%r2"] and registers("%f3") == ["%f3"]


@pytest.fixture(scope="module")
def hw_ptx():
    cute_gemv = pytest.importorskip("nvfp4lib.cute.gemv")
    if cute_gemv.cute is None:
        pytest.skip("the CuTe DSL is not installed")
    from nvfp4lib.study import generic_kernels

    return {name: (cute_gemv.compile_ptx("fast", "sm_100a", getattr(generic_kernels, name)),
                   getattr(generic_kernels, name)) for name in ("WIDE", "TALL")}


@pytest.mark.cute
@pytest.mark.parametrize("tile", ["WIDE", "TALL"])
def test_sm100_ptx_pairs_bytes_and_scales_as_the_model_does(hw_ptx, tile):
    ptx, cfg = hw_ptx[tile]
    found = hw_pairing_from_ptx(ptx, cfg.rows_per_warp, cfg.unroll)
    assert found == expected_hw_pairing(cfg.rows_per_warp, cfg.unroll)
    assert len(found) == 2 * cfg.rows_per_warp * cfg.unroll  # every block of every row and step


@pytest.mark.cute
def test_pairing_check_sees_a_swapped_operand(hw_ptx):
    """The same PTX with the first B byte conversion reading byte 1 instead of byte 0."""
    ptx, cfg = hw_ptx["WIDE"]
    first_b_cvt = ptx.index("cvt.rn.f16x2.e2m1x2", ptx.index("ld.global.nc.v4.u32"))
    broken = ptx[:first_b_cvt] + ptx[first_b_cvt:].replace(", b0;", ", b1;", 1)
    assert broken != ptx
    assert hw_pairing_from_ptx(broken, cfg.rows_per_warp, cfg.unroll) != expected_hw_pairing(cfg.rows_per_warp,
                                                                                              cfg.unroll)


@pytest.mark.cute
def test_hopper_ptx_accumulates_like_the_model():
    """sm_90a (lookup decode): the same fma.rn.f32 per block, and B's scales times 1/4 once per step."""
    cute_gemv = pytest.importorskip("nvfp4lib.cute.gemv")
    from nvfp4lib.study.generic_kernels import WIDE as cfg

    ptx = cute_gemv.compile_ptx("fast", "sm_90a", cfg)
    ops = [op for op, _ in instructions(ptx)]
    assert ops.count("fma.rn.f32") == ops.count("cvt.rn.f32.s32") == 2 * cfg.rows_per_warp * cfg.unroll
    quarter = [args for op, args in instructions(ptx) if op == "mul.f32" and args.endswith("0f3E800000")]
    assert len(quarter) == 2 * cfg.unroll and dm.DECODE_FACTOR["lut"] == 0.25


# ------------------------------------------------------------------------------- whole kernel


SHAPES = [Shape(128, 256, 1), Shape(256, 1536, 2), Shape(128, 7168, 1), Shape(384, 2048, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_hardware_decode_computes_the_hopper_decodes_fp32_values(shape):
    data = generate_input(*shape, seed=shape.m + shape.k + shape.l, mode="full")
    results = {decode: dm.fast_kernel_model(data, decode) for decode in DECODES}
    hw_fp32, hw_fp16 = results["hw"]
    assert hw_fp32.shape == (shape.m, shape.l) and np.isfinite(hw_fp32).all()
    for decode in ("lut", "bitops"):
        assert np.array_equal(hw_fp32.view(np.uint32), results[decode][0].view(np.uint32)), decode
    result = check(torch.from_numpy(hw_fp16).unsqueeze(1), data)
    assert result.ok, result.message


def test_kernel_model_comparison_sees_a_wrong_pairing(monkeypatch):
    """A pairing that takes B's bytes of a word in reverse order: the hw model no longer equals the
    lookup model (which does not use HW_BLOCK), so the comparison above can fail."""
    data = generate_input(128, 256, 1, seed=7, mode="full")
    lut = dm.fast_kernel_model(data, "lut")[0]
    monkeypatch.setattr(dm, "HW_BLOCK", tuple((a, (b[0], 3 - b[1])) for a, b in dm.HW_BLOCK))
    assert not np.array_equal(dm.fast_kernel_model(data, "hw")[0], lut)
