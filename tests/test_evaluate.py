"""The local leaderboard catches what the real one would, and what its weak data would not.

Each deliberately wrong submission below is a small pure-PyTorch file with one bug; the evaluator
must fail it with a message that names the problem. A correct file of the same shape must pass.
Hostile files (exits, crashes, hangs, odd outputs, changed inputs, ways to reach nvfp4lib) must end
in a FAIL that names the cause, never in a traceback, a hang or a pass.
"""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from nvfp4lib.bench.timing import (BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, RANKED_RULE, RANKED_WARMUP_RULE, StoppingRule,
                            summarize)
from nvfp4lib.contract import Shape
from nvfp4lib.leaderboard.evaluate import (BenchResult, CASES, CPU_MAX_ELEMENTS, CPU_TEST_SHAPES, MAX_SEED_OPTION,
                                           RANKED_SEED_STEP, Report, SubmissionProcess, check_secret_seed,
                                           combine_seed, data_seed, evaluate, format_bench_table, import_isolated,
                                           main, run_benchmarks, run_tests, seed_of_benchmark, seed_of_test,
                                           stopping_rules)
from nvfp4lib.locations import PACKAGE_DIR
from nvfp4lib.problem import TEST_SHAPES, bytes_moved, generate_input
from nvfp4lib.leaderboard.process import Called, Output
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, SubmissionError, has_directive, load_submission
from tests.leaderboard_helpers import SANDBOXED, marker, running

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
    "import_module_in_the_call": '''
        import importlib

        def custom_kernel(data: input_t) -> output_t:
            reference = importlib.import_module("nvfp4lib.reference")
            return data[6].copy_(reference.reference_gemv(data))
    ''',
    "zeroes_sfa": '''
        def custom_kernel(data: input_t) -> output_t:
            data[2].view(torch.uint8).zero_()  # every A scale 0: the product is 0 ...
            return data[6].zero_()             # ... so zeros match a reference taken from these inputs
    ''',
    "correct_but_writes_inputs": '''
        def custom_kernel(data: input_t) -> output_t:
            out = gemv(data)
            data[0].view(torch.uint8).zero_()
            data[5].view(torch.uint8).zero_()
            return out
    ''',
    "exits_in_the_call": '''
        import sys

        def custom_kernel(data: input_t) -> output_t:
            sys.exit(0)
    ''',
    "os_exit_in_the_call": '''
        import os

        def custom_kernel(data: input_t) -> output_t:
            os._exit(0)
    ''',
    "segfaults": '''
        import os
        import signal

        def custom_kernel(data: input_t) -> output_t:
            os.kill(os.getpid(), signal.SIGSEGV)
    ''',
    "exits_at_import": '''
        import sys

        sys.exit(0)

        def custom_kernel(data: input_t) -> output_t:
            return gemv(data)
    ''',
    "sleeps_at_import": '''
        import time

        time.sleep(3600)

        def custom_kernel(data: input_t) -> output_t:
            return gemv(data)
    ''',
    "prints_at_exit": '''
        import atexit

        atexit.register(print, "printed by an exit handler")

        def custom_kernel(data: input_t) -> output_t:
            return gemv(data)
    ''',
    "wrong_kind_of_output": '''
        class Marked(torch.Tensor):
            pass

        WRONG = [lambda c: torch.empty_like(c, device="meta"), lambda c: c.to_sparse(),
                 lambda c: c.as_subclass(Marked), lambda c: c.tolist()]
        CALLS = []

        def custom_kernel(data: input_t) -> output_t:
            CALLS.append(len(CALLS))
            c = gemv(data)
            if len(CALLS) <= len(WRONG):
                return WRONG[len(CALLS) - 1](c)
            return torch.zeros(1, dtype=torch.float16)  # the same wrong-shaped tensor on every later call
    ''',
}


def tensor_like_c(c: torch.Tensor) -> dict:
    """How the submission's process describes a returned tensor like `c` (dense, float16, c's shape)."""
    return {"type": "Tensor", "tensor": True, "exact": True, "layout": "torch.strided", "device": str(c.device),
            "dtype": "torch.float16", "shape": list(c.shape), "shares": [], "values": True}


def _write(tmp_path, name: str, kernel: str, prologue: str = PROLOGUE):
    path = tmp_path / f"{name}.py"
    path.write_text(prologue + "\n\n" + textwrap.dedent(kernel).strip() + "\n")
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("wrong_submissions")


@pytest.fixture(scope="module")
def reports():
    """{name: Report of KERNELS[name] in test mode on SHAPES}, each evaluated once for all tests."""
    return {}


def _run(folder, reports, name: str):
    if name not in reports:
        reports[name] = evaluate(_write(folder, name, KERNELS[name]), "test", shapes=SHAPES)
    return reports[name]


def _case(report, shape: Shape, case: str):
    return next(c for c in report.cases if c.shape == shape and c.case == case)


def test_correct_submission_passes_what_it_is_given(folder, reports):
    """Two shapes of the nine pass, and the verdict says that the other seven were not checked."""
    report = _run(folder, reports, "correct")
    assert report.ok, report.summary()
    assert len(report.cases) == len(SHAPES) * len(CASES) and all(c.ok for c in report.cases)
    assert (report.verdict, report.exit_code) == ("INCOMPLETE", 4)
    missing = len([s for s in TEST_SHAPES if s not in SHAPES])
    assert report.summary() == (f"INCOMPLETE: {len(report.cases)} checks passed, but not checked here: "
                                f"{missing} of the {len(TEST_SHAPES)} test shapes (not among the shapes given)")


