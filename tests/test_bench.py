"""Tests of the timing helpers: CPU tests check behaviour, never speed."""
import ast
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nvfp4lib.bench import timing
from nvfp4lib.bench.timing import (BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, MEASURES, BenchRow, RANKED_RULE,
                                   RANKED_WARMUP_RULE, StoppingRule, Timing, copy_bandwidth_gbps, flush_l2,
                                   format_table, gbps, leaderboard_time, per_call_us, percent,
                                   reduction_bandwidth_gbps, summarize, time_column, time_host_visible, time_kernel,
                                   time_one_call)


def test_one_flush_vocabulary_from_the_timers_to_the_results(monkeypatch):
    """`harness.measure` takes the results' words: "dirty" gives each timer its own flush, "clean" all a clean one."""
    from nvfp4lib.bench import harness

    calls = []
    monkeypatch.setattr(harness, "time_kernel", lambda fn, **kw: calls.append(("kernel", kw["flush"])))
    monkeypatch.setattr(harness, "time_host_visible", lambda fn, **kw: calls.append(("host-visible", kw["flush"])))
    monkeypatch.setattr(harness, "leaderboard_time", lambda fn, rule, **kw: calls.append(("leaderboard", kw["flush"])))
    harness.measure(lambda: None)
    harness.measure(lambda: None, flush="clean")
    assert calls == [("kernel", "dirty"), ("leaderboard", "leaderboard"), ("host-visible", "dirty"),
                     ("kernel", "clean"), ("leaderboard", "clean"), ("host-visible", "clean")]
    assert set(timing.FLUSHES) < set(timing.FLUSH_MODES)
    with pytest.raises(ValueError, match="flush: expected one of"):
        harness.measure(lambda: None, flush="write")


def test_each_measure_reports_its_statistic_in_its_column():
    """One rule: leaderboard time is the mean (the leaderboard's figure), the teaching measures the median."""
    timed = summarize("kernel", [1.0, 2.0, 9.0])
    assert per_call_us(timed, "leaderboard") == timed.mean_us == 4.0
    assert per_call_us(timed, "kernel") == per_call_us(timed, "host-visible") == timed.median_us == 2.0
    assert [time_column(m) for m in MEASURES] == ["kernel_us", "leaderboard_us", "host_visible_us"]
    assert time_column("host-visible", "p10_us") == "host_visible_p10_us"
    for bad in (lambda: time_column("wall"), lambda: per_call_us(timed, "mean")):
        with pytest.raises(ValueError, match="measure: expected one of"):
            bad()

