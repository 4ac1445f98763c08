"""The check-and-time harness: clone semantics, the leaderboard's benchmark and ranked modes, the
secret seed, and a mode run in a spawned process. CPU only, wall clock; no timing is asserted."""

import dataclasses
import math
import textwrap

import pytest
import torch

from nvfp4lib.bench import harness
from nvfp4lib.bench.timing import StoppingRule, Timing
from nvfp4lib.contract import GemvInput
from nvfp4lib.bench.harness import (Case, Outcome, benchmark_case, benchmark_cases, check_bound, check_once, clone_input,
                              combine_seed, leaderboard_input, measure, run_mode, run_mode_in_process, timing_fields)
from nvfp4lib.problem import BENCHMARK_SHAPES, generate_input
from nvfp4lib.reference import reference_gemv

# Exactly 4 timed calls on any machine: min_calls = max_calls, so no rule but max_calls can stop the
# timing (with the default min_calls of 3, a machine slow enough to pass the 100 ms minimum within 3
# calls could let the standard-error rule stop at 3).
FEW = StoppingRule(max_calls=4, budget_s=1e9, min_calls=4)
SHAPES = [(128, 64, 1), (128, 128, 2)]


def correct(data):
    """A kernel that is right by construction (the point here is the harness, not the kernel)."""
    c = data[6]
    return c.copy_(reference_gemv(data))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).clone() if t.element_size() == 1 else t.clone()


# ------------------------------------------------------------------------------ seeds and cases


def test_combine_seed_is_the_cantor_pairing_plus_the_seed():
    for seed, secret in [(1111, 0), (1111, 7), (0, 2**31), (5, 5)]:
        total = seed + secret
        assert combine_seed(seed, secret) == seed + math.comb(total + 1, 2)  # total (total + 1) / 2
    pairs = {(s, t): combine_seed(s, t) for s in range(40) for t in range(40)}
    assert len(set(pairs.values())) == len(pairs), "different pairs give different seeds"
    with pytest.raises(ValueError, match="secret_seed"):
        combine_seed(1, -1)
    with pytest.raises(ValueError, match="seed"):
        combine_seed(1.5, 1)


def test_benchmark_cases_and_the_secret_seed_change_the_data():
    public = benchmark_cases()
    assert [c.shape for c in public] == list(BENCHMARK_SHAPES) and {c.seed for c in public} == {1111}
    secret = benchmark_cases(SHAPES, secret_seed=123456789)
    assert {c.seed for c in secret} == {combine_seed(1111, 123456789)}
    plain, mixed = (leaderboard_input(*cs[0]) for cs in (benchmark_cases(SHAPES), secret))
    assert not torch.equal(plain[0].view(torch.uint8), mixed[0].view(torch.uint8))
    assert torch.equal(mixed[0].view(torch.uint8), leaderboard_input(*secret[0])[0].view(torch.uint8))
    with pytest.raises(ValueError, match="secret_seed"):
        benchmark_cases(SHAPES, secret_seed=2**40)  # the combined seed would not fit a generator seed


def test_clone_input_copies_every_tensor_deeply():
    data = generate_input(128, 64, 1, seed=3)
    nested = {"data": data, "list": [data.c, 5], "name": "x"}
    copy = clone_input(nested)
    assert copy["name"] == "x" and copy["list"][1] == 5
    assert isinstance(copy["data"], GemvInput), "a named tuple stays one: fields are read by name"
    assert type(clone_input(tuple(data))) is tuple and type(clone_input(list(data))) is list
    for got, was in zip(copy["data"] + (copy["list"][0],), data + (data.c,)):
        assert got.data_ptr() != was.data_ptr() and got.stride() == was.stride()
        assert torch.equal(_bytes(got), _bytes(was))


# ------------------------------------------------------------------------------ checking