@pytest.mark.parametrize("name, message", [
    ("swapped_nibbles", "wrong result"),
    ("unwritten_rows", "unwritten output: "),
    ("float32_output", "returned dtype torch.float32, expected torch.float16"),
    ("import_module_in_the_call", "raised ModuleNotFoundError: No module named 'nvfp4lib': the leaderboard "
                                  "machine does not have nvfp4lib"),
])
def test_wrong_submission_fails_on_every_case(folder, reports, name, message):
    report = _run(folder, reports, name)
    assert not report.ok
    assert not any(c.ok for c in report.cases)
    assert all(message in failure for failure in report.failures), report.failures[0]
    assert report.summary().startswith(f"FAILED: {len(report.cases)} problem(s)")


def test_unwritten_elements_are_counted_and_located(folder, reports):
    report = _run(folder, reports, "unwritten_rows")
    small, batched = (_case(report, shape, CASES[0]).message for shape in SHAPES)
    assert small.startswith("unwritten output: 1 of 128 elements still hold the NaN that c was filled with")
    assert "(m=127, l=0): got NaN (unwritten?)" in small
    assert batched.startswith("unwritten output: 2 of 512 elements")


def test_ignored_sign_passes_leaderboard_data_but_not_full_range(folder, reports):
    """The leaderboard's own data has no negative values: only full-range data exposes the bug."""
    report = _run(folder, reports, "ignored_sign")
    for shape in SHAPES:
        assert _case(report, shape, "leaderboard data").ok
        failed = _case(report, shape, "full-range data")
        assert not failed.ok and failed.message.startswith("wrong result\n")
        assert "elements mismatch (rtol=0.001, atol=0.001)" in failed.message


def test_result_cached_by_shape_is_stale(folder, reports):
    report = _run(folder, reports, "cached_by_shape")
    for shape in SHAPES:
        assert _case(report, shape, "leaderboard data").ok
        for case in CASES[1:]:
            assert _case(report, shape, case).message.startswith("stale result: the output is an earlier call's")


def test_result_cached_by_input_identity_is_stale(folder, reports):
    """Same tuple, same tensors, new values: only an in-place change catches this cache."""
    report = _run(folder, reports, "cached_by_identity")
    for shape in SHAPES:
        assert all(_case(report, shape, case).ok for case in CASES if case != CASES[2])
        assert _case(report, shape, CASES[2]).message.startswith("stale result")


def test_a_repeated_wrong_output_is_wrong_not_stale():
    """Only an earlier correct output, returned again for new inputs, is a cached result."""
    class ZerosProcess:  # stands in for the submission's process: every call answers zeros
        ended = None

        def call(self, data, reuse=False):
            zeros = torch.zeros(data[6].shape, dtype=torch.float16)
            return Called(output=Output(tensor_like_c(data[6]), zeros, zeros.clone()), device="cpu")

    results = run_tests(ZerosProcess(), SHAPES[:1], torch.device("cpu"))
    assert [r.message.splitlines()[0] for r in results] == ["wrong result"] * len(CASES)


# ---------------------------------------------------------------------------------------------
# Hostile submissions: one FAIL naming the cause, never a traceback, a hang or a pass


def test_changed_inputs_cannot_fool_the_check(folder, reports):
    """The reference comes from an untouched copy: zeroing sfa and returning zeros is wrong, and says why."""
    report = _run(folder, reports, "zeroes_sfa")
    assert report.cases and not any(c.ok for c in report.cases)
    for case in report.cases:
        first, rest = case.message.split("\n", 1)
        assert first.startswith("changed its input sfa in place (inputs are read-only") and "wrong too" in first
        assert "elements mismatch" in rest


def test_changed_inputs_fail_even_when_the_result_is_right(folder, reports):
    report = _run(folder, reports, "correct_but_writes_inputs")
    assert report.cases and not any(c.ok for c in report.cases)
    for case in report.cases:
        first, rest = case.message.split("\n", 1)
        assert first.startswith("changed its inputs a, sfb_permuted in place") and "wrong" not in first
        assert rest.startswith("ok: ")


def test_every_wrong_kind_of_output_is_named(folder, reports):
    """meta, sparse, a subclass, a list, then a wrong shape on every call (not reported as stale)."""
    report = _run(folder, reports, "wrong_kind_of_output")
    expected = ["returned a tensor on meta, expected cpu (as c)",
                "returned a tensor with layout torch.sparse_coo, expected torch.strided (dense, as c)",
                "returned a Marked (a torch.Tensor subclass), expected a plain tensor like c",
                "returned list, expected the tensor c"]
    expected += [f"returned shape (1,), expected {(SHAPES[1].m, 1, SHAPES[1].l)} (as c)"] * 4
    assert [c.message for c in report.cases] == expected
    assert not any("stale" in failure for failure in report.failures)


def test_crash_in_a_call_fails_once(folder, reports):
    report = _run(folder, reports, "segfaults")
    assert len(report.cases) == 1, "no call can follow the end of the process"
    assert report.failures == [f"128x256x1, {CASES[0]}: the call ended the process (killed by signal SIGSEGV) "
                               f"without an answer"]


