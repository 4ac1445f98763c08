"""cute_bench's check and timing loops on a CPU, with stand-in kernels: the rows it writes (the
benchmark CSV's schema, % of the best read) and the failures it reports. No speed is asserted."""

import pytest
import torch

from nvfp4lib.bench import report as bench_report
from nvfp4lib.bench import cute_bench
from nvfp4lib.bench.timing import StoppingRule
from nvfp4lib.bench.ceilings import TorchRead, read_ceilings
from nvfp4lib.contract import Shape
from nvfp4lib.cute.gemv import NaiveConfig
from nvfp4lib.problem import bytes_moved
from nvfp4lib.reference import reference_gemv
from nvfp4lib.study.generic_kernels import TILED, FastConfig, generic_config

SHAPES = [Shape(128, 256, 1), Shape(256, 128, 2)]


class StandIn:
    """Has what cute_bench reads of a CuteGemv: a call, the config of each K (the naive kernel's without one)
    and whether it refuses a K."""

    def __init__(self, cfg=None, wrong=False):
        self.cfg, self.wrong = cfg, wrong

    def config_for(self, k):
        return self.cfg or NaiveConfig()

    def refusal(self, k):
        return self.config_for(k).refusal(k)

    def __call__(self, data):
        *_, c = data
        out = c.copy_(reference_gemv(data))
        return out.neg_() if self.wrong else out


def test_check_all_reports_each_kernel_and_skips_loads_only(capsys):
    kernels = [("cute_naive", StandIn()), ("cute_fast[bad]", StandIn(FastConfig(4, 4, 2), wrong=True)),
               ("cute_fast[loads]", StandIn(FastConfig(4, 4, 2, compute=False), wrong=True))]
    assert cute_bench.check_all(kernels, SHAPES, seed=0, device="cpu") is False
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("check")]
    assert len(lines) == 2 * len(SHAPES), "the loads-only kernel is not checked"
    assert [line.split()[1] for line in lines if "FAIL" in line] == ["cute_fast[bad]"] * len(SHAPES)
    assert cute_bench.check_all(kernels[:1], SHAPES, seed=0, device="cpu") is True


def test_time_all_rows(monkeypatch, tmp_path):
    monkeypatch.setattr(cute_bench, "measure", _few_calls(cute_bench.measure))
    reads = read_ceilings([("benchmark", s) for s in SHAPES], large=False, rule=StoppingRule(3, 1e9), warmup=1,
                          reps=3, reads=(TorchRead(),))
    names = [cute_bench.kernel_name("naive"), cute_bench.kernel_name("fast", FastConfig(8, 4, 1))]
    kernels = [(names[0], StandIn()), (names[1], StandIn(FastConfig(8, 4, 1)))]
    rows = cute_bench.time_all(kernels, SHAPES, reps=3, reads=reads, device="cpu")
    assert [(r["path"], r["m"], r["k"], r["l"]) for r in rows] == [
        (p, *s) for s in SHAPES for p in ("cute_naive", "cute_fast[rows_per_warp=8,unroll=1]")]
    for r in rows:
        assert r["bytes"] == bytes_moved(Shape(r["m"], r["k"], r["l"])) and r["status"] == "ok"
        read = min(x["leaderboard_us"] for x in reads if (x["m"], x["k"], x["l"]) == (r["m"], r["k"], r["l"])
                   and x["path"] == "read-torch")
        assert r["leaderboard_pct_of_read"] == pytest.approx(100 * read / r["leaderboard_us"])
        assert r["kernel_us"] > 0 and r["host_visible_us"] > 0 and r["leaderboard_reps"] == 3
    path = tmp_path / "cute.csv"
    bench_report.write_csv(reads + rows, path)
    loaded = bench_report.load_results(path)
    assert [r["path"] for r in loaded] == [r["path"] for r in reads + rows]
    with pytest.raises(ValueError, match="flush"):
        cute_bench.time_all(kernels, SHAPES, flush="write", reads=reads, device="cpu")


def test_the_printed_time_lines_read_back_as_the_rows(monkeypatch, capsys):
    """What time_all prints is what a results log keeps; read_time_lines gives back every row's times and
    shares, as printed (2 decimals for times, 1 for shares)."""
    monkeypatch.setattr(cute_bench, "measure", _few_calls(cute_bench.measure))
    reads = read_ceilings([("benchmark", s) for s in SHAPES], large=False, rule=StoppingRule(3, 1e9), warmup=1,
                          reps=3, reads=(TorchRead(),))
    capsys.readouterr()
    kernels = [("cute_naive", StandIn()), ("cute_fast[rows_per_warp=8,unroll=1]", StandIn(FastConfig(8, 4, 1)))]
    rows = cute_bench.time_all(kernels, SHAPES, reps=3, reads=reads, device="cpu")
    read = cute_bench.read_time_lines("## a log\n" + capsys.readouterr().out)
    assert list(read) == [(r["path"], Shape(r["m"], r["k"], r["l"])) for r in rows]
    for r in rows:
        back = read[r["path"], Shape(r["m"], r["k"], r["l"])]
        for column, decimals in (("kernel_us", 2), ("leaderboard_us", 2), ("leaderboard_err_us", 2),
                                 ("host_visible_us", 2), ("kernel_pct_of_read", 1), ("leaderboard_pct_of_read", 1)):
            assert back[column] == pytest.approx(round(r[column], decimals), abs=1e-9), column