def test_a_kernel_that_changes_its_input_is_judged_on_the_untouched_copy():
    data = generate_input(128, 256, 1, seed=4)
    before = [_bytes(t) for t in data[:6]]
    seen = []

    def zero_a_then_compute(given):
        seen.append(given)
        given[0].view(torch.uint8).zero_()  # A is now all zeros: the output is 0 everywhere
        return correct(given)

    result = check_once(zero_a_then_compute, data)
    assert not result.ok and "mismatch" in result.message
    assert seen[0] is not data and seen[0][0].data_ptr() != data[0].data_ptr()
    assert all(torch.equal(b, _bytes(t)) for b, t in zip(before, data[:6])), "the original is untouched"
    assert check_once(correct, data).ok


def test_an_unwritten_output_is_caught_by_the_poison():
    data = generate_input(128, 256, 1, seed=5)
    data[6].copy_(reference_gemv(data))  # the right answer already in the caller's c

    def writes_nothing(given):
        return given[6]

    result = check_once(writes_nothing, data)
    assert not result.ok and "NaN" in result.message


def test_check_bound_returns_the_call_on_the_checked_clone():
    data = generate_input(128, 64, 2, seed=6)
    bound = []

    def bind(given):
        bound.append(given)
        return lambda: correct(given)

    result, call = check_bound(bind, data)
    assert result.ok and bound[0] is not data
    out = call()
    assert out.data_ptr() == bound[0][6].data_ptr()


def test_measure_and_the_csv_fields():
    timings = measure(lambda: None, rule=StoppingRule(3, 1e9), warmup=1, reps=5)
    assert set(timings) == {"kernel", "leaderboard", "host-visible"}
    assert all(isinstance(t, Timing) for t in timings.values())
    fields = timing_fields(timings)
    assert fields["leaderboard_us"] == timings["leaderboard"].mean_us, "leaderboard time is the mean"
    assert fields["kernel_us"] == timings["kernel"].median_us
    assert fields["host_visible_us"] == timings["host-visible"].median_us
    assert fields["leaderboard_err_us"] == timings["leaderboard"].err_us and fields["kernel_reps"] == 5
    with pytest.raises(ValueError, match="measures"):
        measure(lambda: None, ("kernel", "wallclock"))


# ------------------------------------------------------------------------------ the leaderboard's modes


class Recorder:
    """Wraps make_input and a kernel: which seeds were drawn and which tensors each call got."""

    def __init__(self, kernel=correct):
        self.seeds, self.given, self.kernel = [], [], kernel

    def make_input(self, m, k, l, seed):
        self.seeds.append(seed)
        return leaderboard_input(m, k, l, seed)

    def __call__(self, data):
        self.given.append(data)
        return self.kernel(data)


def test_ranked_mode_makes_a_new_input_before_every_call_and_checks_each():
    rec = Recorder()
    case = Case(128, 64, 2, 1111)
    out = benchmark_case(rec, case, ranked=True, rule=FEW, make_input=rec.make_input)
    assert out.ok, out.message
    assert out.timing.n == 4 and out.checked == 1 + 4
    assert rec.seeds == [1111 + 13 * i for i in range(5)], "the first check's seed, then +13 before every call"
    a_ptrs = [given[0].data_ptr() for given in rec.given]
    assert len(rec.given) == 5 and len(set(a_ptrs)) == 5, "a fresh input for every call"


def test_benchmark_mode_reuses_one_input():
    rec = Recorder()
    out = benchmark_case(rec, Case(128, 64, 2, 1111), rule=FEW, make_input=rec.make_input)
    assert out.ok and out.timing.n == 4 and out.checked == 1
    assert rec.seeds == [1111]
    first, *timed = rec.given
    assert all(given is timed[0] for given in timed), "the timed calls share one input"
    assert first is not timed[0], "the checked call got a clone"


def caching_kernel():
    cache = {}

    def kernel(data):
        if "c" not in cache:
            cache["c"] = correct(data).clone()
        return data[6].copy_(cache["c"])

    return kernel


def test_a_kernel_that_caches_its_first_answer_fails_ranked_mode_only():
    case = Case(128, 64, 1, 1111)
    assert benchmark_case(caching_kernel(), case, rule=FEW).ok
    out = benchmark_case(caching_kernel(), case, ranked=True, rule=FEW)
    assert not out.ok and out.timing is None
    assert out.message.startswith(f"wrong result at seed {1111 + 13}") and out.checked == 2


