"""Check and time a GEMV: the one loop behind every tool of the workbook that checks or times a path.

Checking (`check_once`, `check_bound`): the kernel gets a clone of the input with its output c
poisoned (NaN, so an element it never writes is caught), and what it returns is checked against
the original, which it never saw: a kernel that changes its inputs is judged on the untouched copy.

Timing a call (`measure`): kernel time, leaderboard time and host-visible time (nvfp4lib.bench.timing),
and `timing_fields` turns them into the columns of the benchmark CSV (nvfp4lib.bench.report).

The leaderboard's benchmark, as its harness runs it (`benchmark_case`, `run_mode`,
`run_mode_in_process`):

* a case is (m, k, l, seed); a secret seed, when given, is mixed into every case's seed
  (`combine_seed`), so that the public seeds say nothing about the data;
* one obligatory check first: the kernel on a clone of a fresh input, checked against a copy the
  kernel never saw;
* then leaderboard time (`timing.leaderboard_time`) until the mode's stopping rule says stop.
  Benchmark mode calls the kernel on that one input again and again, unchecked. Ranked mode (the
  harness's "leaderboard" mode) advances the seed by 13 and makes a new input before every timed
  call, gives the kernel that input (its c poisoned with NaN, untimed, as everywhere in the
  workbook) and checks every result against a copy of it;
* a mode starts with one warm-up benchmark of its first case (not reported) and runs in a fresh
  spawned process, all its cases in that one process (`run_mode_in_process`); in ranked mode the
  first failing case ends the run.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.connection
import numbers
import os
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence

import torch

from nvfp4lib import reference
from nvfp4lib.bench.timing import (BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, FLUSHES, MEASURES, RANKED_RULE,
                                   RANKED_WARMUP_RULE, StoppingRule, Timing, gbps, leaderboard_time, per_call_us,
                                   time_column, time_host_visible, time_kernel)
from nvfp4lib.contract import Shape
from nvfp4lib.messages import describe_error
from nvfp4lib.problem import BENCHMARK_SHAPES, generate_input
from nvfp4lib.leaderboard.submission_file import load_submission

LEADERBOARD_SEED = 1111  # the seed of every case in the leaderboard's task file
RANKED_SEED_STEP = 13    # ranked mode: added to the seed before every timed call
MAX_SEED = 2 ** 64 - 1   # torch.Generator.manual_seed takes seeds up to this


# ---------------------------------------------------------------------------------------------
# Cases and inputs


class Case(NamedTuple):
    """One benchmark as the leaderboard lists it: a shape and the seed of its data."""
    m: int
    k: int
    l: int
    seed: int

    @property
    def shape(self) -> Shape:
        return Shape(self.m, self.k, self.l)


def check_integer(name: str, value, low: int, high: int | None = None) -> int:
    """`value` if it is an integer from `low` to `high`, else a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
            low <= value and (high is None or value <= high)):
        expected = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: expected an integer {expected}, got {value!r}")
    return int(value)


def combine_seed(seed: int, secret: int) -> int:
    """A case's seed with the secret seed mixed in, as the leaderboard mixes them: the Cantor
    pairing (seed + secret)(seed + secret + 1)/2 plus `seed`. A large secret gives a large seed
    whatever the small public one is, and different pairs never give the same seed."""
    seed, secret = check_integer("seed", seed, 0), check_integer("secret_seed", secret, 0)
    total = seed + secret
    return seed + total * (total + 1) // 2


def benchmark_cases(shapes: Iterable = BENCHMARK_SHAPES, seed: int = LEADERBOARD_SEED,
                    secret_seed: int | None = None) -> list[Case]:
    """The cases of `shapes`, all with `seed` (the leaderboard's task file uses one seed for
    all), the secret seed mixed in when given."""
    seed = check_integer("seed", seed, 0) if secret_seed is None else combine_seed(seed, secret_seed)
    if seed > MAX_SEED:
        raise ValueError(f"secret_seed: expected a value that keeps the combined seed <= 2**64 - 1, got {secret_seed}")
    return [Case(*Shape(*s), seed) for s in shapes]


def leaderboard_input(m: int, k: int, l: int, seed: int):
    """The default input of a case: `problem.generate_input` with the leaderboard's kind of data,
    on the GPU when there is one."""
    return generate_input(m, k, l, seed=seed, mode="leaderboard", device="cuda" if torch.cuda.is_available() else "cpu")


def clone_input(data):
    """A deep copy of the tensors in `data` (tuples, lists and dicts followed), other values as they are."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a NamedTuple such as GemvInput
        return type(data)(*(clone_input(x) for x in data))
    if isinstance(data, (tuple, list)):
        return type(data)(clone_input(x) for x in data)
    if isinstance(data, dict):
        return {k: clone_input(v) for k, v in data.items()}
    return data


# ---------------------------------------------------------------------------------------------
# Checking


class CheckFailed(AssertionError):
    """A timed call's result did not match the reference (ranked mode)."""


