"""Scale-factor layouts: plain [MN, K/16, L], the "permuted" 6-D view, cuBLAS 128x4 blocked.

Blackwell's block-scaled MMA reads scales in 512-byte atoms: 128 rows x 4 scale columns (64 K elements), byte
(i % 32) * 16 + ((i % 128) // 32) * 4 + (j % 4). The permuted 6-D tensor [32, 4, rest_m, 4, rest_k, L] is a
view of exactly those bytes, and per batch they are the same bytes, in the same order, as cuBLAS's blocked
buffer; hence the free views below."""

from __future__ import annotations

import numbers

import torch

from nvfp4lib.contract import (BLOCK_SIZE, NVFP4InputError, SCALE_ATOM_BYTES, SCALE_TILE_COLS, SCALE_TILE_ROWS,
                               byte_view, permuted_strides, require_tensor, scale_tile_counts, strides_match,
                               validate_gemv_input)


def _bytes(sf: torch.Tensor, name: str) -> torch.Tensor:
    return byte_view(sf, name, torch.float8_e4m3fn)


def _tiles(sf_lmk: torch.Tensor) -> torch.Tensor:
    """Plain (L, MN, KB) -> contiguous (L, rest_mn, rest_k, 32, 4, 4), zero padded."""
    l, mn, kb = sf_lmk.shape
    rest_mn, rest_k = scale_tile_counts(mn, kb)
    padded = sf_lmk.new_zeros(l, rest_mn * SCALE_TILE_ROWS, rest_k * SCALE_TILE_COLS)
    padded[:, :mn, :kb] = sf_lmk
    # row i = (tile, i % 128 // 32, i % 32), column j = (tile, j % 4)
    split = padded.view(l, rest_mn, 4, 32, rest_k, SCALE_TILE_COLS)
    return split.permute(0, 1, 4, 3, 2, 5).contiguous()


def _untile(tiles: torch.Tensor, mn: int, k_blocks: int) -> torch.Tensor:
    """Contiguous (L, rest_mn, rest_k, 32, 4, 4) -> plain contiguous (L, MN, KB)."""
    l, rest_mn, rest_k = tiles.shape[:3]
    # row i = (tile, i % 128 // 32, i % 32), column j = (tile, j % 4), as in _tiles
    in_plain_order = tiles.permute(0, 1, 4, 3, 2, 5)
    if (mn, k_blocks) == (rest_mn * SCALE_TILE_ROWS, rest_k * SCALE_TILE_COLS):  # no padding: one copy
        plain = tiles.new_empty(l, mn, k_blocks)
        plain.view(in_plain_order.shape).copy_(in_plain_order)
        return plain
    plain = in_plain_order.reshape(l, rest_mn * SCALE_TILE_ROWS, rest_k * SCALE_TILE_COLS)
    # clone (not .contiguous()) so that even size-1 dims get canonical strides
    return plain[:, :mn, :k_blocks].clone(memory_format=torch.contiguous_format)


def to_permuted(sf: torch.Tensor) -> torch.Tensor:
    """Plain [MN, K/16, L] (or [MN, K/16] meaning L = 1) -> [32, 4, rest_mn, 4, rest_k, L]."""
    require_tensor(sf, "sf")
    if sf.dim() == 2:
        sf = sf.unsqueeze(-1)
    if sf.dim() != 3:
        raise NVFP4InputError(f"sf: expected [MN, K/16, L] or [MN, K/16], got shape {tuple(sf.shape)}")
    tiles = _tiles(_bytes(sf, "sf").permute(2, 0, 1))
    return tiles.view(sf.dtype).permute(3, 4, 1, 5, 2, 0)


def _check_permuted_shape(sfp) -> None:
    if require_tensor(sfp, "sfp").dim() != 6 or tuple(sfp.shape[:2]) != (32, 4) or sfp.shape[3] != 4:
        raise NVFP4InputError(f"sfp: expected shape [32, 4, rest_mn, 4, rest_k, L], got {tuple(sfp.shape)}")


def from_permuted(sfp: torch.Tensor, mn: int, k_blocks: int) -> torch.Tensor:
    """[32, 4, rest_mn, 4, rest_k, L] -> plain [MN, K/16, L] (view of a contiguous (L, MN, K/16))."""
    _check_permuted_shape(sfp)
    if tuple(sfp.shape[2:5:2]) != scale_tile_counts(mn, k_blocks):
        raise NVFP4InputError(
            f"sfp: expected rest_mn, rest_k = {scale_tile_counts(mn, k_blocks)} for mn={mn}, "
            f"k_blocks={k_blocks}, got shape {tuple(sfp.shape)}")
    tiles = _bytes(sfp, "sfp").permute(5, 2, 4, 0, 1, 3)
    return _untile(tiles, mn, k_blocks).view(sfp.dtype).permute(1, 2, 0)


def to_blocked(sf2d: torch.Tensor) -> torch.Tensor:
    """Plain [MN, K/16] -> flat cuBLAS 128x4 blocked buffer (what torch._scaled_mm takes)."""
    if require_tensor(sf2d, "sf2d").dim() != 2:
        raise NVFP4InputError(f"sf2d: expected [MN, K/16], got shape {tuple(sf2d.shape)}")
    return _tiles(_bytes(sf2d, "sf2d").unsqueeze(0)).view(sf2d.dtype).view(-1)


