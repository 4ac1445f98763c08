"""The registry of paths and the dispatcher: the path chosen per device and shape, reported with its
reason; forcing; the measured table and its calibration. Other machines are simulated by replacing
capabilities(), without kernels."""
import ast
import asyncio
import dataclasses
import inspect
import json
import logging
import os
import re
import sys
import threading

import pytest
import torch

from nvfp4lib import contract, dispatch, fallback, paths, scaled_mm
from nvfp4lib.bench import calibration
from nvfp4lib.bench.peers import all_paths
from nvfp4lib.leaderboard import export
from nvfp4lib.bench.timing import StoppingRule, summarize
from nvfp4lib.contract import NAMES, NVFP4InputError, Shape
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.layouts import to_permuted
from nvfp4lib.problem import BENCHMARK_SHAPES, TEST_SHAPES, generate_input
from nvfp4lib.reference import check, poison_

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
    poison_(data.c)
    return data


def _pretend(monkeypatch, caps: Capabilities) -> None:
    monkeypatch.setattr(dispatch, "capabilities", lambda: caps)


# ----------------------------------------------------------------------------------- CPU


def test_cpu_inputs_take_the_emulation_and_say_why():
    data = _fresh(Shape(256, 512, 2))
    decision = dispatch.explain(data)
    assert decision.path == "scaled_mm_permuted" and decision.source == "device"
    assert "CPU" in decision.reason and "emulation" in decision.reason
    assert decision.shape_class == dispatch.shape_class((256, 512, 2))
    assert str(decision).startswith("scaled_mm_permuted [")


@pytest.mark.parametrize("shape", TEST_SHAPES[:3] + [Shape(512, 1536, 2), Shape(256, 512, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_custom_kernel_on_cpu_matches_reference(shape):
    data = _fresh(shape)
    out = dispatch.custom_kernel(data)
    assert out is data.c
    result = check(out, data)
    assert result.ok, result.message
    assert dispatch.decisions()[(data.a.shape, False)].path == "scaled_mm_permuted"


@pytest.mark.parametrize("bad", [None, {}, (), (1, 2, 3, 4, 5, 6, 7)])
def test_malformed_input_gets_the_validators_error(bad):
    with pytest.raises(NVFP4InputError, match="^data: expected a 7-tuple|^a: expected a torch.Tensor"):
        dispatch.custom_kernel(bad)


def test_choice_is_made_once_per_shape(monkeypatch):
    made = []
    real = dispatch.DISPATCHER._plan
    monkeypatch.setattr(dispatch.DISPATCHER, "_plan", lambda data, key: made.append(key) or real(data, key))
    for _ in range(3):
        dispatch.custom_kernel(_fresh(Shape(128, 256, 1)))
    dispatch.custom_kernel(_fresh(Shape(128, 512, 1)))
    assert len(made) == 2


# Every path of the package that runs on inputs in host memory here.
CPU_PATHS = [name for name, path in paths.PATHS.items() if path.unavailable(capabilities(), False) is None]


def test_the_paths_built_on_pytorch_alone_run_on_the_cpu():
    assert {"reference", "scaled_mm_reference", "scaled_mm_permuted", "scaled_mm_transposed", "scaled_mm_streams",
            "scaled_mm_graph"} <= set(CPU_PATHS)


@pytest.mark.parametrize("name", CPU_PATHS)
def test_force_runs_the_named_path_correctly(name):
    data = _fresh(Shape(256, 512, 3))
    with dispatch.force(name):
        decision = dispatch.explain(data)
        assert decision.path == name and decision.source == "forced"
        assert f"force('{name}')" in decision.reason
        for _ in range(2):  # the streams path warms up on its first call, then uses the pool
            poison_(data.c)
            result = check(dispatch.custom_kernel(data), data)
            assert result.ok, result.message
    assert dispatch.explain(data).path == "scaled_mm_permuted"  # restored after the block


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
    with dispatch.force("cute_fast"), pytest.raises(RuntimeError, match="cannot run here: .*CUDA"):
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
    assert dispatch.explain(data).path == "scaled_mm_permuted"


# --------------------------------------------------------------- simulated other machines


def test_hopper_takes_the_cute_kernel(monkeypatch):
    _pretend(monkeypatch, HOPPER)
    decision = dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=True)
    assert decision.path == "cute_fast" and decision.source == "device"
    assert "sm_100" in decision.reason
    assert dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=False).path == "scaled_mm_permuted"


def test_gpu_without_cute_dsl_takes_the_emulation_on_the_gpu(monkeypatch):
    _pretend(monkeypatch, dataclasses.replace(HOPPER, cute_dsl=False, cute_dsl_version=None))
    decision = dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=True)
    assert decision.path == "scaled_mm_permuted" and "emulation on the GPU" in decision.reason


def test_blackwell_without_table_reports_the_default(monkeypatch):
    _pretend(monkeypatch, BLACKWELL)
    for shape in BENCHMARK_SHAPES:
        decision = dispatch.choose(shape, on_cuda=True)
        assert decision.path == dispatch.BLACKWELL_DEFAULT and decision.source == "default"
        assert dispatch.DEFAULT_NOTE in decision.reason
    no_dsl = dataclasses.replace(BLACKWELL, cute_dsl=False, cute_dsl_version=None)
    assert dispatch.choose(BENCHMARK_SHAPES[0], on_cuda=True, caps=no_dsl).path == "scaled_mm_permuted"


