"""CuTe DSL NVFP4 GEMV kernels: a naive baseline and a bandwidth-bound fast kernel.

Both read the leaderboard tensors in place and cover all L batches in one launch. The FP4
decode is picked at compile time from the target (``resolve_decode``): Blackwell (sm_100a and
newer) has the hardware ``cvt.rn.f16x2.e2m1x2``; Hopper has no FP4 instruction, so the fast
kernel looks codes up in a byte table with ``prmt`` and multiplies with integer ``dp4a``
(``_decode_word_lut``), and the naive one (or ``decode="bitops"``) rebuilds fp16 bit patterns
with integer operations (``_decode_word_bitops``). Scales use ``cvt.rn.f16x2.e4m3x2`` (sm_89+).

The fast kernel gives each warp ``rows_per_warp`` rows of one batch at a time (a "row
group"; warps walk row groups grid-stride). The lanes split K in 16-byte chunks (32 codes,
two 16-element scale blocks), so every load of A is a 128-bit load and one warp-instruction
reads 512 contiguous bytes of a row. B is decoded once per chunk and reused for all rows of
the warp. The loads of the next step are issued before the math of the current one. Each
16-element block is summed exactly (packed fp16, or int32 with the lookup: see ``_block_dot``
and ``_block_dot_lut``), then scaled and accumulated in fp32, reduced over the warp with
shuffles, and written as fp16. The tile shape is chosen per K (``default_config``). By default
it reads the plain scales ``sfa``/``sfb`` (64 contiguous bytes per warp load); the permuted
tensor-core layout is an option, slower for this access pattern (docs/cute_kernel_notes.md).

The kernels need nvidia-cutlass-dsl 4.6.0 or newer (``MIN_CUTE_DSL``: ``cute.arch.inline_ptx`` and
``cute.arch.fma_packed_f16x2`` first appear there); an older DSL is refused when compiling, with a
message naming the version (``DSL_PROBLEM``). The public leaderboard's harness imports ``OpError``
from ``cutlass.cute.nvgpu.common``, which the DSL removed in 4.7.0, so the leaderboard ran 4.6.x or
older; where these kernels cannot be built, the exported submissions fall back (nvfp4lib.submission).
They are called through TVM-FFI (integers and the raw stream handle, the cheapest host call) when
apache-tvm-ffi is installed, and through the DSL's plain call path (``Int64``/``Int32`` arguments
and a ``CUstream``) when it is not.
"""

from __future__ import annotations

import functools
import re
import sys
import tempfile
from dataclasses import dataclass

import torch

from .device import capabilities
from .validate import NVFP4InputError, TupleCache, validate_gemv_input

try:  # CuTe DSL is optional: everything else in the package works without it.
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float16, Float32, Int32, Int64, Uint32
    from cutlass.cute.runtime import make_fake_stream
    DSL_IMPORT_ERROR = None
except ImportError as missing:  # pragma: no cover - exercised on machines without the DSL
    cute = None
    DSL_IMPORT_ERROR = f"{type(missing).__name__}: {missing}"

MIN_CUTE_DSL = (4, 6, 0)  # cute.arch.inline_ptx and cute.arch.fma_packed_f16x2 first appear in 4.6.0
_SCALE_ATOM_BYTES = 512  # one 128-row x 4-scale-column tile of the permuted layout
_FP16_2_POW_14 = 0x74007400  # half2(16384, 16384)
_INT32_MAX = 2**31 - 1


def _dsl_problem() -> str | None:
    """Why the installed CuTe DSL cannot build these kernels (None: it can)."""
    if cute is None:
        return (f"the CuTe DSL could not be imported ({DSL_IMPORT_ERROR}); "
                f"pip install 'nvidia-cutlass-dsl>=4.6' apache-tvm-ffi")
    version = str(getattr(cutlass, "__version__", ""))
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if found and found < MIN_CUTE_DSL:  # no number (a source build): compiling will tell
        return (f"nvidia-cutlass-dsl {version} is too old for these kernels: they need 4.6.0 or newer "
                f"(cute.arch.inline_ptx, cute.arch.fma_packed_f16x2); pip install 'nvidia-cutlass-dsl>=4.6'")
    return None


DSL_PROBLEM = _dsl_problem()
"""Checked once, at import: None, or why `compile_gemv` will refuse (a missing or too old DSL)."""


