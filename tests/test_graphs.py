"""CUDA graph replay of a GEMV: a transparent pass-through on the CPU, bit-identical replays on a
GPU, a new capture whenever the tensors (pointers, shapes, strides) change."""
import contextlib

import pytest
import torch

from nvfp4lib import scaled_mm
from nvfp4lib.contract import Shape
from nvfp4lib.device import capabilities
from nvfp4lib.caches import memory_key, validated_once
from nvfp4lib.graphs import CPU_NOTE, GraphedGemv
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.streams import StreamPool, run_batches

_seeds = iter(range(2000, 10**6))


def _fresh(shape: Shape, device: str = "cpu"):
    data = generate_input(*shape, seed=next(_seeds), mode="full", device=device)
    poison_(data.c)
    return data


def test_cpu_inputs_pass_straight_through():
    calls = []

    def fn(data):
        calls.append(data)
        return scaled_mm.gemv_scaled_mm_permuted(data)

    g = GraphedGemv(fn)
    data = _fresh(Shape(256, 512, 2))
    out = g(data)
    assert out is data.c and calls == [data]
    result = check(out, data)
    assert result.ok, result.message
    g(data)
    assert len(calls) == 2 and len(g) == 0 and g.captures == 0
    if not torch.cuda.is_available():
        assert g.note == CPU_NOTE


def test_key_changes_with_pointer_shape_stride_and_dtype():
    data = _fresh(Shape(128, 64, 2))
    key = memory_key(data)
    assert memory_key(tuple(list(data))) == key
    assert memory_key(list(data)) == key  # the container does not matter, its contents do
    retyped = data._replace(a=data.a.view(torch.uint8))  # same address, shape and strides
    assert memory_key(retyped) != key
    assert memory_key(_fresh(Shape(128, 64, 2))) != key  # new tensors, new pointers
    shifted = data._replace(a=data.a[:, :, 1:])
    assert memory_key(shifted) != key
    restrided = data._replace(a=data.a.contiguous())
    assert memory_key(restrided) != key


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="warmup"):
        GraphedGemv(lambda d: None, warmup=0)
    with pytest.raises(ValueError, match="max_graphs"):
        GraphedGemv(lambda d: None, max_graphs=0)
    with pytest.raises(ValueError, match="CUDA"):
        GraphedGemv(lambda d: None).capture(_fresh(Shape(128, 64, 1)))


# ----------------------------------------------------------------------------------- GPU


def _gemvs():
    """name -> GEMV on the whole tuple, for every GEMV that runs on this GPU."""
    fns = {"scaled_mm_permuted": scaled_mm.gemv_scaled_mm_permuted}
    if capabilities().cute_dsl:
        from nvfp4lib.cute.gemv import CuteGemv

        fns["cute_fast"] = CuteGemv()
        per_batch, pool = CuteGemv(cache_entries=64), StreamPool(3)  # one cache entry per batch view
        fns["cute_fast_per_batch_streams"] = lambda d: run_batches(per_batch, d, pool)
    return fns


GEMV_NAMES = ["scaled_mm_permuted", "cute_fast", "cute_fast_per_batch_streams"]


