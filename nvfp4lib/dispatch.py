"""`custom_kernel(data)`: the fastest correct GEMV path for the machine it runs on.

Which path wins depends on the device and on the shape, so the choice is made per shape, once:

* inputs on the CPU: the emulation of the FP4 GEMM (``scaled_mm_permuted``: fp32 sums like cuBLAS,
  not exact where large products cancel, `scaled_mm.emulated_scaled_mm_fp4`; path "reference" is);
* Blackwell (``capabilities().fp4_gemm``): `torch._scaled_mm` or the CuTe kernel, per shape
  class, from a table measured on this GPU (`nvfp4lib.bench.calibration.calibrate`, saved and loaded
  as JSON). With no table the default is the CuTe kernel, reported as "default, not measured";
* another CUDA GPU with the CuTe DSL (Hopper): the CuTe kernel, the only real kernel there
  (cuBLAS has no FP4 GEMM below sm_100);
* CUDA without the CuTe DSL: the emulation, on the GPU.

Apart from the table, each is the first path of `paths.FALLBACK_ORDER` that can run here, builds, passes
the self-check (`fallback.first_working`, as in the exported files) and takes the shape's K (the per-K CuTe
kernel refuses a K it cannot hold, and the next path runs that shape). A path that fails it is never used again
by this dispatcher; a later call that raises (an input a path refuses) changes nothing. `explain` and
`decisions` say what and why. For experiments a path can be forced by name
(``with force("scaled_mm_permuted"): ...`` or the environment variable NVFP4_PATH): built as it is, with no
self-check and no fallback. With ``check_scales`` (`Dispatcher`) every call first checks that the two copies
of the scales agree (`layouts.check_scale_copies`).

The module-level functions are the methods of one `Dispatcher`, `DISPATCHER`; make another for an independent
set of choices. Cost per call: after the first call of a shape, a context-variable read, one or two
lookups in the environment (NVFP4_PATH on every call; NVFP4_CHECK_SCALES too when the dispatcher leaves the
scale check to it, as the default does, and the call is handed both copies of the scales: not the op's),
one dictionary lookup keyed by (a.shape, a.is_cuda, what forces a path) and the path's own call, which
validates its input (`Dispatcher.run_validated`: for a tuple its caller validated, the op's). The first call
of a shape builds and self-checks a path: make it before capturing a CUDA graph."""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from nvfp4lib.caches import validated_once
from nvfp4lib.contract import first_tensor, shape_of
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.fallback import PassedOver, first_working, judged
from nvfp4lib.layouts import check_scale_copies
from nvfp4lib.locations import DISPATCH_TABLE
from nvfp4lib.paths import FALLBACK_ORDER, PATHS, check_name, cute_unavailable, fallback_paths

PATH_ENV_VAR = "NVFP4_PATH"
CHECK_SCALES_ENV_VAR = "NVFP4_CHECK_SCALES"
DEFAULT_NOTE = "default, not measured"
BLACKWELL_DEFAULT = FALLBACK_ORDER[0]  # a measured table may say otherwise per shape


def shape_class(shape) -> str:
    """'L{l}-A2^{e}': the batch count and the bytes of A's codes per batch, to the nearest power
    of two. Shapes of one class move about as many bytes in as many batches, so one path fits."""
    m, k, l = shape
    return f"L{l}-A2^{round(math.log2(m * k // 2))}"


@dataclass
class Table:
    """Measured choices of one GPU model (made by `nvfp4lib.bench.calibration.calibrate`). ``entries``: shape
    class -> {"path": fastest, "mean_us": {path: us}, "shapes": [[m, k, l]]}; ``skipped``: path -> why it was
    not timed (not available here, or a wrong result)."""
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
        return ("inputs on the CPU: the emulation of the FP4 GEMM (exact products summed in fp32 like cuBLAS, "
                "then rounded to fp16; not exact where large products cancel), the reference-style path")
    if name == BLACKWELL_DEFAULT:
        return f"{caps.name}: no FP4 GEMM below sm_100, the CuTe kernel decodes FP4 itself"
    if caps.fp4_gemm:
        return f"Blackwell without the CuTe DSL: cuBLAS FP4 GEMM is the only kernel ({cute_unavailable(caps, on_cuda)})"
    return (f"{caps.name}: no FP4 GEMM and no CuTe DSL, the emulation on the GPU (exact products summed in fp32, "
            "like cuBLAS)")


