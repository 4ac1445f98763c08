"""The local leaderboard's modes, run against a submission in its own process, and `evaluate`, which
runs a mode's phases (each in a fresh process) and gives the verdict.

* test: the test shapes on the leaderboard's own data and on full-range data
  (nvfp4lib.problem.generate_input), with the output poisoned first so an element left unwritten
  shows up, then new inputs twice (the tensors of the previous call overwritten in place, then new
  tensors) so a result cached from an earlier call is caught.
* benchmark: a warm-up benchmark of the first shape (not reported), then per benchmark shape one
  checked call and leaderboard time (nvfp4lib.bench.timing.leaderboard_time, run in the
  submission's process with clocks bound before its import: the leaderboard's flush enqueued right
  before each call) on that one input, until the leaderboard's stopping rule says stop. Each timed
  call's output is copied on the caller's stream right after the call: work that stream never
  waited for is a failure, not a shorter time. A time below what moving the call's bytes at the
  copy bandwidth takes, or a run these times leave unexplained by this process's clock, fails.
* ranked: what the leaderboard calls its "leaderboard" mode. As benchmark mode, but before every
  timed call a new input with the seed advanced by RANKED_SEED_STEP, made here and passed to the
  submission's process untimed; that process times the call and every result is checked here;
  the first failing shape ends the mode.

Every output and every time is judged here (nvfp4lib.leaderboard.judge) from what the submission's
process sent back, never by code running there.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable

import torch

from nvfp4lib.bench.timing import (StoppingRule, copy_bandwidth_gbps, gbps, leaderboard_time, percent, summarize)
from nvfp4lib.contract import Shape
from nvfp4lib.device import capabilities
from nvfp4lib.leaderboard.judge import floor_us, judge, timed_problem, too_fast
from nvfp4lib.leaderboard.process import (EvaluationInterrupted, SubmissionProcess, SubmissionProcessEnded, Timed,
                                          memory_held, signal_name, signals_as_failures)
from nvfp4lib.leaderboard.protocol import (CASES, CPU_MAX_ELEMENTS, CPU_TEST_SHAPES, MAX_SEED_OPTION, MODES, PHASES,
                                           RANKED_SEED_STEP, TIMED, TIMED_PHASES, BadArgument, check_integer,
                                           check_seconds, check_secret_seed, data_seed, seed_of_benchmark,
                                           seed_of_test, stopping_rules)
from nvfp4lib.leaderboard.report import BenchResult, CaseResult, Report, format_bench_table, shape_text, shown_path
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, SubmissionError, has_directive, read_submission
from nvfp4lib.layouts import check_scale_copies
from nvfp4lib.problem import B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, TEST_SHAPES, bytes_moved, generate_input
from nvfp4lib.reference import poison_

CALL_TIMEOUT_S = 120.0  # per call (the import counts as one): room for a first call that compiles kernels
TIME_LIMIT_S = 900.0    # the whole evaluation
CHECK_CASES = {"benchmark": "benchmark data", "ranked": "ranked data"}  # the obligatory check of a shape
TIMED_CASES = {"benchmark": "timed calls", "ranked": "ranked timed calls"}  # its timed calls, when they fail


class CheckFailed(AssertionError):
    """A ranked timed call's result was judged wrong (the message says how)."""


def import_isolated(paths, expression: str = "submission.custom_kernel.__name__", timeout: float = TIME_LIMIT_S):
    """Import each file in a fresh process of the kind `evaluate` runs submissions in (nvfp4lib out
    of reach; none sees what an earlier file did) and evaluate `expression` there with the module
    bound to `submission` -> {path: (ok, value or error)}. `timeout` bounds the whole run."""
    deadline = time.monotonic() + check_seconds("timeout", timeout)
    results, device = {}, torch.device("cuda" if capabilities().cuda else "cpu")
    for path in (str(Path(p).resolve()) for p in paths):
        try:
            source = read_submission(path)
            with SubmissionProcess(device, timeout, deadline, timeout) as process:
                loaded = process.load(path, expression, source)
            results[path] = (True, loaded.value) if loaded.ok else (False, loaded.error)
        except (SubmissionError, SubmissionProcessEnded) as err:
            results[path] = (False, str(err))
    return results


