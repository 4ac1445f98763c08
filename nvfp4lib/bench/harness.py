"""Check and time a GEMV: the one loop behind every tool of the workbook that checks or times a path.

Checking (`check_once`, `check_bound`): the kernel gets a clone of the input with its output c
poisoned (NaN, so an element it never writes is caught), and what it returns is checked against
the original, which it never saw: a kernel that changes its inputs is judged on the untouched copy.

Timing a call (`measure`): kernel time, leaderboard time and host-visible time (nvfp4lib.bench.timing),
and `timing_fields` turns them into the columns of the benchmark CSV (nvfp4lib.bench.report).

The leaderboard's own protocol (its modes, seeds and the submission in a process of its own) is
nvfp4lib.leaderboard's: see nvfp4lib.leaderboard.modes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from nvfp4lib import reference
from nvfp4lib.bench.timing import (BENCHMARK_RULE, FLUSHES, MEASURES, StoppingRule, Timing, gbps, leaderboard_time,
                                   per_call_us, time_column, time_host_visible, time_kernel)

# ---------------------------------------------------------------------------------------------
# Checking


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
    _gbps; leaderboard time also its _std_us, _err_us and _median_us (beside the mean, which one slow
    call can move); host_us from host-visible time."""
    fields = {}
    for name, t in timings.items():
        us = per_call_us(t, name)
        fields.update({time_column(name): us, time_column(name, "p10_us"): t.p10_us,
                       time_column(name, "p90_us"): t.p90_us, time_column(name, "reps"): t.n})
        if nbytes is not None:
            fields[time_column(name, "gbps")] = gbps(nbytes, us)
        if name == "leaderboard":
            fields.update(leaderboard_std_us=t.std_us, leaderboard_err_us=t.err_us, leaderboard_median_us=t.median_us)
        if name == "host-visible":
            fields["host_us"] = t.host_us
    return fields


