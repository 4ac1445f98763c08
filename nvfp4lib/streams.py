"""Spread the L batches of one GEMV call over a few CUDA streams, joined back before return.

A per-batch kernel that cannot fill the GPU on its own (one batch of a small shape, a cuBLAS GEMM with few
tiles) may overlap with the next batch's when the two run on different streams. The price is host time: every
stream used costs an event wait, a stream switch and an event record per call, and the leaderboard times each
call on its own, so that cost is part of the score.

Ordering with the caller. Work queued before the call on the caller's current stream
(say, the inputs being written) must finish before any pool stream reads the inputs, and work queued after the
call on the caller's stream must see c written. So `StreamPool.run` (behind `run_batches` and the transposed
`_scaled_mm` GEMV) records one event on the caller's stream that every pool stream waits on before its
batches, records one event on each pool stream after its batches, and makes the caller's stream wait on all of
them before it returns. Nothing waits on the host (no synchronize): the call returns as soon as the work is
queued, and the result is safe to use on the caller's stream, exactly like a single kernel. This fork/join
pattern is also legal inside CUDA graph capture, so a graph can record it.

Memory (PyTorch's caching allocator). A block is handed out again as soon as its tensor is freed on the
host, to later work on the stream that allocated it; that is only safe for work ordered after every use:
* the inputs and c belong to the caller, as do buffers it made for the call before the fork (the
  transposed GEMV's converted scales); the per-batch views made here allocate nothing, and the join
  orders every later use or free on the caller's stream after the pool's work;
* temporaries that a per-batch function allocates on a pool stream (cuBLAS outputs, say) are used and
  freed on that stream only, so the allocator's reuse is in stream order;
* the per-batch function writes its result into the c of the tuple it is given (every GEMV here does)
  and its return value is dropped, so no tensor made on a pool stream reaches the caller and none needs
  ``record_stream``.
State that a per-batch function creates lazily and keeps (a lookup table made on first use, say), made
inside a pool stream on the first call, could be read by other pool streams before it is written: call
the function once on the caller's stream first (a warm-up).

Without CUDA (or for inputs on the CPU) the batches run one after another through the same per-batch function,
so the splitting logic is exercised everywhere."""

from __future__ import annotations

from typing import Callable

import torch

from nvfp4lib.caches import TupleCache
from nvfp4lib.contract import validate_gemv_input

_SPLIT_CACHE_ENTRIES = 4


def batch_views(data) -> tuple[tuple, ...]:
    """The 7-tuple of batch l for every l: views ``t[..., l:l+1]`` of each tensor, no copies. Slicing L (the
    last dimension of all seven) keeps the documented strides (a size-1 dimension's stride never matters),
    so each view is itself a valid GEMV input with L = 1 whose data pointers are offset to batch l."""
    n_batches = data[0].shape[-1]
    return tuple(tuple(t[..., l:l + 1] for t in data) for l in range(n_batches))


def _checked_batch_views(data) -> tuple[tuple, ...]:
    """`batch_views` of a tuple checked whole first, so a bad input is named as given, not as a batch."""
    validate_gemv_input(data, need_m_multiple=None, check_storage=False)
    return batch_views(data)


def _resolved_device(device) -> torch.device:
    """`device` with its index filled in ("cuda" is the current CUDA device; None the GPU if any)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class StreamPool:
    """``n`` CUDA streams and the events that join them to a caller, created once and reused. One pool serves one
    host thread at a time (its events are reused by every call). PyTorch hands out ``torch.cuda.Stream()``
    round-robin from a fixed set per device (32 per priority), so the n <= 32 streams of one pool are distinct,
    though pools may share streams with each other (harmless: the events order the work either way). Without CUDA, or
    with ``device="cpu"``, it holds no streams (`run_batches` is sequential)."""

    def __init__(self, n: int, device=None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n: expected an int >= 1 (number of streams), got {n!r}")
        self.n = n
        self.device = device = _resolved_device(device)
        self.streams: list = []
        if device.type == "cuda":
            self.streams = [torch.cuda.Stream(device=device) for _ in range(n)]
            with torch.cuda.device(device):
                self._ready = torch.cuda.Event()  # recorded on the caller's stream
                self._done = [torch.cuda.Event() for _ in range(n)]  # one per pool stream
        self._splits = TupleCache(_SPLIT_CACHE_ENTRIES)

    @property
    def cuda(self) -> bool:
        return bool(self.streams)

    def split(self, data) -> tuple[tuple, ...]:
        """`batch_views(data)`, remembered for the last few input tuples (a `TupleCache`): making the views costs
        a few microseconds of host time per batch, which a repeated call on the same tensors saves."""
        return self._splits.get(data, _checked_batch_views)

    def run(self, fn: Callable, items) -> None:
        """``fn(item)`` for every item, item i on stream i % n, joined into the caller's stream; only
        min(n, len(items)) streams are used. `items` is any sliceable sequence (per-batch tuples, a range of
        batch indices). CUDA pools only; the module docstring says how it is ordered and what ``fn`` may allocate."""
        caller = torch.cuda.current_stream(self.device)
        n = min(self.n, len(items))
        self._ready.record(caller)
        started = 0
        try:
            for i in range(n):
                stream = self.streams[i]
                stream.wait_event(self._ready)  # the caller's earlier work (inputs, c) comes first
                started = i + 1
                with torch.cuda.stream(stream):
                    for item in items[i::n]:
                        fn(item)
        finally:
            # Join even on an error, so nothing queued on a pool stream is left unordered.
            for i in range(started):
                self._done[i].record(self.streams[i])
                caller.wait_event(self._done[i])

    def __repr__(self) -> str:
        where = f"{self.device}" if self.cuda else "cpu, sequential"
        return f"StreamPool(n={self.n}, {where})"


_shared_pools: dict = {}


def shared_pool(device, n: int) -> StreamPool:
    """The pool of n streams on `device` (a tensor's device, index included) that every caller of this
    process shares, made on first use and kept (streams and events are made once, not per call)."""
    key = (_resolved_device(device), n)
    if key not in _shared_pools:
        _shared_pools[key] = StreamPool(n, key[0])
    return _shared_pools[key]


def run_batches(per_batch_fn: Callable, data, pool: StreamPool) -> torch.Tensor:
    """Run ``per_batch_fn(batch_data)`` for every batch of ``data``, batch l on stream l % n (`StreamPool.run`);
    return c of ``data``, ready for use on the caller's current stream. ``per_batch_fn`` is any GEMV that accepts
    the 7-tuple with L = 1 and writes its c (a `_scaled_mm` variant, a `CuteGemv` made with enough
    `cache_entries` for L tuples, ...), warmed up once on the caller's stream if it creates shared state lazily."""
    batches = pool.split(data)
    *_, c = data
    if not c.is_cuda:
        for part in batches:
            per_batch_fn(part)
        return c
    if not pool.cuda or c.device != pool.device:
        raise ValueError(f"pool: the inputs are on {c.device}, the pool's streams on {pool.device}")
    pool.run(per_batch_fn, batches)
    return c