def check_bound(bind: Callable, data, *, against=None, check: Callable | None = None):
    """Check a call made on a clone of `data` -> (CheckResult, the zero-argument call).

    `bind(clone)` returns the zero-argument call to check (and later to time, on the same clone);
    its c is poisoned first. The output is checked with `check(output, against)` (default
    `reference.check`, at `reference.TOLERANCE`) where `against` defaults to `data`, which the call
    never sees."""
    given = clone_input(data)
    *_, c = given
    reference.poison_(c)
    call = bind(given)
    output = call()
    return (check or reference.check)(output, data if against is None else against), call


def check_once(kernel: Callable, data, *, against=None, check: Callable | None = None):
    """`kernel(clone of data)`, its c poisoned, checked against `data` (see `check_bound`) -> CheckResult."""
    return check_bound(lambda given: lambda: kernel(given), data, against=against, check=check)[0]


# ---------------------------------------------------------------------------------------------
# Timing a bound call

def measure(fn: Callable[[], object], measures: Sequence[str] = MEASURES, *, rule: StoppingRule = BENCHMARK_RULE,
            warmup: int = 10, reps: int = 100, flush: str = "dirty") -> dict[str, Timing]:
    """Time `fn` (which should already have run once, e.g. in its check) -> {measure: Timing}.

    "kernel" and "host-visible" make `warmup` untimed then `reps` timed calls; "leaderboard" is
    the leaderboard's method in benchmark mode, `fn` again and again until `rule` says stop.
    `flush` is one of `timing.FLUSHES`: "dirty" gives each its own flush (`timing.flush_l2` "dirty"
    for the first two, the leaderboard's randn for leaderboard time), "clean" a clean one to all."""
    unknown = [m for m in measures if m not in MEASURES]
    if unknown:
        raise ValueError(f"measures: expected names from {MEASURES}, got {unknown}")
    if flush not in FLUSHES:
        raise ValueError(f"flush: expected one of {FLUSHES}, got {flush!r}")
    timers = {
        "kernel": lambda: time_kernel(fn, warmup=warmup, reps=reps, flush=flush),
        "leaderboard": lambda: leaderboard_time(fn, rule, flush="leaderboard" if flush == "dirty" else flush),
        "host-visible": lambda: time_host_visible(fn, warmup=warmup, reps=reps, flush=flush),
    }
    return {m: timers[m]() for m in measures}


def timing_fields(timings: dict[str, Timing], nbytes: int | None = None) -> dict:
    """The benchmark CSV's columns of these timings (`timing.time_column`): <measure>_us, the time per
    call its statistic gives (`timing.per_call_us`: the mean of leaderboard time, as the leaderboard
    reports it; the median of kernel and host-visible time), _p10_us, _p90_us, _reps, and with `nbytes`
    _gbps; leaderboard time also its _std_us and _err_us; host_us from host-visible time."""
    fields = {}
    for name, t in timings.items():
        us = per_call_us(t, name)
        fields.update({time_column(name): us, time_column(name, "p10_us"): t.p10_us,
                       time_column(name, "p90_us"): t.p90_us, time_column(name, "reps"): t.n})
        if nbytes is not None:
            fields[time_column(name, "gbps")] = gbps(nbytes, us)
        if name == "leaderboard":
            fields.update(leaderboard_std_us=t.std_us, leaderboard_err_us=t.err_us)
        if name == "host-visible":
            fields["host_us"] = t.host_us
    return fields


# ---------------------------------------------------------------------------------------------
# The leaderboard's benchmark


@dataclass(frozen=True)
class ModeRules:
    rule: StoppingRule
    warmup_rule: StoppingRule
    ranked: bool


MODES = {"benchmark": ModeRules(BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, False),
         "ranked": ModeRules(RANKED_RULE, RANKED_WARMUP_RULE, True)}


@dataclass
class Outcome:
    """One benchmarked case: its leaderboard time, or why it failed."""
    case: Case
    ok: bool
    message: str
    timing: Timing | None
    checked: int  # results checked against the reference (1 + one per timed call in ranked mode)


def benchmark_case(kernel: Callable, case: Case, *, ranked: bool = False, rule: StoppingRule = BENCHMARK_RULE,
                   make_input: Callable | None = None, check: Callable | None = None,
                   time_call: Callable | None = None, clock: Callable[[], float] | None = None) -> Outcome:
    """Benchmark one case the leaderboard's way -> Outcome (never raises for the kernel's faults).

    `make_input(m, k, l, seed)` builds an input (default `leaderboard_input`); `check(output, data)`
    judges a result (default `reference.check`). First the obligatory check on a clone, then
    leaderboard time: on the same input (`ranked=False`) or, with `ranked`, on a new input with
    the seed advanced by RANKED_SEED_STEP before every call, each result checked against a copy
    of its input. `time_call` and `clock` go to `timing.leaderboard_time` (fakes in tests)."""
    make_input = make_input or leaderboard_input
    check = check or reference.check
    checked = 0
    try:
        data = make_input(case.m, case.k, case.l, case.seed)
        result = check_once(kernel, data, check=check)
        checked += 1
        if not result.ok:
            return Outcome(case, False, f"wrong result at seed {case.seed}: {result.message}", None, checked)
        current = {"data": data, "seed": case.seed}

        def new_input():
            current["seed"] += RANKED_SEED_STEP
            current["data"] = make_input(case.m, case.k, case.l, current["seed"])
            current["copy"] = clone_input(current["data"])
            *_, c = current["data"]
            reference.poison_(c)

        def check_result(output):
            nonlocal checked
            outcome = check(output, current["copy"])
            checked += 1
            if not outcome.ok:
                raise CheckFailed(f"wrong result at seed {current['seed']}: {outcome.message}")

        timing = leaderboard_time(lambda: kernel(current["data"]), rule,
                                  before=new_input if ranked else None, after=check_result if ranked else None,
                                  time_call=time_call, clock=clock)
    except Exception as err:  # noqa: BLE001 - whatever the kernel does, the case gets an answer
        return Outcome(case, False, err.args[0] if isinstance(err, CheckFailed) else describe_error(err), None, checked)
    return Outcome(case, True, "", timing, checked)


