"""The dispatcher: the path chosen per device and shape, reported with its reason; forcing;
the measured table. Other machines are simulated by replacing capabilities(), without kernels."""
import dataclasses
import json

import pytest
import torch

from nvfp4lib import dispatch
from nvfp4lib.bench import StoppingRule, summarize
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.problem import BENCHMARK_SHAPES, TEST_SHAPES, Shape, generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.validate import NVFP4InputError

CPU = Capabilities(cuda=False, name="cpu", sm=None, fp4_gemm=False, cute_dsl=True, cute_dsl_version="4.8.1",
                   hw_e2m1=False, cute_arch=None)
HOPPER = Capabilities(cuda=True, name="NVIDIA H200", sm=(9, 0), fp4_gemm=False, cute_dsl=True,
                      cute_dsl_version="4.8.1", hw_e2m1=False, cute_arch="sm_90a")
BLACKWELL = Capabilities(cuda=True, name="NVIDIA B200", sm=(10, 0), fp4_gemm=True, cute_dsl=True,
                         cute_dsl_version="4.8.1", hw_e2m1=True, cute_arch="sm_100a")
_seeds = iter(range(3000, 10**6))


pytestmark = pytest.mark.usefixtures("clean_dispatch")  # every test starts with no table and no forcing


def _fresh(shape: Shape, device: str = "cpu"):
    data = generate_input(*shape, seed=next(_seeds), mode="full", device=device)
    poison_(data[6])
    return data


def _pretend(monkeypatch, caps: Capabilities) -> None:
    monkeypatch.setattr(dispatch, "capabilities", lambda: caps)


# ----------------------------------------------------------------------------------- CPU


def test_cpu_inputs_take_the_emulation_and_say_why():
    data = _fresh(Shape(256, 512, 2))
    decision = dispatch.explain(data)
    assert decision.path == "scaled_mm" and decision.source == "device"
    assert "CPU" in decision.reason and "emulation" in decision.reason
    assert decision.shape_class == dispatch.shape_class((256, 512, 2))
    assert str(decision).startswith("scaled_mm [")


@pytest.mark.parametrize("shape", TEST_SHAPES[:3] + [Shape(512, 1536, 2), Shape(256, 512, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_custom_kernel_on_cpu_matches_reference(shape):
    data = _fresh(shape)
    out = dispatch.custom_kernel(data)
    assert out is data[6]
    result = check(out, data)
    assert result.ok, result.message
    assert dispatch.decisions()[(data[0].shape, False)].path == "scaled_mm"


@pytest.mark.parametrize("bad", [None, {}, (), (1, 2, 3, 4, 5, 6, 7)])
def test_malformed_input_gets_the_validators_error(bad):
    with pytest.raises(NVFP4InputError, match="^data: expected a 7-tuple|^a: expected a torch.Tensor"):
        dispatch.custom_kernel(bad)


def test_choice_is_made_once_per_shape(monkeypatch):
    made = []
    real = dispatch._plan
    monkeypatch.setattr(dispatch, "_plan", lambda data, key: made.append(key) or real(data, key))
    for _ in range(3):
        dispatch.custom_kernel(_fresh(Shape(128, 256, 1)))
    dispatch.custom_kernel(_fresh(Shape(128, 512, 1)))
    assert len(made) == 2


@pytest.mark.parametrize("name", ["reference", "scaled_mm", "scaled_mm_streams", "scaled_mm_graph"])
def test_force_runs_the_named_path_correctly(name):
    data = _fresh(Shape(256, 512, 3))
    with dispatch.force(name):
        decision = dispatch.explain(data)
        assert decision.path == name and decision.source == "forced"
        assert f"force('{name}')" in decision.reason
        for _ in range(2):  # the streams path warms up on its first call, then uses the pool
            poison_(data[6])
            result = check(dispatch.custom_kernel(data), data)
            assert result.ok, result.message
    assert dispatch.explain(data).path == "scaled_mm"  # restored after the block


def test_force_nests_and_rejects_unknown_names():
    with dispatch.force("reference"):
        with dispatch.force("scaled_mm_graph"):
            assert dispatch.choose(Shape(128, 64, 1)).path == "scaled_mm_graph"
        assert dispatch.choose(Shape(128, 64, 1)).path == "reference"
    with pytest.raises(ValueError, match="unknown path 'fastest'"):
        with dispatch.force("fastest"):
            pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_forcing_an_unavailable_path_fails_with_the_reason():
    data = _fresh(Shape(128, 256, 1))
    with dispatch.force("cute"), pytest.raises(RuntimeError, match="cannot run here: .*CUDA"):
        dispatch.custom_kernel(data)


def test_environment_variable_forces_a_path(monkeypatch):
    data = _fresh(Shape(128, 256, 2))
    monkeypatch.setenv(dispatch.PATH_ENV_VAR, "reference")
    dispatch.reset()
    decision = dispatch.explain(data)
    assert decision.path == "reference" and decision.source == "env"
    assert "NVFP4_PATH=reference" in decision.reason
    result = check(dispatch.custom_kernel(data), data)
    assert result.ok, result.message
    monkeypatch.setenv(dispatch.PATH_ENV_VAR, "nonsense")
    dispatch.reset()
    with pytest.raises(ValueError, match="NVFP4_PATH: unknown path"):
        dispatch.custom_kernel(data)
    monkeypatch.setenv(dispatch.PATH_ENV_VAR, "auto")
    assert dispatch.explain(data).path == "scaled_mm"


# --------------------------------------------------------------- simulated other machines


def test_hopper_takes_the_cute_kernel(monkeypatch):
    _pretend(monkeypatch, HOPPER)
    decision = dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=True)
    assert decision.path == "cute" and decision.source == "device"
    assert "sm_100" in decision.reason
    assert dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=False).path == "scaled_mm"


def test_gpu_without_cute_dsl_takes_the_emulation_on_the_gpu(monkeypatch):
    _pretend(monkeypatch, dataclasses.replace(HOPPER, cute_dsl=False, cute_dsl_version=None))
    decision = dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=True)
    assert decision.path == "scaled_mm" and "emulation on the GPU" in decision.reason


