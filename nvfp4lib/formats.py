"""The NVFP4 number formats: E2M1 codes, E4M3 block scales, and the two-level recipe.

Everything works on uint8 bit patterns because PyTorch's ``float4_e2m1fn_x2`` dtype
supports almost no arithmetic; a byte view is free, so the helpers stay device-agnostic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nvfp4lib.validate import NVFP4InputError, require_real, require_tensor

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
FP4_MAX = 6.0
E4M3_MAX = 448.0
BLOCK_SIZE = 16

# Midpoints between neighbouring magnitudes (codes 0..7): where rounding changes code.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 code (ties to even code), saturating at +-6.

    Ties go to the even code because an even code has mantissa bit 0, which is what
    IEEE round-half-to-even means for this format. The sign of zero is kept.
    """
    require_real(x, "x")
    if torch.isnan(x).any():
        raise NVFP4InputError("x: expected finite values to encode as E2M1, got NaN")
    mag = x.abs().float().clamp(max=FP4_MAX)
    mids = torch.tensor(_E2M1_MIDPOINTS, device=x.device)
    below = torch.bucketize(mag, mids, right=False)  # midpoints strictly below mag
    at_or_below = torch.bucketize(mag, mids, right=True)
    # Off a midpoint both counts agree; on one they differ by 1 and the even one wins.
    code = torch.where(at_or_below % 2 == 0, at_or_below, below).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def _check_codes(codes) -> None:
    """uint8 values 0..15: a larger value has no E2M1 meaning (and would index past the table)."""
    require_tensor(codes, "codes")
    if codes.dtype != torch.uint8:
        raise NVFP4InputError(f"codes: expected uint8 E2M1 codes, got {codes.dtype}")
    # (not inside torch.compile: a data-dependent check there would split the compiled graph)
    if codes.numel() and not torch.compiler.is_compiling() and int(codes.max()) > 15:
        raise NVFP4InputError(f"codes: expected E2M1 codes 0..15, got a maximum of {int(codes.max())}")


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Table lookup code -> float32 (the table is the definition, so no bit tricks)."""
    _check_codes(codes)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def fp4_bytes(t: torch.Tensor, name: str = "t") -> torch.Tensor:
    """Byte view (no copy) of packed FP4 data given as uint8 or float4_e2m1fn_x2."""
    require_tensor(t, name)
    if t.dtype == torch.uint8:
        return t
    if t.dtype == torch.float4_e2m1fn_x2:
        return t.view(torch.uint8)
    raise NVFP4InputError(f"{name}: expected uint8 or float4_e2m1fn_x2, got {t.dtype}")


def as_fp4x2(t: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn_x2 view (no copy) of packed bytes, the dtype torch._scaled_mm wants."""
    return fp4_bytes(t).view(torch.float4_e2m1fn_x2)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """codes[..., K] -> bytes[..., K/2]; the even K index goes to the LOW nibble."""
    _check_codes(codes)
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise NVFP4InputError(f"codes: expected an even last dimension, got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """bytes[..., K/2] (uint8 or float4_e2m1fn_x2) -> codes[..., K], low nibble first."""
    b = fp4_bytes(packed, "packed")
    if b.dim() == 0:
        raise NVFP4InputError(f"packed: expected at least 1 dimension (K/2 bytes last), got shape {tuple(b.shape)}")
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def decode_e4m3(t: torch.Tensor, name: str = "t") -> torch.Tensor:
    """E4M3 scales (float8_e4m3fn or their uint8 bits) -> float32."""
    require_tensor(t, name)
    if t.dtype == torch.uint8:
        t = t.view(torch.float8_e4m3fn)
    if t.dtype != torch.float8_e4m3fn:
        raise NVFP4InputError(f"{name}: expected float8_e4m3fn or uint8, got {t.dtype}")
    return t.to(torch.float32)


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float -> float8_e4m3fn, saturating at +-448 (a plain cast would give NaN)."""
    require_real(x, "x")
    if torch.isnan(x).any():
        raise NVFP4InputError("x: expected values to encode as E4M3 (Inf saturates), got NaN")
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@dataclass
class NVFP4Tensor:
    """x ~= decode(codes) * scales (per 16 along the last dim) * global_scale."""

    codes: torch.Tensor   # float4_e2m1fn_x2 [..., K/2]
    scales: torch.Tensor  # float8_e4m3fn [..., K/16]
    global_scale: float


def quantize_nvfp4(x: torch.Tensor, global_scale: float | None = None) -> NVFP4Tensor:
    """Two-level NVFP4 quantization along the last dimension.

    The fp32 global scale (amax / (6 * 448)) lets every block scale fit E4M3's range;
    each 16-element block then gets the E4M3 scale that maps its amax to 6.
    """
    require_real(x, "x")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise NVFP4InputError(
            f"x: expected the last dimension to be a multiple of {BLOCK_SIZE}, got shape {tuple(x.shape)}")
    x = x.float()
    if not torch.isfinite(x).all():
        raise NVFP4InputError("x: expected finite values, got NaN or Inf")
    if global_scale is None:
        amax = x.abs().max().item() if x.numel() else 0.0
        global_scale = amax / (FP4_MAX * E4M3_MAX) if amax > 0 else 1.0
    try:
        ok = math.isfinite(global_scale) and global_scale > 0
    except TypeError:
        ok = False
    if not ok:
        raise NVFP4InputError(f"global_scale: expected a finite positive float, got {global_scale!r}")
    # float64: for amax below ~3e-35 the global scale is no normal float32, and float32 math would
    # round it (or flush it to zero) and lose the data
    blocks = x.double().unflatten(-1, (-1, BLOCK_SIZE))
    scales = encode_e4m3(blocks.abs().amax(-1) / FP4_MAX / global_scale)
    denom = (decode_e4m3(scales).double() * global_scale).unsqueeze(-1)
    # A block whose scale is zero (all zeros, or too small for E4M3) decodes to zero anyway.
    scaled = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1.0), 0.0)
    codes = pack_fp4(encode_e2m1(scaled.flatten(-2)))
    return NVFP4Tensor(as_fp4x2(codes), scales, float(global_scale))


def dequantize_nvfp4(q: NVFP4Tensor) -> torch.Tensor:
    """Decode codes and both scale levels back to float32 values."""
    if not isinstance(q, NVFP4Tensor):
        raise NVFP4InputError(f"q: expected an NVFP4Tensor, got {type(q).__name__}")
    codes, scales = fp4_bytes(q.codes, "q.codes"), decode_e4m3(q.scales, "q.scales")
    want = (*codes.shape[:-1], 2 * codes.shape[-1] // BLOCK_SIZE) if codes.dim() else None
    if want is None or codes.shape[-1] % (BLOCK_SIZE // 2) or tuple(scales.shape) != want:
        raise NVFP4InputError(f"q.scales: expected shape {want} (one per {BLOCK_SIZE} codes of q.codes "
                              f"{tuple(codes.shape)}), got {tuple(scales.shape)}")
    values = decode_e2m1(unpack_fp4(codes)).unflatten(-1, (-1, BLOCK_SIZE))
    scaled = values * scales.unsqueeze(-1) * q.global_scale
    return scaled.flatten(-2)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when identical)."""
    ref, approx = ref.double(), approx.double()
    noise = (ref - approx).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    return math.inf if noise == 0 else 10.0 * math.log10(signal / noise)