@dataclass(frozen=True)
class FastConfig:
    """Compile-time shape of the fast kernel (one compiled variant per config)."""

    rows_per_warp: int = 4
    warps_per_block: int = 4
    unroll: int = 2  # 16-byte chunks per lane and row in one step
    blocks_per_sm: int = 4  # grid = min(work, SMs x this): warps loop over row groups
    compute: bool = True  # False: loads only, a wrong result that times the access pattern alone
    a_load: str = ".nc.L1::no_allocate"  # PTX qualifiers of the A loads (read once: skip L1)
    permuted_scales: bool = False  # read sfa_permuted/sfb_permuted instead of the plain sfa/sfb
    decode: str = "auto"  # FP4 decode: "hw" (sm_100a+), "lut" or "bitops" (any); "auto" picks per target

    @property
    def rows_per_block(self) -> int:
        return self.rows_per_warp * self.warps_per_block


# --------------------------------------------------------------------------- device code
# Plain Python helpers called from inside kernels are traced inline by the DSL.


def _e4m3x2_to_f32(pair):
    """Two E4M3 scales (one 16-bit load) -> two fp32 (``cvt ... e4m3x2`` exists from sm_89)."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 h2; .reg .f16 lo, hi;\n"
        " cvt.rn.f16x2.e4m3x2 h2, {$r0};\n"
        " mov.b32 {lo, hi}, h2;\n"
        " cvt.f32.f16 {$w0}, lo;\n"
        " cvt.f32.f16 {$w1}, hi; }",
        write_only_types=[Float32, Float32],
        read_only_args=[pair],
    )


def _half2_to_f32_pair(h2):
    """The two halves of a packed half2, as fp32."""
    return cute.arch.inline_ptx(
        "{ .reg .f16 lo, hi;\n mov.b32 {lo, hi}, {$r0};\n cvt.f32.f16 {$w0}, lo;\n cvt.f32.f16 {$w1}, hi; }",
        write_only_types=[Float32, Float32],
        read_only_args=[h2],
    )


def _half2_sum_f32(h2):
    """lo + hi of a packed half2, in fp32."""
    lo, hi = _half2_to_f32_pair(h2)
    return lo + hi


def _prmt(a, b, selector: int):
    return cute.arch.inline_ptx(
        f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {selector};",
        write_only_types=[Int32],
        read_only_args=[a, b],
    )


def _decode_word_bitops(word):
    """8 E2M1 codes (one 32-bit word) -> 4 half2 holding value * 2^-14, with bit operations.

    An E2M1 code is [sign | e1 e0 | m]. Placing e1 e0 m into fp16 bits 11..9 (the two low
    exponent bits and the top mantissa bit) and the sign into bit 15 gives an fp16 equal
    to the E2M1 value times 2^-14, for normal and subnormal codes alike. Each byte is first
    rewritten as [s 0 0 0 e1 e0 m 0], then a byte permute lifts two bytes into one half2.
    Pairs come out as (n2, n6), (n0, n4), (n3, n7), (n1, n5); A and B use the same order.
    """
    x = Uint32(word)
    even = ((x << 1) & Uint32(0x0E0E0E0E)) | ((x << 4) & Uint32(0x80808080))
    odd = ((x >> 3) & Uint32(0x0E0E0E0E)) | (x & Uint32(0x80808080))
    zero = Int32(0)
    return (
        Int32(even & Uint32(0xFF00FF00)),
        _prmt(Int32(even), zero, 0x2404),
        Int32(odd & Uint32(0xFF00FF00)),
        _prmt(Int32(odd), zero, 0x2404),
    )


def _decode_word_hw(word):
    """8 E2M1 codes -> 4 half2 of true values with Blackwell's hardware conversion."""
    return cute.arch.inline_ptx(
        "{ .reg .b8 b0, b1, b2, b3;\n"
        " mov.b32 {b0, b1, b2, b3}, {$r0};\n"
        " cvt.rn.f16x2.e2m1x2 {$w0}, b0;\n"
        " cvt.rn.f16x2.e2m1x2 {$w1}, b1;\n"
        " cvt.rn.f16x2.e2m1x2 {$w2}, b2;\n"
        " cvt.rn.f16x2.e2m1x2 {$w3}, b3; }",
        write_only_types=[Int32] * 4,
        read_only_args=[Int32(word)],
    )


def _decode_b_word(word, hw_e2m1: bool):
    """B is decoded to true fp16 values (the 2^-14 of the bit trick stays on A only)."""
    if hw_e2m1:
        return _decode_word_hw(word)
    two14 = Int32(_FP16_2_POW_14)
    zero = Int32(0)
    return tuple(
        cute.arch.fma_packed_f16x2(h, two14, zero) for h in _decode_word_bitops(word)
    )


