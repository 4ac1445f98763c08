"""Bad input is refused, by every public entry point, with an error that names the argument,
what was expected and what was given.

A kernel that reads raw pointers turns a wrong dtype, shape, stride or alignment into garbage or
a crashed GPU context, and a helper that fails deep inside PyTorch ("index 16 is out of bounds")
leaves the caller guessing which argument was wrong. The tables below pair each entry point with
every bad case that applies to it; each case says which message must appear.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch

from nvfp4lib import contract, dispatch, formats, layouts, problem, reference, scaled_mm
from nvfp4lib.cute import gemv as cute_gemv
from nvfp4lib.bench import peers
from nvfp4lib.contract import NAMES, NVFP4InputError
from nvfp4lib.bench.peers import all_paths

M, K, L = 256, 128, 2  # the valid base case: 2 row tiles, 2 scale-column tiles, 2 batches
BASE = problem.generate_input(M, K, L)


# --------------------------------------------------------------------------- building bad tuples


def with_(data, **changes):
    """The 7-tuple with some tensors replaced by name."""
    return tuple(changes.get(name, t) for name, t in zip(NAMES, data))


def other(m=M, k=K, l=L, name="a"):
    """One tensor of a valid tuple of another shape, laid out as the leaderboard does."""
    return getattr(problem.generate_input(m, k, l), name)


def shifted(t: torch.Tensor, by: int) -> torch.Tensor:
    """Same shape, strides, dtype and values, but the data starts `by` bytes past an aligned address."""
    assert t.element_size() == 1
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    buffer = torch.zeros(span + 64, dtype=torch.uint8)
    start = (-buffer.data_ptr()) % 64 + by
    out = buffer[start:start + span].as_strided(t.shape, t.stride())
    out.copy_(t.view(torch.uint8))
    return out.view(t.dtype)


def _inference_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of t made inside torch.inference_mode() (same strides), to be used outside it."""
    with torch.inference_mode():
        return t.clone()


def k40():
    """a and b with K = 40: a multiple of 16 (one scale per 16) but not of 64."""
    def packed(rows):
        return torch.zeros(L, rows, 20, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).permute(1, 2, 0)
    return with_(BASE, a=packed(M), b=packed(128))


# Who refuses a case: "reference" needs a well-formed tuple (any M, K a multiple of 16, any
# strides); "kernel" adds what kernels need (M % 128, K % 64, the documented storage and
# alignment, as raw-pointer kernels and cuBLAS read it); "gpu" adds tensors on a CUDA device.
ALL = frozenset({"reference", "kernel", "gpu"})
KERNELS = frozenset({"kernel", "gpu"})
GPU = frozenset({"gpu"})


class TupleCase(NamedTuple):
    id: str
    make: Callable[[], object]
    match: str  # must appear after the start of the message or after a "...: " prefix
    refused_by: frozenset = ALL


