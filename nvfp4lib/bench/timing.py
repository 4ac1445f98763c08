"""Timing GPU kernels: the leaderboard's own method, and two measures that explain it.

`leaderboard_time` times calls exactly as the GPU MODE leaderboard's harness does: per call a
synchronize, then its L2 flush (a 4 GiB float32 `torch.randn`) enqueued with NO synchronize
after it, then the start event, the call, the end event and a synchronize. The flush is about a
millisecond of GPU work still running when the call is made, so the host's cost of the call hides
behind it. The figure is the MEAN (with sample std, standard error, best, worst), and calls go
on until a `StoppingRule` says stop: the standard error under 0.1 % of the mean (after at least
3 calls and 100 ms), or a budget spent. `before` and `after` hooks run untimed around every
call (a new input before, a check after: the leaderboard's ranked mode, see nvfp4lib.leaderboard.modes).

Two teaching measures beside it, named for what they are:

* `time_kernel` ("kernel time"): calls enqueued back to back with the L2 flushed between them,
  no synchronize in between: the kernel alone, host cost hidden, the number to hold against a
  bandwidth ceiling.
* `time_host_visible` ("host-visible time"): each call on its own with the GPU idle at the start
  event (flush, synchronize, events around one call): the host's launch cost counts whenever the
  kernel is shorter than it, as for a program that waits for every result.

Without CUDA every timer falls back to wall-clock time (mode "wall") so the logic runs on a CPU.
The timed callable must do its GPU work on the current stream (or join any side streams back
into it before returning): the CUDA events are recorded there.

This module imports only the standard library and torch: the local leaderboard runs its source inside
a submission's process (nvfp4lib.leaderboard.child), where nvfp4lib itself cannot be imported, before
the submission is imported. What `time_one_call` reads its times with (`CLOCKS`) is bound then, to
torch's C entry points and the C clock: a file that later replaces `torch.cuda.Event`, its methods,
`torch.cuda.synchronize`, `torch.randn` or `time.perf_counter` does not change the times taken.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

FLUSH_MODES = ("dirty", "clean", "leaderboard")
"""How `flush_l2` evicts the L2, named for what the next call finds there (see `flush_l2`)."""
FLUSHES = ("dirty", "clean")
"""The flush a measurement is made after, as the results' "flush" column says it: "dirty", each
timer's own flush, which leaves dirty lines ("dirty" for kernel and host-visible time, "leaderboard"
for leaderboard time); "clean", all of them after a "clean" flush."""
FLUSH_FALLBACK_BYTES = 256 << 20  # used when the device does not report its L2 size
LEADERBOARD_FLUSH_SHAPE = (1024, 1024, 1024)  # float32: the 4 GiB randn of the leaderboard's clear_l2_cache
CPU_BANDWIDTH_BYTES = 16 << 20    # default size of the bandwidth probes without CUDA
GPU_BANDWIDTH_BYTES = 1 << 31     # 2 GiB: large enough that launch cost and L2 vanish

_flush_buffers: dict[int, torch.Tensor] = {}


class Clocks:
    """The clock, the CUDA events and stream, the synchronize and the leaderboard's flush that a timed
    call is made with, bound when this is made (the module makes `CLOCKS` when it is loaded) to
    functions of torch's C extension and the C clock, never looked up again: replacing the Python
    names (torch.cuda.Event and its elapsed_time, torch.cuda.current_stream, torch.randn,
    time.perf_counter) afterwards changes nothing here. Without CUDA only the clock is there."""

    def __init__(self):
        c = torch._C
        event = getattr(c, "_CudaEventBase", None)
        self.perf_counter, self.randn = time.perf_counter, torch.randn
        self._event, self._record, self._elapsed_ms = (event, getattr(event, "record", None),
                                                       getattr(event, "elapsed_time", None))
        self.synchronize = getattr(c, "_cuda_synchronize", None)
        self._stream_of, self._device = getattr(c, "_cuda_getCurrentStream", None), getattr(c, "_cuda_getDevice", None)
        self._stream, self._lazy_init = getattr(c, "_CudaStreamBase", None), torch.cuda._lazy_init

    def current_stream(self):
        """The current CUDA stream of the current device, made from its id (as torch.cuda.current_stream does)."""
        self._lazy_init()  # CUDA set up, if nothing has yet (a no-op after the first call)
        stream_id, index, kind = self._stream_of(self._device())
        return self._stream(stream_id=stream_id, device_index=index, device_type=kind)

    def event(self):
        return self._event(enable_timing=True)

    def record(self, event, stream) -> None:
        self._record(event, stream)

    def elapsed_us(self, start, end) -> float:
        return self._elapsed_ms(start, end) * 1e3


CLOCKS = Clocks()


@dataclass
class Timing:
    """Summary of repeated timings in microseconds; `samples` are kept for plotting.

    Leaderboard time is reported as `mean_us` (the leaderboard's figure); kernel and
    host-visible time as `median_us`. Every summary made here fills both."""
    mode: str  # "kernel" | "leaderboard" | "host-visible" | "wall"
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    host_us: float | None = None  # median CPU time inside the call (host-visible time)
    samples: list[float] = field(default_factory=list, repr=False)
    mean_us: float | None = None
    std_us: float | None = None    # sample standard deviation (n - 1 in the denominator)
    err_us: float | None = None    # standard error of the mean, std / sqrt(n)
    best_us: float | None = None
    worst_us: float | None = None

    def __str__(self) -> str:
        host = "" if self.host_us is None else f", host {self.host_us:.1f} us"
        mean = "" if self.mean_us is None else f"mean {self.mean_us:.1f} +- {self.err_us:.2f}, "
        return (f"{self.median_us:.1f} us ({self.mode}, {mean}p10 {self.p10_us:.1f}, "
                f"p90 {self.p90_us:.1f}, n={self.n}{host})")


MEASURES = ("kernel", "leaderboard", "host-visible")  # the three ways a call is timed (module docstring)
STATISTIC = {"kernel": "median", "leaderboard": "mean", "host-visible": "median"}
"""The figure each measure reports per call: the mean for leaderboard time (the leaderboard's own
figure), the median for the two teaching measures."""


def _check_measure(measure: str) -> str:
    if measure not in MEASURES:
        raise ValueError(f"measure: expected one of {MEASURES}, got {measure!r}")
    return measure


def per_call_us(timing: Timing, measure: str) -> float:
    """The time per call that `measure` reports from its `timing` (`STATISTIC`: mean or median)."""
    return getattr(timing, f"{STATISTIC[_check_measure(measure)]}_us")


def time_column(measure: str, field: str = "us") -> str:
    """The results' column of a measure's `field` ("us", the time per call; "p10_us", "reps", "gbps",
    ...): "host-visible" -> "host_visible_us"."""
    return f"{_check_measure(measure).replace('-', '_')}_{field}"


def mean_and_std(samples: Sequence[float]) -> tuple[float, float]:
    """The leaderboard's mean and sample std of `samples` (std NaN for one sample); what its stopping rule reads."""
    n = len(samples)
    mean = math.fsum(samples) / n
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in samples) / (n - 1)) if n > 1 else float("nan")


