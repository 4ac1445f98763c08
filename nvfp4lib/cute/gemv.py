"""The CuTe GEMV's host side and its naive kernel: which kernel runs at each K, and how a call reaches it.

`default_config(K)` is a per-K kernel (`nvfp4lib.cute.whole_k`) for every K: the measured ones of
`PER_K_DEFAULTS` at the benchmark K, `per_k_rule` elsewhere. The naive kernel (`NaiveConfig`, one thread
per row) is the baseline path ``cute_naive``. A config compiles its own kernel (`compile`, `compiled`) and
says which K it cannot run (`refusal`), so the host takes any config: the generic kernels that led to the
per-K one (the wide, tall and tiled tiles of `nvfp4lib.study.generic_kernels`) run through the same host.

Both read the leaderboard tensors in place and cover all L batches in one launch; the FP4 decode is picked
per target when a kernel is compiled (`launch.resolve_decode`). `CuteLaunch` calls a kernel with nothing
checked (the standalone file's), `CuteRunner` validates each input once and remembers its arguments (the
package's paths), `CuteGemv` names a runner by variant. The kernels are built and checked with CuTe DSL
`device.MIN_CUTE_DSL` and newer; where they cannot be built, the exported submissions fall back
(nvfp4lib.leaderboard.export)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from nvfp4lib.caches import TupleCache, is_validated_once
from nvfp4lib.contract import B_ROWS, SCALE_ATOM_BYTES, SCALE_TILE_ROWS, NVFP4InputError, Shape, validate_gemv_input
from nvfp4lib.cute.constants import DECODE_FACTOR
from nvfp4lib.cute.decode import decode_b_word, decode_word_bitops, decode_word_hw
from nvfp4lib.cute.launch import (compile_artifact, compile_gemv_launch, compile_target, compiled_kernel,
                                  permuted_scale_views, plain_scale_views, require_dsl, resolve_decode)
from nvfp4lib.cute.ptx import (Float16, Float32, Int32, Int64, cute, cutlass, e4m3x2_to_f32, half2_to_f32_pair,
                               ld_global_u16_if, ld_global_u32)
from nvfp4lib.cute.whole_k import MAX_CHUNKS_PER_THREAD, WholeKConfig
from nvfp4lib.device import cute_arch, tvm_ffi_problem

_INT32_MAX = 2**31 - 1
NAIVE_THREADS = 128  # threads per block of the naive kernel, one row each
MAX_ROWS_PER_BLOCK = 128  # the naive kernel's block; every kernel keeps to it
MAX_ROWS = _INT32_MAX + 1 - MAX_ROWS_PER_BLOCK
"""Largest M * L the kernels take: they count rows over all batches in 32-bit integers, and the grid
size (M * L + rows per block - 1) // rows per block, with up to 128 rows per block, must fit too."""