TUPLE_CASES = [
    # arity and types
    TupleCase("six-entries", lambda: BASE[:6], r"data: expected a 7-tuple .*, got tuple of length 6"),
    TupleCase("eight-entries", lambda: BASE + (BASE.c,), r"data: expected a 7-tuple .*, got tuple of length 8"),
    TupleCase("none", lambda: None, r"data: expected a 7-tuple .*, got NoneType"),
    TupleCase("dict", lambda: dict(zip(NAMES, BASE)), r"data: expected a 7-tuple .*, got dict of length 7"),
    TupleCase("b-none", lambda: with_(BASE, b=None), r"b: expected a torch\.Tensor, got NoneType"),
    TupleCase("sfa-ndarray", lambda: with_(BASE, sfa=BASE.sfa.float().numpy()),
              r"sfa: expected a torch\.Tensor, got ndarray"),
    TupleCase("c-float", lambda: with_(BASE, c=0.0), r"c: expected a torch\.Tensor, got float"),
    # dtypes
    TupleCase("a-uint8", lambda: with_(BASE, a=BASE.a.view(torch.uint8)),
              r"a: expected dtype torch\.float4_e2m1fn_x2, got torch\.uint8"),
    TupleCase("b-int8", lambda: with_(BASE, b=BASE.b.view(torch.int8)),
              r"b: expected dtype torch\.float4_e2m1fn_x2, got torch\.int8"),
    TupleCase("sfa-float32", lambda: with_(BASE, sfa=BASE.sfa.float()),
              r"sfa: expected dtype torch\.float8_e4m3fn, got torch\.float32"),
    TupleCase("sfb-e5m2", lambda: with_(BASE, sfb=BASE.sfb.view(torch.float8_e5m2)),
              r"sfb: expected dtype torch\.float8_e4m3fn, got torch\.float8_e5m2"),
    TupleCase("sfa_permuted-uint8", lambda: with_(BASE, sfa_permuted=BASE.sfa_permuted.view(torch.uint8)),
              r"sfa_permuted: expected dtype torch\.float8_e4m3fn, got torch\.uint8"),
    TupleCase("c-float32", lambda: with_(BASE, c=BASE.c.float()),
              r"c: expected dtype torch\.float16, got torch\.float32"),
    TupleCase("c-bfloat16", lambda: with_(BASE, c=BASE.c.bfloat16()),
              r"c: expected dtype torch\.float16, got torch\.bfloat16"),
    # c as autograd or inference mode sees it: every path writes c in place
    TupleCase("c-requires-grad", lambda: with_(BASE, c=BASE.c.clone().requires_grad_()),
              r"c: expected a tensor that does not require grad .*, got requires_grad=True"),
    TupleCase("c-inference", lambda: with_(BASE, c=_inference_copy(BASE.c)),
              r"c: expected a tensor that may be written here, got an inference tensor outside "
              r"torch\.inference_mode\(\)"),
    # ranks
    TupleCase("a-rank2", lambda: with_(BASE, a=BASE.a[:, :, 0]), r"a: expected rank 3, got shape \(256, 64\)"),
    TupleCase("sfa-rank4", lambda: with_(BASE, sfa=BASE.sfa.unsqueeze(0)),
              r"sfa: expected rank 3, got shape \(1, 256, 8, 2\)"),
    TupleCase("sfb_permuted-rank5", lambda: with_(BASE, sfb_permuted=BASE.sfb_permuted[..., 0]),
              r"sfb_permuted: expected rank 6, got shape \(32, 4, 1, 4, 2\)"),
    TupleCase("c-rank2", lambda: with_(BASE, c=BASE.c[:, 0, :]), r"c: expected rank 3, got shape \(256, 2\)"),
    # shapes, and K / L that disagree between operands
    TupleCase("b-64-rows", lambda: with_(BASE, b=BASE.b[:64]),
              r"b: expected shape \(128, 64, 2\), got \(64, 64, 2\)"),
    TupleCase("b-other-K", lambda: with_(BASE, b=other(k=256, name="b")),
              r"b: expected K/2 = 64 \(from a\), got shape \(128, 128, 2\)"),
    TupleCase("b-other-L", lambda: with_(BASE, b=other(l=1, name="b")),
              r"b: expected L = 2 \(from a\), got shape \(128, 64, 1\)"),
    TupleCase("sfa-other-K", lambda: with_(BASE, sfa=other(k=256, name="sfa")),
              r"sfa: expected shape \(256, 8, 2\), got \(256, 16, 2\)"),
    TupleCase("sfa-other-M", lambda: with_(BASE, sfa=other(m=128, name="sfa")),
              r"sfa: expected shape \(256, 8, 2\), got \(128, 8, 2\)"),
    TupleCase("sfb-other-L", lambda: with_(BASE, sfb=other(l=1, name="sfb")),
              r"sfb: expected shape \(128, 8, 2\), got \(128, 8, 1\)"),
    TupleCase("sfa_permuted-other-M", lambda: with_(BASE, sfa_permuted=other(m=128, name="sfa_permuted")),
              r"sfa_permuted: expected shape \(32, 4, 2, 4, 2, 2\), got \(32, 4, 1, 4, 2, 2\)"),
    TupleCase("sfb_permuted-other-L", lambda: with_(BASE, sfb_permuted=other(l=1, name="sfb_permuted")),
              r"sfb_permuted: expected shape \(32, 4, 1, 4, 2, 2\), got \(32, 4, 1, 4, 2, 1\)"),
    TupleCase("c-other-L", lambda: with_(BASE, c=other(l=1, name="c")),
              r"c: expected shape \(256, 1, 2\), got \(256, 1, 1\)"),
    # K and M constraints
    TupleCase("K-40", k40, r"a: expected K a multiple of (16|64), got K = 40"),
    TupleCase("K-96", lambda: problem.generate_input(M, 96, L), r"a: expected K a multiple of 64, got K = 96",
              KERNELS),
    TupleCase("M-200", lambda: problem.generate_input(200, K, L), r"a: expected M a multiple of 128, got M = 200",
              KERNELS),
    # devices ('meta' stands in for a second device)
    TupleCase("c-on-meta", lambda: with_(BASE, c=BASE.c.to("meta")),
              r"data: expected all tensors on one device, got .*'c': device\(type='meta'\)"),
    TupleCase("sfa-on-meta", lambda: with_(BASE, sfa=BASE.sfa.to("meta")),
              r"data: expected all tensors on one device, got .*'sfa': device\(type='meta'\)"),
    TupleCase("cpu-data-to-gpu-kernel", lambda: BASE, r"data: expected tensors on cuda, got cpu", GPU),
    # storage that a raw-pointer kernel would misread: same shape and values, other strides
    TupleCase("a-contiguous", lambda: with_(BASE, a=BASE.a.contiguous()),
              r"a: expected strides \(64, 1, 16384\) .*got \(128, 2, 1\)", KERNELS),
    TupleCase("sfa-contiguous", lambda: with_(BASE, sfa=BASE.sfa.contiguous()),
              r"sfa: expected strides \(8, 1, 2048\) .*got \(16, 2, 1\)", KERNELS),
    TupleCase("sfb_permuted-contiguous", lambda: with_(BASE, sfb_permuted=BASE.sfb_permuted.contiguous()),
              r"sfb_permuted: expected strides \(16, 4, 1024, 1, 512, 1024\) .*got \(64, 16, 16, 4, 2, 1\)",
              KERNELS),
    TupleCase("c-contiguous", lambda: with_(BASE, c=BASE.c.contiguous()),
              r"c: expected strides \(1, 1, 256\) .*got \(2, 2, 1\)", KERNELS),
    # ... or the right strides from an address that 128-bit (a, b, permuted scales) or 32-bit
    # (plain scales) loads cannot use
    TupleCase("a-misaligned", lambda: with_(BASE, a=shifted(BASE.a, 1)),
              r"a: expected a data pointer aligned to 16 bytes, got address % 16 = 1", KERNELS),
    TupleCase("b-misaligned", lambda: with_(BASE, b=shifted(BASE.b, 8)),
              r"b: expected a data pointer aligned to 16 bytes, got address % 16 = 8", KERNELS),
    TupleCase("sfa-misaligned", lambda: with_(BASE, sfa=shifted(BASE.sfa, 2)),
              r"sfa: expected a data pointer aligned to 4 bytes, got address % 4 = 2", KERNELS),
    TupleCase("sfa_permuted-misaligned", lambda: with_(BASE, sfa_permuted=shifted(BASE.sfa_permuted, 4)),
              r"sfa_permuted: expected a data pointer aligned to 16 bytes, got address % 16 = 4", KERNELS),
]


