"""FP4 (E2M1) decode and 16-code block dot products, as the CuTe kernels trace them.

Three decodes of a 32-bit word of 8 codes, picked per target when a kernel is compiled
(`nvfp4lib.cute.launch.resolve_decode`):

* "hw" (sm_100a and newer): Blackwell's ``cvt.rn.f16x2.e2m1x2``, one instruction per byte
  (`decode_word_hw`); true fp16 values.
* "lut" (Hopper's default): ``prmt`` looks the codes up in a byte table of twice their magnitudes held
  in two registers or two immediates (`decode_word_lut`'s ``lookup``), and integer ``dp4a`` multiplies
  (`block_dot_lut2`).
* "bitops" (any target): integer operations rebuild the fp16 bit patterns, which come out as the value
  times 2^-14 (`decode_word_bitops`).

A 16-code block (2 words of A against 2 of B) is summed exactly, in packed fp16 (`block_dot`) or in int32
(`block_dot_lut2`); `DECODE_FACTOR` undoes what the decode scaled the products by and is folded into B's block
scale (the constants are in `nvfp4lib.cute.constants`). A chunk of B is decoded once (`decode_b_chunk`) and
added to every row's accumulator (`accumulate_chunk`), as the per-K kernels do, with decode "hw" or "lut";
the naive kernel and the generic kernels (`nvfp4lib.study.generic_kernels`: the bit trick too, B negated for
`block_dot_lut`) build their own from the same pieces.
Plain Python helpers: a kernel calls them while it is traced, so they emit their instructions inline; the
study wing (`nvfp4lib.study.decode_models`) models each of them bit for bit in numpy."""

from __future__ import annotations

from nvfp4lib.cute.constants import DECODE_FACTOR, FP16X2_2_POW_14, SIGN_BITS
from nvfp4lib.cute.ptx import (Float32, Int32, Uint32, dp4a, e2m1x8_to_f16x2, e4m3x2_to_f32, fma_rn_f16x2, fma_rn_f32,
                               half2_to_f32_pair, prmt, s32_to_f32)


# --------------------------------------------------------------------------- packed fp16 decodes


def decode_word_bitops(word):
    """8 E2M1 codes (one 32-bit word) -> 4 half2 holding value * 2^-14, with bit operations. An E2M1 code
    is [sign | e1 e0 | m]. Placing e1 e0 m into fp16 bits 11..9 (the two low exponent bits and the top mantissa
    bit) and the sign into bit 15 gives an fp16 equal to the E2M1 value times 2^-14, for normal and subnormal
    codes alike. Each byte is first rewritten as [s 0 0 0 e1 e0 m 0], then a byte permute lifts two bytes into
    one half2. Pairs come out as (n2, n6), (n0, n4), (n3, n7), (n1, n5); A and B use the same order."""
    x = Uint32(word)
    even = ((x << 1) & Uint32(0x0E0E0E0E)) | ((x << 4) & Uint32(0x80808080))
    odd = ((x >> 3) & Uint32(0x0E0E0E0E)) | (x & Uint32(0x80808080))
    zero = Int32(0)
    return (
        Int32(even & Uint32(0xFF00FF00)),
        prmt(Int32(even), zero, 0x2404),
        Int32(odd & Uint32(0xFF00FF00)),
        prmt(Int32(odd), zero, 0x2404),
    )


def decode_word_hw(word):
    """8 E2M1 codes -> 4 half2 of true values with Blackwell's hardware conversion (half2 i = byte i)."""
    return e2m1x8_to_f16x2(Int32(word))


def decode_b_word(word, hw_e2m1: bool):
    """B is decoded to true fp16 values (the 2^-14 of the bit trick stays on A only)."""
    if hw_e2m1:
        return decode_word_hw(word)
    two14 = Int32(FP16X2_2_POW_14)
    zero = Int32(0)
    return tuple(
        fma_rn_f16x2(h, two14, zero) for h in decode_word_bitops(word)
    )


def block_dot(a_words, b_halves, decode_a=decode_word_hw):
    """Sum of a 16-element block (2 words of A, 8 half2 of B) in packed fp16, as fp32; A decoded by ``decode_a``
    (`decode_word_hw` or `decode_word_bitops`, whose B is `decode_b_word`'s). Exact: every product is a multiple
    of 2^-16 (bit trick) or 1/4 (hardware decode) and each half2 lane sums 8 products of magnitude <= 36, which
    fp16 represents exactly."""
    acc = Int32(0)
    for w in range(2):
        a_halves = decode_a(a_words[w])
        for h in range(4):
            acc = fma_rn_f16x2(a_halves[h], b_halves[4 * w + h], acc)
    lo, hi = half2_to_f32_pair(acc)  # the two lanes' sums, added in fp32
    return lo + hi


# --------------------------------------------------------------------------- byte-table lookup (Hopper)