@pytest.mark.parametrize("caps", [CPU, HOPPER, BLACKWELL, dataclasses.replace(HOPPER, cute_dsl=False),
                                  dataclasses.replace(BLACKWELL, cute_dsl=False)],
                         ids=["cpu", "hopper", "blackwell", "hopper-no-dsl", "blackwell-no-dsl"])
def test_without_a_table_the_choice_is_the_first_runnable_path_of_the_fallback_order(caps):
    for on_cuda in (False, True) if caps.cuda else (False,):
        decision = dispatch.choose(BENCHMARK_SHAPES[1], on_cuda=on_cuda, caps=caps)
        runnable = [p for p in paths.FALLBACK_ORDER if paths.PATHS[p].unavailable(caps, on_cuda) is None]
        assert decision.path == runnable[0] == paths.fallback_paths(caps, on_cuda)[0]
        assert paths.fallback_paths(caps, on_cuda, after=runnable[0]) == runnable[1:]
    assert paths.FALLBACK_ORDER[-1] == "scaled_mm_permuted"
    assert paths.PATHS["scaled_mm_permuted"].unavailable(caps, False) is None


def test_a_chosen_path_that_fails_to_build_gives_way_to_the_next(monkeypatch):
    """The CuTe kernel chosen (as on a GPU) but not compiling: the next path of FALLBACK_ORDER runs, and
    the decision says why; a forced path is not replaced. Fresh dispatchers build the patched path."""
    def no_compile():
        raise RuntimeError("NVVM_ERROR_COMPILATION")

    monkeypatch.setitem(paths.PATHS, "cute_fast", dataclasses.replace(paths.PATHS["cute_fast"], build=no_compile,
                                                                       unavailable=paths.runs_anywhere))
    key = dispatch.shape_class((256, 512, 2))
    chosen = dispatch.Dispatcher()
    monkeypatch.setattr(chosen, "_choose", lambda *args: dispatch.Decision("cute_fast", "chosen", key, "device"))
    data = _fresh(Shape(256, 512, 2))
    result = check(chosen(data), data)
    assert result.ok, result.message
    decision = chosen.decisions()[(data.a.shape, False)]
    assert decision.path == "scaled_mm_permuted" and decision.source == "fallback"
    assert decision.reason == ("cute_fast could not be built (RuntimeError: NVVM_ERROR_COMPILATION); "
                               "the next path of FALLBACK_ORDER")
    assert chosen.explain(data) == decision, "explain says what the call did"
    forced = dispatch.Dispatcher()
    monkeypatch.setattr(forced, "_choose", lambda *args: dispatch.Decision("cute_fast", "forced", key, "forced"))
    with pytest.raises(RuntimeError, match="NVVM_ERROR_COMPILATION"):
        forced(data)


class _RefusesK:
    """A kernel that is right (the emulation) and, like the CuTe runner, refuses a K it cannot hold."""

    def __init__(self, refused_k: int):
        self.refused_k = refused_k

    def refusal(self, k: int) -> str | None:
        return f"a: expected K <= 256 for the whole-K kernel, got K = {k}" if k == self.refused_k else None

    def __call__(self, data):
        return scaled_mm.gemv_scaled_mm_permuted(data)


def test_a_path_that_refuses_the_shapes_k_gives_way_to_the_next_for_that_shape_only(monkeypatch):
    """The per-K kernel refuses a K it cannot hold (naming a): that shape runs the next path of FALLBACK_ORDER;
    another K still runs the first path, which passed its self-check."""
    kernel = _RefusesK(512)
    monkeypatch.setitem(paths.PATHS, "cute_fast", dataclasses.replace(paths.PATHS["cute_fast"], build=lambda: kernel,
                                                                       unavailable=paths.runs_anywhere))
    mine = dispatch.Dispatcher()
    monkeypatch.setattr(mine, "_choose", lambda shape, *args: dispatch.Decision("cute_fast", "chosen",
                                                                                 dispatch.shape_class(shape), "device"))
    refused, taken = _fresh(Shape(128, 512, 1)), _fresh(Shape(128, 256, 1))
    for data in (refused, taken):
        assert check(mine(data), data).ok
    decision = mine.decisions()[(refused.a.shape, False)]
    assert decision.path == "scaled_mm_permuted" and decision.source == "fallback"
    assert decision.reason == ("cute_fast cannot run here (a: expected K <= 256 for the whole-K kernel, got K = 512); "
                               "the next path of FALLBACK_ORDER")
    assert mine.decisions()[(taken.a.shape, False)].path == "cute_fast"


def _table_for(caps: Capabilities) -> dispatch.Table:
    big, many = BENCHMARK_SHAPES[0], BENCHMARK_SHAPES[1]
    return dispatch.Table(caps.name, "10.0", {
        dispatch.shape_class(big): {"path": "scaled_mm_permuted",
                                    "mean_us": {"scaled_mm_permuted": 20.0, "cute_fast": 25.0}, "shapes": [list(big)]},
        dispatch.shape_class(many): {"path": "cute_fast", "mean_us": {"scaled_mm_permuted": 130.0, "cute_fast": 30.0},
                                     "shapes": [list(many)]},
    })


