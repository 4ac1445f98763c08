"""The stream pool: per-batch views, results equal to one launch, ordering with the caller's stream.

On a CPU the pool runs the batches one after another through the same per-batch function, so the
splitting and the per-batch path are checked everywhere; on a GPU results must be bit-identical
to the single launch (every batch is computed the same way, only the stream differs).
"""
import pytest
import torch

from nvfp4lib import scaled_mm, streams
from nvfp4lib.contract import Shape, validate_gemv_input
from nvfp4lib.device import capabilities
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.streams import StreamPool, batch_views, run_batches, shared_pool

SHAPES = [Shape(128, 256, 1), Shape(256, 512, 3), Shape(128, 64, 8)]
POOL_SIZES = [1, 2, 3, 8]
_seeds = iter(range(1000, 10**6))


def _fresh(shape: Shape, device: str = "cpu"):
    """New full-range data for every test (a fresh seed each time), c poisoned with NaN."""
    data = generate_input(*shape, seed=next(_seeds), mode="full", device=device)
    poison_(data.c)
    return data


def _sequential(per_batch_fn, data):
    for l in range(data.a.shape[2]):
        per_batch_fn(tuple(t[..., l:l + 1] for t in data))
    return data.c


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batch_views_are_valid_inputs_sharing_storage(shape):
    data = _fresh(shape)
    views = batch_views(data)
    assert len(views) == shape.l
    for l, part in enumerate(views):
        assert validate_gemv_input(part) == Shape(shape.m, shape.k, 1)
        for whole, view in zip(data, part):
            assert view.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
            assert view.data_ptr() == whole.data_ptr() + l * whole.stride(-1) * whole.element_size()


@pytest.mark.parametrize("n", POOL_SIZES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cpu_pool_equals_sequential_and_reference(shape, n):
    data = _fresh(shape)
    expected = _sequential(scaled_mm.gemv_scaled_mm_permuted, data).clone()
    poison_(data.c)
    out = run_batches(scaled_mm.gemv_scaled_mm_permuted, data, StreamPool(n, "cpu"))
    assert out is data.c
    assert torch.equal(out, expected), "the pool must compute exactly what the sequential loop does"
    result = check(out, data)
    assert result.ok, result.message


def test_every_batch_is_handed_over_once_in_order():
    data = _fresh(Shape(128, 64, 5))
    seen = []
    run_batches(lambda part: seen.append(part[0].data_ptr()), data, StreamPool(2, "cpu"))
    a = data.a
    assert seen == [a.data_ptr() + l * a.stride(2) for l in range(5)]


def test_split_is_cached_per_set_of_tensors():
    pool = StreamPool(2, "cpu")
    data = _fresh(Shape(128, 64, 3))
    views = pool.split(data)
    assert pool.split(data) is views
    assert pool.split(list(data)) is views  # the same tensors in another container
    replaced = list(data._replace(c=data.c.clone()))  # another c: new views, of the new c
    assert pool.split(replaced) is not views
    *_, new_c = replaced
    assert [c.data_ptr() for *_, c in pool.split(replaced)] == [
        new_c.data_ptr() + l * new_c.stride(2) * new_c.element_size() for l in range(3)]


def test_pool_writes_the_c_now_in_a_reused_list():
    """A list refilled with new tensors between calls: the batches come from the new tensors."""
    pool = StreamPool(2, "cpu")
    data = list(_fresh(Shape(128, 256, 3)))
    run_batches(scaled_mm.gemv_scaled_mm_permuted, data, pool)
    old_c = data[-1].clone()
    data[:] = _fresh(Shape(128, 256, 3))
    out = run_batches(scaled_mm.gemv_scaled_mm_permuted, data, pool)
    assert out is data[-1], "the c the list holds now"
    result = check(out, data)
    assert result.ok, result.message
    assert not torch.equal(out, old_c)


def test_shared_pool_is_one_pool_per_device_and_size():
    """Streams and events are made once per (device, n) and shared by every caller of the process."""
    pool = shared_pool("cpu", 2)
    assert isinstance(pool, StreamPool)
    assert shared_pool(torch.device("cpu"), 2) is pool
    assert shared_pool("cpu", 3) is not pool
    data = _fresh(Shape(128, 256, 3))
    out = run_batches(scaled_mm.gemv_scaled_mm_permuted, data, pool)
    assert out is data.c
    result = check(out, data)
    assert result.ok, result.message


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_pool_size_is_checked(bad):
    with pytest.raises(ValueError, match="n: expected an int >= 1"):
        StreamPool(bad, "cpu")


# ----------------------------------------------------------------------------------- GPU


def _cute_per_batch():
    if not capabilities().cute_dsl:
        pytest.skip("needs the CuTe DSL")
    from nvfp4lib.cute.gemv import CuteGemv

    return CuteGemv(), CuteGemv(cache_entries=64)  # per batch: one cache entry per batch view


def _gpu_pair(kind: str):
    """(single launch over all batches, per-batch function) of one GEMV."""
    if kind == "cute_fast":
        return _cute_per_batch()
    return scaled_mm.gemv_scaled_mm_permuted, scaled_mm.gemv_scaled_mm_permuted


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cute_fast", "scaled_mm_permuted"])
@pytest.mark.parametrize("n", POOL_SIZES)
@pytest.mark.parametrize("shape", SHAPES + [Shape(1024, 2048, 8)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_pool_is_bit_identical_to_single_launch(kind, shape, n):
    single, per_batch = _gpu_pair(kind)
    data = _fresh(shape, "cuda")
    expected = single(data).clone()  # also the warm-up on the caller's stream
    assert check(expected, data).ok
    poison_(data.c)
    pool = StreamPool(n)
    for _ in range(3):  # the second and later calls reuse the cached views and runners
        poison_(data.c)
        out = run_batches(per_batch, data, pool)
        assert out is data.c
        assert torch.equal(out, expected), f"pool of {n} differs from the single launch"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cute_fast", "scaled_mm_permuted"])
def test_gpu_pool_orders_with_a_non_default_caller_stream(kind):
    """Work before the call (poisoning c behind a long sleep) must come first, and work after the
    call must see c written even when the pool's kernels are slow (each batch sleeps first)."""
    single, per_batch = _gpu_pair(kind)
    data = _fresh(Shape(512, 1024, 4), "cuda")
    expected = single(data).clone()
    pool = StreamPool(4)

    def slow(part):
        torch.cuda._sleep(2_000_000)  # on the pool stream, before the batch's kernel
        per_batch(part)

    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())  # the data and `expected` were made there
    with torch.cuda.stream(caller):
        torch.cuda._sleep(20_000_000)  # if the pool did not wait for this, its result would be poisoned
        poison_(data.c)
        run_batches(slow, data, pool)
        seen = data.c.clone()  # queued on the caller's stream right after the call
    caller.synchronize()
    assert torch.equal(seen, expected)
    assert torch.equal(data.c, expected)


@pytest.mark.gpu
def test_gpu_pool_refuses_inputs_on_another_device():
    data = _fresh(Shape(128, 64, 2), "cuda")
    with pytest.raises(ValueError, match="pool"):
        run_batches(scaled_mm.gemv_scaled_mm_permuted, data, StreamPool(2, "cpu"))


# ------------------------------------------- the CUDA protocol, recorded with stand-ins on any machine


class _FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.name))