def decode_word_lut(word, lookup):
    """8 E2M1 codes -> 2|v| bytes of the positive codes and of the negative ones. Returns (pos 0-3, pos 4-7, neg 0-3,
    neg 4-7): four words of 4 bytes, a byte 0 where the code has the other sign. a . b = pos . b + neg . (-b) then
    needs no sign arithmetic. ``lookup(selectors)`` is a ``prmt`` on the table (LUT_LO, LUT_HI): in two registers
    (``functools.partial(prmt_lookup, lo, hi)``) or two immediates (`prmt_table`); it picks byte ``code & 7`` for
    each of the 4 codes in the low 16 bits of ``selectors``, and a code's sign bit is prmt's sign-replicate flag,
    which yields 0x00 because no table byte has its top bit set."""
    x = Uint32(word)
    flipped = x ^ Uint32(SIGN_BITS)
    return lookup(Int32(x)), lookup(Int32(x >> 16)), lookup(Int32(flipped)), lookup(Int32(flipped >> 16))


def negate_bytes(v):
    """-v per byte for bytes in [0, 128] (no borrow crosses a byte)."""
    return Int32((Uint32(0x80808080) - Uint32(v)) ^ Uint32(0x80808080))


def decode_b_signed(word, lookup):
    """8 E2M1 codes of B -> 2v as signed bytes: (b 0-3, b 4-7), the words `block_dot_lut2` takes."""
    pos_lo, pos_hi, neg_lo, neg_hi = decode_word_lut(word, lookup)
    return pos_lo | negate_bytes(neg_lo), pos_hi | negate_bytes(neg_hi)


def block_dot_lut2(a_words, b_signed, lookup):
    """4 x the sum of a 16-element block (2 words of A, 4 words of B's signed bytes), as fp32: the
    lookup splits A by sign, and two int32 accumulators sum 2|a| * 2b over the positive and the
    negative codes (each |sum| <= 16 * 144 = 2304, exact); their difference is converted once. B
    needs no negated copy (half the registers of `block_dot_lut`'s)."""
    pos, neg = Int32(0), Int32(0)
    for w in range(2):
        pos_lo, pos_hi, neg_lo, neg_hi = decode_word_lut(a_words[w], lookup)
        b_lo, b_hi = b_signed[2 * w], b_signed[2 * w + 1]
        pos = dp4a(pos_hi, b_hi, dp4a(pos_lo, b_lo, pos))
        neg = dp4a(neg_hi, b_hi, dp4a(neg_lo, b_lo, neg))
    return s32_to_f32(pos - neg)


# --------------------------------------------------------------------------- a chunk into the accumulators (per-K)


def scaled_b(sfb_pair, decode: str):
    """B's two block scales of a chunk as fp32, times `DECODE_FACTOR` (folded in once per chunk of B)."""
    factor = Float32(DECODE_FACTOR[decode])
    sb0, sb1 = e4m3x2_to_f32(sfb_pair)
    return sb0 * factor, sb1 * factor


def decode_b_chunk(words, decode: str, lookup=None) -> list:
    """A 16-byte chunk of B (4 words) decoded for `chunk_dots`: for "hw" 4 half2 per word (`decode_word_hw`), for
    "lut" 2 words of signed bytes (`decode_b_signed`)."""
    if decode == "hw":
        return [x for w in range(4) for x in decode_word_hw(words[w])]
    return [x for w in range(4) for x in decode_b_signed(words[w], lookup)]


def chunk_dots(a_words, b_dec, decode: str, lookup=None):
    """The two 16-element block sums of a 16-byte chunk: 4 words of A against B's chunk (`decode_b_chunk`),
    exact, `DECODE_FACTOR` times the true sums. ``lookup``: see `decode_word_lut`."""
    if decode == "hw":
        return block_dot(a_words[0:2], b_dec[0:8]), block_dot(a_words[2:4], b_dec[8:16])
    return block_dot_lut2(a_words[0:2], b_dec[0:4], lookup), block_dot_lut2(a_words[2:4], b_dec[4:8], lookup)


def accumulate_chunk(acc, a_chunks, sfa_pairs, b_dec, sb, decode: str, lookup=None, dots=chunk_dots):
    """acc[r] += the two scaled block sums of row r's chunk (``a_chunks[r]``: 4 words, ``sfa_pairs[r]``
    its scales) against one chunk of B (``b_dec``: `decode_b_chunk`; ``sb``: `scaled_b`), for every row,
    each block added with ``fma.rn.f32(sa * sb, block sum, acc)``, block 0 then 1: the order
    `nvfp4lib.study.whole_k_model` reproduces. ``dots``: `chunk_dots`, or a benchmark form's own."""
    for r in range(len(a_chunks)):
        sa0, sa1 = e4m3x2_to_f32(sfa_pairs[r])
        d0, d1 = dots(a_chunks[r], b_dec, decode, lookup)
        acc[r] = fma_rn_f32(sa1 * sb[1], d1, fma_rn_f32(sa0 * sb[0], d0, acc[r]))
