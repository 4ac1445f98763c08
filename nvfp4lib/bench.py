"""Timing GPU kernels the two ways that matter for this problem.

`time_kernel` enqueues every call back to back, so the GPU never waits for Python: it
measures the kernel alone, the number to hold against a memory-bandwidth ceiling.
`time_leaderboard` times each call on its own after an L2 flush and a synchronize, as the
leaderboard does, so the host's launch cost is part of the number whenever the kernel is
shorter than the launch. Without CUDA both fall back to wall-clock time (mode "wall") so the
notebooks still run on a CPU.

The timed callable must do its GPU work on the current stream (or join any side streams
back into it before returning): the CUDA events are recorded there.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

FLUSH_MODES = ("write", "clean")
FLUSH_FALLBACK_BYTES = 256 << 20  # used when the device does not report its L2 size
CPU_BANDWIDTH_BYTES = 16 << 20    # default size of the bandwidth probes without CUDA
GPU_BANDWIDTH_BYTES = 1 << 31     # 2 GiB: large enough that launch cost and L2 vanish

_flush_buffers: dict[int, torch.Tensor] = {}


@dataclass
class Timing:
    """Summary of repeated timings in microseconds; `samples` are kept for plotting."""
    mode: str  # "kernel" | "leaderboard" | "wall"
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    host_us: float | None = None  # median CPU time inside the call (leaderboard mode)
    samples: list[float] = field(default_factory=list, repr=False)

    def __str__(self) -> str:
        host = "" if self.host_us is None else f", host {self.host_us:.1f} us"
        return (f"{self.median_us:.1f} us ({self.mode}, p10 {self.p10_us:.1f}, "
                f"p90 {self.p90_us:.1f}, n={self.n}{host})")


def _summarize(mode: str, samples: list[float], host: list[float] | None = None) -> Timing:
    deciles = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples
    return Timing(mode, statistics.median(samples), deciles[0], deciles[-1], len(samples),
                  statistics.median(host) if host else None, samples)


def _flush_buffer(index: int) -> torch.Tensor:
    """The flush buffer of one GPU, allocated on first use so timed loops never allocate."""
    buf = _flush_buffers.get(index)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0)
        nbytes = 2 * l2 if l2 > 0 else FLUSH_FALLBACK_BYTES
        buf = _flush_buffers[index] = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
    return buf


def flush_l2(device=None, mode: str = "write") -> None:
    """Evict the L2 so the next kernel reads its inputs from DRAM. A no-op without CUDA.

    mode "write" writes twice the L2's size, as the leaderboard does; it leaves the L2 full
    of dirty lines, whose write-back to DRAM then competes with the next kernel's reads.
    mode "clean" also reads the buffer back, so the write-back happens here and the next
    kernel finds only clean lines: its time is then its own.
    """
    if mode not in FLUSH_MODES:
        raise ValueError(f"mode: expected one of {FLUSH_MODES}, got {mode!r}")
    if not torch.cuda.is_available():
        return
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
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
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _summarize("wall", samples)


def _flush_mode(flush: bool | str) -> str | None:
    """flush=True means the leaderboard's way ("write"); a string names a flush_l2 mode."""
    if flush is False or flush is None:
        return None
    return "write" if flush is True else flush


def _warm_up(fn: Callable[[], object], warmup: int, flush: str | None) -> None:
    for _ in range(warmup):
        fn()
    if flush:
        flush_l2(mode=flush)  # allocates the buffer here, outside the timed loop
    torch.cuda.synchronize()


def time_kernel(fn: Callable[[], object], *, warmup: int = 10, reps: int = 100,
                flush: bool | str = True) -> Timing:
    """GPU time of `fn` alone: all calls are enqueued back to back with no synchronize in
    between, so host launch cost hides behind the GPU work as long as Python runs ahead.
    The flush's own GPU time gives Python that lead; with `flush=False` a kernel shorter than
    its launch leaves the GPU waiting, and the time then includes launch gaps."""
    _check_reps(reps)
    if not torch.cuda.is_available():
        return _time_wall(fn, warmup, reps)
    flush = _flush_mode(flush)
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
    return _summarize("kernel", [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])


def time_leaderboard(fn: Callable[[], object], *, warmup: int = 10, reps: int = 100,
                     flush: bool | str = True) -> Timing:
    """Each call on its own (flush, synchronize, events around one call, synchronize), as
    the leaderboard scores it: the GPU is idle at the start event, so host cost counts.
    `host_us` is the median CPU time spent inside `fn`."""
    _check_reps(reps)
    if not torch.cuda.is_available():
        return _time_wall(fn, warmup, reps)
    flush = _flush_mode(flush)
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
    return _summarize("leaderboard", samples, host)


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
