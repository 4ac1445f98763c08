"""The GEMV as a PyTorch op (nvfp4lib.ops, torch.ops.nvfp4lib.gemv): the exact reference's result, the same
bits as custom_kernel on the same 7-tuple, a new output with the documented strides, the same answer under
torch.compile(fullgraph=True) and (on a GPU) replayed from a CUDA graph, torch.library.opcheck, and bad
inputs refused naming the argument."""

import gc
import os
import re
import subprocess
import sys
import weakref

import pytest
import torch

import nvfp4lib
from nvfp4lib import dispatch, ops, scaled_mm
from nvfp4lib.caches import TupleCache
from nvfp4lib.contract import NVFP4InputError, Shape, plain_strides
from nvfp4lib.device import capabilities
from nvfp4lib.paths import PATHS
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check, poison_

SHAPES = [Shape(128, 256, 1), Shape(256, 1024, 2), Shape(128, 512, 3)]
_seeds = iter(range(71000, 10**6))

pytestmark = pytest.mark.usefixtures("clean_dispatch")  # no table, no forcing, no NVFP4_PATH


def _fresh(shape: Shape, device: str = "cpu"):
    """Full-range data (every E2M1 code in both nibbles, E4M3 scales from zeros and subnormals up to
    448), a new seed per call. cuBLAS's FP4 GEMM reads the scales as unsigned UE4M3, so where it may run
    (Blackwell) the scales keep their sign bit clear."""
    negative_scales = not (device == "cuda" and capabilities().fp4_gemm)
    data = generate_input(*shape, seed=next(_seeds), mode="full", device=device, negative_scales=negative_scales)
    poison_(data.c)
    return data


def _op_args(data) -> tuple:
    return data.a, data.b, data.sfa_permuted, data.sfb_permuted


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _assert_new_output(out: torch.Tensor, data) -> None:
    """A fresh [M, 1, L] float16 tensor on the inputs' device, a view of a contiguous (L, M, 1) buffer,
    sharing no memory with any input (nor with data's own c)."""
    m, half_k, l = data.a.shape
    assert out.shape == (m, 1, l) and out.dtype == torch.float16 and out.device == data.a.device
    assert out.stride() == plain_strides(m, 1, l) == (1, 1, m)
    assert out.permute(2, 0, 1).is_contiguous()
    first, end = _storage_span(out)
    for name, t in zip(data._fields, data):
        t_first, t_end = _storage_span(t)
        assert end <= t_first or t_end <= first, f"the output shares memory with {name}"


def _exact_and_as_custom_kernel(out: torch.Tensor, data) -> None:
    """out matches the exact reference (leaderboard tolerance, element by element) and has the bits
    custom_kernel writes for the same 7-tuple."""
    result = check(out, data)
    assert result.ok, result.message
    poison_(data.c)
    expected = dispatch.custom_kernel(data)
    assert torch.equal(_bits(out), _bits(expected)), "the op and custom_kernel differ"


class NVFP4Weights(torch.nn.Module):
    """What a model holds: a's codes and the permuted scales as buffers; the vector comes per call."""

    def __init__(self, a: torch.Tensor, sfa_permuted: torch.Tensor):
        super().__init__()
        self.register_buffer("a", a)
        self.register_buffer("sfa_permuted", sfa_permuted)

    def forward(self, b: torch.Tensor, sfb_permuted: torch.Tensor) -> torch.Tensor:
        return torch.ops.nvfp4lib.gemv(self.a, b, self.sfa_permuted, sfb_permuted)


# ------------------------------------------------------------------------------ CPU


def test_the_op_is_registered_and_nvfp4lib_gemv_is_it():
    assert nvfp4lib.gemv is ops.gemv
    assert torch.ops.nvfp4lib.gemv.default.name() == ops.OP_NAME == "nvfp4lib::gemv"
    schema = torch.ops.nvfp4lib.gemv.default._schema
    assert [arg.name for arg in schema.arguments] == ["a", "b", "sfa_permuted", "sfb_permuted"]
    assert not any(arg.is_write for arg in schema.arguments)  # mutates_args=()


