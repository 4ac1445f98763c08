"""The GEMV's input contract, and the checks that hold every caller to it.

The leaderboard hands ``custom_kernel`` a 7-tuple; this module is the one place that says what it holds. Per
batch l (the last dimension of every tensor), with K/16 scale blocks:

* ``a`` [M, K/2, L] float4_e2m1fn_x2: two E2M1 codes per byte, the even element in the low nibble;
* ``b`` [128, K/2, L]: the vector is row 0, rows 1..127 are padding (so torch._scaled_mm
  accepts it as a matrix);
* ``sfa`` [M, K/16, L], ``sfb`` [128, K/16, L] float8_e4m3fn: one scale per 16 codes;
* ``sfa_permuted`` / ``sfb_permuted`` [32, 4, rest_mn, 4, rest_k, L]: the same scales in
  512-byte atoms of 128 rows x 4 scale columns, the layout of Blackwell's block-scaled MMA and of
  cuBLAS's blocked buffers (nvfp4lib.layouts converts);
* ``c`` [M, 1, L] float16: the output, written by the kernel.

Every tensor is a view of a contiguous (L, rows, cols) buffer (``plain_strides``), or of a contiguous
(L, rest_mn, rest_k, 32, 4, 4) one (``permuted_strides``). A kernel given a tensor with the right shape but
other strides would silently compute garbage; `validate_gemv_input` turns that into an error that names the
argument, and `validate_op_input` holds the op's four tensors (``nvfp4lib.ops.gemv``) to the same rules.
Nothing here imports the rest of the package."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Shape(NamedTuple):
    """A GEMV problem: M rows of A, K elements per row (and in the vector), L batches."""
    m: int
    k: int
    l: int

    @classmethod
    def of(cls, a: torch.Tensor) -> Shape:
        """The problem of a valid ``a`` ([M, K/2, L] FP4 bytes: K is twice its second size)."""
        m, half_k, l = a.shape
        return cls(m, 2 * half_k, l)


class GemvInput(NamedTuple):
    """The leaderboard's 7-tuple with named fields; still a plain tuple to everything else."""
    a: torch.Tensor
    b: torch.Tensor
    sfa: torch.Tensor
    sfb: torch.Tensor
    sfa_permuted: torch.Tensor
    sfb_permuted: torch.Tensor
    c: torch.Tensor


NAMES = GemvInput._fields
BLOCK_SIZE = 16  # FP4 codes per E4M3 scale
B_ROWS = 128  # b and sfb are padded to 128 rows so that torch._scaled_mm accepts them
SCALE_TILE_ROWS = 128  # one atom of the permuted scales: 128 rows ...
SCALE_TILE_COLS = 4  # ... x 4 scale columns (64 K elements) ...
SCALE_ATOM_BYTES = SCALE_TILE_ROWS * SCALE_TILE_COLS  # ... = 512 bytes

DTYPES = {"a": torch.float4_e2m1fn_x2, "b": torch.float4_e2m1fn_x2, "c": torch.float16,
          **dict.fromkeys(("sfa", "sfb", "sfa_permuted", "sfb_permuted"), torch.float8_e4m3fn)}
RANKS = {"a": 3, "b": 3, "sfa": 3, "sfb": 3, "sfa_permuted": 6, "sfb_permuted": 6, "c": 3}
# Bytes the kernels' widest loads need: 128-bit loads of codes and permuted scales, 32-bit of plain scales.
ALIGNMENT = {"a": 16, "b": 16, "sfa": 4, "sfb": 4, "sfa_permuted": 16, "sfb_permuted": 16, "c": 2}


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


def byte_view(t, name: str, dtype: torch.dtype) -> torch.Tensor:
    """uint8 view (no copy) of `t`, given as `dtype` or already as uint8 bytes."""
    require_tensor(t, name)
    if t.dtype == torch.uint8:
        return t
    if t.dtype == dtype:
        return t.view(torch.uint8)
    raise NVFP4InputError(f"{name}: expected uint8 or {str(dtype).removeprefix('torch.')}, got {t.dtype}")


