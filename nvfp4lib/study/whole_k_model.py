"""The per-K kernels of `nvfp4lib.cute.whole_k`, modelled bit for bit, and the proof that their block sums are exact.

`whole_k_model` computes what a per-K kernel computes, in its order: per thread its chunks t, t + P, ...
(`WholeKPlan`), each chunk's two block sums scaled with ``fma.rn.f32`` (`decode_models.chunk_update`),
the butterfly over the 32 lanes of each warp, the warps of a row added in order, the fp32 rounded once
to fp16. The block sums themselves are exact, whatever the decode, so every decode gives the same
fp32 bit for bit; `EXACTNESS` says why and `fp16_accumulation_check` / `lut_accumulation_check` prove it
by enumerating every accumulator value the kernel's order of operations can reach.
"""

from __future__ import annotations

import numpy as np

from nvfp4lib.study.decode_models import (chunked_kernel_model, decode_word_lut, dp4a, e2m1_f16_bits, fast_kernel_model,
                                          fma_rn, negate_bytes)

EXACTNESS = r"""
**Why the per-K kernels' block sums are exact.** A 16-element block is summed before any scale touches it.

* *Bit trick (Hopper, decode "bitops").* A arrives as its E2M1 value times 2^-14 (every code, fp16
  subnormals included: 0.5 · 2^-14 = 2^-15 is a subnormal), B as its true value (bit trick, then one
  ``fma.rn.f16x2`` by 2^14, exact). E2M1 values are multiples of 1/2 up to 6, so every product is a
  multiple of u = 2^-16 with |product| <= 36 · 2^-14 = 144 u. Each ``fma.rn.f16x2`` lane accumulates the
  products of 8 of the block's 16 codes, from +0, so every partial sum is k · u with |k| <= 8 · 144 = 1152.
  fp16 holds every k · 2^e with |k| <= 2^11 = 2048 exactly, down to 2^e = 2^-24 (its subnormal spacing),
  so every exact a · b + c is representable and ``fma.rn`` returns it unrounded. This needs the subnormals:
  PTX ``fma.rn.f16x2`` without ``.ftz`` keeps them (the kernels' PTX has no ``.ftz`` f16 operation; SASS
  ``HFMA2`` without ``.FTZ``). The two lanes, at most 1152 u each, are converted to fp32 (exact) and
  added: at most 2304 u, exact in fp32's 24 bits. The block sum is the true sum times 2^-14.
* *Hardware decode (Blackwell, "hw").* Both sides are true values: products are multiples of 1/4 up to
  36 = 144 quarters, 8 per lane: at most 1152 quarters = 288 < 2048 quarters, exact in fp16 (and far from
  its subnormals); the fp32 sum of the two lanes (at most 576) is exact too.
* *Register lookup (Hopper's default, "lut").* Codes become the integers 2|v| (A, split by sign) and 2v
  (B, signed bytes); ``dp4a`` sums 4 products at a time into two int32 accumulators, one for A's positive
  and one for its negative codes, at most 16 · 144 = 2304 each; their difference, 4 times the block sum,
  is exact as an integer and as fp32.

Rounding happens only after the block sums, in fp32, exactly where the fast kernel rounds: the scale
product sa · (sb · factor) is exact (E4M3 significands have 4 bits, the factor is a power of two), then
each block adds ``fma.rn.f32(scale product, block sum, acc)`` (one rounding), the lanes of a warp meet in
a butterfly of ``add.f32`` (rounding), the warps of a row are added in order (rounding), and the total is
rounded to fp16 once. The fp32 result differs from the exact sum (the reference's, rounded once) only by
those fp32 roundings, so the fp16 output equals the reference's fp16 except where the exact sum lies within
a few fp32 ulps of a point halfway between two fp16 values. Because the block sums are exact, the three
decodes give the same fp32 bit for bit (`whole_k_model`), as the fast kernel's do.
"""


# ---------------------------------------------------------------------------------------------
# The proof, by enumeration


def _decoded_values(decode: str) -> tuple[np.ndarray, np.ndarray]:
    """(A's 16 decoded values, B's 16), as float64, each exactly what the decode gives the FMAs."""
    codes = np.arange(16)
    true = e2m1_f16_bits(codes).view(np.float16).astype(np.float64)
    if decode == "bitops":
        return true * 2.0 ** -14, true
    if decode == "hw":
        return true, true
    raise ValueError(f"decode: expected 'bitops' or 'hw' (the fp16 block sums), got {decode!r}")