# ---------------------------------------------------------------------------------------------
# Test mode


def run_case(process: SubmissionProcess, data, shape: Shape, case: str, earlier=(), reuse: bool = False):
    """One call on poisoned output, judged against the reference from `data` (which the submission
    never sees: it gets a copy) -> (CaseResult, the output as float32 or None)."""
    poison_(data[-1])
    try:
        called = process.call(data, reuse)
    except SubmissionProcessEnded as err:
        return CaseResult(shape, case, False, str(err)), None
    return judge(called, data, shape, case, earlier)


def run_tests(process: SubmissionProcess, shapes, device, seed: int = 0, log: Callable[[str], None] | None = None, *,
              secret_seed: int | None = None):
    """The four CASES per shape; returns their CaseResults (stops where the process ends)."""
    results = []
    for i, shape in enumerate(shapes):
        earlier = []
        for offset, case in enumerate(CASES):
            # full range, but unsigned scales: NVFP4's scales are UE4M3 (never negative in the
            # leaderboard's data), and cuBLAS's FP4 GEMM reads them so
            data = generate_input(*shape, seed=data_seed(seed_of_test(seed, i, offset), secret_seed), device=device,
                                  mode="leaderboard" if case == CASES[0] else "full", negative_scales=False)
            check_scale_copies(data)  # a kernel may read either copy of the scales: they must agree
            result, output = run_case(process, data, shape, case, earlier, reuse=case == CASES[2])
            earlier += [output] if result.ok else []  # returned again for new inputs, it was cached
            results.append(result)
            if log:
                log(result.line())
            if process.ended:
                return results
    return results


# ---------------------------------------------------------------------------------------------
# Benchmark and ranked modes


def is_b200() -> bool:
    caps = capabilities()
    return caps.cuda and "B200" in caps.name


def _timed_in_process(process: SubmissionProcess, rule: StoppingRule, shape: Shape, copy_gbps: float) -> Timed:
    """Benchmark mode's timed calls, made and timed in the submission's process -> its answer."""
    try:
        return process.time(rule, (shape[0], 1, shape[2]), floor_us(shape, copy_gbps))
    except SubmissionProcessEnded as err:
        return Timed(error=str(err))


def _ranked_calls(process: SubmissionProcess, shape: Shape, seed: int, device, rule: StoppingRule, first_output,
                  copy_gbps: float):
    """Ranked mode's timed calls at one shape -> (Timing or None, CaseResult of a failure or None,
    results checked).

    Before every call a new input with the seed advanced by RANKED_SEED_STEP is made here and its c
    poisoned; the submission's process gets it (untimed) and times the call on a copy
    (bench.time_one_call); its result is judged here against the untouched input, as in test mode,
    and its time against the floor (judge.too_fast). `first_output` is the checked call's output,
    to name a result cached from it as stale."""
    current = {"seed": seed, "calls": 0}
    earlier = [first_output]  # the previous call's correct output: returned for a new input, it was cached

    def new_input():
        current["seed"] += RANKED_SEED_STEP
        current["data"] = generate_input(*shape, seed=current["seed"], mode="leaderboard", device=device)
        poison_(current["data"].c)

    def timed_there(call):
        called = call()
        return called, called.us

    def check_result(called):
        current["calls"] += 1
        result, copy = judge(called, current["data"], shape, TIMED_CASES["ranked"], earlier)
        named = f"timed call {current['calls']} (seed {current['seed']})"
        problem = (f"{named}: {result.message}" if not result.ok
                   else too_fast([called.us], shape, copy_gbps, lambda i: named))
        if problem:
            raise CheckFailed(problem)
        earlier[:] = [copy]

    try:
        timing = leaderboard_time(lambda: process.call(current["data"], timed=True), rule, before=new_input,
                                  after=check_result, time_call=timed_there)
    except (CheckFailed, SubmissionProcessEnded) as err:
        return None, CaseResult(shape, TIMED_CASES["ranked"], False, str(err)), current["calls"]
    return timing, None, current["calls"]


