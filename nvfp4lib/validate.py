"""Input checks for the GEMV 7-tuple, so kernels that read raw pointers fail loudly.

A kernel given a tensor with the right shape but the wrong strides silently computes
garbage; these checks turn that into an error that names the argument.
"""

from __future__ import annotations

import torch

NAMES = ("a", "b", "sfa", "sfb", "sfa_permuted", "sfb_permuted", "c")
_DTYPES = {
    "a": torch.float4_e2m1fn_x2, "b": torch.float4_e2m1fn_x2,
    "sfa": torch.float8_e4m3fn, "sfb": torch.float8_e4m3fn,
    "sfa_permuted": torch.float8_e4m3fn, "sfb_permuted": torch.float8_e4m3fn,
    "c": torch.float16,
}
_RANKS = {"a": 3, "b": 3, "sfa": 3, "sfb": 3, "sfa_permuted": 6, "sfb_permuted": 6, "c": 3}
B_ROWS = 128  # b and sfb are padded to 128 rows so that torch._scaled_mm accepts them
# Bytes the kernels' widest loads need: 128-bit loads of codes and permuted scales, 32-bit of plain scales.
_ALIGNMENT = {"a": 16, "b": 16, "sfa": 4, "sfb": 4, "sfa_permuted": 16, "sfb_permuted": 16, "c": 2}


class NVFP4InputError(ValueError):
    """A GEMV or quantization input is not what the code expects (names the argument)."""


def require_tensor(x, name: str) -> torch.Tensor:
    """x, or an error naming the argument (rather than an AttributeError deep inside)."""
    if not isinstance(x, torch.Tensor):
        raise NVFP4InputError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def require_real(x, name: str) -> torch.Tensor:
    """A tensor PyTorch can do arithmetic on as real numbers (not complex, not packed FP4)."""
    require_tensor(x, name)
    if x.is_complex() or x.dtype in (torch.bool, torch.float4_e2m1fn_x2):
        raise NVFP4InputError(f"{name}: expected a real floating-point or integer tensor, got {x.dtype}")
    return x


class TupleCache:
    """What was prepared for the last few input tuples (validation, views, addresses).

    A GEMV called again on the same 7-tuple skips that work: the per-call host cost is one
    dict lookup. An entry holds its tuple, so the tensors stay alive and the tuple's id
    cannot be reused while the entry lives; values written into the same tensors are read.
    """

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._entries: dict[int, tuple] = {}

    def get(self, data, make):
        """make(data) the first time this tuple is seen, the remembered result afterwards."""
        entry = self._entries.get(id(data))
        if entry is not None and entry[0] is data:
            return entry[1]
        value = make(data)
        if len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)))  # the oldest
        self._entries[id(data)] = (data, value)
        return value


def strides_match(t: torch.Tensor, expected: tuple[int, ...]) -> bool:
    """Compare strides, ignoring size-1 dimensions (their stride never matters)."""
    return all(size == 1 or got == want for size, got, want in zip(t.shape, t.stride(), expected))


def plain_strides(rows: int, cols: int, l: int) -> tuple[int, int, int]:
    """Strides of a [rows, cols, L] view of a contiguous (L, rows, cols) buffer."""
    return (cols, 1, rows * cols)


def validate_gemv_input(data, *, device=None, need_m_multiple: int | None = 128, need_k_multiple: int = 64,
                        check_storage: bool = True):
    """Check the 7-tuple (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c); return its Shape.

    `check_storage=False` skips strides and alignment, for code that indexes the tensors
    (the reference) rather than reading raw pointers.
    """
    from nvfp4lib.layouts import permuted_strides, scale_tile_counts  # they import this module
    from nvfp4lib.problem import Shape

    if not isinstance(data, (tuple, list)) or len(data) != len(NAMES):
        got = f"{type(data).__name__} of length {len(data)}" if hasattr(data, "__len__") else type(data).__name__
        raise NVFP4InputError(f"data: expected a 7-tuple {NAMES}, got {got}")
    t = dict(zip(NAMES, data))
    for name, x in t.items():
        require_tensor(x, name)
        if x.dtype != _DTYPES[name]:
            raise NVFP4InputError(f"{name}: expected dtype {_DTYPES[name]}, got {x.dtype}")
        if x.dim() != _RANKS[name]:
            raise NVFP4InputError(f"{name}: expected rank {_RANKS[name]}, got shape {tuple(x.shape)}")

    m, half_k, l = t["a"].shape
    k = 2 * half_k
    if t["b"].shape[1] != half_k:
        raise NVFP4InputError(f"b: expected K/2 = {half_k} (from a), got shape {tuple(t['b'].shape)}")
    if t["b"].shape[2] != l:
        raise NVFP4InputError(f"b: expected L = {l} (from a), got shape {tuple(t['b'].shape)}")
    if k % need_k_multiple:
        raise NVFP4InputError(f"a: expected K a multiple of {need_k_multiple}, got K = {k}")
    if need_m_multiple and m % need_m_multiple:
        raise NVFP4InputError(f"a: expected M a multiple of {need_m_multiple}, got M = {m}")
    k_blocks = k // 16
    rest_m, rest_k = scale_tile_counts(m, k_blocks)
    shapes = {
        "a": (m, half_k, l), "b": (B_ROWS, half_k, l),
        "sfa": (m, k_blocks, l), "sfb": (B_ROWS, k_blocks, l),
        "sfa_permuted": (32, 4, rest_m, 4, rest_k, l), "sfb_permuted": (32, 4, 1, 4, rest_k, l),
        "c": (m, 1, l),
    }
    strides = {
        "a": plain_strides(m, half_k, l), "b": plain_strides(B_ROWS, half_k, l),
        "sfa": plain_strides(m, k_blocks, l), "sfb": plain_strides(B_ROWS, k_blocks, l),
        "sfa_permuted": permuted_strides(rest_m, rest_k, l), "sfb_permuted": permuted_strides(1, rest_k, l),
        "c": plain_strides(m, 1, l),
    }
    for name, x in t.items():
        if tuple(x.shape) != shapes[name]:
            raise NVFP4InputError(f"{name}: expected shape {shapes[name]}, got {tuple(x.shape)}")
        if not check_storage:
            continue
        if not strides_match(x, strides[name]):
            raise NVFP4InputError(
                f"{name}: expected strides {strides[name]} (the documented storage), got {x.stride()}")
        if x.data_ptr() % _ALIGNMENT[name]:
            raise NVFP4InputError(f"{name}: expected a data pointer aligned to {_ALIGNMENT[name]} bytes, "
                                  f"got address % {_ALIGNMENT[name]} = {x.data_ptr() % _ALIGNMENT[name]}")

    devices = {name: x.device for name, x in t.items()}
    if len(set(devices.values())) != 1:
        raise NVFP4InputError(f"data: expected all tensors on one device, got {devices}")
    if device is not None:
        want = torch.device(device)
        got = t["a"].device
        if got.type != want.type or (want.index is not None and got.index != want.index):
            raise NVFP4InputError(f"data: expected tensors on {want}, got {got}")
    return Shape(m, k, l)
