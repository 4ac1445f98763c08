"""Compiling and launching the CuTe kernels, shared by every kernel family (`gemv`, `whole_k`) and the
streaming read: the target and its decode, TVM-FFI or plain calls, and the kernels' view of the leaderboard's
tensors from raw addresses."""

from __future__ import annotations

import contextlib
import functools
import glob
import tempfile
import unittest.mock
from pathlib import Path

from nvfp4lib.contract import B_ROWS, SCALE_TILE_COLS, SCALE_TILE_ROWS, permuted_strides, plain_strides
from nvfp4lib.cute.ptx import DSL_PROBLEM, Float16, Int32, Int64, cute, cutlass
from nvfp4lib.device import cute_arch, tvm_ffi_problem


def _gmem_tensor(dtype, address, shape, stride, align: int):
    pointer = cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)
    return cute.make_tensor(pointer, cute.make_layout(shape, stride=stride))


def plain_scale_views(sfa_ptr, sfb_ptr, m, kb, l):
    """CuTe views of the plain scales, sfa [M, K/16, L] and sfb [128, K/16, L], from their addresses."""
    return (_gmem_tensor(cutlass.Uint8, sfa_ptr, (m, kb, l), plain_strides(m, kb, l), 4),
            _gmem_tensor(cutlass.Uint8, sfb_ptr, (B_ROWS, kb, l), plain_strides(B_ROWS, kb, l), 4))


def permuted_scale_views(sfa_ptr, sfb_ptr, m, kb, l):
    """CuTe views of the permuted scales, [32, 4, rest_m, 4, rest_k, L] (rest_m 1 for sfb), from their addresses."""
    u8 = cutlass.Uint8
    rest_m, rest_k = m // SCALE_TILE_ROWS, kb // SCALE_TILE_COLS
    return (_gmem_tensor(u8, sfa_ptr, (32, 4, rest_m, 4, rest_k, l), permuted_strides(rest_m, rest_k, l), 16),
            _gmem_tensor(u8, sfb_ptr, (32, 4, 1, 4, rest_k, l), permuted_strides(1, rest_k, l), 16))


