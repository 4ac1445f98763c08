"""What a user would run instead of a custom NVFP4 GEMV kernel: the peers every path is measured against.

Each takes the leaderboard 7-tuple, writes every element of c and returns it:

* `eager_dequant_matmul`: decode A and B to float32 with their scales in plain PyTorch, one
  matmul per batch. Simple and slow: it writes and re-reads a float32 copy of A, 8x A's bytes.
* `compiled_dequant_reduce`: the same decode and a multiply-and-sum written as one function
  under ``torch.compile``, so the decode fuses into the reduction and A is read once.
* `prepare_bf16_weights` + `bf16_gemv`: the weights dequantized ahead of time to bf16, then only a
  cuBLAS GEMV per call (`bf16_gemv_dequantizing` does both in one call). The call is cheap to
  write but reads 4x the bytes of the NVFP4 data.

The Triton kernels (nvfp4lib.bench.triton_gemv) are peers too. `PEERS` registers them all as paths
under the names of nvfp4lib.paths (``peer_*``, ``triton_*``), and `all_paths` is every path a
benchmark times: the package's and the peers.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

from nvfp4lib.bench import triton_gemv
from nvfp4lib.caches import TupleCache
from nvfp4lib.contract import BLOCK_SIZE, validate_gemv_input
from nvfp4lib.device import Capabilities
from nvfp4lib.formats import decode_e2m1, decode_e4m3, unpack_fp4
from nvfp4lib.paths import PATHS, GemvPath

_checked = TupleCache()  # the last sets of tensors validated: a peer validates a tuple once, not on every call


def _validated(data) -> None:
    """`validate_gemv_input` (any M and strides, as the peers index the tensors), once per set of tensors."""
    _checked.get(data, lambda d: validate_gemv_input(d, need_m_multiple=None, check_storage=False))


def block_values(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [..., K/16, 16]: the values of codes [..., K/2] (uint8 or FP4 bytes) times their block's
    E4M3 scale [..., K/16]; every peer decodes with this (exact: 2 significant bits times 4)."""
    return decode_e2m1(unpack_fp4(codes)).unflatten(-1, (-1, BLOCK_SIZE)) * decode_e4m3(scales).unsqueeze(-1)


# ------------------------------------------------------------------------------ eager


def _dequantized(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[rows, K/2] codes and [rows, K/16] scales of one batch -> float32 [rows, K]."""
    return block_values(codes, scales).flatten(-2)


def eager_dequant_matmul(data) -> torch.Tensor:
    """Per batch: A and the vector B[0] dequantized to float32, ``A @ B[0]``, cast to fp16 into c.

    The products are exact in float32 (2 significant bits of E2M1 times 4 of E4M3), so the only
    rounding is float32 accumulation and the final fp16 cast.
    """
    _validated(data)
    a, b, sfa, sfb, _, _, c = data
    for l in range(a.shape[2]):
        weights = _dequantized(a[:, :, l], sfa[:, :, l])
        vector = _dequantized(b[0:1, :, l], sfb[0:1, :, l])
        c[:, 0, l].copy_((weights @ vector.T)[:, 0])
    return c


# ------------------------------------------------------------------------------ torch.compile


def _dequant_reduce_into(out: torch.Tensor, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor,
                         sfb: torch.Tensor) -> None:
    """out[l, m] = sum_k A*sfa * B*sfb, from uint8 views [L, M, K/2], [L, M, K/16], [L, 1, K/2], [L, 1, K/16].

    Written as decode, multiply and sum so that the compiler can fuse it into one pass over A;
    the result is stored into `out` (a view of c) inside the compiled graph, so no extra copy.
    """
    products = block_values(a, sfa) * block_values(b, sfb)  # [L, rows, K/16, 16]
    out.copy_(products.sum(dim=(-2, -1)))


_compiled = None
compile_note: str | None = None
"""None while `compiled_dequant_reduce` runs compiled; otherwise why it runs eagerly."""


def _compiled_fn():
    """The compiled function, built once per process (torch.compile keeps one graph per shape class)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_dequant_reduce_into)
    return _compiled


def compiled_dequant_reduce(data) -> torch.Tensor:
    """`_dequant_reduce_into` under torch.compile, writing c; the first call per shape compiles.

    On a CPU the compiler needs a working C++ toolchain; if compiling fails there, the function
    runs eagerly from then on and says so in `compile_note` (and one warning). On a GPU a
    compile failure is raised: a silent fallback would be timed as if it were compiled.
    """
    global compile_note
    _validated(data)
    a, b, sfa, sfb, _, _, c = data
    args = (c.permute(2, 0, 1)[:, :, 0],  # [L, M] view of c's (L, M, 1) storage
            a.view(torch.uint8).permute(2, 0, 1), sfa.view(torch.uint8).permute(2, 0, 1),
            b[0:1].view(torch.uint8).permute(2, 0, 1), sfb[0:1].view(torch.uint8).permute(2, 0, 1))
    if compile_note is None:
        try:
            _compiled_fn()(*args)
            return c
        except Exception as e:  # noqa: BLE001 - any compiler failure; re-raised on a GPU
            if c.is_cuda:
                raise
            compile_note = f"torch.compile failed on the CPU ({type(e).__name__}); running eagerly"
            warnings.warn(compile_note, RuntimeWarning, stacklevel=2)
    _dequant_reduce_into(*args)
    return c