def _env_check_scales(value: str | None) -> bool:
    """NVFP4_CHECK_SCALES: "1" on, "0" or unset off; anything else is refused, not read as off."""
    value = (value or "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"{CHECK_SCALES_ENV_VAR}: expected 0 or 1, got {value!r}")


class Dispatcher:
    """Per-shape choices of GEMV path, the paths built for them, and what forces or informs them. Calling it
    runs the GEMV (`custom_kernel`). `table` is a measured `Table` (or None). ``check_scales``: check the plain
    scales against the permuted ones on every call (True), never (False), or as NVFP4_CHECK_SCALES says at each
    call (None)."""

    def __init__(self, table: Table | None = None, *, check_scales: bool | None = None):
        if not (check_scales is None or isinstance(check_scales, bool)):
            raise ValueError(f"check_scales: expected True, False or None (NVFP4_CHECK_SCALES decides), "
                             f"got {check_scales!r}")
        self._table = table
        self.check_scales = check_scales
        # the names force() pushed, per thread and asyncio task (a tuple: each context sees its own)
        self._forced: contextvars.ContextVar = contextvars.ContextVar(f"nvfp4lib_forced_{id(self)}", default=())
        self._plans: dict = {}  # (a.shape, a.is_cuda, forced name, NVFP4_PATH) -> callable
        self._decisions: dict = {}  # same key -> Decision
        self._built: dict = {}  # path name -> callable, built once
        self._checked: dict = {}  # device -> {path name: None (passed its self-check) or why it failed}
        self._lock = threading.RLock()  # planning builds kernels: one thread at a time

    # -- the measured table

    def reset(self) -> None:
        """Forget every per-shape choice (they are made again at the next call). What was built and
        each path's self-check verdict are kept: a path that failed it stays passed over."""
        with self._lock:
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

    def _overrides(self) -> tuple[str | None, str | None]:
        """What may force a path, read now: the innermost force() of this thread or task, NVFP4_PATH."""
        forced = self._forced.get()
        return (forced[-1] if forced else None), os.environ.get(PATH_ENV_VAR)

    def choose(self, shape, *, on_cuda: bool | None = None, caps: Capabilities | None = None,
               tab: Table | None = None) -> Decision:
        """The path for a shape on this machine, or on the one ``caps`` describes (a what-if);
        ``on_cuda`` says where the inputs live (default: on the GPU if there is one). What the
        first choice is, before `first_working` builds and checks it (`explain` says what runs)."""
        return self._choose(shape, on_cuda, caps, tab, self._overrides())

    def _choose(self, shape, on_cuda, caps, tab, overrides) -> Decision:
        caps = caps if caps is not None else capabilities()
        on_cuda = caps.cuda if on_cuda is None else on_cuda
        tab = tab if tab is not None else self._table
        key = shape_class(shape)
        forced, env = overrides[0], (overrides[1] or "").strip()
        if forced is not None:
            return Decision(forced, f"forced by force({forced!r})", key, "forced")
        if env and env != "auto":
            return Decision(check_name(env, PATH_ENV_VAR), f"forced by {PATH_ENV_VAR}={env}", key, "env")
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
        """Which path `custom_kernel(data)` runs for these inputs now, and why: the call's own plan
        (made here if the call has not made it yet, building and checking the path as the call would)."""
        return self._decisions[self._planned(data)[2]]

    def decisions(self) -> dict:
        """The choices made so far under the forcing in effect now: (a.shape, on_cuda) -> Decision."""
        now = self._overrides()
        return {(shape, on_cuda): decision for (shape, on_cuda, *overrides), decision in list(self._decisions.items())
                if tuple(overrides) == now}

    @contextlib.contextmanager
    def force(self, name: str):
        """Run every call inside the block on path ``name``: in this thread and asyncio task only
        (other threads and tasks keep their own choice), nested blocks innermost first."""
        check_name(name, "force")
        token = self._forced.set(self._forced.get() + (name,))
        try:
            yield
        finally:
            self._forced.reset(token)

    # -- running

    def build(self, name: str) -> Callable:
        """Path `name`'s callable, built once per dispatcher."""
        with self._lock:
            if name not in self._built:
                self._built[name] = PATHS[name].build()
            return self._built[name]

    def _plan(self, data, key) -> Callable:
        with self._lock:
            if key in self._plans:  # another thread planned it meanwhile
                return self._plans[key]
            a, on_cuda = first_tensor(data), key[1]
            if on_cuda and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("custom_kernel: the first call of a shape chooses, builds and self-checks its path, "
                                   "which cannot be done while a CUDA graph is being captured; call it once before "
                                   "capturing")
            caps = capabilities()
            shape = shape_of(data)
            decision = self._choose(shape, on_cuda, None, None, key[2:])
            if decision.source in ("forced", "env"):  # built as it is, or the build's error
                why_not = PATHS[decision.path].unavailable(caps, on_cuda)
                if why_not is not None:
                    raise RuntimeError(f"path {decision.path!r} ({decision.reason}) cannot run here: {why_not}")
                run = self.build(decision.path)
            else:
                run, decision = self._first_working(decision, caps, on_cuda, a.device, shape.k)
            self._plans[key], self._decisions[key] = run, decision
            return run

    def _first_working(self, decision: Decision, caps: Capabilities, on_cuda: bool, device,
                       k: int) -> tuple[Callable, Decision]:
        """The chosen path, or the first of FALLBACK_ORDER behind it, that builds, passes its self-check and
        takes this K (`fallback.first_working`)."""
        after = decision.path if decision.path in FALLBACK_ORDER else None
        candidates = [decision.path] + [p for p in fallback_paths(caps, on_cuda, after=after) if p != decision.path]
        checked = self._checked.setdefault(str(device), {})

        def judge(name: str, build, where) -> tuple:
            """`fallback.judged` once per path and device, then whether the kernel takes this K (the CuTe
            kernels' `refusal`: a path of this machine, not of this K)."""
            if name not in checked:
                checked[name] = judged(name, build, where)[1]
            if checked[name] is not None:
                return None, checked[name]
            kernel = build(name)  # built once per dispatcher
            refused = kernel.refusal(k) if hasattr(kernel, "refusal") else None
            return (kernel, None) if refused is None else (None, PassedOver(name, "cannot run", refused))

        recalled = tuple(verdict for verdict in checked.values() if verdict is not None)
        choice = first_working(candidates, self.build, device, judge=judge, recalled=recalled,
                               unavailable=lambda name: PATHS[name].unavailable(caps, on_cuda))
        why = "; ".join(str(item) for item in choice.passed_over)
        if choice.name is None:
            raise RuntimeError(f"no GEMV path passed its self-check on {device}: {why}")
        if choice.name != decision.path:
            decision = Decision(choice.name, f"{why}; the next path of FALLBACK_ORDER", decision.shape_class,
                                "fallback")
        return choice.kernel, decision

    def _planned(self, data, scales_may_differ: bool = False) -> tuple[Callable, bool, tuple]:
        """(the path planned for `data`, made now if need be; whether to check its scale copies; the plan's
        key): the one place a call reads the environment, NVFP4_PATH and, where it decides, NVFP4_CHECK_SCALES."""
        a = first_tensor(data)
        key = (a.shape, a.is_cuda, *self._overrides())
        check = scales_may_differ and (self.check_scales if self.check_scales is not None
                                       else _env_check_scales(os.environ.get(CHECK_SCALES_ENV_VAR)))
        run = self._plans.get(key)
        return (run if run is not None else self._plan(data, key)), check, key

    def __call__(self, data) -> torch.Tensor:
        """c = A @ B per batch, written into the c of `data` and returned."""
        run, check, _ = self._planned(data, scales_may_differ=True)
        if check:
            check_scale_copies(data)
        return run(data)

    def run_validated(self, data) -> torch.Tensor:
        """`__call__` for a 7-tuple its caller validated and made for this call alone, the plain scales
        derived from the permuted ones (the op's): the same path, run without the scale check (the copies
        agree), its own validation skipped where it can be, remembered by no cache (`caches.validated_once`)."""
        run, _, _ = self._planned(data)
        with validated_once():
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
