"""The generic CuTe GEMV kernels that led to the per-K one: the fast kernel (wide and tall tiles, `FastConfig`)
and the tiled kernel (`TiledConfig`), with the rule that chose between them per K before the per-K kernel
served every K (`generic_config`).

Notebook 04's progression and the benchmarks run them (`nvfp4lib.bench.cute_bench`, `nvfp4lib.bench.profile`);
the core runs only the per-K and naive kernels of `nvfp4lib.cute`. A config here is any config the core's host
takes (`cute.gemv.CuteRunner`, `cute.gemv.compile_ptx`): it compiles its own kernel (`kernel`).

The fast kernel gives each warp ``rows_per_warp`` rows of one batch at a time (a "row group"; warps walk row
groups grid-stride). The lanes split K in 16-byte chunks (32 codes, two 16-element scale blocks), so every load
of A is a 128-bit load and one warp-instruction reads 512 contiguous bytes of a row. B is decoded once per
chunk and reused for all rows of the warp. Each 16-element block is summed exactly
(`generic_chunk_dots`), then scaled and accumulated in fp32, reduced over the warp with shuffles,
and written as fp16. By default it reads the plain scales ``sfa``/``sfb`` (64 contiguous bytes per warp load);
the permuted tensor-core layout is an option, slower for this access pattern (docs/cute_kernel_notes.md)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from nvfp4lib.contract import B_ROWS, SCALE_ATOM_BYTES, SCALE_TILE_ROWS
from nvfp4lib.cute.constants import DECODE_FACTOR, LUT_HI, LUT_LO
from nvfp4lib.cute.decode import (block_dot, decode_b_word, decode_word_bitops, decode_word_hw, decode_word_lut,
                                  negate_bytes, scaled_b)
from nvfp4lib.cute.gemv import MAX_ROWS_PER_BLOCK, OneKernelForEveryK, row_blocks
from nvfp4lib.cute.ptx import (Float16, Float32, Int32, Int64, cute, cutlass, dp4a, e4m3x2_to_f32, ld_global_u16_if,
                               ld_global_v4_if, ld_shared, prefetch_l2_if, prmt_lookup, prmt_table, s32_to_f32,
                               smem_allocator, smem_words, st_shared)


@dataclass(frozen=True)
class FastConfig(OneKernelForEveryK):
    """Compile-time shape of the fast kernel (one compiled variant per config)."""

    rows_per_warp: int = 4
    warps_per_block: int = 4
    unroll: int = 2  # 16-byte chunks per lane and row in one step
    blocks_per_sm: int = 4  # grid = min(work, SMs x this): warps loop over row groups
    compute: bool = True  # False: loads only, a wrong result that times the access pattern alone
    a_load: str = ".nc.L1::no_allocate"  # PTX qualifiers of the A loads (read once: skip L1)
    permuted_scales: bool = False  # read sfa_permuted/sfb_permuted instead of the plain sfa/sfb
    decode: str = "auto"  # FP4 decode: "hw" (sm_100a+), "lut" or "bitops" (any); "auto" picks per target
    prefetch: int = 0  # steps ahead whose A rows are prefetched into L2 (bulk prefetch, sm_90+); 0: none
    lut_registers: bool = False  # "lut" decode: the table loaded into registers (`lut_table`), not immediates

    def __post_init__(self):
        if min(self.rows_per_warp, self.warps_per_block, self.unroll, self.blocks_per_sm) < 1 or self.prefetch < 0:
            raise ValueError(f"FastConfig: expected rows_per_warp, warps_per_block, unroll and blocks_per_sm >= 1 and "
                             f"prefetch >= 0, got {self}")
        if MAX_ROWS_PER_BLOCK % self.rows_per_block or self.rows_per_warp > 32:
            raise ValueError(f"rows_per_warp x warps_per_block: expected a divisor of {MAX_ROWS_PER_BLOCK} with at "
                             f"most 32 rows per warp (a lane writes each), got {self.rows_per_warp} x "
                             f"{self.warps_per_block}")

    @property
    def rows_per_block(self) -> int:
        return self.rows_per_warp * self.warps_per_block


    def kernel(self, decode: str) -> tuple:
        """(the fast kernel, threads per block, grid): warps loop over row groups, so the grid stops at
        ``blocks_per_sm`` blocks per multiprocessor."""
        return (make_fast_kernel(self, decode), 32 * self.warps_per_block,
                row_blocks(self.rows_per_block, sm_count() * self.blocks_per_sm))


# --------------------------------------------------------------------------- the generic kernels' block sums
# B decoded once per chunk (for "lut" with its negation, for `block_dot_lut`), the table optionally in
# registers, and each chunk added as the compiler contracts it; the per-K kernels use `nvfp4lib.cute.decode`'s
# forms (B's signed bytes alone, `block_dot_lut2`, one ``fma.rn.f32`` per block).


def lut_table_smem(smem) -> Int32:
    """Shared memory for one copy of the lookup table per lane (`lut_table`), as a shared address."""
    return smem_words(smem, 2 * 32, 8)


def store_lut_table(table_addr, lane):
    """Lane ``lane``'s copy of (LUT_LO, LUT_HI); warp 0 stores them, before a barrier."""
    st_shared(table_addr + lane * 8, [Int32(LUT_LO), Int32(LUT_HI)])