def scale_tile_counts(mn: int, k_blocks: int) -> tuple[int, int]:
    """(rest_mn, rest_k): how many 128-row and 4-column tiles cover the scales."""
    return -(-mn // SCALE_TILE_ROWS), -(-k_blocks // SCALE_TILE_COLS)


def permuted_strides(rest_mn: int, rest_k: int, l: int) -> tuple[int, ...]:
    """Strides of [32, 4, rest_mn, 4, rest_k, L] viewing a contiguous (L, rest_mn, rest_k, 32, 4, 4)."""
    return (16, 4, rest_k * SCALE_ATOM_BYTES, 1, SCALE_ATOM_BYTES, rest_mn * rest_k * SCALE_ATOM_BYTES)


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


def first_tensor(data) -> torch.Tensor:
    """``a`` of a 7-tuple, read cheaply, for choosing a kernel or a device before the chosen code
    validates everything; a malformed tuple gets the error `validate_gemv_input` gives."""
    try:
        a = data[0]
    except (TypeError, AttributeError, IndexError, KeyError):
        a = None
    if not isinstance(a, torch.Tensor):
        validate_gemv_input(data)  # raises the NVFP4InputError that names what is wrong
    return a


def shape_of(data) -> Shape:
    """The Shape of a 7-tuple read from ``a`` alone (`first_tensor`)."""
    a = first_tensor(data)
    if a.dim() != 3 or 0 in a.shape:
        validate_gemv_input(data)  # names the rank or the zero size
    return Shape.of(a)


def validate_gemv_input(data, *, device=None, need_m_multiple: int | None = SCALE_TILE_ROWS,
                        need_k_multiple: int = BLOCK_SIZE * SCALE_TILE_COLS, check_storage: bool = True):
    """Check the 7-tuple (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c); return its Shape. `check_storage=False`
    skips strides and alignment, for code that indexes the tensors (the reference) rather than reading raw pointers.
    Always refused: a `c` that requires grad or cannot be written in place here (an inference tensor outside
    inference mode), a zero M, K or L, and a `c` that shares memory with an input (the byte ranges of their storages
    overlap, e.g. c is a view into a's storage). That comparison sees only the memory PyTorch knows the tensors by:
    what a kernel writes through raw pointers elsewhere cannot be detected."""
    if not isinstance(data, (tuple, list)) or len(data) != len(NAMES):
        got = f"{type(data).__name__} of length {len(data)}" if hasattr(data, "__len__") else type(data).__name__
        raise NVFP4InputError(f"data: expected a 7-tuple {NAMES}, got {got}")
    return _validate_tensors(dict(zip(NAMES, data)), "data", device, need_m_multiple, need_k_multiple, check_storage)


OP_NAMES = ("a", "b", "sfa_permuted", "sfb_permuted")
"""The tensors the op takes (nvfp4lib.ops.gemv): those of the 7-tuple that the result depends on and
that no kernel needs in another form; the op derives sfa and sfb from them and makes c."""


def validate_op_input(a, b, sfa_permuted, sfb_permuted, *, check_storage: bool = True) -> Shape:
    """Check the op's four tensors as `validate_gemv_input` checks them in the 7-tuple (same rules,
    same messages, each naming its argument); return the Shape. `check_storage=False` skips strides
    and alignment (for fake tensors, which have no memory)."""
    return _validate_tensors(dict(zip(OP_NAMES, (a, b, sfa_permuted, sfb_permuted))), ", ".join(OP_NAMES), None,
                             SCALE_TILE_ROWS, BLOCK_SIZE * SCALE_TILE_COLS, check_storage)


def _validate_tensors(t: dict, whole: str, device, need_m_multiple: int | None, need_k_multiple: int,
                      check_storage: bool) -> Shape:
    """The checks of `validate_gemv_input` on the named tensors of `t` (a and b among them); `whole`
    names them all, in the errors about all of them."""
    for name, x in t.items():
        require_tensor(x, name)
        if x.dtype != DTYPES[name]:
            raise NVFP4InputError(f"{name}: expected dtype {DTYPES[name]}, got {x.dtype}")
        if x.dim() != RANKS[name]:
            raise NVFP4InputError(f"{name}: expected rank {RANKS[name]}, got shape {tuple(x.shape)}")

    c = t.get("c")  # the op makes its own c
    if c is not None and c.requires_grad:
        raise NVFP4InputError("c: expected a tensor that does not require grad (the GEMV writes c in place, outside "
                              "autograd), got requires_grad=True")
    if c is not None and c.is_inference() and not torch.is_inference_mode_enabled():
        raise NVFP4InputError("c: expected a tensor that may be written here, got an inference tensor outside "
                              "torch.inference_mode() (PyTorch refuses in-place writes to it)")

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
    k_blocks = k // BLOCK_SIZE
    rest_m, rest_k = scale_tile_counts(m, k_blocks)
    shapes = {"a": (m, half_k, l), "b": (B_ROWS, half_k, l), "sfa": (m, k_blocks, l), "sfb": (B_ROWS, k_blocks, l),
              "sfa_permuted": (32, 4, rest_m, 4, rest_k, l), "sfb_permuted": (32, 4, 1, 4, rest_k, l), "c": (m, 1, l)}
    strides = {name: plain_strides(*shape) if len(shape) == 3 else permuted_strides(*shape[2:5:2], l)
               for name, shape in shapes.items()}
    for name, x in t.items():
        if tuple(x.shape) != shapes[name]:
            raise NVFP4InputError(f"{name}: expected shape {shapes[name]}, got {tuple(x.shape)}")
        if check_storage and not strides_match(x, strides[name]):
            raise NVFP4InputError(f"{name}: expected strides {strides[name]} (documented storage), got {x.stride()}")
        if check_storage and x.data_ptr() % ALIGNMENT[name]:
            raise NVFP4InputError(f"{name}: expected a data pointer aligned to {ALIGNMENT[name]} bytes, "
                                  f"got address % {ALIGNMENT[name]} = {x.data_ptr() % ALIGNMENT[name]}")

    devices = {name: x.device for name, x in t.items()}
    if len(set(devices.values())) != 1:
        raise NVFP4InputError(f"{whole}: expected all tensors on one device, got {devices}")
    if device is not None:
        want = torch.device(device)
        got = t["a"].device
        if got.type != want.type or (want.index is not None and got.index != want.index):
            raise NVFP4InputError(f"{whole}: expected tensors on {want}, got {got}")
    if "c" in t and t["c"].device.type != "meta":  # meta tensors have no memory
        c_first, c_end = _storage_span(t["c"])
        for name in NAMES[:-1]:
            first, end = _storage_span(t[name])
            if first < c_end and c_first < end:
                raise NVFP4InputError(f"c: expected memory of its own (c is written), but it shares "
                                      f"storage bytes with {name}")
    return Shape(m, k, l)