def _block_dot(a_words, b_halves, hw_e2m1: bool):
    """Sum of a 16-element block (2 words of A, 8 half2 of B) in packed fp16, as fp32.

    Exact: every product is a multiple of 2^-16 (bit trick) or 1/4 (hardware decode) and
    each half2 lane sums 8 products of magnitude <= 36, which fp16 represents exactly.
    """
    acc = Int32(0)
    for w in range(2):
        a_halves = _decode_word_hw(a_words[w]) if hw_e2m1 else _decode_word_bitops(a_words[w])
        for h in range(4):
            acc = cute.arch.fma_packed_f16x2(a_halves[h], b_halves[4 * w + h], acc)
    return _half2_sum_f32(acc)


# Register lookup (Hopper): twice each E2M1 magnitude, as bytes: 0, 1, 2, 3, 4, 6, 8, 12.
_LUT_LO, _LUT_HI = 0x03020100, 0x0C080604
_SIGNS = 0x88888888  # the sign bit of each of the 8 codes of a word


def _lookup4(selectors):
    """Bytes 2|v| of the 4 codes in the low 16 bits of ``selectors``; 0 for negative codes.

    ``prmt`` picks byte ``code & 7`` of the table; a code's sign bit is prmt's
    sign-replicate flag, which yields 0x00 because no table byte has its top bit set.
    """
    return cute.arch.inline_ptx(
        f"prmt.b32 {{$w0}}, {_LUT_LO}, {_LUT_HI}, {{$r0}};", write_only_types=[Int32], read_only_args=[selectors]
    )


def _decode_word_lut(word):
    """8 E2M1 codes -> 2|v| bytes of the positive codes and of the negative ones.

    Returns (pos 0-3, pos 4-7, neg 0-3, neg 4-7): four words of 4 bytes, a byte 0 where the
    code has the other sign. a . b = pos . b + neg . (-b) then needs no sign arithmetic.
    """
    x = Uint32(word)
    flipped = x ^ Uint32(_SIGNS)
    return (_lookup4(Int32(x)), _lookup4(Int32(x >> 16)), _lookup4(Int32(flipped)), _lookup4(Int32(flipped >> 16)))


def _negate_bytes(v):
    """-v per byte for bytes in [0, 128] (no borrow crosses a byte)."""
    return Int32((Uint32(0x80808080) - Uint32(v)) ^ Uint32(0x80808080))


def _decode_b_word_lut(word):
    """8 E2M1 codes of B -> 2v as signed bytes, and -2v: (b 0-3, b 4-7, -b 0-3, -b 4-7)."""
    pos_lo, pos_hi, neg_lo, neg_hi = _decode_word_lut(word)
    return (pos_lo | _negate_bytes(neg_lo), pos_hi | _negate_bytes(neg_hi),
            neg_lo | _negate_bytes(pos_lo), neg_hi | _negate_bytes(pos_hi))


def _dp4a(a, b, acc):
    return cute.arch.inline_ptx(
        "dp4a.s32.s32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Int32], read_only_args=[a, b, acc]
    )


