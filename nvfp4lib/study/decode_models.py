"""Bit-exact numpy models of the CuTe kernels' FP4 decodes and of the fast kernel's arithmetic.

Each device helper of `nvfp4lib.cute.decode` (and the PTX ops of `nvfp4lib.cute.ptx` under it) has
its model here under the same name, with the kernels' own constants (`nvfp4lib.cute.constants`),
checked against `nvfp4lib.formats`' exact decode for every byte and code
(tests/test_decode_models.py); notebook 04 uses these models.

The Blackwell build decodes FP4 with ``cvt.rn.f16x2.e2m1x2``, an sm_100a instruction that the
H200 (sm_90) cannot run, so its numbers are modelled here, instruction by instruction, and checked
on any machine (tests/test_decode_models.py):

* `cvt_f16x2_e2m1x2` follows the PTX ISA's definition of the conversion: the source is a ``.b8``
  holding two E2M1 codes, the value of the upper 4 bits goes to the upper 16 bits of the ``.b32``
  result and the value of the lower 4 bits to the lower 16 bits (so the low nibble, the even K
  index, lands in the low half). E2M1 -> f16 is exact, so ``.rn`` never rounds. The model builds the
  f16 bit patterns from the E2M1 fields (sign, 2 exponent bits with bias 1, 1 mantissa bit); the
  tests compare them with ``formats.E2M1_VALUES`` for all 256 bytes.
* `HW_BLOCK` is the hardware-decode kernel's pairing of A bytes, B bytes and scale bytes (what
  `cute.decode.decode_word_hw` and `block_dot` and cute.gemv's chunk accumulation do with decode "hw");
  the tests read the same pairing back from the operands of the sm_100a PTX (tests/ptx_pairing.py:
  which loads feed which ``cvt``, which ``cvt`` results meet in which ``fma.rn.f16x2``, which scale
  half multiplies which block sum).
* `fast_kernel_model` computes what the fast kernel computes, lane by lane: block sums in packed
  fp16 (or dp4a integers), scale products and ``fma.rn.f32`` accumulation in the kernel's order,
  the butterfly shuffle reduction, the final rounding to fp16, for decode "hw" (sm_100a) and for the
  two decodes the H200 runs, "lut" and "bitops". Every rounding step is modelled exactly
  (`fma_rn`), so the models can be compared bit for bit.

Other ISA semantics relied on: ``mov.b32 {b0, b1, b2, b3}, r`` unpacks b0 from bits 0-7 (so byte i of
a little-endian 32-bit load is b_i); ``cvt.rn.f16x2.e4m3x2`` puts the lower byte's value in the lower
half; ``prmt.b32`` (default mode) picks, per result byte, byte ``sel & 7`` of the pair {b, a} and
replicates its sign bit when ``sel & 8``; ``dp4a.s32.s32`` adds the products of 4 signed bytes.
"""

from __future__ import annotations

import numpy as np
import torch

from nvfp4lib.cute.constants import DECODE_FACTOR, FP16X2_2_POW_14, LUT_HI, LUT_LO, SIGN_BITS

WORDS_PER_CHUNK = 4  # a lane's 16-byte load: 4 words of 8 codes, two 16-code scale blocks
WARP = 32

# ---------------------------------------------------------------------------------------------
# Formats, from their bit fields


def e2m1_f16_bits(codes) -> np.ndarray:
    """uint16 f16 bit patterns of E2M1 codes 0..15: [s | e1 e0 | m], exponent bias 1; e = 0 is the
    subnormal m * 0.5. The f16 of 2^(e-1) * (1 + m/2) has exponent field e - 1 + 15, mantissa m << 9."""
    codes = np.asarray(codes, dtype=np.uint16)
    sign, exponent, mantissa = codes >> 3, (codes >> 1) & 3, codes & 1
    normal = (exponent + 14) << 10 | mantissa << 9
    subnormal = np.where(mantissa == 1, 14 << 10, 0)  # 0.5 = 2^-1: exponent field 14, or zero
    return (sign << 15 | np.where(exponent > 0, normal, subnormal)).astype(np.uint16)


