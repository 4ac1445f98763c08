"""Quantization-error studies: how much of a tensor survives 4 bits, and why blocks of 16.

`formats.quantize_nvfp4` is the format itself (block 16, E4M3 scales). To ask *why* the
format looks like that we need the same recipe with other block sizes and scale formats,
some realistic data to feed it, and a way to show which decoding bugs a test set can catch.
That is all this module holds; the notebooks only call it.
"""

from __future__ import annotations

import torch

from nvfp4lib.contract import BLOCK_SIZE
from nvfp4lib.formats import (E2M1_VALUES, FP4_MAX, decode_blocks, decode_e4m3, dequantize_blocks, encode_blocks,
                              fp4_bytes, quantize_blocks, sqnr_db, unpack_fp4)

DISTRIBUTIONS = ("gaussian", "laplace", "student_t3", "gaussian_outliers")
SCALE_FORMATS = ("e4m3", "e8m0", "fp32")
SCALE_BITS = {"e4m3": 8, "e8m0": 8, "fp32": 32}
E8M0_EMAX_E2M1 = 2  # exponent of E2M1's largest power of two (4): the MX rule uses it


def sample(name: str, rows: int, cols: int, *, seed: int = 0,
           outlier_fraction: float = 1e-3, outlier_scale: float = 50.0) -> torch.Tensor:
    """Draw a [rows, cols] float32 tensor from one of `DISTRIBUTIONS`, deterministically.

    Weights and activations are not Gaussian: they have heavy tails (Laplace, Student-t with
    3 degrees of freedom) and, in activations, rare large outliers. Each is built from a
    seeded generator so the same seed gives the same tensor on every machine.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (rows, cols)
    if name == "gaussian":
        return torch.randn(shape, generator=g)
    if name == "laplace":
        mag = torch.empty(shape).exponential_(generator=g)
        sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
        return mag * sign
    if name == "student_t3":
        z = torch.randn(shape, generator=g)
        chi2 = torch.randn((3, *shape), generator=g).pow(2).sum(0)
        return z / torch.sqrt(chi2 / 3)
    if name == "gaussian_outliers":
        x = torch.randn(shape, generator=g)
        n_out = max(1, round(outlier_fraction * x.numel()))
        where = torch.randperm(x.numel(), generator=g)[:n_out]
        sign = torch.randint(0, 2, (n_out,), generator=g) * 2 - 1
        x.view(-1)[where] = outlier_scale * sign.float()
        return x
    raise ValueError(f"name: expected one of {DISTRIBUTIONS}, got {name!r}")


def _study_multipliers(amax: torch.Tensor, scale_format: str) -> torch.Tensor:
    """float64 scale of each block of the formats other than NVFP4's, from the block amax."""
    if scale_format == "fp32":  # ideal: amax / 6 as an fp32 (an upper bound on what scales can do)
        return (amax / FP4_MAX).float().double()
    if scale_format == "e8m0":  # MX: a power of two, 2^(floor(log2 amax) - 2); may clip to 6
        _, exponent = torch.frexp(amax)  # amax = mantissa * 2^exponent, mantissa in [0.5, 1)
        return torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), exponent - 1 - E8M0_EMAX_E2M1), 0.0)
    raise ValueError(f"scale_format: expected one of {SCALE_FORMATS}, got {scale_format!r}")


def fake_quantize(x: torch.Tensor, block_size: int | str = 16,
                  scale_format: str = "e4m3") -> torch.Tensor:
    """Quantize the last dimension of `x` to E2M1 with one scale per `block_size` values and
    return the dequantized float32 tensor.

    `block_size` is an int dividing the last dimension, "row" (one scale per row) or
    "tensor" (one scale for everything). "e4m3" is NVFP4's recipe (`formats.quantize_blocks`),
    so at block 16 this is exactly `dequantize_nvfp4(quantize_nvfp4(x))`; the other scale formats
    share its encode and decode steps.
    """
    if block_size == "row":
        block_size = x.shape[-1]
    elif block_size == "tensor":
        block_size = x.numel()
    if not isinstance(block_size, int) or block_size < 1 or x.numel() % block_size \
            or (block_size <= x.shape[-1] and x.shape[-1] % block_size):
        raise ValueError(f"block_size: expected a divisor of the last dimension {x.shape[-1]}, "
                         f"'row' or 'tensor', got {block_size!r}")
    blocks = x.reshape(-1, block_size)
    if scale_format == "e4m3":
        return dequantize_blocks(*quantize_blocks(blocks, block_size)).reshape(x.shape)
    blocks = blocks.double()
    multipliers = _study_multipliers(blocks.abs().amax(-1), scale_format)
    return decode_blocks(encode_blocks(blocks, multipliers), multipliers).reshape(x.shape)


def bits_per_value(block_size: int | str, scale_format: str = "e4m3") -> float:
    """Storage cost: 4 bits of code plus the block's scale spread over its values."""
    if block_size in ("row", "tensor"):
        return 4.0
    return 4.0 + SCALE_BITS[scale_format] / block_size


def sqnr_sweep(distributions=DISTRIBUTIONS, block_sizes=(8, 16, 32, 64, 128, "row"),
               scale_format: str = "e4m3", *, rows: int = 256, cols: int = 4096,
               seed: int = 0) -> dict[str, dict]:
    """SQNR in dB for every (distribution, block size): {distribution: {block_size: dB}}."""
    out = {}
    for name in distributions:
        x = sample(name, rows, cols, seed=seed)
        out[name] = {bs: sqnr_db(x, fake_quantize(x, bs, scale_format)) for bs in block_sizes}
    return out


def nibble_histograms(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How often each of the 16 codes appears in the low and in the high nibble of `packed`
    (uint8 or float4_e2m1fn_x2): the quickest look at what a test set exercises."""
    b = fp4_bytes(packed).reshape(-1).long()
    return torch.bincount(b & 0xF, minlength=16), torch.bincount(b >> 4, minlength=16)


def gemv_with_decoder(data, table=E2M1_VALUES, *, high_nibble: bool = True) -> torch.Tensor:
    """The batched GEMV of the 7-tuple with a *chosen* code -> value table, float32 [M, 1, L].

    With the true table it matches the reference; with a wrong one (or `high_nibble=False`,
    which drops the odd K elements) it is what a kernel with that decoding bug computes, so we
    can ask whether a given test set would notice.
    """
    a, b, sfa, sfb, _, _, _ = data
    lut = torch.tensor(table, dtype=torch.float64, device=a.device)

    def values(packed, scales):  # [rows, K/2, L] -> (L, rows, K) float64, scales applied
        codes = unpack_fp4(fp4_bytes(packed).permute(2, 0, 1))
        if not high_nibble:
            codes[..., 1::2] = 0
        s = decode_e4m3(scales.permute(2, 0, 1)).double().repeat_interleave(BLOCK_SIZE, dim=-1)
        return lut[codes.long()] * s

    av, bv = values(a, sfa), values(b[:1], sfb[:1])      # b's row 0 is the vector
    out = (av * bv).sum(-1)                               # (L, M)
    return out.float().permute(1, 0).unsqueeze(1)         # [M, 1, L]