def _block_dot_lut(a_words, b_bytes):
    """4 x the sum of a 16-element block (2 words of A, 8 words of B bytes), in integers.

    Exact: |2a * 2b| <= 144, so a block sums to at most 2304 in magnitude.
    """
    acc = Int32(0)
    for w in range(2):
        parts = _decode_word_lut(a_words[w])
        for i in range(4):
            acc = _dp4a(parts[i], b_bytes[4 * w + i], acc)
    return cute.arch.inline_ptx("cvt.rn.f32.s32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[acc])


# --------------------------------------------------------------------------- fast kernel

def ld_global_v4_if(ptr, pred, hint: str):
    """128-bit load that yields zeros where ``pred`` is false (K tails, pipeline end)."""
    return cute.arch.inline_ptx(
        "{ .reg .pred p;\n setp.ne.b32 p, {$r1}, 0;\n"
        " mov.b32 {$w0}, 0; mov.b32 {$w1}, 0; mov.b32 {$w2}, 0; mov.b32 {$w3}, 0;\n"
        f" @p ld.global{hint}.v4.u32 {{{{$w0}}, {{$w1}}, {{$w2}}, {{$w3}}}}, [{{$r0}}]; }}",
        write_only_types=[Int32] * 4,
        read_only_args=[ptr, Int32(pred)],
    )


def _ld_global_u16_if(ptr, pred):
    return cute.arch.inline_ptx(
        "{ .reg .pred p;\n setp.ne.b32 p, {$r1}, 0;\n mov.b16 {$w0}, 0;\n @p ld.global.nc.u16 {$w0}, [{$r0}]; }",
        write_only_types=[cutlass.Int16],
        read_only_args=[ptr, Int32(pred)],
    )


def _make_staging(rows: int, unroll: int):
    """Register buffers for one step's loads: A words and scales of R rows, B words and scales.

    A step is U chunks of 16 bytes per lane. Keeping the loads in buffers lets the
    pipelined kernel issue the next step's loads before it computes the current one.
    """
    return (cute.make_rmem_tensor((rows * unroll * 4,), Int32), cute.make_rmem_tensor((rows * unroll,), cutlass.Int16),
            cute.make_rmem_tensor((unroll * 4,), Int32), cute.make_rmem_tensor((unroll,), cutlass.Int16))


def _stage_loads(stage, group, chunk0, n_chunks, live, rows: int, unroll: int, a_load: str):
    """Issue the loads of one step: chunks chunk0 + 32 * u of the rows of ``group``."""
    a_buf, sfa_buf, b_buf, sfb_buf = stage
    for u in range(unroll):
        chunk = chunk0 + 32 * u
        ok = live & (chunk < n_chunks)
        words = ld_global_v4_if(group.b_row + chunk * 16, ok, ".nc")
        for i in range(4):
            b_buf[4 * u + i] = words[i]
        sfb_buf[u] = _ld_global_u16_if(group.sfb_row + group.scale_offset(chunk), ok)
        for r in range(rows):
            words = ld_global_v4_if(group.a_rows[r] + chunk * 16, ok, a_load)
            for i in range(4):
                a_buf[(r * unroll + u) * 4 + i] = words[i]
            sfa_buf[r * unroll + u] = _ld_global_u16_if(group.sfa_rows[r] + group.scale_offset(chunk), ok)


def _stage_snapshot(stage):
    """The buffered values as plain registers, so the buffers can be refilled."""
    return tuple([buf[i] for i in range(cute.size(buf))] for buf in stage)


def _decode_factor(decode: str):
    """Undoes the decode's scaling of a product: 2^-14 on A (bit trick), 2 on A and on B (lookup)."""
    return Float32({"hw": 1.0, "bitops": 16384.0, "lut": 0.25}[decode])


def _accumulate_chunk(values, u: int, rows: int, unroll: int, acc, decode: str):
    """acc[r] += the dot products of chunk u of one step (``_block_dot`` / ``_block_dot_lut``)."""
    a, sfa, b, sfb = values
    b_dec = []
    for w in range(4):
        if cutlass.const_expr(decode == "lut"):
            b_dec.extend(_decode_b_word_lut(b[4 * u + w]))
        else:
            b_dec.extend(_decode_b_word(b[4 * u + w], decode == "hw"))
    factor = _decode_factor(decode)
    sb0, sb1 = _e4m3x2_to_f32(sfb[u])
    sb0, sb1 = sb0 * factor, sb1 * factor
    for r in range(rows):
        words = a[(r * unroll + u) * 4:(r * unroll + u) * 4 + 4]
        sa0, sa1 = _e4m3x2_to_f32(sfa[r * unroll + u])
        if cutlass.const_expr(decode == "lut"):
            d0 = _block_dot_lut(words[0:2], b_dec[0:8])
            d1 = _block_dot_lut(words[2:4], b_dec[8:16])
        else:
            d0 = _block_dot(words[0:2], b_dec[0:8], decode == "hw")
            d1 = _block_dot(words[2:4], b_dec[8:16], decode == "hw")
        acc[r] = acc[r] + d0 * (sa0 * sb0) + d1 * (sa1 * sb1)


def _touch(values, rows: int, acc):
    """Consume the loaded words with one XOR each, so the loads stay but the math is gone."""
    x = Int32(0)
    for buf in values:
        for v in buf:
            x = x ^ Int32(v)
    for r in range(rows):
        acc[r] = acc[r] + Float32(x)


def _scale_offset(chunk, permuted: bool):
    """Byte offset of the 2 scales of a 16-byte chunk (chunk c holds scale columns 2c, 2c+1),
    from the start of a row's scales: next to each other in the plain layout; in the permuted
    one, 4 columns per 512-byte atom."""
    return (chunk // 2) * _SCALE_ATOM_BYTES + (chunk % 2) * 2 if permuted else chunk * 2


class _RowGroup:
    """Pointers of one warp's rows (R consecutive rows of one batch) and their scales.

    Scales come from the plain [rows, K/16] layout (a lane's 2 scales sit next to its
    neighbours', so a warp's scale load is 64 contiguous bytes) or from the permuted
    tensor-core layout (2 bytes in each of 16 different 512-byte atoms per warp load).
    """

    def __init__(self, a, b, sfa, sfb, group, rows: int, permuted: bool):
        m_rows, kh = a.shape[0], a.shape[1]
        row = group * rows  # flat row index over (L, M)
        self.batch = row // m_rows
        self.m0 = row - self.batch * m_rows
        self.permuted = permuted
        self.b_row = b.iterator + Int64(self.batch) * Int64(128 * kh)
        self.a_rows = [a.iterator + Int64(row + r) * Int64(kh) for r in range(rows)]
        if permuted:
            rest_k, rest_m = kh // 32, m_rows // 128  # 4 scale columns (64 codes) per atom
            atoms = Int64(rest_k * _SCALE_ATOM_BYTES)
            self.sfb_row = sfb.iterator + Int64(self.batch) * atoms
            tile = sfa.iterator + Int64(self.batch * rest_m + self.m0 // 128) * atoms
            self.sfa_rows = [tile + ((self.m0 + r) % 32) * 16 + (((self.m0 + r) % 128) // 32) * 4 for r in range(rows)]
        else:
            self.sfb_row = sfb.iterator + Int64(self.batch) * Int64(128 * (kh // 8))
            self.sfa_rows = [sfa.iterator + Int64(row + r) * Int64(kh // 8) for r in range(rows)]

    def scale_offset(self, chunk):
        return _scale_offset(chunk, self.permuted)


def _fast_kernel_factory(cfg: FastConfig, decode: str):
    R, W, U = cfg.rows_per_warp, cfg.warps_per_block, cfg.unroll
    P = cfg.permuted_scales

    @cute.kernel
    def kernel(a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, c: cute.Tensor):
        """Each warp walks its row groups (grid-stride) one step at a time, and loads step
        t + 1 before it computes step t, so a warp always has a step of loads in flight."""
        tidx = cute.arch.thread_idx()[0]
        lane = tidx % 32
        n_chunks = a.shape[1] // 16
        steps_per_group = (n_chunks + 32 * U - 1) // (32 * U)
        n_groups = a.shape[0] * a.shape[2] // R
        first = cute.arch.block_idx()[0] * W + tidx // 32
        stride = cute.arch.grid_dim()[0] * W
        n_steps = Int32(0)
        if first < n_groups:
            n_steps = ((n_groups - first + stride - 1) // stride) * steps_per_group

        acc = cute.make_rmem_tensor((R,), Float32)
        for r in cutlass.range_constexpr(R):
            acc[r] = Float32(0.0)
        stage = _make_staging(R, U)
        # (load_group, load_step): the step whose loads are issued next, one ahead of (group_id, step)
        load_group, load_step = first, Int32(0)
        _stage_loads(stage, _RowGroup(a, b, sfa, sfb, load_group, R, P), lane, n_chunks, n_steps > 0, R, U, cfg.a_load)
        group_id, step = first, Int32(0)
        for t in range(n_steps):
            values = _stage_snapshot(stage)
            load_step = load_step + 1
            if load_step == steps_per_group:
                load_group, load_step = load_group + stride, Int32(0)
            _stage_loads(stage, _RowGroup(a, b, sfa, sfb, load_group, R, P), load_step * 32 * U + lane, n_chunks,
                         t + 1 < n_steps, R, U, cfg.a_load)
            if cutlass.const_expr(cfg.compute):
                for u in cutlass.range_constexpr(U):
                    _accumulate_chunk(values, u, R, U, acc, decode)
            else:
                _touch(values, R, acc)
            step = step + 1
            if step == steps_per_group:  # the row group is complete: reduce over the warp, write, reset
                done = _RowGroup(a, b, sfa, sfb, group_id, R, P)
                for r in cutlass.range_constexpr(R):
                    total = cute.arch.warp_reduction_sum(acc[r])
                    if lane == r:
                        c[done.m0 + r, 0, done.batch] = total.to(Float16)
                    acc[r] = Float32(0.0)
                group_id, step = group_id + stride, Int32(0)

    return kernel


# --------------------------------------------------------------------------- naive kernel


def _naive_kernel_factory(hw_e2m1: bool):
    @cute.kernel
    def kernel(a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, c: cute.Tensor):
        """One thread per (row, batch); 64-code K tiles; everything in fp32."""
        m_rows = a.shape[0]
        row = cute.arch.block_idx()[0] * cute.arch.block_dim()[0] + cute.arch.thread_idx()[0]
        if row < m_rows * a.shape[2]:
            one = _RowGroup(a, b, sfa, sfb, row, 1, True)  # this thread's row, permuted scales
            a_row, b_row, sfa_row, sfb_row, m, batch = one.a_rows[0], one.b_row, one.sfa_rows[0], one.sfb_row, one.m0, one.batch
            acc = Float32(0.0)
            for tile in range(a.shape[1] // 32):  # 64 codes = 32 bytes = 4 scale blocks per tile
                for blk in cutlass.range_constexpr(4):
                    scale_at = _scale_offset(2 * tile + blk // 2, True)
                    sa = _e4m3x2_to_f32(_ld_global_u16_if(sfa_row + scale_at, 1))[blk % 2]
                    sb = _e4m3x2_to_f32(_ld_global_u16_if(sfb_row + scale_at, 1))[blk % 2]
                    part = Float32(0.0)
                    for w in cutlass.range_constexpr(2):
                        off = tile * 32 + blk * 8 + w * 4
                        aw = cute.arch.inline_ptx(
                            "ld.global.u32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[a_row + off]
                        )
                        bw = cute.arch.inline_ptx(
                            "ld.global.u32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[b_row + off]
                        )
                        ah = _decode_word_hw(aw) if hw_e2m1 else _decode_word_bitops(aw)
                        bh = _decode_b_word(bw, hw_e2m1)
                        for h in cutlass.range_constexpr(4):
                            a_lo, a_hi = _half2_to_f32_pair(ah[h])
                            b_lo, b_hi = _half2_to_f32_pair(bh[h])
                            part = part + a_lo * b_lo + a_hi * b_hi
                    acc = acc + part * (sa * sb * _decode_factor("hw" if hw_e2m1 else "bitops"))
            c[m, 0, batch] = acc.to(Float16)

    return kernel


# --------------------------------------------------------------------------- compile & call


def _gmem_tensor(dtype, address, shape, stride, align: int):
    return cute.make_tensor(
        cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align), cute.make_layout(shape, stride=stride)
    )


def _leaderboard_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, kh, m, l, permuted_scales: bool):
    """CuTe views of the five tensors from their addresses, K/2, M and L.

    The call passes plain integers only (TVM-FFI converts those far faster than tensors).
    The strides are the documented ones, which the caller validated once per input.
    """
    u8 = cutlass.Uint8
    a = _gmem_tensor(u8, a_ptr, (m, kh, l), (kh, 1, m * kh), 16)
    b = _gmem_tensor(u8, b_ptr, (128, kh, l), (kh, 1, 128 * kh), 16)
    c = _gmem_tensor(Float16, c_ptr, (m, 1, l), (1, m, m), 2)  # [M, 1, L] of an (L, M, 1) buffer
    kb = kh // 8  # scale bytes per row
    if permuted_scales:
        rest_m, rest_k = m // 128, kb // 4
        atoms = rest_k * _SCALE_ATOM_BYTES
        sfa = _gmem_tensor(u8, sfa_ptr, (32, 4, rest_m, 4, rest_k, l), (16, 4, atoms, 1, _SCALE_ATOM_BYTES, rest_m * atoms), 16)
        sfb = _gmem_tensor(u8, sfb_ptr, (32, 4, 1, 4, rest_k, l), (16, 4, atoms, 1, _SCALE_ATOM_BYTES, atoms), 16)
    else:
        sfa = _gmem_tensor(u8, sfa_ptr, (m, kb, l), (kb, 1, m * kb), 4)
        sfb = _gmem_tensor(u8, sfb_ptr, (128, kb, l), (kb, 1, 128 * kb), 4)
    return a, b, sfa, sfb, c


def _reads_permuted(variant: str, cfg: FastConfig | None) -> bool:
    """Which scales a compiled kernel reads: the naive one (and -perm configs) the permuted ones."""
    return variant == "naive" or (cfg is not None and cfg.permuted_scales)


WIDE = FastConfig()  # 4 rows x 2 chunks per lane: 1 KB of each row per warp step
TALL = FastConfig(rows_per_warp=8, unroll=1)  # 8 rows x 1 chunk: steps of 32 chunks


def default_config(k: int) -> FastConfig:
    """The fast kernel's config for this K, as measured best on the H200.

    WIDE reads longer runs of each row, which the memory system serves better, but a step
    covers 64 chunks of 16 bytes; where K/32 chunks do not fill whole steps (K = 7168: 224
    chunks, 3.5 steps) its last step computes on zeros, and TALL is faster there.
    """
    return WIDE if (k // 32) % (32 * WIDE.unroll) == 0 else TALL


def _sm_count() -> int:
    """Multiprocessors of this GPU; a B200's 148 when cross-compiling without one."""
    return torch.cuda.get_device_properties().multi_processor_count if torch.cuda.is_available() else 148


HOPPER_DECODE = "lut"  # measured faster than "bitops" on the H200 (docs/cute_kernel_notes.md)


def resolve_decode(arch: str, decode: str = "auto") -> str:
    """The FP4 decode a kernel for ``arch`` uses: the hardware conversion where it exists."""
    has_hw = int(arch.removeprefix("sm_").rstrip("af")) >= 100
    if decode == "auto":
        return "hw" if has_hw else HOPPER_DECODE
    if decode not in ("hw", "lut", "bitops"):
        raise ValueError(f"decode: expected 'auto', 'hw', 'lut' or 'bitops', got {decode!r}")
    if decode == "hw" and not has_hw:
        raise ValueError(f"decode: 'hw' needs cvt.rn.f16x2.e2m1x2 (sm_100a or newer), not {arch}")
    return decode


def has_tvm_ffi() -> bool:
    """Whether apache-tvm-ffi imports: then the kernels are compiled for TVM-FFI calls."""
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return False
    return True


def compile_gemv(variant: str = "fast", arch: str | None = None, cfg: FastConfig = FastConfig(), options: str = "",
                 tvm_ffi: bool | None = None):
    """Compile one kernel variant for ``arch`` (e.g. "sm_100a", "sm_90a"); no GPU needed.

    ``options`` are extra CuTe DSL compile options (``compile_ptx`` uses them). ``tvm_ffi``: compile
    for TVM-FFI calls (`launch_arguments` says what each kind of call takes); None: where
    apache-tvm-ffi is installed.
    """
    if DSL_PROBLEM is not None:
        raise RuntimeError(DSL_PROBLEM)
    tvm_ffi = has_tvm_ffi() if tvm_ffi is None else tvm_ffi
    arch = arch or capabilities().cute_arch
    if arch is None:
        raise RuntimeError("no target: pass arch='sm_100a' or 'sm_90a' to cross-compile without a GPU")
    decode = resolve_decode(arch, cfg.decode)
    if variant == "fast":
        kernel = _fast_kernel_factory(cfg, decode)
        threads, rows_per_block = 32 * cfg.warps_per_block, cfg.rows_per_block
        max_blocks = _sm_count() * cfg.blocks_per_sm
    elif variant == "naive":
        kernel = _naive_kernel_factory(decode == "hw")
        threads, rows_per_block = 128, 128
        max_blocks = 1 << 30
    else:
        raise ValueError(f"variant: expected 'fast' or 'naive', got {variant!r}")

    permuted = _reads_permuted(variant, cfg)

    @cute.jit
    def launch(a_ptr: Int64, b_ptr: Int64, sfa_ptr: Int64, sfb_ptr: Int64, c_ptr: Int64, kh: Int32, m: Int32, l: Int32,
               stream):
        a, b, sfa, sfb, c = _leaderboard_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, kh, m, l, permuted)
        n_blocks = cutlass.min((m * l + rows_per_block - 1) // rows_per_block, max_blocks)
        kernel(a, b, sfa, sfb, c).launch(grid=[n_blocks, 1, 1], block=[threads, 1, 1], stream=stream)

    return cute.compile(launch, *[Int64(0)] * 5, *[Int32(1)] * 3, make_fake_stream(),
                        options=f"{'--enable-tvm-ffi ' if tvm_ffi else ''}--gpu-arch {arch} {options}")


MAX_ROWS = _INT32_MAX + 1 - 128
"""Largest M * L the kernels take: they count rows over all batches in 32-bit integers, and the grid
size (M * L + rows per block - 1) // rows per block, with up to 128 rows per block, must fit too."""


def check_launch_bounds(shape) -> None:
    """Refuse a shape whose row count or B batch stride would overflow the kernels' 32-bit integers.

    Every 32-bit quantity of a launch is bounded by M * L or by 128 * K/2 (B's and its scales' batch
    strides); addresses inside a batch are 64-bit. Checked on the host, once per input.
    """
    m, k, l = shape
    if m * l > MAX_ROWS:
        raise NVFP4InputError(f"a: expected M * L <= {MAX_ROWS} (the CuTe kernels count rows over all batches in "
                              f"32-bit integers), got M * L = {m} * {l} = {m * l}")
    if 128 * (k // 2) > _INT32_MAX:
        raise NVFP4InputError(f"b: expected 128 * K/2 <= {_INT32_MAX} (a batch of the padded vector, addressed "
                              f"with 32-bit integers), got K = {k}")


def launch_arguments(pointers, kh: int, m: int, l: int, tvm_ffi: bool) -> tuple:
    """The arguments of a compiled kernel before the stream: plain integers through TVM-FFI; the
    DSL's own Int64/Int32 values through its plain call path (a Python int would become an Int32)."""
    if tvm_ffi:
        return (*pointers, kh, m, l)
    return (*[Int64(p) for p in pointers], Int32(kh), Int32(m), Int32(l))


def stream_argument(handle: int, tvm_ffi: bool):
    """The CUDA stream as a compiled kernel takes it: the raw handle through TVM-FFI, else a CUstream."""
    if tvm_ffi:
        return handle
    from cuda.bindings.driver import CUstream

    return CUstream(handle)


def _compile_artifact(variant: str, arch: str, cfg: FastConfig, kind: str):
    """Compile in a scratch folder and return the kept ``kind`` ("ptx" or "cubin"); no GPU needed."""
    with tempfile.TemporaryDirectory() as tmp:
        return getattr(compile_gemv(variant, arch, cfg, options=f"--keep-{kind} --dump-dir {tmp}"), f"__{kind}__")


def compile_ptx(variant: str = "fast", arch: str = "sm_100a", cfg: FastConfig = FastConfig()) -> str:
    """The PTX of one variant for ``arch``, compiled on any machine (no GPU needed)."""
    return _compile_artifact(variant, arch, cfg, "ptx")


def compile_cubin(variant: str = "fast", arch: str = "sm_100a", cfg: FastConfig = FastConfig()) -> bytes:
    """The machine code (cubin) of one variant for ``arch``, compiled on any machine."""
    cubin = _compile_artifact(variant, arch, cfg, "cubin")
    return cubin if isinstance(cubin, bytes) else cubin.encode("latin1")


@functools.cache
def _compiled(variant: str, arch: str, cfg: FastConfig, tvm_ffi: bool):
    return compile_gemv(variant, arch, cfg, tvm_ffi=tvm_ffi)


class CuteGemv:
    """A compiled kernel bound to this GPU, called with the leaderboard tuple.

    ``cfg=None`` (the fast variant's default) picks ``default_config(K)`` per input. The
    per-call host path is kept to a dict lookup and one call of the compiled kernel (through
    TVM-FFI with integer arguments where apache-tvm-ffi is installed): inputs are validated once
    per input tuple and their launch arguments and kernel remembered with it (``TupleCache``).
    """

    def __init__(self, variant: str = "fast", cfg: FastConfig | None = None, cache_entries: int = 4):
        if variant not in ("fast", "naive"):
            raise ValueError(f"variant: expected 'fast' or 'naive', got {variant!r}")
        caps = capabilities()
        self.variant, self.cfg, self.arch = variant, cfg, caps.cute_arch
        self.tvm_ffi = has_tvm_ffi()
        # Compiled now, not inside a timed or captured call. Without a GPU nothing is
        # compiled; a call then fails validation, naming the argument.
        configs = [cfg] if cfg is not None else [WIDE, TALL] if variant == "fast" else [FastConfig()]
        if caps.cuda and not self.tvm_ffi:
            print("CuTe DSL: apache-tvm-ffi is not installed, so the kernels are called through the DSL's plain "
                  "call path (Int64/Int32 arguments and a CUstream: a slower host call)", file=sys.stderr)
        self._kernels = {c: _compiled(variant, self.arch, c, self.tvm_ffi) for c in configs} if caps.cuda else {}
        self._prepared = TupleCache(cache_entries)

    def config_for(self, k: int) -> FastConfig:
        """The config a call with this K runs."""
        if self.cfg is not None:
            return self.cfg
        return default_config(k) if self.variant == "fast" else FastConfig()

    def _prepare(self, data):
        return self._prepared.get(data, self._arguments)

    def _arguments(self, data):
        shape = validate_gemv_input(data, device="cuda")
        check_launch_bounds(shape)
        a, b, sfa, sfb, sfa_p, sfb_p, c = data
        if c.device.index != torch.cuda.current_device():
            raise NVFP4InputError(f"c: expected a tensor on the current device cuda:{torch.cuda.current_device()}, "
                                  f"got {c.device} (call under torch.cuda.device({c.device.index}))")
        if _reads_permuted(self.variant, self.cfg):
            sfa, sfb = sfa_p, sfb_p
        pointers = (a.data_ptr(), b.data_ptr(), sfa.data_ptr(), sfb.data_ptr(), c.data_ptr())
        args = launch_arguments(pointers, shape.k // 2, shape.m, shape.l, self.tvm_ffi)
        return self._kernels[self.config_for(shape.k)], args, c.device.index

    def __call__(self, data, stream: torch.cuda.Stream | None = None) -> torch.Tensor:
        fn, args, device = self._prepare(data)
        handle = current_stream_handle(device) if stream is None else stream.cuda_stream
        fn(*args, handle if self.tvm_ffi else stream_argument(handle, False))
        return data[-1]


def current_stream_handle(device: int) -> int:
    """The raw handle of this device's current stream (a C call; no Stream object is built)."""
    return torch._C._cuda_getCurrentRawStream(device)


_runners: dict[tuple, CuteGemv] = {}


def gemv_cute(data, variant: str = "fast", cfg: FastConfig | None = None, stream=None) -> torch.Tensor:
    """c = A @ B per batch with a CuTe DSL kernel (on ``stream`` or the current one); returns c.

    Kernels are compiled once per (variant, config) and kept; ``cfg=None`` picks the default
    config for the input's K (``default_config``).
    """
    runner = _runners.get((variant, cfg))
    if runner is None:
        runner = _runners[variant, cfg] = CuteGemv(variant, cfg)
    return runner(data, stream)
