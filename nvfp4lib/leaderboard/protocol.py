"""The leaderboard's protocol as the local leaderboard runs it: its modes, their stopping rules, the
cases of test mode, and the seeds every input is made with (and the bounds on them).

The public harness (its eval.py) runs each mode in a fresh process: test mode checks the test
shapes; benchmark mode makes one obligatory checked call per benchmark shape and then times calls
on that one input, unchecked; its "leaderboard" mode (called `ranked` here) makes a new input with
the seed advanced by `RANKED_SEED_STEP` before every timed call and checks every result. Each
timed mode first runs a warm-up benchmark of its first shape under a rule of its own. A secret
seed, mixed into every seed (`combine_seed`), keeps the data unknown to whoever knows the public
seeds.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from nvfp4lib.bench.timing import (BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, RANKED_RULE, RANKED_WARMUP_RULE,
                                   StoppingRule)
from nvfp4lib.problem import BENCHMARK_SHAPES, TEST_SHAPES

PHASES = {"test": ("test",), "benchmark": ("benchmark",), "ranked": ("ranked",), "both": ("test", "benchmark"),
          "all": ("test", "benchmark", "ranked")}  # a mode's phases, each in a fresh process
MODES = tuple(PHASES)
CASES = ("leaderboard data", "full-range data", "same tensors, new values", "new tensors")  # per test shape
CPU_MAX_ELEMENTS = 1 << 20  # M * K * L of the test shapes run by default without CUDA
CPU_TEST_SHAPES = [s for s in TEST_SHAPES if s.m * s.k * s.l <= CPU_MAX_ELEMENTS]

RANKED_SEED_STEP = 13            # ranked mode: added to the seed before every timed call
MAX_GENERATOR_SEED = 2**64 - 1   # every seed an input is made with: torch.Generator.manual_seed takes up to this
MAX_SEED_OPTION = 2**32 - 1      # --seed, the public seed an evaluation's seeds are derived from
MAX_SECONDS = 1e6                # --timeout and --time-limit (about 11.6 days; a wait must fit a timer)


@dataclass(frozen=True)
class ModeRules:
    """A timed mode's stopping rule, its warm-up benchmark's rule, and whether it is ranked (a new
    input before every timed call, every result checked)."""
    rule: StoppingRule
    warmup_rule: StoppingRule
    ranked: bool


TIMED = {"benchmark": ModeRules(BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, False),
         "ranked": ModeRules(RANKED_RULE, RANKED_WARMUP_RULE, True)}
TIMED_PHASES = tuple(TIMED)


class BadArgument(ValueError):
    """An argument of an evaluation outside what it may be: `name` is the argument, `detail` what
    was expected and what was given (the message is "name: detail"). The command line turns it
    into a usage error naming the option."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name, self.detail = name, detail


def check_integer(name: str, value, low: int, high: int | None = None) -> int:
    """`value` if it is an integer from `low` to `high`, else a BadArgument naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
            low <= value and (high is None or value <= high)):
        expected = f"from {low} to {high}" if high is not None else f">= {low}"
        raise BadArgument(name, f"expected an integer {expected}, got {value!r}")
    return int(value)


def check_seconds(name: str, value) -> float:
    """`value` if it is a positive, finite number of seconds up to MAX_SECONDS, else a BadArgument
    naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= MAX_SECONDS:
        raise BadArgument(name, f"expected a positive number of seconds up to {MAX_SECONDS:.0f}, got {value!r}")
    return float(value)


def stopping_rules(mode: str, reps: int | None = None, warmup: int | None = None):
    """The leaderboard's rules of the timed `mode` -> (rule, warm-up rule or None). `reps` caps the
    timed calls per shape, `warmup` the calls of the warm-up benchmark (0: no warm-up)."""
    rules = TIMED[mode]
    rule = rules.rule if reps is None else dataclasses.replace(rules.rule, max_calls=reps)
    if warmup == 0:
        return rule, None
    return rule, rules.warmup_rule if warmup is None else dataclasses.replace(rules.warmup_rule, max_calls=warmup)


def combine_seed(seed: int, secret: int) -> int:
    """A seed with the secret seed mixed in, as the leaderboard mixes them: the Cantor pairing
    (seed + secret)(seed + secret + 1)/2 plus `seed`. A large secret gives a large seed whatever
    the small public one is, and different pairs never give the same seed."""
    seed, secret = check_integer("seed", seed, 0), check_integer("secret_seed", secret, 0)
    total = seed + secret
    return seed + total * (total + 1) // 2


def data_seed(seed: int, secret_seed: int | None = None) -> int:
    """The seed an input is generated with: `seed`, with the secret seed (if any) mixed in."""
    return seed if secret_seed is None else combine_seed(seed, secret_seed)


def seed_of_test(seed: int, shape_index: int, case_index: int) -> int:
    """The public seed of test case `case_index` (of CASES) at shape `shape_index`."""
    return 1000 * seed + 10 * shape_index + case_index


def seed_of_benchmark(seed: int, shape_index: int) -> int:
    """The public seed of the benchmark shape `shape_index` (its checked call; ranked mode advances it)."""
    return 1000 * seed + 500 + shape_index


def check_secret_seed(secret_seed, seed: int, n_test_shapes: int = len(TEST_SHAPES), ranked_calls: int = 0) -> int:
    """`secret_seed` if, mixed into every seed of an evaluation with `seed` (its tests over
    `n_test_shapes` shapes, its ranked mode advancing a seed `ranked_calls` times), it keeps them
    all at most MAX_GENERATOR_SEED; else a BadArgument naming the largest that does."""
    secret_seed = check_integer("secret_seed", secret_seed, 0)
    largest = max(seed_of_test(seed, n_test_shapes - 1, len(CASES) - 1),
                  seed_of_benchmark(seed, len(BENCHMARK_SHAPES) - 1))
    room = MAX_GENERATOR_SEED - RANKED_SEED_STEP * ranked_calls - largest  # for total (total + 1) / 2
    most = (math.isqrt(8 * room + 1) - 1) // 2 - largest  # total = largest + secret
    if secret_seed > most:
        expected = f"an integer from 0 to {most}" if most >= 0 else "none at all (use a smaller --seed)"
        raise BadArgument("secret_seed", f"expected {expected}: mixed into the seeds of --seed {seed} a larger one "
                                         f"passes 2**64 - 1, the largest generator seed; got {secret_seed}")
    return secret_seed
