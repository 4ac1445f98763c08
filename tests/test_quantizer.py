"""NVFP4 quantization exists once: `quantization.fake_quantize(x, 16, "e4m3")` and
`dequantize_nvfp4(quantize_nvfp4(x))` agree bit for bit, and both are the definition (the E4M3
scale nearest to amax / 6 / global, the E2M1 code nearest to x / (scale * global), ties to even)
on values placed exactly on its edges, checked here with exact fractions.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from nvfp4lib import formats
from nvfp4lib.study import quantization
from nvfp4lib.contract import NVFP4InputError
from tests.bitdefs import E2M1_MAGNITUDES, E4M3_MAGNITUDES, nearest_index, round_to_float32

E2M1_MIDPOINTS = [(lo + hi) / 2 for lo, hi in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:])]
E4M3_MIDPOINTS = [(lo + hi) / 2 for lo, hi in zip(E4M3_MAGNITUDES, E4M3_MAGNITUDES[1:])]


def bits(t: torch.Tensor) -> torch.Tensor:
    """float32 bit patterns: equality of these also tells -0.0 from +0.0."""
    return t.contiguous().view(torch.int32)


def negative(value: float) -> bool:
    return math.copysign(1.0, value) < 0


# --------------------------------------------------------------------------- the two routes, full size


@pytest.mark.parametrize("name", quantization.DISTRIBUTIONS)
def test_study_route_is_the_format_at_full_size(name):
    x = quantization.sample(name, 1024, 4096, seed=0)
    study = quantization.fake_quantize(x, 16, "e4m3")
    nvfp4 = formats.dequantize_nvfp4(formats.quantize_nvfp4(x))
    assert torch.equal(bits(study), bits(nvfp4)), f"{int((study != nvfp4).sum())} elements differ"


# --------------------------------------------------------------------------- the definition, on its edges


def defined(x: np.ndarray, global_scale: float):
    """(codes [rows, K], scale bytes [rows, K/16], float32 values) of NVFP4 quantization with the
    given global scale, from exact fractions."""
    rows, k = x.shape
    codes = np.zeros((rows, k), dtype=np.uint8)
    scales = np.zeros((rows, k // 16), dtype=np.uint8)
    values = np.zeros((rows, k), dtype=np.float32)
    g = Fraction(global_scale)
    for r in range(rows):
        for blk in range(k // 16):
            block = [float(v) for v in x[r, 16 * blk:16 * blk + 16]]
            amax = max(abs(Fraction(v)) for v in block)
            scales[r, blk] = nearest_index(amax / 6 / g, E4M3_MAGNITUDES)
            multiplier = E4M3_MAGNITUDES[scales[r, blk]] * g
            for i, v in enumerate(block):
                if multiplier == 0:  # the block decodes to zero whatever its codes: they are +0
                    continue
                code = nearest_index(Fraction(v) / multiplier, E2M1_MAGNITUDES) | (8 if negative(v) else 0)
                codes[r, 16 * blk + i] = code
                value = round_to_float32(E2M1_MAGNITUDES[code & 7] * multiplier)
                values[r, 16 * blk + i] = -value if code & 8 else value
    return codes, scales, values


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(np.float32)


def next_up(v: np.float32) -> np.float32:
    return np.nextafter(v, np.float32(np.inf))


def next_down(v: np.float32) -> np.float32:
    return np.nextafter(v, np.float32(-np.inf))


def edge_blocks(exponent: int) -> np.ndarray:
    """float32 blocks of 16 (one per row) on the edges of the recipe when the global scale is
    2^exponent; the first block holds the tensor's amax, 6 * 448 * 2^exponent, so that the derived
    global scale is exactly that power of two."""
    g = 2.0 ** exponent
    blocks = [[6 * 448 * g] + [0.0] * 15]
    for s in E4M3_MAGNITUDES[1:]:  # every nonzero scale, subnormals included
        unit = float(s) * g
        mids = [float(m) for m in E2M1_MIDPOINTS]
        # exact ties at every E2M1 midpoint, both signs, -0.0, and a block amax of 6 * scale
        blocks.append([6 * unit] + [m * unit for m in mids] + [-m * unit for m in mids] + [-0.0])
        # one float32 step above and below every midpoint
        steps = [f(np.float32(m * unit)) for m in mids for f in (next_up, next_down)]
        blocks.append([6 * unit] + steps + [-6 * unit])
    for mid in E4M3_MIDPOINTS:  # block amax / 6 / g exactly halfway between two E4M3 scales
        amax = 6 * float(mid) * g
        blocks.append([amax, -amax / 2, amax / 3, -amax / 7] + [amax / 12] * 12)
    tiny = float(np.nextafter(np.float32(0), np.float32(1)))  # the smallest float32
    blocks += [[0.0] * 16, [-0.0] * 16, [tiny, -tiny] * 8,
               [2.0 ** -10 * 6 * g] + [0.0] * 15,  # scale exactly halfway between 0 and 2^-9: 0
               [1.5 * 2.0 ** -9 * 6 * g] + [-0.0] * 15]  # halfway between 2^-9 and 2^-8: 2^-8
    return f32(blocks)


@pytest.mark.parametrize("exponent", [0, -3, 17, -120, -130])
def test_quantization_on_the_edges_is_the_definition(exponent):
    """Exponent -120 puts block values among float32's subnormals; at -130, amax / (6 * 448) is no
    normal float32, so the global scale is float32's smallest normal, 2^-126, and the block scales
    take the rest (the definition with that global scale still holds, bit for bit)."""
    x = edge_blocks(exponent)
    q = formats.quantize_nvfp4(torch.from_numpy(x))
    assert q.global_scale == max(2.0 ** exponent, 2.0 ** -126)
    codes, scales, values = defined(x, q.global_scale)
    got_codes = formats.unpack_fp4(q.codes).numpy()
    bad = np.argwhere(got_codes != codes)
    assert not bad.size, f"{len(bad)} codes differ, first at {bad[0]}: x = {x[tuple(bad[0])]!r}"
    assert np.array_equal(q.scales.view(torch.uint8).numpy(), scales)
    nvfp4 = formats.dequantize_nvfp4(q)
    assert np.array_equal(nvfp4.numpy().view(np.int32), values.view(np.int32))
    study = quantization.fake_quantize(torch.from_numpy(x), 16, "e4m3")
    assert torch.equal(bits(study), bits(nvfp4))


def test_block_scales_saturate_beyond_448():
    """A given global scale can leave block amax / 6 / global above 448: the scale saturates at
    448 (also at 464, halfway to the next binade) and the codes at +-6."""
    g = 2.0 ** -4
    x = f32([[6 * 464 * g, -1.0] + [0.0] * 14, [6 * 500 * g, 3 * 448 * g] + [-0.0] * 14,
             [6 * 448 * g, 6 * 448 * g * 1.01] + [1.0] * 14])
    q = formats.quantize_nvfp4(torch.from_numpy(x), global_scale=g)
    codes, scales, values = defined(x, g)
    assert (scales == 0x7E).all() and np.array_equal(q.scales.view(torch.uint8).numpy(), scales)
    assert np.array_equal(formats.unpack_fp4(q.codes).numpy(), codes)
    assert np.array_equal(formats.dequantize_nvfp4(q).numpy().view(np.int32), values.view(np.int32))


def test_float64_input_is_rounded_once():
    """x / (scale * global) just above an E2M1 midpoint in float64 rounds up; through float32 it
    would land on the midpoint and go to the even code below."""
    x = torch.tensor([[6.0, 0.25 + 2.0 ** -40, 2.5 + 2.0 ** -40, -(5.0 + 2.0 ** -40)] + [0.0] * 12],
                     dtype=torch.float64)
    q = formats.quantize_nvfp4(x, global_scale=1 / 448)
    assert formats.decode_e2m1(formats.unpack_fp4(q.codes))[0, :4].tolist() == [6.0, 0.5, 3.0, -6.0]
    assert torch.equal(quantization.fake_quantize(x, 16, "e4m3"), formats.dequantize_nvfp4(formats.quantize_nvfp4(x)))


def test_e8m0_scale_is_the_power_of_two_below_amax():
    """2^(floor(log2 amax) - 2), also for an amax one float32 step below 2^40 (where a float32
    log2 rounds up to 40 itself)."""
    below = float(np.nextafter(np.float32(2.0 ** 40), np.float32(0)))
    x = torch.tensor([[below] + [0.0] * 31, [2.0 ** 40] + [0.0] * 31])
    out = quantization.fake_quantize(x, 32, "e8m0")
    # scales 2^37 and 2^38: just below 2^40 / 2^37 = 8 saturates at code 6, 2^40 / 2^38 = 4 is a code
    assert out[:, 0].tolist() == [6 * 2.0 ** 37, 4 * 2.0 ** 38]


# --------------------------------------------------------------------------- encoders


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_encode_e2m1_of_integers(dtype):
    """Every integer dtype, its minimum included (whose abs() overflows in its own dtype)."""
    info = torch.iinfo(dtype)
    ints = sorted(v for v in {info.min, info.min + 1, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, info.max}
                  if info.min <= v <= info.max)
    got = formats.encode_e2m1(torch.tensor(ints, dtype=dtype)).tolist()
    want = [nearest_index(Fraction(v), E2M1_MAGNITUDES) | (8 if v < 0 else 0) for v in ints]
    assert got == want


def float64_neighbourhood(points) -> list[float]:
    """Each point and the float64 values one step below and above it."""
    return [f(p) for p in points for f in (lambda v: math.nextafter(v, -math.inf), float,
                                          lambda v: math.nextafter(v, math.inf))]


def test_encode_e2m1_rounds_float64_once():
    xs = float64_neighbourhood([float(m) for m in E2M1_MIDPOINTS])
    xs += [-v for v in xs]
    got = formats.encode_e2m1(torch.tensor(xs, dtype=torch.float64)).tolist()
    want = [nearest_index(Fraction(v), E2M1_MAGNITUDES) | (8 if v < 0 else 0) for v in xs]
    assert got == want


def test_encode_e4m3_rounds_float64_once():
    xs = float64_neighbourhood([float(m) for m in E4M3_MIDPOINTS] + [464.0])
    xs += [-v for v in xs]
    got = formats.encode_e4m3(torch.tensor(xs, dtype=torch.float64)).view(torch.uint8).tolist()
    want = [nearest_index(Fraction(v), E4M3_MAGNITUDES) | (0x80 if v < 0 else 0) for v in xs]
    assert got == want


# --------------------------------------------------------------------------- the global scale


FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("global_scale", [1e39, 2 * FLOAT32_MAX, float(np.nextafter(FLOAT32_MAX, math.inf))])
def test_global_scale_beyond_float32_is_refused(global_scale):
    x = torch.ones(2, 16)
    with pytest.raises(NVFP4InputError, match=r"^global_scale: .*beyond float32's range"):
        formats.quantize_nvfp4(x, global_scale)
    q = formats.quantize_nvfp4(x)
    with pytest.raises(NVFP4InputError, match=r"^q\.global_scale: .*beyond float32's range"):
        formats.dequantize_nvfp4(formats.NVFP4Tensor(q.codes, q.scales, global_scale))


@pytest.mark.parametrize("global_scale", [1e-300, 1e-39, 2.0 ** -127, float(np.nextafter(np.float32(2.0 ** -126), 0))])
def test_global_scale_below_float32s_smallest_normal_is_refused(global_scale):
    """1e-300 is no float32 at all (it would dequantize everything to 0); a subnormal is no NVFP4
    per-tensor scale. Refused by quantize and by dequantize, naming the argument."""
    x = torch.ones(2, 16)
    with pytest.raises(NVFP4InputError, match=r"^global_scale: expected a positive normal float32 .*below float32's "
                                              r"smallest normal"):
        formats.quantize_nvfp4(x, global_scale)
    q = formats.quantize_nvfp4(x)
    with pytest.raises(NVFP4InputError, match=r"^q\.global_scale: expected a positive normal float32 .*below"):
        formats.dequantize_nvfp4(formats.NVFP4Tensor(q.codes, q.scales, global_scale))


def test_global_scale_at_float32s_smallest_normal_is_accepted_and_round_trips():
    tiny = 2.0 ** -126
    x = torch.tensor([[6 * tiny] + [0.0] * 15], dtype=torch.float64)  # amax / (6 * 448) would be below 2^-126
    q = formats.quantize_nvfp4(x)
    assert q.global_scale == tiny and formats.quantize_nvfp4(x, q.global_scale).global_scale == tiny
    assert formats.dequantize_nvfp4(q)[0, 0].item() == np.float32(6 * tiny)


def test_global_scale_at_float32_max_is_accepted():
    q = formats.quantize_nvfp4(torch.full((1, 16), 3.0), FLOAT32_MAX)
    assert q.global_scale == FLOAT32_MAX and torch.equal(formats.dequantize_nvfp4(q), torch.zeros(1, 16))


def test_data_whose_global_scale_would_pass_float32_is_refused():
    x = torch.zeros(1, 16, dtype=torch.float64)
    x[0, 3] = 1e300
    with pytest.raises(NVFP4InputError, match=r"^x: expected max \|x\| <= .*got 1e\+300"):
        formats.quantize_nvfp4(x)