def test_blackwell_follows_the_measured_table(monkeypatch):
    _pretend(monkeypatch, BLACKWELL)
    dispatch.set_table(_table_for(BLACKWELL))
    big, many, other = BENCHMARK_SHAPES
    d_big = dispatch.choose(big, on_cuda=True)
    assert d_big.path == "scaled_mm_permuted" and d_big.source == "table" and "20.0 us" in d_big.reason
    assert dispatch.choose(many, on_cuda=True).path == "cute_fast"
    assert dispatch.choose(other, on_cuda=True).source == "default"  # class not in the table
    with dispatch.force("scaled_mm_permuted"):  # forcing still wins over the table
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
    text = path.read_text()
    assert '"path": "cute_fast"' in text
    path.write_text(text.replace('"path": "cute_fast"', '"path": "warp_speed"'))
    with pytest.raises(ValueError, match="unknown path 'warp_speed'"):
        dispatch.load_table(path, any_device=True)
    path.write_text(text.replace('"path": "cute_fast"', '"path": "cute"'))  # a name of the old scheme
    with pytest.raises(ValueError, match="unknown path 'cute'"):
        dispatch.load_table(path, any_device=True)
    with pytest.raises(ValueError, match="no table"):
        dispatch.set_table(None) or dispatch.save_table(tmp_path / "none.json")


def test_shape_classes():
    assert dispatch.shape_class(Shape(7168, 16384, 1)) == "L1-A2^26"
    assert dispatch.shape_class(Shape(4096, 7168, 8)) == "L8-A2^24"
    assert dispatch.shape_class(Shape(7168, 2048, 4)) == "L4-A2^23"
    assert dispatch.shape_class((128, 256, 1)) == "L1-A2^14"


# ------------------------------------------------------------------------------- the registry of paths

# The name prefixes of each kind of path: the family comes first in every name.
FAMILIES = {"nvfp4lib": ("cute_", "scaled_mm_"), "peer": ("peer_", "triton_"), "yardstick": ("reference",)}
EVERY_PATH = all_paths()  # the package's paths and the peers: one naming scheme
MACHINES = {"cpu": CPU, "hopper": HOPPER, "blackwell": BLACKWELL,
            "hopper-no-dsl": dataclasses.replace(HOPPER, cute_dsl=False, cute_dsl_version=None),
            "blackwell-no-dsl": dataclasses.replace(BLACKWELL, cute_dsl=False, cute_dsl_version=None)}


def test_every_path_has_a_label_and_a_summary():
    assert paths.PATHS
    for name, path in EVERY_PATH.items():
        assert path.name == name
        assert path.kind in FAMILIES, f"{name}: kind {path.kind!r}"
        assert isinstance(path.label, str) and path.label.strip(), f"{name}: no label"
        assert isinstance(path.summary, str) and path.summary.strip(), f"{name}: no summary"
    labels = [path.label for path in EVERY_PATH.values()]
    assert len(set(labels)) == len(labels), "tables and legends tell the paths apart by their labels"


def test_path_names_follow_one_scheme():
    """Lowercase words joined by "_", the family first: one spelling in every tool."""
    for name, path in EVERY_PATH.items():
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name), f"{name!r} is not lowercase words joined by _"
        assert name.startswith(FAMILIES[path.kind]), f"{name!r} ({path.kind}) starts with none of {FAMILIES[path.kind]}"


@pytest.mark.parametrize("caps", MACHINES.values(), ids=MACHINES.keys())
def test_the_last_path_of_the_fallback_order_runs_anywhere(caps):
    assert set(paths.FALLBACK_ORDER) <= set(paths.PATHS)
    assert dispatch.BLACKWELL_DEFAULT == paths.FALLBACK_ORDER[0]
    last = paths.FALLBACK_ORDER[-1]
    for on_cuda in (False, True) if caps.cuda else (False,):
        assert paths.PATHS[last].unavailable(caps, on_cuda) is None
        assert paths.fallback_paths(caps, on_cuda)[-1] == last, "there is always a path to run"


def test_every_exportable_path_can_be_exported():
    exportable = {name for name, path in paths.PATHS.items() if path.exportable}
    assert {"cute_fast", "scaled_mm_permuted"} <= exportable
    assert exportable <= set(export.EXPORTS)
    assert set(export.EXPORTS) - exportable == {export.HYBRID}


def test_the_dispatcher_runs_the_package_paths_only():
    """The peers are benchmark yardsticks registered in the bench wing: not something to force."""
    with pytest.raises(ValueError, match="force: unknown path 'peer_eager'"):
        with dispatch.force("peer_eager"):
            pass


@pytest.mark.parametrize("name", ["cute", "scaled_mm", "cute_graph", "cute-fast", "peer-bf16", "fastest"])
def test_an_unknown_name_is_refused_with_the_list_of_paths(name):
    assert paths.check_name("cute_fast", "--only") == "cute_fast"
    with pytest.raises(ValueError) as refused:
        paths.check_name(name, "--only")
    message = str(refused.value)
    assert message.startswith(f"--only: unknown path {name!r}; expected one of ")
    assert message.split("expected one of ", 1)[1].split(", ") == list(paths.PATHS)


