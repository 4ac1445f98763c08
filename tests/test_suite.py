"""The benchmark suite runs end to end on a CPU, writes the CSV it promises, and draws its figures.

Nothing here asserts a speed: CPU timings are wall clock and only exercise the code.
"""

import csv
import dataclasses
import math

import pytest
import torch
from matplotlib.colors import to_hex

from nvfp4lib.bench import report as bench_report
from nvfp4lib.bench import suite
from nvfp4lib.bench.peers import all_paths
from nvfp4lib.bench.timing import MEASURES
from nvfp4lib.contract import Shape
from nvfp4lib.device import capabilities
from nvfp4lib.problem import BENCHMARK_SHAPES, bytes_moved, generate_input

FAST_PATHS = ["peer_eager", "peer_bf16"]  # every path runs in the slow test


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
    assert {"peer_eager", "peer_compiled", "peer_bf16", "dispatch"} <= set(names)
    assert not any(n.startswith(("cute_", "scaled_mm_")) for n in names)
    assert "reference" not in names and "reference" not in dict(skipped), "the yardstick is not timed"
    reasons = dict(skipped)
    assert "CUDA" in reasons["cute_fast"] and "sm_100" in reasons["scaled_mm_permuted"]

    paths, _ = suite.discover_paths(_caps(fp4_gemm=True))
    assert {"scaled_mm_reference", "scaled_mm_permuted", "scaled_mm_transposed"} <= {p.name for p in paths}


def test_select_takes_globs():
    names = ["cute_fast", "cute_naive", "peer_eager", "peer_bf16"]
    assert suite.select(names, None) == set(names)
    assert suite.select(names, ["cute_*", "peer_bf16"]) == {"cute_fast", "cute_naive", "peer_bf16"}
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

    row = suite.check_and_time(_path(wrong), data, _plan())
    assert row["status"] == "inexact" and "mismatch" in row["note"]
    assert row["kernel_us"] > 0 and row["max_abs_err"] > 1e-3


def test_a_path_that_raises_is_reported():
    def broken(d):
        raise RuntimeError("no kernel for this\nsecond line")

    row = suite.check_and_time(_path(broken), generate_input(128, 256, 1, seed=0), _plan())
    assert row == {"status": "error", "note": "RuntimeError: no kernel for this"}


def test_a_correct_path_is_timed_three_ways():
    from nvfp4lib.bench import peers

    row = suite.check_and_time(_path(peers.eager_dequant_matmul), generate_input(128, 256, 2, seed=1), _plan())
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

    row = suite.check_and_time(_path(zero_a_then_compute), data, _plan())
    assert row["status"] == "inexact" and "mismatch" in row["note"]
    assert torch.equal(data[0].view(torch.uint8), a_before)


# ------------------------------------------------------------------------------ end to end