def test_importing_the_package_registers_the_op_without_the_gpu_or_the_cute_dsl():
    """`import nvfp4lib` alone, in a fresh interpreter, as a user of a torch extension package writes it:
    the op is there (also for torch.compile), and nothing of the CuTe DSL, the GPU or a wing was loaded."""
    code = ("import sys, torch, nvfp4lib; "
            "print(torch.ops.nvfp4lib.gemv.default.name(), nvfp4lib.gemv.__module__, torch.cuda.is_initialized()); "
            "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'tvm_ffi', 'triton') "
            "or m.startswith(('nvfp4lib.cute', 'nvfp4lib.bench', 'nvfp4lib.leaderboard', 'nvfp4lib.study'))))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                         env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr
    registered, loaded = out.stdout.split("\n")[:2]
    assert registered == "nvfp4lib::gemv nvfp4lib.ops False"
    assert loaded == "", f"importing nvfp4lib loaded {loaded}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_op_is_exact_and_has_custom_kernels_bits(shape):
    data = _fresh(shape)
    inputs_before = [t.view(torch.uint8).clone() for t in _op_args(data)]
    for call in (nvfp4lib.gemv, torch.ops.nvfp4lib.gemv):
        out = call(*_op_args(data))
        _assert_new_output(out, data)
        _exact_and_as_custom_kernel(out, data)
    for name, t, before in zip(("a", "b", "sfa_permuted", "sfb_permuted"), _op_args(data), inputs_before):
        assert torch.equal(t.view(torch.uint8), before), f"the op changed {name}"


def test_each_call_returns_a_new_tensor():
    data = _fresh(SHAPES[1])
    first = nvfp4lib.gemv(*_op_args(data))
    kept = first.clone()
    second = nvfp4lib.gemv(*_op_args(data))
    assert second.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
    assert torch.equal(_bits(first), _bits(kept)) and torch.equal(_bits(second), _bits(kept))


CPU_PATHS = [name for name, path in PATHS.items()
             if path.kind != "peer" and path.unavailable(capabilities(), False) is None]


@pytest.mark.parametrize("name", CPU_PATHS)
def test_the_op_takes_the_dispatchers_path_with_the_same_bits(name):
    """Paths that read the plain scales (reference, scaled_mm_reference, ...) get them derived from the
    permuted ones, those that read only the permuted ones (scaled_mm_permuted) get them as given: both
    give custom_kernel's bits on the full tuple."""
    data = _fresh(Shape(256, 512, 2))
    assert dispatch.explain(data).path == "scaled_mm_permuted"  # the CPU's choice, for custom_kernel and the op
    with dispatch.force(name):
        out = nvfp4lib.gemv(*_op_args(data))
        assert dispatch.decisions()[(data.a.shape, False)].path == name
        _exact_and_as_custom_kernel(out, data)


@pytest.mark.parametrize("name", CPU_PATHS)
def test_no_cache_keeps_the_ops_tuple(name):
    """The op's 7-tuple is new on every call (plain scales derived, a new c): a cache entry for it would
    never be hit again and would keep its tensors alive, the output among them."""
    data = _fresh(Shape(256, 512, 2))
    with dispatch.force(name):
        for _ in range(3):
            out = nvfp4lib.gemv(*_op_args(data))
            _exact_and_as_custom_kernel(out, data)
            assert not [cache for cache in gc.get_objects() if type(cache) is TupleCache
                        and any(t is out for kept, _ in cache._entries.values() for t in kept)]
            freed = weakref.ref(out)
            del out
            gc.collect()
            assert freed() is None, "something keeps the op's output alive"


def test_the_op_validates_once_per_call(monkeypatch):
    """Its four tensors, once; neither the path (scaled_mm_permuted, the CPU's) nor its per-batch emulation again."""
    data = _fresh(Shape(256, 512, 3))
    nvfp4lib.gemv(*_op_args(data))  # plans the shape (its self-check validates its own inputs)
    calls = []

    def counted(real, what):
        return lambda *args, **kwargs: calls.append(what) or real(*args, **kwargs)

    monkeypatch.setattr(ops, "validate_op_input", counted(ops.validate_op_input, "op"))
    monkeypatch.setattr(scaled_mm, "validate_gemv_input", counted(scaled_mm.validate_gemv_input, "path"))
    monkeypatch.setattr(scaled_mm, "_check_scaled_mm_args", counted(scaled_mm._check_scaled_mm_args, "batch"))
    for _ in range(2):
        result = check(nvfp4lib.gemv(*_op_args(data)), data)
        assert result.ok, result.message
    assert calls == ["op", "op"]


def test_the_op_compiles_in_a_module_holding_nvfp4_weights():
    torch._dynamo.reset()
    data = _fresh(Shape(256, 512, 2))
    model = NVFP4Weights(data.a, data.sfa_permuted)
    assert dict(model.named_buffers()).keys() == {"a", "sfa_permuted"}
    compiled = torch.compile(model, fullgraph=True)
    eager = model(data.b, data.sfb_permuted)
    for _ in range(2):
        out = compiled(data.b, data.sfb_permuted)
        _assert_new_output(out, data)
        _exact_and_as_custom_kernel(out, data)
        assert torch.equal(_bits(out), _bits(eager))
    # new vector values in the same tensors: the compiled module reads them
    other = _fresh(Shape(256, 512, 2))
    data.b.view(torch.uint8).copy_(other.b.view(torch.uint8))
    data.sfb_permuted.view(torch.uint8).copy_(other.sfb_permuted.view(torch.uint8))
    data.sfb.view(torch.uint8).copy_(other.sfb.view(torch.uint8))  # custom_kernel may read the plain ones
    renewed = compiled(data.b, data.sfb_permuted)
    # custom_kernel's bits on the new values (the exactness of this path is checked above and in its own
    # tests: an fp32 sum of full-range data can miss the exact answer by more than the tolerance)
    assert not torch.equal(_bits(renewed), _bits(eager)), "the compiled module did not read the new values"
    poison_(data.c)
    assert torch.equal(_bits(renewed), _bits(dispatch.custom_kernel(data)))


def test_opcheck():
    """torch.library.opcheck: the fake implementation against the real one (shape, dtype, device and
    strides: `test_faketensor`), and the op through AOTAutograd with static and dynamic shapes.

    Not run: `test_schema`, because its mutation check compares every input before and after with
    torch.allclose, which PyTorch does not implement for float4_e2m1fn_x2 ("copy_" not implemented);
    the same property (no input changed, no output aliasing an input) is checked on byte views in
    test_the_op_is_exact_and_has_custom_kernels_bits. And `test_autograd_registration`, which checks
    only when an input requires grad: no input can here (FP4 codes and E4M3 scales), the op is
    forward only.
    """
    data = _fresh(Shape(128, 256, 2))
    for test_util in ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"):
        result = torch.library.opcheck(torch.ops.nvfp4lib.gemv.default, _op_args(data), test_utils=test_util)
        assert result == {test_util: "SUCCESS"}, result


def test_the_fake_gives_the_outputs_metadata_without_running():
    data = _fresh(Shape(256, 512, 3))
    meta = [t.to("meta") for t in _op_args(data)]
    out = torch.ops.nvfp4lib.gemv(*meta)
    assert out.device.type == "meta" and out.shape == (256, 1, 3) and out.dtype == torch.float16
    assert out.stride() == plain_strides(256, 1, 3)


def _replace(data, name: str, value) -> tuple:
    return tuple(value if field == name else getattr(data, field)
                 for field in ("a", "b", "sfa_permuted", "sfb_permuted"))


BAD_INPUTS = [
    ("a", lambda d, o: "codes", r"^a: expected a torch\.Tensor, got str"),
    ("sfb_permuted", lambda d, o: None, r"^sfb_permuted: expected a torch\.Tensor, got NoneType"),
    ("a", lambda d, o: d.a.view(torch.uint8), r"^a: expected dtype torch\.float4_e2m1fn_x2, got torch\.uint8"),
    ("b", lambda d, o: d.b.view(torch.uint8), r"^b: expected dtype torch\.float4_e2m1fn_x2, got torch\.uint8"),
    ("sfa_permuted", lambda d, o: d.sfa_permuted.view(torch.uint8), r"^sfa_permuted: expected dtype torch\.float8"),
    ("a", lambda d, o: d.a[:, :, 0], r"^a: expected rank 3, got shape \(256, 256\)"),
    ("sfb_permuted", lambda d, o: d.sfb_permuted[..., 0], r"^sfb_permuted: expected rank 6"),
    ("sfa_permuted", lambda d, o: o.sfa_permuted, r"^sfa_permuted: expected shape \(32, 4, 2, 4, 8, 2\), got "
                                                  r"\(32, 4, 1, 4, 8, 2\)"),
    ("sfb_permuted", lambda d, o: generate_input(128, 1024, 2).sfb_permuted,
     r"^sfb_permuted: expected shape \(32, 4, 1, 4, 8, 2\), got \(32, 4, 1, 4, 16, 2\)"),
    ("b", lambda d, o: generate_input(128, 1024, 2).b, r"^b: expected K/2 = 256 \(from a\)"),
    ("b", lambda d, o: generate_input(128, 512, 1).b, r"^b: expected L = 2 \(from a\)"),
    ("sfa_permuted", lambda d, o: d.sfa_permuted.contiguous(), r"^sfa_permuted: expected strides"),
    ("a", lambda d, o: d.a.contiguous(), r"^a: expected strides"),
    ("sfb_permuted", lambda d, o: d.sfb_permuted.to("meta"), r"^a, b, sfa_permuted, sfb_permuted: expected all "
                                                             r"tensors on one device"),
]


@pytest.mark.parametrize("name, make, match", BAD_INPUTS,
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(BAD_INPUTS)])
def test_bad_inputs_are_refused_naming_the_argument(name, make, match):
    data, other = _fresh(Shape(256, 512, 2)), generate_input(128, 512, 2)
    args = _replace(data, name, make(data, other))
    with pytest.raises(NVFP4InputError, match=match):
        nvfp4lib.gemv(*args)
    if all(isinstance(x, torch.Tensor) for x in args):  # PyTorch's own parser refuses non-tensors first
        with pytest.raises(NVFP4InputError, match=match):
            torch.ops.nvfp4lib.gemv(*args)


