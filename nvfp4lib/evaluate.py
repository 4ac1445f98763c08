"""A local leaderboard: check and time a one-file submission the way the leaderboard does.

``python -m nvfp4lib.evaluate submission.py [--mode test|benchmark|both]``

The file is loaded as the leaderboard loads it: into a fresh module, with a stand-in ``task``
module for ``from task import input_t, output_t``, and without nvfp4lib (the leaderboard machine
does not have it, so an import of it from the file fails here too). Test mode runs the test
shapes on the leaderboard's own data and on full-range data (nvfp4lib.problem.generate_input),
with the output poisoned first so an element left unwritten shows up, and then feeds new inputs
twice (the same tensors overwritten in place, then new tensors) so a result cached from an
earlier call is caught. Every output is compared with nvfp4lib.reference at rtol = atol = 1e-3.
Benchmark mode times the benchmark shapes one call at a time with the L2 flushed
(bench.time_leaderboard), against this device's copy bandwidth and, on a B200, the speed of light.

Without CUDA, test mode runs `CPU_TEST_SHAPES` (the test shapes of at most 2^20 elements of A,
so that a CPU run takes seconds) and timing is skipped.
"""

from __future__ import annotations

import argparse
import builtins
import functools
import importlib.util
import itertools
import json
import subprocess
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from nvfp4lib.bench import Timing, copy_bandwidth_gbps, gbps, geomean, percent, text_table, time_leaderboard
from nvfp4lib.device import capabilities
from nvfp4lib.problem import (B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, TEST_SHAPES, Shape, bytes_moved,
                              generate_input)
from nvfp4lib.reference import check, poison_

PACKAGE = "nvfp4lib"
DIRECTIVE = "#!POPCORN leaderboard nvfp4_gemv"
MODES = ("test", "benchmark", "both")
CPU_MAX_ELEMENTS = 1 << 20  # M * K * L of the test shapes run without CUDA
CPU_TEST_SHAPES = [s for s in TEST_SHAPES if s.m * s.k * s.l <= CPU_MAX_ELEMENTS]
CASES = ("leaderboard data", "full-range data", "same tensors, new values", "new tensors")
RTOL = ATOL = 1e-3
_DETAILED_FAILURES = 3  # failures printed in full at the end; the rest by their first line

_loaded = itertools.count()


class SubmissionError(RuntimeError):
    """The file cannot be loaded as a submission (the message says why)."""


# ---------------------------------------------------------------------------------------------
# Loading


TASK_SOURCE = '''"""Stand-in for the leaderboard's task module: the type aliases a submission imports."""
import torch

input_t = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
output_t = torch.Tensor
'''


def task_module() -> types.ModuleType:
    task = types.ModuleType("task")
    exec(TASK_SOURCE, task.__dict__)
    return task


def _without_package() -> dict:
    """Builtins whose ``__import__`` refuses nvfp4lib: every import statement of the submission
    (at import time and inside its functions) goes through it, even though the evaluator itself
    has nvfp4lib loaded."""
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == PACKAGE or name.startswith(PACKAGE + ".")):
            raise ModuleNotFoundError(
                f"No module named {name!r}: the leaderboard machine does not have {PACKAGE}; export the "
                f"submission with `python -m {PACKAGE}.submission`, which inlines the code it needs", name=name)
        return real_import(name, globals, locals, fromlist, level)

    table = dict(vars(builtins))
    table["__import__"] = guarded_import
    return table


def has_directive(source: str) -> bool:
    """Whether the leading comment lines include the leaderboard directive."""
    for line in source.splitlines():
        if line.strip() == DIRECTIVE:
            return True
        if line.strip() and not line.lstrip().startswith("#"):
            return False
    return False


def load_submission(path) -> types.ModuleType:
    """Import the file as a fresh module without access to nvfp4lib; it must define custom_kernel."""
    path = Path(path)
    if not path.is_file():
        raise SubmissionError(f"{path}: no such file")
    name = f"leaderboard_submission_{next(_loaded)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = _without_package()
    sys.modules.setdefault("task", task_module())
    sys.modules[name] = module  # dataclasses and the CuTe DSL look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - whatever it is, the file does not load
        del sys.modules[name]
        raise SubmissionError(f"{path}: importing it failed: {type(err).__name__}: {err}") from err
    if not callable(getattr(module, "custom_kernel", None)):
        raise SubmissionError(f"{path}: defines no function custom_kernel(data)")
    return module