def test_a_kernel_that_raises_is_an_outcome_not_an_exception():
    def broken(data):
        raise RuntimeError("no kernel image\nfor this GPU")

    out = benchmark_case(broken, Case(128, 64, 1, 1), rule=FEW)
    assert not out.ok and out.message.startswith("RuntimeError: no kernel image") and out.checked == 0


def test_run_mode_warms_up_on_the_first_case_and_ranked_mode_stops_at_a_failure():
    rec = Recorder()
    cases = benchmark_cases(SHAPES, seed=7)
    outcomes = run_mode(rec, cases, "benchmark", make_input=rec.make_input, rule=FEW, warmup_rule=FEW)
    assert [o.case for o in outcomes] == cases and all(o.ok for o in outcomes)
    assert rec.seeds == [7, 7, 7], "the warm-up benchmark of case 0, then each case"

    def wrong_at_l2(data):
        out = correct(data)
        return out.neg_() if out.shape[2] == 2 else out

    for mode, expect in (("benchmark", 2), ("ranked", 1)):
        outcomes = run_mode(wrong_at_l2, [cases[1], cases[0]], mode, rule=FEW, warmup_rule=FEW)
        assert len(outcomes) == expect and not outcomes[0].ok
    with pytest.raises(ValueError, match="mode"):
        run_mode(correct, cases, "leaderboard")


KERNEL_FILE = '''
import torch

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def values(packed, scales):
    codes = packed.view(torch.uint8).long()
    v = torch.stack([E2M1[codes & 15], E2M1[codes >> 4]], dim=2).flatten(1, 2)
    return v * scales.to(torch.float64).repeat_interleave(16, dim=1)


def custom_kernel(data):
    a, b, sfa, sfb, _, _, c = data
    c[...] = torch.einsum("mkl,kl->ml", values(a, sfa), values(b, sfb)[0]).unsqueeze(1).to(c.dtype)
    return c
'''


def test_a_mode_in_a_spawned_process_returns_the_same_structure(tmp_path):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(KERNEL_FILE))
    cases = benchmark_cases(SHAPES)
    here = run_mode(harness.load_callable(path), cases, "ranked", rule=FEW, warmup_rule=FEW)
    there = run_mode_in_process(str(path), cases, "ranked", rule=FEW, warmup_rule=FEW, timeout=600)
    for a, b in zip(here, there, strict=True):
        assert isinstance(b, Outcome) and isinstance(b.timing, Timing)
        assert b.ok, b.message
        assert (a.case, a.ok, a.checked, a.timing.n) == (b.case, b.ok, b.checked, b.timing.n) == (a.case, True, 5, 4)
        assert [f.name for f in dataclasses.fields(b.timing)] == [f.name for f in dataclasses.fields(a.timing)]
    with pytest.raises(RuntimeError, match="missing.py: no such file"):
        run_mode_in_process(str(tmp_path / "missing.py"), cases, rule=FEW, warmup_rule=FEW, timeout=600)


def test_kernel_names_a_process_can_load():
    assert harness.load_callable("nvfp4lib.reference:reference_gemv") is reference_gemv
    for bad in ("nvfp4lib.reference", "nvfp4lib.reference:nothing_here", 42):
        with pytest.raises(ValueError, match="kernel"):
            harness.load_callable(bad)
    with pytest.raises(ValueError, match="kernel"):
        run_mode_in_process(correct, benchmark_cases(SHAPES))


@pytest.mark.gpu
def test_both_modes_on_the_gpu():
    """On CUDA the inputs live on the GPU and the timing is the leaderboard's (CUDA events)."""
    cases = benchmark_cases(SHAPES)
    for mode in ("benchmark", "ranked"):
        outcomes = run_mode(correct, cases, mode, rule=FEW, warmup_rule=FEW)
        assert all(o.ok and o.timing.mode == "leaderboard" and o.timing.n == 4 for o in outcomes), outcomes
    assert leaderboard_input(*cases[0])[0].is_cuda