# ------------------------------------------------------------------------------- the Dispatcher object


def test_two_dispatchers_keep_their_own_choices_forces_and_tables():
    first, second = dispatch.Dispatcher(), dispatch.Dispatcher()
    tab = _table_for(BLACKWELL)
    first.set_table(tab)
    assert first.table() is tab and second.table() is None and dispatch.table() is None
    data = _fresh(Shape(256, 512, 2))
    key = (data.a.shape, False)
    with first.force("reference"):
        assert first.explain(data).path == "reference"
        assert second.explain(data).path == dispatch.explain(data).path == "scaled_mm_permuted"
        for run in (first, second):
            poison_(data.c)
            result = check(run(data), data)
            assert result.ok, result.message
        assert first.decisions()[key].path == "reference"
        assert second.decisions()[key].path == "scaled_mm_permuted"
        assert dispatch.decisions()[key].path == "scaled_mm_permuted", "explain planned it, unforced"
    assert not first.decisions(), "leaving force() forgets that dispatcher's choices"
    assert second.decisions()[key].path == "scaled_mm_permuted", "... and only that dispatcher's"
    assert first.build("scaled_mm_graph") is first.build("scaled_mm_graph"), "built once per dispatcher"
    assert first.build("scaled_mm_graph") is not second.build("scaled_mm_graph"), "each builds its own"


def test_the_module_functions_are_the_default_dispatchers_methods():
    for name in ("reset", "table", "set_table", "save_table", "load_table", "choose", "explain", "decisions",
                 "force"):
        function = getattr(dispatch, name)
        assert function.__self__ is dispatch.DISPATCHER, name
        assert function.__func__ is getattr(dispatch.Dispatcher, name), name
    tab = _table_for(BLACKWELL)
    dispatch.set_table(tab)
    assert dispatch.DISPATCHER.table() is tab
    data = _fresh(Shape(128, 256, 2))
    key = (data.a.shape, False)
    with dispatch.force("reference"):
        assert dispatch.DISPATCHER.choose(Shape(128, 256, 2)).path == "reference"
        dispatch.custom_kernel(data)
        assert dispatch.DISPATCHER.decisions()[key].path == "reference"
    poison_(data.c)
    result = check(dispatch.custom_kernel(data), data)
    assert result.ok, result.message
    assert dispatch.DISPATCHER.decisions()[key].path == "scaled_mm_permuted"
    dispatch.reset()
    assert dispatch.DISPATCHER.decisions() == {}


def test_the_dispatcher_leaves_validation_to_the_chosen_path(monkeypatch):
    """One validation per call, the chosen path's: the dispatcher reads only a's shape. Every module
    that imported validate_gemv_input by name gets the counting one."""
    real = contract.validate_gemv_input
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if (name == "nvfp4lib" or name.startswith("nvfp4lib.")) and getattr(module, "validate_gemv_input",
                                                                              None) is real:
            monkeypatch.setattr(module, "validate_gemv_input", counting)
    data = _fresh(Shape(384, 192, 2))
    out = dispatch.Dispatcher()(data)  # the first call: it chooses, builds and self-checks the path, then runs it
    on_data = [args for args in calls if args[0] is data]
    assert len(on_data) == 1, f"validated {len(on_data)} times"
    result = check(out, data)
    assert result.ok, result.message
    used = {node.id for node in ast.walk(ast.parse(inspect.getsource(dispatch))) if isinstance(node, ast.Name)}
    assert "validate_gemv_input" not in used | set(vars(dispatch))


def _with(data, **changes):
    """The 7 tensors as a plain tuple, some replaced by name."""
    return tuple(changes.get(name, t) for name, t in zip(NAMES, data))


MALFORMED = {
    "six-tensors": (lambda d: tuple(d)[:6], r"data: expected a 7-tuple .*got tuple of length 6"),
    "a-not-a-tensor": (lambda d: _with(d, a=[[1]]), r"^a: expected a torch\.Tensor, got list"),
    "b-not-a-tensor": (lambda d: _with(d, b=None), r"b: expected a torch\.Tensor, got NoneType"),
    "sfa-float32": (lambda d: _with(d, sfa=d.sfa.float()),
                    r"sfa: expected dtype torch\.float8_e4m3fn, got torch\.float32"),
    "c-wrong-shape": (lambda d: _with(d, c=torch.empty(256, 2, 2, dtype=torch.float16)),
                      r"c: expected shape \(256, 1, 2\), got \(256, 2, 2\)"),
}