def test_blackwell_without_table_reports_the_default(monkeypatch):
    _pretend(monkeypatch, BLACKWELL)
    for shape in BENCHMARK_SHAPES:
        decision = dispatch.choose(shape, on_cuda=True)
        assert decision.path == dispatch.BLACKWELL_DEFAULT and decision.source == "default"
        assert dispatch.DEFAULT_NOTE in decision.reason
    no_dsl = dataclasses.replace(BLACKWELL, cute_dsl=False, cute_dsl_version=None)
    assert dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=True, caps=no_dsl).path == "scaled_mm"


@pytest.mark.parametrize("caps", [CPU, HOPPER, BLACKWELL, dataclasses.replace(HOPPER, cute_dsl=False),
                                  dataclasses.replace(BLACKWELL, cute_dsl=False)],
                         ids=["cpu", "hopper", "blackwell", "hopper-no-dsl", "blackwell-no-dsl"])
def test_without_a_table_the_choice_is_the_first_runnable_path_of_the_fallback_order(caps):
    for on_cuda in (False, True) if caps.cuda else (False,):
        decision = dispatch.choose(BENCHMARK_SHAPES[1], on_cuda=on_cuda, caps=caps)
        runnable = [p for p in dispatch.FALLBACK_ORDER if dispatch.why_unavailable(p, caps, on_cuda) is None]
        assert decision.path == runnable[0] == dispatch.fallback_paths(caps, on_cuda)[0]
        assert dispatch.fallback_paths(caps, on_cuda, after=runnable[0]) == runnable[1:]
    assert dispatch.FALLBACK_ORDER[-1] == "scaled_mm" and dispatch.why_unavailable("scaled_mm", caps, False) is None


def test_a_chosen_path_that_fails_to_build_gives_way_to_the_next(monkeypatch):
    """The CuTe kernel chosen (as on a GPU) but not compiling: the next path of FALLBACK_ORDER runs, and
    the decision says why; a forced path is not replaced."""
    def no_compile():
        raise RuntimeError("NVVM_ERROR_COMPILATION")

    monkeypatch.setitem(dispatch.PATHS, "cute", dataclasses.replace(dispatch.PATHS["cute"], make=no_compile,
                                                                     unavailable=dispatch._anywhere))
    monkeypatch.delitem(dispatch._built, "cute", raising=False)  # built again, with the patched make
    key = dispatch.shape_class((256, 512, 2))
    monkeypatch.setattr(dispatch, "choose", lambda shape, on_cuda: dispatch.Decision("cute", "chosen", key, "device"))
    data = _fresh(Shape(256, 512, 2))
    result = check(dispatch.custom_kernel(data), data)
    assert result.ok, result.message
    decision = dispatch.decisions()[(data[0].shape, False)]
    assert decision.path == "scaled_mm" and decision.source == "fallback"
    assert decision.reason == ("cute could not be built (RuntimeError: NVVM_ERROR_COMPILATION); "
                               "the next path of FALLBACK_ORDER")
    dispatch.reset()
    monkeypatch.setattr(dispatch, "choose", lambda shape, on_cuda: dispatch.Decision("cute", "forced", key, "forced"))
    with pytest.raises(RuntimeError, match="NVVM_ERROR_COMPILATION"):
        dispatch.custom_kernel(data)


