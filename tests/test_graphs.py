"""CUDA graph replay of a GEMV: a transparent pass-through on the CPU, bit-identical replays on a
GPU, a new capture whenever the tensors (pointers, shapes, strides) change."""
import pytest
import torch

from nvfp4lib import scaled_mm
from nvfp4lib.device import capabilities
from nvfp4lib.graphs import CPU_NOTE, GraphedGemv, graph_key
from nvfp4lib.problem import Shape, generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.streams import StreamPool, run_batches

_seeds = iter(range(2000, 10**6))


def _fresh(shape: Shape, device: str = "cpu"):
    data = generate_input(*shape, seed=next(_seeds), mode="full", device=device)
    poison_(data[6])
    return data


def test_cpu_inputs_pass_straight_through():
    calls = []

    def fn(data):
        calls.append(data)
        return scaled_mm.gemv_scaled_mm_permuted(data)

    g = GraphedGemv(fn)
    data = _fresh(Shape(256, 512, 2))
    out = g(data)
    assert out is data[6] and calls == [data]
    result = check(out, data)
    assert result.ok, result.message
    g(data)
    assert len(calls) == 2 and len(g) == 0 and g.captures == 0
    if not torch.cuda.is_available():
        assert g.note == CPU_NOTE


def test_key_changes_with_pointer_shape_and_stride():
    data = _fresh(Shape(128, 64, 2))
    key = graph_key(data)
    assert graph_key(tuple(list(data))) == key
    assert graph_key(_fresh(Shape(128, 64, 2))) != key  # new tensors, new pointers
    shifted = (data[0][:, :, 1:],) + data[1:]
    assert graph_key(shifted) != key
    restrided = (data[0].contiguous(),) + data[1:]
    assert graph_key(restrided) != key


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
    fns = {"scaled_mm": scaled_mm.gemv_scaled_mm_permuted}
    if capabilities().cute_dsl:
        from nvfp4lib.cute_gemv import CuteGemv
        from nvfp4lib.streams import CutePerBatch

        fns["cute"] = CuteGemv()
        per_batch, pool = CutePerBatch(), StreamPool(3)
        fns["cute_pool"] = lambda d: run_batches(per_batch, d, pool)
    return fns


GEMV_NAMES = ["scaled_mm", "cute", "cute_pool"]


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
        poison_(data[6])
        out = g(data)
        assert out is data[6]
        assert torch.equal(out, expected)
    assert g.captures == 1 and g.replays == 3


@pytest.mark.gpu
@pytest.mark.parametrize("name", GEMV_NAMES)
def test_new_tensors_capture_again_and_in_place_changes_are_seen(name):
    fn = _gemv(name)
    g = GraphedGemv(fn, max_graphs=2)
    first, second, third = (_fresh(Shape(256, 512, 2), "cuda") for _ in range(3))
    for data in (first, second, first, third):
        poison_(data[6])
        result = check(g(data), data)
        assert result.ok, result.message
    assert g.captures == 3 and len(g) == 2  # `first` was replayed once, `second` dropped for `third`
    # new values in the same memory: the graph reads them
    first[0].view(torch.uint8).copy_(second[0].view(torch.uint8))
    poison_(first[6])
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
        poison_(data[6])
        g(data)
        seen = data[6].clone()
    caller.synchronize()
    assert torch.equal(seen, expected)