def run_benchmarks(process: SubmissionProcess, shapes, device, copy_gbps: float, *, mode: str = "benchmark",
                   seed: int = 0, secret_seed: int | None = None, rule: StoppingRule | None = None,
                   warmup_rule: StoppingRule | None = None, log: Callable[[str], None] | None = None):
    """The leaderboard's benchmark or ranked `mode` with the submission in `process` ->
    (BenchResults, CaseResults).

    First a warm-up benchmark of the first shape under `warmup_rule` (benchmark mode's calls, not
    reported; None: no warm-up; a failure there ends the mode), then per shape one checked call on
    a new input and leaderboard time under `rule` (default: the mode's). Benchmark mode times
    custom_kernel on that input again and again in its process; ranked mode gives it a new input
    before every call and checks every result (`_ranked_calls`), and its first failing shape ends
    the run. A time below the floor of `copy_gbps` (judge.too_fast) fails its shape."""
    if mode not in TIMED_PHASES:
        raise BadArgument("mode", f"expected one of {TIMED_PHASES}, got {mode!r}")
    ranked = TIMED[mode].ranked
    rule = TIMED[mode].rule if rule is None else rule
    say = log or (lambda line: None)
    rows, checks = [], []
    b200 = is_b200()
    kind = "leaderboard" if torch.device(device).type == "cuda" else "wall"
    if warmup_rule is not None and shapes:
        data = generate_input(*shapes[0], seed=data_seed(seed_of_benchmark(seed, 0), secret_seed), mode="leaderboard",
                              device=device)
        warm, _ = run_case(process, data, shapes[0], "warm-up benchmark")
        timed = _timed_in_process(process, warmup_rule, shapes[0], copy_gbps) if warm.ok else None
        problem = warm.message if timed is None else timed_problem(timed, shapes[0], copy_gbps)
        if problem:
            checks.append(CaseResult(shapes[0], "warm-up benchmark", False, problem))
            say(checks[-1].line())
            return rows, checks
        say(f"warm-up benchmark at {shape_text(shapes[0])}: {len(timed.samples_us)} calls (not reported)")
    for i, shape in enumerate(shapes):
        shape_seed = data_seed(seed_of_benchmark(seed, i), secret_seed)
        data = generate_input(*shape, seed=shape_seed, mode="leaderboard", device=device)
        result, output = run_case(process, data, shape, CHECK_CASES[mode])
        timing, checked = None, 0
        if result.ok and ranked:
            timing, failure, checked = _ranked_calls(process, shape, shape_seed, device, rule, output, copy_gbps)
            result = failure or result
        elif result.ok:
            timed = _timed_in_process(process, rule, shape, copy_gbps)
            problem = timed_problem(timed, shape, copy_gbps)
            if problem:
                result = CaseResult(shape, TIMED_CASES[mode], False, problem)
            else:
                timing = summarize(kind, timed.samples_us)
        checks.append(result)
        say(result.line())
        if timing is not None:  # every time above the floor: the mean is positive
            bw, sol = gbps(bytes_moved(shape), timing.mean_us), B200_SPEED_OF_LIGHT_US.get(shape)
            rows.append(BenchResult(shape, timing, bw, percent(bw, copy_gbps),
                                    percent(sol, timing.mean_us) if b200 and sol else None, checked))
        if process.ended or (ranked and not result.ok):
            break
    return rows, checks


@functools.cache
def _copy_bandwidth_gbps() -> float:
    """The ceiling, measured once per process (evaluating several files need not re-measure it)."""
    return copy_bandwidth_gbps()


# ---------------------------------------------------------------------------------------------
# An evaluation


def _load(process: SubmissionProcess, path, source: str, report: Report, cuda: bool, say) -> bool:
    """Import the file in `process`; False (with the failure or the skip in `report`) if no call can follow."""
    try:
        loaded = process.load(path, source=source)
    except SubmissionProcessEnded as err:
        report.failures.append(f"{shown_path(path)}: {err}")
        return False
    if not loaded.ok:
        report.failures.append(f"{shown_path(path)}: importing it {loaded.error}")
        return False
    if not loaded.has_kernel:
        report.failures.append(f"{shown_path(path)}: defines no function custom_kernel(data)")
        return False
    report.submission_path = loaded.submission_path
    if loaded.backend and report.backend is None:
        report.backend = loaded.backend
        say(f"backend: {report.backend}")
    if loaded.needs_cuda and not cuda:
        report.skipped = (f"{report.submission_path or shown_path(Path(path).name)} needs a CUDA GPU: the file imports "
                          f"here, but no check can run without one")
        return False
    return True