def _functional(data):
    reason = scaled_mm.functional_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return scaled_mm.gemv_scaled_mm_functional(data)


# Entry points that take the 7-tuple, and which family of checks they must make.
TUPLE_ENTRIES = {
    "validate_gemv_input": (contract.validate_gemv_input, "kernel"),
    "reference_gemv": (reference.reference_gemv, "reference"),
    "check": (lambda data: reference.check(torch.zeros(M, 1, L), data), "reference"),
    "gemv_scaled_mm_reference": (scaled_mm.gemv_scaled_mm_reference, "kernel"),
    "gemv_scaled_mm_permuted": (scaled_mm.gemv_scaled_mm_permuted, "kernel"),
    "gemv_scaled_mm_transposed": (scaled_mm.gemv_scaled_mm_transposed, "kernel"),
    "gemv_scaled_mm_functional": (_functional, "kernel"),
    "custom_kernel": (dispatch.custom_kernel, "kernel"),
    "eager_dequant_matmul": (peers.eager_dequant_matmul, "reference"),
    "prepare_bf16_weights": (peers.prepare_bf16_weights, "reference"),
    "gemv_cute_fast": (lambda data: cute_gemv.gemv_cute(data, "fast"), "gpu"),
    "gemv_cute_naive": (lambda data: cute_gemv.gemv_cute(data, "naive"), "gpu"),
    "CuteGemv_naive": (lambda data: cute_gemv.CuteGemv("naive")(data), "gpu"),
}


