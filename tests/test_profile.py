"""make profile's Nsight Compute reader on a hand-written sample of ncu's CSV (the details page: one line
per launch and metric), the join with what the child launched, the CSV round trip, and the skip path."""

import json
from pathlib import Path

import pytest
import torch

from nvfp4lib.bench import profile
from nvfp4lib.locations import REPO_ROOT
from nvfp4lib.problem import Shape

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _line(launch, metric, unit, value, kernel="kernel_cutlass_kernel_tensorptri8gmemalign16o1_0"):
    return (f'"{launch}","4242","python3","h200","{kernel}","1","7","(256, 1, 1)","(1792, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


def _sample():
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3)", "some output of the program", HEADER]
    for launch, scale in ((0, 1), (1, 2)):
        lines += [
            _line(launch, "dram__bytes_read.sum", "byte", f"{66_123_456 * scale:,}"),
            _line(launch, "dram__bytes_write.sum", "Kbyte", "14.34"),
            _line(launch, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "78.25"),
            _line(launch, "gpu__time_duration.sum", "nsecond", f"{25_300 * scale:,}"),
            _line(launch, "lts__t_sector_hit_rate.pct", "%", "3.10"),
            _line(launch, "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "45.5"),
            _line(launch, "smsp__issue_active.avg.pct_of_peak_sustained_active", "%", "40.0"),
            _line(launch, "smsp__inst_executed.sum", "inst", "9,748,480"),
            _line(launch, "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct", "%", "60"),
            _line(launch, "smsp__warp_issue_stalled_wait_per_warp_active.pct", "%", "20"),
            _line(launch, "smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct", "%", "10"),
            _line(launch, "smsp__warp_issue_stalled_barrier_per_warp_active.pct", "%", "6"),
            _line(launch, "smsp__warp_issue_stalled_selected_per_warp_active.pct", "%", "4"),
            _line(launch, "smsp__warp_issue_stalled_sleeping_per_warp_active.pct", "%", "n/a"),
        ]
        if launch == 0:
            lines.append("==PROF== Profiling \"kernel_cutlass_kernel\": 0%....50%....100% - 9 passes")
    return "\n".join(lines) + "\n"


def test_ncu_csv_is_read_per_launch_in_base_units():
    launches = profile.parse_ncu_csv(_sample())
    assert [launch["id"] for launch in launches] == [0, 1]
    first = launches[0]["metrics"]
    assert first["dram__bytes_read.sum"] == 66_123_456 and first["dram__bytes_write.sum"] == pytest.approx(14_340)
    assert first["gpu__time_duration.sum"] == pytest.approx(25.3)  # microseconds
    assert first["smsp__inst_executed.sum"] == 9_748_480 and first["lts__t_sector_hit_rate.pct"] == 3.1
    assert first["smsp__warp_issue_stalled_sleeping_per_warp_active.pct"] is None
    assert launches[1]["metrics"]["gpu__time_duration.sum"] == pytest.approx(50.6)
    with pytest.raises(ValueError, match="no CSV header"):
        profile.parse_ncu_csv("==ERROR== the profiling counters are not accessible\n")


def test_top_stalls_are_shares_of_all_stall_reasons():
    metrics = profile.parse_ncu_csv(_sample())[0]["metrics"]
    assert profile.top_stalls(metrics) == [("long_scoreboard", 0.6), ("wait", 0.2), ("math_pipe_throttle", 0.1)]


def test_rows_join_the_manifest_by_launch_order_and_round_trip(tmp_path):
    manifest = [dict(config="default", kernel="cute_fast", m=7168, k=16384, l=1, status="ok", note=""),
                dict(config="w1x1x4", kernel="cute_wholek[...]", m=7168, k=16384, l=1, status="refused",
                     note="a: expected K <= 8192"),
                dict(config="w2x4x1", kernel="cute_wholek[]", m=7168, k=16384, l=1, status="ok", note=""),
                dict(config="w2x2x1", kernel="cute_wholek[rows_per_thread=2]", m=7168, k=16384, l=1, status="ok",
                     note="")]
    rows = profile.join(manifest, profile.parse_ncu_csv(_sample()))
    assert [r["status"] for r in rows] == ["ok", "refused", "ok", "error"]  # the last call has no launch
    assert rows[2]["duration_us"] == pytest.approx(50.6) and rows[0]["l2_writeback_bytes"] == pytest.approx(14_340)
    assert rows[0]["inst_per_chunk"] == pytest.approx(9_748_480 * 32 / (7168 * 16384 / 32))
    assert (rows[0]["stall_1"], rows[0]["stall_1_share"]) == ("long_scoreboard", 0.6)
    path = tmp_path / "h200_profile.csv"
    profile.write_profile(rows, path)
    loaded = profile.load_profile(path)
    assert [r["config"] for r in loaded] == [r["config"] for r in rows] and loaded[0]["m"] == 7168
    assert loaded[0]["dram_read_bytes"] == 66_123_456 and loaded[1]["duration_us"] is None
    sentence = profile.where_time_goes(loaded[0])
    assert sentence.startswith("default at 7168x16384x1: 25.3 us, DRAM 66.1 MB read at 78 % of peak")
    assert "long_scoreboard 60 %" in sentence and "instructions per 16-byte chunk of A" in sentence
    assert "not profiled (a: expected K <= 8192)" in profile.where_time_goes(loaded[1])


def test_ncu_command_leaves_the_clocks_alone_and_profiles_only_the_cute_kernels():
    command = profile.ncu_command("ncu", ["python", "-m", "x"])
    assert command[:3] == ["ncu", "--clock-control", "none"] and command[-3:] == ["python", "-m", "x"]
    metrics = command[command.index("--metrics") + 1].split(",")
    assert set(profile.METRICS.values()) <= set(metrics) and profile.STALL_REGEX in metrics
    assert command[command.index("--kernel-name") + 1] == profile.KERNEL_REGEX
    assert set(profile.PROGRESSION) >= {"naive", "default", "t32x8x2-reg"} and "w2x4x1" in profile.CONFIGS


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path without a GPU")
def test_without_a_gpu_nothing_is_profiled(capsys, tmp_path):
    assert profile.main(["--out", str(tmp_path / "p.csv")]) == 0
    assert profile.NOTHING in capsys.readouterr().out and not (tmp_path / "p.csv").exists()
    assert profile.main(["--dry-run"]) == 0
    assert "--clock-control none" in capsys.readouterr().out


def test_the_help_names_the_module_to_run(capsys):
    with pytest.raises(SystemExit):
        profile.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m nvfp4lib.bench.profile")


def test_the_committed_profile_loads_with_its_columns_and_round_trips(tmp_path):
    rows = profile.load_profile(REPO_ROOT / "results" / "h200_profile.csv")
    assert rows and all(tuple(r) == profile.COLUMNS for r in rows)
    assert all(isinstance(r[c], int) for r in rows for c in ("m", "k", "l"))
    assert all(isinstance(r["config"], str) and isinstance(r["commit"], str) for r in rows)
    assert {r["config"] for r in rows} >= set(profile.PROGRESSION)
    assert all(profile.where_time_goes(r) for r in rows)
    profile.write_profile(rows, tmp_path / "again" / "h200_profile.csv")  # the folder is made
    again = profile.load_profile(tmp_path / "again" / "h200_profile.csv")
    for before, after in zip(rows, again, strict=True):
        for column in profile.COLUMNS:
            if isinstance(before[column], float):
                assert after[column] == pytest.approx(before[column], rel=1e-3), column
            else:
                assert after[column] == before[column], column


def test_find_profile_prefers_this_device_then_a_committed_one(tmp_path, monkeypatch):
    monkeypatch.setattr(profile, "RESULTS_DIR", tmp_path)
    assert profile.find_profile("b200") is None
    (tmp_path / "h200_profile.csv").write_text("x")
    (tmp_path / "h200.csv").write_text("x")  # the benchmark CSV: not a profile
    (tmp_path / "a100_carveout_profile.csv").write_text("x")  # one experiment's counters, first by name
    assert profile.find_profile("b200") == tmp_path / "h200_profile.csv"
    (tmp_path / "b200_profile.csv").write_text("x")
    assert profile.find_profile("b200") == tmp_path / "b200_profile.csv"
    assert profile.output_path(None, "b200") == tmp_path / "b200_profile.csv"
    assert profile.output_path("elsewhere.csv") == Path("elsewhere.csv")


class _FakeRunner:
    """A kernel as cute_bench.variants yields it, recording what the child does with it."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def refusal(self, k):
        return None  # refuses no K

    def prepare(self, data):
        self.calls.append(("prepare", self.name))

    def __call__(self, data):
        if self.name == "cute_broken":
            raise RuntimeError("launch failed")
        self.calls.append(("call", self.name))


def test_the_child_builds_kernels_as_cute_bench_does_and_calls_each_once(tmp_path, monkeypatch):
    """Without a GPU, with cute_bench.variants and the input stood in for: one manifest line per config and
    shape, named as variants names them; a kernel that fails to build or to run is noted, the others go on."""
    from nvfp4lib import problem
    from nvfp4lib.bench import cute_bench

    calls = []

    def variants(configs):
        yield "cute_naive", _FakeRunner("cute_naive", calls)
        for text in configs:
            if text == "unbuildable":
                raise ValueError("cannot compile")
            name = "cute_fast" if text == "default" else f"cute_{text}"
            yield name, _FakeRunner(name, calls)

    monkeypatch.setattr(cute_bench, "variants", variants)
    monkeypatch.setattr(problem, "generate_input",  # only a's shape is read: the K
                        lambda m, k, l, **kwargs: (torch.empty(m, k // 2, l, dtype=torch.uint8),))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    manifest = tmp_path / "manifest.jsonl"
    shapes = [Shape(128, 256, 1), Shape(256, 512, 2)]
    assert profile.run_child(["naive", "default", "broken", "unbuildable"], shapes, str(manifest)) == 0
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [(e["config"], e["kernel"], e["status"], e["m"]) for e in entries] == [
        (config, kernel, status, s.m) for s in shapes for config, kernel, status in (
            ("naive", "cute_naive", "ok"), ("default", "cute_fast", "ok"), ("broken", "cute_broken", "error"),
            ("unbuildable", None, "error"))]
    assert entries[2]["note"] == "RuntimeError: launch failed" and entries[3]["note"] == "ValueError: cannot compile"
    assert calls[:4] == [("prepare", "cute_naive"), ("call", "cute_naive"), ("prepare", "cute_fast"),
                         ("call", "cute_fast")]