def evaluate(path, mode: str = "both", *, seed: int = 0, secret_seed: int | None = None, shapes=None,
             all_shapes: bool = False, warmup: int | None = None, reps: int | None = None,
             timeout: float = CALL_TIMEOUT_S, time_limit: float = TIME_LIMIT_S, show_output: bool = False,
             log: Callable[[str], None] | None = None) -> Report:
    """Run the local leaderboard on one file; `log` (e.g. print) sees each line as it happens, the
    verdict (`Report.summary`) last, once every process the submission started has ended.

    `mode` is one of MODES (see the module's docstring). `shapes` overrides the test shapes;
    without CUDA the default is CPU_TEST_SHAPES unless `all_shapes` (fewer shapes than the test
    shapes make the verdict INCOMPLETE at best, as do the timed modes without CUDA).
    `secret_seed` is mixed into every seed (`data_seed`). The timed modes follow the leaderboard's
    stopping rules; `reps` caps the timed calls per shape and `warmup` the calls of the warm-up
    benchmark (0: none). `timeout` bounds each call of the submission (its import counts as one)
    and `time_limit` the whole evaluation, in seconds. `show_output` passes the submission's stdout
    and stderr to `log`, each line prefixed (always kept in `Report.output`). Nothing raises for a
    bad submission: problems end up in `Report.failures` (bad arguments raise BadArgument, a
    ValueError naming the argument, before anything runs). The submission runs in the sandbox of
    nvfp4lib.leaderboard.process (`Report.isolation` says which); in the main thread the signals
    that would end this process end the evaluation with a FAILED verdict instead (`Report.interrupted`).
    """
    if mode not in MODES:
        raise BadArgument("mode", f"expected one of {MODES}, got {mode!r}")
    seed = check_integer("seed", seed, 0, MAX_SEED_OPTION)
    warmup = None if warmup is None else check_integer("warmup", warmup, 0)
    reps = None if reps is None else check_integer("reps", reps, 1)
    timeout, time_limit = check_seconds("timeout", timeout), check_seconds("time_limit", time_limit)
    caps = capabilities()
    shapes = [Shape(*s) for s in (shapes if shapes is not None else
                                  TEST_SHAPES if caps.cuda or all_shapes else CPU_TEST_SHAPES)]
    phases = list(PHASES[mode])
    if secret_seed is not None:
        ranked_calls = stopping_rules("ranked", reps)[0].max_calls if "ranked" in phases else 0
        secret_seed = check_secret_seed(secret_seed, seed, len(shapes), ranked_calls)
    deadline = time.monotonic() + time_limit
    say = log or (lambda line: None)
    device = torch.device("cuda" if caps.cuda else "cpu")
    report = Report(Path(path), mode, caps.summary())
    name = shown_path(path)
    say(f"local leaderboard: {name} ({mode}) on {caps.summary()}" + (
        "; a secret seed is mixed into every seed (the inputs are made here: it never reaches the submission)"
        if secret_seed is not None else ""))
    try:
        source = read_submission(path)
    except SubmissionError as err:
        report.failures.append(str(err).replace(str(path), name))
        say(report.summary())
        return report
    if not has_directive(source):
        report.failures.append(f"{name}: the leading comment lines lack the directive line {DIRECTIVE!r}")

    timed = [phase for phase in phases if phase in TIMED_PHASES]
    if timed and not caps.cuda:
        report.unchecked += [f"{phase} mode (timing needs a CUDA GPU)" for phase in timed]
        report.notes.append(f"timing needs a CUDA GPU: {' and '.join(timed)} not run")
        say(report.notes[-1])
        phases = [phase for phase in phases if phase not in TIMED_PHASES] or ["import"]  # still checks the import
    missing = [s for s in TEST_SHAPES if s not in shapes]
    if "test" in phases and missing:
        why = (f"without CUDA only those of M*K*L <= {CPU_MAX_ELEMENTS} run unless --all-shapes"
               if shapes == CPU_TEST_SHAPES and not caps.cuda else "not among the shapes given")
        report.unchecked.insert(0, f"{len(missing)} of the {len(TEST_SHAPES)} test shapes ({why})")
        report.notes.append(f"test shapes: {len(TEST_SHAPES) - len(missing)} of {len(TEST_SHAPES)} ({why})")
        say(report.notes[-1])
    shown = (lambda line: say(line)) if show_output else None
    cases: list[CaseResult] = []
    stopped = []
    try:
        with signals_as_failures():
            for phase in phases:  # a fresh process per mode, as on the leaderboard
                if time.monotonic() >= deadline:
                    stopped.append(f"{phase} mode: not started, the evaluation reached --time-limit {time_limit:g} s")
                    break
                process = SubmissionProcess(device, timeout, deadline, time_limit, shown)
                if report.isolation is None:
                    report.isolation = process.isolation
                    say(f"isolation: {report.isolation}")
                try:
                    loaded = _load(process, path, source, report, caps.cuda, say)
                    if loaded:
                        _run_phase(process, phase, report, cases, shapes, device, seed, secret_seed, reps, warmup,
                                   log)
                except torch.OutOfMemoryError:  # read while the submission's process still holds its memory
                    stopped.append(_no_room_for_inputs(device))
                    loaded = False
                finally:
                    process.close()  # its exit handlers' output too
                    _keep_output(report, process, say)
                if not loaded or process.ended:
                    break
    except EvaluationInterrupted as err:
        report.interrupted = err.signum
        stopped.append(f"the evaluation was stopped by {signal_name(err.signum)} (sent by the submission's processes "
                       f"or from outside); everything the submission started was ended")
    except OSError as err:  # e.g. no room left for a work folder or a pipe
        stopped.append(f"the evaluation could not go on: {err.strerror or err} (the evaluator's own resources: has "
                       f"the submission filled the disk or the process table?)")
    report.cases = cases
    report.failures += [f"{shape_text(c.shape)}, {c.case}: {c.message}" for c in cases if not c.ok] + stopped
    if report.output_bytes and not show_output:
        say(f"the submission wrote {report.output_bytes} bytes to stdout and stderr (not shown here; "
            f"--show-output shows them)")
    say(report.summary())
    return report