def _table_for(caps: Capabilities) -> dispatch.Table:
    big, many = BENCHMARK_SHAPES[0], BENCHMARK_SHAPES[1]
    return dispatch.Table(caps.name, "10.0", {
        dispatch.shape_class(big): {"path": "scaled_mm", "mean_us": {"scaled_mm": 20.0, "cute": 25.0},
                                    "shapes": [list(big)]},
        dispatch.shape_class(many): {"path": "cute", "mean_us": {"scaled_mm": 130.0, "cute": 30.0},
                                     "shapes": [list(many)]},
    })


def test_blackwell_follows_the_measured_table(monkeypatch):
    _pretend(monkeypatch, BLACKWELL)
    dispatch.set_table(_table_for(BLACKWELL))
    big, many, other = BENCHMARK_SHAPES
    d_big = dispatch.choose(big, on_cuda=True)
    assert d_big.path == "scaled_mm" and d_big.source == "table" and "20.0 us" in d_big.reason
    assert dispatch.choose(many, on_cuda=True).path == "cute"
    assert dispatch.choose(other, on_cuda=True).source == "default"  # class not in the table
    with dispatch.force("scaled_mm"):  # forcing still wins over the table
        assert dispatch.choose(many, on_cuda=True).source == "forced"
    # a table of another GPU model is ignored
    dispatch.set_table(_table_for(dataclasses.replace(BLACKWELL, name="NVIDIA GB300")))
    assert dispatch.choose(big, on_cuda=True).source == "default"


def test_table_round_trips_through_json(monkeypatch, tmp_path):
    _pretend(monkeypatch, BLACKWELL)
    path = dispatch.save_table(tmp_path / "table.json", _table_for(BLACKWELL))
    assert json.loads(path.read_text())["device"] == "NVIDIA B200"
    loaded = dispatch.load_table(path)
    assert loaded == _table_for(BLACKWELL) and dispatch.table() == loaded
    _pretend(monkeypatch, HOPPER)
    with pytest.raises(ValueError, match="measured on 'NVIDIA B200'"):
        dispatch.load_table(path)
    assert dispatch.load_table(path, any_device=True).device == "NVIDIA B200"
    path.write_text(path.read_text().replace('"path": "cute"', '"path": "warp_speed"'))
    with pytest.raises(ValueError, match="unknown path 'warp_speed'"):
        dispatch.load_table(path, any_device=True)
    with pytest.raises(ValueError, match="no table"):
        dispatch.set_table(None) or dispatch.save_table(tmp_path / "none.json")


def test_shape_classes():
    assert dispatch.shape_class(Shape(7168, 16384, 1)) == "L1-A2^26"
    assert dispatch.shape_class(Shape(4096, 7168, 8)) == "L8-A2^24"
    assert dispatch.shape_class(Shape(7168, 2048, 4)) == "L4-A2^23"
    assert dispatch.shape_class((128, 256, 1)) == "L1-A2^14"


FEW = StoppingRule(max_calls=3, budget_s=1e9, min_wall_s=1e9)  # exactly 3 timed calls


def test_calibrate_times_checks_and_picks(monkeypatch):
    """On the CPU the timings are wall clock and meaningless, but the logic is the real one."""
    broken = dispatch.GemvPath("broken", "writes zeros", lambda: lambda d: d[6].zero_(), dispatch._anywhere)
    monkeypatch.setitem(dispatch.PATHS, "broken", broken)
    shapes = [Shape(128, 256, 1), Shape(128, 256, 2), Shape(256, 128, 2)]  # the last two: one class
    tab = dispatch.calibrate(shapes, ("scaled_mm", "reference", "broken", "cute"), rule=FEW, warmup_rule=FEW)
    assert tab.device == capabilities().name and dispatch.table() is tab
    assert set(tab.entries) == {"L1-A2^14", "L2-A2^14"}
    assert tab.entries["L2-A2^14"]["shapes"] == [[128, 256, 2], [256, 128, 2]]
    cute_here = dispatch.PATHS["cute"].unavailable(capabilities(), capabilities().cuda) is None
    for entry in tab.entries.values():
        assert set(entry["mean_us"]) == {"scaled_mm", "reference"} | ({"cute"} if cute_here else set())
        assert entry["path"] == min(entry["mean_us"], key=entry["mean_us"].get)
    assert "wrong result" in tab.skipped["broken"]
    if not cute_here:
        assert "cute" in tab.skipped
    with pytest.raises(ValueError, match="unknown path"):
        dispatch.calibrate(shapes, ("nope",))


