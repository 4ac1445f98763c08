"""`custom_kernel(data)`: the fastest correct GEMV path for the machine it runs on.

Which path wins depends on the device and on the shape, so the choice is made per shape, once:

* inputs on the CPU: the exact emulation of the FP4 GEMM (``scaled_mm_permuted``, fp32
  accumulation like the reference's `torch._scaled_mm`, rounded once to fp16);
* Blackwell (``capabilities().fp4_gemm``): `torch._scaled_mm` or the CuTe kernel, per shape
  class, from a table measured on this GPU (`nvfp4lib.bench.calibration.calibrate`, saved and loaded
  as JSON). With no table the default is the CuTe kernel, reported as "default, not measured";
* another CUDA GPU with the CuTe DSL (Hopper): the CuTe kernel, the only real kernel there
  (cuBLAS has no FP4 GEMM below sm_100);
* CUDA without the CuTe DSL: the emulation, on the GPU.

Apart from the table, each of these is the first path of `paths.FALLBACK_ORDER` that can run here;
the exported one-file submissions try the same order. A chosen path that fails to build (a kernel
that does not compile for this GPU) gives way to the next one, and `explain` says so.

For experiments a path can be forced by name: ``with force("scaled_mm_permuted"): ...`` or the
environment variable NVFP4_PATH. `explain(data)` says which path would run and why.

The module-level functions are the methods of one `Dispatcher`, `DISPATCHER`; make another for
an independent set of choices. Cost per call: after the first call of a shape, one dictionary
lookup keyed by (a.shape, a.is_cuda) and the path's own call, which validates its input (the
dispatcher reads only a's shape). The environment and the table are read when a shape is first
seen: after changing NVFP4_PATH call `reset()` (forcing and setting a table reset by themselves).
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

from nvfp4lib.contract import first_tensor, shape_of
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.locations import DISPATCH_TABLE
from nvfp4lib.messages import describe_error
from nvfp4lib.paths import FALLBACK_ORDER, PATHS, check_name, cute_unavailable, fallback_paths

PATH_ENV_VAR = "NVFP4_PATH"
DEFAULT_NOTE = "default, not measured"
BLACKWELL_DEFAULT = FALLBACK_ORDER[0]  # a measured table may say otherwise per shape


def shape_class(shape) -> str:
    """'L{l}-A2^{e}': the batch count and the bytes of A's codes per batch, to the nearest power
    of two. Shapes of one class move about as many bytes in as many batches, so one path fits."""
    m, k, l = shape
    return f"L{l}-A2^{round(math.log2(m * k // 2))}"


@dataclass
class Table:
    """Measured choices of one GPU model (made by `nvfp4lib.bench.calibration.calibrate`).

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
            check_name(entry["path"], f"table entry {cls_name}")
        return cls(raw["device"], raw.get("sm"), raw["entries"], raw.get("skipped", {}))


@dataclass(frozen=True)
class Decision:
    path: str
    reason: str
    shape_class: str
    source: str  # "forced" | "env" | "table" | "default" | "device" | "fallback" (the first choice failed)

    def __str__(self) -> str:
        return f"{self.path} [{self.shape_class}]: {self.reason}"


def _device_reason(name: str, caps: Capabilities, on_cuda: bool) -> str:
    """Why `name`, the first path of FALLBACK_ORDER that can run here, suits this machine."""
    if not on_cuda:
        return ("inputs on the CPU: the exact emulation of the FP4 GEMM (fp32 accumulation, one rounding to "
                "fp16), the reference-style path")
    if name == BLACKWELL_DEFAULT:
        return f"{caps.name}: no FP4 GEMM below sm_100, the CuTe kernel decodes FP4 itself"
    if caps.fp4_gemm:
        return f"Blackwell without the CuTe DSL: cuBLAS FP4 GEMM is the only kernel ({cute_unavailable(caps, on_cuda)})"
    return f"{caps.name}: no FP4 GEMM and no CuTe DSL, the exact emulation on the GPU"


