"""Capture a GEMV call into a CUDA graph once, then replay it: one launch for any number of kernels.

A call that launches several kernels (a GEMM and a copy per batch, or a stream pool's forks and joins) pays
the host cost of each launch every time. A CUDA graph records the whole sequence once and replays it with a
single launch, which can only help when the host, not the GPU, is the bottleneck, as it is for short calls
timed one at a time.

A graph replays the exact kernels it recorded, with the exact pointers: it is valid for one layout of memory
(`caches.memory_key`: data addresses, shapes, strides, dtypes, devices; a few microseconds of host time per
call to build); values changed in place are picked up, new tensors need a new capture.

Capture rules followed here (PyTorch's CUDA graph notes): the function is first run a few times on a side
stream, so lazy initialisation (cuBLAS handles and workspaces, module loading, the kernels' own caches)
happens outside the capture; the capture itself runs on that same side stream. A replay is queued on the
caller's current stream, so it is ordered with the caller's work like any kernel. Nothing inside the function
may synchronize with the host."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

from nvfp4lib.caches import is_validated_once, memory_key
from nvfp4lib.contract import validate_gemv_input

CPU_NOTE = "pass-through: CUDA graphs need a CUDA GPU, so every call runs the function directly"


class GraphedGemv:
    """``GraphedGemv(fn)(data)`` computes ``fn(data)`` by replaying a CUDA graph of it. ``fn`` takes the 7-tuple,
    writes c and returns it (any GEMV here). The first call for a given set of tensors warms ``fn`` up and captures
    it (slow: milliseconds, with a device synchronize); later calls with the same tensors replay. Up to
    ``max_graphs`` graphs are kept, each with its own memory pool for the temporaries ``fn`` allocates (the least
    recently used is dropped). Without CUDA, for inputs on the CPU (`note`) and for a tuple made for one call alone
    (`caches.validated_once`: its graph would never be replayed), calls go straight to ``fn``."""

    def __init__(self, fn: Callable, *, warmup: int = 2, max_graphs: int = 4):
        if warmup < 1:
            raise ValueError(f"warmup: expected >= 1 (capture needs a warmed-up function), got {warmup}")
        if max_graphs < 1:
            raise ValueError(f"max_graphs: expected >= 1, got {max_graphs}")
        self.fn = fn
        self.warmup = warmup
        self.max_graphs = max_graphs
        self.captures = 0
        self.replays = 0
        self._graphs: OrderedDict = OrderedDict()  # caches.memory_key -> (CUDAGraph, output)
        self._streams: dict = {}  # device -> side stream for warm-up and capture

    @property
    def note(self) -> str:
        if not torch.cuda.is_available():
            return CPU_NOTE
        return f"CUDA graphs: {len(self._graphs)} held, {self.captures} captures, {self.replays} replays"

    def __call__(self, data):
        try:
            graphed = data[0].is_cuda and not is_validated_once()
            key = memory_key(data) if graphed else None
        except (TypeError, AttributeError, IndexError, KeyError):
            validate_gemv_input(data)  # raises the NVFP4InputError that names what is wrong
            raise
        if not graphed:
            return self.fn(data)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(data, key)
        else:
            self._graphs.move_to_end(key)
        entry[0].replay()  # on the current stream
        self.replays += 1
        return entry[1]

    def capture(self, data) -> None:
        """Capture (or capture again) a graph for these tensors without running it."""
        validate_gemv_input(data, check_storage=False)
        if not data[0].is_cuda:
            raise ValueError(f"data: CUDA graphs need tensors on a CUDA GPU, got {data[0].device}")
        key = memory_key(data)
        self._graphs.pop(key, None)
        self._capture(data, key)

    def clear(self) -> None:
        """Drop every graph (after the GPU has finished replaying them) and its memory pool."""
        if self._graphs and torch.cuda.is_available():
            torch.cuda.synchronize()
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _capture(self, data, key) -> tuple:
        device = data[0].device
        caller = torch.cuda.current_stream(device)
        side = self._side_stream(device)
        side.wait_stream(caller)  # the inputs may have just been written on the caller's stream
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(data)
        caller.wait_stream(side)
        while len(self._graphs) >= self.max_graphs:
            torch.cuda.synchronize()  # a replay of the graph being dropped may still be running
            self._graphs.popitem(last=False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.graph(graph, stream=side):  # synchronizes first
            out = self.fn(data)
        self._graphs[key] = entry = (graph, out)
        self.captures += 1
        return entry
