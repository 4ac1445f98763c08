"""Per-K CuTe kernels: one compiled kernel per K, the whole of K of a few rows in one short-lived block.

The fast and tiled kernels of `nvfp4lib.cute.gemv` walk K in a loop whose bounds are runtime values, and a
warp has one step of loads in flight. Here K is a compile-time constant, so a kernel is compiled for each K it
meets (`WholeKConfig.compile`), and a block owns ``rows_per_block`` consecutive rows of one batch and the whole of
their K (`WholeKPlan`). Every thread issues all of its loads at once (its 16-byte chunks of A for each of its
rows, and the same chunks of B), then computes and exits, as the fastest streaming read does: no loop
bookkeeping, every address an immediate offset from one base, the block gone as soon as its rows are written.

* The ``threads_per_row`` threads that share a row take its 16-byte chunks t, t + P, t + 2P, ...
  (P = threads_per_row), so that every warp-wide load reads 512 contiguous bytes. Each thread computes
  ``rows_per_thread`` rows against one decode of its chunks of B (B stays in registers: a thread needs
  only the chunks its own loads of A cover).
* A is loaded with ``L1::no_allocate`` and an L2 ``evict_first`` policy (read once), B with ``L1::evict_last``
  and an L2 ``evict_last`` policy (read by every block of its batch); their scales under the same with ``scale_hints``.
* Each 16-element block is summed exactly (the decodes of `nvfp4lib.cute.decode`; "lut" with
  `block_dot_lut2`, so that B needs no negated copy), scaled with one ``fma.rn.f32``, reduced over the warp
  with shuffles and over the warps of a row through shared memory, in a fixed order that
  `nvfp4lib.study.whole_k_model` reproduces bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from nvfp4lib.contract import B_ROWS, NVFP4InputError
from nvfp4lib.cute.constants import LUT_HI, LUT_LO
from nvfp4lib.cute.decode import accumulate_chunk, chunk_dots, decode_b_chunk, scaled_b
from nvfp4lib.cute.launch import (SM_SHARED_MEMORY, compile_gemv_launch, compile_target, compiled_kernel,
                                  plain_scale_views, resolve_decode)
from nvfp4lib.cute.ptx import (Float16, Float32, Int32, Int64, Uint32, cute, cutlass, l2_policy, ld_global_u16_if,
                               ld_global_v4_policy, ld_shared, prmt_lookup, smem_allocator, smem_words, st_shared,
                               warp_word_offset)

CHUNK_BYTES = 16  # one 128-bit load: 32 codes, two 16-element scale blocks
MAX_THREADS = 1024
MAX_CHUNKS_PER_THREAD = 8  # chunks of one row held by a thread at once: K up to 8 * 32 * threads_per_row


@dataclass(frozen=True)
class WholeKConfig:
    """The rule that turns a K into a launch shape (`plan_for`); one compiled kernel per (config, K).

    ``chunks_per_thread``: the 16-byte chunks of a row each thread aims to load; the threads that share a row
    are that many fewer, rounded up to whole warps (K = 16384, 512 chunks: 2 -> 256 threads; K = 7168, 224
    chunks: 1 -> 224 threads, 2 -> 128 threads of which the last 32 have one chunk). ``rows_per_thread``: the
    rows each thread computes against one decode of its chunks of B, at most 32 (a row has 32 threads or more, and
    each row is written by one thread of its block). ``row_slots``: groups of threads per block, each with its own
    rows (a block has rows_per_thread x row_slots rows, a power of two up to 128).
    ``decode``: one of `DECODES`, "auto" the target's (`launch.resolve_decode`). ``min_blocks_per_sm``: 0 leaves
    the registers to ptxas; N > 0 asks for N blocks resident per SM (``.minnctapersm``), so ptxas may use up to
    65536 / (N x threads) registers a thread, and does (docs/cute_kernel_notes.md). ``scale_hints``: the scale
    loads under their operand's L2 policy too (faster at K = 7168 alone, ibid.). ``max_blocks_per_sm``: 0 leaves the
    resident blocks to the registers and threads; N > 0 caps them at N per SM by the shared memory each block
    reserves (`reserved_smem`), which also leaves the L1 its smallest share; the PTX and the cubin stay the config's
    own (ibid.). Its methods are what `gemv.CuteLaunch` asks of every config (`gemv.OneKernelForEveryK` has the
    same), but `sum_rows`."""

    permuted_scales = False  # not fields: the kernel reads the plain scales ...
    compute = True  # ... and computes (a benchmark's loads-only form does not) ...
    a_load = ".nc.L1::no_allocate"  # ... with these A-load qualifiers (a benchmark's form varies them)
    DECODES = ("auto", "hw", "lut")  # those `accumulate_rows` computes with (a benchmark's forms add others)

    chunks_per_thread: int = 2
    rows_per_thread: int = 4
    row_slots: int = 1
    decode: str = "auto"
    min_blocks_per_sm: int = 0
    scale_hints: bool = False
    max_blocks_per_sm: int = 0

    def __post_init__(self):
        for name, value, low, high in (("chunks_per_thread", self.chunks_per_thread, 1, MAX_CHUNKS_PER_THREAD),
                                       ("min_blocks_per_sm", self.min_blocks_per_sm, 0, 32),  # an SM's most blocks
                                       ("max_blocks_per_sm", self.max_blocks_per_sm, 0, 8)):  # see reserved_smem
            if not low <= value <= high:
                raise ValueError(f"{name}: expected {low} to {high}, got {value}")
        rows = self.rows_per_thread * self.row_slots
        for name, value, most in (("rows_per_thread", self.rows_per_thread, 32), ("row_slots", self.row_slots, 128),
                                  ("rows_per_thread x row_slots", rows, 128)):
            if value < 1 or value & (value - 1) or value > most:
                raise ValueError(f"{name}: expected a power of two up to {most}, got {value}")
        if self.decode not in self.DECODES:
            raise ValueError(f"decode: expected one of {self.DECODES}, got {self.decode!r}")
        if not isinstance(self.scale_hints, bool):
            raise ValueError(f"scale_hints: expected True or False, got {self.scale_hints!r}")

    def reserved_smem(self) -> int | None:
        """The dynamic shared memory a block reserves so that at most ``max_blocks_per_sm`` blocks fit an SM, each
        also taking the 1 KB the system reserves for a block and the kernel's 1 KB of static shared memory
        (cuobjdump -res-usage: SHARED:1024): N blocks fill `launch.SM_SHARED_MEMORY` exactly, N + 1 do not fit (for
        N up to 8: above, the rounding may let one more fit). None without a cap: the kernel's own allocations."""
        return (SM_SHARED_MEMORY // self.max_blocks_per_sm - 2048) // 1024 * 1024 if self.max_blocks_per_sm else None

    def sum_rows(self, acc, plan, decode: str, loaded, zero) -> None:
        """What the kernel computes from its loads (`accumulate_rows`; a benchmark's forms override it)."""
        accumulate_rows(acc, plan, decode, loaded, zero)

    def refusal(self, k: int) -> str | None:
        """Why this config cannot run this K (`plan_for`'s error, naming the argument), or None."""
        try:
            plan_for(self, k)
        except NVFP4InputError as err:
            return str(err)
        return None

    def compile(self, arch: str | None, k: int, options: str = "", tvm_ffi: bool | None = None, **launch_options):
        """The kernel of this K for ``arch`` ("sm_90a", "sm_100a", ...), compiled now; no GPU needed. Its launch
        reserves `reserved_smem`, with more of the DSL's launch options where a caller adds them (a benchmark's
        form: a shared-memory carveout)."""
        arch, plan = compile_target(arch), plan_for(self, k)
        kernel = make_whole_k_kernel(plan, self, resolve_decode(arch, self.decode))
        return compile_gemv_launch(kernel, lambda m, l: [m // plan.rows_per_block, l, 1], plan.threads,
                                   plain_scale_views, arch, options, tvm_ffi, k // 2, self.min_blocks_per_sm,
                                   smem=self.reserved_smem(), **launch_options)

    def compiled(self, arch: str, k: int | None, tvm_ffi: bool):
        """The kernel of this K from the compile cache (`launch.compiled_kernel`): one per K, compiled on the
        first input with that K; None for ``k`` None (no K to compile for yet)."""
        return None if k is None else compiled_kernel(self, arch, k, tvm_ffi)


class WholeKPlan(NamedTuple):
    """The launch shape of one K (`plan_for`): ``rows_per_block`` rows per block in slots of ``threads_per_row``
    threads (``threads`` in all); thread t of a slot loads chunks t + i * threads_per_row (i < chunks_per_thread)
    of each of its ``rows_per_thread`` rows. ``partial[i]``: chunk i is past the row's end for some threads."""

    k: int
    n_chunks: int  # 16-byte chunks per row
    rows_per_block: int
    rows_per_thread: int
    threads_per_row: int
    chunks_per_thread: int
    threads: int
    partial: tuple[bool, ...]


def plan_for(cfg: WholeKConfig, k: int) -> WholeKPlan:
    """The launch shape of ``cfg`` at this K (a multiple of 64); refuses a K or a shape a block cannot hold."""
    if not isinstance(k, int) or k < 64 or k % 64:
        raise NVFP4InputError(f"a: expected K a positive multiple of 64 for the whole-K kernel, got K = {k}")
    n_chunks = k // 32  # 32 codes per chunk
    threads_per_row = 32 * -(-n_chunks // (32 * cfg.chunks_per_thread))
    if cfg.row_slots * threads_per_row > MAX_THREADS:
        limit = MAX_THREADS // cfg.row_slots * cfg.chunks_per_thread * 32
        raise NVFP4InputError(f"a: expected K <= {limit} for the whole-K kernel with {cfg.row_slots} row slots of "
                              f"{cfg.chunks_per_thread} chunks a thread ({MAX_THREADS} threads a block), got K = {k}")
    chunks = -(-n_chunks // threads_per_row)
    partial = tuple((i + 1) * threads_per_row > n_chunks for i in range(chunks))
    return WholeKPlan(k, n_chunks, cfg.rows_per_thread * cfg.row_slots, cfg.rows_per_thread, threads_per_row, chunks,
                      cfg.row_slots * threads_per_row, partial)


# --------------------------------------------------------------------------- block sums


def opaque_zero(m_rows, tidx):
    """0 as a per-thread value the compiler cannot fold: (tidx | M) >> 31, with tidx < 1024 and M < 2^31."""
    return Int32((Uint32(tidx) | Uint32(m_rows)) >> 31)


def loads_joined(loaded, zero):
    """``zero`` made to depend on every load of ``loaded`` (one word of each: a load's registers arrive
    together), so that whatever uses the result waits for all of them. Without it ptxas sinks each load
    to just before its first use, to save registers, and a thread has only a few loads in flight; with
    it every load is issued before the first block sum, as the streaming read issues them."""
    return functools.reduce(lambda join, value: join ^ Int32(value), loaded, Int32(0)) & zero


def lut_after(zero):
    """The lookup table (LUT_LO, LUT_HI) as two registers, XORed with an opaque 0 (`opaque_zero`,
    `loads_joined`): ptxas cannot fold them into immediates (it would then move the first word into a
    register again before most ``prmt``, docs/cute_kernel_notes.md), and every lookup waits for the loads."""
    return Int32(LUT_LO) ^ zero, Int32(LUT_HI) ^ zero


def accumulate_rows(acc, plan: WholeKPlan, decode: str, loaded, zero, decode_b=decode_b_chunk, dots=chunk_dots):
    """acc[q] += the scaled block sums of row q (``loaded``: the thread's chunks of B, their scales, its chunks of
    A and their scales, row by row): every load joined first (`loads_joined`), then chunk i of every row against
    one decode of B's chunk i. A chunk past the row's end was loaded as zeros, and adds +0 exactly. ``decode_b`` and
    ``dots``: `decode.decode_b_chunk` and `decode.chunk_dots`, or a benchmark form's own."""
    b_words, sfb_pairs, a_words, sfa_pairs = loaded
    zero = loads_joined([w[0] for w in b_words + a_words] + sfb_pairs + sfa_pairs, zero)
    lookup = functools.partial(prmt_lookup, *lut_after(zero)) if decode == "lut" else None
    if decode != "lut":  # B's words carry the dependency
        b_words = [[w ^ zero for w in words] for words in b_words]
    C = plan.chunks_per_thread
    for i in range(C):
        b_dec = decode_b(b_words[i], decode, lookup)
        accumulate_chunk(acc, a_words[i::C], sfa_pairs[i::C], b_dec, scaled_b(sfb_pairs[i], decode), decode, lookup,
                         dots)


# --------------------------------------------------------------------------- the kernel


def make_whole_k_kernel(plan: WholeKPlan, cfg: WholeKConfig, decode: str):
    """The kernel of one K (``plan``) and FP4 decode, to launch or compile."""
    P, C, Q, R = plan.threads_per_row, plan.chunks_per_thread, plan.rows_per_thread, plan.rows_per_block
    WP = P // 32  # warps per row
    PER_LOAD = 4 if WP % 4 == 0 else 2 if WP % 2 == 0 else 1  # a row's partials a shared load reads, aligned
    KH, KS, STEP = plan.k // 2, plan.k // 16, P * CHUNK_BYTES  # bytes of A, of its scales per row; a load's stride

    @cute.kernel
    def kernel(a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, c: cute.Tensor):
        """All loads of a thread first (its chunks of B, then of each row), then the block sums, the
        warp and row reductions, and one fp16 store per row."""
        tidx = cute.arch.thread_idx()[0]
        lane = tidx % 32
        slot, t = tidx // P, tidx % P
        m_rows = a.shape[0]
        batch = cute.arch.block_idx()[1]  # a grid of (M / rows_per_block, L): no division by M
        m0 = cute.arch.block_idx()[0] * R  # the block's first row within its batch
        first = batch * m_rows + m0 + slot * Q  # this slot's first row, flat over (L, M)
        a_base = a.iterator + (Int64(first) * KH + t * CHUNK_BYTES)
        sfa_base = sfa.iterator + (Int64(first) * KS + 2 * t)
        b_base = b.iterator + (Int64(batch) * (B_ROWS * KH) + t * CHUNK_BYTES)
        sfb_base = sfb.iterator + (Int64(batch) * (B_ROWS * KS) + 2 * t)
        read_once, read_by_all = l2_policy("evict_first"), l2_policy("evict_last")
        sfa_policy, sfb_policy = (read_once, read_by_all) if cfg.scale_hints else (None, None)

        preds = [(t < plan.n_chunks - i * P) if plan.partial[i] else None for i in range(C)]  # None: every thread's
        b_words, sfb_pairs, a_words, sfa_pairs = [], [], [], []
        for i in cutlass.range_constexpr(C):
            b_words.append(ld_global_v4_policy(b_base + i * STEP, read_by_all, preds[i], ".nc.L1::evict_last"))
            sfb_pairs.append(ld_global_u16_if(sfb_base + i * P * 2, preds[i], sfb_policy))
        for q in cutlass.range_constexpr(Q):
            for i in cutlass.range_constexpr(C):
                a_words.append(ld_global_v4_policy(a_base + (q * KH + i * STEP), read_once, preds[i], cfg.a_load))
                sfa_pairs.append(ld_global_u16_if(sfa_base + (q * KS + i * P * 2), preds[i], sfa_policy))

        acc = [Float32(0.0)] * Q  # the rows' sums
        cfg.sum_rows(acc, plan, decode, (b_words, sfb_pairs, a_words, sfa_pairs), opaque_zero(m_rows, tidx))

        # The row's warps meet in shared memory (explicit instructions); one thread per row adds them in order.
        partials = smem_words(smem_allocator(), R * WP, 16)  # [row][warp] fp32 partial sums
        warp_bytes = warp_word_offset(t)
        for q in cutlass.range_constexpr(Q):
            total = cute.arch.warp_reduction_sum(acc[q])
            if lane == 0:
                st_shared(partials + (slot * Q + q) * WP * 4 + warp_bytes, [total])
        cute.arch.sync_threads()
        if tidx < R:
            row = partials + tidx * (WP * 4)
            parts = [p for w in range(0, WP, PER_LOAD) for p in ld_shared(row + 4 * w, Float32, PER_LOAD)]
            c[m0 + tidx, 0, batch] = sum(parts[1:], parts[0]).to(Float16)  # ((p0 + p1) + p2) + ...

    return kernel

