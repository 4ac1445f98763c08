"""The local leaderboard catches what the real one would, and what its weak data would not.

Each deliberately wrong submission below is a small pure-PyTorch file with one bug; the evaluator
must fail it with a message that names the problem. A correct file of the same shape must pass.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

from nvfp4lib.bench import Timing
from nvfp4lib.evaluate import (CASES, CPU_MAX_ELEMENTS, CPU_TEST_SHAPES, DIRECTIVE, BenchResult, SubmissionError,
                               evaluate, format_bench_table, has_directive, load_submission, main)
from nvfp4lib.problem import TEST_SHAPES, Shape

SHAPES = [Shape(128, 256, 1), Shape(256, 512, 2)]  # small, and one with two batches

PROLOGUE = f'''\
{DIRECTIVE}
import torch
from task import input_t, output_t

VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def decode(packed, scales, swap=False, signed=True):
    """[rows, K/2] FP4 bytes and [rows, K/16] scales -> float64 [rows, K] (low nibble = even K)."""
    table = torch.tensor(VALUES, dtype=torch.float64, device=packed.device)
    table = table if signed else table.abs()
    byte = packed.view(torch.uint8).long()
    pair = (byte >> 4, byte & 15) if swap else (byte & 15, byte >> 4)
    values = table[torch.stack(pair, dim=-1).flatten(-2)]
    return (values.unflatten(-1, (-1, 16)) * scales.float().double().unsqueeze(-1)).flatten(-2)


def gemv(data, swap_a=False, signed=True):
    a, b, sfa, sfb, _, _, c = data
    for l in range(a.shape[2]):
        vec = decode(b[0:1, :, l], sfb[0:1, :, l], signed=signed)[0]
        c[:, 0, l] = (decode(a[:, :, l], sfa[:, :, l], swap=swap_a, signed=signed) @ vec).half()
    return c
'''

KERNELS = {
    "correct": '''
        def custom_kernel(data: input_t) -> output_t:
            return gemv(data)
    ''',
    "swapped_nibbles": '''
        def custom_kernel(data: input_t) -> output_t:
            return gemv(data, swap_a=True)  # A's high nibble taken as the even element
    ''',
    "ignored_sign": '''
        def custom_kernel(data: input_t) -> output_t:
            return gemv(data, signed=False)  # |value| for every code
    ''',
    "unwritten_rows": '''
        def custom_kernel(data: input_t) -> output_t:
            c = data[6]
            full = gemv(data[:6] + (c.clone(),))
            c[:-1] = full[:-1]  # the last row is never written
            return c
    ''',
    "cached_by_shape": '''
        CACHE = {}

        def custom_kernel(data: input_t) -> output_t:
            key = tuple(data[0].shape)
            if key not in CACHE:
                CACHE[key] = gemv(data).clone()
            data[6].copy_(CACHE[key])
            return data[6]
    ''',
    "cached_by_identity": '''
        CACHE = {}

        def custom_kernel(data: input_t) -> output_t:
            if id(data) not in CACHE:
                CACHE[id(data)] = (data, gemv(data).clone())
            return CACHE[id(data)][1]
    ''',
    "float32_output": '''
        def custom_kernel(data: input_t) -> output_t:
            return gemv(data).float()
    ''',
    "imports_nvfp4lib_in_the_call": '''
        def custom_kernel(data: input_t) -> output_t:
            from nvfp4lib.scaled_mm import gemv_scaled_mm_permuted
            return gemv_scaled_mm_permuted(data)
    ''',
}


def _write(tmp_path, name: str, kernel: str, prologue: str = PROLOGUE):
    path = tmp_path / f"{name}.py"
    path.write_text(prologue + "\n\n" + textwrap.dedent(kernel).strip() + "\n")
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("wrong_submissions")


def _run(folder, name: str, **kwargs):
    return evaluate(_write(folder, name, KERNELS[name]), "test", shapes=SHAPES, **kwargs)


def _case(report, shape: Shape, case: str):
    return next(c for c in report.cases if c.shape == shape and c.case == case)


def test_correct_submission_passes(folder):
    report = _run(folder, "correct")
    assert report.ok, report.summary()
    assert len(report.cases) == len(SHAPES) * len(CASES)
    assert report.summary().startswith("PASSED")


@pytest.mark.parametrize("name, message", [
    ("swapped_nibbles", "wrong result"),
    ("unwritten_rows", "unwritten output: "),
    ("float32_output", "returned dtype torch.float32, expected torch.float16"),
    ("imports_nvfp4lib_in_the_call", "raised ModuleNotFoundError: No module named 'nvfp4lib.scaled_mm': the "
                                     "leaderboard machine does not have nvfp4lib"),
])
def test_wrong_submission_fails_on_every_case(folder, name, message):
    report = _run(folder, name)
    assert not report.ok
    assert not any(c.ok for c in report.cases)
    assert all(message in failure for failure in report.failures), report.failures[0]
    assert report.summary().startswith(f"FAILED: {len(report.cases)} problem(s)")


def test_unwritten_elements_are_counted_and_located(folder):
    report = _run(folder, "unwritten_rows")
    small, batched = (_case(report, shape, CASES[0]).message for shape in SHAPES)
    assert small.startswith("unwritten output: 1 of 128 elements still hold the NaN that c was filled with")
    assert "(m=127, l=0): got NaN (unwritten?)" in small
    assert batched.startswith("unwritten output: 2 of 512 elements")


def test_ignored_sign_passes_leaderboard_data_but_not_full_range(folder):
    """The leaderboard's own data has no negative values: only full-range data exposes the bug."""
    report = _run(folder, "ignored_sign")
    for shape in SHAPES:
        assert _case(report, shape, "leaderboard data").ok
        failed = _case(report, shape, "full-range data")
        assert not failed.ok and failed.message.startswith("wrong result\n")
        assert "elements mismatch (rtol=0.001, atol=0.001)" in failed.message