def e4m3_f32(bits) -> np.ndarray:
    """float32 values of E4M3 bytes: [s | 4 exponent bits, bias 7 | 3 mantissa bits]; exponent 0 is
    subnormal (m * 2^-9), S.1111.111 is NaN, and there is no infinity. Every value is exact in f16
    and f32, so ``cvt.rn.f16x2.e4m3x2`` followed by ``cvt.f32.f16`` gives exactly this."""
    bits = np.asarray(bits, dtype=np.int64)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 7
    magnitude = np.where(exponent > 0, np.ldexp(1.0 + mantissa / 8.0, exponent - 7), mantissa * 2.0**-9)
    magnitude = np.where((exponent == 15) & (mantissa == 7), np.nan, magnitude)
    return (sign * magnitude).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Instructions


def halves(h2) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) float16 halves of packed half2 words."""
    h2 = np.asarray(h2, dtype=np.uint32)
    return ((h2 & 0xFFFF).astype(np.uint16).view(np.float16), (h2 >> 16).astype(np.uint16).view(np.float16))


def _pack(lo, hi) -> np.ndarray:
    lo = np.asarray(lo, dtype=np.float16).view(np.uint16).astype(np.uint32)
    hi = np.asarray(hi, dtype=np.float16).view(np.uint16).astype(np.uint32)
    return lo | hi << 16


def cvt_f16x2_e2m1x2(byte) -> np.ndarray:
    """``cvt.rn.f16x2.e2m1x2 d, a``: .b8 a -> .b32 d, the low nibble's f16 in bits 0-15, the high
    nibble's in bits 16-31."""
    byte = np.asarray(byte, dtype=np.uint32)
    return e2m1_f16_bits(byte & 0xF).astype(np.uint32) | e2m1_f16_bits(byte >> 4).astype(np.uint32) << 16


def unpack_bytes(word) -> list[np.ndarray]:
    """``mov.b32 {b0, b1, b2, b3}, word``: b0 is bits 0-7 (the first byte in memory)."""
    word = np.asarray(word, dtype=np.uint32)
    return [(word >> (8 * i)) & 0xFF for i in range(4)]


def cvt_e4m3x2_f32(pair) -> tuple[np.ndarray, np.ndarray]:
    """``cvt.rn.f16x2.e4m3x2`` then ``cvt.f32.f16`` of each half: the lower byte's value first."""
    pair = np.asarray(pair, dtype=np.uint32)
    return e4m3_f32(pair & 0xFF), e4m3_f32(pair >> 8)


def _round_to_odd_sum(product: np.ndarray, addend: np.ndarray) -> np.ndarray:
    """product + addend in float64, rounded to odd (an inexact sum keeps an odd last bit), from the
    exact error of the float64 sum (TwoSum)."""
    total = product + addend
    virtual = total - product
    error = (product - (total - virtual)) + (addend - virtual)
    odd = (total.view(np.int64) & 1) == 1
    nudged = np.nextafter(total, np.where(error > 0, np.inf, -np.inf))
    return np.where((error != 0) & ~odd, nudged, total)


def fma_rn(a, b, c, dtype) -> np.ndarray:
    """a * b + c rounded once to nearest even in `dtype` (float16 or float32), as ``fma.rn`` does.

    The product of two such values is exact in float64; the sum is rounded to odd in float64's 53
    bits, at least 2 more than the target's, and then to nearest: one correct rounding.
    """
    a, b, c = (np.asarray(x, dtype=dtype).astype(np.float64) for x in (a, b, c))
    return _round_to_odd_sum(a * b, c).astype(dtype)


def fma_rn_f16x2(a, b, c) -> np.ndarray:
    """``fma.rn.f16x2 d, a, b, c``: per 16-bit half, a * b + c rounded once to f16."""
    (a_lo, a_hi), (b_lo, b_hi), (c_lo, c_hi) = halves(a), halves(b), halves(c)
    return _pack(fma_rn(a_lo, b_lo, c_lo, np.float16), fma_rn(a_hi, b_hi, c_hi, np.float16))


def half2_sum_f32(h2) -> np.ndarray:
    """``cvt.f32.f16`` of both halves, then ``add.f32`` (lo + hi)."""
    lo, hi = halves(h2)
    return lo.astype(np.float32) + hi.astype(np.float32)


def prmt(a, b, selector) -> np.ndarray:
    """``prmt.b32 d, a, b, c`` (default mode): result byte i is byte (c >> 4i) & 7 of the 8 bytes
    b:a (a's bytes are 0-3), or that byte's sign bit replicated where (c >> 4i) & 8."""
    source = np.asarray(b, dtype=np.uint64) << np.uint64(32) | np.asarray(a, dtype=np.uint64)
    selector = np.asarray(selector, dtype=np.uint64)
    out = np.zeros(np.broadcast(source, selector).shape, dtype=np.uint64)
    for i in range(4):
        nibble = (selector >> np.uint64(4 * i)) & np.uint64(0xF)
        byte = (source >> (np.uint64(8) * (nibble & np.uint64(7)))) & np.uint64(0xFF)
        byte = np.where(nibble & np.uint64(8), np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0)), byte)
        out |= byte << np.uint64(8 * i)
    return out.astype(np.uint32)