def test_calibrate_checks_a_clone_against_the_untouched_input(monkeypatch):
    """A path that zeroes A's scales gets zeros right for the inputs it changed: it is judged on the originals."""
    def zero_scales(data):
        data[2].view(torch.uint8).zero_()
        return data[6].zero_()

    monkeypatch.setitem(dispatch.PATHS, "zero_scales", dispatch.GemvPath(
        "zero_scales", "zeroes sfa", lambda: zero_scales, dispatch._anywhere))
    tab = dispatch.calibrate([Shape(128, 256, 1)], ("scaled_mm", "zero_scales"), rule=FEW, warmup_rule=None,
                             install=False)
    assert tab.skipped["zero_scales"].startswith("wrong result at (128, 256, 1)")
    assert set(tab.entries["L1-A2^14"]["mean_us"]) == {"scaled_mm"}


def test_calibrate_ranks_by_the_leaderboards_mean_and_warms_each_path_up_once(monkeypatch):
    """Leaderboard time with the given rules; the mean decides, not the median."""
    calls, built, real_build = [], [], dispatch._build
    samples = {"scaled_mm": [1.0, 1.0, 40.0], "reference": [5.0, 6.0, 7.0]}

    def build(name):
        built.append(name)  # the path whose call is measured next
        return real_build(name)

    def fake_measure(fn, measures, *, rule):
        calls.append((measures, rule))
        return {"leaderboard": summarize("leaderboard", samples[built[-1]])}

    monkeypatch.setattr(dispatch, "_build", build)
    monkeypatch.setattr(dispatch, "measure", fake_measure)
    warm = StoppingRule(max_calls=2, budget_s=1.0)
    shapes = [Shape(128, 256, 1), Shape(256, 128, 1)]
    tab = dispatch.calibrate(shapes, ("scaled_mm", "reference"), rule=FEW, warmup_rule=warm, install=False)
    entry = tab.entries["L1-A2^14"]
    assert entry["mean_us"] == {"scaled_mm": pytest.approx(14.0), "reference": pytest.approx(6.0)}
    assert entry["path"] == "reference", "scaled_mm's median (1.0) is lower, its mean (14.0) is not"
    assert calls == [(("leaderboard",), warm), (("leaderboard",), FEW), (("leaderboard",), warm),
                     (("leaderboard",), FEW), (("leaderboard",), FEW), (("leaderboard",), FEW)]


def test_calibrate_logs_one_line_per_shape_and_path(monkeypatch):
    lines = []
    shapes = [Shape(128, 256, 1), Shape(128, 256, 2)]
    monkeypatch.setattr(dispatch, "capabilities", lambda: CPU)
    dispatch.calibrate(shapes, ("scaled_mm", "cute", "reference"), rule=FEW, warmup_rule=None, install=False,
                       log=lines.append)
    why = dispatch.PATHS["cute"].unavailable(CPU, False)
    assert lines == [
        "timing scaled_mm at 128x256x1 (1/6) ...", f"skipping cute at 128x256x1 (2/6): {why}",
        "timing reference at 128x256x1 (3/6) ...",
        "timing scaled_mm at 128x256x2 (4/6) ...", f"skipping cute at 128x256x2 (5/6): {why}",
        "timing reference at 128x256x2 (6/6) ...",
    ]


# ----------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("shape", TEST_SHAPES + [Shape(128, 64, 8)], ids=lambda s: "x".join(map(str, s)))
def test_custom_kernel_on_gpu_matches_reference(shape):
    data = _fresh(shape, "cuda")
    decision = dispatch.explain(data)
    for _ in range(2):
        poison_(data[6])
        result = check(dispatch.custom_kernel(data), data)
        assert result.ok, f"{decision}: {result.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(dispatch.PATHS))
def test_every_available_path_is_correct_on_gpu(name):
    if dispatch.PATHS[name].unavailable(capabilities(), True):
        pytest.skip(dispatch.PATHS[name].unavailable(capabilities(), True))
    data = _fresh(Shape(512, 1536, 2), "cuda")
    with dispatch.force(name):
        for _ in range(3):
            poison_(data[6])
            result = check(dispatch.custom_kernel(data), data)
            assert result.ok, result.message


@pytest.mark.sm100
@pytest.mark.cute
def test_blackwell_calibration_fills_the_table(tmp_path):
    shapes = [Shape(4096, 7168, 8), Shape(1024, 1024, 1)]
    tab = dispatch.calibrate(shapes, rule=StoppingRule(max_calls=10, budget_s=1.0),
                             warmup_rule=StoppingRule(max_calls=2, budget_s=1.0))
    assert set(tab.entries) == {dispatch.shape_class(s) for s in shapes}
    assert all(set(e["mean_us"]) == {"scaled_mm", "cute"} for e in tab.entries.values())
    data = _fresh(shapes[0], "cuda")
    assert dispatch.explain(data).source == "table"
    result = check(dispatch.custom_kernel(data), data)
    assert result.ok, result.message
    dispatch.set_table(None)
    assert dispatch.load_table(dispatch.save_table(tmp_path / "t.json", tab)) == tab
