"""Independent reference for the GEMV and a checker that explains what went wrong.

The reference is exact: every E2M1 value is n/2 with n an integer (|n| <= 12) and every finite E4M3 scale is
n * 2^-9 (|n| <= 448 * 2^9), so every term of the sum is an integer multiple of 2^-20 and the whole dot
product is an int64 sum, converted and rounded to float32 once. It decodes with the tables of `formats`; its
integer arithmetic shares nothing with any kernel's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4lib.contract import BLOCK_SIZE, NVFP4InputError, require_tensor, validate_gemv_input
from nvfp4lib.formats import E2M1_VALUES, E4M3_MAX, byte_values, decode_e4m3, fp4_bytes

TOLERANCE = 1e-3
"""The leaderboard's rtol and atol: an element matches within TOLERANCE * (1 + |expected|)."""
_CHUNK_ELEMENTS = 1 << 24  # A elements per chunk: bounds the temporaries at about 100 MB
E2M1_UNIT = 2.0 ** -1  # every E2M1 value is an integer multiple of this
E4M3_UNIT = 2.0 ** -9  # every finite E4M3 value (subnormals included) is an integer multiple of this
# Bit budget of the int64 sum, in units of (E2M1_UNIT * E4M3_UNIT)^2 = 2^-20: one block of 16 products
# of codes is at most 16 * 12 * 12 = 2304 units of 2^-2, times two scales of at most 448 * 2^9 each,
# about 1.2e14 < 2^47; int64 holds 76087 such blocks: K up to 1,217,392 (the leaderboard's K <= 16384).
_MAX_BLOCK_UNITS = BLOCK_SIZE * int(max(E2M1_VALUES) / E2M1_UNIT) ** 2 * int(E4M3_MAX / E4M3_UNIT) ** 2
MAX_EXACT_K = (2 ** 63 - 1) // _MAX_BLOCK_UNITS * BLOCK_SIZE


def _pair_units(device) -> torch.Tensor:
    """[256, 2] int16: the (low, high) nibble values of every byte, in units of E2M1_UNIT."""
    return (byte_values(device) / E2M1_UNIT).to(torch.int16)


def _scale_units(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 scales in units of E4M3_UNIT with NaN as 0, where the scale is NaN)."""
    values = decode_e4m3(scales)
    nan = torch.isnan(values)
    return (values.nan_to_num(0.0) / E4M3_UNIT).to(torch.int64), nan


def reference_gemv(data) -> torch.Tensor:
    """float32 [M, 1, L]: c[m, 0, l] = sum_k A*sfa * B[0]*sfb[0], the exact sum rounded once to float32 (NaN where a
    scale the row uses is NaN), from the plain tensors only. Per batch, a table holds for every K/2 byte position of
    the vector and every possible A byte the exact sum of the byte's two code products; a gather and a sum of 8 give
    each row's block sums of codes, which the scales multiply and add up in int64. Elementwise ops and sums only, so
    it runs on CPU and CUDA tensors alike."""
    # Any M and any K with whole scale blocks; the tensors are indexed, so any strides.
    validate_gemv_input(data, need_m_multiple=None, need_k_multiple=BLOCK_SIZE, check_storage=False)
    a, b, sfa, sfb, _, _, _ = data
    m, half_k, l = a.shape
    if 2 * half_k > MAX_EXACT_K:
        raise NVFP4InputError(f"a: expected K <= {MAX_EXACT_K} (an exact int64 sum), got K = {2 * half_k}")
    k_blocks = 2 * half_k // BLOCK_SIZE
    pairs = _pair_units(a.device)
    # byte position p of A indexes row p of the table: flat index p * 256 + byte
    position = torch.arange(half_k, device=a.device) * 256
    out = torch.empty(l, m, 1, dtype=torch.float32, device=a.device)
    rows = max(1, _CHUNK_ELEMENTS // (2 * half_k))
    for batch in range(l):
        vector = pairs[fp4_bytes(b[0, :, batch]).long()]  # [K/2, 2]
        table = (vector.unsqueeze(1) * pairs).sum(-1, dtype=torch.int16).view(-1)  # [K/2 * 256], |.| <= 288
        sb, sb_nan = _scale_units(sfb[0, :, batch])
        for start in range(0, m, rows):
            stop = min(start + rows, m)
            index = fp4_bytes(a[start:stop, :, batch]).long() + position
            block_sums = table.take(index).view(stop - start, k_blocks, BLOCK_SIZE // 2).sum(-1, dtype=torch.int64)
            sa, sa_nan = _scale_units(sfa[start:stop, :, batch])
            total = (block_sums * sa * sb).sum(-1)  # units of 2^-20, exact (see MAX_EXACT_K)
            # int64 -> float32 rounds once (to nearest even); the power-of-two scaling is exact
            values = total.to(torch.float32) * (E2M1_UNIT * E4M3_UNIT) ** 2
            nan = (sa_nan | sb_nan).any(-1)
            out[batch, start:stop, 0] = values.masked_fill(nan, float("nan"))
    return out.permute(1, 2, 0)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    message: str
    max_abs_err: float
    n_bad: int

    def __bool__(self) -> bool:
        return self.ok


def check(output: torch.Tensor, data, rtol: float = TOLERANCE, atol: float = TOLERANCE, *,
          max_listed: int = 5) -> CheckResult:
    """Compare a GEMV output with the reference as the leaderboard's checker does. An element matches when it is
    within atol + rtol * |expected|, or when both are NaN, or both the same infinity. The leaderboard's expected
    values are in the output's dtype, so an exact sum beyond fp16's range is +-inf there, and here too. An output NaN
    where the reference is finite stays a mismatch: that is how `poison_` catches elements a kernel never wrote."""
    require_tensor(output, "output")
    expected = reference_gemv(data)
    if tuple(output.shape) != tuple(expected.shape):
        return CheckResult(False, f"output: expected shape {tuple(expected.shape)}, got {tuple(output.shape)}",
                           float("inf"), expected.numel())
    got = output.detach().to(device=expected.device, dtype=torch.float32)
    if output.is_floating_point():
        in_output_dtype = expected.to(output.dtype).float()
        expected = torch.where(torch.isinf(in_output_dtype), in_output_dtype, expected)
    both_special = (torch.isnan(got) & torch.isnan(expected)) | (torch.isinf(got) & (got == expected))
    err = (got - expected).abs().masked_fill(both_special, 0.0)
    close = (err <= atol + rtol * expected.abs()) & torch.isfinite(expected)  # False for NaN
    bad = ~(close | both_special)
    n_bad = int(bad.sum())
    max_abs_err = float(err.max()) if err.numel() else 0.0
    if n_bad == 0:
        return CheckResult(True, f"ok: {expected.numel()} elements, max abs err {max_abs_err:.3g}",
                           max_abs_err, 0)
    n_nan = int((torch.isnan(got) & bad).sum())
    lines = [f"{n_bad} of {expected.numel()} elements mismatch (rtol={rtol}, atol={atol})"
             + (f", {n_nan} are NaN (unwritten?)" if n_nan else "")]
    for m, _, l in bad.nonzero()[:max_listed].tolist():
        g, e = got[m, 0, l].item(), expected[m, 0, l].item()
        shown = "NaN (unwritten?)" if g != g else f"{g:.6g}"
        lines.append(f"  (m={m}, l={l}): got {shown} vs expected {e:.6g}")
    return CheckResult(False, "\n".join(lines), max_abs_err, n_bad)


def poison_(c: torch.Tensor) -> torch.Tensor:
    """Fill the output with NaN in place, so elements a kernel forgets to write are caught."""
    return c.fill_(float("nan"))
