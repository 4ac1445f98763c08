"""The GEMV as a cuBLAS FP4 GEMM: ``torch._scaled_mm`` and ``torch.nn.functional.scaled_mm``.

The leaderboard's reference pads the vector B to 128 rows and calls
``torch._scaled_mm(a_l, b_l.T, scale_a, scale_b, out_dtype=float16)``, i.e. a block-scaled GEMM
[M, K] x [K, 128] of which only column 0 is kept. The convention, as PyTorch checks it:

* operands ``float4_e2m1fn_x2`` (two E2M1 codes per byte, K/2 elements along K); ``mat1``
  row-major [rows, K/2], ``mat2`` column-major [K/2, cols] (the ``.T`` of a row-major tensor);
  ``mat1``'s K/2 and both dimensions of ``mat2`` must be multiples of 16 (so one column, N = 1,
  is refused: the vector is padded);
* scales ``float8_e4m3fn``, one per 16 K elements, each passed as a contiguous tensor of exactly
  round_up(rows, 128) * round_up(K/16, 4) elements in cuBLAS's 128x4 blocked layout (this is
  the recipe "BlockWise1x16" with swizzle "SWIZZLE_32_4_4" of the functional API);
* the output [rows(mat1), cols(mat2)] in the requested dtype, accumulated in fp32.

Real FP4 GEMMs need Blackwell (sm_100+); elsewhere (Hopper raises CUBLAS_STATUS_NOT_SUPPORTED, and the CPU has
no kernel) every function here runs `emulated_scaled_mm_fp4`, which reads the same operands and the same
BLOCKED scale buffers, so the layout code is tested everywhere. Which backend ran is recorded in
`last_backend`."""

from __future__ import annotations

import functools

import torch

from nvfp4lib.caches import TupleCache, is_validated_once
from nvfp4lib.contract import (BLOCK_SIZE, SCALE_ATOM_BYTES, SCALE_TILE_COLS, SCALE_TILE_ROWS, NVFP4InputError,
                               require_tensor, scale_tile_counts, validate_gemv_input)
from nvfp4lib.device import capabilities
from nvfp4lib.formats import byte_values, decode_e4m3, fp4_bytes
from nvfp4lib.layouts import blocked_batches_view, from_blocked, to_blocked, to_permuted
from nvfp4lib.streams import shared_pool

HARDWARE_BACKEND = "cublas-fp4"
OUT_DTYPE = torch.float16

last_backend: str | None = None
"""What the most recent call ran: HARDWARE_BACKEND, or "emulated (...)" saying why."""


# ---------------------------------------------------------------------------------------------
# Which path, and the emulation


