"""The check-and-time harness: clone semantics, checking on an untouched copy, the measures and their
CSV fields; the leaderboard's seeds; the wings' modules in no import cycle. CPU only, wall clock; no
timing is asserted. (The leaderboard's modes are tested on the real protocol: tests/test_evaluate.py.)"""

import ast
import math

import pytest
import torch

from nvfp4lib.bench.harness import check_bound, check_once, clone_input, measure, timing_fields
from nvfp4lib.bench.timing import StoppingRule, Timing
from nvfp4lib.contract import GemvInput
from nvfp4lib.leaderboard.protocol import MAX_GENERATOR_SEED, combine_seed, data_seed
from nvfp4lib.locations import PACKAGE_DIR
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import reference_gemv


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


def test_the_secret_seed_changes_the_data_and_is_repeatable():
    plain, mixed, again = (generate_input(128, 64, 1, seed=data_seed(1111, secret), mode="leaderboard")
                           for secret in (None, 123456789, 123456789))
    assert data_seed(1111) == 1111 and data_seed(1111, 123456789) == combine_seed(1111, 123456789)
    assert not torch.equal(plain.a.view(torch.uint8), mixed.a.view(torch.uint8))
    assert torch.equal(mixed.a.view(torch.uint8), again.a.view(torch.uint8))
    assert MAX_GENERATOR_SEED == 2**64 - 1
    torch.Generator().manual_seed(MAX_GENERATOR_SEED)  # the bound is the generator's own


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
    assert fields["leaderboard_median_us"] == timings["leaderboard"].median_us, "every leaderboard-timed row"
    assert "kernel_median_us" not in fields and "host_visible_median_us" not in fields
    with pytest.raises(ValueError, match="measures"):
        measure(lambda: None, ("kernel", "wallclock"))


# ------------------------------------------------------------------------------ the wings' import graph


WINGS = ("bench", "leaderboard")


def _package_imports() -> dict[str, set[str]]:
    """The wings' modules ("bench.harness", "leaderboard.child", ...) -> the modules of the wings each
    imports, at the top or inside a function."""
    modules = {f"{wing}.{p.stem}" for wing in WINGS for p in (PACKAGE_DIR / wing).glob("*.py")}
    graph = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((PACKAGE_DIR / f"{name.replace('.', '/')}.py").read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found |= {n[len("nvfp4lib."):] for n in names if n.startswith("nvfp4lib.")}
        graph[name] = found & modules - {name}
    return graph


def test_the_bench_wing_does_not_use_the_leaderboards_protocol():
    """One protocol: the leaderboard's modes, seeds and submission files live in leaderboard/ alone."""
    graph = _package_imports()
    assert not {m for name, found in graph.items() if name.startswith("bench.") for m in found
                if m.startswith("leaderboard.")}