def _no_room_for_inputs(device) -> str:
    """Why this process could not allocate on `device` (its inputs, its copy bandwidth probe): `process.memory_held`."""
    held = memory_held(device)
    if held is None:
        return f"the evaluator ran out of memory on {device} while the submission's process held memory there"
    return (f"the evaluator could not allocate its inputs on {device}: {held}; a submission must leave the device the "
            f"room the leaderboard's inputs take")


def _keep_output(report: Report, process: SubmissionProcess, say) -> None:
    report.output = (report.output + process.output)[-(64 << 10):]
    report.output_bytes += process.output_bytes
    if process.left_running:
        report.notes.append("the submission's processes were killed but had not all ended yet (stuck in the kernel?)")
        say(report.notes[-1])


def _run_phase(process, phase, report, cases, shapes, device, seed, secret_seed, reps, warmup, log) -> None:
    say = log or (lambda line: None)
    if phase == "test":
        cases += run_tests(process, shapes, device, seed, log, secret_seed=secret_seed)
    elif phase in TIMED_PHASES:
        if report.copy_gbps is None:
            report.copy_gbps = _copy_bandwidth_gbps()
            say(f"device copy bandwidth: {report.copy_gbps:.0f} GB/s (read + write)")
        rule, warmup_rule = stopping_rules(phase, reps, warmup)
        say(f"{phase} mode: " + ("a new input before every timed call, every result checked"
                                 if TIMED[phase].ranked else "one input, timed calls unchecked"))
        rows, checks = run_benchmarks(process, BENCHMARK_SHAPES, device, report.copy_gbps, mode=phase, seed=seed,
                                      secret_seed=secret_seed, rule=rule, warmup_rule=warmup_rule, log=log)
        if phase == "ranked":
            report.ranked = rows
        else:
            report.bench = rows
        cases += checks
        if rows:
            say(format_bench_table(rows))