def dp4a(a, b, acc) -> np.ndarray:
    """``dp4a.s32.s32 d, a, b, c``: c + the sum of the products of the 4 signed bytes of a and b."""
    a, b = np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)
    total = np.asarray(acc, dtype=np.int64)
    for i in range(4):
        total = total + (((a >> (8 * i)) & 0xFF).astype(np.int8).astype(np.int64)
                         * ((b >> (8 * i)) & 0xFF).astype(np.int8).astype(np.int64))
    return total


# ---------------------------------------------------------------------------------------------
# The three decodes of one 32-bit word of 8 codes (cute.decode's device helpers, modelled)


HALF2_CODES = {"hw": ((0, 1), (2, 3), (4, 5), (6, 7)), "bitops": ((2, 6), (0, 4), (3, 7), (1, 5))}
"""Which codes of a word (0..7 in K order; code 2i is the low nibble of byte i) the low and the high
half of each of the 4 half2 of `decode_word_hw` / `decode_word_bitops` hold."""


def codes_in_order(halves4, decode: str) -> np.ndarray:
    """The 4 half2 of a word decoded with `decode` ("hw" or "bitops") as float16 [..., 8], the word's
    codes in K order (for "bitops" still times 2^-14)."""
    out = np.empty(np.shape(halves4[0]) + (8,), dtype=np.float16)
    for h2, (lo, hi) in zip(halves4, HALF2_CODES[decode]):
        out[..., lo], out[..., hi] = halves(h2)
    return out


def decode_word_hw(word) -> list[np.ndarray]:
    """`cute.decode.decode_word_hw`: one ``cvt.rn.f16x2.e2m1x2`` per byte; half2 i holds (code 2i, code 2i + 1)."""
    return [cvt_f16x2_e2m1x2(byte) for byte in unpack_bytes(word)]


def decode_word_bitops(word) -> list[np.ndarray]:
    """`cute.decode.decode_word_bitops`: 4 half2 of value * 2^-14, codes (2, 6), (0, 4), (3, 7), (1, 5)."""
    x = np.asarray(word, dtype=np.uint32)
    even = ((x << 1) & 0x0E0E0E0E) | ((x << 4) & 0x80808080)
    odd = ((x >> 3) & 0x0E0E0E0E) | (x & 0x80808080)
    return [even & 0xFF00FF00, prmt(even, 0, 0x2404), odd & 0xFF00FF00, prmt(odd, 0, 0x2404)]


def decode_b_word_bitops(word) -> list[np.ndarray]:
    """`cute.decode.decode_b_word` without the hardware decode: the bit trick times half2(2^14, 2^14)
    with ``fma.rn.f16x2``, true values in the order of `decode_word_bitops`."""
    two14 = np.uint32(FP16X2_2_POW_14)
    return [fma_rn_f16x2(h, two14, 0) for h in decode_word_bitops(word)]


def decode_word_lut(word) -> list[np.ndarray]:
    """`cute.decode.decode_word_lut`: bytes 2|v| of the positive codes 0-3, 4-7, then of the negative
    ones (`prmt` from the table LUT_LO, LUT_HI)."""
    x = np.asarray(word, dtype=np.uint32)
    flipped = x ^ np.uint32(SIGN_BITS)
    return [prmt(LUT_LO, LUT_HI, x & 0xFFFF), prmt(LUT_LO, LUT_HI, x >> 16),
            prmt(LUT_LO, LUT_HI, flipped & 0xFFFF), prmt(LUT_LO, LUT_HI, flipped >> 16)]


def negate_bytes(v) -> np.ndarray:
    """`cute.decode.negate_bytes`: -v per byte of a word, for bytes in [0, 128]."""
    return ((np.uint32(0x80808080) - np.asarray(v, dtype=np.uint32)) ^ np.uint32(0x80808080)).astype(np.uint32)