@functools.lru_cache(maxsize=None)
def _built(name: str):
    return all_paths()[name].build()


def _registry_path(name: str):
    """What the registry builds for `name` (for the package's paths what ``dispatch.force(name)`` runs),
    built on first use."""
    def run(data):
        if name == "scaled_mm_functional":
            return _functional(data)
        return _built(name)(data)

    return run


# The registry's paths, as the dispatcher and the benchmark run them.
REGISTRY_FAMILIES = {"cute_fast": "gpu", "cute_naive": "gpu", "scaled_mm_reference": "kernel",
                     "scaled_mm_permuted": "kernel", "scaled_mm_transposed": "kernel",
                     "scaled_mm_functional": "kernel", "scaled_mm_streams": "kernel", "scaled_mm_graph": "kernel",
                     "cute_fast_graph": "gpu", "reference": "reference", "peer_eager": "reference",
                     "peer_compiled": "reference", "peer_bf16": "reference"}
TUPLE_ENTRIES.update({f"paths.{name}": (_registry_path(name), family) for name, family in REGISTRY_FAMILIES.items()})

TUPLE_PAIRS = [pytest.param(entry, case, id=f"{entry}-{case.id}")
               for entry, (_, family) in TUPLE_ENTRIES.items()
               for case in TUPLE_CASES if family in case.refused_by]


@pytest.mark.parametrize("entry, case", TUPLE_PAIRS)
def test_bad_tuple_is_refused(entry, case):
    fn, _ = TUPLE_ENTRIES[entry]
    data = case.make()
    with pytest.raises(NVFP4InputError, match=rf"(?:^|: ){case.match}"):
        fn(data)


def test_every_tuple_entry_meets_every_family_of_cases():
    """No entry point silently drops out of the table (e.g. by a typo in its family)."""
    families = {family for _, family in TUPLE_ENTRIES.values()}
    assert families == {"reference", "kernel", "gpu"}
    covered = {entry for entry, _ in (p.values for p in TUPLE_PAIRS)}
    assert covered == set(TUPLE_ENTRIES)


@pytest.mark.parametrize("entry", [e for e, (_, fam) in TUPLE_ENTRIES.items() if fam != "gpu"])
def test_valid_tuple_is_accepted(entry):
    """The base case itself is fine, so every refusal above is caused by its one change."""
    fn, _ = TUPLE_ENTRIES[entry]
    data = problem.generate_input(M, K, L)
    reference.poison_(data.c)
    out = fn(data)
    if entry not in ("validate_gemv_input", "reference_gemv", "check", "prepare_bf16_weights"):  # these write no c
        assert out is data.c
        result = reference.check(out, data)
        assert result.ok, f"{entry}: {result.message}"


# --------------------------------------------------------------------------- everything else


class Case(NamedTuple):
    entry: str
    id: str
    call: Callable[[], object]
    match: str
    error: type = NVFP4InputError