class _FakeEvent:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def record(self, stream):
        self.log.append(("record", stream.name, self.name))


class _FakeTensor:
    """Enough of a CUDA tensor for run_batches: L, device, and slicing into named batch views."""
    is_cuda = True
    device = torch.device("cuda", 0)

    def __init__(self, l):
        self.shape = (1, 1, l)

    def __getitem__(self, index):
        return index[-1].start  # batch_views slices t[..., l:l+1]: the view is just l here


@pytest.fixture
def recorded_pool(monkeypatch):
    """A pool of two stand-in streams on 'cuda:0', and the log of everything done to them."""
    monkeypatch.setattr(streams, "validate_gemv_input", lambda data, **kwargs: None)  # the tensors are stand-ins
    log = []
    current = [_FakeStream("caller", log)]

    class _StreamContext:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            self.prev, current[0] = current[0], self.stream

        def __exit__(self, *exc):
            current[0] = self.prev

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "stream", _StreamContext)
    pool = StreamPool(2, "cpu")
    pool.device = torch.device("cuda", 0)
    pool.streams = [_FakeStream("s0", log), _FakeStream("s1", log)]
    pool._ready = _FakeEvent("ready", log)
    pool._done = [_FakeEvent("done0", log), _FakeEvent("done1", log)]
    return pool, log, current


def test_cuda_fork_and_join_protocol(recorded_pool):
    pool, log, current = recorded_pool
    data = tuple(_FakeTensor(3) for _ in range(7))
    run_batches(lambda part: log.append(("run", current[0].name, part[0])), data, pool)
    assert log == [
        ("record", "caller", "ready"),
        ("wait", "s0", "ready"), ("run", "s0", 0), ("run", "s0", 2),
        ("wait", "s1", "ready"), ("run", "s1", 1),
        ("record", "s0", "done0"), ("wait", "caller", "done0"),
        ("record", "s1", "done1"), ("wait", "caller", "done1"),
    ]
    assert current[0].name == "caller"


def test_cuda_protocol_joins_even_when_a_batch_fails(recorded_pool):
    pool, log, current = recorded_pool
    data = tuple(_FakeTensor(2) for _ in range(7))

    def fails_on_batch_1(part):
        if part[0] == 1:
            raise RuntimeError("boom")
        log.append(("run", current[0].name, part[0]))

    with pytest.raises(RuntimeError, match="boom"):
        run_batches(fails_on_batch_1, data, pool)
    assert log[-4:] == [("record", "s0", "done0"), ("wait", "caller", "done0"),
                        ("record", "s1", "done1"), ("wait", "caller", "done1")]
    assert current[0].name == "caller"


def test_cuda_protocol_uses_at_most_l_streams(recorded_pool):
    pool, log, current = recorded_pool
    run_batches(lambda part: None, tuple(_FakeTensor(1) for _ in range(7)), pool)
    assert [e for e in log if e[1] == "s1"] == []


def test_cuda_protocol_of_run_over_batch_indices(recorded_pool):
    """`StreamPool.run` takes any sliceable items, e.g. the batch indices of the transposed GEMV."""
    pool, log, current = recorded_pool
    pool.run(lambda l: log.append(("run", current[0].name, l)), range(5))
    assert log == [
        ("record", "caller", "ready"),
        ("wait", "s0", "ready"), ("run", "s0", 0), ("run", "s0", 2), ("run", "s0", 4),
        ("wait", "s1", "ready"), ("run", "s1", 1), ("run", "s1", 3),
        ("record", "s0", "done0"), ("wait", "caller", "done0"),
        ("record", "s1", "done1"), ("wait", "caller", "done1"),
    ]
    assert current[0].name == "caller"
