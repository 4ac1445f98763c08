"""`custom_kernel(data)`: the fastest correct GEMV path for the machine it runs on.

Which path wins depends on the device and on the shape, so the choice is made per shape, once:

* inputs on the CPU: the exact emulation of the FP4 GEMM (`scaled_mm`, fp32 accumulation like
  the reference's `torch._scaled_mm`, rounded once to fp16);
* Blackwell (``capabilities().fp4_gemm``): `torch._scaled_mm` or the CuTe kernel, per shape
  class, from a table measured on this GPU by `calibrate()` (saved and loaded as JSON). With no
  table the default is the CuTe kernel, reported as "default, not measured";
* another CUDA GPU with the CuTe DSL (Hopper): the CuTe kernel, the only real kernel there
  (cuBLAS has no FP4 GEMM below sm_100);
* CUDA without the CuTe DSL: the emulation, on the GPU.

Apart from the table, each of these is the first path of `FALLBACK_ORDER` that can run here; the
exported one-file submissions try the same order. A chosen path that fails to build (a kernel
that does not compile for this GPU) gives way to the next one, and `explain` says so.

For experiments a path can be forced by name: ``with force("scaled_mm"): ...`` or the
environment variable NVFP4_PATH. `explain(data)` says which path would run and why.

Cost per call: after the first call of a shape, one dictionary lookup keyed by (a.shape,
a.is_cuda) and the path's own call. The first call validates the input and builds the path.
The environment and the table are read when a shape is first seen: after changing NVFP4_PATH
call `reset()` (forcing, calibrating and loading a table reset by themselves).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from nvfp4lib import scaled_mm
from nvfp4lib.bench import BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, StoppingRule, geomean
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.graphs import GraphedGemv
from nvfp4lib.harness import check_bound, measure
from nvfp4lib.problem import BENCHMARK_SHAPES, Shape, generate_input
from nvfp4lib.reference import reference_gemv
from nvfp4lib.streams import StreamPool, run_batches
from nvfp4lib.validate import validate_gemv_input

PATH_ENV_VAR = "NVFP4_PATH"
DEFAULT_NOTE = "default, not measured"
BLACKWELL_DEFAULT = "cute"  # the first of FALLBACK_ORDER; a measured table may say otherwise per shape
CALIBRATION_CANDIDATES = ("scaled_mm", "cute")
POOL_STREAMS = 4  # streams of the "scaled_mm_streams" path


# ---------------------------------------------------------------------------------------------
# The paths


def _reference_into_c(data) -> torch.Tensor:
    """The exact reference, rounded to fp16 and written into c (slow; a yardstick)."""
    c = data[6]
    c.copy_(reference_gemv(data))
    return c


def _cute_reason(caps: Capabilities, on_cuda: bool) -> str | None:
    if not on_cuda or not caps.cuda:
        return "the CuTe kernel needs the inputs on a CUDA GPU"
    if not caps.cute_dsl:
        return "the CuTe DSL is not installed (pip install -e '.[cute]')"
    return None


def _anywhere(caps: Capabilities, on_cuda: bool) -> str | None:
    return None


FALLBACK_ORDER = ("cute", "scaled_mm")
"""The paths in the order they are tried where nothing is forced or measured: `choose` takes the
first that can run here, and the exported submissions (nvfp4lib.submission) try them in this order
too, moving on when a path cannot run, fails its self-check at import or raises on its first call.
"scaled_mm" runs everywhere (cuBLAS FP4 on Blackwell, its exact emulation elsewhere), so it is last."""

_REQUIREMENTS = {"cute": _cute_reason, "scaled_mm": _anywhere}


def why_unavailable(name: str, caps: Capabilities, on_cuda: bool) -> str | None:
    """Why path `name` of FALLBACK_ORDER cannot run on the machine `caps` describes (None: it can)."""
    return _REQUIREMENTS[name](caps, on_cuda)


def fallback_paths(caps: Capabilities, on_cuda: bool, after: str | None = None) -> list[str]:
    """The paths of FALLBACK_ORDER that can run here, best first; with `after`, only those behind it."""
    order = FALLBACK_ORDER[FALLBACK_ORDER.index(after) + 1:] if after is not None else FALLBACK_ORDER
    return [name for name in order if why_unavailable(name, caps, on_cuda) is None]


def _make_cute() -> Callable:
    from nvfp4lib.cute_gemv import CuteGemv

    return CuteGemv("fast")


def _make_scaled_mm_streams() -> Callable:
    pools: dict = {}

    def run(data):
        device = data[0].device
        if device not in pools:
            pools[device] = StreamPool(POOL_STREAMS, device)
        return run_batches(scaled_mm.gemv_scaled_mm_permuted, data, pools[device])

    return run


@dataclass(frozen=True)
class GemvPath:
    name: str
    summary: str
    make: Callable[[], Callable]  # builds the callable once (compiles, creates streams, ...)
    unavailable: Callable[[Capabilities, bool], str | None]  # why it cannot run, or None


PATHS = {p.name: p for p in (
    GemvPath("cute", "CuTe DSL fast kernel, all L batches in one launch", _make_cute, _cute_reason),
    GemvPath("cute_graph", "the CuTe kernel replayed from a CUDA graph (captured per set of tensors)",
             lambda: GraphedGemv(_make_cute()), _cute_reason),
    GemvPath("scaled_mm", "torch._scaled_mm per batch on views of the permuted scales "
             "(cuBLAS FP4 GEMM on Blackwell, its exact emulation elsewhere)",
             lambda: scaled_mm.gemv_scaled_mm_permuted, _anywhere),
    GemvPath("scaled_mm_streams", f"the scaled_mm path with batches spread over {POOL_STREAMS} CUDA streams",
             _make_scaled_mm_streams, _anywhere),
    GemvPath("scaled_mm_graph", "the scaled_mm path replayed from a CUDA graph (captured per set of tensors)",
             lambda: GraphedGemv(scaled_mm.gemv_scaled_mm_permuted), _anywhere),
    GemvPath("reference", "the exact reference, rounded to fp16 (slow)", lambda: _reference_into_c, _anywhere),
)}


def _check_name(name: str, source: str) -> str:
    if name not in PATHS:
        raise ValueError(f"{source}: unknown path {name!r}; expected one of {sorted(PATHS)}")
    return name


# ---------------------------------------------------------------------------------------------
# The measured table


def shape_class(shape) -> str:
    """'L{l}-A2^{e}': the batch count and the bytes of A's codes per batch, to the nearest power
    of two. Shapes of one class move about as many bytes in as many batches, so one path fits."""
    m, k, l = shape
    return f"L{l}-A2^{round(math.log2(m * k // 2))}"


@dataclass
class Table:
    """Measured choices of one GPU model.

    ``entries``: shape class -> {"path": fastest, "mean_us": {path: us}, "shapes": [[m, k, l]]};
    ``skipped``: path -> why it was not timed (not available here, or a wrong result).
    """
    device: str
    sm: str | None
    entries: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"device": self.device, "sm": self.sm, "entries": self.entries,
                           "skipped": self.skipped}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Table":
        raw = json.loads(text)
        for cls_name, entry in raw["entries"].items():
            _check_name(entry["path"], f"table entry {cls_name}")
        return cls(raw["device"], raw.get("sm"), raw["entries"], raw.get("skipped", {}))


_table: Table | None = None
_forced: list[str] = []
_plans: dict = {}  # (a.shape, a.is_cuda) -> callable
_decisions: dict = {}  # same key -> Decision
_built: dict = {}  # path name -> callable, built once


def reset() -> None:
    """Forget every per-shape choice (they are made again, reading NVFP4_PATH and the table)."""
    _plans.clear()
    _decisions.clear()


def table() -> Table | None:
    return _table


def set_table(new: Table | None) -> None:
    global _table
    _table = new
    reset()


def save_table(path, tab: Table | None = None) -> Path:
    tab = tab if tab is not None else _table
    if tab is None:
        raise ValueError("no table to save: run calibrate() or load_table() first")
    path = Path(path)
    path.write_text(tab.to_json() + "\n")
    return path


def load_table(path, *, any_device: bool = False) -> Table:
    """Read a table saved by `save_table` and use it. A table measured on another GPU model is
    refused unless ``any_device`` (its timings say nothing about this one)."""
    tab = Table.from_json(Path(path).read_text())
    here = capabilities().name
    if not any_device and tab.device != here:
        raise ValueError(f"table {path}: measured on {tab.device!r}, this machine is {here!r} "
                         "(pass any_device=True to use it anyway)")
    set_table(tab)
    return tab


# ---------------------------------------------------------------------------------------------
# The decision


@dataclass(frozen=True)
class Decision:
    path: str
    reason: str
    shape_class: str
    source: str  # "forced" | "env" | "table" | "default" | "device" | "fallback" (the first choice failed)

    def __str__(self) -> str:
        return f"{self.path} [{self.shape_class}]: {self.reason}"


def _forced_name() -> tuple[str, str] | None:
    if _forced:
        return _forced[-1], "forced"
    env = os.environ.get(PATH_ENV_VAR, "").strip()
    if env and env != "auto":
        return _check_name(env, PATH_ENV_VAR), "env"
    return None


def choose(shape, *, on_cuda: bool | None = None, caps: Capabilities | None = None,
           tab: Table | None = None) -> Decision:
    """The path for a shape on this machine, or on the one ``caps`` describes (a what-if);
    ``on_cuda`` says where the inputs live (default: on the GPU if there is one)."""
    caps = caps if caps is not None else capabilities()
    on_cuda = caps.cuda if on_cuda is None else on_cuda
    tab = tab if tab is not None else _table
    key = shape_class(shape)
    forced = _forced_name()
    if forced is not None:
        name, source = forced
        how = f"force({name!r})" if source == "forced" else f"{PATH_ENV_VAR}={name}"
        return Decision(name, f"forced by {how}", key, source)
    name = fallback_paths(caps, on_cuda)[0]
    if caps.fp4_gemm and on_cuda and name == BLACKWELL_DEFAULT:
        entry = tab.entries.get(key) if tab is not None and tab.device == caps.name else None
        if entry is not None:
            times = ", ".join(f"{p} {us:.1f} us" for p, us in sorted(entry["mean_us"].items()))
            return Decision(entry["path"], f"measured on {tab.device}: {times}", key, "table")
        return Decision(name, f"{DEFAULT_NOTE}: Blackwell, no measured entry for {key}; the CuTe "
                        "kernel reads the bytes once with hardware FP4 decode, cuBLAS pads the vector to a "
                        "128-column GEMM", key, "default")
    return Decision(name, _device_reason(name, caps, on_cuda), key, "device")


def _device_reason(name: str, caps: Capabilities, on_cuda: bool) -> str:
    """Why `name`, the first path of FALLBACK_ORDER that can run here, suits this machine."""
    if not on_cuda:
        return ("inputs on the CPU: the exact emulation of the FP4 GEMM (fp32 accumulation, one rounding to "
                "fp16), the reference-style path")
    if name == "cute":
        return f"{caps.name}: no FP4 GEMM below sm_100, the CuTe kernel decodes FP4 itself"
    if caps.fp4_gemm:
        return f"Blackwell without the CuTe DSL: cuBLAS FP4 GEMM is the only kernel ({_cute_reason(caps, on_cuda)})"
    return f"{caps.name}: no FP4 GEMM and no CuTe DSL, the exact emulation on the GPU"


def explain(data) -> Decision:
    """Which path `custom_kernel(data)` runs for these inputs, and why."""
    a = data[0]
    return choose(Shape(a.shape[0], 2 * a.shape[1], a.shape[2]), on_cuda=a.is_cuda)


def decisions() -> dict:
    """The choices made so far: (a.shape, on_cuda) -> Decision."""
    return dict(_decisions)


@contextlib.contextmanager
def force(name: str):
    """Run every `custom_kernel` call inside the block on path ``name`` (nests; restores after)."""
    _check_name(name, "force")
    _forced.append(name)
    reset()
    try:
        yield
    finally:
        _forced.pop()
        reset()


def _build(name: str) -> Callable:
    if name not in _built:
        _built[name] = PATHS[name].make()
    return _built[name]


def _plan(data, key) -> Callable:
    on_cuda = data[0].is_cuda
    decision = choose(validate_gemv_input(data), on_cuda=on_cuda)
    why_not = PATHS[decision.path].unavailable(capabilities(), on_cuda)
    if why_not is not None:
        raise RuntimeError(f"path {decision.path!r} ({decision.reason}) cannot run here: {why_not}")
    while True:
        try:
            run = _build(decision.path)
            break
        except Exception as err:  # noqa: BLE001 - e.g. a kernel that does not compile for this GPU
            # a path the user forced is built or fails; a chosen one gives way to the next of FALLBACK_ORDER
            rest = ([] if decision.source in ("forced", "env") or decision.path not in FALLBACK_ORDER
                    else fallback_paths(capabilities(), on_cuda, after=decision.path))
            if not rest:
                raise
            why = f"{decision.path} could not be built ({type(err).__name__}: {err})"
            decision = Decision(rest[0], f"{why}; the next path of FALLBACK_ORDER", decision.shape_class,
                                "fallback")
    _plans[key], _decisions[key] = run, decision
    return run


def custom_kernel(data) -> torch.Tensor:
    """The leaderboard entry point: c = A @ B per batch, written into data[6] and returned."""
    try:
        key = (data[0].shape, data[0].is_cuda)
    except (TypeError, AttributeError, IndexError, KeyError):
        validate_gemv_input(data)  # raises the NVFP4InputError that names what is wrong
        raise
    run = _plans.get(key)
    if run is None:
        run = _plan(data, key)
    return run(data)


# ---------------------------------------------------------------------------------------------
# Calibration


def calibrate(shapes=BENCHMARK_SHAPES, candidates=CALIBRATION_CANDIDATES, *, rule: StoppingRule = BENCHMARK_RULE,
              warmup_rule: StoppingRule | None = BENCHMARK_WARMUP_RULE, seed: int = 0, install: bool = True,
              log: Callable[[str], None] | None = None) -> Table:
    """Time every available candidate on every shape here as the leaderboard times a submission,
    and keep per shape class the fastest one whose result passed the reference check.

    Each (shape, path): one call on a clone of the input, its c poisoned, checked against the
    untouched input (`harness.check_bound`), then leaderboard time of that call until `rule` says
    stop (`harness.measure`); a path's first timing is preceded by a warm-up benchmark under
    `warmup_rule` (None: none), as the leaderboard warms up a submission. Paths are ranked by the
    mean, the leaderboard's figure; several shapes of one class by the geometric mean of their means. `log` receives one line per (shape,
    path), before its work, for progress.

    Runs on whatever device this is (wall clock on a CPU, useful only to test the logic). Graph
    paths may be listed, but they win only when the very same tensors come back call after call
    (a new set of tensors means a new capture, milliseconds), so they are not candidates by default.
    """
    for name in candidates:
        _check_name(name, "candidates")
    say = log or (lambda line: None)
    caps = capabilities()
    device = "cuda" if caps.cuda else "cpu"
    tab = Table(caps.name, f"{caps.sm[0]}.{caps.sm[1]}" if caps.sm else None)
    timed: dict = {}  # class -> {path: [mean us per shape]}
    warmed: set = set()
    shapes = [Shape._make(s) for s in shapes]
    total = len(shapes) * len(candidates)
    for i, s in enumerate(shapes):
        key = shape_class(s)
        entry = tab.entries.setdefault(key, {"path": None, "mean_us": {}, "shapes": []})
        entry["shapes"].append(list(s))
        where = f"{s.m}x{s.k}x{s.l}"
        # unsigned scales, as NVFP4 has them: cuBLAS's FP4 GEMM reads its block scales as UE4M3
        data = generate_input(*s, seed=seed, device=device, negative_scales=False)
        for j, name in enumerate(candidates):
            step = f"({i * len(candidates) + j + 1}/{total})"
            why_not = PATHS[name].unavailable(caps, device == "cuda")
            if why_not is None:
                say(f"timing {name} at {where} {step} ...")
                fn = _build(name)
                result, call = check_bound(lambda given: lambda: fn(given), data)
                why_not = None if result.ok else f"wrong result at {tuple(s)}: {result.message.splitlines()[0]}"
            else:
                say(f"skipping {name} at {where} {step}: {why_not}")
            if why_not is not None:
                tab.skipped[name] = why_not
                continue
            if warmup_rule is not None and name not in warmed:
                measure(call, ("leaderboard",), rule=warmup_rule)
                warmed.add(name)
            t = measure(call, ("leaderboard",), rule=rule)["leaderboard"]
            timed.setdefault(key, {}).setdefault(name, []).append(t.mean_us)
    for key, entry in list(tab.entries.items()):
        n = len(entry["shapes"])
        # a path that failed or was skipped at any shape of the class is out of the running there
        geo = {p: geomean(v) for p, v in timed.get(key, {}).items() if len(v) == n}
        if not geo:
            del tab.entries[key]
            continue
        entry["mean_us"] = geo
        entry["path"] = min(geo, key=geo.get)
    if install:
        set_table(tab)
    return tab