# A fresh interpreter in which nvfp4lib cannot be imported (a finder ahead of all others refuses
# it, whatever sys.path or an installed copy says), started in an empty folder so that no file
# next to the submission can be imported either.
_ISOLATED = '''
import importlib.abc, importlib.util, json, sys, types

class HidePackage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == PACKAGE:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

PACKAGE, TASK_SOURCE, paths, expression = json.loads(sys.argv[1])
sys.meta_path.insert(0, HidePackage())  # first, so that no installed copy is found
task = sys.modules["task"] = types.ModuleType("task")
exec(TASK_SOURCE, task.__dict__)
results = {}
for i, path in enumerate(paths):
    try:
        spec = importlib.util.spec_from_file_location(f"submission_{i}", path)
        submission = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(submission)
        results[path] = [True, str(eval(expression, {"submission": submission}))]
    except Exception as err:
        results[path] = [False, f"{type(err).__name__}: {err}"]
print(json.dumps(results))
'''


def import_isolated(paths, expression: str = "submission.custom_kernel.__name__", timeout: int = 600):
    """Import each file in one fresh interpreter where nvfp4lib does not exist, and evaluate
    `expression` there with the module bound to `submission` -> {path: (ok, value or error)}.

    Stricter than `load_submission` (which blocks import statements only): nothing of nvfp4lib is
    loaded at all, as on the leaderboard machine."""
    paths = [str(Path(p).resolve()) for p in paths]
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run([sys.executable, "-c", _ISOLATED, json.dumps([PACKAGE, TASK_SOURCE, paths, expression])],
                              capture_output=True, text=True, cwd=empty, timeout=timeout)
    if proc.returncode != 0:
        raise SubmissionError(f"the isolated interpreter failed: {proc.stderr.strip()[-2000:]}")
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {path: tuple(results[path]) for path in paths}


# ---------------------------------------------------------------------------------------------
# Test mode


@dataclass
class CaseResult:
    shape: Shape
    case: str
    ok: bool
    message: str

    def line(self) -> str:
        first = self.message.splitlines()[0] if self.message else ""
        return f"{'PASS' if self.ok else 'FAIL'}  {_shape(self.shape):<13} {self.case:<25} {first}"


def _shape(shape: Shape) -> str:
    return "x".join(map(str, shape))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(kernel: Callable, data, shape: Shape, case: str, earlier=()):
    """One call on poisoned output, checked against the reference -> (CaseResult, output copy).

    `earlier` are outputs of earlier calls on other inputs: an output equal to one of them is
    reported as stale (a result cached across calls)."""
    device = data[0].device
    poison_(data[6])
    try:
        out = kernel(data)
        _sync(device)
    except Exception as err:  # noqa: BLE001 - reported as this case's failure
        return CaseResult(shape, case, False, f"raised {type(err).__name__}: {err}"), None
    if not isinstance(out, torch.Tensor):
        return CaseResult(shape, case, False, f"returned {type(out).__name__}, expected the tensor c"), None
    if out.dtype != torch.float16:
        return CaseResult(shape, case, False, f"returned dtype {out.dtype}, expected torch.float16 (as c)"), None
    result = check(out, data, rtol=RTOL, atol=ATOL)
    copy = out.detach().float()  # a new tensor (the dtype is float16 here)
    if result.ok:
        return CaseResult(shape, case, True, result.message), copy
    n_nan = int(torch.isnan(copy).sum())
    if n_nan:
        why = (f"unwritten output: {n_nan} of {copy.numel()} elements still hold the NaN that c was "
               f"filled with before the call")
    elif any(e.shape == copy.shape and torch.equal(e, copy) for e in earlier):
        why = ("stale result: the output is an earlier call's, although the inputs are new "
               "(results must not be cached across calls)")
    else:
        why = "wrong result"
    return CaseResult(shape, case, False, f"{why}\n{result.message}"), copy


def _overwrite(data, fresh) -> None:
    """New contents in the same tensors (as bytes, so any dtype copies exactly)."""
    for dst, src in zip(data[:6], fresh[:6]):
        dst.view(torch.uint8).copy_(src.view(torch.uint8))