# ------------------------------------------------------------------------------ bf16 weights


@dataclass(frozen=True)
class PreparedBF16:
    """Weights and vector dequantized ahead of time: bf16 [L, M, K] and [L, K, 1]."""

    weights: torch.Tensor
    vector: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Bytes a call reads: 2 per weight, 4x the NVFP4 codes plus scales (4.5 bits per weight)."""
        return self.weights.nbytes + self.vector.nbytes


def prepare_bf16_weights(data) -> PreparedBF16:
    """Dequantize A and B[0] of every batch to bf16, once (exact: each value has at most 6 significant bits)."""
    _validated(data)
    a, b, sfa, sfb, _, _, _ = data
    weights = torch.stack([_dequantized(a[:, :, l], sfa[:, :, l]) for l in range(a.shape[2])])
    vector = torch.stack([_dequantized(b[0:1, :, l], sfb[0:1, :, l]).T for l in range(a.shape[2])])
    return PreparedBF16(weights.to(torch.bfloat16), vector.to(torch.bfloat16))


def bf16_gemv(prepared: PreparedBF16, data) -> torch.Tensor:
    """c = weights @ vector per batch: one batched cuBLAS GEMV, fp32 accumulate, cast into c.

    The output is taken in float32 and then cast to fp16: a bf16 result (8 significant bits)
    would be off by up to 2^-9 relative, beyond the 1e-3 tolerance. PyTorch's CPU build has no
    bf16 -> fp32 matmul, so there the operands are widened first (same numbers, not timed on a GPU).
    """
    *_, c = data
    w, x = prepared.weights, prepared.vector
    if w.is_cuda:
        out = torch.bmm(w, x, out_dtype=torch.float32)
    else:
        out = torch.bmm(w.float(), x.float())
    c.permute(2, 0, 1).copy_(out)  # c's storage is (L, M, 1)
    return c


def bf16_gemv_dequantizing(data) -> torch.Tensor:
    """`bf16_gemv` with the weights dequantized in the call, so it is always right for the values
    as they are now; benchmarks prepare once instead (`PEERS` binds it that way)."""
    return bf16_gemv(prepare_bf16_weights(data), data)


# ------------------------------------------------------------------------------ the registry


def _on_cuda(reason: str | None, on_cuda: bool) -> str | None:
    return reason or (None if on_cuda else "Triton kernels need the inputs on a CUDA GPU")


def triton_unavailable(caps: Capabilities, on_cuda: bool) -> str | None:
    return _on_cuda(triton_gemv.why_unavailable(caps), on_cuda)


def dot_scaled_unavailable(caps: Capabilities, on_cuda: bool) -> str | None:
    return _on_cuda(triton_gemv.dot_scaled_unavailable(caps), on_cuda)


PEERS: dict[str, GemvPath] = {p.name: p for p in (
    GemvPath("peer_eager", "eager dequant + matmul", "eager PyTorch: dequantize to float32, one matmul per batch",
             lambda: eager_dequant_matmul, kind="peer"),
    GemvPath("peer_compiled", "torch.compile dequant-reduce", "torch.compile of dequantize-and-reduce, "
             "fused into one pass over A", lambda: compiled_dequant_reduce, kind="peer",
             describe=lambda data: compile_note or ""),
    GemvPath("peer_bf16", "cuBLAS bf16 GEMV", "cuBLAS bf16 GEMV on weights dequantized ahead of time "
             "(4x the bytes; benchmarks dequantize once, untimed)", lambda: bf16_gemv_dequantizing, kind="peer",
             timed_call=lambda data: functools.partial(bf16_gemv, prepare_bf16_weights(data), data)),
    GemvPath("triton_nvfp4", "Triton NVFP4 GEMV", "Triton: packed bytes, table-lookup decode, fp32 accumulation, "
             "autotuned", lambda: triton_gemv.TritonGemv("table"), triton_unavailable, kind="peer"),
    GemvPath("triton_nvfp4_bits", "Triton NVFP4 GEMV, bit decode", "the Triton GEMV with the codes decoded by bit "
             "operations instead of a table", lambda: triton_gemv.TritonGemv("bits"), triton_unavailable, kind="peer"),
    GemvPath("triton_dot_scaled", "Triton tl.dot_scaled", "Triton's block-scaled tl.dot_scaled with e2m1 "
             "operands (Blackwell)", lambda: triton_gemv.TritonDotScaledGemv(), dot_scaled_unavailable,
             kind="peer"),
)}
"""The peers as paths: what a PyTorch or Triton user would run instead of the package's kernels."""


def all_paths() -> dict[str, GemvPath]:
    """Every path a benchmark times, by name: the package's (`nvfp4lib.paths.PATHS`) and then the
    peers (`PEERS`). The suite, the figures' colours and the tests see the two through this."""
    return {**PATHS, **PEERS}