def describe_backend(device=None) -> str:
    """The backend a call with data on `device` (default: cuda if present, else cpu) runs, in words."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    caps = capabilities()
    if device.type == "cuda" and caps.fp4_gemm:
        return HARDWARE_BACKEND
    if device.type != "cuda" and caps.fp4_gemm:
        return "emulated (the inputs are on the CPU)"
    return f"emulated (no FP4 GEMM on this device: {caps.summary()})"


def _use_hardware(device: torch.device) -> bool:
    global last_backend
    last_backend = describe_backend(device)
    return last_backend == HARDWARE_BACKEND


def _check_scaled_mm_args(mat1, mat2, scale1, scale2) -> None:
    """The checks torch._scaled_mm makes for FP4 x FP4 (plus cuBLAS's row x column-major rule)."""
    for name, t in (("mat1", mat1), ("mat2", mat2), ("scale_a", scale1), ("scale_b", scale2)):
        require_tensor(t, name)
    for name, t in (("mat1", mat1), ("mat2", mat2)):
        if t.dtype != torch.float4_e2m1fn_x2 or t.dim() != 2:
            raise NVFP4InputError(f"{name}: expected a 2-D float4_e2m1fn_x2 matrix, "
                                  f"got {t.dtype} of shape {tuple(t.shape)}")
    if mat1.shape[1] != mat2.shape[0]:
        raise NVFP4InputError(f"mat1, mat2: shapes cannot be multiplied "
                              f"({tuple(mat1.shape)} and {tuple(mat2.shape)})")
    if mat1.shape[1] % 16 or mat2.shape[1] % 16:
        raise NVFP4InputError(f"mat1, mat2: K/2 and the columns of mat2 must be multiples of 16, "
                              f"got {tuple(mat1.shape)} and {tuple(mat2.shape)}")
    if mat1.stride(1) != 1 or mat2.stride(0) != 1:
        raise NVFP4InputError(f"mat1, mat2: expected row-major mat1 and column-major mat2 (cuBLAS "
                              f"FP4 is 'TN'), got strides {mat1.stride()} and {mat2.stride()}")
    k_blocks = 2 * mat1.shape[1] // BLOCK_SIZE
    for name, s, rows in (("scale_a", scale1, mat1.shape[0]), ("scale_b", scale2, mat2.shape[1])):
        rest_mn, rest_k = scale_tile_counts(rows, k_blocks)
        want = rest_mn * rest_k * SCALE_ATOM_BYTES
        if s.dtype != torch.float8_e4m3fn or s.numel() != want or not s.is_contiguous():
            raise NVFP4InputError(
                f"{name}: expected a contiguous float8_e4m3fn blocked buffer of {want} elements "
                f"(round_up({rows}, {SCALE_TILE_ROWS}) * round_up({k_blocks}, {SCALE_TILE_COLS})), "
                f"got {s.dtype} of shape {tuple(s.shape)}, contiguous={s.is_contiguous()}")


@functools.cache
def _byte_table(device: torch.device) -> torch.Tensor:
    """`formats.byte_values` on `device`, once: built on the CPU and copied with a blocking copy, so
    the table is complete before any stream (e.g. a stream pool's) can read it."""
    return byte_values().to(device)


def _dequantize(codes_rows: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """[rows, K/2] FP4 codes + their BLOCKED scale buffer -> float32 [rows, K]."""
    rows, half_k = codes_rows.shape
    k_blocks = 2 * half_k // BLOCK_SIZE
    scales = decode_e4m3(from_blocked(blocked.reshape(-1), rows, k_blocks))  # [rows, K/16]
    # One lookup per byte (two values) is the same decode as unpack_fp4 + decode_e2m1, 2-3x faster.
    byte_index = fp4_bytes(codes_rows).reshape(-1).int()
    values = _byte_table(codes_rows.device).index_select(0, byte_index).view(rows, k_blocks, BLOCK_SIZE)
    return (values * scales.unsqueeze(-1)).view(rows, 2 * half_k)


OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The outputs cuBLAS's block-scaled FP4 GEMM writes and the emulation computes (cuBLAS can also
write FP4 with an output scale, which the emulation does not produce)."""


def _check_epilogue(mat2, bias, scale_result, out_dtype, use_fast_accum) -> None:
    """What torch._scaled_mm accepts besides the operands for FP4 x FP4, or an error naming the argument."""
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in OUT_DTYPES:
        raise NVFP4InputError(f"out_dtype: expected one of {', '.join(map(str, OUT_DTYPES))} (what cuBLAS's FP4 GEMM "
                              f"writes and the emulation computes), got {out_dtype!r}")
    if use_fast_accum is not False:
        raise NVFP4InputError(f"use_fast_accum: expected False (torch._scaled_mm refuses fast accumulation for "
                              f"float4_e2m1fn_x2 operands), got {use_fast_accum!r}")
    if scale_result is not None and not (isinstance(scale_result, torch.Tensor) and scale_result.numel() == 1
                                         and scale_result.dtype == torch.float32):
        raise NVFP4InputError(f"scale_result: expected None or a float32 scalar tensor (unused for a "
                              f"{out_dtype} output), got {scale_result!r}")
    if bias is None:
        return
    got = f"{bias.dtype} with {bias.numel()} elements" if isinstance(bias, torch.Tensor) else type(bias).__name__
    if out_dtype == torch.float32:
        raise NVFP4InputError(f"bias: expected None: torch._scaled_mm takes no bias for a float32 output, got {got}")
    if not isinstance(bias, torch.Tensor) or bias.dtype != out_dtype or bias.numel() != mat2.shape[1]:
        raise NVFP4InputError(f"bias: expected {mat2.shape[1]} elements (mat2's columns) of {out_dtype} (the output "
                              f"dtype), got {got}")


def emulated_scaled_mm_fp4(mat1: torch.Tensor, mat2: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                           bias: torch.Tensor | None = None, scale_result: torch.Tensor | None = None,
                           out_dtype: torch.dtype = OUT_DTYPE, use_fast_accum: bool = False) -> torch.Tensor:
    """What ``torch._scaled_mm(mat1, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)``
    computes for FP4 operands, on any device (out_dtype defaults to float16 here), with the same checks
    (mat1 row-major [M, K/2], mat2 column-major [K/2, N], flat blocked scale buffers, all on one device; and
    `_check_epilogue`'s, what torch._scaled_mm refuses for FP4). It decodes the scales from the blocked
    buffer, so a wrong layout gives wrong numbers here as it would on the GPU.

    What it promises: every dequantized operand and every product is exact in fp32; the sum over K is an
    fp32 matmul (plus the bias, in fp32), then rounded to `out_dtype`. It is not exact: cuBLAS also sums in
    fp32, in its own order, and any fp32 sum rounds its partial sums (at most about K * 2^-24 times the sum
    of |products|): far inside rtol = atol = 1e-3 for data of mixed signs, but where large products cancel it
    can swallow a whole small term (tests/test_scaled_mm.py: exact answer 4, fp32 sum 0). The exact answer is
    nvfp4lib.reference's. Scales are decoded as signed E4M3; cuBLAS reads them as unsigned UE4M3: the two
    agree for scales with the sign bit clear.
    """
    _check_scaled_mm_args(mat1, mat2, scale_a, scale_b)
    _check_epilogue(mat2, bias, scale_result, out_dtype, use_fast_accum)
    tensors = {"mat1": mat1, "mat2": mat2, "scale_a": scale_a, "scale_b": scale_b,
               **({"bias": bias} if bias is not None else {})}
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        raise NVFP4InputError(f"mat1, mat2, scale_a, scale_b: expected one device, got {devices}")
    return _emulate(mat1, mat2, scale_a, scale_b, bias, out_dtype)


def _emulate(mat1, mat2, scale_a, scale_b, bias=None, out_dtype=OUT_DTYPE) -> torch.Tensor:
    """`emulated_scaled_mm_fp4` on arguments known to be right: the GEMVs here check their 7-tuple
    once, which makes every batch's operands right, rather than each batch's arguments again."""
    a = _dequantize(mat1, scale_a)
    b = _dequantize(mat2.T, scale_b)
    out = a @ b.T
    if bias is not None:
        out = out + bias.reshape(-1).to(torch.float32)
    return out.to(out_dtype)


def _cublas_fp4(mat1, mat2, scale1, scale2) -> torch.Tensor:
    """torch._scaled_mm itself: cuBLAS's block-scaled FP4 GEMM, fp16 out (Blackwell)."""
    return torch._scaled_mm(mat1, mat2, scale1, scale2, out_dtype=OUT_DTYPE)


def _gemm_on(device: torch.device, gemm=_cublas_fp4):
    """``gemm`` where `device` has the FP4 GEMM, else the emulation (`_emulate`); `last_backend` says which."""
    return gemm if _use_hardware(device) else _emulate


def _checked_blocked_views(data):
    """The 7-tuple checked (errors say it is this module's; not where its caller did, `caches.validated_once`)
    and the [L, n] blocked views of its permuted scales (row l: permuted_as_blocked(sf_p, l))."""
    if not is_validated_once():
        try:
            validate_gemv_input(data)
        except NVFP4InputError as e:
            raise NVFP4InputError(f"scaled_mm GEMV input: {e}") from None
    return blocked_batches_view(data[4]), blocked_batches_view(data[5])  # sfa_permuted, sfb_permuted


CACHE_ENTRIES = 16  # sets of tensors remembered: a stream pool hands one per batch (L up to 8 here) in turn
_prepared = TupleCache(CACHE_ENTRIES)  # a repeated call on the same tensors is not checked again


def _checked(data):
    """`_checked_blocked_views`, once per set of tensors."""
    return _prepared.get(data, _checked_blocked_views)


def _gemv_per_batch(data, blocked_a, blocked_b, gemm) -> torch.Tensor:
    """Per batch l, ``gemm(A, B_padded.T)`` with the blocked scales blocked_a[l], blocked_b[l]: column 0 into c."""
    a, b, _, _, _, _, c = data
    for l in range(a.shape[2]):
        c[:, 0, l].copy_(gemm(a[:, :, l], b[:, :, l].T, blocked_a[l], blocked_b[l])[:, 0])
    return c


# ---------------------------------------------------------------------------------------------
# Variants 1 and 2: the reference's orientation, two sources of blocked scales


def gemv_scaled_mm_reference(data) -> torch.Tensor:
    """The leaderboard reference: per batch, ``A @ B_padded.T`` -> [M, 128], keep column 0. The plain scales
    sfa[:, :, l], sfb[:, :, l] are rearranged into the blocked layout with `to_blocked` on every call: a
    zero-padded copy plus a permuting copy per batch and operand, i.e. extra kernels and an extra read + write
    of all the A scales (1/8 of A's bytes). It is the baseline the other variants save against."""
    _checked(data)
    a, _, sfa, sfb, _, _, _ = data
    blocked = ([to_blocked(sf[:, :, l]) for l in range(sf.shape[2])] for sf in (sfa, sfb))
    return _gemv_per_batch(data, *blocked, _gemm_on(a.device))


def gemv_scaled_mm_permuted(data) -> torch.Tensor:
    """As `gemv_scaled_mm_reference`, but the scales are per-batch views of sfa_permuted / sfb_permuted: batch l
    of the permuted tensor is stored as exactly the bytes of the blocked buffer, so the conversion kernels and
    their traffic disappear and only the GEMM (plus the column copy) remains. The inputs carry both forms for
    this reason."""
    blocked = _checked(data)
    return _gemv_per_batch(data, *blocked, _gemm_on(data[0].device))


def gemv_cublas_permuted(data) -> torch.Tensor:
    """`gemv_scaled_mm_permuted` on cuBLAS alone, never the emulation: how an exported file runs that path, where
    the GPU has the FP4 GEMM (`paths.IN_A_FILE`)."""
    return _gemv_per_batch(data, *_checked(data), _cublas_fp4)


# ---------------------------------------------------------------------------------------------
# Variant 3: transposed GEMM, batched scale conversion, optional streams


def convert_scales_batched(sf: torch.Tensor) -> torch.Tensor:
    """Plain [MN, K/16, L] -> [L, n] blocked buffers of all batches, in one conversion."""
    return blocked_batches_view(to_permuted(sf))  # storage as to_permuted makes it: nothing to check again


def blocked_scales(sfa: torch.Tensor, sfb: torch.Tensor, *,
                   side_stream: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocked [L, n] scales of A and B, as the transposed variant gets them: converted all batches at once, on
    every call (A's on a side CUDA stream if `side_stream`). Not cached: a cache would have to know that the
    scales are unchanged, and PyTorch's version counter misses writes through ``.data``, through numpy,
    through another tensor over the same storage and through raw pointers (kernels)."""
    if not (side_stream and sfa.is_cuda):
        return convert_scales_batched(sfa), convert_scales_batched(sfb)
    caller, side = torch.cuda.current_stream(sfa.device), shared_pool(sfa.device, 1).streams[0]
    side.wait_stream(caller)  # the scales may have just been written on the caller's stream
    with torch.cuda.stream(side):
        blocked_a = convert_scales_batched(sfa)
    blocked_b = convert_scales_batched(sfb)  # meanwhile, on the caller's stream
    caller.wait_stream(side)
    blocked_a.record_stream(caller)  # made on `side`, read on `caller`
    return blocked_a, blocked_b


def gemv_scaled_mm_transposed(data, *, streams: int = 0, side_stream: bool = False) -> torch.Tensor:
    """The same GEMM the other way round: ``B_padded @ A.T`` -> [128, M], keep row 0.

    Saves, against `gemv_scaled_mm_reference`:
    * scale conversion kernels: all L batches are converted at once, on every call (`blocked_scales`;
      ``side_stream=True`` overlaps the A and B conversions on two streams).
    * a strided gather: the wanted output is row 0 of a row-major [128, M] result, M contiguous fp16
      values, instead of column 0 of [M, 128] (a stride-128 read).
    * possibly GEMM time: the large dimension M becomes the GEMM's N (the side whose tile width is
      flexible) and the 128 padded rows fill exactly one tile height. Whether cuBLAS's heuristics pick a
      faster kernel this way is measured, not assumed (notebook 03).
    `streams=n > 0` launches batch l on stream l % n of the device's `shared_pool` (CUDA only), joined back
    into the caller's current stream (no device synchronize); one host thread at a time.
    """
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 0:
        raise NVFP4InputError(f"streams: expected an int >= 0 (0 = the caller's stream), got {streams!r}")
    _checked(data)
    a, b, sfa, sfb, _, _, c = data
    gemm = _gemm_on(a.device)
    blocked_a, blocked_b = blocked_scales(sfa, sfb, side_stream=side_stream)

    def one_batch(l: int) -> None:
        c[:, 0, l].copy_(gemm(b[:, :, l], a[:, :, l].T, blocked_b[l], blocked_a[l])[0])

    if streams and a.is_cuda:
        shared_pool(a.device, streams).run(one_batch, range(a.shape[2]))
    else:
        for l in range(a.shape[2]):
            one_batch(l)
    return c


# ---------------------------------------------------------------------------------------------
# Variant 4: the public functional API

_RECIPE_NAMES = ("BlockWise1x16", "Blockwise_1x16")
_SWIZZLE_NAMES = ("SWIZZLE_32_4_4", "Swizzle_32_4_4")


def _functional_api():
    """(scaled_mm, BlockWise1x16, SWIZZLE_32_4_4) from torch.nn.functional, or None if absent."""
    f = torch.nn.functional
    fn, scaling, swizzle = (getattr(f, n, None) for n in ("scaled_mm", "ScalingType", "SwizzleType"))
    if fn is None or scaling is None or swizzle is None:
        return None
    recipe = next((getattr(scaling, n) for n in _RECIPE_NAMES if hasattr(scaling, n)), None)
    swz = next((getattr(swizzle, n) for n in _SWIZZLE_NAMES if hasattr(swizzle, n)), None)
    return None if recipe is None or swz is None else (fn, recipe, swz)


def functional_unavailable_reason() -> str | None:
    """Why `gemv_scaled_mm_functional` cannot run with this PyTorch, or None if it can."""
    if _functional_api() is None:
        return (f"torch.nn.functional.scaled_mm with ScalingType.BlockWise1x16 and "
                f"SwizzleType.SWIZZLE_32_4_4 is not available in PyTorch {torch.__version__}")
    return None


def gemv_scaled_mm_functional(data) -> torch.Tensor:
    """`gemv_scaled_mm_permuted` through the public ``torch.nn.functional.scaled_mm``. The recipe is named
    instead of inferred from dtypes and sizes (BlockWise1x16 scales in the SWIZZLE_32_4_4 = 128x4 blocked
    layout), so a wrong scale tensor is an error rather than another scaling mode; it saves nothing at run
    time against the permuted variant. Raises NotImplementedError when the installed PyTorch lacks the API."""
    api = _functional_api()
    if api is None:
        raise NotImplementedError(functional_unavailable_reason())
    fn, recipe, swizzle = api

    def gemm(mat1, mat2, scale1, scale2):
        return fn(mat1, mat2, scale1, recipe, scale2, recipe, swizzle_a=swizzle, swizzle_b=swizzle,
                  output_dtype=OUT_DTYPE)

    blocked = _checked(data)
    return _gemv_per_batch(data, *blocked, _gemm_on(data[0].device, gemm))