def row_blocks(rows_per_block: int, max_blocks: int = 1 << 30):
    """The grid of a kernel with a block per ``rows_per_block`` rows over (L, M), at most ``max_blocks``:
    ``grid(m, l)`` as `launch.compile_gemv_launch` takes it (traced: M and L are runtime values)."""
    def grid(m, l):
        return [cutlass.min((m * l + rows_per_block - 1) // rows_per_block, max_blocks), 1, 1]

    return grid


class OneKernelForEveryK:
    """What the host asks of every config (`whole_k.WholeKConfig` has the same methods), for a config whose one
    compiled kernel serves every K: its ``kernel(decode)`` gives (the kernel, threads per block, grid)."""

    permuted_scales = False  # the scales a kernel reads: the plain ones unless a config says otherwise

    def refusal(self, k: int) -> str | None:
        """Why this config cannot run this K (an error message naming the argument), or None."""
        return None

    def compile(self, arch: str | None, k: int | None = None, options: str = "", tvm_ffi: bool | None = None):
        """The config's kernel for ``arch``, compiled now in the GEMV launch (``k`` is not needed)."""
        arch = compile_target(arch)
        kernel, threads, grid = self.kernel(resolve_decode(arch, self.decode))
        views = permuted_scale_views if self.permuted_scales else plain_scale_views
        return compile_gemv_launch(kernel, grid, threads, views, arch, options, tvm_ffi)

    def compiled(self, arch: str, k: int | None, tvm_ffi: bool):
        """The compiled kernel, from the compile cache (`launch.compiled_kernel`): one for every K."""
        return compiled_kernel(self, arch, None, tvm_ffi)


# --------------------------------------------------------------------------- naive kernel


@dataclass(frozen=True)
class NaiveConfig(OneKernelForEveryK):
    """The naive kernel: one thread per row, permuted scales; its one choice is the FP4 decode
    ("auto": the hardware conversion where the target has it, else the bit trick)."""

    decode: str = "auto"
    compute = True  # not fields: what a benchmark reads of every config
    permuted_scales = True

    def kernel(self, decode: str) -> tuple:
        """(the naive kernel, threads per block, grid): a row per thread."""
        return make_naive_kernel(decode == "hw"), NAIVE_THREADS, row_blocks(NAIVE_THREADS)


def make_naive_kernel(hw_e2m1: bool):
    """The naive kernel, decoding FP4 with the hardware conversion or with bit operations."""
    @cute.kernel
    def kernel(a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, c: cute.Tensor):
        """One thread per (row, batch); 64-code K tiles (one column of 512-byte scale atoms); everything in fp32."""
        m_rows, kh = a.shape[0], a.shape[1]
        row = cute.arch.block_idx()[0] * cute.arch.block_dim()[0] + cute.arch.thread_idx()[0]  # flat over (L, M)
        if row < m_rows * a.shape[2]:
            batch = row // m_rows
            m = row - batch * m_rows
            a_row = a.iterator + Int64(row) * Int64(kh)
            b_row = b.iterator + Int64(batch) * Int64(B_ROWS * kh)
            atoms = Int64(kh // 32 * SCALE_ATOM_BYTES)  # a batch's row of atoms: 4 scale columns per 32 bytes of K
            sfb_row = sfb.iterator + Int64(batch) * atoms
            sfa_row = (sfa.iterator + Int64(batch * (m_rows // SCALE_TILE_ROWS) + m // SCALE_TILE_ROWS) * atoms
                       + (m % 32) * 16 + ((m % SCALE_TILE_ROWS) // 32) * 4)
            acc = Float32(0.0)
            for tile in range(kh // 32):  # 64 codes = 32 bytes = 4 scale blocks per tile
                for blk in cutlass.range_constexpr(4):
                    scale_at = tile * SCALE_ATOM_BYTES + (blk // 2) * 2  # 2 of the atom's 4 columns per load
                    sa = e4m3x2_to_f32(ld_global_u16_if(sfa_row + scale_at, 1))[blk % 2]
                    sb = e4m3x2_to_f32(ld_global_u16_if(sfb_row + scale_at, 1))[blk % 2]
                    part = Float32(0.0)
                    for w in cutlass.range_constexpr(2):
                        off = tile * 32 + blk * 8 + w * 4
                        aw = ld_global_u32(a_row + off)
                        bw = ld_global_u32(b_row + off)
                        ah = decode_word_hw(aw) if hw_e2m1 else decode_word_bitops(aw)
                        bh = decode_b_word(bw, hw_e2m1)
                        for h in cutlass.range_constexpr(4):
                            a_lo, a_hi = half2_to_f32_pair(ah[h])
                            b_lo, b_hi = half2_to_f32_pair(bh[h])
                            part = part + a_lo * b_lo + a_hi * b_hi
                    acc = acc + part * (sa * sb * Float32(DECODE_FACTOR["hw" if hw_e2m1 else "bitops"]))
            c[m, 0, batch] = acc.to(Float16)

    return kernel


# --------------------------------------------------------------------------- the kernel of each K


PER_K_DEFAULTS = {16384: WholeKConfig(2, 2, 1, scale_hints=True, max_blocks_per_sm=3),  # w2x2x1-hints-s3
                  7168: WholeKConfig(1, 4, 1, min_blocks_per_sm=5, scale_hints=True, max_blocks_per_sm=3),  # w1x4x1-m5-hints-s3
                  2048: WholeKConfig(1, 4, 2, min_blocks_per_sm=8, scale_hints=True, max_blocks_per_sm=6)}  # w1x4x2-m8-hints-s6
"""The per-K kernels that `default_config` runs at the benchmark K (chunks_per_thread, rows_per_thread and
row_slots in this order, as `cute_bench`'s ``wCxQxS`` names them; each line ends with its name): their launch
shapes the fastest of the per-K configs measured on the H200 (results/h200_per_k.csv, commit f91bda39931b) at
K = 16384 and 7168, at K = 2048 two row slots of 4 rows; their resident-block counts, scale hints and caps the
fastest by leaderboard time of those timed at their K in the recorded run on an H100 under CuTe DSL 4.6.3 and
4.8.1, the default with its hints switched and without its cap among them (results/h100_kernel_vs_read.csv;
docs/cute_kernel_notes.md)."""

SHORT_K = 8192
"""Up to this K, `per_k_rule` gives each thread one chunk of 4 rows (``w1x4x1``, K/32 threads per row: the
fastest at K = 2048 and 7168); beyond it, K/8192 chunks of 2 rows (``w2x2x1`` at K = 16384, the fastest
there: 256 threads per row), at most `whole_k.MAX_CHUNKS_PER_THREAD` (K = 65536), then more threads, up to a
block's 1024 (K = 262144; a larger K is refused, naming ``a``)."""


def per_k_rule(k: int) -> WholeKConfig:
    """The per-K config for a K without a measured one, from the measured ones (`SHORT_K` says how)."""
    if k <= SHORT_K:
        return WholeKConfig(chunks_per_thread=1, rows_per_thread=4)
    return WholeKConfig(chunks_per_thread=min(MAX_CHUNKS_PER_THREAD, -(-k // SHORT_K)), rows_per_thread=2)


def default_config(k: int) -> WholeKConfig:
    """The kernel ``cute_fast`` runs at this K: the measured per-K config of `PER_K_DEFAULTS`, else `per_k_rule`'s.
    A K the per-K kernel cannot hold is refused by the config (`WholeKConfig.refusal`, naming ``a``)."""
    return PER_K_DEFAULTS.get(k) or per_k_rule(k)


def kernel_config(variant: str, cfg=None):
    """What ``variant`` runs: "fast" ``cfg``, or without one the rule `default_config`; "naive" the naive
    kernel with ``cfg``'s decode."""
    if variant not in ("fast", "naive"):
        raise ValueError(f"variant: expected 'fast' or 'naive', got {variant!r}")
    if variant == "naive":
        return NaiveConfig(cfg.decode) if cfg is not None else NaiveConfig()
    return cfg if cfg is not None else default_config


def _compiled_config(variant: str, cfg, k: int | None):
    config = kernel_config(variant, cfg)
    if config is default_config:
        if k is None:
            raise ValueError("k: the default config compiles one kernel per K; pass the K to compile for")
        return default_config(k)
    return config


def compile_ptx(variant: str = "fast", arch: str = "sm_100a", cfg=None, k: int | None = None) -> str:
    """The PTX of one variant for ``arch``, compiled on any machine (no GPU needed); ``k``: the K of a per-K
    config (the default's included)."""
    return compile_artifact(_compiled_config(variant, cfg, k), arch, k, "ptx")


def compile_cubin(variant: str = "fast", arch: str = "sm_100a", cfg=None, k: int | None = None) -> bytes:
    """The machine code (cubin) of one variant for ``arch``, compiled on any machine; ``k`` as `compile_ptx`'s."""
    return compile_artifact(_compiled_config(variant, cfg, k), arch, k, "cubin")


# --------------------------------------------------------------------------- calling a kernel


def check_launch_bounds(shape) -> None:
    """Refuse a shape whose row count or B batch stride would overflow the kernels' 32-bit integers. Every 32-bit
    quantity of a launch is bounded by M * L or by B_ROWS * K/2 (B's and its scales' batch strides, B padded to 128
    rows); addresses inside a batch are 64-bit. Checked on the host, once per input."""
    m, k, l = shape
    if m * l > MAX_ROWS:
        raise NVFP4InputError(f"a: expected M * L <= {MAX_ROWS} (the CuTe kernels count rows over all batches in "
                              f"32-bit integers), got M * L = {m} * {l} = {m * l}")
    if B_ROWS * (k // 2) > _INT32_MAX:
        raise NVFP4InputError(f"b: expected {B_ROWS} * K/2 <= {_INT32_MAX} (a batch of the padded vector, addressed "
                              f"with 32-bit integers), got K = {k}")


def kernel_arguments(data, permuted_scales: bool, tvm_ffi: bool) -> tuple:
    """The arguments of a compiled kernel before the stream, from a 7-tuple: the addresses of a, b, the scales the
    kernel reads and c; K/2, M, L. Plain integers through TVM-FFI; the DSL's own Int64/Int32 values through its
    plain call path (a Python int would become an Int32)."""
    a, b, *scales, c = data  # the scales: sfa, sfb, sfa_permuted, sfb_permuted
    sfa, sfb = scales[2:] if permuted_scales else scales[:2]
    pointers, (m, kh, l) = (a.data_ptr(), b.data_ptr(), sfa.data_ptr(), sfb.data_ptr(), c.data_ptr()), a.shape
    if tvm_ffi:
        return (*pointers, kh, m, l)
    return (*[Int64(p) for p in pointers], Int32(kh), Int32(m), Int32(l))


class CuteLaunch:
    """A kernel config, or a rule that picks one per K (`default_config`), bound to this GPU and called with the
    leaderboard tuple, nothing checked: the kernel of each K is chosen and compiled at its first input (with a
    GPU, those of ``compile_at`` now, not inside a timed call), then called on the tensors' addresses and the
    current stream (TVM-FFI where apache-tvm-ffi is installed, else the DSL's plain call path). The standalone
    file's kernel; `CuteRunner` is the same call with every input validated (and a config's one kernel for every
    K compiled at once)."""

    def __init__(self, config, compile_at=()):
        self.arch, self.tvm_ffi = cute_arch(), tvm_ffi_problem() is None  # arch None: no GPU, nothing compiled now
        self.config_for = config if callable(config) else lambda k: config  # K -> the config a call with it runs
        self._by_k: dict[int, tuple] = {}  # K -> (config, compiled kernel)
        if self.arch and not self.tvm_ffi:  # the plain call path takes the stream as the driver's CUstream
            from cuda.bindings.driver import CUstream
            self._cu_stream = CUstream
        for k in compile_at if self.arch else ():
            self.kernel_for(k)

    def refusal(self, k: int) -> str | None:
        """Why this K cannot run here (the config's refusal, naming the argument), or None."""
        return self.config_for(k).refusal(k)

    def kernel_for(self, k: int) -> tuple:
        """(config, compiled kernel) of this K, decided and compiled once; a K the config cannot run is an
        NVFP4InputError naming the argument."""
        known = self._by_k.get(k)
        if known is None:
            cfg, refused = self.config_for(k), self.refusal(k)
            if refused is not None:
                raise NVFP4InputError(refused)
            known = self._by_k[k] = (cfg, cfg.compiled(self.arch, k, self.tvm_ffi))
        return known

    def prepare(self, data):
        """(compiled kernel, its arguments before the stream, device index, c) for this input tuple, launching
        nothing and checking nothing (`CuteRunner.prepare` validates)."""
        cfg, fn = self.kernel_for(2 * data[0].shape[1])
        return fn, kernel_arguments(data, cfg.permuted_scales, self.tvm_ffi), data[6].device.index, data[6]

    def __call__(self, data, stream: torch.cuda.Stream | None = None) -> torch.Tensor:
        """The kernel on ``stream`` or the device's current one, as this call path takes a stream; returns c."""
        fn, args, device, c = self.prepare(data)
        handle = torch._C._cuda_getCurrentRawStream(device) if stream is None else stream.cuda_stream  # a C call
        fn(*args, handle if self.tvm_ffi else self._cu_stream(handle))
        return c


class CuteRunner(CuteLaunch):
    """`CuteLaunch` for the package's paths: an input tuple is validated once (the kernels read raw pointers)
    and its kernel and arguments are remembered with it in a `TupleCache`. Per call the host builds the cache's
    key (7 attribute reads of each tensor: id, address, shape, strides, dtype, device, requires_grad; and
    whether inference mode is on), looks it up in a dict and calls the compiled kernel once: a few microseconds
    of host time, no device work. Built by the paths once their `cute_unavailable` found the CuTe DSL usable
    (`CuteGemv` checks it itself)."""

    def __init__(self, config, compile_at=(), cache_entries: int = 4):
        super().__init__(config, compile_at)
        if self.arch and not callable(config):  # a config's one kernel for every K, compiled now
            config.compiled(self.arch, None, self.tvm_ffi)
        if self.arch and not self.tvm_ffi:
            print("CuTe DSL: apache-tvm-ffi is not installed, so the kernels are called through the DSL's plain "
                  "call path (Int64/Int32 arguments and a CUstream: a slower host call)", file=sys.stderr)
        self._prepared = TupleCache(cache_entries)

    def prepare(self, data):
        """`CuteLaunch.prepare` with the input validated, and the kernel of a new K compiled, once per tuple
        (``TupleCache``; c is data's own: the cache keys on every tensor); call it first to keep both out of what
        is timed or profiled."""
        return self._prepared.get(data, self._arguments)

    def _arguments(self, data):
        shape = Shape.of(data[0]) if is_validated_once() else validate_gemv_input(data, device="cuda")
        check_launch_bounds(shape)
        self.kernel_for(shape.k)  # a K the config cannot run is refused here, naming it; a new K is compiled
        c = data[6]
        if c.device.index != torch.cuda.current_device():
            raise NVFP4InputError(f"c: expected a tensor on the current device cuda:{torch.cuda.current_device()}, "
                                  f"got {c.device} (call under torch.cuda.device({c.device.index}))")
        return super().prepare(data)


class CuteGemv(CuteRunner):
    """`CuteRunner` by variant (`kernel_config`): "fast" runs ``cfg``, or without one ``default_config(K)`` with
    the kernels of `PER_K_DEFAULTS` compiled now; "naive" the naive kernel."""

    def __init__(self, variant: str = "fast", cfg=None, cache_entries: int = 4):
        require_dsl()
        self.variant, self.cfg = variant, cfg
        config = kernel_config(variant, cfg)
        super().__init__(config, tuple(PER_K_DEFAULTS) if config is default_config else (), cache_entries)


_runners: dict[tuple, CuteGemv] = {}


def gemv_cute(data, variant: str = "fast", cfg=None, stream=None) -> torch.Tensor:
    """c = A @ B per batch with a CuTe DSL kernel (on ``stream`` or the current one); returns c. Kernels are
    compiled once per (variant, config) and kept; ``cfg=None`` picks ``default_config`` for the input's K."""
    runner = _runners.get((variant, cfg))
    if runner is None:
        runner = _runners[variant, cfg] = CuteGemv(variant, cfg)
    return runner(data, stream)
