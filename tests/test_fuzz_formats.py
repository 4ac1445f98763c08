"""Random shapes and random bytes through the formats, the layouts and the GEMV, against slow
versions written here from the definitions alone.

Nothing below calls nvfp4lib to compute an expected value: E2M1 and E4M3 are decoded from their
bit fields, rounding is a search over all representable values, the scale layouts are the index
formulas of the problem statement, and the GEMV is a float64 sum. The data is random bytes:
every E2M1 code in both nibbles, every E4M3 bit pattern (NaN patterns included where only bytes
are moved), negative scales, garbage in padding that a conversion must ignore.

`-m "not slow"` runs the quick profile (well under a minute on two cores); the tests marked
`slow` draw larger shapes, up to the leaderboard's test shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nvfp4lib import formats, layouts, problem, reference, scaled_mm
from nvfp4lib.device import capabilities
from nvfp4lib.paths import PATHS
from tests.bitdefs import e2m1_value, e4m3_value

# --------------------------------------------------------------------------- the definitions


E2M1 = np.array([e2m1_value(c) for c in range(16)])
E4M3 = np.array([e4m3_value(b) for b in range(256)])
E4M3_FINITE = [b for b in range(256) if not math.isnan(E4M3[b])]
E2M1_MAGNITUDES = E2M1[:8]  # increasing, codes 0..7
E4M3_MAGNITUDES = E4M3[:0x7F]  # increasing, bytes 0x00..0x7E (0x7F is NaN)


def nearest_code(magnitudes: np.ndarray, x: float) -> tuple[int, bool]:
    """The code of the magnitude nearest to |x| (saturating at the largest; a tie goes to the even
    code, whose last mantissa bit is 0), and whether |x| lies within a relative 1e-6 of a tie, where
    float32 arithmetic before the rounding may land on either side."""
    mag = min(abs(x), magnitudes[-1])
    dist = np.abs(magnitudes - mag)
    first, second = (int(i) for i in np.argsort(dist, kind="stable")[:2])
    best = first if dist[first] < dist[second] or first % 2 == 0 else second
    return best, bool(dist[second] - dist[first] <= 1e-6 * mag)


def unpack_bytes(raw: np.ndarray) -> np.ndarray:
    """Packed bytes [..., n] -> codes [..., 2n]: the element with the even K index is the LOW nibble."""
    codes = np.empty((*raw.shape[:-1], 2 * raw.shape[-1]), dtype=np.uint8)
    codes[..., 0::2] = raw & 0xF
    codes[..., 1::2] = raw >> 4
    return codes


def tile_counts(mn: int, k_blocks: int) -> tuple[int, int]:
    return -(-mn // 128), -(-k_blocks // 4)


def atom_offset(i, j, rest_k):
    """Byte of scale (row i, scale column j) in one batch's 128x4 blocked buffer (NVFP4_GEMV.md)."""
    return ((i // 128) * rest_k + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4


def blocked_bytes(sf: np.ndarray) -> np.ndarray:
    """Plain scale bytes [MN, KB] -> the flat blocked buffer, zero padded."""
    mn, kb = sf.shape
    rest_m, rest_k = tile_counts(mn, kb)
    flat = np.zeros(rest_m * rest_k * 512, dtype=np.uint8)
    i, j = np.meshgrid(np.arange(mn), np.arange(kb), indexing="ij")
    flat[atom_offset(i, j, rest_k)] = sf
    return flat


def permuted_storage(sf: np.ndarray) -> np.ndarray:
    """Plain scale bytes [MN, KB, L] -> the (L, rest_m, rest_k, 32, 4, 4) buffer behind the permuted view."""
    mn, kb, l = sf.shape
    rest_m, rest_k = tile_counts(mn, kb)
    return np.stack([blocked_bytes(sf[:, :, b]) for b in range(l)]).reshape(l, rest_m, rest_k, 32, 4, 4)


def gather_plain(flat: np.ndarray, mn: int, kb: int) -> np.ndarray:
    """The inverse: [MN, KB] read out of a blocked buffer (whatever its padding holds)."""
    i, j = np.meshgrid(np.arange(mn), np.arange(kb), indexing="ij")
    return flat[atom_offset(i, j, tile_counts(mn, kb)[1])]


def exact_gemv(a, b, sfa, sfb):
    """float64 c[m, l] = sum_k A*sfa * B[0]*sfb[0] and sum_k |...|, from byte arrays in (L, rows, cols)
    order. The products are exact, and so is the sum when K <= 1024 (each product is a multiple of
    2^-20 below 2^23, so any partial sum of up to 2^10 of them fits in 53 bits)."""
    a_val = E2M1[unpack_bytes(a)] * np.repeat(E4M3[sfa], 16, axis=-1)  # [L, M, K]
    b_val = E2M1[unpack_bytes(b[:, 0])] * np.repeat(E4M3[sfb[:, 0]], 16, axis=-1)  # [L, K]
    exact = np.einsum("lmk,lk->lm", a_val, b_val)
    magnitude = np.einsum("lmk,lk->lm", np.abs(a_val), np.abs(b_val))
    return exact, magnitude  # [L, M] each


# --------------------------------------------------------------------------- random inputs


def fuzz(strategy, examples: int, *always):
    """A hypothesis property over `examples` draws of `strategy`, plus the cases `always` (found
    before: they run first, every time); no deadline, since first calls warm caches up."""
    def wrap(prop):
        for case in always:
            prop = example(case)(prop)
        return settings(max_examples=examples, deadline=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
            given(strategy)(prop))
    return wrap


SCALE_PALETTES = {
    "any": np.array(E4M3_FINITE, dtype=np.uint8),  # every finite pattern, both signs, subnormals
    "positive": np.arange(0, 0x7F, dtype=np.uint8),
    "at_most_one": np.array([b for b in E4M3_FINITE if abs(E4M3[b]) <= 1.0], dtype=np.uint8),
    "leaderboard": np.array([0x00, 0x38, 0x40], dtype=np.uint8),  # 0, 1, 2
}
CODE_PALETTES = {"any": 256, "leaderboard": 4}  # bytes below this bound


def random_gemv_bytes(m: int, k: int, l: int, seed: int, codes: str, scales: str):
    """(a, b, sfa, sfb) as byte arrays in storage order (L, rows, cols), and c values."""
    rng = np.random.default_rng(seed)
    palette = SCALE_PALETTES[scales]
    return (rng.integers(0, CODE_PALETTES[codes], (l, m, k // 2), dtype=np.uint8),
            rng.integers(0, CODE_PALETTES[codes], (l, 128, k // 2), dtype=np.uint8),
            rng.choice(palette, (l, m, k // 16)), rng.choice(palette, (l, 128, k // 16)),
            rng.uniform(-2, 2, (l, m, 1)).astype(np.float16))


def leaderboard_tuple(a, b, sfa, sfb, c):
    """The 7-tuple with the documented dtypes and storage, built here without nvfp4lib."""
    def plain(array, dtype):
        return torch.from_numpy(np.ascontiguousarray(array)).view(dtype).permute(1, 2, 0)

    def permuted(scale_bytes):  # (L, rows, KB) -> [32, 4, rest, 4, rest_k, L] view of the atom buffer
        storage = permuted_storage(np.transpose(scale_bytes, (1, 2, 0)))
        return torch.from_numpy(storage).view(torch.float8_e4m3fn).permute(3, 4, 1, 5, 2, 0)

    return (plain(a, torch.float4_e2m1fn_x2), plain(b, torch.float4_e2m1fn_x2),
            plain(sfa, torch.float8_e4m3fn), plain(sfb, torch.float8_e4m3fn),
            permuted(sfa), permuted(sfb), plain(c, torch.float16))


def gemv_cases(m_values, k_values, max_l: int, scales=("any", "positive", "leaderboard")):
    return st.fixed_dictionaries({
        "m": m_values, "k": k_values, "l": st.integers(1, max_l), "seed": st.integers(0, 2**32 - 1),
        "codes": st.sampled_from(sorted(CODE_PALETTES)), "scales": st.sampled_from(scales)})


def scale_cases(max_mn: int, max_kb: int, max_l: int):
    return st.tuples(st.integers(1, max_mn), st.integers(1, max_kb), st.integers(1, max_l),
                     st.integers(0, 2**32 - 1))


def random_bytes(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def as_bytes(t: torch.Tensor) -> np.ndarray:
    return (t if t.dtype == torch.uint8 else t.view(torch.uint8)).numpy()


# --------------------------------------------------------------------------- E2M1 / E4M3 / packing


def test_decoders_match_bit_definitions():
    every_byte = torch.arange(256, dtype=torch.uint8)
    got = formats.decode_e4m3(every_byte.view(torch.float8_e4m3fn)).double().numpy()
    assert np.array_equal(got, E4M3, equal_nan=True)
    finite = ~np.isnan(E4M3)  # a NaN's sign bit means nothing
    assert np.array_equal(np.signbit(got[finite]), np.signbit(E4M3[finite]))
    got = formats.decode_e2m1(torch.arange(16, dtype=torch.uint8)).double().numpy()
    assert np.array_equal(got, E2M1) and np.array_equal(np.signbit(got), np.signbit(E2M1))


@fuzz(hnp.arrays(np.uint8, hnp.array_shapes(min_dims=1, max_dims=3, max_side=40)), 100)
def test_unpack_and_pack_match_nibble_order(raw):
    codes = formats.unpack_fp4(torch.from_numpy(raw).view(torch.float4_e2m1fn_x2))
    assert np.array_equal(codes.numpy(), unpack_bytes(raw))
    assert np.array_equal(formats.unpack_fp4(torch.from_numpy(raw)).numpy(), unpack_bytes(raw))
    assert np.array_equal(formats.pack_fp4(torch.from_numpy(unpack_bytes(raw))).numpy(), raw)


FLOATS32 = st.floats(width=32, allow_nan=False, allow_infinity=True, allow_subnormal=True)


@fuzz(hnp.arrays(np.float32, st.integers(1, 64), elements=FLOATS32), 100)
def test_encode_e4m3_rounds_to_nearest_even_and_saturates(x):
    got = as_bytes(formats.encode_e4m3(torch.from_numpy(x)))
    for value, byte in zip(x.tolist(), got.tolist()):
        code, _ = nearest_code(E4M3_MAGNITUDES, value)  # exact: the cast has no float32 step before it
        assert byte == code | (0x80 if math.copysign(1, value) < 0 else 0), (value, hex(byte))


@fuzz(hnp.arrays(np.float32, st.integers(1, 64), elements=FLOATS32), 100)
def test_encode_e2m1_rounds_to_nearest_even_and_saturates(x):
    got = formats.encode_e2m1(torch.from_numpy(x)).numpy()
    for value, code in zip(x.tolist(), got.tolist()):
        want, _ = nearest_code(E2M1_MAGNITUDES, value)
        assert code == want | (8 if math.copysign(1, value) < 0 else 0), (value, code)


# --------------------------------------------------------------------------- quantize / dequantize


def blocks_of(rows: int, blocks: int):
    """float32 rows of whole 16-element blocks, with magnitudes from subnormal to huge, whole zero
    blocks and signed zeros, and a per-row exponent so blocks of one row differ in scale."""
    element = st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from([0.0, -0.0, 6.0, -448.0]),
                        st.floats(-2.0 ** -100, 2.0 ** -100, width=32, allow_subnormal=True))
    return hnp.arrays(np.float32, (rows, blocks * 16), elements=element)


QUANTIZE_CASES = st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(-60, 60)).flatmap(
    lambda t: st.tuples(blocks_of(t[0], t[1]), st.just(t[2])))


def check_quantized(x: np.ndarray, q: formats.NVFP4Tensor) -> None:
    """Every block scale is the E4M3 nearest to amax / 6 / global_scale and every code the E2M1
    nearest to x / (scale * global_scale), computed here in float64; near a rounding tie (where the
    library's float32 steps may fall either way) either neighbour is accepted."""
    rows, k = x.shape
    amax = float(np.abs(x).max())
    want_global = amax / (6 * 448) if amax > 0 else 1.0
    assert q.global_scale == pytest.approx(want_global, rel=1e-6)
    g = q.global_scale
    scales, codes = as_bytes(q.scales), unpack_bytes(as_bytes(q.codes))
    assert scales.shape == (rows, k // 16) and codes.shape == (rows, k)
    for r in range(rows):
        for blk in range(k // 16):
            block = x[r, blk * 16:(blk + 1) * 16].astype(np.float64)
            want, near_tie = nearest_code(E4M3_MAGNITUDES, float(np.abs(block).max()) / 6 / g)
            got = int(scales[r, blk])
            assert got == want or (near_tie and abs(got - want) == 1), (r, blk, hex(got), hex(want))
            denom = E4M3[got] * g
            for e, value in enumerate(block):
                code = int(codes[r, blk * 16 + e])
                if denom == 0:
                    assert E2M1[code] == 0, (r, blk, e, code)
                    continue
                want_code, near_tie = nearest_code(E2M1_MAGNITUDES, value / denom)
                assert (code & 8) == (8 if math.copysign(1, value) < 0 else 0) or E2M1[code] == 0
                assert (code & 7) == want_code or (near_tie and abs((code & 7) - want_code) == 1), \
                    (r, blk, e, value, value / denom, code)


TINY = (np.full((1, 16), 1e-42, dtype=np.float32), 0)  # amax / (6 * 448) is below float32's range


@fuzz(QUANTIZE_CASES, 60, TINY)
def test_quantize_matches_definition(case):
    x, exponent = case
    x = (x.astype(np.float64) * 2.0 ** exponent).astype(np.float32)
    if not np.isfinite(x).all():
        return  # scaled past float32: refusing non-finite input is tested elsewhere
    q = formats.quantize_nvfp4(torch.from_numpy(x))
    check_quantized(x, q)


@fuzz(st.tuples(st.integers(1, 5), st.integers(1, 8), st.integers(0, 2**32 - 1),
                st.sampled_from([1.0, 2.0 ** -20, 3.3e-3, 1e4])), 80)
def test_dequantize_matches_definition(case):
    rows, blocks, seed, global_scale = case
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, (rows, blocks * 8), dtype=np.uint8)
    scale_bytes = rng.choice(SCALE_PALETTES["any"], (rows, blocks))
    q = formats.NVFP4Tensor(torch.from_numpy(packed).view(torch.float4_e2m1fn_x2),
                            torch.from_numpy(scale_bytes).view(torch.float8_e4m3fn), global_scale)
    want = E2M1[unpack_bytes(packed)] * np.repeat(E4M3[scale_bytes], 16, axis=-1) * global_scale
    got = formats.dequantize_nvfp4(q).double().numpy()
    # value * scale is exact in float32; multiplying by the global scale rounds once
    np.testing.assert_allclose(got, want, rtol=2.0 ** -23, atol=0)
    assert np.array_equal(np.signbit(got[want != 0]), np.signbit(want[want != 0]))


# --------------------------------------------------------------------------- scale layouts


@fuzz(scale_cases(300, 20, 3), 60)
def test_to_permuted_is_the_documented_storage(case):
    mn, kb, l, seed = case
    raw = random_bytes((l, mn, kb), seed)  # every byte value, NaN patterns included
    sf = torch.from_numpy(raw).view(torch.float8_e4m3fn).permute(1, 2, 0)
    sfp = layouts.to_permuted(sf)
    rest_m, rest_k = tile_counts(mn, kb)
    assert sfp.shape == (32, 4, rest_m, 4, rest_k, l) and sfp.dtype == torch.float8_e4m3fn
    storage = sfp.permute(5, 2, 4, 0, 1, 3)
    assert storage.is_contiguous()
    assert np.array_equal(as_bytes(storage), permuted_storage(np.transpose(raw, (1, 2, 0))))
    # and element [i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, l] is sf[i, j, l]
    i, j, b = (np.random.default_rng(seed).integers(0, n, 50) for n in (mn, kb, l))
    got = as_bytes(sfp)[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, b]
    assert np.array_equal(got, raw[b, i, j])


@fuzz(scale_cases(300, 20, 3), 60)
def test_from_permuted_reads_only_the_documented_bytes(case):
    mn, kb, l, seed = case
    rest_m, rest_k = tile_counts(mn, kb)
    storage = random_bytes((l, rest_m, rest_k, 32, 4, 4), seed)  # padding holds garbage too
    sfp = torch.from_numpy(storage).view(torch.float8_e4m3fn).permute(3, 4, 1, 5, 2, 0)
    plain = layouts.from_permuted(sfp, mn, kb)
    assert plain.shape == (mn, kb, l) and plain.permute(2, 0, 1).is_contiguous()
    want = np.stack([gather_plain(storage[b].reshape(-1), mn, kb) for b in range(l)], axis=-1)
    assert np.array_equal(as_bytes(plain), want)


@fuzz(scale_cases(300, 20, 1), 60)
def test_to_blocked_and_from_blocked_match_the_byte_formula(case):
    mn, kb, _, seed = case
    raw = random_bytes((mn, kb), seed)
    flat = layouts.to_blocked(torch.from_numpy(raw).view(torch.float8_e4m3fn))
    assert flat.dim() == 1 and np.array_equal(as_bytes(flat), blocked_bytes(raw))
    garbage = random_bytes(flat.shape, seed + 1)
    back = layouts.from_blocked(torch.from_numpy(garbage), mn, kb)
    assert np.array_equal(back.numpy(), gather_plain(garbage, mn, kb))


@fuzz(scale_cases(300, 20, 4), 40)
def test_permuted_as_blocked_is_each_batch_blocked_buffer_in_place(case):
    mn, kb, l, seed = case
    raw = random_bytes((l, mn, kb), seed)
    storage = torch.from_numpy(permuted_storage(np.transpose(raw, (1, 2, 0))))
    sfp = storage.permute(3, 4, 1, 5, 2, 0)
    for b in range(l):
        view = layouts.permuted_as_blocked(sfp, b)
        assert view.data_ptr() == storage[b].data_ptr(), "a view of the same bytes, not a copy"
        assert np.array_equal(view.numpy(), blocked_bytes(raw[b]))


@fuzz(st.tuples(st.integers(1, 300), st.sampled_from([16, 32, 64, 128, 320]), st.integers(1, 3),
                st.integers(0, 2**31 - 1), st.sampled_from(problem.MODES)), 30)
def test_generated_permuted_scales_are_the_plain_scales(case):
    m, k, l, seed, mode = case
    a, b, sfa, sfb, sfa_p, sfb_p, c = problem.generate_input(m, k, l, seed=seed, mode=mode)
    for plain, permuted in ((sfa, sfa_p), (sfb, sfb_p)):
        want = permuted_storage(as_bytes(plain))
        assert np.array_equal(as_bytes(permuted.permute(5, 2, 4, 0, 1, 3).contiguous()), want)
    for t, rows, cols in ((a, m, k // 2), (b, 128, k // 2), (sfa, m, k // 16), (c, m, 1)):
        assert t.permute(2, 0, 1).is_contiguous() and t.shape == (rows, cols, l)


# --------------------------------------------------------------------------- the GEMV


def check_reference(case) -> None:
    a, b, sfa, sfb, c = random_gemv_bytes(**case)
    data = leaderboard_tuple(a, b, sfa, sfb, c)
    got = reference.reference_gemv(data)
    assert got.shape == (case["m"], 1, case["l"]) and got.dtype == torch.float32
    exact, magnitude = exact_gemv(a, b, sfa, sfb)
    want = exact.T[:, None, :].astype(np.float32)
    if case["k"] <= 1024:
        assert np.array_equal(got.numpy(), want), "the exact sum, rounded once to float32"
    else:  # the float64 sums of this file now round: bound the difference by theirs and float32's
        tol = 2.0 ** -24 * np.abs(exact) + case["k"] * 2.0 ** -52 * magnitude
        assert (np.abs(got.numpy()[:, 0, :].T - exact) <= tol).all()


@fuzz(gemv_cases(st.integers(1, 300), st.integers(1, 64).map(lambda n: 16 * n), 3), 40)
def test_reference_gemv_is_exact(case):
    check_reference(case)


def check_emulation(case, variants) -> None:
    """The scaled_mm paths (the emulation of the FP4 GEMM, exact products summed in fp32, on machines without one) against the
    exact sum: fp32 accumulation, one rounding to fp16. Scales <= 1 keep every sum inside fp16."""
    a, b, sfa, sfb, c = random_gemv_bytes(**case)
    exact, magnitude = exact_gemv(a, b, sfa, sfb)
    tol = 2.0 ** -11 * np.abs(exact) + 2 * case["k"] * 2.0 ** -24 * magnitude + 2.0 ** -24
    for name in variants:
        data = leaderboard_tuple(a, b, sfa, sfb, c)
        *_, c_given = data
        c_given.fill_(float("nan"))
        out = PATHS[name].build()(data)
        assert out.data_ptr() == c_given.data_ptr()
        got = out.double().numpy()[:, 0, :].T
        bad = ~(np.abs(got - exact) <= tol)
        assert not bad.any(), f"{name}: {int(bad.sum())} wrong, first at (l, m) = {np.argwhere(bad)[0]}"


def _variants():
    """The registry's torch._scaled_mm variants that can run on the CPU here."""
    return [name for name in ("scaled_mm_reference", "scaled_mm_permuted", "scaled_mm_transposed",
                              "scaled_mm_functional") if PATHS[name].unavailable(capabilities(), False) is None]


@fuzz(gemv_cases(st.sampled_from([128, 256]), st.integers(1, 12).map(lambda n: 64 * n), 3,
                 scales=("at_most_one", "leaderboard")), 15)
def test_scaled_mm_paths_match_exact_sum(case):
    check_emulation(case, _variants())


@fuzz(st.fixed_dictionaries({
    "rows": st.integers(1, 300), "cols": st.sampled_from([16, 32, 128]), "k": st.integers(1, 24).map(lambda n: 32 * n),
    "seed": st.integers(0, 2**32 - 1)}), 40)
def test_emulated_scaled_mm_reads_blocked_scales(case):
    """The emulation of ``torch._scaled_mm`` on its own: any row count (padded scale tiles), K whose
    scale columns do not fill a tile, and a column-major mat2, as cuBLAS takes them."""
    rows, cols, k, seed = case["rows"], case["cols"], case["k"], case["seed"]
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(0, 256, (n, k // 2), dtype=np.uint8) for n in (rows, cols))
    sa, sb = (rng.choice(SCALE_PALETTES["at_most_one"], (n, k // 16)) for n in (rows, cols))

    def fp4(x):
        return torch.from_numpy(x).view(torch.float4_e2m1fn_x2)

    def blocked(x):
        return torch.from_numpy(blocked_bytes(x)).view(torch.float8_e4m3fn)

    out = scaled_mm.emulated_scaled_mm_fp4(fp4(a), fp4(b).T, blocked(sa), blocked(sb))
    assert out.shape == (rows, cols) and out.dtype == torch.float16
    a_val = E2M1[unpack_bytes(a)] * np.repeat(E4M3[sa], 16, axis=-1)
    b_val = E2M1[unpack_bytes(b)] * np.repeat(E4M3[sb], 16, axis=-1)
    exact, magnitude = a_val @ b_val.T, np.abs(a_val) @ np.abs(b_val).T
    tol = 2.0 ** -11 * np.abs(exact) + 2 * k * 2.0 ** -24 * magnitude + 2.0 ** -24
    assert (np.abs(out.double().numpy() - exact) <= tol).all()


# --------------------------------------------------------------------------- heavier profile


@pytest.mark.slow
@fuzz(gemv_cases(st.sampled_from([128, 1000, 2432]), st.sampled_from([64, 1024, 1536, 4608, 7168]), 4), 6)
def test_reference_gemv_large_shapes(case):
    check_reference(case)


@pytest.mark.slow
@pytest.mark.parametrize("shape", problem.TEST_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_scaled_mm_paths_on_test_shapes(shape):
    # scales <= 1 keep every sum inside fp16 up to K = 4096; beyond, the leaderboard's palette does
    codes, scales = ("any", "at_most_one") if shape.k <= 4096 else ("leaderboard", "leaderboard")
    case = {"m": shape.m, "k": shape.k, "l": shape.l, "seed": shape.m + shape.k, "codes": codes, "scales": scales}
    check_emulation(case, _variants())


@pytest.mark.slow
@fuzz(scale_cases(3000, 300, 8), 20)
def test_permuted_round_trip_large(case):
    mn, kb, l, seed = case
    raw = random_bytes((l, mn, kb), seed)
    sf = torch.from_numpy(raw).view(torch.float8_e4m3fn).permute(1, 2, 0)
    sfp = layouts.to_permuted(sf)
    assert np.array_equal(as_bytes(sfp.permute(5, 2, 4, 0, 1, 3)), permuted_storage(np.transpose(raw, (1, 2, 0))))
    assert np.array_equal(as_bytes(layouts.from_permuted(sfp, mn, kb)), as_bytes(sf))