@pytest.fixture
def no_cuda(monkeypatch):
    """Pretend CUDA is absent so the wall-clock fallback is tested on any machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _check_summary(t: Timing, mode: str, reps: int) -> None:
    assert t.mode == mode
    assert t.n == reps == len(t.samples)
    assert all(s > 0 for s in t.samples)
    assert 0 < t.p10_us <= t.median_us <= t.p90_us


@pytest.mark.parametrize("timer", [time_kernel, time_host_visible])
def test_cpu_fallback_is_wall_clock(no_cuda, timer):
    calls = []
    x = torch.arange(1000, dtype=torch.float32)
    t = timer(lambda: calls.append(x.sum()), warmup=2, reps=7)
    _check_summary(t, "wall", 7)
    assert len(calls) == 2 + 7
    assert t.host_us is None
    assert "wall" in str(t)


def test_single_rep_and_bad_reps(no_cuda):
    _check_summary(time_kernel(lambda: None, warmup=0, reps=1), "wall", 1)
    with pytest.raises(ValueError, match="reps"):
        time_host_visible(lambda: None, reps=0)
    with pytest.raises(ValueError, match="flush"):
        time_kernel(lambda: None, flush="sideways")
    with pytest.raises(ValueError, match="flush"):
        leaderboard_time(lambda: None, flush="write twice")


def test_gbps_and_percent():
    assert gbps(2_000_000_000, 1_000_000) == pytest.approx(2.0)  # 2 GB in one second
    assert gbps(66_100_000, 16.0) == pytest.approx(4131.25)
    assert percent(50.0, 200.0) == pytest.approx(25.0)
    with pytest.raises(ValueError, match="positive"):
        gbps(1, 0.0)
    with pytest.raises(ValueError, match="positive"):
        percent(1.0, 0.0)


def test_format_table_rows_and_columns():
    kernel = Timing("kernel", 20.0, 19.0, 21.0, 3, None, [19.0, 20.0, 21.0])
    board = Timing("leaderboard", 30.0, 29.0, 31.0, 3, 7.5, [29.0, 30.0, 31.0])
    rows = [BenchRow("fast", (7168, 16384, 1), kernel, nbytes=66_100_000, ceiling_gbps=4000.0),
            BenchRow("one call", (4096, 7168, 8), board)]
    lines = format_table(rows).splitlines()
    assert len(lines) == 4
    assert lines[0].split() == ["name", "shape", "median", "us", "GB/s", "%", "of", "ceiling",
                                "host", "us"]
    assert lines[2].split() == ["fast", "7168x16384x1", "20.0", "3305", "82.6", "-"]
    assert lines[3].split() == ["one", "call", "4096x7168x8", "30.0", "-", "-", "7.5"]
    # right-aligned numeric columns end at the same position
    assert lines[0].index("median us") + len("median us") == lines[2].index("20.0") + 4


def test_format_table_without_host_column():
    row = BenchRow("k", "custom", Timing("kernel", 5.0, 5.0, 5.0, 1))
    text = format_table([row])
    assert "host us" not in text and "custom" in text


def test_flush_l2_is_noop_without_cuda(no_cuda, monkeypatch):
    monkeypatch.setattr(timing, "_flush_buffers", {})
    assert flush_l2() is None
    assert flush_l2("cpu") is None
    assert timing._flush_buffers == {}


def test_bandwidth_probes_on_cpu():
    for probe in (copy_bandwidth_gbps, reduction_bandwidth_gbps):
        value = probe(nbytes=1 << 20, device="cpu", reps=3)
        assert math.isfinite(value) and value > 0


@pytest.mark.gpu
def test_kernel_time_of_known_copy_is_plausible():
    src = torch.ones(1 << 26, dtype=torch.float32, device="cuda")  # 256 MiB
    dst = torch.empty_like(src)
    t = time_kernel(lambda: dst.copy_(src), warmup=3, reps=20)
    _check_summary(t, "kernel", 20)
    # wide bounds: catch unit mistakes (1000x), not slow GPUs
    assert 50 < gbps(2 * src.nbytes, t.median_us) < 20_000
    visible = time_host_visible(lambda: dst.copy_(src), warmup=3, reps=20)
    _check_summary(visible, "host-visible", 20)
    assert visible.host_us is not None and visible.host_us > 0
    board = leaderboard_time(lambda: dst.copy_(src), StoppingRule(max_calls=20, budget_s=10.0))
    assert board.mode == "leaderboard" and 3 <= board.n <= 20
    assert 50 < gbps(2 * src.nbytes, board.mean_us) < 20_000
    assert 50 < copy_bandwidth_gbps(nbytes=1 << 28, reps=5) < 20_000
    assert 50 < reduction_bandwidth_gbps(nbytes=1 << 28, reps=5) < 20_000


@pytest.mark.gpu
def test_flush_buffer_allocated_once():
    flush_l2()
    index = torch.cuda.current_device()
    buf = timing._flush_buffers[index]
    l2 = torch.cuda.get_device_properties(index).L2_cache_size
    assert buf.numel() == (2 * l2 if l2 > 0 else timing.FLUSH_FALLBACK_BYTES)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(5):
        flush_l2()
    torch.cuda.synchronize()
    assert timing._flush_buffers[index] is buf
    assert torch.cuda.memory_allocated() == allocated


# ------------------------------------------------------------------------------ statistics and stopping


def test_summary_statistics_match_numpy():
    rng = np.random.default_rng(7)
    for n in (2, 3, 17, 200):
        samples = list(rng.gamma(4.0, 5.0, n))
        t = summarize("leaderboard", samples)
        x = np.array(samples)
        assert t.n == n and t.samples == samples
        assert t.mean_us == pytest.approx(x.mean(), rel=1e-12)
        assert t.std_us == pytest.approx(x.std(ddof=1), rel=1e-12)
        assert t.err_us == pytest.approx(x.std(ddof=1) / math.sqrt(n), rel=1e-12)
        assert (t.best_us, t.worst_us) == (x.min(), x.max())
        assert t.median_us == pytest.approx(np.median(x), rel=1e-12)
        assert [t.p10_us, t.p90_us] == pytest.approx(list(np.percentile(x, [10, 90])), rel=1e-12)
    one = summarize("wall", [3.0])
    assert (one.mean_us, one.best_us, one.worst_us, one.median_us) == (3.0, 3.0, 3.0, 3.0)
    assert math.isnan(one.std_us) and math.isnan(one.err_us)
    with pytest.raises(ValueError, match="samples"):
        summarize("wall", [])


def test_the_leaderboards_rules():
    """Benchmark mode: at most 200 calls, 10 s of timed calls; ranked: 1000 and 30 s; warm-ups
    0.1 s and 0.5 s; all: at least 3 calls and 100 ms, 0.1 % standard error, 120 s of wall time."""
    assert (BENCHMARK_RULE.max_calls, BENCHMARK_RULE.budget_s) == (200, 10.0)
    assert (RANKED_RULE.max_calls, RANKED_RULE.budget_s) == (1000, 30.0)
    assert (BENCHMARK_WARMUP_RULE.max_calls, BENCHMARK_WARMUP_RULE.budget_s) == (200, 0.1)
    assert (RANKED_WARMUP_RULE.max_calls, RANKED_WARMUP_RULE.budget_s) == (1000, 0.5)
    for rule in (BENCHMARK_RULE, RANKED_RULE, BENCHMARK_WARMUP_RULE, RANKED_WARMUP_RULE):
        assert (rule.min_calls, rule.min_wall_s, rule.max_rel_err, rule.max_wall_s) == (3, 0.1, 0.001, 120.0)
    for name, bad in (("max_calls", dict(max_calls=0, budget_s=1.0)), ("max_calls", dict(max_calls=True, budget_s=1.0)),
                      ("budget_s", dict(max_calls=5, budget_s=-1.0)),
                      ("max_rel_err", dict(max_calls=5, budget_s=1.0, max_rel_err=float("nan")))):
        with pytest.raises(ValueError, match=name):
            StoppingRule(**bad)


def _fake(durations, step_s):
    """A fake per-call timer returning `durations` in turn, a fake clock advancing `step_s` per call,
    and the log of what ran in which order."""
    log, clock_now = [], [0.0]
    source = itertools.cycle(durations)

    def time_call(fn):
        log.append("call")
        clock_now[0] += step_s
        return fn(), next(source)

    return time_call, (lambda: clock_now[0]), log


def _calls_until_stop(rule, durations, step_s) -> int:
    """The same rule written out independently: the number of calls after which it stops."""
    samples = []
    for n in itertools.count(1):
        samples.append(durations[(n - 1) % len(durations)])
        if n >= rule.max_calls:
            return n
        wall = n * step_s
        if n >= 3 and wall > 0.1:
            x = np.array(samples)
            err = x.std(ddof=1) / math.sqrt(n)
            if err / x.mean() < 0.001 or x.sum() * 1e-6 > rule.budget_s or wall > rule.max_wall_s:
                return n


@pytest.mark.parametrize("durations, step_s, rule, expect", [
    ([10.0], 0.05, StoppingRule(1000, 30.0), 3),               # steady: stops once 3 calls and 100 ms are past
    ([10.0], 0.01, StoppingRule(1000, 30.0), 11),              # ... not before 100 ms of wall time
    ([10.0, 20.0], 0.05, StoppingRule(1000, 0.001), 68),       # noisy: the timed calls pass the budget (1 ms)
    ([10.0, 20.0], 1.0, StoppingRule(1000, 1e9), 121),         # noisy, no budget: 120 s of wall time
    ([10.0, 20.0], 0.05, StoppingRule(5, 1e9), 5),             # max_calls first
    ([100.0, 100.1], 0.05, StoppingRule(1000, 1e9), None),     # small noise: the standard error rule
])
def test_stopping_rule_with_a_fake_clock_and_timer(no_cuda, durations, step_s, rule, expect):
    time_call, clock, log = _fake(durations, step_s)
    t = leaderboard_time(lambda: None, rule, time_call=time_call, clock=clock)
    independent = _calls_until_stop(rule, durations, step_s)
    assert t.n == len(log) == independent
    if expect is not None:
        assert t.n == expect
    assert t.samples == [durations[i % len(durations)] for i in range(t.n)]
    assert t.mean_us == pytest.approx(np.mean(t.samples))


def test_before_and_after_run_around_every_timed_call(no_cuda):
    events = []
    time_call, clock, _ = _fake([5.0], 0.01)  # 4 calls within 100 ms: max_calls stops them
    outputs = iter(range(100))
    t = leaderboard_time(lambda: events.append("fn") or next(outputs), StoppingRule(4, 1e9),
                         before=lambda: events.append("before"), after=lambda out: events.append(("after", out)),
                         time_call=time_call, clock=clock)
    assert t.n == 4
    assert events == [e for i in range(4) for e in ("before", "fn", ("after", i))]

    def reject(out):
        raise AssertionError("wrong result")

    with pytest.raises(AssertionError, match="wrong result"):
        leaderboard_time(lambda: 1, StoppingRule(4, 1e9), after=reject, time_call=time_call, clock=clock)


# ------------------------------------------------------------------------------ what runs between the events


class _FakeCuda:
    """Stands in for torch.cuda and flush_l2, recording the order of what a timer does."""

    def __init__(self, monkeypatch):
        self.log = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.name = None

            def record(self):
                fake.log.append("record")

            def elapsed_time(self, other):
                return 0.002  # ms

        class Clocks:  # what time_one_call reads its times with
            perf_counter = staticmethod(time.perf_counter)
            synchronize = staticmethod(lambda: self.log.append("synchronize"))
            randn = staticmethod(lambda *shape, **kw: self.log.append("flush leaderboard"))
            current_stream = staticmethod(lambda: "stream")
            event = staticmethod(lambda: Event())
            record = staticmethod(lambda event, stream: event.record())
            elapsed_us = staticmethod(lambda start, end: start.elapsed_time(end) * 1e3)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.log.append("synchronize"))
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(timing, "CLOCKS", Clocks)
        monkeypatch.setattr(timing, "flush_l2", lambda device=None, mode="dirty": self.log.append(f"flush {mode}"))

    def call(self):
        self.log.append("call")


def test_leaderboard_time_enqueues_its_flush_after_the_synchronize(monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    out, us = time_one_call(cuda.call)
    assert us == pytest.approx(2.0)
    # no synchronize between the flush and the start event: the GPU is still busy with the flush
    assert cuda.log == ["synchronize", "flush leaderboard", "record", "call", "record", "synchronize"]
    cuda.log.clear()
    t = leaderboard_time(cuda.call, StoppingRule(2, 1e9))
    assert t.mode == "leaderboard" and t.n == 2
    assert cuda.log == 2 * ["synchronize", "flush leaderboard", "record", "call", "record", "synchronize"]


def test_host_visible_time_synchronizes_after_its_flush(monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    t = time_host_visible(cuda.call, warmup=0, reps=2)
    assert t.mode == "host-visible" and t.host_us is not None
    timed = ["flush dirty", "synchronize", "record", "call", "record", "synchronize"]
    assert cuda.log == ["flush dirty", "synchronize"] + 2 * timed  # the warm-up flush allocates, then the calls


def test_kernel_time_never_synchronizes_between_calls(monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    t = time_kernel(cuda.call, warmup=1, reps=3)
    assert t.mode == "kernel" and t.n == 3
    assert cuda.log == ["call", "flush dirty", "synchronize"] + 3 * ["flush dirty", "record", "call", "record"] + [
        "synchronize"]


def test_leaderboard_flush_is_a_4_gib_float32_randn(monkeypatch):
    made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: made.append((shape, kw)))
    flush_l2(mode="leaderboard")
    (shape, kw), = made
    assert math.prod(*shape) * 4 == 4 << 30 and kw["device"].type == "cuda" and "dtype" not in kw
    with pytest.raises(ValueError, match="mode"):
        flush_l2(mode="randn")


def test_bench_imports_only_the_standard_library_and_torch():
    """nvfp4lib.leaderboard.evaluate runs this module's source in a submission's process, where nvfp4lib (or
    anything else not on the leaderboard machine) cannot be imported: every import, at any depth."""
    tree = ast.parse(Path(timing.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    tops = {name.partition(".")[0] for name in names}
    assert "torch" in tops and tops - {"torch", "__future__"} <= set(sys.stdlib_module_names), tops
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree)), "no relative imports"
