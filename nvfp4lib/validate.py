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
    """What was prepared for the last few inputs (validation, views, raw addresses), keyed on
    the tensors themselves.

    A GEMV called again on the same tensors skips that work. The key holds, for every tensor,
    all that the prepared data depends on: the object (its id), data address, shape, strides,
    dtype and device. The container is not part of it, so a tuple and a list of the same
    tensors share an entry, and a list whose items are replaced, or a tensor re-pointed in
    place (``set_``, ``.data = ...``, ``as_strided_``), is prepared again. An entry holds its
    tensors, so their ids cannot be reused while it lives, and a hit means every remembered
    address is where each tensor's data is now. Values are not in the key (c is written by
    every call): nothing prepared here may depend on them. Per call: 6 reads of each tensor
    and one dict lookup, a few microseconds of host time and no device work.
    """

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._entries: dict[tuple, tuple] = {}

    @staticmethod
    def key(data) -> tuple:
        """Per tensor: (id, data address, shape, strides, dtype, device)."""
        return tuple([(id(t), t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) for t in data])

    def get(self, data, make):
        """make(data) the first time these tensors are seen as they are now, the remembered result afterwards."""
        try:
            key = self.key(data)
        except (TypeError, AttributeError):  # not a sequence of tensors: make() reports what is wrong
            return make(data)
        entry = self._entries.get(key)
        if entry is not None:
            return entry[1]
        value = make(data)
        if len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)))  # the oldest
        self._entries[key] = (tuple(data), value)
        return value


def strides_match(t: torch.Tensor, expected: tuple[int, ...]) -> bool:
    """Compare strides, ignoring size-1 dimensions (their stride never matters)."""
    return all(size == 1 or got == want for size, got, want in zip(t.shape, t.stride(), expected))


def plain_strides(rows: int, cols: int, l: int) -> tuple[int, int, int]:
    """Strides of a [rows, cols, L] view of a contiguous (L, rows, cols) buffer."""
    return (cols, 1, rows * cols)


def _storage_span(x: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte address of the whole storage behind x (not only x's own elements)."""
    storage = x.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def validate_gemv_input(data, *, device=None, need_m_multiple: int | None = 128, need_k_multiple: int = 64,
                        check_storage: bool = True):
    """Check the 7-tuple (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c); return its Shape.

    `check_storage=False` skips strides and alignment, for code that indexes the tensors
    (the reference) rather than reading raw pointers. Always refused: a zero M, K or L, and a
    `c` that shares memory with an input (the byte ranges of their storages overlap, e.g. c is
    a view into a's storage). That comparison sees only the memory PyTorch knows the tensors by:
    what a kernel writes through raw pointers elsewhere cannot be detected.
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
    for label, size in (("M", m), ("K", k), ("L", l)):
        if size == 0:
            raise NVFP4InputError(f"a: expected M, K and L >= 1, got {label} = 0 (shape {tuple(t['a'].shape)})")
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
    if t["c"].device.type != "meta":  # meta tensors have no memory
        c_first, c_end = _storage_span(t["c"])
        for name in NAMES[:-1]:
            first, end = _storage_span(t[name])
            if first < c_end and c_first < end:
                raise NVFP4InputError(f"c: expected memory of its own (c is written), but it shares "
                                      f"storage bytes with {name}")
    return Shape(m, k, l)