def _fp4(*shape):
    return torch.zeros(*shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


def _e4m3(*shape):
    return torch.ones(*shape).to(torch.float8_e4m3fn)


PERMUTED = layouts.to_permuted(BASE.sfa)  # [32, 4, 2, 4, 2, 2]
BLOCKED = layouts.to_blocked(BASE.sfa[:, :, 0])  # 2 x 2 atoms
ROWS = torch.randn(4, 32)
NAN_ROWS = ROWS.clone().index_put_((torch.tensor([1]), torch.tensor([3])), torch.tensor(math.nan))
INF_ROWS = ROWS.clone().index_put_((torch.tensor([2]), torch.tensor([5])), torch.tensor(-math.inf))
CODES_16 = torch.tensor([[3, 16]], dtype=torch.uint8)  # 16 is not a 4-bit code

CASES = [
    # formats.quantize_nvfp4
    Case("quantize_nvfp4", "list", lambda: formats.quantize_nvfp4([1.0] * 16),
         r"^x: expected a torch\.Tensor, got list"),
    Case("quantize_nvfp4", "0-d", lambda: formats.quantize_nvfp4(torch.tensor(1.0)),
         r"^x: expected .*, got shape \(\)"),
    Case("quantize_nvfp4", "last-dim-24", lambda: formats.quantize_nvfp4(torch.randn(4, 24)),
         r"^x: expected the last dimension to be a multiple of 16, got shape \(4, 24\)"),
    Case("quantize_nvfp4", "fp4-input", lambda: formats.quantize_nvfp4(_fp4(4, 16)),
         r"^x: expected a real floating-point .*tensor, got torch\.float4_e2m1fn_x2"),
    Case("quantize_nvfp4", "complex", lambda: formats.quantize_nvfp4(torch.ones(4, 16, dtype=torch.complex64)),
         r"^x: expected a real floating-point .*tensor, got torch\.complex64"),
    Case("quantize_nvfp4", "nan", lambda: formats.quantize_nvfp4(NAN_ROWS),
         r"^x: expected finite values, got NaN"),
    Case("quantize_nvfp4", "-inf", lambda: formats.quantize_nvfp4(INF_ROWS),
         r"^x: expected finite values, got .*Inf"),
    Case("quantize_nvfp4", "nan-fp16", lambda: formats.quantize_nvfp4(NAN_ROWS.half()),
         r"^x: expected finite values, got NaN"),
    Case("quantize_nvfp4", "global-nan", lambda: formats.quantize_nvfp4(ROWS, math.nan),
         r"^global_scale: expected a positive normal float32 \(1\.17549e-38 to 3\.40282e\+38\), got nan$"),
    Case("quantize_nvfp4", "global-inf", lambda: formats.quantize_nvfp4(ROWS, math.inf),
         r"^global_scale: expected a positive normal float32 .*, got inf$"),
    Case("quantize_nvfp4", "global-zero", lambda: formats.quantize_nvfp4(ROWS, 0.0),
         r"^global_scale: expected a positive normal float32 .*, got 0\.0$"),
    Case("quantize_nvfp4", "global-negative", lambda: formats.quantize_nvfp4(ROWS, -1.0),
         r"^global_scale: expected a positive normal float32 .*, got -1\.0$"),
    Case("quantize_nvfp4", "global-str", lambda: formats.quantize_nvfp4(ROWS, "1"),
         r"^global_scale: expected a positive normal float32 .*, got '1'$"),
    Case("quantize_nvfp4", "global-bool", lambda: formats.quantize_nvfp4(ROWS, True),
         r"^global_scale: expected a positive normal float32 .*, got True$"),
    Case("quantize_nvfp4", "global-1e-300", lambda: formats.quantize_nvfp4(ROWS, 1e-300),
         r"^global_scale: expected a positive normal float32 .*, got 1e-300, below float32's smallest normal"),
    Case("quantize_nvfp4", "global-subnormal", lambda: formats.quantize_nvfp4(ROWS, 2.0 ** -127),
         r"^global_scale: expected a positive normal float32 .*, got 5\.877\d*e-39, below float32's smallest normal"),
    Case("dequantize_nvfp4", "global-1e-300",
         lambda: formats.dequantize_nvfp4(formats.NVFP4Tensor(_fp4(4, 8), _e4m3(4, 1), 1e-300)),
         r"^q\.global_scale: expected a positive normal float32 .*, got 1e-300, below float32's smallest normal"),
    # formats.dequantize_nvfp4
    Case("dequantize_nvfp4", "none", lambda: formats.dequantize_nvfp4(None),
         r"^q: expected an NVFP4Tensor, got NoneType"),
    Case("dequantize_nvfp4", "scales-for-other-K",
         lambda: formats.dequantize_nvfp4(formats.NVFP4Tensor(_fp4(4, 8), _e4m3(4, 2), 1.0)),
         r"^q\.scales: expected shape \(4, 1\).*, got \(4, 2\)"),
    Case("dequantize_nvfp4", "scales-float32",
         lambda: formats.dequantize_nvfp4(formats.NVFP4Tensor(_fp4(4, 8), torch.ones(4, 1), 1.0)),
         r"^q\.scales: expected uint8 or float8_e4m3fn, got torch\.float32"),
    # formats.encode_e2m1 / encode_e4m3: Inf saturates by definition, NaN has no code
    Case("encode_e2m1", "list", lambda: formats.encode_e2m1([1.0]), r"^x: expected a torch\.Tensor, got list"),
    Case("encode_e2m1", "nan", lambda: formats.encode_e2m1(torch.tensor([1.0, math.nan])),
         r"^x: expected finite values to encode as E2M1, got NaN"),
    Case("encode_e2m1", "fp4-input", lambda: formats.encode_e2m1(_fp4(4)),
         r"^x: expected a real floating-point .*tensor, got torch\.float4_e2m1fn_x2"),
    Case("encode_e2m1", "complex", lambda: formats.encode_e2m1(torch.ones(4, dtype=torch.complex64)),
         r"^x: expected a real floating-point .*tensor, got torch\.complex64"),
    Case("encode_e4m3", "list", lambda: formats.encode_e4m3([1.0]), r"^x: expected a torch\.Tensor, got list"),
    Case("encode_e4m3", "nan", lambda: formats.encode_e4m3(torch.tensor([2.0, math.nan])),
         r"^x: expected .*, got NaN"),
    Case("encode_e4m3", "complex", lambda: formats.encode_e4m3(torch.ones(4, dtype=torch.complex64)),
         r"^x: expected a real floating-point .*tensor, got torch\.complex64"),
    # formats.decode_e2m1 / decode_e4m3
    Case("decode_e2m1", "list", lambda: formats.decode_e2m1([1]), r"^codes: expected a torch\.Tensor, got list"),
    Case("decode_e2m1", "float", lambda: formats.decode_e2m1(torch.ones(4)),
         r"^codes: expected uint8 E2M1 codes, got torch\.float32"),
    Case("decode_e2m1", "code-16", lambda: formats.decode_e2m1(CODES_16),
         r"^codes: expected E2M1 codes 0\.\.15, got .*16"),
    Case("decode_e4m3", "list", lambda: formats.decode_e4m3([1]), r"^t: expected a torch\.Tensor, got list"),
    Case("decode_e4m3", "float32", lambda: formats.decode_e4m3(torch.ones(4)),
         r"^t: expected uint8 or float8_e4m3fn, got torch\.float32"),
    # formats.pack_fp4 / unpack_fp4
    Case("pack_fp4", "list", lambda: formats.pack_fp4([1, 2]), r"^codes: expected a torch\.Tensor, got list"),
    Case("pack_fp4", "float", lambda: formats.pack_fp4(torch.ones(4)),
         r"^codes: expected uint8 E2M1 codes, got torch\.float32"),
    Case("pack_fp4", "odd-K", lambda: formats.pack_fp4(torch.zeros(2, 5, dtype=torch.uint8)),
         r"^codes: expected an even last dimension, got shape \(2, 5\)"),
    Case("pack_fp4", "0-d", lambda: formats.pack_fp4(torch.tensor(3, dtype=torch.uint8)),
         r"^codes: expected .*, got shape \(\)"),
    Case("pack_fp4", "code-16", lambda: formats.pack_fp4(CODES_16),
         r"^codes: expected E2M1 codes 0\.\.15, got .*16"),
    Case("unpack_fp4", "list", lambda: formats.unpack_fp4([1]), r"^packed: expected a torch\.Tensor, got list"),
    Case("unpack_fp4", "float32", lambda: formats.unpack_fp4(torch.ones(4)),
         r"^packed: expected uint8 or float4_e2m1fn_x2, got torch\.float32"),
    Case("unpack_fp4", "0-d", lambda: formats.unpack_fp4(torch.tensor(3, dtype=torch.uint8)),
         r"^packed: expected .*, got shape \(\)"),
    # layouts
    Case("to_permuted", "list", lambda: layouts.to_permuted([[1]]), r"^sf: expected a torch\.Tensor, got list"),
    Case("to_permuted", "float32", lambda: layouts.to_permuted(BASE.sfa.float()),
         r"^sf: expected uint8 or float8_e4m3fn, got torch\.float32"),
    Case("to_permuted", "rank4", lambda: layouts.to_permuted(BASE.sfa.unsqueeze(0)),
         r"^sf: expected \[MN, K/16, L\] or \[MN, K/16\], got shape \(1, 256, 8, 2\)"),
    Case("to_permuted", "rank1", lambda: layouts.to_permuted(BASE.sfa[:, 0, 0]),
         r"^sf: expected \[MN, K/16, L\] or \[MN, K/16\], got shape \(256,\)"),
    Case("from_permuted", "list", lambda: layouts.from_permuted([1], M, K // 16),
         r"^sfp: expected a torch\.Tensor, got list"),
    Case("from_permuted", "float32", lambda: layouts.from_permuted(PERMUTED.float(), M, K // 16),
         r"^sfp: expected uint8 or float8_e4m3fn, got torch\.float32"),
    Case("from_permuted", "rank5", lambda: layouts.from_permuted(PERMUTED[..., 0], M, K // 16),
         r"^sfp: expected shape \[32, 4, rest_mn, 4, rest_k, L\], got \(32, 4, 2, 4, 2\)"),
    Case("from_permuted", "other-M", lambda: layouts.from_permuted(PERMUTED, 512, K // 16),
         r"^sfp: expected rest_mn, rest_k = \(4, 2\) for mn=512, k_blocks=8, got shape \(32, 4, 2, 4, 2, 2\)"),
    Case("to_blocked", "float32", lambda: layouts.to_blocked(BASE.sfa[:, :, 0].float()),
         r"^sf2d: expected uint8 or float8_e4m3fn, got torch\.float32"),
    Case("to_blocked", "rank3", lambda: layouts.to_blocked(BASE.sfa),
         r"^sf2d: expected \[MN, K/16\], got shape \(256, 8, 2\)"),
    Case("from_blocked", "float32", lambda: layouts.from_blocked(BLOCKED.float(), M, K // 16),
         r"^flat: expected uint8 or float8_e4m3fn, got torch\.float32"),
    Case("from_blocked", "other-M", lambda: layouts.from_blocked(BLOCKED, 512, K // 16),
         r"^flat: expected 1-D with 4096 elements for mn=512, k_blocks=8, got shape \(2048,\)"),
    Case("from_blocked", "rank2", lambda: layouts.from_blocked(BLOCKED.view(4, 512), M, K // 16),
         r"^flat: expected 1-D with 2048 elements .*, got shape \(4, 512\)"),
    Case("permuted_as_blocked", "float32", lambda: layouts.permuted_as_blocked(PERMUTED.float(), 0),
         r"^sfp: expected uint8 or float8_e4m3fn, got torch\.float32"),
    Case("permuted_as_blocked", "contiguous", lambda: layouts.permuted_as_blocked(PERMUTED.contiguous(), 0),
         r"^sfp: expected strides \(16, 4, 1024, 1, 512, 2048\) .*got \(128, 32, 16, 4, 2, 1\)"),
    Case("permuted_as_blocked", "batch-out-of-range", lambda: layouts.permuted_as_blocked(PERMUTED, 2),
         r"^l: expected 0 <= l < 2, got 2"),
    Case("permuted_as_blocked", "rank5", lambda: layouts.permuted_as_blocked(PERMUTED[..., 0], 0),
         r"^sfp: expected shape \[32, 4, rest_mn, 4, rest_k, L\], got \(32, 4, 2, 4, 2\)"),
    Case("permuted_as_blocked_batches", "float32", lambda: layouts.permuted_as_blocked_batches(PERMUTED.float()),
         r"^sfp: expected uint8 or float8_e4m3fn, got torch\.float32"),
    Case("permuted_as_blocked_batches", "contiguous",
         lambda: layouts.permuted_as_blocked_batches(PERMUTED.contiguous()),
         r"^sfp: expected strides \(16, 4, 1024, 1, 512, 2048\) .*got \(128, 32, 16, 4, 2, 1\)"),
    # problem.generate_input
    Case("generate_input", "m-0", lambda: problem.generate_input(0, K, L),
         r"^\(m, k, l\): expected m, l >= 1 and k a positive multiple of 16, got \(0, 128, 2\)"),
    Case("generate_input", "k-40", lambda: problem.generate_input(M, 40, L),
         r"^\(m, k, l\): expected .*k a positive multiple of 16, got \(256, 40, 2\)"),
    Case("generate_input", "l-0", lambda: problem.generate_input(M, K, 0),
         r"^\(m, k, l\): expected m, l >= 1 .*, got \(256, 128, 0\)"),
    Case("generate_input", "m-float", lambda: problem.generate_input(128.5, K, L),
         r"^\(m, k, l\): expected int.*, got \(128\.5, 128, 2\)"),
    Case("generate_input", "m-str", lambda: problem.generate_input("128", K, L),
         r"^\(m, k, l\): expected int.*, got \('128', 128, 2\)"),
    Case("generate_input", "mode", lambda: problem.generate_input(M, K, L, mode="random"),
         r"^mode: expected one of \('full', 'leaderboard'\), got 'random'"),
    # the extra arguments of the kernel paths
    Case("gemv_scaled_mm_transposed", "streams-negative",
         lambda: scaled_mm.gemv_scaled_mm_transposed(BASE, streams=-1),
         r"^streams: expected an int >= 0 .*, got -1"),
    Case("gemv_scaled_mm_transposed", "streams-bool",
         lambda: scaled_mm.gemv_scaled_mm_transposed(BASE, streams=True),
         r"^streams: expected an int >= 0 .*, got True"),
    Case("reference.check", "output-none", lambda: reference.check(None, BASE),
         r"^output: expected a torch\.Tensor, got NoneType"),
    Case("CuteGemv", "unknown-variant", lambda: cute_gemv.CuteGemv("fastest"),
         r"^variant: expected 'fast' or 'naive', got 'fastest'", ValueError),
    Case("gemv_cute", "unknown-variant", lambda: cute_gemv.gemv_cute(BASE, "fastest"),
         r"(?:^|: )(variant: expected 'fast' or 'naive', got 'fastest'|data: expected tensors on cuda, got cpu)",
         ValueError),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.entry}-{c.id}" for c in CASES])
def test_bad_argument_is_refused(case):
    with pytest.raises(case.error, match=case.match):
        case.call()


def test_input_errors_are_value_errors():
    """Callers that catch ValueError (the usual contract for bad arguments) catch these too."""
    assert issubclass(NVFP4InputError, ValueError)


def test_inf_saturates_rather_than_fails():
    """E2M1 and E4M3 (fn) have no infinity: encoding saturates, as the format definitions say."""
    codes = formats.encode_e2m1(torch.tensor([math.inf, -math.inf]))
    assert codes.tolist() == [7, 15]
    scales = formats.encode_e4m3(torch.tensor([math.inf, 1e6]))
    assert formats.decode_e4m3(scales).tolist() == [448.0, 448.0]


def test_base_case_arrays_are_what_the_table_assumes():
    """Guards the hard-coded numbers in the patterns above."""
    a, b, sfa, sfb, sfap, sfbp, c = BASE
    assert a.shape == (256, 64, 2) and a.stride() == (64, 1, 16384)
    assert sfa.shape == (256, 8, 2) and sfbp.shape == (32, 4, 1, 4, 2, 2)
    assert np.prod(BLOCKED.shape) == 2048 and PERMUTED.shape == (32, 4, 2, 4, 2, 2)