@pytest.mark.parametrize("shape, match", [((200, 512, 1), r"^a: expected M a multiple of 128, got M = 200"),
                                          ((128, 96, 1), r"^a: expected K a multiple of 64, got K = 96")])
def test_shapes_outside_the_kernels_are_refused(shape, match):
    with pytest.raises(NVFP4InputError, match=match):
        nvfp4lib.gemv(*_op_args(generate_input(*shape)))


def test_a_bad_input_under_torch_compile_is_refused_when_traced_naming_the_argument():
    torch._dynamo.reset()
    data, other = _fresh(Shape(256, 512, 2)), generate_input(128, 512, 2)
    compiled = torch.compile(NVFP4Weights(data.a, other.sfa_permuted), fullgraph=True)
    # Dynamo wraps what the fake implementation raises in its own error, which quotes it
    with pytest.raises(Exception, match=r"NVFP4InputError\('sfa_permuted: expected shape \(32, 4, 2, 4, 8, 2\)"):
        compiled(data.b, data.sfb_permuted)


@pytest.mark.parametrize("m, expected", [
    (200, "a: expected M a multiple of 128, got M = 200"),
    (384, "sfa_permuted: expected shape (32, 4, 3, 4, 8, 1), got (32, 4, 2, 4, 8, 1)")])