def run_tests(kernel: Callable, shapes, device, seed: int = 0, log: Callable[[str], None] | None = None):
    """The four CASES per shape; returns their CaseResults."""
    results = []
    for i, shape in enumerate(shapes):
        base = 1000 * seed + 10 * i

        def data(offset: int, mode: str = "full"):
            return generate_input(*shape, seed=base + offset, mode=mode, device=device)

        full = data(1)
        earlier = []
        for case in CASES:
            if case == CASES[0]:
                inputs = data(0, "leaderboard")
            elif case == CASES[1]:
                inputs = full
            elif case == CASES[2]:
                _overwrite(full, data(2))  # same tensors (and the same tuple), new values
            else:
                inputs = data(3)
            result, output = run_case(kernel, inputs, shape, case, earlier)
            earlier += [output] if output is not None else []
            results.append(result)
            if log:
                log(result.line())
    return results


# ---------------------------------------------------------------------------------------------
# Benchmark mode


@dataclass
class BenchResult:
    shape: Shape
    timing: Timing
    bandwidth_gbps: float
    percent_of_copy: float
    percent_of_b200_sol: float | None  # B200 speed-of-light time as a % of this time (B200 only)


def is_b200() -> bool:
    caps = capabilities()
    return caps.cuda and "B200" in caps.name


def run_benchmarks(kernel: Callable, shapes, device, copy_gbps: float, *, seed: int = 0, warmup: int = 10,
                   reps: int = 100, log: Callable[[str], None] | None = None):
    """Check each benchmark shape once, then time it -> (BenchResults, CaseResults)."""
    rows, checks = [], []
    b200 = is_b200()
    for i, shape in enumerate(shapes):
        data = generate_input(*shape, seed=1000 * seed + 500 + i, mode="leaderboard", device=device)
        result, _ = run_case(kernel, data, shape, "benchmark data")
        checks.append(result)
        if log:
            log(result.line())
        if not result.ok:
            continue
        timing = time_leaderboard(lambda: kernel(data), warmup=warmup, reps=reps)
        bw = gbps(bytes_moved(shape), timing.median_us)
        sol = B200_SPEED_OF_LIGHT_US.get(shape)
        rows.append(BenchResult(shape, timing, bw, percent(bw, copy_gbps),
                                percent(sol, timing.median_us) if b200 and sol else None))
    return rows, checks


@functools.cache
def _copy_bandwidth_gbps() -> float:
    """The ceiling, measured once per process (evaluating several files need not re-measure it)."""
    return copy_bandwidth_gbps()


def format_bench_table(rows: list[BenchResult]) -> str:
    """shape, median us, GB/s, % of copy bandwidth, % of B200 speed of light, host us; geomean last."""
    show_sol = any(r.percent_of_b200_sol is not None for r in rows)
    header = ["shape", "median us", "GB/s", "% copy BW"] + (["% B200 SOL"] if show_sol else []) + ["host us"]
    body = []
    for r in rows:
        cells = [_shape(r.shape), f"{r.timing.median_us:.1f}", f"{r.bandwidth_gbps:.0f}", f"{r.percent_of_copy:.1f}"]
        cells += [f"{r.percent_of_b200_sol:.1f}"] if show_sol else []
        body.append(cells + ["-" if r.timing.host_us is None else f"{r.timing.host_us:.1f}"])
    if rows:
        cells = ["geomean", f"{geomean(r.timing.median_us for r in rows):.1f}",
                 f"{geomean(r.bandwidth_gbps for r in rows):.0f}", f"{geomean(r.percent_of_copy for r in rows):.1f}"]
        cells += [f"{geomean(r.percent_of_b200_sol for r in rows):.1f}"] if show_sol else []
        body.append(cells + [""])
    lines = text_table(header, body, left=1).split("\n")
    if rows:
        lines.insert(len(lines) - 1, lines[1])  # a rule above the geomean row
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Both, as one report


@dataclass
class Report:
    file: Path
    mode: str
    device: str
    submission_path: str | None = None
    backend: str | None = None
    cases: list[CaseResult] = field(default_factory=list)
    bench: list[BenchResult] = field(default_factory=list)
    copy_gbps: float | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def geomean_us(self) -> float | None:
        return geomean(r.timing.median_us for r in self.bench) if self.bench else None

    def summary(self) -> str:
        if self.skipped:
            return f"SKIPPED: {self.skipped}"
        if self.failures:
            lines = [f"FAILED: {len(self.failures)} problem(s) in {self.file}"]
            for i, failure in enumerate(self.failures):
                text = failure if i < _DETAILED_FAILURES else failure.splitlines()[0]
                lines.append("  - " + text.replace("\n", "\n    "))
            return "\n".join(lines)
        timed = f"; geomean {self.geomean_us:.1f} us" if self.bench else ""
        return f"PASSED: {sum(c.ok for c in self.cases)} checks{timed}"