def test_exit_at_import_is_a_failure(folder, reports):
    report = _run(folder, reports, "exits_at_import")
    assert not report.cases and report.failures == [f"{folder / 'exits_at_import.py'}: importing it called sys.exit(0)"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_hanging_call_is_killed_with_what_it_started(tmp_path):
    mark = marker()
    kernel = f'''
        import subprocess

        def custom_kernel(data: input_t) -> output_t:
            subprocess.Popen(["sleep", "600.{mark}"])
            print("started", flush=True)
            while True:
                pass
    '''
    # The per-call timeout also bounds the import and the call's work before the loop (a process
    # start, a line printed): milliseconds, so 3 s leaves a busy machine room and the call still hangs.
    report = evaluate(_write(tmp_path, "hangs", kernel), "test", shapes=SHAPES, timeout=3)
    assert len(report.cases) == 1
    assert report.cases[0].message == ("the call did not finish within 3 s (--timeout 3 s per call); "
                                       "the process was killed")
    assert "started" in report.output and not running(mark)


def test_time_limit_bounds_the_whole_evaluation(folder):
    """An import that never ends, under a generous per-call timeout: the overall limit ends it (while
    the process starts, or during the import, depending on how busy this machine is)."""
    path = _write(folder, "sleeps_at_import", KERNELS["sleeps_at_import"])
    report = evaluate(path, "test", shapes=SHAPES, timeout=600, time_limit=3)
    assert not report.cases and len(report.failures) == 1
    assert report.failures[0].startswith(f"{path}: ")
    assert report.failures[0].endswith("(what was left of --time-limit 3 s for the whole evaluation); "
                                       "the process was killed")


# Every route to nvfp4lib that a submission might take, tried in the process submissions run in, and
# what refuses it: the import guard's message, the file guard's, or (in the sandbox) an empty folder.
NOT_IMPORTED, NOT_READ, DENIED = "No module named 'nvfp4lib'", "cannot read nvfp4lib's files", "Permission denied"
# the sandbox's folders of the package are empty: found again (behind a link, or on a path put back), nothing is there
NOT_THERE = ("No module named 'alias.contract'", "No module named 'nvfp4lib.contract'")
ROUTES = {
    "import_module": ("importlib.import_module('nvfp4lib.reference')", NOT_IMPORTED),
    "find_spec": ("importlib.util.find_spec('nvfp4lib.reference')", NOT_IMPORTED),
    "dunder_import": ("__import__('nvfp4lib.reference')", NOT_IMPORTED),
    "import_statement": ("from nvfp4lib.reference import reference_gemv", NOT_IMPORTED),
    "exec_of_an_import": ("exec('import nvfp4lib.reference')", NOT_IMPORTED),
    "sys_modules": ("return sys.modules['nvfp4lib.reference']", "raised KeyError: 'nvfp4lib.reference'"),
    "spec_from_file_location": (
        "spec = importlib.util.spec_from_file_location('v', os.path.join(PACKAGE_DIR, 'contract.py'))\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))", NOT_READ),
    "run_path": ("runpy.run_path(os.path.join(PACKAGE_DIR, 'contract.py'))", NOT_READ),
    "read_and_exec": ("exec(open(os.path.join(PACKAGE_DIR, 'contract.py')).read(), {})", NOT_READ),
    "finder_removed_and_path_restored": (  # an installed (editable) copy is found then: guarded as well
        "finders = sys.meta_path[:]\n"
        "sys.meta_path[:] = [f for f in finders if type(f).__name__ != 'RefusePackage']\n"
        "sys.path.insert(0, os.path.dirname(PACKAGE_DIR))\n"
        "try:\n    import nvfp4lib.contract\nfinally:\n    sys.meta_path[:] = finders\n    sys.path.pop(0)",
        (NOT_READ, NOT_IMPORTED, DENIED)),
    "symlinked_folder": (
        "os.symlink(PACKAGE_DIR, 'alias')\nsys.path.insert(0, os.getcwd())\n"
        "try:\n    importlib.import_module('alias.contract')\nfinally:\n    sys.path.pop(0)", NOT_READ),
}
# Routes past Python's guards: closed by the sandbox (the package's folders are empty there), open without (as
# --help says). Each raises if it could not read the file.
KERNEL_ROUTES = {
    "directory_descriptor": "fd = os.open(os.path.dirname(PACKAGE_DIR), os.O_RDONLY | os.O_DIRECTORY)\n"
                            "os.close(os.open('nvfp4lib/contract.py', os.O_RDONLY, dir_fd=fd))",
    "path_descriptor": "fd = os.open(os.path.dirname(PACKAGE_DIR), os.O_PATH)\n"
                       "os.close(os.open('nvfp4lib/contract.py', os.O_RDONLY, dir_fd=fd))",
    "another_program": "done = subprocess.run(['cat', os.path.join(PACKAGE_DIR, 'contract.py')], capture_output=True,\n"
                       "                      text=True)\n"
                       "if done.returncode:\n    raise PermissionError(done.stderr)",
    "ctypes_open": "import ctypes\nfd = ctypes.CDLL(None, use_errno=True).open(\n"
                   "    os.path.join(PACKAGE_DIR, 'contract.py').encode(), 0)\n"
                   "if fd < 0:\n    raise PermissionError(os.strerror(ctypes.get_errno()))\nos.close(fd)",
    "copied_then_imported": "copy = os.path.join(os.getcwd(), 'copy', 'nvfp4lib')\n"
                            "shutil.copytree(PACKAGE_DIR, copy)\n"
                            "open(os.path.join(copy, 'contract.py')).close()",
}


def test_no_route_reaches_nvfp4lib(tmp_path):
    """Imports of any kind (at call time here: `reach` runs after the import), the module table, and
    loading or reading the package's files by path; in the sandbox also a directory descriptor,
    another program, ctypes and a copy (its folders are empty there)."""
    files = {}
    for name, route in {**{n: r for n, (r, _) in ROUTES.items()}, **KERNEL_ROUTES}.items():
        body = textwrap.indent(route, "    ")
        files[name] = tmp_path / f"{name}.py"
        files[name].write_text(f"import importlib, importlib.util, os, runpy, shutil, subprocess, sys\n"
                               f"PACKAGE_DIR = {str(PACKAGE_DIR)!r}\n\n\ndef reach():\n{body}\n    return 'reached'\n")
    results = import_isolated(files.values(), "submission.reach()")
    for name, (_, messages) in ROUTES.items():
        ok, value = results[str(files[name].resolve())]
        messages = messages if isinstance(messages, tuple) else (messages,)
        assert not ok and any(m in value for m in messages + NOT_THERE * SANDBOXED), f"{name}: {value}"
    for name in KERNEL_ROUTES:
        ok, value = results[str(files[name].resolve())]
        if SANDBOXED:
            assert not ok and "No such file" in value, f"{name}: {value}"
        elif name == "copied_then_imported":  # copying opens the files with Python's open: its guard refuses
            assert not ok and NOT_READ in value, f"{name}: {value}"
        else:
            assert ok and value == "reached", f"{name}: {value} (the route --help names as open without a sandbox)"


# ---------------------------------------------------------------------------------------------
# Loading


def test_import_of_nvfp4lib_at_load_time_is_refused(tmp_path):
    path = _write(tmp_path, "imports", "from nvfp4lib.reference import reference_gemv\ncustom_kernel = reference_gemv")
    with pytest.raises(SubmissionError, match="No module named 'nvfp4lib.reference': the leaderboard machine"):
        load_submission(path)
    report = evaluate(path, "test", shapes=SHAPES)
    assert not report.ok and not report.cases
    assert report.failures == [f"{path}: importing it raised ModuleNotFoundError: No module named 'nvfp4lib': the "
                               f"leaderboard machine does not have nvfp4lib; export the submission with "
                               f"`python -m nvfp4lib.leaderboard.export`, which inlines the code it needs"]


LATIN1 = DIRECTIVE.encode() + "\n# café\n".encode("latin-1")


@pytest.mark.parametrize("name, content, message", [
    ("latin1.py", LATIN1, f"not UTF-8 text (byte 0xe9 at offset {LATIN1.index(0xe9)}); the leaderboard reads the "
                          f"file as UTF-8"),
    ("notes.txt", PROLOGUE.encode(), "expected a Python file ending in .py"),
])
def test_file_that_is_no_python_source_fails_without_running(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    report = evaluate(path, "test")
    assert report.failures == [f"{path}: {message}"] and not report.cases
    with pytest.raises(SubmissionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_submission(path)


def test_folder_is_not_a_submission(tmp_path):
    assert evaluate(tmp_path, "test").failures == [f"{tmp_path}: not a regular file"]


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
@pytest.mark.parametrize("mode, skipped", [("benchmark", "benchmark"), ("ranked", "ranked")])
def test_without_cuda_timing_is_skipped_with_a_note(folder, mode, skipped):
    report = evaluate(_write(folder, "correct", KERNELS["correct"]), mode)
    assert report.ok and not report.bench and not report.ranked and not report.cases
    assert report.notes == [f"timing needs a CUDA GPU: {skipped} not run"]
    assert report.verdict == "INCOMPLETE" and report.exit_code == 4
    assert report.summary() == (f"INCOMPLETE: 0 checks passed, but not checked here: {skipped} mode (timing needs a "
                                f"CUDA GPU) (only the import was checked)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_mode_all_runs_the_tests_and_names_both_timed_modes_it_skips(folder):
    report = evaluate(_write(folder, "correct", KERNELS["correct"]), "all", shapes=SHAPES[:1])
    assert report.ok and len(report.cases) == len(CASES)
    assert report.notes[0] == "timing needs a CUDA GPU: benchmark and ranked not run"
    assert report.unchecked[-2:] == ["benchmark mode (timing needs a CUDA GPU)",
                                     "ranked mode (timing needs a CUDA GPU)"]


# The timed modes on the CPU's wall clock, with short rules (no time is asserted, only what ran).
ONLY_CALLS = {n: StoppingRule(max_calls=n, budget_s=1e9, min_wall_s=1e9) for n in (2, 4)}  # exactly n calls
BY_ERROR = StoppingRule(max_calls=50, budget_s=1e9, min_calls=3, min_wall_s=0.0, max_rel_err=1e9)  # 3 calls


RECORDING = '''
    def custom_kernel(data: input_t) -> output_t:
        a = data[0]
        print(f"CALL {a.shape[0]}x{2 * a.shape[1]}x{a.shape[2]} {fingerprint(a)}", flush=True)
        return gemv(data)

    def fingerprint(t):
        return t.view(torch.uint8).flatten()[:24].tolist()
'''  # a correct kernel that prints its shape and its input's first bytes (a fingerprint) on every call


def _calls(process: SubmissionProcess) -> list[str]:
    """What RECORDING printed in `process` (once it is closed: all of it was read)."""
    return [line[5:] for line in process.output.splitlines() if line.startswith("CALL ")]


def _fingerprint(shape: Shape, seed: int) -> str:
    """What RECORDING prints for the leaderboard's data of `shape` made with `seed` (computed here)."""
    a = generate_input(*shape, seed=seed, mode="leaderboard")[0]
    return f"{shape.m}x{shape.k}x{shape.l} {a.view(torch.uint8).flatten()[:24].tolist()}"


def _timed_mode(folder, name: str, kernel: str, mode: str, rule=ONLY_CALLS[4], warmup_rule=ONLY_CALLS[2], calls=None,
                **kw):
    """run_benchmarks of `kernel` on SHAPES; `calls` (a list) gets what RECORDING printed."""
    cpu = torch.device("cpu")
    with SubmissionProcess(cpu, timeout=60, deadline=time.monotonic() + 600, time_limit=600) as process:
        assert process.load(_write(folder, name, kernel)).ok
        result = run_benchmarks(process, SHAPES, cpu, copy_gbps=100.0, mode=mode, rule=rule,
                                warmup_rule=warmup_rule, **kw)
    if calls is not None:
        calls += _calls(process)
    return result


def test_benchmark_mode_warms_up_then_times_one_input_per_shape_and_reports_the_mean(tmp_path):
    calls = []
    rows, checks = _timed_mode(tmp_path, "recording", RECORDING, "benchmark", calls=calls)
    assert all(c.ok for c in checks) and [c.case for c in checks] == ["benchmark data"] * 2
    assert [r.shape for r in rows] == SHAPES
    first, second = (_fingerprint(s, seed_of_benchmark(0, i)) for i, s in enumerate(SHAPES))
    # warm-up: a checked call and 2 timed calls on shape 0; then per shape a checked call and 4 timed calls
    assert calls == [first] * 3 + [first] * 5 + [second] * 5
    for r in rows:
        t = r.timing
        assert t.mode == "wall" and t.n == 4 and r.checked == 0
        assert t.mean_us == pytest.approx(sum(t.samples) / 4) and t.best_us == min(t.samples)
        assert r.bandwidth_gbps == pytest.approx(bytes_moved(r.shape) / t.mean_us / 1e3), "bandwidth at the mean"
        assert r.percent_of_copy == pytest.approx(100 * r.bandwidth_gbps / 100.0)


def test_benchmark_mode_stops_when_the_rule_says(folder):
    """The whole rule travels to the submission's process: here the error criterion stops at 3 calls of 50."""
    rows, checks = _timed_mode(folder, "correct", KERNELS["correct"], "benchmark", rule=BY_ERROR, warmup_rule=None)
    assert all(c.ok for c in checks) and [r.timing.n for r in rows] == [3, 3]


def test_ranked_mode_makes_a_new_input_with_a_new_seed_for_every_timed_call(tmp_path):
    calls, secret = [], 99
    rows, checks = _timed_mode(tmp_path, "recording", RECORDING, "ranked", secret_seed=secret, calls=calls)
    assert all(c.ok for c in checks) and [c.case for c in checks] == ["ranked data"] * 2
    assert [(r.shape, r.timing.n, r.checked) for r in rows] == [(s, 4, 4) for s in SHAPES]
    expected = []
    for i, shape in enumerate(SHAPES):
        seed = combine_seed(seed_of_benchmark(0, i), secret)  # the secret mixed in, then +13 before every call
        expected.append([_fingerprint(shape, seed + RANKED_SEED_STEP * k) for k in range(5)])
    warm_up = [expected[0][0]] * 3  # benchmark mode's calls on the first shape's input
    assert calls == warm_up + expected[0] + expected[1]
    assert len(set(expected[0] + expected[1])) == 10


def test_a_kernel_that_caches_its_first_answer_passes_benchmark_mode_but_fails_ranked_mode(folder):
    rows, checks = _timed_mode(folder, "cached_by_shape", KERNELS["cached_by_shape"], "benchmark")
    assert all(c.ok for c in checks) and len(rows) == 2
    rows, checks = _timed_mode(folder, "cached_by_shape", KERNELS["cached_by_shape"], "ranked")
    assert not rows and [(c.shape, c.case, c.ok) for c in checks] == [
        (SHAPES[0], "ranked timed calls", False)], "the first failure ends the run"
    seed = seed_of_benchmark(0, 0) + RANKED_SEED_STEP
    assert checks[0].message.startswith(f"timed call 1 (seed {seed}): stale result: the output is an earlier call's")


def test_a_wrong_ranked_call_is_named_by_its_number_and_seed(tmp_path):
    """Right on the checked call and the first two timed calls, then wrong: caught at call 3."""
    kernel = '''
        CALLS = []

        def custom_kernel(data: input_t) -> output_t:
            CALLS.append(None)
            out = gemv(data)
            return out.neg_() if len(CALLS) == 4 else out
    '''
    rows, checks = _timed_mode(tmp_path, "wrong_at_call_4", kernel, "ranked", warmup_rule=None)
    seed = seed_of_benchmark(0, 0) + 3 * RANKED_SEED_STEP
    assert not rows and checks[-1].message.startswith(f"timed call 3 (seed {seed}): wrong result\n")


def test_timed_calls_run_in_the_submission_process(folder):
    """A kernel that raises only while timed fails there, named by the timed calls; one process
    holds both files in turn."""
    failing = '''
        CALLS = []

        def custom_kernel(data: input_t) -> output_t:
            CALLS.append(None)
            if len(CALLS) > 1:
                raise RuntimeError("only the first call works")
            return gemv(data)
    '''
    cpu = torch.device("cpu")
    with SubmissionProcess(cpu, timeout=60, deadline=time.monotonic() + 600, time_limit=600) as process:
        assert process.load(_write(folder, "correct", KERNELS["correct"])).ok
        rows, checks = run_benchmarks(process, SHAPES, cpu, copy_gbps=100.0, rule=ONLY_CALLS[2])
        assert all(c.ok for c in checks) and [r.shape for r in rows] == SHAPES
        for mode in ("benchmark", "ranked"):
            assert process.load(_write(folder, "fails_when_timed", failing)).ok
            rows, checks = run_benchmarks(process, SHAPES[:1], cpu, copy_gbps=100.0, mode=mode, rule=ONLY_CALLS[2])
            case = "timed calls" if mode == "benchmark" else "ranked timed calls"
            assert not rows and [(c.case, c.message) for c in checks] == [
                (case, ("" if mode == "benchmark" else f"timed call 1 (seed {500 + RANKED_SEED_STEP}): ")
                 + "raised RuntimeError: only the first call works")]


def test_benchmark_mode_goes_on_after_a_failing_shape_and_ranked_mode_stops(folder):
    """The leaderboard's two timed modes after a wrong result at L = 2 (the first shape here)."""
    wrong_at_l2 = '''
        def custom_kernel(data: input_t) -> output_t:
            out = gemv(data)
            return out.neg_() if out.shape[2] == 2 else out
    '''
    cpu, shapes = torch.device("cpu"), [SHAPES[1], SHAPES[0]]
    with SubmissionProcess(cpu, timeout=60, deadline=time.monotonic() + 600, time_limit=600) as process:
        assert process.load(_write(folder, "wrong_at_l2", wrong_at_l2)).ok
        rows, checks = run_benchmarks(process, shapes, cpu, copy_gbps=100.0, rule=ONLY_CALLS[2])
        assert [(c.shape, c.ok) for c in checks] == [(SHAPES[1], False), (SHAPES[0], True)]
        assert [r.shape for r in rows] == [SHAPES[0]] and checks[0].message.startswith("wrong result")
        rows, checks = run_benchmarks(process, shapes, cpu, copy_gbps=100.0, mode="ranked", rule=ONLY_CALLS[2])
        assert not rows and [(c.shape, c.ok) for c in checks] == [(SHAPES[1], False)]


def test_the_leaderboards_stopping_rules_and_their_caps():
    assert stopping_rules("benchmark") == (BENCHMARK_RULE, BENCHMARK_WARMUP_RULE)
    assert stopping_rules("ranked") == (RANKED_RULE, RANKED_WARMUP_RULE)
    rule, warmup_rule = stopping_rules("ranked", reps=7, warmup=3)
    assert (rule.max_calls, warmup_rule.max_calls) == (7, 3) and rule.max_rel_err == RANKED_RULE.max_rel_err
    assert stopping_rules("benchmark", warmup=0)[1] is None


def test_the_secret_seed_changes_the_data_of_every_test_case(tmp_path):
    """The same cases with no secret, a secret, and the same secret again: the data changes with the
    secret, is repeatable with it, and is what harness.combine_seed gives."""
    cpu, shape = torch.device("cpu"), SHAPES[0]
    runs = []
    for secret in (None, 123456, 123456):
        with SubmissionProcess(cpu, timeout=60, deadline=time.monotonic() + 600, time_limit=600) as process:
            assert process.load(_write(tmp_path, "recording", RECORDING)).ok
            assert all(r.ok for r in run_tests(process, [shape], cpu, seed=3, secret_seed=secret))
        runs.append(_calls(process))
    plain, mixed, again = runs
    assert len(plain) == len(CASES) and not set(plain) & set(mixed) and mixed == again
    assert plain[0] == _fingerprint(shape, seed_of_test(3, 0, 0))
    assert mixed[0] == _fingerprint(shape, combine_seed(seed_of_test(3, 0, 0), 123456))
    assert data_seed(5) == 5 and data_seed(5, 7) == combine_seed(5, 7)


def test_a_secret_seed_must_keep_every_seed_a_generator_seed(tmp_path, capsys):
    """The bound is exact: the largest secret whose mixed seeds all fit passes, one more fails."""
    for seed, ranked_calls in ((0, 0), (7, RANKED_RULE.max_calls)):
        low, high = 0, 2**40  # binary search with combine_seed itself, independent of the bound's formula
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if _fits(mid, seed, ranked_calls) else (low, mid - 1)
        assert check_secret_seed(low, seed, ranked_calls=ranked_calls) == low
        with pytest.raises(ValueError, match=f"secret_seed: expected an integer from 0 to {low}: mixed into"):
            check_secret_seed(low + 1, seed, ranked_calls=ranked_calls)
    with pytest.raises(ValueError, match="none at all"):
        check_secret_seed(0, MAX_SEED_OPTION)
    with pytest.raises(ValueError, match="secret_seed: expected an integer >= 0, got -1"):
        evaluate(tmp_path / "x.py", "test", secret_seed=-1)
    with pytest.raises(SystemExit) as exit_:
        main(["submission.py", "--secret-seed", str(10**12)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("FAILED: argument --secret-seed: expected an integer "
                                                               "from 0 to ")


def _fits(secret: int, seed: int, ranked_calls: int) -> bool:
    """Whether every seed of an evaluation with `seed` (all the test shapes) stays a generator seed."""
    largest = max(seed_of_test(seed, len(TEST_SHAPES) - 1, len(CASES) - 1), seed_of_benchmark(seed, 2))
    return combine_seed(largest, secret) + RANKED_SEED_STEP * ranked_calls <= 2**64 - 1


def test_bench_table_names_the_mean_and_its_statistics():
    def row(shape, samples, sol):
        timing = summarize("leaderboard", samples)
        return BenchResult(Shape(*shape), timing, 1000.0, 25.0, sol)

    rows = [row((7168, 16384, 1), [18.0, 20.0, 25.0], 43.1), row((4096, 7168, 8), [70.0, 80.0, 105.0], 21.6)]
    table = format_bench_table(rows)
    header, rule, first, *_, last = table.splitlines()
    assert [h.strip() for h in header.split("  ") if h.strip()] == [
        "shape", "leaderboard time (mean) us", "+- err", "std", "best", "worst", "calls", "GB/s", "% copy BW",
        "% B200 SOL"]
    # the mean (not the median, 20), the standard error and std (n - 1), best, worst, calls
    assert first.split() == ["7168x16384x1", "21.00", "2.08", "3.61", "18.00", "25.00", "3", "1000", "25.0", "43.1"]
    assert last.split()[:2] == ["geomean", "42.25"]  # sqrt(21 * 85): the geomean of the means
    assert "% B200 SOL" not in format_bench_table([row((7168, 16384, 1), [20.0, 21.0], None)])


def test_report_summary_names_both_timed_modes():
    timing = summarize("leaderboard", [10.0, 10.0])
    report = Report(Path("f.py"), "all", "cpu", bench=[BenchResult(SHAPES[0], timing, 1.0, 1.0, None)],
                    ranked=[BenchResult(SHAPES[0], summarize("leaderboard", [12.0, 12.0]), 1.0, 1.0, None, 2)])
    assert report.summary() == ("PASSED: 0 checks and 2 ranked results; leaderboard time (mean), geomean: "
                                "benchmark 10.00 us, ranked 12.00 us")


def test_cli_passes_a_correct_file_that_prints_at_exit(folder, capsys):
    """What its exit handler prints goes to its own pipe: never after the verdict, shown only when asked."""
    path = str(_write(folder, "prints_at_exit", KERNELS["prints_at_exit"]))
    expected = 0 if torch.cuda.is_available() else 4  # on a CPU, 4 of the 9 test shapes: INCOMPLETE
    assert main([path, "--mode", "test"]) == expected
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"{'PASSED' if expected == 0 else 'INCOMPLETE'}: {4 * len(CPU_TEST_SHAPES)} checks")
    assert not any("printed by an exit handler" in line for line in lines)
    assert lines[-2].startswith("the submission wrote ") and lines[-2].endswith("--show-output shows them)")
    assert main([path, "--mode", "test", "--show-output"]) == expected
    lines = capsys.readouterr().out.splitlines()
    assert "[submission] printed by an exit handler" in lines[:-1]


def test_cli_exit_code_after_sys_exit_in_the_call(folder, capsys):
    assert main([str(_write(folder, "exits_in_the_call", KERNELS["exits_in_the_call"])), "--mode", "test"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: 16 problem(s)" in out and f"{CASES[0]}: called sys.exit(0)" in out


def test_cli_exit_code_after_os_exit_in_the_call(folder):
    """The evaluator's own exit code, from the command line: os._exit(0) in the call must not become 0."""
    path = _write(folder, "os_exit_in_the_call", KERNELS["os_exit_in_the_call"])
    proc = subprocess.run([sys.executable, "-m", "nvfp4lib.leaderboard.evaluate", str(path), "--mode", "test"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-2:] == [
        f"FAILED: 1 problem(s) in {path}",
        f"  - 128x256x1, {CASES[0]}: the call ended the process (exit code 0) without an answer"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--seed", "1e17"], f"argument --seed: expected an integer from 0 to {MAX_SEED_OPTION}, got '1e17'"),
    (["--seed", str(10**17)], f"argument --seed: expected an integer from 0 to {MAX_SEED_OPTION}, got {10**17}"),
    (["--reps", "0"], "argument --reps: expected an integer from 1 to 1000000, got 0"),
    (["--timeout", "0"], "argument --timeout: expected a positive number of seconds up to 1000000, got 0.0"),
    (["--time-limit", "nan"], "argument --time-limit: expected a positive number of seconds up to 1000000, got nan"),
    (["--time-limit", "1e10"], "argument --time-limit: expected a positive number of seconds up to 1000000, got "
                               "10000000000.0"),
    (["--timeout", "inf"], "argument --timeout: expected a positive number of seconds up to 1000000, got inf"),
    (["--timeout", "1e999999"], "argument --timeout: expected a positive number of seconds up to 1000000, got inf"),
    (["--time-limit", "ten"], "argument --time-limit: expected a positive number of seconds up to 1000000, got "
                              "'ten'"),
    (["--reps", str(10**7)], f"argument --reps: expected an integer from 1 to 1000000, got {10**7}"),
    (["--seed", "-1"], f"argument --seed: expected an integer from 0 to {MAX_SEED_OPTION}, got -1"),
])
def test_bad_arguments_end_in_one_failed_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["submission.py", *argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"FAILED: {message}"


def test_bad_arguments_to_evaluate_raise_naming_the_argument(tmp_path):
    with pytest.raises(ValueError, match=f"seed: expected an integer from 0 to {MAX_SEED_OPTION}, got {10**17}"):
        evaluate(tmp_path / "x.py", "test", seed=10**17)
    with pytest.raises(ValueError, match="timeout: expected a positive number of seconds up to 1000000, got -1"):
        evaluate(tmp_path / "x.py", "test", timeout=-1)
    with pytest.raises(ValueError, match="time_limit: expected a positive number of seconds up to 1000000, got 1000"):
        evaluate(tmp_path / "x.py", "test", time_limit=1e10)


def test_a_fault_of_the_evaluator_itself_ends_in_one_failed_line(monkeypatch, capsys):
    """Not a verdict on the file: one line naming the error (its first line, at most 500 characters)."""
    import nvfp4lib.leaderboard.evaluate as command_line

    def broken(*args, **kwargs):
        raise RuntimeError("the evaluator broke\n" + "a second line " * 100)

    monkeypatch.setattr(command_line, "evaluate", broken)
    assert main(["submission.py", "--mode", "test"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "FAILED: the evaluator itself failed (RuntimeError: the evaluator broke); no verdict on submission.py"]


def test_an_argument_bad_only_with_the_others_is_a_usage_error_from_evaluate_itself(monkeypatch, capsys):
    """--secret-seed's bound depends on --seed and --mode: `evaluate` checks it, the command line names the option."""
    import nvfp4lib.leaderboard.evaluate as command_line

    calls = []

    def checking(*args, **kwargs):
        calls.append(kwargs["secret_seed"])
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(command_line, "evaluate", checking)
    with pytest.raises(SystemExit) as exit_:
        main(["submission.py", "--seed", str(MAX_SEED_OPTION), "--secret-seed", "0"])
    assert exit_.value.code == 2 and calls == [0]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"FAILED: argument --secret-seed: expected none at all (use a smaller --seed): mixed into the seeds of "
        f"--seed {MAX_SEED_OPTION} a larger one passes 2**64 - 1, the largest generator seed; got 0")


def test_the_scale_copies_are_checked_once_per_test_input_and_never_in_the_timed_modes(folder, monkeypatch):
    import nvfp4lib.leaderboard.modes as modes

    checked, check = [], modes.check_scale_copies

    def counting(data):  # each input named by its shape and its first bytes of A
        checked.append((tuple(data.a.shape), bytes(data.a.view(torch.uint8).flatten()[:64].tolist())))
        return check(data)

    monkeypatch.setattr(modes, "check_scale_copies", counting)
    cpu = torch.device("cpu")
    with SubmissionProcess(cpu, timeout=60, deadline=time.monotonic() + 600, time_limit=600) as process:
        assert process.load(_write(folder, "correct", KERNELS["correct"])).ok
        assert all(r.ok for r in run_tests(process, SHAPES, cpu))
        assert len(checked) == len(set(checked)) == len(CASES) * len(SHAPES)
        checked.clear()
        for mode in ("benchmark", "ranked"):
            rows, checks = run_benchmarks(process, SHAPES, cpu, copy_gbps=100.0, mode=mode, rule=ONLY_CALLS[2],
                                          warmup_rule=ONLY_CALLS[2])
            assert all(c.ok for c in checks) and len(rows) == len(SHAPES)
    assert checked == []


@pytest.mark.gpu
def test_benchmark_on_gpu_times_every_benchmark_shape(folder):
    report = evaluate(_write(folder, "correct", KERNELS["correct"]), "benchmark", warmup=1, reps=3)
    assert report.ok, report.summary()
    assert [r.shape for r in report.bench] == [c.shape for c in report.cases]
    assert report.copy_gbps > 0 and report.geomean_us > 0
    assert all(r.bandwidth_gbps > 0 and r.percent_of_copy > 0 for r in report.bench)


def test_a_skipped_file_does_not_exit_0(folder):
    """Exit 0 means PASSED, nothing else: a file that needs CUDA, on a machine without it, gets 3."""
    if torch.cuda.is_available():
        pytest.skip("the file would run here")
    path = folder / "needs_gpu.py"
    path.write_text(f"{DIRECTIVE}\nNEEDS_CUDA = True\n\ndef custom_kernel(data):\n    return data[6]\n")
    from nvfp4lib.leaderboard.evaluate import main

    assert main([str(path), "--mode", "test"]) == 3