def from_blocked(flat: torch.Tensor, mn: int, k_blocks: int) -> torch.Tensor:
    """Flat cuBLAS blocked buffer -> plain contiguous [MN, K/16]."""
    rest_mn, rest_k = scale_tile_counts(mn, k_blocks)
    if require_tensor(flat, "flat").dim() != 1 or flat.numel() != rest_mn * rest_k * SCALE_ATOM_BYTES:
        raise NVFP4InputError(
            f"flat: expected 1-D with {rest_mn * rest_k * SCALE_ATOM_BYTES} elements for mn={mn}, "
            f"k_blocks={k_blocks}, got shape {tuple(flat.shape)}")
    tiles = _bytes(flat, "flat").view(1, rest_mn, rest_k, 32, 4, SCALE_TILE_COLS)
    return _untile(tiles, mn, k_blocks)[0].view(flat.dtype)


def _check_permuted_storage(sfp: torch.Tensor) -> None:
    _check_permuted_shape(sfp)
    _bytes(sfp, "sfp")  # the dtype
    rest_mn, rest_k, l = sfp.shape[2], sfp.shape[4], sfp.shape[5]
    want = permuted_strides(rest_mn, rest_k, l)
    if not strides_match(sfp, want):
        raise NVFP4InputError(
            f"sfp: expected strides {want} (a view of a contiguous (L, rest_mn, rest_k, 32, 4, 4) buffer), "
            f"got {sfp.stride()}; build it with to_permuted() or generate_input()")


def permuted_as_blocked_batches(sfp: torch.Tensor) -> torch.Tensor:
    """[32, 4, rest_mn, 4, rest_k, L] -> [L, n] where row l is batch l's blocked buffer; no copy."""
    _check_permuted_storage(sfp)
    return blocked_batches_view(sfp)


def blocked_batches_view(sfp: torch.Tensor) -> torch.Tensor:
    """`permuted_as_blocked_batches` of scales whose storage is known to be right (a 7-tuple
    `validate_gemv_input` passed): the view alone."""
    # .view (not .reshape) raises instead of copying if the storage were not as checked.
    return sfp.permute(5, 2, 4, 0, 1, 3).view(sfp.shape[5], -1)


def permuted_as_blocked(sfp: torch.Tensor, l: int) -> torch.Tensor:
    """Batch l of the permuted scales as a flat cuBLAS blocked buffer; a view, no copy."""
    batches = permuted_as_blocked_batches(sfp)
    # a bool (or a tensor) would pass as an index, and select all batches or some other view
    if isinstance(l, bool) or not isinstance(l, numbers.Integral):
        raise NVFP4InputError(f"l: expected an int batch index, got {l!r} of type {type(l).__name__}")
    if not 0 <= l < batches.shape[0]:
        raise NVFP4InputError(f"l: expected 0 <= l < {batches.shape[0]}, got {l}")
    return batches[l]


def _e4m3_value(byte: int) -> float:
    return torch.tensor(byte, dtype=torch.uint8).view(torch.float8_e4m3fn).item()


def check_scale_copies(data) -> None:
    """Check that the 7-tuple's two copies of each operand's scales agree: sfa with sfa_permuted (every row), sfb
    with sfb_permuted (row 0, the vector's; rows 1..127 are filler no path uses). The paths read one copy or the
    other (the reference and the plain-scale kernels sfa / sfb, the `torch._scaled_mm` views and the naive CuTe
    kernel the permuted ones), so copies that disagree give answers that depend on the path. Compared bit for bit (a
    NaN equals the same NaN); padding of the permuted tensors beyond M or K/16 is not read. Raises NVFP4InputError
    naming the permuted tensor, how many scales differ and the first (row, scale block, batch) with both values. A
    full read of the scales (1/8 of A's bytes and a conversion): off the hot path unless asked for
    (`dispatch.Dispatcher(check_scales=True)` or NVFP4_CHECK_SCALES=1)."""
    validate_gemv_input(data, need_m_multiple=None, need_k_multiple=BLOCK_SIZE, check_storage=False)
    _, _, sfa, sfb, sfa_permuted, sfb_permuted, _ = data
    k_blocks = sfa.shape[1]
    for name, plain, permuted, rows in (("sfa", sfa, sfa_permuted, sfa.shape[0]), ("sfb", sfb, sfb_permuted, 1)):
        mn = plain.shape[0]
        unpermuted = _bytes(from_permuted(permuted, mn, k_blocks), f"{name}_permuted")[:rows]
        differ = unpermuted != _bytes(plain, name)[:rows]
        n_differ = int(differ.sum())
        if n_differ:
            row, block, batch = differ.nonzero()[0].tolist()
            got, want = int(unpermuted[row, block, batch]), int(_bytes(plain, name)[row, block, batch])
            where = f"(row {row}, scale block {block}, batch {batch})"
            raise NVFP4InputError(
                f"{name}_permuted: expected the same scales as {name}, but {n_differ} of {differ.numel()} differ; "
                f"first at {where}: {name}_permuted holds 0x{got:02x} ({_e4m3_value(got):g}), {name} "
                f"0x{want:02x} ({_e4m3_value(want):g})")