def decode_b_word_lut(word) -> list[np.ndarray]:
    """`study.generic_kernels.decode_b_word_lut`: signed bytes 2v of codes 0-3, 4-7, then -2v."""
    pos_lo, pos_hi, neg_lo, neg_hi = decode_word_lut(word)
    return [pos_lo | negate_bytes(neg_lo), pos_hi | negate_bytes(neg_hi),
            neg_lo | negate_bytes(pos_lo), neg_hi | negate_bytes(pos_hi)]


# ---------------------------------------------------------------------------------------------
# One 16-code block and one chunk, as cute.decode.block_dot and study.generic_kernels.block_dot_lut compute them


HW_BLOCK = tuple(((w, i), (w, i)) for w in range(2) for i in range(4))
"""The block sum's pairing: ``fma.rn.f16x2`` number n of block j multiplies half2 i of word 2j + w of
A by half2 i' of word 2j + w' of B, ((w, i), (w', i')) = HW_BLOCK[n], accumulating from 0 in this
order. With the hardware decode half2 i of a word is the ``cvt`` of its byte i, so the kernel
pairs each A byte with the B byte at the same place, low nibble with low nibble. Block j of a
16-byte chunk c (words 2j, 2j + 1: K elements 32c + 16j .. 32c + 16j + 15) takes scale half j, the
scale byte at offset 2c + j, of A and of B. (The bit-trick decode uses the same loop.)"""


def block_sum(a_words, b_words, decode: str) -> np.ndarray:
    """float32 sum of one 16-code block (2 words of A, 2 of B) as the kernel computes it with `decode`,
    before `DECODE_FACTOR` (bit trick: value * 2^-14; lookup: 4 * value)."""
    if decode == "lut":
        acc = np.zeros(np.shape(a_words[0]), dtype=np.int64)
        for w in range(2):
            for part_a, part_b in zip(decode_word_lut(a_words[w]), decode_b_word_lut(b_words[w])):
                acc = dp4a(part_a, part_b, acc)
        return acc.astype(np.float32)  # cvt.rn.f32.s32 (|acc| <= 2304: exact)
    if decode == "hw":
        a_dec, b_dec = decode_word_hw, decode_word_hw
    elif decode == "bitops":
        a_dec, b_dec = decode_word_bitops, decode_b_word_bitops
    else:
        raise ValueError(f"decode: expected 'hw', 'lut' or 'bitops', got {decode!r}")
    acc = np.zeros(np.shape(a_words[0]), dtype=np.uint32)
    a_halves, b_halves = [a_dec(w) for w in a_words], [b_dec(w) for w in b_words]
    for (wa, ia), (wb, ib) in HW_BLOCK:
        acc = fma_rn_f16x2(a_halves[wa][ia], b_halves[wb][ib], acc)
    return half2_sum_f32(acc)


def chunk_update(acc, a_words, b_words, sfa_pair, sfb_pair, decode: str) -> np.ndarray:
    """acc after one 16-byte chunk (4 words of A and of B, the u16 of 2 scale bytes each), as
    cute.gemv's chunk accumulation compiles: ``mul.f32`` of the scales (B's pre-multiplied by DECODE_FACTOR),
    then ``fma.rn.f32(scale product, block sum, acc)`` for block 0, then block 1."""
    sb = cvt_e4m3x2_f32(sfb_pair)
    sa = cvt_e4m3x2_f32(sfa_pair)
    factor = np.float32(DECODE_FACTOR[decode])
    for j in range(2):
        product = sa[j] * (sb[j] * factor)
        acc = fma_rn(product, block_sum(a_words[2 * j:2 * j + 2], b_words[2 * j:2 * j + 2], decode), acc, np.float32)
    return acc


# ---------------------------------------------------------------------------------------------
# The whole fast kernel


def load_words(chunks: np.ndarray) -> list[np.ndarray]:
    """[..., 16] bytes -> 4 little-endian uint32 words, as a ``ld.global.v4.u32`` reads them."""
    return list(np.moveaxis(np.ascontiguousarray(chunks).view("<u4"), -1, 0))