def test_a_bad_size_traced_as_a_symbol_is_refused_with_its_value(m, expected):
    """torch.compile(dynamic=True) traces the sizes as symbols (s0, s33, ...): the error names the numbers
    they have in the call, as in eager mode."""
    torch._dynamo.reset()
    data = _fresh(Shape(256, 512, 1))
    a = data.a[:m] if m < data.a.shape[0] else generate_input(m, 512, 1).a
    with pytest.raises(NVFP4InputError, match=re.escape(expected)):
        nvfp4lib.gemv(a, data.b, data.sfa_permuted, data.sfb_permuted)  # eager: the message to expect
    compiled = torch.compile(nvfp4lib.gemv, fullgraph=True, dynamic=True)
    with pytest.raises(Exception) as refused:  # Dynamo's own error, quoting the fake implementation's
        compiled(a, data.b, data.sfa_permuted, data.sfb_permuted)
    assert f"NVFP4InputError('{expected}')" in str(refused.value), str(refused.value)


# ------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [Shape(512, 4096, 2)], ids=lambda s: "x".join(map(str, s)))
def test_the_op_on_gpu_is_exact_and_has_custom_kernels_bits(shape):
    data = _fresh(shape, "cuda")
    for _ in range(2):
        out = nvfp4lib.gemv(*_op_args(data))
        torch.cuda.synchronize()
        _assert_new_output(out, data)
        _exact_and_as_custom_kernel(out, data)


@pytest.mark.gpu
def test_the_op_compiles_on_gpu_in_a_module_holding_nvfp4_weights():
    torch._dynamo.reset()
    data = _fresh(Shape(512, 1024, 2), "cuda")
    model = NVFP4Weights(data.a, data.sfa_permuted)
    compiled = torch.compile(model, fullgraph=True)
    eager = model(data.b, data.sfb_permuted)
    for _ in range(2):
        out = compiled(data.b, data.sfb_permuted)
        torch.cuda.synchronize()
        _assert_new_output(out, data)
        _exact_and_as_custom_kernel(out, data)
        assert torch.equal(_bits(out), _bits(eager))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [Shape(256, 1024, 2), Shape(512, 7168, 1)], ids=lambda s: "x".join(map(str, s)))
def test_the_op_replays_from_a_cuda_graph_on_fresh_data(shape):
    static = _fresh(shape, "cuda")
    args = _op_args(static)
    # Warm up on a side stream (PyTorch's capture rules): the first call of a shape chooses and builds
    # the path, compiling the CuTe kernel, which must not happen inside the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            nvfp4lib.gemv(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = nvfp4lib.gemv(*args)
    for _ in range(3):
        fresh = _fresh(shape, "cuda")
        for dst, src in zip(args, _op_args(fresh)):  # byte views: PyTorch has no copy_ for float4_e2m1fn_x2
            dst.view(torch.uint8).copy_(src.view(torch.uint8))
        poison_(out)  # every element the replay leaves unwritten stays NaN, and fails the check
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), "the replay left elements of the output unwritten"
        result = check(out, fresh)  # the exact reference of the fresh data
        assert result.ok, result.message
        direct = nvfp4lib.gemv(*_op_args(fresh))
        assert torch.equal(_bits(out), _bits(direct)), "the replay and a direct call differ"