@pytest.mark.parametrize("make, match", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_tuple_is_refused_naming_the_argument(make, match):
    """Through custom_kernel, before and after its shape is planned: the chosen path's check names it."""
    data = _fresh(Shape(256, 128, 2))
    for _ in range(2):
        with pytest.raises(NVFP4InputError, match=match):
            dispatch.custom_kernel(make(data))
        dispatch.custom_kernel(data)  # the shape is planned now


# ----------------------------------------------- what holds per thread and task, and at the moment of the call


def test_force_in_one_thread_leaves_other_threads_alone():
    """A force() block open in one thread: another thread's calls take the unforced path, and run."""
    entered, done = threading.Event(), threading.Event()
    seen = {}

    def forcing():
        with dispatch.force("cute_fast"):  # cannot run on these CPU inputs: a call here would raise
            seen["inside"] = dispatch.choose(Shape(128, 256, 1), on_cuda=False).path
            entered.set()
            done.wait(30)

    thread = threading.Thread(target=forcing)
    thread.start()
    assert entered.wait(30)
    try:
        data = _fresh(Shape(128, 256, 1))
        result = check(dispatch.custom_kernel(data), data)
        assert result.ok, result.message
        assert dispatch.explain(data).path == "scaled_mm_permuted" and dispatch.explain(data).source == "device"
    finally:
        done.set()
        thread.join(30)
    assert seen["inside"] == "cute_fast"


def test_nested_force_blocks_in_two_threads_keep_their_own_names():
    """Thread A enters force("reference"), B enters force("scaled_mm_graph") and then nests
    force("scaled_mm_reference"), A leaves first: each thread sees its own innermost name throughout."""
    step = threading.Barrier(2, timeout=30)
    seen = {"a": [], "b": []}
    here = lambda: dispatch.choose(Shape(128, 256, 1), on_cuda=False).path  # noqa: E731

    def a():
        with dispatch.force("reference"):
            step.wait()  # 1: both inside their first block
            step.wait()  # 2: B nested its second block
            seen["a"].append(here())
        step.wait()  # 3: A has left
        seen["a"].append(here())
        step.wait()  # 4

    def b():
        with dispatch.force("scaled_mm_graph"):
            step.wait()  # 1
            with dispatch.force("scaled_mm_reference"):
                step.wait()  # 2
                step.wait()  # 3
                seen["b"].append(here())
            seen["b"].append(here())
        seen["b"].append(here())
        step.wait()  # 4

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {"a": ["reference", "scaled_mm_permuted"],
                    "b": ["scaled_mm_reference", "scaled_mm_graph", "scaled_mm_permuted"]}
    assert here() == "scaled_mm_permuted"


def test_force_holds_per_asyncio_task():
    async def forced(started: asyncio.Event, release: asyncio.Event):
        with dispatch.force("reference"):
            started.set()
            await release.wait()
            return dispatch.choose(Shape(128, 256, 1), on_cuda=False).path

    async def main():
        started, release = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(forced(started, release))
        await started.wait()
        other = await asyncio.create_task(asyncio.sleep(0, dispatch.choose(Shape(128, 256, 1), on_cuda=False).path))
        release.set()
        return await task, other

    assert asyncio.run(main()) == ("reference", "scaled_mm_permuted")


def _counting_paths(monkeypatch, *names):
    """Replace registry paths by correct ones that count their calls: name -> list of call shapes."""
    counts = {}
    for name in names:
        counts[name] = []

        def run(data, calls=counts[name]):
            calls.append(data.a.shape)
            return scaled_mm.gemv_scaled_mm_permuted(data)

        monkeypatch.setitem(paths.PATHS, name, dataclasses.replace(paths.PATHS[name], build=lambda run=run: run,
                                                                    unavailable=paths.runs_anywhere))
    return counts


def test_explain_and_custom_kernel_follow_nvfp4_path_as_it_is_at_each_call(monkeypatch):
    """No reset() needed: after NVFP4_PATH changes, explain names the path the next call runs, and it runs."""
    counts = _counting_paths(monkeypatch, "scaled_mm_reference", "scaled_mm_transposed")
    mine = dispatch.Dispatcher()
    data = _fresh(Shape(128, 256, 1))
    for name in ("scaled_mm_reference", "scaled_mm_transposed", "scaled_mm_reference"):
        monkeypatch.setenv(dispatch.PATH_ENV_VAR, name)
        assert mine.explain(data).path == name and mine.explain(data).source == "env"
        before = len(counts[name])
        poison_(data.c)
        assert check(mine(data), data).ok
        assert len(counts[name]) == before + 1, f"{name} did not run"
    monkeypatch.delenv(dispatch.PATH_ENV_VAR)
    assert mine.explain(data).path == "scaled_mm_permuted"
    assert mine.decisions()[(data.a.shape, False)].path == "scaled_mm_permuted"


def test_explain_reports_the_fallback_the_call_takes(monkeypatch):
    """The chosen path fails its self-check: explain (before any call) and the call agree on the next path."""
    def wrong(data):
        return data.c.zero_()

    monkeypatch.setitem(paths.PATHS, "cute_fast", dataclasses.replace(paths.PATHS["cute_fast"], build=lambda: wrong,
                                                                       unavailable=paths.runs_anywhere))
    mine = dispatch.Dispatcher()
    key = dispatch.shape_class((128, 256, 1))
    monkeypatch.setattr(mine, "_choose", lambda *args: dispatch.Decision("cute_fast", "chosen", key, "device"))
    data = _fresh(Shape(128, 256, 1))
    decision = mine.explain(data)
    assert decision.path == "scaled_mm_permuted" and decision.source == "fallback"
    assert decision.reason.startswith("cute_fast failed its self-check (wrong result at (m, k, l) = (128, 256, 2)")
    assert check(mine(data), data).ok and mine.decisions()[(data.a.shape, False)] == decision


def test_a_self_check_failure_is_sticky_and_logged_once(monkeypatch, caplog):
    built, checked = [], []
    real_check = fallback.self_check

    def wrong(data):
        return data.c.zero_()

    def build():
        built.append(1)
        return wrong

    monkeypatch.setitem(paths.PATHS, "cute_fast", dataclasses.replace(paths.PATHS["cute_fast"], build=build,
                                                                       unavailable=paths.runs_anywhere))
    monkeypatch.setattr(fallback, "self_check", lambda kernel, device: checked.append(kernel) or real_check(kernel,
                                                                                                            device))
    mine = dispatch.Dispatcher()
    monkeypatch.setattr(mine, "_choose", lambda shape, *args: dispatch.Decision(
        "cute_fast", "chosen", dispatch.shape_class(shape), "device"))
    with caplog.at_level(logging.INFO, logger="nvfp4lib.fallback"):
        for shape in (Shape(128, 256, 1), Shape(256, 512, 2), Shape(128, 256, 1)):
            data = _fresh(shape)
            assert check(mine(data), data).ok
            assert mine.explain(data).source == "fallback"
    assert len(built) == 1 and len(checked) == 2, "cute_fast built and checked once, scaled_mm_permuted checked once"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].getMessage().startswith("cute_fast failed its self-check (wrong result")
    assert warnings[0].getMessage().endswith("; using scaled_mm_permuted")