class Dispatcher:
    """Per-shape choices of GEMV path, the paths built for them, and what forces or informs them.

    Calling it runs the GEMV (`custom_kernel`). `table` is a measured `Table` (or None); `force`
    and NVFP4_PATH override everything; `explain` and `decisions` say what was chosen and why.
    """

    def __init__(self, table: Table | None = None):
        self._table = table
        self._forced: list[str] = []
        self._plans: dict = {}  # (a.shape, a.is_cuda) -> callable
        self._decisions: dict = {}  # same key -> Decision
        self._built: dict = {}  # path name -> callable, built once

    # -- the measured table

    def reset(self) -> None:
        """Forget every per-shape choice (they are made again, reading NVFP4_PATH and the table)."""
        self._plans.clear()
        self._decisions.clear()

    def table(self) -> Table | None:
        return self._table

    def set_table(self, new: Table | None) -> None:
        self._table = new
        self.reset()

    def save_table(self, path=DISPATCH_TABLE, tab: Table | None = None) -> Path:
        """Write the table (this dispatcher's, or `tab`) as JSON to `path`, its folder created if need be."""
        tab = tab if tab is not None else self._table
        if tab is None:
            raise ValueError("no table to save: run calibration.calibrate() or load_table() first")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tab.to_json() + "\n")
        return path

    def load_table(self, path=DISPATCH_TABLE, *, any_device: bool = False) -> Table:
        """Read a table saved by `save_table` and use it. A table measured on another GPU model is
        refused unless ``any_device`` (its timings say nothing about this one)."""
        tab = Table.from_json(Path(path).read_text())
        here = capabilities().name
        if not any_device and tab.device != here:
            raise ValueError(f"table {path}: measured on {tab.device!r}, this machine is {here!r} "
                             "(pass any_device=True to use it anyway)")
        self.set_table(tab)
        return tab

    # -- the decision

    def _forced_name(self) -> tuple[str, str] | None:
        if self._forced:
            return self._forced[-1], "forced"
        env = os.environ.get(PATH_ENV_VAR, "").strip()
        if env and env != "auto":
            return check_name(env, PATH_ENV_VAR), "env"
        return None

    def choose(self, shape, *, on_cuda: bool | None = None, caps: Capabilities | None = None,
               tab: Table | None = None) -> Decision:
        """The path for a shape on this machine, or on the one ``caps`` describes (a what-if);
        ``on_cuda`` says where the inputs live (default: on the GPU if there is one)."""
        caps = caps if caps is not None else capabilities()
        on_cuda = caps.cuda if on_cuda is None else on_cuda
        tab = tab if tab is not None else self._table
        key = shape_class(shape)
        forced = self._forced_name()
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

    def explain(self, data) -> Decision:
        """Which path `custom_kernel(data)` runs for these inputs, and why."""
        return self.choose(shape_of(data), on_cuda=first_tensor(data).is_cuda)

    def decisions(self) -> dict:
        """The choices made so far: (a.shape, on_cuda) -> Decision."""
        return dict(self._decisions)

    @contextlib.contextmanager
    def force(self, name: str):
        """Run every call inside the block on path ``name`` (nests; restores after)."""
        check_name(name, "force")
        self._forced.append(name)
        self.reset()
        try:
            yield
        finally:
            self._forced.pop()
            self.reset()

    # -- running

    def build(self, name: str) -> Callable:
        """Path `name`'s callable, built once per dispatcher."""
        if name not in self._built:
            self._built[name] = PATHS[name].build()
        return self._built[name]

    def _plan(self, data, key) -> Callable:
        on_cuda = key[1]
        decision = self.choose(shape_of(data), on_cuda=on_cuda)
        why_not = PATHS[decision.path].unavailable(capabilities(), on_cuda)
        if why_not is not None:
            raise RuntimeError(f"path {decision.path!r} ({decision.reason}) cannot run here: {why_not}")
        while True:
            try:
                run = self.build(decision.path)
                break
            except Exception as err:  # noqa: BLE001 - e.g. a kernel that does not compile for this GPU
                # a path the user forced is built or fails; a chosen one gives way to the next of FALLBACK_ORDER
                rest = ([] if decision.source in ("forced", "env") or decision.path not in FALLBACK_ORDER
                        else fallback_paths(capabilities(), on_cuda, after=decision.path))
                if not rest:
                    raise
                why = f"{decision.path} could not be built ({describe_error(err, 400)})"
                decision = Decision(rest[0], f"{why}; the next path of FALLBACK_ORDER", decision.shape_class,
                                    "fallback")
        self._plans[key], self._decisions[key] = run, decision
        return run

    def __call__(self, data) -> torch.Tensor:
        """c = A @ B per batch, written into the c of `data` and returned."""
        a = first_tensor(data)
        key = (a.shape, a.is_cuda)
        run = self._plans.get(key)
        if run is None:
            run = self._plan(data, key)
        return run(data)


DISPATCHER = Dispatcher()
"""The dispatcher behind the module-level functions."""


def custom_kernel(data) -> torch.Tensor:
    """The leaderboard entry point: c = A @ B per batch, written into c (the last tensor) and returned."""
    return DISPATCHER(data)


reset = DISPATCHER.reset
table = DISPATCHER.table
set_table = DISPATCHER.set_table
save_table = DISPATCHER.save_table
load_table = DISPATCHER.load_table
choose = DISPATCHER.choose
explain = DISPATCHER.explain
decisions = DISPATCHER.decisions
force = DISPATCHER.force