def run_mode(kernel: Callable, cases: Sequence[Case], mode: str = "benchmark", *, make_input: Callable | None = None,
             check: Callable | None = None, rule: StoppingRule | None = None, warmup_rule: StoppingRule | None = None,
             time_call: Callable | None = None, clock: Callable[[], float] | None = None) -> list[Outcome]:
    """One mode of the leaderboard in this process: a warm-up benchmark of the first case under
    the mode's warm-up rule (unchecked calls, not reported), then every case under the mode's
    rule -> an Outcome per case; in ranked mode a failing case ends the run. `rule` and
    `warmup_rule` replace the leaderboard's (e.g. fewer calls for a quick look)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {tuple(MODES)}, got {mode!r}")
    cases = [Case(*c) for c in cases]
    if not cases:
        raise ValueError("cases: expected at least one case, got none")
    rules = MODES[mode]
    common = dict(make_input=make_input, check=check, time_call=time_call, clock=clock)
    benchmark_case(kernel, cases[0], rule=warmup_rule or rules.warmup_rule, **common)
    outcomes = []
    for case in cases:
        outcomes.append(benchmark_case(kernel, case, ranked=rules.ranked, rule=rule or rules.rule, **common))
        if rules.ranked and not outcomes[-1].ok:
            break
    return outcomes


# ---------------------------------------------------------------------------------------------
# A mode in a fresh process


def load_callable(spec: str, what: str = "kernel") -> Callable:
    """A callable named by `spec`: a submission file "path/to/file.py" (its custom_kernel, loaded
    with `submission_file.load_submission`: nvfp4lib out of its reach) or "module:name"."""
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"{what}: expected 'file.py' or 'module:name', got {spec!r}")
    spec = os.fspath(spec)
    if spec.endswith(".py"):
        return load_submission(spec).custom_kernel
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{what}: expected 'file.py' or 'module:name', got {spec!r}")
    found = getattr(importlib.import_module(module), name, None)
    if not callable(found):
        raise ValueError(f"{what}: {spec!r} names no callable")
    return found


def _mode_in_child(conn, kernel: str, cases, mode: str, make_input: str | None, rule, warmup_rule) -> None:
    try:
        outcomes = run_mode(load_callable(kernel), cases, mode,
                            make_input=load_callable(make_input, "make_input") if make_input else None,
                            rule=rule, warmup_rule=warmup_rule)
        conn.send((True, outcomes))
    except BaseException as err:  # noqa: BLE001 - the parent gets every failure as text
        conn.send((False, f"{describe_error(err)}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_mode_in_process(kernel: str, cases: Sequence[Case], mode: str = "benchmark", *, make_input: str | None = None,
                        rule: StoppingRule | None = None, warmup_rule: StoppingRule | None = None,
                        timeout: float | None = None) -> list[Outcome]:
    """`run_mode` in a fresh spawned Python process, as the leaderboard runs each mode -> its Outcomes.

    `kernel` and `make_input` are names a new process can load (`load_callable`): a submission
    file or "module:name". Raises RuntimeError if the process fails, dies, or outlives `timeout`
    seconds (then it is killed)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {tuple(MODES)}, got {mode!r}")
    for name, spec in (("kernel", kernel), ("make_input", make_input)):
        if spec is not None and not isinstance(spec, (str, os.PathLike)):
            raise ValueError(f"{name}: expected 'file.py' or 'module:name' (a new process loads it), got {spec!r}")
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_mode_in_child, daemon=True,
                              args=(send, os.fspath(kernel), [Case(*c) for c in cases], mode,
                                    None if make_input is None else os.fspath(make_input), rule, warmup_rule))
    process.start()
    send.close()
    try:
        ready = multiprocessing.connection.wait([receive, process.sentinel], timeout)
        if receive not in ready:
            why = "ended" if process.sentinel in ready else f"did not finish within {timeout} s"
            raise RuntimeError(f"the {mode} process {why} without an answer (exit code {process.exitcode})")
        ok, value = receive.recv()
    except EOFError:
        raise RuntimeError(f"the {mode} process ended without an answer (exit code {process.exitcode})") from None
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
        receive.close()
    if not ok:
        raise RuntimeError(f"the {mode} process failed: {value}")
    return value