def test_the_committed_progression_log_holds_every_step_at_every_benchmark_shape():
    """results/h200_nb04_progression.log, which notebook 04 shows on a CPU: a timed row per step and shape."""
    from nvfp4lib.bench.profile import PROGRESSION
    from nvfp4lib.locations import RESULTS_DIR
    from nvfp4lib.problem import BENCHMARK_SHAPES

    read = cute_bench.read_time_lines((RESULTS_DIR / "h200_nb04_progression.log").read_text())
    names = [cute_bench.kernel_name("naive") if step == "naive" else
             cute_bench.kernel_name("fast", None if step == "default" else cute_bench.parse_config(step))
             for step in PROGRESSION]
    missing = [(n, s) for n in names for s in BENCHMARK_SHAPES if (n, s) not in read]
    assert not missing and len(read) == len(names) * len(BENCHMARK_SHAPES), missing


def test_kernel_names_follow_the_package_scheme():
    name = cute_bench.kernel_name
    assert (name("naive"), name("fast"), name("fast", FastConfig())) == ("cute_naive", "cute_fast", "cute_fast[]")
    assert name("fast", generic_config) == "cute_generic" and cute_bench.RULES["generic"] is generic_config
    assert name("fast", cute_bench.parse_config("8x4x1x4-lut")) == "cute_fast[rows_per_warp=8,unroll=1,decode=lut]"
    assert name("fast", cute_bench.parse_config("4x4x2x4-perm-loads:.nc")) == \
        "cute_fast[compute=False,a_load=.nc,permuted_scales=True]"
    assert name("fast", cute_bench.parse_config("4x4x2x4-lut-reg")) == "cute_fast[decode=lut,lut_registers=True]"
    assert name("fast", cute_bench.parse_config("t32x8x2")) == "cute_tiled[]"
    assert cute_bench.parse_config("t32x8x2-reg") == TILED
    assert name("fast", cute_bench.parse_config("t16x8x4-loads-bitops")) == \
        "cute_tiled[rows_per_block=16,chunks_per_step=4,compute=False,decode=bitops]"


@pytest.mark.parametrize("text, why", [("t16x8", "t16x8"), ("t24x8x2", "rows_per_block: expected a divisor of 128"),
                                        ("tAx8x2", "tAx8x2"), ("t16x8x0", "chunks_per_step")])
def test_bad_tiled_configs_are_refused_naming_the_text(text, why):
    with pytest.raises(SystemExit, match=why):
        cute_bench.parse_config(text)


@pytest.mark.parametrize("text, why", [("3x4x2", "a divisor of 128"), ("64x2x1", "at most 32 rows per warp"),
                                        ("4x4x0", "blocks_per_sm >= 1"), ("4xAx2", "4xAx2")])
def test_bad_fast_configs_are_refused_by_the_config_and_named_by_the_parser(text, why):
    with pytest.raises(SystemExit, match=why):
        cute_bench.parse_config(text)


def test_a_fast_config_checks_its_own_range():
    with pytest.raises(ValueError, match="a divisor of 128"):
        FastConfig(rows_per_warp=3)
    with pytest.raises(ValueError, match="prefetch >= 0"):
        FastConfig(prefetch=-1)


def test_shapes_option_names_other_shapes_and_refuses_bad_text():
    assert cute_bench.parse_shapes("4096x4608x2,128x64x1") == [Shape(4096, 4608, 2), Shape(128, 64, 1)]
    assert cute_bench.shape_set(Shape(4096, 4608, 2)) == "sweep" and cute_bench.shape_set(Shape(7168, 2048, 4)) == \
        "benchmark"
    with pytest.raises(SystemExit, match="--shapes: expected MxKxL"):
        cute_bench.parse_shapes("4096x4608")


def _few_calls(measure):
    """harness.measure with a stopping rule of 3 calls, so that a CPU run takes moments."""
    return lambda fn, *args, **kw: measure(fn, *args, **dict(kw, rule=StoppingRule(3, 1e9)))


def test_command_line_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the command would time for real")
    assert cute_bench.main(["--reps", "5"]) == 0
    assert "nothing to time here" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cute_bench.main(["--reps", "0"])