def leaderboard_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, kh, m, l, scale_views=plain_scale_views):
    """CuTe views of the five tensors from their addresses, K/2, M and L; the scales' by ``scale_views``
    (`plain_scale_views` or `permuted_scale_views`). The call passes plain integers only (TVM-FFI converts those
    far faster than tensors). The strides are the documented ones, which the caller validated once per input."""
    a = _gmem_tensor(cutlass.Uint8, a_ptr, (m, kh, l), plain_strides(m, kh, l), 16)
    b = _gmem_tensor(cutlass.Uint8, b_ptr, (B_ROWS, kh, l), plain_strides(B_ROWS, kh, l), 16)
    c = _gmem_tensor(Float16, c_ptr, (m, 1, l), (1, m, m), 2)  # [M, 1, L] of an (L, M, 1) buffer
    sfa, sfb = scale_views(sfa_ptr, sfb_ptr, m, kh // 8, l)  # K/16 scale bytes per row
    return a, b, sfa, sfb, c


HOPPER_DECODE = "lut"  # measured faster than "bitops" on the H200 (docs/cute_kernel_notes.md)
SM_SHARED_MEMORY = 233472  # bytes of shared memory an SM of an H100, H200 or B200 gives its blocks (228 KB)


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


def require_dsl() -> None:
    """Raise RuntimeError where the installed CuTe DSL cannot build the kernels (`ptx.DSL_PROBLEM`): the
    check of every compile but a standalone file's, which has nothing checked."""
    if DSL_PROBLEM is not None:
        raise RuntimeError(DSL_PROBLEM)


def compile_target(arch: str | None = None) -> str:
    """The target a CuTe kernel compiles for: `arch` (e.g. "sm_100a", "sm_90a"), or this GPU's.
    Raises RuntimeError where there is none."""
    arch = arch or cute_arch()
    if arch is None:
        raise RuntimeError("no target: pass arch='sm_100a' or 'sm_90a' to cross-compile without a GPU")
    return arch


def compile_launch(launch, example_args, arch: str | None = None, options: str = "", tvm_ffi: bool | None = None):
    """``cute.compile`` of a ``@cute.jit`` function ``launch(*example_args, stream)`` for `arch`
    (`compile_target`), no GPU needed: every CuTe kernel of the workbook is compiled here. For
    TVM-FFI calls where apache-tvm-ffi is installed (or as `tvm_ffi` says); `options` are extra
    CuTe DSL compile options."""
    arch = compile_target(arch)
    from cutlass.cute.runtime import make_fake_stream  # the DSL is there: compile_target checked it
    tvm_ffi = tvm_ffi_problem() is None if tvm_ffi is None else tvm_ffi
    return cute.compile(launch, *example_args, make_fake_stream(),
                        options=f"{'--enable-tvm-ffi ' if tvm_ffi else ''}--gpu-arch {arch} {options}")


def compile_gemv_launch(kernel, grid, threads: int, scale_views, arch: str | None, options: str = "",
                        tvm_ffi: bool | None = None, example_kh: int = 1, min_blocks: int = 0, **launch_options):
    """`compile_launch` of the launch every GEMV kernel has: ``kernel(a, b, sfa, sfb, c)`` on the
    `leaderboard_tensors` of (5 addresses, K/2, M, L) with ``scale_views``, ``threads`` per block, ``grid(m, l)``
    blocks (traced: M and L are runtime values). Called with `gemv.kernel_arguments` and the stream. ``min_blocks``
    > 0: at least that many blocks resident per SM (``.minnctapersm``: ptxas fits its registers to that; its
    ``-maxrregcount`` is ignored for the kernels' ``.reqntid``). ``launch_options``: more of the DSL's ``launch``
    options: ``smem`` (a per-K kernel's `whole_k.WholeKConfig.reserved_smem`), ``preferred_smem_carveout`` (a
    benchmark's form).

    For more than one resident block every CuTe DSL release asks the driver for the SM's shared memory, to choose
    the launch's shared-memory carveout. Where there is no GPU to ask, the answer is an H200's and a B200's
    (`SM_SHARED_MEMORY`): a host setting of a function that cannot run there, in neither the PTX nor the cubin,
    which are what a compile without a GPU is for."""
    @cute.jit
    def launch(a_ptr: Int64, b_ptr: Int64, sfa_ptr: Int64, sfb_ptr: Int64, c_ptr: Int64, kh: Int32, m: Int32, l: Int32,
               stream):
        a, b, sfa, sfb, c = leaderboard_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, kh, m, l, scale_views)
        kernel(a, b, sfa, sfb, c).launch(grid=grid(m, l), block=[threads, 1, 1], stream=stream,
                                         min_blocks_per_mp=min_blocks, **launch_options)

    no_driver = min_blocks > 1 and cute_arch() is None  # the DSL asks the driver a question, and there is none
    with (unittest.mock.patch("cutlass.cutlass_dsl.cutlass.cuda_helpers.get_device_attribute",
                              lambda attribute, *args: SM_SHARED_MEMORY) if no_driver else contextlib.nullcontext()):
        return compile_launch(launch, [Int64(0)] * 5 + [Int32(example_kh)] + [Int32(1)] * 2, arch, options, tvm_ffi)


@functools.cache
def compiled_kernel(cfg, arch: str, k: int | None, tvm_ffi: bool):
    """The compile cache of every kernel config (`gemv.FastConfig`, `gemv.TiledConfig`, `whole_k.WholeKConfig`,
    ...): ``cfg.compile(arch, k, tvm_ffi=tvm_ffi)`` once per (config, target, K, call kind); ``k`` None for a
    config whose one kernel takes every K."""
    return cfg.compile(arch, k, tvm_ffi=tvm_ffi)


def compile_artifact(cfg, arch: str, k: int | None, kind: str) -> str | bytes:
    """What a compile of ``cfg``'s kernel for ``arch`` (at K ``k`` where it compiles per K) writes to its dump
    folder: the PTX text (``kind`` "ptx") or the machine code (``kind`` "cubin", as bytes); no GPU needed. Read
    from the folder, since releases before 4.4 load the compiled host code into a JIT engine after writing them,
    which raises on a machine without a CUDA driver: there the artifact is kept, and the error only if none was
    written."""
    require_dsl()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg.compile(arch, k, options=f"--keep-{kind} --dump-dir {tmp}")
        except Exception:
            if cute_arch() or not glob.glob(f"{tmp}/*.{kind}"):
                raise
        written = glob.glob(f"{tmp}/*.{kind}")
        if len(written) != 1:
            raise RuntimeError(f"compiling {cfg} for {arch} wrote {len(written)} .{kind} files, expected 1")
        return Path(written[0]).read_bytes() if kind == "cubin" else Path(written[0]).read_text()