def fast_kernel_model(data, decode: str) -> tuple[np.ndarray, np.ndarray]:
    """(float32 [M, L] before the final rounding, float16 [M, L] as written to c) of the fast kernel
    on a CPU copy of the leaderboard tuple, with FP4 decode `decode` ("hw", "lut" or "bitops").

    Lane t of a row's warp takes 16-byte chunks t, t + 32, t + 64, ... (every tile walks them in this
    order; chunks past K/32 load as zeros and add nothing), accumulates them with `chunk_update`,
    and the 32 lane sums meet in a butterfly (``shfl.sync.bfly`` 16, 8, 4, 2, 1, each ``add.f32``):
    `chunked_kernel_model` with one warp per row.
    """
    n_chunks = tensor_bytes(data[0]).shape[1] // 16
    return chunked_kernel_model(data, WARP, -(-n_chunks // WARP), decode)


def chunked_kernel_model(data, threads_per_row: int, chunks_per_thread: int,
                         decode: str) -> tuple[np.ndarray, np.ndarray]:
    """(float32 [M, L] before the final rounding, float16 [M, L] as written) of a kernel whose rows are
    shared by ``threads_per_row`` threads (whole warps) of up to ``chunks_per_thread`` 16-byte chunks each,
    on a CPU copy of the leaderboard tuple: thread t accumulates chunks t, t + P, ... (those inside the
    row) with `chunk_update`, the lanes of warp w (threads 32w..32w+31) meet in the butterfly, and the
    warps' sums are added in order of w. The fast kernel (`fast_kernel_model`) and the per-K kernels
    (`nvfp4lib.study.whole_k_model`) are this model with their own thread layout."""
    if decode not in DECODE_FACTOR:
        raise ValueError(f"decode: expected one of {tuple(DECODE_FACTOR)}, got {decode!r}")
    a, b, sfa, sfb, *_ = data  # the permuted scales and c are not read
    a = tensor_bytes(a)  # [M, K/2, L]
    b = tensor_bytes(b)[0]  # [K/2, L], row 0: the vector
    sfa, sfb = tensor_bytes(sfa), tensor_bytes(sfb)[0]
    m, half_k, l = a.shape
    n_chunks, P, C = half_k // 16, threads_per_row, chunks_per_thread
    if P % WARP or C * P < n_chunks:
        raise ValueError(f"threads_per_row x chunks_per_thread must cover the {n_chunks} chunks in whole warps")
    pad = C * P - n_chunks
    # [L, M, C, P, 16] codes; [L, M, C, P] scale pairs (u16 of bytes 2c, 2c + 1)
    a_chunks = np.pad(a.transpose(2, 0, 1).reshape(l, m, n_chunks, 16), ((0, 0), (0, 0), (0, pad), (0, 0)))
    b_chunks = np.pad(b.T.reshape(l, 1, n_chunks, 16), ((0, 0), (0, 0), (0, pad), (0, 0)))
    sfa_pairs = np.pad(scale_pairs(sfa.transpose(2, 0, 1)), ((0, 0), (0, 0), (0, pad)))
    sfb_pairs = np.pad(scale_pairs(sfb.T[:, None, :]), ((0, 0), (0, 0), (0, pad)))
    shape = (l, m, C, P)
    a_words = load_words(a_chunks.reshape(*shape, 16))
    b_words = load_words(np.broadcast_to(b_chunks.reshape(l, 1, C, P, 16), (*shape, 16)))
    sfa_pairs, sfb_pairs = sfa_pairs.reshape(shape), np.broadcast_to(sfb_pairs.reshape(l, 1, C, P), shape)
    acc = np.zeros((l, m, P), dtype=np.float32)
    for i in range(C):
        inside = (np.arange(P) + i * P) < n_chunks  # threads past the row's end skip the chunk
        step = chunk_update(acc, [w[:, :, i] for w in a_words], [w[:, :, i] for w in b_words], sfa_pairs[:, :, i],
                            sfb_pairs[:, :, i], decode)
        acc = np.where(inside, step, acc)
    warps = acc.reshape(l, m, P // WARP, WARP)
    lanes = np.arange(WARP)
    for offset in (16, 8, 4, 2, 1):
        warps = warps + warps[..., lanes ^ offset]
    total = warps[..., 0, 0]  # every lane holds its warp's sum
    for w in range(1, P // WARP):
        total = total + warps[..., w, 0]
    total = total.T  # [M, L]
    return total, total.astype(np.float16)


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """A tensor of the tuple (any 1-byte dtype) as a numpy uint8 array of the same shape."""
    return t.detach().cpu().view(torch.uint8).numpy()


def scale_pairs(scales: np.ndarray) -> np.ndarray:
    """[..., K/16] scale bytes -> [..., K/32] u16 of (byte 2c, byte 2c + 1), as ``ld.u16`` reads them."""
    return scales[..., 0::2].astype(np.uint32) | scales[..., 1::2].astype(np.uint32) << 8