def test_an_input_error_on_the_first_call_discards_nothing():
    """c requiring grad, a wrong dtype: the caller gets the error naming the argument, the path stays."""
    mine = dispatch.Dispatcher()
    data = _fresh(Shape(128, 256, 1))
    grad_c = data.c.clone().requires_grad_()
    with pytest.raises(NVFP4InputError, match=r"^scaled_mm GEMV input: c: expected a tensor that does not require "
                                              r"grad"):
        mine(data._replace(c=grad_c))
    with pytest.raises(NVFP4InputError, match=r"c: expected dtype torch\.float16, got torch\.float32"):
        mine(data._replace(c=data.c.float()))
    assert check(mine(data), data).ok
    assert mine.decisions()[(data.a.shape, False)].path == "scaled_mm_permuted"


def test_the_first_call_of_a_shape_is_refused_while_a_cuda_graph_is_captured(monkeypatch):
    """Planning builds and self-checks: it cannot be captured (simulated: the capture flag alone)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    data = _fresh(Shape(128, 256, 1))
    with pytest.raises(RuntimeError, match="cannot be done while a CUDA graph is being captured; call it once"):
        dispatch.Dispatcher()._plan(data, (data.a.shape, True, None, None))


def _disagreeing_scales(shape=Shape(256, 512, 2)):
    """A valid tuple whose sfa_permuted holds another scale than sfa at (row 130, block 5, batch 1)."""
    data = _fresh(shape)
    sfa = data.sfa.clone()
    sfa.view(torch.uint8)[130, 5, 1] = 0x38 if int(data.sfa.view(torch.uint8)[130, 5, 1]) != 0x38 else 0x40
    return data._replace(sfa_permuted=to_permuted(sfa))


def test_disagreeing_scale_copies_are_answered_silently_by_default_and_refused_when_asked(monkeypatch):
    data = _disagreeing_scales()
    out = dispatch.Dispatcher()(data)  # default: off (a full read of the scales)
    assert not check(out, data).ok, "the permuted copy answered, the reference read the plain one"
    match = (r"^sfa_permuted: expected the same scales as sfa, but 1 of 16384 differ; first at \(row 130, scale block 5, "
             r"batch 1\)")
    with pytest.raises(NVFP4InputError, match=match):
        dispatch.Dispatcher(check_scales=True)(data)
    monkeypatch.setenv(dispatch.CHECK_SCALES_ENV_VAR, "1")
    with pytest.raises(NVFP4InputError, match=match):
        dispatch.custom_kernel(data)
    assert not check(dispatch.Dispatcher(check_scales=False)(data), data).ok  # False wins over the variable
    monkeypatch.setenv(dispatch.CHECK_SCALES_ENV_VAR, "yes")
    with pytest.raises(ValueError, match=r"^NVFP4_CHECK_SCALES: expected 0 or 1, got 'yes'"):
        dispatch.custom_kernel(data)
    monkeypatch.setenv(dispatch.CHECK_SCALES_ENV_VAR, "0")
    fine = _fresh(Shape(256, 512, 2))
    assert check(dispatch.Dispatcher(check_scales=True)(fine), fine).ok
    with pytest.raises(ValueError, match=r"^check_scales: expected True, False or None"):
        dispatch.Dispatcher(check_scales="yes")


class _CountedEnviron(dict):
    """os.environ as a dict that counts the reads of each variable."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reads: dict = {}

    def get(self, key, default=None):
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().get(key, default)