def _check_csv(path, expect_paths):
    rows = bench_report.load_results(path)
    with open(path) as f:
        assert tuple(f.readline().strip().split(",")) == bench_report.COLUMNS
    ceilings = [r for r in rows if r["kind"] == "ceiling"]
    assert {r["path"] for r in ceilings} == {"copy", "reduction", "read-cute", "read-triton", "read-torch",
                                             "read-torch-clean", "read-triton-xor-plain",
                                             "read-triton-xor-evict-first", "read-triton-xor-cg"}
    assert all(r["kernel_gbps"] > 0 for r in ceilings if r["path"] in ("copy", "reduction"))
    assert {r["path"]: r["note"] for r in ceilings if r["status"] == "skipped"} == {
        name: "needs a CUDA GPU" for name in ("read-cute", "read-triton", "read-triton-xor-plain",
                                              "read-triton-xor-evict-first", "read-triton-xor-cg")}
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
    for r in rows:
        if r["kind"] != "ceiling" and r["status"] == "skipped":  # named as the registry names it
            path = all_paths()[r["path"]]
            assert (r["kind"], r["label"]) == (path.kind, path.label), r
            assert r["note"] == path.why_not_timed(capabilities(), capabilities().cuda)
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
    for name in ("00_roofline", "00_benchmark_bars"):
        assert (tmp_path / "figs" / f"{name}.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert bench_report.CPU_NOTE in out and "geomean" in out and "x eager" in out and "x bf16" in out


def test_command_line(tmp_path, capsys):
    assert suite.main(["--list"]) == 0
    assert "peer_bf16" in capsys.readouterr().out
    assert suite.main(["--only", "no-such-path", "--out", str(tmp_path)]) == 2
    not_here = [name for name, _ in suite.discover_paths()[1]][:1]  # a skipped row too, where there is one
    assert suite.main(["--quick", "--out", str(tmp_path), "--only", "peer_bf16", *not_here, "--no-figures",
                       "--no-progress"]) == 0
    rows = _check_csv(tmp_path / "cpu.csv", ["peer_bf16"])
    assert [r["path"] for r in rows if r["status"] == "skipped" and r["kind"] != "ceiling"] == not_here
    assert not (tmp_path / "figures").exists()


@pytest.mark.slow
def test_quick_cpu_run_with_every_path(tmp_path):
    csv_path = suite.run(quick=True, out_dir=tmp_path, progress=False)
    names = [p.name for p in suite.discover_paths()[0]]
    _check_csv(csv_path, names)
    assert (tmp_path / "figures" / "00_roofline.png").exists(), "a CPU run keeps its figures out of figures/"


# ------------------------------------------------------------------------------ tables and figures


READ_BANDWIDTH = {"read-cute": 3600.0, "read-torch": 3300.0}  # GB/s of the synthetic streaming reads (kernel time)


def _synthetic_rows(reads: bool = False):
    """H200-like numbers: two of our paths and two peers, at the benchmark shapes and a small sweep;
    with `reads`, streaming reads of every shape's bytes as nvfp4lib.bench.ceilings writes them."""
    rows = [dict(path="copy", kind="ceiling", label="copy", shape_set="ceiling", status="ok", kernel_gbps=4000.0),
            dict(path="reduction", kind="ceiling", label="sum", shape_set="ceiling", status="ok", kernel_gbps=3900.0),
            dict(path="cute_naive", kind="nvfp4lib", label="CuTe naive", shape_set="-", status="skipped",
                 note="needs a CUDA GPU")]
    model = {"cute_fast": ("nvfp4lib", 3000.0), "dispatch": ("nvfp4lib", 3200.0),
             "peer_eager": ("peer", 25.0), "peer_bf16": ("peer", 900.0)}
    shapes = [("benchmark", s) for s in BENCHMARK_SHAPES] + [("sweep", s) for s in suite.sweep_shapes((21, 25))]
    for shape_set, s in shapes:
        for name, (kind, bandwidth) in model.items():
            kernel = max(3.0, bytes_moved(s) / bandwidth / 1e3)
            rows.append(dict(path=name, kind=kind, label=name, shape_set=shape_set, m=s.m, k=s.k, l=s.l,
                             bytes=bytes_moved(s), status="ok", kernel_us=kernel, leaderboard_us=kernel + 0.5,
                             leaderboard_err_us=0.01, host_visible_us=kernel + 8, host_us=4.0, timing="cuda-events",
                             env_gpu="NVIDIA H200"))
        if reads:
            for name, bandwidth in READ_BANDWIDTH.items():
                kernel = bytes_moved(s) / bandwidth / 1e3
                for flush, suffix in (("dirty", ""), ("clean", "-clean")):
                    rows.append(dict(path=name + suffix, kind="ceiling", label=name, shape_set=shape_set, m=s.m,
                                     k=s.k, l=s.l, bytes=bytes_moved(s), status="ok", flush=flush,
                                     kernel_us=kernel * (0.9 if flush == "clean" else 1.0),
                                     leaderboard_us=kernel + 0.2))
    rows.append(dict(rows[-1], path="broken", kind="nvfp4lib", status="error", note="RuntimeError: no kernel"))
    return rows


def test_benchmark_rows_are_one_paths_checked_rows_by_shape():
    rows = _synthetic_rows()
    got = bench_report.benchmark_rows(rows, "cute_fast")
    assert list(got) == list(BENCHMARK_SHAPES)
    assert all(r["path"] == "cute_fast" and r["shape_set"] == "benchmark" for r in got.values())
    assert bench_report.benchmark_rows(rows, "cute_naive") == {}, "skipped: not a result"
    assert bench_report.benchmark_rows(rows, "cute-fast") == {}, "one spelling of every name"


def test_figures_from_a_synthetic_csv(tmp_path):
    path = tmp_path / "h200.csv"
    bench_report.write_csv(_synthetic_rows(), path)
    figures = bench_report.make_figures(path)
    assert set(figures) == set(("00_roofline", "00_benchmark_bars"))
    roofline = figures["00_roofline"]
    assert [ax.get_title().split(":")[0] for ax in roofline.axes] == ["kernel time", "leaderboard time",
                                                                      "host-visible time"]
    assert all(ax.get_xscale() == "log" for ax in roofline.axes)
    bars = figures["00_benchmark_bars"].axes[0]
    assert len(bars.patches) == 4 * len(BENCHMARK_SHAPES)  # paths that raised or were skipped draw nothing
    saved = bench_report.save_figures(figures, tmp_path / "figs")
    assert all(p.stat().st_size > 10_000 for p in saved.values())


def test_summary_table_speedups_and_geomean():
    text = bench_report.summary_table(_synthetic_rows())
    assert "x eager" in text and "x bf16" in text and "broken" not in text
    line = next(l for l in text.splitlines() if l.startswith("cute_fast") and "7168x16384x1" in l)
    kernel = bytes_moved(Shape(7168, 16384, 1)) / 3000.0 / 1e3
    eager = bytes_moved(Shape(7168, 16384, 1)) / 25.0 / 1e3
    assert line.split()[-2] == f"{(eager + 0.5) / (kernel + 0.5):.2f}", "speed-ups compare leaderboard time"
    header = next(l for l in text.splitlines() if l.startswith("geomean")).split()
    assert header == ["geomean", "over", "kernel", "us", "leaderboard", "us", "host-visible", "us"]
    geo = next(l for l in text.splitlines() if l.startswith("cute_fast") and "3 shapes" in l).split()
    times = [bytes_moved(s) / 3000.0 / 1e3 for s in BENCHMARK_SHAPES]
    expected = [math.prod(t + extra for t in times) ** (1 / 3) for extra in (0.0, 0.5, 8.0)]
    assert [float(x) for x in geo[3:]] == pytest.approx(expected, abs=0.06)
    assert "leaderboard the mean" in text
    assert "% copy: of the measured device-to-device copy, 4000 GB/s" in text, "no reads: the copy is the ceiling"


def _table_cells(text: str, path: str, shape: Shape) -> dict[str, str]:
    """{column header: cell} of one line of a summary table (headers are split on two spaces)."""
    lines = text.splitlines()
    at = next(i for i, l in enumerate(lines) if l.startswith(path + " ") and f" {shape.m}x{shape.k}x{shape.l} " in l)
    header = next(lines[i] for i in range(at, -1, -1) if lines[i].startswith("path "))
    return dict(zip(_cells(header), _cells(lines[at]), strict=True))


def _cells(line: str) -> list[str]:
    """The cells of a text_table line: columns are at least two spaces apart, cells hold single spaces."""
    return [c.strip() for c in line.split("  ") if c.strip()]


def test_summary_and_figures_hold_paths_against_the_best_read():
    rows = _synthetic_rows(reads=True)
    text = bench_report.summary_table(rows)
    assert "% read" in text and "% copy" not in text and "best streaming read" in text
    for s in BENCHMARK_SHAPES:
        best = bytes_moved(s) / max(READ_BANDWIDTH.values()) / 1e3  # the fastest read (dirty flush), kernel time
        kernel = max(3.0, bytes_moved(s) / 3000.0 / 1e3)
        cells = _table_cells(text, "cute_fast", s)
        assert float(cells["% read"]) == pytest.approx(100 * best / kernel, abs=0.06)
    figures = bench_report.make_figures(rows)
    try:
        roofline = figures["00_roofline"]
        assert "best streaming read" in roofline.get_suptitle()
        for ax, measure in zip(roofline.axes, ("kernel", "leaderboard")):
            dashed = [line for line in ax.lines if line.get_linestyle() == "--" and line.get_marker() == "x"]
            assert len(dashed) == 1, "one line through the best reads"
            column = bench_report.time_column(measure)
            expected = sorted((r["bytes"], r[column]) for r in rows if r["path"] == "read-cute")
            xs, ys = dashed[0].get_data()
            assert list(xs) == [x for x, _ in expected] and list(ys) == pytest.approx([y for _, y in expected])
        bars = figures["00_benchmark_bars"].axes[0]
        black = [c for c in bars.collections if to_hex(c.get_color()[0]) == "#000000"]  # the B200 lines are red
        floors = sorted(seg[0][1] for c in black for seg in c.get_segments())
        reads = sorted(r["leaderboard_us"] for r in rows if r["path"] == "read-cute" and r["shape_set"] == "benchmark")
        assert floors == pytest.approx(reads), "per shape: the best read's leaderboard time"
    finally:
        import matplotlib.pyplot as plt

        for fig in figures.values():
            plt.close(fig)


def test_a_summary_table_finds_its_ceilings_once(monkeypatch):
    """Every row of a table is held against the same ceilings: they are indexed once per table, whatever
    the number of rows, and the index gives what the rows themselves give."""
    from nvfp4lib.bench import ceilings

    rows = _synthetic_rows(reads=True)
    index = ceilings.CeilingIndex(rows)
    timed = [r for r in rows if r["kind"] != "ceiling" and r["status"] == "ok"]
    assert [bench_report.percent_of_ceiling(r, index) for r in timed] == \
        [bench_report.percent_of_ceiling(r, rows) for r in timed]
    built = []
    original = ceilings.CeilingIndex.__init__

    def counted(self, given):
        built.append(self)
        original(self, given)

    monkeypatch.setattr(ceilings.CeilingIndex, "__init__", counted)
    bench_report.summary_table(rows)
    bench_report.summary_table(rows + timed)  # more rows, still one index
    assert len(built) == 2


@pytest.mark.parametrize("path", bench_report.committed_results(), ids=lambda p: p.name)
def test_committed_results_load_and_draw(path):
    with open(path, newline="") as f:
        header = next(csv.reader(f))
    missing = [c for c in ("path", "kind", "m", "k", "l", "kernel_us", "leaderboard_us", "host_visible_us")
               if c not in header]  # the schema's own columns (`bench_report.COLUMNS`; older CSVs lack some others)
    assert not missing, (f"{path.name}: not in the benchmark CSV's schema (no {', '.join(missing[:4])} ...); "
                         f"a CSV of counters is named *{bench_report.PROFILE_SUFFIX}.csv")
    rows = bench_report.load_results(path)
    text = bench_report.summary_table(rows, ("benchmark",))
    measures = bench_report.measures_in(rows)
    assert measures == list(MEASURES), "every committed CSV has all three measures (no older layout to read)"
    assert "leaderboard us" in text
    figures = bench_report.make_figures(rows)
    import matplotlib.pyplot as plt

    assert len(figures["00_roofline"].axes) == len(measures)
    for fig in figures.values():
        plt.close(fig)


def test_every_timing_field_is_a_column():
    from nvfp4lib.bench.timing import summarize
    from nvfp4lib.bench.harness import timing_fields

    fields = timing_fields({m: summarize(m, [1.0, 2.0, 3.0], [0.5]) for m in MEASURES}, nbytes=1000)
    # The bandwidth of host-visible time is left out: that time includes the host's work.
    assert set(fields) - set(bench_report.COLUMNS) == {"host_visible_gbps"}
    assert {"kernel_pct_of_read", "leaderboard_pct_of_read", "flush"} <= set(bench_report.COLUMNS)


def test_find_results_prefers_this_device_then_committed(tmp_path, monkeypatch):
    bench, results = tmp_path / "build", tmp_path / "results"
    bench.mkdir(), results.mkdir()
    monkeypatch.setattr(bench_report, "BENCH_DIR", bench)
    monkeypatch.setattr(bench_report, "RESULTS_DIR", results)
    assert bench_report.find_results("h200") is None
    (bench / "cpu.csv").write_text("x")
    assert bench_report.find_results("cpu") is None, "CPU timings are never shown as results"
    (results / "h200.csv").write_text("x")
    (results / "a100_carveout.csv").write_text("x")  # one experiment's CSV, first by name: never the whole run
    assert bench_report.find_results("cpu") == results / "h200.csv"
    assert bench_report.find_results("b200") == results / "h200.csv"
    (bench / "h200.csv").write_text("x")
    assert bench_report.find_results("h200") == bench / "h200.csv"


def test_results_source_names_file_device_date_commit_and_torch(tmp_path):
    row = dict(path="copy", env_gpu="NVIDIA H200", date="2026-12-01", commit="8ecbe5c", env_torch="2.11.0+cu130")
    assert bench_report.results_source(bench_report.RESULTS_DIR / "h200.csv", [dict(path="x"), row]) == \
        "results/h200.csv: NVIDIA H200, 2026-12-01, commit 8ecbe5c, torch 2.11.0+cu130"
    outside = tmp_path / "r.csv"
    assert bench_report.results_source(outside, []) == \
        f"{outside}: unknown device, undated, commit unknown, torch unknown"