def _gemv(name):
    fns = _gemvs()
    if name not in fns:
        pytest.skip(f"{name} needs the CuTe DSL")
    return fns[name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", GEMV_NAMES)
@pytest.mark.parametrize("shape", [Shape(128, 256, 1), Shape(512, 1536, 2), Shape(256, 64, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_replay_is_bit_identical_to_direct_call(name, shape):
    fn = _gemv(name)
    data = _fresh(shape, "cuda")
    expected = fn(data).clone()
    assert check(expected, data).ok
    g = GraphedGemv(fn)
    for _ in range(3):
        poison_(data.c)
        out = g(data)
        assert out is data.c
        assert torch.equal(out, expected)
    assert g.captures == 1 and g.replays == 3


@pytest.mark.gpu
@pytest.mark.parametrize("name", GEMV_NAMES)
def test_new_tensors_capture_again_and_in_place_changes_are_seen(name):
    fn = _gemv(name)
    g = GraphedGemv(fn, max_graphs=2)
    first, second, third = (_fresh(Shape(256, 512, 2), "cuda") for _ in range(3))
    for data in (first, second, first, third):
        poison_(data.c)
        result = check(g(data), data)
        assert result.ok, result.message
    assert g.captures == 3 and len(g) == 2  # `first` was replayed once, `second` dropped for `third`
    # new values in the same memory: the graph reads them
    first.a.view(torch.uint8).copy_(second.a.view(torch.uint8))
    poison_(first.c)
    result = check(g(first), first)
    assert result.ok, result.message


@pytest.mark.gpu
@pytest.mark.parametrize("name", GEMV_NAMES)
def test_replay_on_a_non_default_stream(name):
    fn = _gemv(name)
    data = _fresh(Shape(512, 1024, 4), "cuda")
    expected = fn(data).clone()
    g = GraphedGemv(fn)
    g(data)  # capture on the default stream
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())  # the data, `expected` and the graph were made there
    with torch.cuda.stream(caller):
        torch.cuda._sleep(20_000_000)  # the replay must wait for the poison behind this
        poison_(data.c)
        g(data)
        seen = data.c.clone()
    caller.synchronize()
    assert torch.equal(seen, expected)


# ------------------------------------------- the capture protocol, recorded with stand-ins on any machine


class _FakeTensor:
    """Enough of a CUDA tensor for GraphedGemv: device, and the fields of the graph key."""
    is_cuda = True
    device = torch.device("cuda", 0)
    shape, dtype = (1,), torch.float16

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return (1,)


@pytest.fixture
def recorded_cuda(monkeypatch):
    """Stand-ins for the torch.cuda calls GraphedGemv makes; returns (log, current stream)."""
    log, current = [], ["caller"]

    class _Stream:
        count = 0

        def __init__(self, device=None):
            _Stream.count += 1
            self.name = f"side{_Stream.count}"

        def wait_stream(self, other):
            log.append(("wait", self.name, other if isinstance(other, str) else other.name))

    class _Caller:
        name = "caller"

        def wait_stream(self, other):
            log.append(("wait", "caller", other.name))

    class _StreamContext:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            self.prev, current[0] = current[0], self.stream.name

        def __exit__(self, *exc):
            current[0] = self.prev

    class _Graph:
        count = 0

        def __init__(self):
            _Graph.count += 1
            self.name = f"graph{_Graph.count}"

        def replay(self):
            log.append(("replay", self.name, current[0]))

    class _Capture(_StreamContext):
        def __init__(self, graph, stream=None):
            super().__init__(stream)
            self.graph = graph

        def __enter__(self):
            log.append(("capture", self.graph.name, self.stream.name))
            super().__enter__()

    caller = _Caller()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: caller)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", _StreamContext)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _Capture)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append(("synchronize",)))
    return log, current


def test_capture_protocol(recorded_cuda):
    log, current = recorded_cuda
    out = object()

    def fn(data):
        log.append(("fn", current[0]))
        return out

    g = GraphedGemv(fn, warmup=2, max_graphs=1)
    first = tuple(_FakeTensor(100 + i) for i in range(7))
    assert g(first) is out and g(first) is out
    assert log == [
        ("wait", "side1", "caller"), ("fn", "side1"), ("fn", "side1"), ("wait", "caller", "side1"),
        ("capture", "graph1", "side1"), ("fn", "side1"),
        ("replay", "graph1", "caller"),
        ("replay", "graph1", "caller"),
    ]
    assert (g.captures, g.replays, len(g)) == (1, 2, 1)
    log.clear()
    second = tuple(_FakeTensor(200 + i) for i in range(7))
    g(second)  # a new key: warm up and capture again; the old graph is dropped after a synchronize
    assert log == [
        ("wait", "side1", "caller"), ("fn", "side1"), ("fn", "side1"), ("wait", "caller", "side1"),
        ("synchronize",), ("capture", "graph2", "side1"), ("fn", "side1"), ("replay", "graph2", "caller"),
    ]
    assert (g.captures, len(g)) == (2, 1)
    assert "2 captures" in g.note


def test_a_tuple_made_for_one_call_runs_directly(recorded_cuda):
    """Inside validated_once (the op's tuple, new every call) no graph is captured: it would never be replayed."""
    log, current = recorded_cuda
    out = object()

    def fn(data):
        log.append(("fn", current[0]))
        return out

    g = GraphedGemv(fn)
    with validated_once():
        assert g(tuple(_FakeTensor(300 + i) for i in range(7))) is out
    assert log == [("fn", "caller")] and (g.captures, g.replays, len(g)) == (0, 0, 0)
