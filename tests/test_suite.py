"""The benchmark suite runs end to end on a CPU, writes the CSV it promises, and draws its figures.

Nothing here asserts a speed: CPU timings are wall clock and only exercise the code.
"""

import dataclasses
import math

import pytest
import torch

from nvfp4lib import bench_report, suite
from nvfp4lib.device import capabilities
from nvfp4lib.problem import BENCHMARK_SHAPES, Shape, bytes_moved, generate_input

FAST_PATHS = ["peer-eager", "peer-bf16"]  # every path runs in the slow test


def _caps(**changes):
    return dataclasses.replace(capabilities(), **changes)


# ------------------------------------------------------------------------------ shapes and names


def test_gpu_sweep_spans_1_to_256_mb_of_a_at_l_1_and_4():
    shapes = suite.sweep_shapes(suite.GPU_SWEEP_EXPONENTS)
    assert {s.l for s in shapes} == {1, 4}
    for s in shapes:
        assert s.m % 128 == 0 and s.k % 64 == 0 and s.k >= s.m
    a_codes = sorted({s.m * s.k * s.l // 2 for s in shapes})
    assert a_codes[0] == 1 << 20 and a_codes[-1] == 256 << 20
    assert all(b == 2 * a for a, b in zip(a_codes, a_codes[1:]))


def test_cpu_stand_ins_keep_the_kernel_constraints():
    for factor in (8, 16):
        for big in BENCHMARK_SHAPES:
            s = suite.scaled_down(big, factor)
            assert s.m % 128 == 0 and s.k % 64 == 0 and s.l == big.l
            assert bytes_moved(s) < bytes_moved(big) / 20


def test_device_slug():
    assert bench_report.device_slug(_caps(cuda=False)) == "cpu"
    assert bench_report.device_slug(_caps(cuda=True, name="NVIDIA H200")) == "h200"
    assert bench_report.device_slug(_caps(cuda=True, name="NVIDIA H100 80GB HBM3")) == "h100-80gb-hbm3"


def test_paths_follow_the_capabilities():
    paths, skipped = suite.discover_paths(_caps(cuda=False, fp4_gemm=False))
    names = [p.name for p in paths]
    assert {"peer-eager", "peer-compiled", "peer-bf16"} <= set(names)
    assert not any(n.startswith(("cute-", "scaled_mm-")) for n in names)
    reasons = dict(skipped)
    assert "CUDA" in reasons["cute-fast"] and "sm_100" in reasons["scaled_mm-permuted"]

    paths, _ = suite.discover_paths(_caps(fp4_gemm=True))
    assert {"scaled_mm-reference", "scaled_mm-permuted", "scaled_mm-transposed"} <= {p.name for p in paths}


def test_select_takes_globs():
    names = ["cute-fast", "cute-naive", "peer-eager", "peer-bf16"]
    assert suite.select(names, None) == set(names)
    assert suite.select(names, ["cute-*", "peer-bf16"]) == {"cute-fast", "cute-naive", "peer-bf16"}
    assert suite.select(names, ["nothing"]) == set()


# ------------------------------------------------------------------------------ measuring


def _path(fn):
    return suite.BenchPath("test", "nvfp4lib", "test", lambda data: (lambda: fn(data)))


def _plan():
    return suite.Plan.for_machine(cuda=False, quick=True)


def test_a_wrong_path_is_reported_and_still_timed():
    data = generate_input(128, 256, 1, seed=0)

    def wrong(d):
        return d[6].zero_()

    row = suite.measure(_path(wrong), data, _plan())
    assert row["status"] == "inexact" and "mismatch" in row["note"]
    assert row["kernel_us"] > 0 and row["max_abs_err"] > 1e-3


def test_a_path_that_raises_is_reported():
    def broken(d):
        raise RuntimeError("no kernel for this\nsecond line")

    row = suite.measure(_path(broken), generate_input(128, 256, 1, seed=0), _plan())
    assert row == {"status": "error", "note": "RuntimeError: no kernel for this"}


def test_a_correct_path_is_timed_three_ways():
    from nvfp4lib import peers

    row = suite.measure(_path(peers.eager_dequant_matmul), generate_input(128, 256, 2, seed=1), _plan())
    assert row["status"] == "ok"
    assert row["kernel_us"] > 0 and row["leaderboard_us"] > 0 and row["host_visible_us"] > 0
    assert row["kernel_reps"] >= 1 and row["leaderboard_reps"] >= 1 and "leaderboard_err_us" in row
    assert row["kernel_gbps"] == pytest.approx(bytes_moved(Shape(128, 256, 2)) / row["kernel_us"] / 1e3)


def test_a_path_is_checked_on_a_clone_against_the_untouched_input():
    data = generate_input(128, 256, 1, seed=2)
    a_before = data[0].view(torch.uint8).clone()

    def zero_a_then_compute(d):
        from nvfp4lib.reference import reference_gemv

        d[0].view(torch.uint8).zero_()
        return d[6].copy_(reference_gemv(d))

    row = suite.measure(_path(zero_a_then_compute), data, _plan())
    assert row["status"] == "inexact" and "mismatch" in row["note"]
    assert torch.equal(data[0].view(torch.uint8), a_before)


# ------------------------------------------------------------------------------ end to end


def _check_csv(path, expect_paths):
    rows = bench_report.load_results(path)
    with open(path) as f:
        assert tuple(f.readline().strip().split(",")) == bench_report.COLUMNS
    ceilings = [r for r in rows if r["kind"] == "ceiling"]
    assert {r["path"] for r in ceilings} == {"copy", "reduction", "read-cute", "read-triton", "read-torch",
                                             "read-torch-clean"}
    assert all(r["kernel_gbps"] > 0 for r in ceilings if r["path"] in ("copy", "reduction"))
    assert {r["path"]: r["note"] for r in ceilings if r["status"] == "skipped"} == {
        "read-cute": "needs a CUDA GPU", "read-triton": "needs a CUDA GPU"}
    plan = suite.Plan.for_machine(cuda=False, quick=True)
    reads = [r for r in ceilings if r["path"].startswith("read-torch")]
    assert all(r["status"] == "ok" and r["kernel_us"] > 0 and r["leaderboard_us"] > 0 for r in reads)
    dirty = sorted((r["m"], r["k"], r["l"], r["bytes"]) for r in reads if r["path"] == "read-torch" and r["m"])
    assert dirty == sorted((*s, bytes_moved(s)) for _, s in plan.tasks())
    clean = sorted((r["m"], r["k"], r["l"]) for r in reads if r["path"] == "read-torch-clean")
    assert clean == sorted(plan.benchmark)
    assert [r["shape_set"] for r in reads if not r["m"]] == ["ceiling"], "one large read"
    for r in rows:
        assert r["env_torch"] == torch.__version__ and r["env_python"] and r["env_nvfp4lib"]
        assert r["device_slug"] == "cpu" and r["timing"] == "wall"
    timed = [r for r in rows if r["kind"] != "ceiling" and r["status"] != "skipped"]
    assert {r["path"] for r in timed} == set(expect_paths)
    assert len(timed) == len(expect_paths) * len(plan.tasks())
    for r in timed:
        assert r["status"] == "ok", r
        assert r["kernel_us"] > 0 and r["leaderboard_us"] > 0 and r["kernel_reps"] >= 1
        assert r["kernel_gbps"] == pytest.approx(r["bytes"] / r["kernel_us"] / 1e3, rel=1e-2)
        assert bench_report.CPU_NOTE in r["note"]
    assert {r["shape_set"] for r in timed} == {"benchmark", "sweep"}
    return rows


def test_quick_cpu_run_end_to_end(tmp_path, capsys):
    csv_path = suite.run(quick=True, out_dir=tmp_path, only=FAST_PATHS, figures_dir=tmp_path / "figs",
                         progress=False)
    assert csv_path == tmp_path / "cpu.csv"
    _check_csv(csv_path, FAST_PATHS)
    for name in bench_report.FIGURE_NAMES:
        assert (tmp_path / "figs" / f"{name}.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert bench_report.CPU_NOTE in out and "geomean" in out and "x eager" in out and "x bf16" in out


def test_command_line(tmp_path, capsys):
    assert suite.main(["--list"]) == 0
    assert "peer-bf16" in capsys.readouterr().out
    assert suite.main(["--only", "no-such-path", "--out", str(tmp_path)]) == 2
    assert suite.main(["--quick", "--out", str(tmp_path), "--only", "peer-bf16", "--no-figures",
                       "--no-progress"]) == 0
    _check_csv(tmp_path / "cpu.csv", ["peer-bf16"])
    assert not (tmp_path / "figures").exists()


@pytest.mark.slow
def test_quick_cpu_run_with_every_path(tmp_path):
    csv_path = suite.run(quick=True, out_dir=tmp_path, progress=False)
    names = [p.name for p in suite.discover_paths()[0]]
    _check_csv(csv_path, names)
    assert (tmp_path / "figures" / "00_roofline.png").exists(), "a CPU run keeps its figures out of figures/"


# ------------------------------------------------------------------------------ tables and figures


def _synthetic_rows():
    """H200-like numbers: two of our paths and two peers, at the benchmark shapes and a small sweep."""
    rows = [dict(path="copy", kind="ceiling", label="copy", shape_set="ceiling", status="ok", kernel_gbps=4000.0),
            dict(path="reduction", kind="ceiling", label="sum", shape_set="ceiling", status="ok", kernel_gbps=3900.0),
            dict(path="cute-naive", kind="nvfp4lib", label="CuTe naive", shape_set="-", status="skipped",
                 note="needs a CUDA GPU")]
    model = {"cute-fast": ("nvfp4lib", 3000.0), "dispatch": ("nvfp4lib", 3200.0),
             "peer-eager": ("peer", 25.0), "peer-bf16": ("peer", 900.0)}
    shapes = [("benchmark", s) for s in BENCHMARK_SHAPES] + [("sweep", s) for s in suite.sweep_shapes((21, 25))]
    for shape_set, s in shapes:
        for name, (kind, bandwidth) in model.items():
            kernel = max(3.0, bytes_moved(s) / bandwidth / 1e3)
            rows.append(dict(path=name, kind=kind, label=name, shape_set=shape_set, m=s.m, k=s.k, l=s.l,
                             bytes=bytes_moved(s), status="ok", kernel_us=kernel, leaderboard_us=kernel + 8,
                             host_us=4.0, timing="cuda-events", env_gpu="NVIDIA H200"))
    rows.append(dict(rows[-1], path="broken", status="error", note="RuntimeError: no kernel"))
    return rows


def test_figures_from_a_synthetic_csv(tmp_path):
    path = tmp_path / "h200.csv"
    bench_report.write_csv(_synthetic_rows(), path)
    figures = bench_report.make_figures(path)
    assert set(figures) == set(bench_report.FIGURE_NAMES)
    roofline = figures["00_roofline"]
    assert len(roofline.axes) == 2 and all(ax.get_xscale() == "log" for ax in roofline.axes)
    bars = figures["00_benchmark_bars"].axes[0]
    assert len(bars.patches) == 4 * len(BENCHMARK_SHAPES)  # paths that raised or were skipped draw nothing
    saved = bench_report.save_figures(figures, tmp_path / "figs")
    assert all(p.stat().st_size > 10_000 for p in saved.values())


def test_summary_table_speedups_and_geomean():
    text = bench_report.summary_table(_synthetic_rows())
    assert "x eager" in text and "x bf16" in text and "broken" not in text
    line = next(l for l in text.splitlines() if l.startswith("cute-fast") and "7168x16384x1" in l)
    kernel = bytes_moved(Shape(7168, 16384, 1)) / 3000.0 / 1e3
    eager = bytes_moved(Shape(7168, 16384, 1)) / 25.0 / 1e3
    assert line.split()[-2] == f"{(eager + 8) / (kernel + 8):.2f}"
    geo = next(l for l in text.splitlines() if l.startswith("cute-fast") and "3 shapes" in l)
    times = [bytes_moved(s) / 3000.0 / 1e3 for s in BENCHMARK_SHAPES]
    assert float(geo.split()[-2]) == pytest.approx(math.prod(times) ** (1 / 3), abs=0.1)


def test_find_results_prefers_this_device_then_committed(tmp_path, monkeypatch):
    bench, results = tmp_path / "build", tmp_path / "results"
    bench.mkdir(), results.mkdir()
    monkeypatch.setattr(bench_report, "BENCH_DIR", bench)
    monkeypatch.setattr(bench_report, "RESULTS_DIR", results)
    assert bench_report.find_results("h200") is None
    (bench / "cpu.csv").write_text("x")
    assert bench_report.find_results("cpu") is None, "CPU timings are never shown as results"
    (results / "h200.csv").write_text("x")
    assert bench_report.find_results("cpu") == results / "h200.csv"
    assert bench_report.find_results("b200") == results / "h200.csv"
    (bench / "h200.csv").write_text("x")
    assert bench_report.find_results("h200") == bench / "h200.csv"