def test_a_call_reads_each_variable_once_and_sees_a_change(monkeypatch):
    environ = _CountedEnviron(os.environ)
    monkeypatch.setattr(os, "environ", environ)
    data, mine = _disagreeing_scales(), dispatch.Dispatcher()
    mine(data)  # plans the shape
    environ.reads.clear()
    mine(data)
    assert environ.reads == {dispatch.PATH_ENV_VAR: 1, dispatch.CHECK_SCALES_ENV_VAR: 1}
    environ[dispatch.CHECK_SCALES_ENV_VAR] = "1"
    with pytest.raises(NVFP4InputError, match=r"^sfa_permuted: expected the same scales as sfa"):
        mine(data)
    environ[dispatch.PATH_ENV_VAR] = "reference"
    with pytest.raises(NVFP4InputError, match=r"^sfa_permuted: expected the same scales as sfa"):
        mine(data)
    del environ[dispatch.CHECK_SCALES_ENV_VAR]
    poison_(data.c)
    assert check(mine(data), data).ok and mine.explain(data).path == "reference"  # the plain scales'
    environ.reads.clear()
    mine.run_validated(data)  # its scale copies agree by construction: NVFP4_CHECK_SCALES is not read
    assert environ.reads == {dispatch.PATH_ENV_VAR: 1}


def test_run_validated_runs_the_calls_path_unchecked_and_remembers_nothing(monkeypatch):
    """The op's entry: the path of __call__, no scale check even where asked for, the path's own check skipped."""
    data = _fresh(Shape(256, 512, 2))
    mine = dispatch.Dispatcher(check_scales=True)
    assert check(mine(data), data).ok  # plans the shape, checks the scales and the tuple
    validated = []
    monkeypatch.setattr(scaled_mm, "validate_gemv_input", lambda *args, **kwargs: validated.append(1))
    monkeypatch.setattr(dispatch, "check_scale_copies", lambda data: validated.append(2))
    again = data._replace(c=data.c.clone())  # a new tuple, as the op makes
    poison_(again.c)
    assert mine.run_validated(again) is again.c and check(again.c, data).ok
    assert validated == [] and mine.explain(again).path == "scaled_mm_permuted"
    assert all(again.c is not t for kept, _ in scaled_mm._prepared._entries.values() for t in kept)


# ----------------------------------------------------------------------------------- calibration

FEW = StoppingRule(max_calls=3, budget_s=1e9, min_wall_s=1e9)  # exactly 3 timed calls


def _fake_path(name: str, summary: str, fn) -> paths.GemvPath:
    return paths.GemvPath(name, name.replace("_", " "), summary, lambda: fn, paths.runs_anywhere)


def test_calibrate_times_checks_and_picks(monkeypatch):
    """On the CPU the timings are wall clock and meaningless, but the logic is the real one."""
    def zeros(data):
        *_, c = data
        return c.zero_()

    monkeypatch.setitem(paths.PATHS, "broken", _fake_path("broken", "writes zeros", zeros))
    shapes = [Shape(128, 256, 1), Shape(128, 256, 2), Shape(256, 128, 2)]  # the last two: one class
    mine = dispatch.Dispatcher()
    tab = calibration.calibrate(shapes, ("scaled_mm_permuted", "reference", "broken", "cute_fast"), rule=FEW,
                                warmup_rule=FEW, install=mine)
    assert tab.device == capabilities().name and mine.table() is tab
    assert dispatch.table() is None, "set on the dispatcher it was given only"
    assert set(tab.entries) == {"L1-A2^14", "L2-A2^14"}
    assert tab.entries["L2-A2^14"]["shapes"] == [[128, 256, 2], [256, 128, 2]]
    cute_here = paths.PATHS["cute_fast"].unavailable(capabilities(), capabilities().cuda) is None
    for entry in tab.entries.values():
        assert set(entry["mean_us"]) == {"scaled_mm_permuted", "reference"} | ({"cute_fast"} if cute_here else set())
        assert entry["path"] == min(entry["mean_us"], key=entry["mean_us"].get)
    assert "wrong result" in tab.skipped["broken"]
    if not cute_here:
        assert "cute_fast" in tab.skipped
    with pytest.raises(ValueError, match="unknown path 'nope'"):
        calibration.calibrate(shapes, ("nope",))
    with pytest.raises(ValueError, match="unknown path 'scaled_mm'"):  # a name of the old scheme
        calibration.calibrate(shapes, ("scaled_mm",))


def test_calibrate_sets_the_table_of_the_default_dispatcher():
    tab = calibration.calibrate([Shape(128, 256, 1)], ("scaled_mm_permuted",), rule=FEW, warmup_rule=None)
    assert dispatch.table() is tab and dispatch.DISPATCHER.table() is tab
    assert tab.entries["L1-A2^14"]["path"] == "scaled_mm_permuted"


def test_calibrate_without_install_sets_no_table(monkeypatch):
    """install=None: the table is returned, DISPATCHER's is the one it had, and DISPATCHER builds nothing."""
    before = _table_for(BLACKWELL)
    dispatch.set_table(before)
    monkeypatch.setattr(dispatch.DISPATCHER, "build", lambda name: pytest.fail(f"DISPATCHER built {name}"))
    tab = calibration.calibrate([Shape(128, 256, 1)], ("scaled_mm_permuted", "reference"), rule=FEW,
                                warmup_rule=None, install=None)
    assert dispatch.table() is before
    assert set(tab.entries["L1-A2^14"]["mean_us"]) == {"scaled_mm_permuted", "reference"}