def test_result_cached_by_shape_is_stale(folder):
    report = _run(folder, "cached_by_shape")
    for shape in SHAPES:
        assert _case(report, shape, "leaderboard data").ok
        for case in CASES[1:]:
            assert _case(report, shape, case).message.startswith("stale result: the output is an earlier call's")


def test_result_cached_by_input_identity_is_stale(folder):
    """Same tuple, same tensors, new values: only an in-place change catches this cache."""
    report = _run(folder, "cached_by_identity")
    for shape in SHAPES:
        assert all(_case(report, shape, case).ok for case in CASES if case != CASES[2])
        assert _case(report, shape, CASES[2]).message.startswith("stale result")


# ---------------------------------------------------------------------------------------------
# Loading


def test_import_of_nvfp4lib_at_load_time_is_refused(tmp_path):
    path = _write(tmp_path, "imports", "from nvfp4lib.reference import reference_gemv\ncustom_kernel = reference_gemv")
    with pytest.raises(SubmissionError, match="No module named 'nvfp4lib.reference': the leaderboard machine"):
        load_submission(path)
    report = evaluate(path, "test", shapes=SHAPES)
    assert not report.ok and "importing it failed: ModuleNotFoundError" in report.failures[0]


def test_isolated_import_catches_what_the_import_guard_cannot(tmp_path):
    """importlib.import_module bypasses import statements; in a fresh interpreter there is no nvfp4lib."""
    kernel = ("import importlib\nreference = importlib.import_module('nvfp4lib.reference')\n"
              "custom_kernel = reference.reference_gemv")
    path = _write(tmp_path, "import_module", kernel)
    assert load_submission(path).custom_kernel.__name__ == "reference_gemv"
    report = evaluate(path, "test", shapes=SHAPES, isolated=True)
    assert not report.ok and not report.cases
    assert ("importing it where nvfp4lib does not exist failed: ModuleNotFoundError: No module named "
            "'nvfp4lib'") in report.failures[0]