def lut_table(table_addr, lane):
    """The lookup table as two registers, each lane reading its own copy. As immediates (`prmt_table`)
    or as one warp-uniform load, ptxas holds the first word in a uniform register and moves it into
    a register again before most `prmt`; a per-lane load is a value it keeps in a register."""
    return ld_shared(table_addr + lane * 8, Int32, 2)


def table_lookup(table=None):
    """`cute.decode.decode_word_lut`'s lookup: the table in registers (``table``: `lut_table`'s pair) or, for
    None, as two immediates (`prmt_table`)."""
    if table is None:
        return functools.partial(prmt_table, LUT_LO, LUT_HI)
    return functools.partial(prmt_lookup, *table)


def decode_b_word_lut(word, table=None):
    """8 E2M1 codes of B -> 2v as signed bytes, and -2v: (b 0-3, b 4-7, -b 0-3, -b 4-7)."""
    pos_lo, pos_hi, neg_lo, neg_hi = decode_word_lut(word, table_lookup(table))
    return (pos_lo | negate_bytes(neg_lo), pos_hi | negate_bytes(neg_hi),
            neg_lo | negate_bytes(pos_lo), neg_hi | negate_bytes(pos_hi))


def decode_b_word_as(word, decode: str, table=None):
    """8 E2M1 codes of B -> the words that ``decode``'s block dot takes here: 4 half2 (`decode_b_word`), or for
    "lut" the signed bytes and their negation (`decode_b_word_lut`, for `block_dot_lut`). ``table``: see
    `table_lookup`."""
    if decode != "lut":
        return decode_b_word(word, decode == "hw")
    return decode_b_word_lut(word, table)


def block_dot_lut(a_words, b_bytes, table=None):
    """4 x the sum of a 16-element block (2 words of A, 8 words of B bytes), in integers, as fp32. Exact:
    |2a * 2b| <= 144, so a block sums to at most 2304 in magnitude."""
    acc = Int32(0)
    for w in range(2):
        parts = decode_word_lut(a_words[w], table_lookup(table))
        for i in range(4):
            acc = dp4a(parts[i], b_bytes[4 * w + i], acc)
    return s32_to_f32(acc)


def loads_xor(values):
    """The loads-only kernels' stand-in for the math: every loaded value (buffers of words) XORed into
    one word, as fp32, so that the loads stay and the decode and the math are gone (a wrong result)."""
    x = Int32(0)
    for buf in values:
        for v in buf:
            x = x ^ Int32(v)
    return Float32(x)


def generic_chunk_dots(a_words, b_dec, decode: str, table=None):
    """The two 16-element block sums of a 16-byte chunk: 4 words of A against B's chunk decoded by
    `decode_b_word_as` (exact; `DECODE_FACTOR` times the true sums)."""
    if decode != "lut":
        decode_a = decode_word_hw if decode == "hw" else decode_word_bitops
        return block_dot(a_words[0:2], b_dec[0:8], decode_a), block_dot(a_words[2:4], b_dec[8:16], decode_a)
    return block_dot_lut(a_words[0:2], b_dec[0:8], table), block_dot_lut(a_words[2:4], b_dec[8:16], table)