def test_calibrate_checks_a_clone_against_the_untouched_input(monkeypatch):
    """A path that zeroes A's scales gets zeros right for the inputs it changed: it is judged on the originals."""
    def zero_scales(data):
        _, _, sfa, _, _, _, c = data
        sfa.view(torch.uint8).zero_()
        return c.zero_()

    monkeypatch.setitem(paths.PATHS, "zero_scales", _fake_path("zero_scales", "zeroes sfa, then c", zero_scales))
    tab = calibration.calibrate([Shape(128, 256, 1)], ("scaled_mm_permuted", "zero_scales"), rule=FEW,
                                warmup_rule=None, install=None)
    assert tab.skipped["zero_scales"].startswith("wrong result at (128, 256, 1)")
    assert set(tab.entries["L1-A2^14"]["mean_us"]) == {"scaled_mm_permuted"}


def test_calibrate_ranks_by_the_leaderboards_mean_and_warms_each_path_up_once(monkeypatch):
    """Leaderboard time with the given rules; the mean decides, not the median."""
    calls, built = [], []
    samples = {"scaled_mm_permuted": [1.0, 1.0, 40.0], "reference": [5.0, 6.0, 7.0]}
    mine = dispatch.Dispatcher()
    real_build = mine.build

    def build(name):
        built.append(name)  # the path whose call is measured next
        return real_build(name)

    def fake_measure(fn, measures, *, rule):
        calls.append((measures, rule))
        return {"leaderboard": summarize("leaderboard", samples[built[-1]])}

    monkeypatch.setattr(mine, "build", build)
    monkeypatch.setattr(calibration, "measure", fake_measure)
    warm = StoppingRule(max_calls=2, budget_s=1.0)
    shapes = [Shape(128, 256, 1), Shape(256, 128, 1)]
    tab = calibration.calibrate(shapes, ("scaled_mm_permuted", "reference"), rule=FEW, warmup_rule=warm,
                                install=mine)
    entry = tab.entries["L1-A2^14"]
    assert entry["mean_us"] == {"scaled_mm_permuted": pytest.approx(14.0), "reference": pytest.approx(6.0)}
    assert entry["path"] == "reference", "scaled_mm_permuted's median (1.0) is lower, its mean (14.0) is not"
    assert calls == [(("leaderboard",), warm), (("leaderboard",), FEW), (("leaderboard",), warm),
                     (("leaderboard",), FEW), (("leaderboard",), FEW), (("leaderboard",), FEW)]


def test_calibrate_logs_one_line_per_shape_and_path(monkeypatch):
    lines = []
    shapes = [Shape(128, 256, 1), Shape(128, 256, 2)]
    monkeypatch.setattr(calibration, "capabilities", lambda: CPU)
    calibration.calibrate(shapes, ("scaled_mm_permuted", "cute_fast", "reference"), rule=FEW, warmup_rule=None,
                          install=None, log=lines.append)
    why = paths.PATHS["cute_fast"].unavailable(CPU, False)
    assert lines == [
        "timing scaled_mm_permuted at 128x256x1 (1/6) ...", f"skipping cute_fast at 128x256x1 (2/6): {why}",
        "timing reference at 128x256x1 (3/6) ...",
        "timing scaled_mm_permuted at 128x256x2 (4/6) ...", f"skipping cute_fast at 128x256x2 (5/6): {why}",
        "timing reference at 128x256x2 (6/6) ...",
    ]


# ----------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("shape", TEST_SHAPES + [Shape(128, 64, 8)], ids=lambda s: "x".join(map(str, s)))
def test_custom_kernel_on_gpu_matches_reference(shape):
    data = _fresh(shape, "cuda")
    decision = dispatch.explain(data)
    for _ in range(2):
        poison_(data.c)
        result = check(dispatch.custom_kernel(data), data)
        assert result.ok, f"{decision}: {result.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(paths.PATHS))
def test_every_available_path_is_correct_on_gpu(name):
    if paths.PATHS[name].unavailable(capabilities(), True):
        pytest.skip(paths.PATHS[name].unavailable(capabilities(), True))
    data = _fresh(Shape(512, 1536, 2), "cuda")
    with dispatch.force(name):
        for _ in range(3):
            poison_(data.c)
            result = check(dispatch.custom_kernel(data), data)
            assert result.ok, result.message


@pytest.mark.sm100
@pytest.mark.cute
def test_blackwell_calibration_fills_the_table(tmp_path):
    shapes = [Shape(4096, 7168, 8), Shape(1024, 1024, 1)]
    tab = calibration.calibrate(shapes, rule=StoppingRule(max_calls=10, budget_s=1.0),
                                warmup_rule=StoppingRule(max_calls=2, budget_s=1.0))
    assert set(tab.entries) == {dispatch.shape_class(s) for s in shapes}
    assert all(set(e["mean_us"]) == {"scaled_mm_permuted", "cute_fast"} for e in tab.entries.values())
    data = _fresh(shapes[0], "cuda")
    assert dispatch.explain(data).source == "table"
    result = check(dispatch.custom_kernel(data), data)
    assert result.ok, result.message
    dispatch.set_table(None)
    assert dispatch.load_table(dispatch.save_table(tmp_path / "t.json", tab)) == tab