def test_file_without_custom_kernel_is_refused(tmp_path):
    path = _write(tmp_path, "no_entry", "def kernel(data):\n    return gemv(data)")
    with pytest.raises(SubmissionError, match="defines no function custom_kernel"):
        load_submission(path)


def test_missing_directive_is_a_failure(tmp_path):
    path = _write(tmp_path, "no_directive", KERNELS["correct"], prologue=PROLOGUE.replace(DIRECTIVE + "\n", ""))
    report = evaluate(path, "test", shapes=SHAPES[:1])
    assert all(c.ok for c in report.cases)
    assert report.failures == [f"{path}: the leading comment lines lack the directive line {DIRECTIVE!r}"]


def test_directive_must_be_in_the_leading_comments():
    assert has_directive(f"# header\n{DIRECTIVE}\nimport torch\n")
    assert not has_directive(f"import torch\n{DIRECTIVE}\n")


def test_missing_file_is_reported(tmp_path):
    report = evaluate(tmp_path / "absent.py", "test")
    assert not report.ok and "absent.py" in report.failures[0]


def test_each_load_is_a_fresh_module(tmp_path):
    path = _write(tmp_path, "cached", KERNELS["cached_by_shape"])
    first, second = load_submission(path), load_submission(path)
    first.CACHE["x"] = 1
    assert first is not second and second.CACHE == {}


# ---------------------------------------------------------------------------------------------
# Shapes, modes, the command line


def test_cpu_shapes_are_a_documented_subset():
    assert CPU_TEST_SHAPES and set(CPU_TEST_SHAPES) <= set(TEST_SHAPES)
    assert all(s.m * s.k * s.l <= CPU_MAX_ELEMENTS for s in CPU_TEST_SHAPES)
    assert any(s.l > 1 for s in CPU_TEST_SHAPES), "batches must be covered without CUDA too"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_timing_is_skipped_with_a_note(folder):
    report = evaluate(_write(folder, "correct", KERNELS["correct"]), "benchmark")
    assert report.ok and not report.bench and not report.cases
    assert report.notes == ["timing needs a CUDA GPU: benchmark skipped"]


def test_bench_table_has_every_column_and_the_geomean():
    def row(shape, us, sol):
        timing = Timing("leaderboard", us, us, us, 5, host_us=6.0)
        return BenchResult(Shape(*shape), timing, 1000.0 * us / us, 25.0, sol)

    table = format_bench_table([row((7168, 16384, 1), 20.0, 43.1), row((4096, 7168, 8), 80.0, 21.6)])
    header, *_, last = table.splitlines()
    assert header.split() == ["shape", "median", "us", "GB/s", "%", "copy", "BW", "%", "B200", "SOL", "host", "us"]
    assert "7168x16384x1" in table and last.split()[:2] == ["geomean", "40.0"]
    assert "% B200 SOL" not in format_bench_table([row((7168, 16384, 1), 20.0, None)])


def test_cli_exit_codes(folder, capsys):
    good = _write(folder, "correct", KERNELS["correct"])
    assert main([str(good), "--mode", "test", "--no-isolated-import"]) == 0
    assert "PASSED" in capsys.readouterr().out
    bad = _write(folder, "ignored_sign", KERNELS["ignored_sign"])
    proc = subprocess.run([sys.executable, "-m", "nvfp4lib.evaluate", str(bad), "--mode", "test",
                           "--no-isolated-import"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAILED" in proc.stdout and "full-range data: wrong result" in proc.stdout


@pytest.mark.gpu
def test_benchmark_on_gpu_times_every_benchmark_shape(folder):
    report = evaluate(_write(folder, "correct", KERNELS["correct"]), "benchmark", warmup=1, reps=3)
    assert report.ok, report.summary()
    assert [r.shape for r in report.bench] == [c.shape for c in report.cases]
    assert report.copy_gbps > 0 and report.geomean_us > 0
    assert all(r.bandwidth_gbps > 0 and r.percent_of_copy > 0 for r in report.bench)