def summarize(mode: str, samples: Sequence[float], host: Sequence[float] | None = None) -> Timing:
    """Every statistic of `samples` (microseconds): median and deciles, and the leaderboard's
    mean, sample std, standard error, best and worst (std and error are NaN for one sample)."""
    samples = list(samples)
    if not samples:
        raise ValueError("samples: expected at least one timing, got none")
    n = len(samples)
    mean, std = mean_and_std(samples)
    deciles = statistics.quantiles(samples, n=10, method="inclusive") if n > 1 else samples
    return Timing(mode, statistics.median(samples), deciles[0], deciles[-1], n,
                  statistics.median(host) if host else None, samples,
                  mean, std, std / math.sqrt(n), min(samples), max(samples))


@dataclass(frozen=True)
class StoppingRule:
    """When leaderboard timing of one benchmark stops, as the leaderboard decides it.

    After each call: stop at `max_calls` calls; otherwise, once more than `min_calls - 1` calls
    and more than `min_wall_s` seconds of wall time have passed, stop as soon as the standard
    error is under `max_rel_err` of the mean, or the timed durations add up to more than
    `budget_s` (mean * calls), or the wall time passes `max_wall_s`."""
    max_calls: int
    budget_s: float
    min_calls: int = 3
    min_wall_s: float = 0.1
    max_rel_err: float = 0.001
    max_wall_s: float = 120.0

    def __post_init__(self):
        if isinstance(self.max_calls, bool) or not isinstance(self.max_calls, int) or self.max_calls < 1:
            raise ValueError(f"max_calls: expected an integer >= 1, got {self.max_calls!r}")
        for name in ("budget_s", "min_wall_s", "max_rel_err", "max_wall_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name}: expected a number >= 0, got {value!r}")

    def should_stop(self, samples_us: Sequence[float], wall_s: float) -> bool:
        n = len(samples_us)
        if n >= self.max_calls:
            return True
        if n < self.min_calls or wall_s <= self.min_wall_s:
            return False
        mean, std = mean_and_std(samples_us)  # not every statistic (`summarize`): this runs after every call
        return (std / math.sqrt(n) < self.max_rel_err * mean
                or mean * n * 1e-6 > self.budget_s
                or wall_s > self.max_wall_s)


