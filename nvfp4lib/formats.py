"""The NVFP4 number formats: E2M1 codes, E4M3 block scales, and the two-level recipe.

Everything works on uint8 bit patterns because PyTorch's ``float4_e2m1fn_x2`` dtype supports almost no
arithmetic; a byte view is free, so the helpers stay device-agnostic."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nvfp4lib.contract import BLOCK_SIZE, NVFP4InputError, byte_view, require_real, require_tensor

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
FP4_MAX = 6.0
E4M3_MAX = 448.0

FLOAT32_MAX = torch.finfo(torch.float32).max  # NVFP4's per-tensor scale is an fp32 number ...
FLOAT32_MIN_NORMAL = torch.finfo(torch.float32).tiny  # ... a normal one: 2^-126 at least


def _midpoints(magnitudes) -> tuple[float, ...]:
    """Where rounding moves from one magnitude (in increasing order) to the next."""
    return tuple((lo + hi) / 2 for lo, hi in zip(magnitudes, magnitudes[1:]))


_E2M1_MIDPOINTS = _midpoints(E2M1_VALUES[:8])  # codes 0..7
_E4M3_MIDPOINTS = _midpoints(  # bytes 0x00..0x7E (0x7F is NaN); exact in float64
    torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double().tolist())


def _nearest_code(x: torch.Tensor, midpoints: tuple[float, ...], sign_bit: int) -> torch.Tensor:
    """uint8 code of the magnitude nearest to |x|, ties to the even code, saturating at the largest, with the sign of
    x at `sign_bit`. Codes number the magnitudes in increasing order and an even code has mantissa bit 0, so ties to
    the even code is IEEE round-half-to-even. x is converted once, before any arithmetic, to float64: it holds every
    float32, fp16 and bfloat16 value and every integer up to 2^53 exactly (a larger integer stays beyond every
    midpoint, with its sign), so the code is the only rounding."""
    exact = x.to(torch.float64)
    mids = torch.tensor(midpoints, dtype=torch.float64, device=x.device)
    magnitude = exact.abs()
    below = torch.bucketize(magnitude, mids, right=False)  # midpoints strictly below
    at_or_below = torch.bucketize(magnitude, mids, right=True)
    # Off a midpoint both counts agree; on one they differ by 1 and the even one wins.
    code = torch.where(at_or_below % 2 == 0, at_or_below, below).to(torch.uint8)
    return code | (torch.signbit(exact).to(torch.uint8) << sign_bit)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 code (ties to even code), saturating at +-6; the sign of zero is kept."""
    require_real(x, "x")
    if torch.isnan(x).any():
        raise NVFP4InputError("x: expected finite values to encode as E2M1, got NaN")
    return _nearest_code(x, _E2M1_MIDPOINTS, 3)


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
    return byte_view(t, name, torch.float4_e2m1fn_x2)


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


def byte_values(device=None) -> torch.Tensor:
    """[256, 2] float32: the values of the two codes of every byte, low nibble first, so that
    one lookup per byte decodes packed data."""
    return decode_e2m1(unpack_fp4(torch.arange(256, dtype=torch.uint8, device=device))).view(256, 2)


def decode_e4m3(t: torch.Tensor, name: str = "t") -> torch.Tensor:
    """E4M3 scales (float8_e4m3fn or their uint8 bits) -> float32."""
    return byte_view(t, name, torch.float8_e4m3fn).view(torch.float8_e4m3fn).to(torch.float32)


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float -> float8_e4m3fn, nearest with ties to even, saturating at +-448 (a plain cast gives NaN
    beyond 464, and rounds a float64 twice, through float32)."""
    require_real(x, "x")
    if torch.isnan(x).any():
        raise NVFP4InputError("x: expected values to encode as E4M3 (Inf saturates), got NaN")
    return _nearest_code(x, _E4M3_MIDPOINTS, 7).view(torch.float8_e4m3fn)


def encode_blocks(blocks: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes of blocks [..., n, size] divided by their block's multiplier [..., n] (its
    scale times any global scale), in float64. A block whose multiplier is zero (all zeros, or a
    scale below its format's range) gets code 0."""
    denom = multipliers.to(torch.float64).unsqueeze(-1)
    positive = denom > 0
    return encode_e2m1(torch.where(positive, blocks.to(torch.float64) / torch.where(positive, denom, 1.0), 0.0))