def generic_accumulate_chunk(acc, a_chunks, sfa_pairs, b_dec, sb, decode: str, table=None):
    """acc[r] += the two scaled block sums of row r's chunk (``a_chunks[r]``: 4 words, ``sfa_pairs[r]`` its
    scales) against one chunk of B (``b_dec``: `decode_b_word_as` of its 4 words; ``sb``: `scaled_b`), for
    every row: ``acc + d0 * (sa0 * sb0) + d1 * (sa1 * sb1)``, as the compiler contracts it."""
    for r in range(len(a_chunks)):
        sa0, sa1 = e4m3x2_to_f32(sfa_pairs[r])
        d0, d1 = generic_chunk_dots(a_chunks[r], b_dec, decode, table)
        acc[r] = acc[r] + d0 * (sa0 * sb[0]) + d1 * (sa1 * sb[1])


# --------------------------------------------------------------------------- fast kernel


def _make_staging(rows: int, unroll: int):
    """Register buffers for one step's loads (U chunks of 16 bytes per lane): A words and scales of R rows, B
    words and scales, so that the kernel can issue the next step's loads before it computes the current one."""
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
        sfb_buf[u] = ld_global_u16_if(group.sfb_row + group.scale_offset(chunk), ok)
        for r in range(rows):
            words = ld_global_v4_if(group.a_rows[r] + chunk * 16, ok, a_load)
            for i in range(4):
                a_buf[(r * unroll + u) * 4 + i] = words[i]
            sfa_buf[r * unroll + u] = ld_global_u16_if(group.sfa_rows[r] + group.scale_offset(chunk), ok)


def _stage_snapshot(stage):
    """The buffered values as plain registers, so the buffers can be refilled."""
    return tuple([buf[i] for i in range(cute.size(buf))] for buf in stage)


def _accumulate_step_chunk(values, u: int, rows: int, unroll: int, acc, decode: str, table):
    """acc[r] += the dot products of chunk u of one step (`generic_accumulate_chunk`)."""
    a, sfa, b, sfb = values
    a_chunks = [a[(r * unroll + u) * 4:(r * unroll + u) * 4 + 4] for r in range(rows)]
    b_dec = [x for w in range(4) for x in decode_b_word_as(b[4 * u + w], decode, table)]
    generic_accumulate_chunk(acc, a_chunks, sfa[u::unroll], b_dec, scaled_b(sfb[u], decode), decode, table)


