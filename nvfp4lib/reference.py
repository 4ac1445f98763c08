"""Independent reference for the GEMV and a checker that explains what went wrong.

The reference decodes with table lookups and accumulates in float64, so it shares no
code path with any kernel and its own rounding error is negligible next to fp16's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4lib.formats import BLOCK_SIZE, decode_e2m1, decode_e4m3, unpack_fp4
from nvfp4lib.validate import require_tensor, validate_gemv_input

_CHUNK_ELEMENTS = 1 << 24  # bounds the float64 temporaries at 128 MB


def _values(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Packed [rows, K/2] codes and [rows, K/16] scales -> float64 [rows, K]."""
    v = decode_e2m1(unpack_fp4(codes)).double().unflatten(-1, (-1, BLOCK_SIZE))
    return (v * decode_e4m3(scales).double().unsqueeze(-1)).flatten(-2)


def reference_gemv(data) -> torch.Tensor:
    """float32 [M, 1, L]: c[m, 0, l] = sum_k A*sfa * B[0]*sfb[0], from the plain tensors only."""
    # Any M and any K with whole scale blocks; the tensors are indexed, so any strides.
    validate_gemv_input(data, need_m_multiple=None, need_k_multiple=BLOCK_SIZE, check_storage=False)
    a, b, sfa, sfb = data[:4]
    m, half_k, l = a.shape
    out = torch.empty(l, m, 1, dtype=torch.float32, device=a.device)
    rows = max(1, _CHUNK_ELEMENTS // (2 * half_k))
    for batch in range(l):
        vec = _values(b[0:1, :, batch], sfb[0:1, :, batch])[0]
        for start in range(0, m, rows):
            block = _values(a[start:start + rows, :, batch], sfa[start:start + rows, :, batch])
            out[batch, start:start + rows, 0] = (block @ vec).float()
    return out.permute(1, 2, 0)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    message: str
    max_abs_err: float
    n_bad: int

    def __bool__(self) -> bool:
        return self.ok


def check(output: torch.Tensor, data, rtol: float = 1e-3, atol: float = 1e-3, *, max_listed: int = 5) -> CheckResult:
    """Compare a GEMV output with the reference; NaN (e.g. unwritten after poison_) counts as wrong."""
    require_tensor(output, "output")
    expected = reference_gemv(data)
    if tuple(output.shape) != tuple(expected.shape):
        return CheckResult(False, f"output: expected shape {tuple(expected.shape)}, got {tuple(output.shape)}",
                           float("inf"), expected.numel())
    got = output.detach().to(device=expected.device, dtype=torch.float32)
    err = (got - expected).abs()
    bad = ~(err <= atol + rtol * expected.abs())  # written this way so NaN is bad
    n_bad = int(bad.sum())
    max_abs_err = float(err.max()) if err.numel() else 0.0
    if n_bad == 0:
        return CheckResult(True, f"ok: {expected.numel()} elements, max abs err {max_abs_err:.3g}",
                           max_abs_err, 0)
    n_nan = int(torch.isnan(got).sum())
    lines = [f"{n_bad} of {expected.numel()} elements mismatch (rtol={rtol}, atol={atol})"
             + (f", {n_nan} are NaN (unwritten?)" if n_nan else "")]
    for m, _, l in bad.nonzero()[:max_listed].tolist():
        g, e = got[m, 0, l].item(), expected[m, 0, l].item()
        shown = "NaN (unwritten?)" if g != g else f"{g:.6g}"
        lines.append(f"  (m={m}, l={l}): got {shown} vs expected {e:.6g}")
    return CheckResult(False, "\n".join(lines), max_abs_err, n_bad)


def assert_gemv_close(output: torch.Tensor, data, rtol: float = 1e-3, atol: float = 1e-3) -> None:
    result = check(output, data, rtol, atol)
    if not result.ok:
        raise AssertionError(result.message)


def poison_(c: torch.Tensor) -> torch.Tensor:
    """Fill the output with NaN in place, so elements a kernel forgets to write are caught."""
    return c.fill_(float("nan"))