def fp16_accumulation_check(decode: str, products_per_lane: int = 8) -> dict:
    """Every accumulator value an fp16 lane of the block sum can reach, by enumeration: starting from +0,
    step j adds the product of every one of the 16 x 16 code pairs to every value reachable after j - 1
    steps, with ``fma.rn.f16`` modelled bit for bit (`decode_models.fma_rn`), and checks the rounded result
    against the exact one. Returns the unit u of the products, the largest |partial sum| in units of u and
    the number of FMAs checked; raises AssertionError on the first inexact one."""
    a_values, b_values = _decoded_values(decode)
    a16, b16 = np.float16(a_values), np.float16(b_values)
    assert np.array_equal(a16.astype(np.float64), a_values) and np.array_equal(b16.astype(np.float64), b_values)
    a_grid, b_grid = (x.reshape(-1) for x in np.meshgrid(a16, b16, indexing="ij"))  # all 256 code pairs
    unit = 2.0 ** -16 if decode == "bitops" else 0.25
    reachable = np.zeros(1, dtype=np.float16)  # the accumulator starts at +0
    checked = 0
    for _ in range(products_per_lane):
        acc = np.repeat(reachable, a_grid.size)
        a, b = np.tile(a_grid, reachable.size), np.tile(b_grid, reachable.size)
        got = fma_rn(a, b, acc, np.float16).astype(np.float64)
        exact = a.astype(np.float64) * b.astype(np.float64) + acc.astype(np.float64)
        bad = got != exact
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(f"fma.rn.f16({a[i]}, {b[i]}, {acc[i]}) = {got[i]}, exact {exact[i]}")
        assert np.array_equal(exact / unit, np.round(exact / unit))  # every partial sum is a multiple of u
        checked += exact.size
        reachable = np.unique(np.float16(exact))
    return {"unit": unit, "max_units": int(np.max(np.abs(reachable.astype(np.float64))) / unit),
            "values_reached": int(reachable.size), "fmas_checked": checked}


def lut_accumulation_check() -> dict:
    """The lookup decode's integers: every code's 2|v| (A) and 2v (B) as `cute.decode.decode_b_signed`
    and `decode_word_lut` produce them for every byte, and the largest accumulator of a 16-code block."""
    words = np.arange(256, dtype=np.uint32) * 0x01010101  # each byte value in every byte of a word
    pos_lo, _, neg_lo, _ = decode_word_lut(words)
    b_lo, _ = decode_b_signed(words)
    values = e2m1_f16_bits(np.arange(16)).view(np.float16).astype(np.float64)
    low, high = words & 0xF, (words >> 4) & 0xF
    a_int = [(pos_lo >> (8 * i) & 0xFF).astype(np.int64) - (neg_lo >> (8 * i) & 0xFF).astype(np.int64)
             for i in range(4)]
    b_int = [(b_lo >> (8 * i) & 0xFF).astype(np.uint8).view(np.int8).astype(np.int64) for i in range(4)]
    expected = [2 * values[low], 2 * values[high], 2 * values[low], 2 * values[high]]
    for i in range(4):  # result byte i is code i of the word: codes 0 and 2 are low nibbles, 1 and 3 high
        assert np.array_equal(a_int[i], expected[i]) and np.array_equal(b_int[i], expected[i]), i
    largest = 16 * int(np.max(np.abs(2 * values))) ** 2
    assert largest < 2 ** 24  # exact as int32 and as fp32
    return {"max_product": int(np.max(np.abs(2 * values))) ** 2, "max_block": largest}


# ---------------------------------------------------------------------------------------------
# The kernel's helpers and the whole kernel


def decode_b_signed(word) -> list[np.ndarray]:
    """`cute.decode.decode_b_signed`: B's 2v as signed bytes, codes 0-3 then 4-7."""
    pos_lo, pos_hi, neg_lo, neg_hi = decode_word_lut(word)
    return [pos_lo | negate_bytes(neg_lo), pos_hi | negate_bytes(neg_hi)]


def block_dot_lut2(a_words, b_words) -> np.ndarray:
    """`cute.decode.block_dot_lut2`: 4 x a block's sum, from a positive and a negative dp4a accumulator."""
    pos = np.zeros(np.shape(a_words[0]), dtype=np.int64)
    neg = np.zeros_like(pos)
    for w in range(2):
        pos_lo, pos_hi, neg_lo, neg_hi = decode_word_lut(a_words[w])
        b_lo, b_hi = decode_b_signed(b_words[w])
        pos = dp4a(pos_hi, b_hi, dp4a(pos_lo, b_lo, pos))
        neg = dp4a(neg_hi, b_hi, dp4a(neg_lo, b_lo, neg))
    return (pos - neg).astype(np.float32)


def whole_k_model(data, threads_per_row: int, chunks_per_thread: int, decode: str) -> tuple[np.ndarray, np.ndarray]:
    """(float32 [M, L] before the final rounding, float16 [M, L] as written) of a per-K kernel whose rows
    are shared by ``threads_per_row`` threads of ``chunks_per_thread`` chunks (`WholeKPlan`), on a CPU copy
    of the leaderboard tuple: `decode_models.chunked_kernel_model` (thread t accumulates chunks t, t + P, ...
    inside the row; a butterfly per warp; the warps' sums added in order)."""
    return chunked_kernel_model(data, threads_per_row, chunks_per_thread, decode)


def plan_model(data, plan, decode: str) -> tuple[np.ndarray, np.ndarray]:
    """`whole_k_model` with the thread layout of a `whole_k.WholeKPlan`."""
    return whole_k_model(data, plan.threads_per_row, plan.chunks_per_thread, decode)


def config_model(data, cfg, decode: str) -> tuple[np.ndarray, np.ndarray]:
    """The model of the kernel that config ``cfg`` runs at the input's K (`gemv.CuteGemv.config_for`): a per-K
    config (one with `whole_k.plan_for`'s plan) by its plan, the fast and tiled kernels, whose lanes walk a
    row's chunks in the same order, by `decode_models.fast_kernel_model`."""
    from nvfp4lib.cute.whole_k import WholeKConfig, plan_for

    if isinstance(cfg, WholeKConfig):
        return plan_model(data, plan_for(cfg, 2 * data[0].shape[1]), decode)
    return fast_kernel_model(data, decode)