def scale_offset(chunk, permuted: bool):
    """Byte offset of the 2 scales of a 16-byte chunk (chunk c holds scale columns 2c, 2c+1),
    from the start of a row's scales: next to each other in the plain layout; in the permuted
    one, 4 columns per 512-byte atom."""
    return (chunk // 2) * SCALE_ATOM_BYTES + (chunk % 2) * 2 if permuted else chunk * 2


def _prefetch_step(group, step, n_groups, n_chunks, lane, rows: int, unroll: int):
    """Prefetch into L2 the A bytes of step ``step`` of row group ``group`` (if it exists): lane r
    asks for row r's run of up to 32 * U chunks, clamped to the row's end."""
    chunk0 = step * 32 * unroll
    left = (n_chunks - chunk0) * 16  # bytes of the row from chunk0 on
    for r in range(rows):
        prefetch_l2_if(group.a_rows[r] + chunk0 * 16, left, 512 * unroll,
                       (lane == r) & (group.index < n_groups) & (left > 0))


class _RowGroup:
    """Pointers of one warp's rows (R consecutive rows of one batch) and their scales: plain [rows, K/16] (a
    warp's scale load is 64 contiguous bytes) or permuted (2 bytes in each of 16 512-byte atoms per warp load)."""

    def __init__(self, a, b, sfa, sfb, group, rows: int, permuted: bool):
        m_rows, kh = a.shape[0], a.shape[1]
        row = group * rows  # flat row index over (L, M)
        self.index = group
        self.batch = row // m_rows
        self.m0 = row - self.batch * m_rows
        self.permuted = permuted
        self.b_row = b.iterator + Int64(self.batch) * Int64(B_ROWS * kh)
        self.a_rows = [a.iterator + Int64(row + r) * Int64(kh) for r in range(rows)]
        if permuted:
            rest_k, rest_m = kh // 32, m_rows // SCALE_TILE_ROWS  # 4 scale columns (64 codes = 32 bytes) per atom
            atoms = Int64(rest_k * SCALE_ATOM_BYTES)
            self.sfb_row = sfb.iterator + Int64(self.batch) * atoms
            tile = sfa.iterator + Int64(self.batch * rest_m + self.m0 // SCALE_TILE_ROWS) * atoms
            self.sfa_rows = [tile + ((self.m0 + r) % 32) * 16 + (((self.m0 + r) % SCALE_TILE_ROWS) // 32) * 4
                             for r in range(rows)]
        else:
            self.sfb_row = sfb.iterator + Int64(self.batch) * Int64(B_ROWS * (kh // 8))
            self.sfa_rows = [sfa.iterator + Int64(row + r) * Int64(kh // 8) for r in range(rows)]

    def scale_offset(self, chunk):
        return scale_offset(chunk, self.permuted)


def make_fast_kernel(cfg: FastConfig, decode: str):
    """The fast kernel for one config and FP4 decode (``resolve_decode``), to launch or compile."""
    R, W, U = cfg.rows_per_warp, cfg.warps_per_block, cfg.unroll
    P = cfg.permuted_scales

    @cute.jit
    def next_step(group, step, steps_per_group, stride):
        """(row group, step) after step ``step`` of row group ``group``: a warp's next row group starts at step 0."""
        step = step + 1
        if step == steps_per_group:
            group, step = group + stride, Int32(0)
        return group, step

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
        table = None
        if cutlass.const_expr(cfg.lut_registers and decode == "lut" and cfg.compute):
            table_addr = lut_table_smem(smem_allocator())
            if tidx < 32:
                store_lut_table(table_addr, tidx)
            cute.arch.sync_threads()
            table = lut_table(table_addr, lane)
        stage = _make_staging(R, U)
        # (load_group, load_step): the step whose loads are issued next, one ahead of (group_id, step)
        load_group, load_step = first, Int32(0)
        _stage_loads(stage, _RowGroup(a, b, sfa, sfb, load_group, R, P), lane, n_chunks, n_steps > 0, R, U, cfg.a_load)
        group_id, step = first, Int32(0)
        # (pf_group, pf_step): the step prefetched into L2 last, `cfg.prefetch` steps ahead of the loads
        pf_group, pf_step = first, Int32(0)
        for _ in cutlass.range_constexpr(cfg.prefetch):
            pf_group, pf_step = next_step(pf_group, pf_step, steps_per_group, stride)
            _prefetch_step(_RowGroup(a, b, sfa, sfb, pf_group, R, P), pf_step, n_groups, n_chunks, lane, R, U)
        for t in range(n_steps):
            values = _stage_snapshot(stage)
            load_group, load_step = next_step(load_group, load_step, steps_per_group, stride)
            _stage_loads(stage, _RowGroup(a, b, sfa, sfb, load_group, R, P), load_step * 32 * U + lane, n_chunks,
                         t + 1 < n_steps, R, U, cfg.a_load)
            if cutlass.const_expr(cfg.prefetch > 0):
                pf_group, pf_step = next_step(pf_group, pf_step, steps_per_group, stride)
                _prefetch_step(_RowGroup(a, b, sfa, sfb, pf_group, R, P), pf_step, n_groups, n_chunks, lane, R, U)
            if cutlass.const_expr(cfg.compute):
                for u in cutlass.range_constexpr(U):
                    _accumulate_step_chunk(values, u, R, U, acc, decode, table)
            else:
                touched = loads_xor(values)
                for r in cutlass.range_constexpr(R):
                    acc[r] = acc[r] + touched
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


# --------------------------------------------------------------------------- tiled kernel


TILED_B_WORDS = 16  # decoded B words per 16-byte chunk: 4 per word of 8 codes
TILED_SMEM_BYTES_PER_CHUNK = TILED_B_WORDS * 4 + 8  # and B's two block scales, times DECODE_FACTOR, as fp32
STATIC_SMEM_BYTES = 48 * 1024  # shared memory a kernel may declare statically


@dataclass(frozen=True)
class TiledConfig(OneKernelForEveryK):
    """Compile-time shape of the tiled kernel (one compiled variant per config). A block owns ``rows_per_block``
    consecutive rows of one batch (contiguous bytes of A) and decodes that batch's B once into shared memory;
    each warp streams its share of the rows in address order, running on from one row into the next (no step
    computes on padding, whatever K), ``chunks_per_step`` 16-byte chunks per lane in flight. Short-lived blocks
    (one tile each), like the fastest streaming read. K up to ``max_k``: B's decoded row is sized for it."""

    rows_per_block: int = 32
    warps_per_block: int = 8
    chunks_per_step: int = 2
    max_k: int = 16384
    compute: bool = True  # False: loads only, a wrong result that times the access pattern alone
    a_load: str = ".nc.L1::no_allocate"
    decode: str = "auto"
    lut_registers: bool = False  # "lut" decode: the table loaded into registers (`lut_table`), not immediates

    def __post_init__(self):
        if self.warps_per_block < 1 or MAX_ROWS_PER_BLOCK % self.rows_per_block or \
                self.rows_per_block % self.warps_per_block:
            raise ValueError(f"rows_per_block: expected a divisor of {MAX_ROWS_PER_BLOCK} and a multiple of "
                             f"warps_per_block, got {self.rows_per_block} rows, {self.warps_per_block} warps")
        if self.chunks_per_step < 1:
            raise ValueError(f"chunks_per_step: expected >= 1, got {self.chunks_per_step}")
        if self.max_k < 64 or self.max_k % 64 or self.max_k // 32 * TILED_SMEM_BYTES_PER_CHUNK > STATIC_SMEM_BYTES:
            raise ValueError(f"max_k: expected a multiple of 64 whose decoded B fits {STATIC_SMEM_BYTES} bytes of "
                             f"shared memory ({TILED_SMEM_BYTES_PER_CHUNK} per 32 codes), got {self.max_k}")

    @property
    def rows_per_warp(self) -> int:
        return self.rows_per_block // self.warps_per_block

    def refusal(self, k: int) -> str | None:
        if k > self.max_k:
            return f"b: expected K <= {self.max_k} for the tiled kernel (B is decoded into shared memory), got K = {k}"
        return None

    def kernel(self, decode: str) -> tuple:
        """(the tiled kernel, threads per block, grid): a block per tile of rows."""
        return make_tiled_kernel(self, decode), 32 * self.warps_per_block, row_blocks(self.rows_per_block)


def _tile_loads(stage, a_base, sfa_base, kh, row, seg, segs, n_chunks, lane, cfg: TiledConfig):
    """Issue one step's loads: the next ``chunks_per_step`` 32-chunk segments of the warp's rows,
    from segment ``seg`` of row ``row`` on; returns where the next step starts."""
    a_buf, sfa_buf = stage
    for u in range(cfg.chunks_per_step):
        col = seg * 32 + lane
        ok = (row < cfg.rows_per_warp) & (col < n_chunks)
        words = ld_global_v4_if(a_base + (row * kh + col * 16), ok, cfg.a_load)
        for i in range(4):
            a_buf[4 * u + i] = words[i]
        sfa_buf[u] = ld_global_u16_if(sfa_base + (row * (kh // 8) + col * 2), ok)
        seg, row = _next_segment(seg, row, segs)
    return row, seg


def _next_segment(seg, row, segs):
    """(segment, row) after segment `seg` of row `row`: a warp runs on from a row's last segment into
    the next row's first."""
    wrap = Int32(seg + 1 == segs)
    return seg + 1 - wrap * segs, row + wrap


def make_tiled_kernel(cfg: TiledConfig, decode: str):
    """The tiled kernel for one config and FP4 decode (``resolve_decode``), to launch or compile."""
    W, N, RW = cfg.warps_per_block, cfg.chunks_per_step, cfg.rows_per_warp
    max_chunks = cfg.max_k // 32
    threads = 32 * W

    @cute.kernel
    def kernel(a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, c: cute.Tensor):
        """B's batch decoded into shared memory once; then each warp walks its rows' segments of
        32 chunks (512 bytes) in address order, loading step t + 1 before computing step t."""
        tidx = cute.arch.thread_idx()[0]
        lane, warp = tidx % 32, tidx // 32
        m_rows, kh = a.shape[0], a.shape[1]
        n_chunks = kh // 16
        segs = (n_chunks + 31) // 32
        row0 = cute.arch.block_idx()[0] * cfg.rows_per_block  # flat row over (L, M)
        batch = row0 // m_rows
        m0 = row0 - batch * m_rows + warp * RW
        a_base = a.iterator + Int64(row0 + warp * RW) * Int64(kh)
        sfa_base = sfa.iterator + Int64(row0 + warp * RW) * Int64(kh // 8)
        n_steps = (RW * segs + N - 1) // N

        stage = (cute.make_rmem_tensor((4 * N,), Int32), cute.make_rmem_tensor((N,), cutlass.Int16))
        load_row, load_seg = _tile_loads(stage, a_base, sfa_base, kh, Int32(0), Int32(0), segs, n_chunks, lane, cfg)

        smem = smem_allocator()
        b_addr = smem_words(smem, TILED_B_WORDS * max_chunks, 16)
        s_addr = smem_words(smem, 2 * max_chunks, 16)
        table = None
        table_in_registers = cfg.lut_registers and decode == "lut" and cfg.compute
        if cutlass.const_expr(table_in_registers):  # the table's shared memory only where it is used
            table_addr = lut_table_smem(smem)
        if cutlass.const_expr(cfg.compute):
            if cutlass.const_expr(table_in_registers):
                if tidx < 32:
                    store_lut_table(table_addr, tidx)
            b_row = b.iterator + Int64(batch) * Int64(B_ROWS * kh)
            sfb_row = sfb.iterator + Int64(batch) * Int64(B_ROWS * (kh // 8))
            factor = Float32(DECODE_FACTOR[decode])
            for i in range((n_chunks + threads - 1 - tidx) // threads):
                col = tidx + i * threads
                words = ld_global_v4_if(b_row + col * 16, 1, ".nc")
                sb0, sb1 = e4m3x2_to_f32(ld_global_u16_if(sfb_row + col * 2, 1))
                for w in cutlass.range_constexpr(4):
                    st_shared(b_addr + (w * max_chunks + col) * 16, [Int32(x) for x in decode_b_word_as(words[w], decode)])
                st_shared(s_addr + col * 8, [sb0 * factor, sb1 * factor])
            cute.arch.sync_threads()
            if cutlass.const_expr(table_in_registers):
                table = lut_table(table_addr, lane)

        acc = Float32(0.0)
        row, seg = Int32(0), Int32(0)
        for _ in range(n_steps):
            a_now, sfa_now = _stage_snapshot(stage)
            load_row, load_seg = _tile_loads(stage, a_base, sfa_base, kh, load_row, load_seg, segs, n_chunks, lane,
                                             cfg)
            for u in cutlass.range_constexpr(N):
                words = a_now[4 * u:4 * u + 4]
                if cutlass.const_expr(cfg.compute):
                    col = cutlass.min(seg * 32 + lane, n_chunks - 1)  # past the row's end A is zero; B stays finite
                    b_dec = []
                    for w in cutlass.range_constexpr(4):
                        b_dec.extend(ld_shared(b_addr + (w * max_chunks + col) * 16, Int32, 4))
                    sb0, sb1 = ld_shared(s_addr + col * 8, Float32, 2)
                    sa0, sa1 = e4m3x2_to_f32(sfa_now[u])
                    d0, d1 = generic_chunk_dots(words, b_dec, decode, table)
                    acc = acc + d0 * (sa0 * sb0) + d1 * (sa1 * sb1)
                else:
                    acc = acc + loads_xor([[sfa_now[u]], words])
                if seg == segs - 1:  # the row is complete: reduce over the warp, write, reset
                    total = cute.arch.warp_reduction_sum(acc)
                    if lane == 0 and row < RW:
                        c[m0 + row, 0, batch] = total.to(Float16)
                    acc = Float32(0.0)
                seg, row = _next_segment(seg, row, segs)

    return kernel



# --------------------------------------------------------------------------- the configs


WIDE = FastConfig(lut_registers=True)  # 4 rows x 2 chunks per lane: 1 KB of each row per warp step
TALL = FastConfig(rows_per_warp=8, unroll=1)  # 8 rows x 1 chunk: steps of 32 chunks
TILED = TiledConfig(lut_registers=True)  # 32 rows per block of 8 warps, B in shared memory, 2 chunks per lane


def generic_config(k: int) -> FastConfig | TiledConfig:
    """The generic kernels' config for this K, as measured best on the H200 before the per-K kernel: WIDE reads
    longer runs of each row, which the memory system serves better, but a step covers 64 chunks of 16 bytes;
    where K/32 chunks do not fill whole steps (K = 7168: 224 chunks, 3.5 steps) its last step computes on zeros,
    and the tiled kernel is faster (up to TILED.max_k; WIDE beyond)."""
    return WIDE if (k // 32) % (32 * WIDE.unroll) == 0 or k > TILED.max_k else TILED


def sm_count() -> int:
    """Multiprocessors of this GPU; a B200's 148 when cross-compiling without one."""
    return torch.cuda.get_device_properties().multi_processor_count if torch.cuda.is_available() else 148