def decode_blocks(codes: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """float32 values of E2M1 codes [..., n, size] times their block's multiplier [..., n].

    The product is formed in float64, exactly when the multiplier has at most 51 significant bits
    (an E4M3 scale times an fp32 global scale has 28), and rounded once to float32."""
    return (decode_e2m1(codes).double() * multipliers.to(torch.float64).unsqueeze(-1)).float()


@dataclass
class NVFP4Tensor:
    """x ~= decode(codes) * scales (per 16 along the last dim) * global_scale."""

    codes: torch.Tensor   # float4_e2m1fn_x2 [..., K/2]
    scales: torch.Tensor  # float8_e4m3fn [..., K/16]
    global_scale: float


def _require_global_scale(value, name: str) -> float:
    """A positive normal float32 value: NVFP4 stores the per-tensor scale as an fp32, and one below
    float32's smallest normal (2^-126) is a subnormal or no float32 at all (1e-300 is 0 there)."""
    try:
        v = float(value) if not isinstance(value, (bool, str, bytes)) else math.nan
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
        v = math.nan
    if not (math.isfinite(v) and FLOAT32_MIN_NORMAL <= v <= FLOAT32_MAX) or isinstance(value, (bool, str, bytes)):
        detail = ""
        if math.isfinite(v) and v > FLOAT32_MAX:
            detail = f", beyond float32's range (max {FLOAT32_MAX:.6g})"
        elif math.isfinite(v) and 0 < v < FLOAT32_MIN_NORMAL:
            detail = ", below float32's smallest normal (a subnormal, or no float32 at all)"
        raise NVFP4InputError(f"{name}: expected a positive normal float32 ({FLOAT32_MIN_NORMAL:.6g} to "
                              f"{FLOAT32_MAX:.6g}), got {value!r}{detail}")
    return v


def quantize_blocks(x: torch.Tensor, block_size: int = BLOCK_SIZE,
                    global_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """NVFP4's two-level recipe along the last dimension, with blocks of `block_size`. Returns (uint8 E2M1 codes
    shaped like x, float8_e4m3fn scales [..., K / block_size], global scale). The global scale (amax / (6 * 448)
    unless given) moves the data's range to the top of E4M3's; each block gets the E4M3 scale nearest to its
    amax / 6 / global, each value the E2M1 code nearest to value / (scale * global). The arithmetic is float64 on x
    converted once, so no input is rounded before its code. A given global scale must be a positive normal float32
    (2^-126 to float32's max); the derived one is never below 2^-126, so a tensor whose amax is under
    6 * 448 * 2^-126 gets block scales below 448 (and a block under 6 * 2^-9 * 2^-126, about 1e-40, quantizes to
    zero: the format has nothing smaller)."""
    require_real(x, "x")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise NVFP4InputError(f"block_size: expected a positive int, got {block_size!r}")
    if x.dim() == 0 or x.shape[-1] % block_size:
        raise NVFP4InputError(
            f"x: expected the last dimension to be a multiple of {block_size}, got shape {tuple(x.shape)}")
    exact = x.to(torch.float64)
    if not torch.isfinite(exact).all():
        raise NVFP4InputError("x: expected finite values, got NaN or Inf")
    if global_scale is None:
        amax = exact.abs().max().item() if exact.numel() else 0.0
        # at least float32's smallest normal: the block scales take the rest, down to E4M3's 2^-9
        global_scale = max(amax / (FP4_MAX * E4M3_MAX), FLOAT32_MIN_NORMAL) if amax > 0 else 1.0
        if global_scale > FLOAT32_MAX:
            raise NVFP4InputError(f"x: expected max |x| <= 6 * 448 * {FLOAT32_MAX:.6g} (a global scale "
                                  f"within float32's range), got {amax:.6g}")
    global_scale = _require_global_scale(global_scale, "global_scale")
    blocks = exact.unflatten(-1, (-1, block_size))
    scales = encode_e4m3(blocks.abs().amax(-1) / FP4_MAX / global_scale)
    codes = encode_blocks(blocks, decode_e4m3(scales).double() * global_scale)
    return codes.flatten(-2), scales, global_scale


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, global_scale: float) -> torch.Tensor:
    """float32 values of `quantize_blocks`' output (the block size is codes' last dimension over
    scales')."""
    multipliers = decode_e4m3(scales, "scales").double() * global_scale
    return decode_blocks(codes.unflatten(-1, (scales.shape[-1], -1)), multipliers).flatten(-2)


def quantize_nvfp4(x: torch.Tensor, global_scale: float | None = None) -> NVFP4Tensor:
    """Two-level NVFP4 quantization along the last dimension (`quantize_blocks` with blocks of 16)."""
    codes, scales, global_scale = quantize_blocks(x, BLOCK_SIZE, global_scale)
    return NVFP4Tensor(as_fp4x2(pack_fp4(codes)), scales, global_scale)


def dequantize_nvfp4(q: NVFP4Tensor) -> torch.Tensor:
    """Decode codes and both scale levels back to float32 values."""
    if not isinstance(q, NVFP4Tensor):
        raise NVFP4InputError(f"q: expected an NVFP4Tensor, got {type(q).__name__}")
    codes, scales = fp4_bytes(q.codes, "q.codes"), byte_view(q.scales, "q.scales", torch.float8_e4m3fn)
    want = (*codes.shape[:-1], 2 * codes.shape[-1] // BLOCK_SIZE) if codes.dim() else None
    if want is None or codes.shape[-1] % (BLOCK_SIZE // 2) or tuple(scales.shape) != want:
        raise NVFP4InputError(f"q.scales: expected shape {want} (one per {BLOCK_SIZE} codes of q.codes "
                              f"{tuple(codes.shape)}), got {tuple(scales.shape)}")
    global_scale = _require_global_scale(q.global_scale, "q.global_scale")
    return dequantize_blocks(unpack_fp4(codes), scales, global_scale)  # the one decode of the scales


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when identical)."""
    ref, approx = ref.double(), approx.double()
    noise = (ref - approx).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    return math.inf if noise == 0 else 10.0 * math.log10(signal / noise)