# The leaderboard's rules: benchmark mode (one input reused) and ranked mode (a new input before
# every call), each preceded by a warm-up benchmark of the first shape under its own rule.
BENCHMARK_RULE = StoppingRule(max_calls=200, budget_s=10.0)
BENCHMARK_WARMUP_RULE = StoppingRule(max_calls=200, budget_s=0.1)
RANKED_RULE = StoppingRule(max_calls=1000, budget_s=30.0)
RANKED_WARMUP_RULE = StoppingRule(max_calls=1000, budget_s=0.5)


def _flush_buffer(index: int) -> torch.Tensor:
    """The flush buffer of one GPU, allocated on first use so timed loops never allocate."""
    buf = _flush_buffers.get(index)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0)
        nbytes = 2 * l2 if l2 > 0 else FLUSH_FALLBACK_BYTES
        buf = _flush_buffers[index] = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
    return buf


def flush_l2(device=None, mode: str = "dirty") -> None:
    """Evict the L2 so the next kernel reads its inputs from DRAM. A no-op without CUDA.

    The work is only enqueued: nothing here waits for the GPU.
    mode "dirty" writes twice the L2's size; it leaves the L2 full of dirty lines, whose
    write-back to DRAM then competes with the next kernel's reads.
    mode "clean" also reads the buffer back, so the write-back happens here and the next
    kernel finds only clean lines: its time is then its own.
    mode "leaderboard" is the leaderboard's own clear: a new 4 GiB float32 randn (from the
    caching allocator after the first call), also leaving dirty lines.
    """
    if mode not in FLUSH_MODES:
        raise ValueError(f"mode: expected one of {FLUSH_MODES}, got {mode!r}")
    if not torch.cuda.is_available():
        return
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        return
    if mode == "leaderboard":
        torch.randn(LEADERBOARD_FLUSH_SHAPE, device=dev)
        return
    buf = _flush_buffer(torch.cuda.current_device() if dev.index is None else dev.index)
    buf.zero_()
    if mode == "clean":
        words = buf.view(torch.int32)
        torch.amax(words[: words.numel() // 2], 0, out=words[-1])  # reads the first half back


def _check_reps(reps: int) -> None:
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")


def _time_wall(fn: Callable[[], object], warmup: int, reps: int) -> Timing:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = CLOCKS.perf_counter()
        fn()
        samples.append((CLOCKS.perf_counter() - t0) * 1e6)
    return summarize("wall", samples)


def _flush_mode(flush: bool | str | None) -> str | None:
    """flush=True means "dirty"; a string names a flush_l2 mode; False or None: no flush."""
    if flush is False or flush is None:
        return None
    if flush is True:
        return "dirty"
    if flush not in FLUSH_MODES:
        raise ValueError(f"flush: expected True, False or one of {FLUSH_MODES}, got {flush!r}")
    return flush


def _warm_up(fn: Callable[[], object], warmup: int, flush: str | None) -> None:
    for _ in range(warmup):
        fn()
    if flush:
        flush_l2(mode=flush)  # allocates the buffer here, outside the timed loop
    torch.cuda.synchronize()


def time_kernel(fn: Callable[[], object], *, warmup: int = 10, reps: int = 100,
                flush: bool | str = True) -> Timing:
    """Kernel time: GPU time of `fn` alone. All calls are enqueued back to back with no
    synchronize in between, so host launch cost hides behind the GPU work as long as Python
    runs ahead. The flush's own GPU time gives Python that lead; with `flush=False` a kernel
    shorter than its launch leaves the GPU waiting, and the time then includes launch gaps."""
    _check_reps(reps)
    flush = _flush_mode(flush)
    if not torch.cuda.is_available():
        return _time_wall(fn, warmup, reps)
    _warm_up(fn, warmup, flush)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if flush:
            flush_l2(mode=flush)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return summarize("kernel", [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])


def time_host_visible(fn: Callable[[], object], *, warmup: int = 10, reps: int = 100,
                      flush: bool | str = True) -> Timing:
    """Host-visible time: each call on its own with the GPU idle when it is made (flush,
    synchronize, events around one call, synchronize), so the host's cost of the call counts.
    Not how the leaderboard times (`leaderboard_time` is): it enqueues its flush after the
    synchronize, which hides that cost. `host_us` is the median CPU time spent inside `fn`."""
    _check_reps(reps)
    flush = _flush_mode(flush)
    if not torch.cuda.is_available():
        return _time_wall(fn, warmup, reps)
    _warm_up(fn, warmup, flush)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples, host = [], []
    for _ in range(reps):
        if flush:
            flush_l2(mode=flush)
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return summarize("host-visible", samples, host)


def time_one_call(fn: Callable[[], object], flush: str = "leaderboard",
                  after_end: Callable[[object], object] | None = None, stream=None) -> tuple[object, float]:
    """One call timed as the leaderboard times it -> (what `fn` returned, microseconds).

    Synchronize; enqueue the flush (no synchronize after it: the GPU is still busy with it when
    the call is made); start event; the call; end event; synchronize. The events are recorded on
    `stream` (default: the current stream); wall clock without CUDA (and without `stream`). All of
    it through `CLOCKS`. `after_end(output)`, if given, runs right after the end event is recorded
    and before the synchronize: work it enqueues on the current stream is ordered after the call,
    as the public harness's check of the output is."""
    clocks = CLOCKS
    if stream is None and not torch.cuda.is_available():
        t0 = clocks.perf_counter()
        out = fn()
        us = (clocks.perf_counter() - t0) * 1e6
        if after_end is not None:
            after_end(out)
        return out, us
    stream = clocks.current_stream() if stream is None else stream
    clocks.synchronize()
    start, end = clocks.event(), clocks.event()
    if flush == "leaderboard":  # flush_l2's "leaderboard" mode, through the randn bound in CLOCKS
        clocks.randn(LEADERBOARD_FLUSH_SHAPE, device="cuda")
    else:
        flush_l2(mode=flush)
    clocks.record(start, stream)
    out = fn()
    clocks.record(end, stream)
    if after_end is not None:
        after_end(out)
    clocks.synchronize()
    return out, clocks.elapsed_us(start, end)


def leaderboard_time(fn: Callable[[], object], rule: StoppingRule = BENCHMARK_RULE, *,
                     before: Callable[[], object] | None = None, after: Callable[[object], object] | None = None,
                     flush: str = "leaderboard",
                     time_call: Callable[[Callable[[], object]], tuple[object, float]] | None = None,
                     clock: Callable[[], float] | None = None) -> Timing:
    """Leaderboard time: calls of `fn`, each timed by `time_one_call` (the leaderboard's flush,
    no synchronize between it and the start event), until `rule` says stop -> Timing with the
    leaderboard's statistics (its figure is `mean_us`).

    `before()` runs untimed before every call and `after(output)` after it (ranked mode: a new
    input, a check that raises on a wrong result; an exception ends the timing). No warm-up
    call is made here: the leaderboard's first, checked call (and its warm-up benchmark) come
    before. `flush` other than "leaderboard" is for experiments; `time_call` and `clock` (the
    wall clock of the rule, default CLOCKS.perf_counter) can be replaced, e.g. by fakes in tests."""
    if flush not in FLUSH_MODES:
        raise ValueError(f"flush: expected one of {FLUSH_MODES}, got {flush!r}")
    timed = time_call or (lambda f: time_one_call(f, flush))
    clock = clock or CLOCKS.perf_counter
    samples: list[float] = []
    started = clock()
    while True:
        if before is not None:
            before()
        out, us = timed(fn)
        if after is not None:
            after(out)
        del out
        samples.append(us)
        if rule.should_stop(samples, clock() - started):
            break
    return summarize("leaderboard" if torch.cuda.is_available() else "wall", samples)


def _probe(nbytes: int | None, device) -> tuple[torch.device, int]:
    dev = torch.device(device if device is not None else
                       ("cuda" if torch.cuda.is_available() else "cpu"))
    if nbytes is None:
        nbytes = GPU_BANDWIDTH_BYTES if dev.type == "cuda" else CPU_BANDWIDTH_BYTES
    return dev, nbytes


def _time_on(dev: torch.device, fn: Callable[[], object], reps: int) -> Timing:
    if dev.type != "cuda":
        return _time_wall(fn, 3, reps)
    with torch.cuda.device(dev):
        return time_kernel(fn, warmup=3, reps=reps, flush=True)


def copy_bandwidth_gbps(nbytes: int | None = None, device=None, reps: int = 20) -> float:
    """Device-to-device copy of `nbytes` (default 2 GiB on CUDA, 16 MiB on CPU), counting
    bytes read + written: the practical ceiling for a memory-bound kernel."""
    dev, nbytes = _probe(nbytes, device)
    src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    return gbps(2 * src.nbytes, _time_on(dev, lambda: dst.copy_(src), reps).median_us)


def reduction_bandwidth_gbps(nbytes: int | None = None, device=None, reps: int = 20) -> float:
    """Row sums over `nbytes` of float32 (same defaults), counting bytes read only: the
    ceiling for a kernel that, like a GEMV, mostly reads."""
    dev, nbytes = _probe(nbytes, device)
    x = torch.ones(max(1, nbytes // (4 * 4096)), 4096, dtype=torch.float32, device=dev)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=dev)
    return gbps(x.nbytes, _time_on(dev, lambda: torch.sum(x, dim=1, out=out), reps).median_us)


def gbps(nbytes: int, us: float) -> float:
    """Bandwidth in GB/s (10^9 bytes per second) of moving `nbytes` in `us` microseconds."""
    if us <= 0:
        raise ValueError(f"time must be positive, got {us} us")
    return nbytes / us / 1e3


def geomean(values) -> float:
    """Geometric mean (how the leaderboard combines its shapes); NaN for no values."""
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def percent(x: float, ceiling: float) -> float:
    """`x` as a percentage of `ceiling` (e.g. achieved GB/s of the copy bandwidth)."""
    if ceiling <= 0:
        raise ValueError(f"ceiling must be positive, got {ceiling}")
    return 100.0 * x / ceiling


@dataclass
class BenchRow:
    """One line of a results table; bandwidth columns are filled when `nbytes` is known."""
    name: str
    shape: object  # e.g. a problem Shape or any tuple; printed as 7168x16384x1
    timing: Timing
    nbytes: int | None = None
    ceiling_gbps: float | None = None

    @property
    def bandwidth_gbps(self) -> float | None:
        return None if self.nbytes is None else gbps(self.nbytes, self.timing.median_us)

    @property
    def percent_of_ceiling(self) -> float | None:
        bw = self.bandwidth_gbps
        return None if bw is None or self.ceiling_gbps is None else percent(bw, self.ceiling_gbps)


def cell_text(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(rows: Sequence[BenchRow]) -> str:
    """Aligned text table; the host column appears only when some row has a host time."""
    show_host = any(r.timing.host_us is not None for r in rows)
    header = ["name", "shape", "median us", "GB/s", "% of ceiling"] + (["host us"] if show_host else [])
    body = []
    for r in rows:
        shape = "x".join(map(str, r.shape)) if isinstance(r.shape, (tuple, list)) else str(r.shape)
        cells = [r.name, shape, f"{r.timing.median_us:.1f}", cell_text(r.bandwidth_gbps, ".0f"),
                 cell_text(r.percent_of_ceiling, ".1f")]
        body.append(cells + ([cell_text(r.timing.host_us, ".1f")] if show_host else []))
    return text_table(header, body)


def text_table(header: list[str], body: list[list[str]], left: int = 2) -> str:
    """Text columns: the first ``left`` left-aligned (names), the rest right-aligned (numbers)."""
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])
