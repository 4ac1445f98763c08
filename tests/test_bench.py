"""Tests of the timing helpers: CPU tests check behaviour, never speed."""
import math

import pytest
import torch

from nvfp4lib import bench
from nvfp4lib.bench import (BenchRow, Timing, copy_bandwidth_gbps, flush_l2, format_table, gbps,
                            percent, reduction_bandwidth_gbps, time_kernel, time_leaderboard)

@pytest.fixture
def no_cuda(monkeypatch):
    """Pretend CUDA is absent so the wall-clock fallback is tested on any machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _check_summary(t: Timing, mode: str, reps: int) -> None:
    assert t.mode == mode
    assert t.n == reps == len(t.samples)
    assert all(s > 0 for s in t.samples)
    assert 0 < t.p10_us <= t.median_us <= t.p90_us


@pytest.mark.parametrize("timer", [time_kernel, time_leaderboard])
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
        time_leaderboard(lambda: None, reps=0)


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
    monkeypatch.setattr(bench, "_flush_buffers", {})
    assert flush_l2() is None
    assert flush_l2("cpu") is None
    assert bench._flush_buffers == {}


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
    lb = time_leaderboard(lambda: dst.copy_(src), warmup=3, reps=20)
    _check_summary(lb, "leaderboard", 20)
    assert lb.host_us is not None and lb.host_us > 0
    assert 50 < copy_bandwidth_gbps(nbytes=1 << 28, reps=5) < 20_000
    assert 50 < reduction_bandwidth_gbps(nbytes=1 << 28, reps=5) < 20_000


@pytest.mark.gpu
def test_flush_buffer_allocated_once():
    flush_l2()
    index = torch.cuda.current_device()
    buf = bench._flush_buffers[index]
    l2 = torch.cuda.get_device_properties(index).L2_cache_size
    assert buf.numel() == (2 * l2 if l2 > 0 else bench.FLUSH_FALLBACK_BYTES)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(5):
        flush_l2()
    torch.cuda.synchronize()
    assert bench._flush_buffers[index] is buf
    assert torch.cuda.memory_allocated() == allocated