def evaluate(path, mode: str = "both", *, seed: int = 0, shapes=None, all_shapes: bool = False,
             warmup: int = 10, reps: int = 100, isolated: bool = False,
             log: Callable[[str], None] | None = None) -> Report:
    """Run the local leaderboard on one file; `log` (e.g. print) sees each line as it happens.

    `shapes` overrides the test shapes; without CUDA the default is CPU_TEST_SHAPES unless
    `all_shapes`. `isolated` first imports the file in a fresh interpreter without nvfp4lib
    (`import_isolated`, a few seconds). Nothing raises for a bad submission: problems end up in
    `Report.failures`.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    say = log or (lambda line: None)
    caps = capabilities()
    device = torch.device("cuda" if caps.cuda else "cpu")
    report = Report(Path(path), mode, caps.summary())
    say(f"local leaderboard: {path} ({mode}) on {caps.summary()}")
    try:
        source = Path(path).read_text()
        if not has_directive(source):
            report.failures.append(f"{path}: the leading comment lines lack the directive line {DIRECTIVE!r}")
        if isolated:
            ok, message = import_isolated([path])[str(Path(path).resolve())]
            if not ok:
                raise SubmissionError(f"{path}: importing it where nvfp4lib does not exist failed: {message}")
            say("imports in a fresh interpreter without nvfp4lib: ok")
        module = load_submission(path)
    except (OSError, SubmissionError) as err:
        report.failures.append(str(err))
        say(report.summary())
        return report
    report.submission_path = getattr(module, "SUBMISSION_PATH", None)
    report.backend = getattr(module, "BACKEND", None)
    if report.backend:
        say(f"backend: {report.backend}")
    if getattr(module, "NEEDS_CUDA", False) and not caps.cuda:
        report.skipped = (f"{report.submission_path or Path(path).name} needs a CUDA GPU: the file imports "
                          f"here, but no check can run without one")
        say(report.summary())
        return report
    kernel = module.custom_kernel

    if mode in ("test", "both"):
        if shapes is None:
            shapes = TEST_SHAPES if caps.cuda or all_shapes else CPU_TEST_SHAPES
        if not caps.cuda and not all_shapes and list(shapes) == CPU_TEST_SHAPES:
            report.notes.append(f"no CUDA: test shapes limited to M*K*L <= {CPU_MAX_ELEMENTS} "
                                f"({len(CPU_TEST_SHAPES)} of {len(TEST_SHAPES)})")
            say(report.notes[-1])
        report.cases += run_tests(kernel, shapes, device, seed, log)
    if mode in ("benchmark", "both"):
        if not caps.cuda:
            report.notes.append("timing needs a CUDA GPU: benchmark skipped")
            say(report.notes[-1])
        else:
            report.copy_gbps = _copy_bandwidth_gbps()
            say(f"device copy bandwidth: {report.copy_gbps:.0f} GB/s (read + write)")
            rows, checks = run_benchmarks(kernel, BENCHMARK_SHAPES, device, report.copy_gbps, seed=seed,
                                          warmup=warmup, reps=reps, log=log)
            report.bench, report.cases = rows, report.cases + checks
            if rows:
                say(format_bench_table(rows))
    report.failures += [f"{_shape(c.shape)}, {c.case}: {c.message}" for c in report.cases if not c.ok]
    say(report.summary())
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.evaluate",
                                     description="Check (and on a GPU, time) a one-file leaderboard submission.")
    parser.add_argument("file", help="the submission file, e.g. submission.py")
    parser.add_argument("--mode", choices=MODES, default="both", help="test, benchmark or both (default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    parser.add_argument("--reps", type=int, default=100, help="timed calls per benchmark shape")
    parser.add_argument("--all-shapes", action="store_true", help="all test shapes even without CUDA (slow)")
    parser.add_argument("--no-isolated-import", dest="isolated", action="store_false",
                        help="skip the import in a fresh interpreter without nvfp4lib (saves a few seconds)")
    args = parser.parse_args(argv)
    report = evaluate(args.file, args.mode, seed=args.seed, all_shapes=args.all_shapes, reps=args.reps,
                      isolated=args.isolated, log=print)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
