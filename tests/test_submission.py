"""Exported one-file submissions: self-contained, readable, self-checked, and correct through the
local leaderboard.

Every path is exported once per module. The files are imported in a fresh interpreter in which
nvfp4lib cannot be found (as on the leaderboard machine); every path passes the local leaderboard's
test mode here (the CuTe files through their fallback, the emulation, when there is no GPU), and
the CuTe file cross-compiles its kernels without a GPU, with and without apache-tvm-ffi.
"""

import ast
import bisect
import dataclasses
import functools
import importlib.util
import inspect
import itertools
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nvfp4lib
from nvfp4lib import device, dispatch, fallback, paths, scaled_mm
from nvfp4lib.cute import gemv as cute_gemv
from nvfp4lib.cute import launch as cute_launch
from nvfp4lib.cute import whole_k as cute_whole_k
from nvfp4lib.leaderboard import runtime
from nvfp4lib.contract import validate_gemv_input
from nvfp4lib.leaderboard.evaluate import evaluate, import_isolated
from nvfp4lib.formats import unpack_fp4
from nvfp4lib.layouts import to_permuted
from nvfp4lib.problem import BENCHMARK_SHAPES, generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.leaderboard.export import (EXPORTS, GENERATED, MAX_STREAMS, PACKAGE_FOLDER, STANDALONE, TASK_IMPORT,
                                         ExportError, export_path, export_source, inline_objects, main, sections,
                                         write_submission)
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, TASK_SOURCE, load_submission

REPO = Path(__file__).resolve().parents[1]
CHECKED_PATHS = [name for name in EXPORTS if export_path(name).candidates]  # self-checked, with a fallback
CUDA_PATHS = [name for name in EXPORTS if export_path(name).needs_cuda]
# Evaluated for every file in one interpreter without nvfp4lib: its BACKEND, and for the CuTe files
# the kernels each cross-compiles (tracing a kernel runs every helper it calls, so a helper missing
# from the file fails there). The probe file reports whether nvfp4lib can be imported.
CROSS_COMPILE = {
    "cute_fast": "[type(submission.default_config(k).compile(arch, k)).__name__ for arch, k in "
                 "(('sm_100a', 2048), ('sm_90a', 7168), ('sm_90a', 4608))]",
    "cute_naive": "[type(submission.NaiveConfig().compile(arch)).__name__ for arch in ('sm_100a', 'sm_90a')]",
}
PROBE = ("(getattr(submission, 'BACKEND', None), "
         + "".join(f"{code} if submission.SUBMISSION_PATH == {name!r} and submission.cute is not None else "
                   for name, code in CROSS_COMPILE.items()) + "None)")
LINE_BUDGETS = {"hybrid": 1000, "cute_fast": 1000, "cute_naive": 835, "standalone": 500}
"""The most lines each file may have (the standalone file: `--standalone` of cute_fast, at most 500): the sizes
measured when these bounds were set, so that nothing grows back. About 450 lines of each CuTe file are the CuTe
modules it inlines (the per-K kernel, its decodes and PTX ops, the launch and the host side)."""
PROBE_FILE = """
SUBMISSION_PATH = "probe"
try:
    import nvfp4lib
    BACKEND = "nvfp4lib found"
except ModuleNotFoundError as err:
    BACKEND = str(err)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    files = {name: write_submission(name, folder / f"{name}.py") for name in EXPORTS}
    return files | {"standalone": write_submission("cute_fast", folder / "standalone.py", standalone=True)}


@pytest.fixture(scope="module")
def isolated(exported, tmp_path_factory):
    """{name: (ok, (BACKEND, compiled kernels)) or (False, error)} from the interpreter without nvfp4lib."""
    probe = tmp_path_factory.mktemp("probe") / "probe.py"
    probe.write_text(PROBE_FILE)
    files = {**exported, "probe": probe}
    results = import_isolated(files.values(), PROBE)
    outcome = {}
    for name, file in files.items():
        ok, value = results[str(file.resolve())]
        outcome[name] = (ok, ast.literal_eval(value) if ok else value)
    return outcome


# ---------------------------------------------------------------------------------------------
# The command line


def test_list_names_every_path(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in EXPORTS:
        assert f"{name}  " in out and export_path(name).summary[:40] in out


def test_cli_writes_the_file(tmp_path, capsys):
    out = tmp_path / "nested" / "submission.py"
    assert main(["--path", "scaled_mm_permuted", "--out", str(out)]) == 0
    assert out.read_text().startswith(DIRECTIVE + "\n")
    assert "wrote" in capsys.readouterr().out


def test_unknown_path_is_a_clear_error(capsys):
    with pytest.raises(ExportError, match=rf"^unknown path 'cute_fastest'; choose one of: {', '.join(EXPORTS)}$"):
        export_source("cute_fastest")
    with pytest.raises(ExportError, match="unknown path 'cute'"):  # a name of the old scheme
        export_source("cute")
    assert main(["--path", "cute_fastest"]) == 2
    assert "unknown path 'cute_fastest'" in capsys.readouterr().err


def test_streams_apply_to_the_transposed_path_only():
    assert "gemv_scaled_mm_transposed(data, streams=3)" in export_source("scaled_mm_transposed", streams=3)
    with pytest.raises(ExportError, match="--streams applies only to paths that take streams"):
        export_source("cute_fast", streams=2)


@pytest.mark.parametrize("streams", [-1, True, 2.5, MAX_STREAMS + 1, 10**6])
def test_streams_must_be_a_count_within_the_bound(streams, tmp_path, capsys):
    with pytest.raises(ExportError, match=rf"--streams: expected an integer from 0 to {MAX_STREAMS} \(0 = the "
                                          rf"caller's stream\), got {streams!r}"):
        export_source("scaled_mm_transposed", streams=streams)
    if isinstance(streams, int) and not isinstance(streams, bool):
        assert main(["--path", "scaled_mm_transposed", "--streams", str(streams), "--out", str(tmp_path / "s.py")]) == 2
        assert f"--streams: expected an integer from 0 to {MAX_STREAMS}" in capsys.readouterr().err
        assert not (tmp_path / "s.py").exists()
    assert f"streams={MAX_STREAMS})" in export_source("scaled_mm_transposed", streams=MAX_STREAMS)


def test_existing_file_is_kept_without_force(tmp_path, capsys):
    out = tmp_path / "submission.py"
    out.write_text("# mine\n")
    assert main(["--path", "scaled_mm_permuted", "--out", str(out)]) == 2
    assert f"--out: {out} exists; pass --force to overwrite it" in capsys.readouterr().err
    assert out.read_text() == "# mine\n"
    assert main(["--path", "scaled_mm_permuted", "--out", str(out), "--force"]) == 0
    assert out.read_text().startswith(DIRECTIVE)


def test_a_failed_overwrite_keeps_the_old_file_whole(tmp_path, monkeypatch, capsys):
    """The new text goes to a scratch file beside --out, renamed over it when complete: a write that fails
    half-way (a full disk, say) leaves the old file as it was and no scratch file behind."""
    out = tmp_path / "submission.py"
    out.write_text("# the old file\n")
    real_open = open

    def failing_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "x" in mode:
            handle.write("# half of the new one")
            handle.flush()
            raise OSError(28, "No space left on device")
        return handle

    monkeypatch.setattr("builtins.open", failing_open)
    assert main(["--path", "scaled_mm_permuted", "--out", str(out), "--force"]) == 2
    monkeypatch.undo()
    assert f"--out: cannot write {out}: No space left on device" in capsys.readouterr().err
    assert out.read_text() == "# the old file\n" and [p.name for p in tmp_path.iterdir()] == ["submission.py"]
    assert main(["--path", "scaled_mm_permuted", "--out", str(out), "--force"]) == 0
    assert out.read_text().startswith(DIRECTIVE) and [p.name for p in tmp_path.iterdir()] == ["submission.py"]


def test_out_may_not_be_a_file_of_the_package(tmp_path, capsys):
    """The package's folder holds the source the exporter reads: --out there is refused, --force or not, a
    link into it too; the file is untouched."""
    own = PACKAGE_FOLDER / "paths.py"
    before = own.read_text()
    link = tmp_path / "link.py"
    link.symlink_to(own)
    for out in (own, PACKAGE_FOLDER / "cute" / "new_submission.py", link):
        for force in ([], ["--force"]):
            assert main(["--path", "scaled_mm_permuted", "--out", str(out), *force]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: --out: {out} is inside the nvfp4lib package"), err
    assert own.read_text() == before and not (PACKAGE_FOLDER / "cute" / "new_submission.py").exists()


def test_bad_out_is_a_clear_error(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = {str(tmp_path): "is a folder", str(tmp_path / "new_folder") + "/": "is a folder",
             str(a_file / "submission.py"): "cannot write"}
    for out, message in cases.items():
        assert main(["--path", "scaled_mm_permuted", "--out", out]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith("error: --out: ") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "new_folder").exists()


# ---------------------------------------------------------------------------------------------
# What a file contains


@pytest.mark.parametrize("name", EXPORTS + ("standalone",))
def test_file_is_a_self_contained_leaderboard_entry(exported, name):
    source = exported[name].read_text()
    lines = source.splitlines()
    assert lines[0] == DIRECTIVE
    path = "cute_fast" if name == "standalone" else name
    assert f"path {path!r}" in lines[1] and f"Generated by nvfp4lib {nvfp4lib.__version__}" in source
    assert TASK_IMPORT in lines
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("nvfp4lib"), ast.unparse(node)
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("nvfp4lib") for a in node.names), ast.unparse(node)
    kinds = [isinstance(s, (ast.Import, ast.ImportFrom, ast.Try)) for s in tree.body]
    first_code = next(i for i, s in enumerate(tree.body) if isinstance(s, (ast.FunctionDef, ast.ClassDef)))
    assert not any(kinds[first_code:]), "all imports come before the first definition"
    assert any(isinstance(s, ast.FunctionDef) and s.name == "custom_kernel" for s in tree.body)


def _code_lines(text: str, name: str) -> list[str]:
    """The lines of the top-level definition `name` in `text`, its docstrings (its own and nested ones) left out."""
    lines = text.splitlines()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    docs = {i for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(n)
            for i in range(n.body[0].lineno, n.body[0].end_lineno + 1)}
    return [lines[i - 1] for i in range(node.lineno, node.end_lineno + 1) if i not in docs]


def test_inlined_code_is_the_package_source(exported):
    """Statements keep their source, line for line; only the docstrings are cut (to their first sentence)."""
    source = exported["scaled_mm_transposed"].read_text()
    for obj in (scaled_mm.gemv_scaled_mm_transposed, scaled_mm.blocked_scales, scaled_mm._emulate):
        original = _code_lines(inspect.getsource(scaled_mm), obj.__name__)
        assert _code_lines(source, obj.__name__) == original, f"{obj.__name__} is not inlined verbatim"
    assert "\n# ==== nvfp4lib/scaled_mm.py: " in source and "\n# ==== nvfp4lib/layouts.py: " in source


def test_function_local_package_imports_are_inlined(exported, probe_modules):
    """An import of the package inside a function body: that line goes, the names it imports come."""
    module = probe_modules("local_import", '''
        def entry(data):
            from nvfp4lib.contract import validate_gemv_input
            return validate_gemv_input(data)
    ''')
    imports, code = inline_objects([module.entry])
    body = code[code.index("def entry"):]
    assert "import" not in body
    assert "def validate_gemv_input" in code and "class Shape(NamedTuple)" in code and "def permuted_strides" in code
    namespace = {}
    exec(compile(imports + "\n" + code, "<probe>", "exec"), namespace)
    assert namespace["entry"](generate_input(128, 64, 2)) == (128, 64, 2)
    # in an exported file: what validate_gemv_input uses comes along
    source = exported["scaled_mm_reference"].read_text()
    assert "class Shape(NamedTuple)" in source and "def permuted_strides" in source


def _defined(text: str) -> set[str]:
    return {s.name for s in ast.parse(text).body if isinstance(s, (ast.FunctionDef, ast.ClassDef))}


def test_file_holds_only_what_its_path_needs(exported):
    reference = exported["scaled_mm_reference"].read_text()
    assert "def gemv_scaled_mm_transposed" not in reference and "cutlass.cute" not in reference
    assert "def generate_input" not in reference and "def choose_kernel" not in reference
    for name in CHECKED_PATHS:  # the kernel, its fallback and the self-check, nothing else
        defined = _defined(exported[name].read_text())
        assert {"CuteRunner", "gemv_cublas_permuted", "exact_gemv", "choose_kernel", "first_working", "self_check",
                "dequantized_gemv", "self_check_input"} <= defined, name
        # the self-check's own dequantize-and-matmul, not the package's generator and integer reference, and
        # torch._scaled_mm on cuBLAS alone: no emulation
        assert not defined & {"generate_input", "reference_gemv", "check", "CuteGemv", "gemv_scaled_mm_transposed",
                              "calibrate", "gemv_scaled_mm_permuted", "_emulate", "from_blocked"}, name


# what each CuTe file runs, and what it must not carry: the kernels and configs of the other paths
RUNS = {"cute_fast": {"WholeKConfig", "WholeKPlan", "plan_for", "make_whole_k_kernel", "default_config"},
        "cute_naive": {"NaiveConfig", "make_naive_kernel"}}
NEVER = {"FastConfig", "TiledConfig", "make_fast_kernel", "make_tiled_kernel", "generic_config", "kernel_config"}


@pytest.mark.parametrize("name, runs", [("cute_fast", "cute_fast"), ("hybrid", "cute_fast"),
                                        ("standalone", "cute_fast"), ("cute_naive", "cute_naive")])
def test_no_file_carries_a_kernel_its_path_never_runs(exported, name, runs):
    defined = _defined(exported[name].read_text())
    other = "cute_naive" if runs == "cute_fast" else "cute_fast"
    assert RUNS[runs] <= defined and not defined & (RUNS[other] | NEVER), defined & (RUNS[other] | NEVER)


@pytest.mark.parametrize("name", sorted(LINE_BUDGETS))
def test_files_keep_to_their_line_budgets(exported, name):
    lines = len(exported[name].read_text().splitlines())
    assert lines <= LINE_BUDGETS[name], f"{name}: {lines} lines, more than {LINE_BUDGETS[name]}"


def test_standalone_file_is_the_kernel_alone(exported, isolated):
    """No validation, self-check or fallback: the per-K kernels, their launch and custom_kernel; it declares
    NEEDS_CUDA (the local leaderboard skips it without a GPU) and imports where nvfp4lib does not exist."""
    text = exported["standalone"].read_text()
    defined = _defined(text)
    assert {"CuteLaunch", "custom_kernel", "make_whole_k_kernel", "_cute_fast_unchecked"} <= defined
    assert not defined & {"validate_gemv_input", "TupleCache", "first_working", "self_check", "choose_kernel",
                          "gemv_scaled_mm_permuted", "CuteRunner"}
    assert "\nNEEDS_CUDA = True" in text and TASK_IMPORT in text.splitlines()
    assert ": `python -m nvfp4lib.leaderboard.export --path cute_fast --standalone`\n" in text
    ok, value = isolated["standalone"]
    assert ok, value
    with pytest.raises(ExportError, match=rf"^--standalone: only for {', '.join(STANDALONE)}, not 'hybrid'$"):
        export_source("hybrid", standalone=True)
    with pytest.raises(ExportError, match="'cute_fast' has no fallback"):
        export_source("cute_fast", standalone=True, fail=("scaled_mm_permuted",))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_standalone_file_is_skipped_by_the_local_leaderboard_without_a_gpu(exported):
    report = evaluate(exported["standalone"], "test")
    assert report.verdict == "SKIPPED" and "needs a CUDA GPU" in report.skipped


def _candidate_table(source: str) -> dict:
    """The generated ``KERNEL, BACKEND = choose_kernel({name: (unavailable, build), ...})``, as source text."""
    tree = ast.parse(source)
    setup = next(s for s in tree.body if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "(KERNEL, BACKEND)")
    assert ast.unparse(setup.value.func) == "choose_kernel"
    table = setup.value.args[0]
    return {ast.literal_eval(key): tuple(ast.unparse(part) for part in value.elts)
            for key, value in zip(table.keys, table.values)}


@pytest.mark.parametrize("name", CHECKED_PATHS)
def test_checked_files_try_their_kernel_then_the_fallback_order(exported, name):
    """One fallback order, paths.FILE_FALLBACK_ORDER, written into every self-checked file, each path with the
    registry's own availability check and builder (one per path; `paths.IN_A_FILE`'s where a file runs it on
    cuBLAS alone, or it is the file's last resort)."""
    table = _candidate_table(exported[name].read_text())
    first = {"cute_naive": "cute_naive", "cute_fast": "cute_fast", "hybrid": "cute_fast"}[name]
    assert list(table) == [first, *paths.FILE_FALLBACK_ORDER[1:]] == list(export_path(name).candidates)
    assert paths.FILE_FALLBACK_ORDER == ("cute_fast", "scaled_mm_permuted", "exact")
    for candidate, (unavailable, build) in table.items():
        expected = paths.IN_A_FILE.get(candidate) or (paths.PATHS[candidate].unavailable, paths.PATHS[candidate].build)
        assert (unavailable, build) == tuple(fn.__name__ for fn in expected)
    assert table["scaled_mm_permuted"] == ("needs_fp4_gemm", "_scaled_mm_cublas")
    text = exported[name].read_text()
    assert "def _scaled_mm_cublas()" in text and "def _exact()" in text and f"def _{first}()" in text
    assert "def build_path" not in text


def test_a_builder_that_cannot_be_inlined_stops_the_export(monkeypatch):
    monkeypatch.setitem(paths.PATHS, "cute_fast", dataclasses.replace(paths.PATHS["cute_fast"], build=lambda: None))
    with pytest.raises(ExportError, match=r"^cute_fast: build: .*lambda.* cannot be inlined; give it a name "
                                          r"in nvfp4lib\.paths"):
        export_source("hybrid")


@pytest.mark.parametrize("name", EXPORTS)
def test_sections_name_the_inlined_modules_by_their_paths(exported, name):
    text = exported[name].read_text()
    found = sections(text)
    assert sum(section.lines for section in found) == len(text.splitlines())
    assert found[0].name == GENERATED and found[-1].name == GENERATED
    modules = [section.name for section in found[1:-1]]
    assert modules and all(m.startswith("nvfp4lib/") and m.endswith(".py") and (REPO / m).is_file() for m in modules)
    assert len(set(modules)) == len(modules) and "nvfp4lib/scaled_mm.py" in modules
    if name in CHECKED_PATHS:
        assert {"nvfp4lib/cute/gemv.py", "nvfp4lib/fallback.py", "nvfp4lib/leaderboard/runtime.py"} <= set(modules)
        assert "nvfp4lib/leaderboard/export.py" not in modules, "the exporter stays out of the submissions"


@pytest.mark.parametrize("name", EXPORTS + ("standalone",))
def test_exported_files_carry_no_bench_or_study_code(exported, name):
    """The wings stay out of submissions: a file carries the core, and the leaderboard's runtime."""
    wings = [section.name for section in sections(exported[name].read_text())
             if section.name.startswith(("nvfp4lib/bench/", "nvfp4lib/study/"))]
    assert not wings, f"{name} carries {wings}"


def test_functions_keep_their_names_but_not_their_docstrings(exported):
    """The file's functions are the package's, under its names; their docstrings stay in the package."""
    module = load_submission(exported["hybrid"])
    for name in ("gemv_cublas_permuted", "cute_arch", "validate_gemv_input"):
        original = getattr(scaled_mm, name, None) or getattr(device, name, None) or \
            getattr(sys.modules["nvfp4lib.contract"], name)
        assert original.__doc__ and getattr(module, name).__doc__ is None, name


@pytest.mark.parametrize("name", ["hybrid", "cute_fast", "standalone"])
def test_docstrings_stay_in_the_package(exported, name):
    """Every file's rendering, as its header says: no docstrings (each section names the module that has them),
    but where one is a block's whole body, which keeps its first sentence's start on one line."""
    text = exported[name].read_text()
    assert "(without its docstrings: each section names the file that has them)" in " ".join(text.split())
    starts = list(itertools.accumulate(section.lines for section in sections(text)))
    names = [section.name for section in sections(text)]
    left_out = 0
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        section = names[bisect.bisect_left(starts, node.lineno)]
        if section == GENERATED:
            continue
        original = inspect.getdoc(getattr(importlib.import_module(section[:-3].replace("/", ".")), node.name, None))
        doc = ast.get_docstring(node)
        if doc is None:
            left_out += original is not None
            continue
        assert len(node.body) == 1 and node.body[0].lineno == node.body[0].end_lineno, node.name
        assert " ".join(original.split()).startswith(doc.removesuffix(" ...")), (node.name, doc, original)
    assert left_out > 30, left_out


def _class_members(text: str, cls: str) -> set[str]:
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {m.name for m in node.body if isinstance(m, ast.FunctionDef)}


def test_classes_carry_only_the_members_some_inlined_code_reads(exported):
    """A class's methods and properties are inlined where some inlined code names them (``x.name``, or a string
    such as ``hasattr(x, "refusal")``), its dunders always: the per-K plan's `describe` is for the benchmarks."""
    from nvfp4lib.cute import gemv

    _, code = inline_objects([gemv.per_k_rule])  # builds a WholeKConfig, and calls none of its methods
    assert _class_members(code, "WholeKConfig") == {"__post_init__"}
    text = exported["hybrid"].read_text()
    assert {"refusal", "compile", "compiled", "sum_rows", "__post_init__"} <= _class_members(text, "WholeKConfig")
    assert {"get", "key", "__init__"} <= _class_members(text, "TupleCache")
    assert "summary" in _class_members(text, "Capabilities")  # describe_backend's message reads it


# ---------------------------------------------------------------------------------------------
# Export errors


def test_reference_to_the_package_itself_is_an_error(probe_modules):
    module = probe_modules("package", '''
        import nvfp4lib

        def version():
            return nvfp4lib.__version__
    ''')
    with pytest.raises(ExportError, match="the nvfp4lib package itself"):
        inline_objects([module.version])


def test_only_package_objects_can_be_inlined():
    with pytest.raises(ExportError, match="only functions and classes defined in nvfp4lib"):
        inline_objects([torch.matmul])


@pytest.fixture
def probe_modules(tmp_path, monkeypatch):
    """Register small throwaway modules as nvfp4lib._probe_<name> (the exporter reads their source)."""

    def make(name: str, source: str):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        spec = importlib.util.spec_from_file_location(f"nvfp4lib._probe_{name}", path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)
        spec.loader.exec_module(module)
        return module

    return make


def test_undefined_name_is_an_error(probe_modules):
    module = probe_modules("undefined", '''
        def entry(data):
            return helper_that_does_not_exist(data)
    ''')
    with pytest.raises(ExportError, match="uses 'helper_that_does_not_exist', which nvfp4lib._probe_undefined does "
                                          "not define or import"):
        inline_objects([module.entry])


def test_name_clash_between_modules_is_an_error(probe_modules):
    probe_modules("b", '''
        def scale():
            return 2

        def twice():
            return scale()
    ''')
    module = probe_modules("a", '''
        from nvfp4lib._probe_b import twice

        def scale():
            return 3

        def entry():
            return scale() + twice()
    ''')
    with pytest.raises(ExportError, match="name clash: 'scale' is defined by"):
        inline_objects([module.entry])


def test_probe_modules_inline_when_consistent(probe_modules):
    probe_modules("c", '''
        LIMIT = 6.0  # the largest magnitude

        def clamp(x):
            """Keep x within +-LIMIT."""
            return max(-LIMIT, min(LIMIT, x))
    ''')
    module = probe_modules("d", '''
        import math

        def entry(x):
            from nvfp4lib._probe_c import clamp
            return math.floor(clamp(x))
    ''')
    imports, code = inline_objects([module.entry])
    assert imports.strip() == "import math"
    namespace = {}
    exec(compile(imports + "\n" + code, "<probe>", "exec"), namespace)
    assert namespace["entry"](9.5) == 6 and "LIMIT = 6.0  # the largest magnitude" in code


# ---------------------------------------------------------------------------------------------
# Running without nvfp4lib


def test_isolated_interpreter_really_lacks_nvfp4lib(isolated):
    ok, (message, compiled) = isolated["probe"]
    assert ok and message.startswith("No module named 'nvfp4lib'") and compiled is None


@pytest.mark.parametrize("name", EXPORTS)
def test_file_imports_where_nvfp4lib_does_not_exist(isolated, name):
    ok, value = isolated[name]
    assert ok, value
    if name in CHECKED_PATHS and not torch.cuda.is_available():
        assert value[0] == runtime.describe_kernel("exact", None)


@pytest.mark.cute
@pytest.mark.parametrize("name", sorted(CROSS_COMPILE))
def test_cute_file_compiles_its_kernels_without_nvfp4lib(isolated, name):
    ok, value = isolated[name]
    assert ok, value
    assert value[1] and all("JitCompiledFunction" in kind for kind in value[1]), value[1]


@pytest.mark.parametrize("name", EXPORTS)
def test_path_passes_the_local_leaderboard_test_mode(exported, name):
    report = evaluate(exported[name], "test")
    assert report.ok, report.summary()
    assert report.cases and all(case.ok for case in report.cases)
    assert report.submission_path == name and not report.skipped


def _run_file(path, code: str, tmp_path) -> subprocess.CompletedProcess:
    """Import the file as `submission` in a fresh interpreter, in an empty folder holding only it and a
    stand-in `task` module, no logging configured, then run `code`: what a leaderboard process sees."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "task.py").write_text(TASK_SOURCE)
    (folder / "submission.py").write_text(Path(path).read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NVFP4_PATH")}
    return subprocess.run([sys.executable, "-c", "import submission\n" + textwrap.dedent(code)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
@pytest.mark.parametrize("name", CUDA_PATHS)
def test_cute_file_without_cuda_says_why_at_info_and_runs_its_fallback(exported, name, caplog):
    """No GPU is information, not a failure: logged at INFO, nothing on stderr by default."""
    with caplog.at_level(logging.INFO):
        module = load_submission(exported[name])
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("INFO", f"{name} cannot run here (the CuTe kernel needs the inputs on a CUDA GPU); using exact"),
                    ("INFO", "scaled_mm_permuted cannot run here (cuBLAS's FP4 GEMM needs the inputs on a CUDA GPU); "
                             "using exact"), ("INFO", "self-check ok: exact on cpu")]
    assert module.BACKEND == "the exact dequantize-and-matmul, in float64 (slow)"
    data = generate_input(128, 256, 1, seed=11)
    poison_(data.c)
    assert check(module.custom_kernel(data), data).ok


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_a_file_on_a_machine_without_its_kernel_prints_nothing(exported, tmp_path):
    run = _run_file(exported["hybrid"], "print(submission.BACKEND)", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and run.stdout.strip() == "the exact dequantize-and-matmul, in float64 (slow)"


def test_hybrid_file_keeps_its_kernel_after_a_first_call_with_a_bad_input(exported, tmp_path):
    """c requiring grad, then a wrong dtype of c, then a valid call: each bad call gets the error naming
    c, nothing is discarded, and the valid call is right (it used to fail with "no GEMV path passed")."""
    run = _run_file(exported["hybrid"], """
        import torch
        from submission import NVFP4InputError, dequantized_gemv, self_check_input
        data = self_check_input(128, 256, 1, "cpu")
        for bad in (data.c.clone().requires_grad_(), data.c.float()):
            try:
                submission.custom_kernel(data._replace(c=bad))
            except NVFP4InputError as err:
                print("refused:", err)
        data.c.fill_(float("nan"))
        out = submission.custom_kernel(data).double()
        print("ok" if torch.isclose(out, dequantized_gemv(data), rtol=1e-3, atol=1e-3).all() else "WRONG")
    """, tmp_path)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("refused: ") and "c: expected a tensor that does not require grad" in lines[0]
    assert lines[1].startswith("refused: ") and "c: expected dtype torch.float16, got torch.float32" in lines[1]
    assert lines[2:] == ["ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the CuTe kernel would pass")
def test_a_real_failure_is_a_warning_on_stderr(tmp_path):
    path = write_submission("hybrid", tmp_path / "broken.py", fail=("exact",))
    run = _run_file(path, "print(submission.BACKEND)", tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "no path passed its self-check"
    assert run.stderr.splitlines() == ["exact could not be built (RuntimeError: made to fail on purpose (exported with "
                                       "--fail-path)); no path is left"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.cute] if n.startswith("cute") else [])
                                  for n in EXPORTS])
def test_path_passes_the_local_leaderboard_on_gpu(exported, name):
    report = evaluate(exported[name], "both", warmup=2, reps=5)
    assert report.ok, report.summary()
    assert len(report.bench) == 3 and report.geomean_us > 0
    if name in CUDA_PATHS:
        assert report.backend.startswith("CuTe DSL")


@pytest.mark.cute
def test_cute_file_without_tvm_ffi_compiles_for_the_plain_call(exported):
    """apache-tvm-ffi hidden in the interpreter without nvfp4lib: the file still builds its kernels."""
    expression = ("(submission.sys.modules.__setitem__('tvm_ffi', None), submission.tvm_ffi_problem() is None, "
                  "type(submission.default_config(2048).compile('sm_100a', 2048)).__name__)[1:]")
    (ok, value), = import_isolated([exported["cute_fast"]], expression).values()
    assert ok, value
    assert ast.literal_eval(value) == (False, "CudaDialectJitCompiledFunction")


# ---------------------------------------------------------------------------------------------
# The self-check and the fallback (the runtime code the files inline, run in the package)


def test_self_check_input_covers_every_code_and_the_scales_the_leaderboard_can_give():
    for m, k, l in fallback.SELF_CHECK_SHAPES:
        data = fallback.self_check_input(m, k, l, "cpu")
        assert validate_gemv_input(data) == (m, k, l)
        a, b, sfa, sfb, sfa_p, sfb_p, _ = data
        for codes in (unpack_fp4(a[:, :, 0]), unpack_fp4(b[0, :, 0])):  # the vector is row 0
            assert set(codes[..., 0::2].unique().tolist()) == set(range(16))  # low nibbles
            assert set(codes[..., 1::2].unique().tolist()) == set(range(16))  # high nibbles
        assert not torch.equal(b.view(torch.uint8)[0], b.view(torch.uint8)[1])  # padding a path must not read
        assert set(sfa.view(torch.uint8)[:, 0, 0].tolist()) == set(range(127))  # every E4M3 code with no sign bit
        for sf in (sfa, sfb[:1]):
            scales = sf.float()
            assert (scales >= 0).all() and (scales == 0).any() and ((scales > 0) & (scales < 2.0 ** -6)).any()
            assert scales.max() == 448.0 or sf is not sfa  # subnormals, and up to 448 in A's
        assert (sfa.float() * sfb[:1].float()).max() <= 448 * 7 * 2.0 ** -9  # one side of each block is narrow
        assert torch.equal(sfa_p.view(torch.uint8), to_permuted(sfa).view(torch.uint8))
        assert torch.equal(sfb_p.view(torch.uint8), to_permuted(sfb).view(torch.uint8))


def test_the_dequantized_product_is_the_exact_reference():
    """The self-check's few lines of float64 against the package's exact integer reference (an independent
    decode): equal at every element of every self-check shape, rounded to float32."""
    from nvfp4lib.reference import reference_gemv

    for shape in fallback.SELF_CHECK_SHAPES:
        data = fallback.self_check_input(*shape, "cpu")
        assert torch.equal(fallback.dequantized_gemv(data).float(), reference_gemv(data)), shape


def _ignores_sign(data):
    """A plausible bug: the emulation on |A| (sign bits of the codes cleared)."""
    a, *rest = data
    return scaled_mm.gemv_scaled_mm_permuted(((a.view(torch.uint8) & 0x77).view(torch.float4_e2m1fn_x2), *rest))


def test_self_check_catches_a_wrong_kernel_and_passes_a_right_one():
    assert fallback.self_check(scaled_mm.gemv_scaled_mm_permuted, "cpu") is None
    assert fallback.self_check(_ignores_sign, "cpu").startswith("wrong result at (m, k, l) = (128, 256, 2)")
    assert fallback.self_check(lambda data: data.c, "cpu").startswith("wrong result")  # c left as poisoned


def test_self_check_covers_every_k_the_default_kernel_is_specialised_for_with_inputs_made_once(monkeypatch):
    assert {k for _, k, _ in fallback.SELF_CHECK_SHAPES} >= {k for _, k, _ in BENCHMARK_SHAPES}
    made = []
    real = fallback.self_check_input
    monkeypatch.setattr(fallback, "self_check_input", lambda *args: made.append(args) or real(*args))
    fallback._self_check_input_on.cache_clear()
    for kernel in (scaled_mm.gemv_scaled_mm_permuted, _ignores_sign, scaled_mm.gemv_scaled_mm_permuted):
        fallback.self_check(kernel, "cpu")
    assert made == [(*shape, torch.device("cpu")) for shape in fallback.SELF_CHECK_SHAPES]
    assert fallback.self_check(_ignores_sign, torch.device("cpu")).startswith("wrong result")


def _table(**kernels):
    """choose_kernel's table: name -> (runs anywhere, a builder giving the kernel or raising the exception)."""
    def builder(kernel):
        def build():
            if isinstance(kernel, Exception):
                raise kernel
            return kernel
        return build

    return {name: (paths.runs_anywhere, builder(kernel)) for name, kernel in kernels.items()}


def _said(caplog):
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_a_failing_build_falls_back_with_one_warning(caplog):
    with caplog.at_level(logging.INFO, logger="nvfp4lib.fallback"):
        kernel, backend = runtime.choose_kernel(_table(
            first=RuntimeError("NVVM_ERROR_COMPILATION: unsupported operation\nmore"),
            second=scaled_mm.gemv_scaled_mm_permuted))
    assert _said(caplog) == [
        ("WARNING", "first could not be built (RuntimeError: NVVM_ERROR_COMPILATION: unsupported operation); "
                    "using second"), ("INFO", "self-check ok: second on cpu")]
    assert kernel is scaled_mm.gemv_scaled_mm_permuted and backend == "second"


def test_a_wrong_result_falls_back(caplog):
    with caplog.at_level(logging.INFO, logger="nvfp4lib.fallback"):
        kernel, _ = runtime.choose_kernel(_table(sign_bug=_ignores_sign, right=scaled_mm.gemv_scaled_mm_permuted))
    (level, first), last = _said(caplog)
    assert level == "WARNING" and first.startswith("sign_bug failed its self-check (wrong result at (m, k, l) = "
                                                   "(128, 256, 2): ")
    assert first.endswith("; using right") and last == ("INFO", "self-check ok: right on cpu")
    assert kernel is scaled_mm.gemv_scaled_mm_permuted


def test_a_path_that_raises_later_stays_chosen_and_the_caller_gets_the_error():
    """The choice is made once: KERNEL is the kernel itself (nothing on the hot path), and an error
    of a later call is the caller's; the next call runs the same kernel."""
    calls = []

    def breaks_once(data):
        calls.append(data.a.shape)
        if len(calls) == len(fallback.SELF_CHECK_SHAPES) + 1:  # the first real call
            raise RuntimeError("CUDA_ERROR_LAUNCH_TIMEOUT")
        return scaled_mm.gemv_scaled_mm_permuted(data)

    kernel, backend = runtime.choose_kernel(_table(flaky=breaks_once, steady=scaled_mm.gemv_scaled_mm_permuted))
    assert kernel is breaks_once and backend == "flaky"
    data = generate_input(256, 512, 2, seed=5)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_LAUNCH_TIMEOUT"):
        kernel(data)
    poison_(data.c)
    assert check(kernel(data), data).ok


def test_when_every_path_fails_the_file_imports_and_every_call_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="nvfp4lib.fallback"):
        kernel, backend = runtime.choose_kernel(_table(one=RuntimeError("no"), two=_ignores_sign))
    said = _said(caplog)
    assert said[0] == ("WARNING", "one could not be built (RuntimeError: no); no path is left")
    assert said[1][0] == "WARNING" and said[1][1].startswith("two failed its self-check (wrong result")
    assert len(said) == 2
    assert backend == runtime.NO_PATH
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"^no GEMV path passed its self-check on this machine: one could not "
                                               r"be built \(RuntimeError: no\); two failed its self-check"):
            kernel(generate_input(128, 256, 1))


_real_self_check = fallback.self_check


def test_a_cute_kernel_that_does_not_compile_falls_back_to_scaled_mm(monkeypatch, caplog):
    """The real path: a machine that looks like a B200 with the DSL, where compiling fails."""
    caps = dataclasses.replace(device.capabilities(), cuda=True, name="NVIDIA B200", sm=(10, 0), cute_dsl=True,
                               cute_arch="sm_100a", hw_e2m1=True, fp4_gemm=True)
    for module in (runtime, fallback):
        monkeypatch.setattr(module, "capabilities", lambda: caps)
    monkeypatch.setattr(cute_gemv, "cute_arch", lambda: "sm_100a")
    monkeypatch.setattr(scaled_mm, "_cublas_fp4", scaled_mm._emulate)  # cuBLAS's FP4 GEMM, on this CPU

    def fails(*args, **kwargs):
        raise RuntimeError("NVVM_ERROR_COMPILATION: unsupported operation")

    monkeypatch.setattr(cute_whole_k.WholeKConfig, "compile", fails)
    monkeypatch.setattr(fallback, "self_check", lambda kernel, where: _real_self_check(kernel, "cpu"))  # no GPU here
    cute_launch.compiled_kernel.cache_clear()
    table = {name: paths.IN_A_FILE.get(name) or (paths.PATHS[name].unavailable, paths.PATHS[name].build)
             for name in export_path("hybrid").candidates}
    try:
        with caplog.at_level(logging.INFO, logger="nvfp4lib.fallback"):
            kernel, backend = runtime.choose_kernel(table)
    finally:
        cute_launch.compiled_kernel.cache_clear()
    assert _said(caplog)[-2] == ("WARNING", "cute_fast could not be built (RuntimeError: NVVM_ERROR_COMPILATION: "
                                            "unsupported operation); using scaled_mm_permuted")
    assert _said(caplog)[-1] == ("INFO", "self-check ok: scaled_mm_permuted on NVIDIA B200 (sm_100)")
    assert kernel is scaled_mm.gemv_cublas_permuted
    assert backend == "torch._scaled_mm on the permuted scales (cuBLAS's FP4 GEMM)"


def test_fail_path_is_checked_and_written_into_the_file(tmp_path):
    with pytest.raises(ExportError, match=r"--fail-path 'nope': not a path of 'hybrid' "
                                          r"\(its paths: cute_fast, scaled_mm_permuted, exact\)"):
        export_source("hybrid", fail=("nope",))
    with pytest.raises(ExportError, match=r"--fail-path 'scaled_mm': not a path of 'hybrid'"):  # an old name
        export_source("hybrid", fail=("scaled_mm",))
    with pytest.raises(ExportError, match="'scaled_mm_permuted' has no fallback"):
        export_source("scaled_mm_permuted", fail=("cute_fast",))
    text = export_source("hybrid", fail=("scaled_mm_permuted",))
    assert "}, fail=('scaled_mm_permuted',))" in text
    assert ": `python -m nvfp4lib.leaderboard.export --path hybrid --fail-path scaled_mm_permuted`\n" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the CuTe kernel would pass")
def test_file_whose_every_path_fails_imports_and_raises_when_called(tmp_path, caplog):
    path = write_submission("hybrid", tmp_path / "broken.py", fail=("exact",))
    with caplog.at_level(logging.INFO):
        module = load_submission(path)
    assert module.BACKEND == "no path passed its self-check"
    assert ("WARNING", "exact could not be built (RuntimeError: made to fail on purpose (exported with "
                       "--fail-path)); no path is left") in _said(caplog)
    with pytest.raises(RuntimeError, match="no GEMV path passed its self-check"):
        module.custom_kernel(generate_input(128, 256, 1))


MACHINES = {
    "cpu": dict(cuda=False, name="cpu", sm=None, fp4_gemm=False, cute_dsl=True, cute_arch=None),
    "hopper": dict(cuda=True, name="NVIDIA H200", sm=(9, 0), fp4_gemm=False, cute_dsl=True, cute_arch="sm_90a"),
    "hopper, no DSL": dict(cuda=True, name="NVIDIA H200", sm=(9, 0), fp4_gemm=False, cute_dsl=False,
                           cute_arch="sm_90a"),
    "blackwell": dict(cuda=True, name="NVIDIA B200", sm=(10, 0), fp4_gemm=True, cute_dsl=True, cute_arch="sm_100a"),
    "blackwell, no DSL": dict(cuda=True, name="NVIDIA B200", sm=(10, 0), fp4_gemm=True, cute_dsl=False,
                              cute_arch="sm_100a"),
}


CHOSEN = {"cpu": ("exact", "scaled_mm_permuted"), "hopper": ("cute_fast", "cute_fast"),
          "hopper, no DSL": ("exact", "scaled_mm_permuted"), "blackwell": ("cute_fast", "cute_fast"),
          "blackwell, no DSL": ("scaled_mm_permuted", "scaled_mm_permuted")}
"""(the hybrid file's choice, the dispatcher's) where nothing is measured or forced: the same where a CuTe kernel
or cuBLAS's FP4 GEMM runs; elsewhere the file runs the exact product and the dispatcher the emulation."""


@pytest.mark.parametrize("machine", MACHINES)
def test_dispatcher_and_exported_files_choose_with_one_function(machine, monkeypatch):
    """The dispatcher and the hybrid file hand `first_working` the fallback order with the registry's
    availability checks and builders (the file's own for the paths of `paths.IN_A_FILE`), so on one machine
    they pass over the same paths and run the same kernel where a kernel or cuBLAS runs (`CHOSEN`)."""
    caps = dataclasses.replace(device.capabilities(), **MACHINES[machine])
    seen = {}

    def recording(who):
        def first_working(candidates, build, where, *, unavailable=None, **dispatchers_own):
            runnable = [name for name in candidates if unavailable(name) is None]
            seen[who] = (runnable, build(runnable[0]))
            return fallback.Choice(runnable[0], seen[who][1], ())
        return first_working

    built = {"cute_fast": "built cute_fast"}  # compiling needs a GPU: count the registry's builder instead
    monkeypatch.setitem(paths.PATHS, "cute_fast", dataclasses.replace(paths.PATHS["cute_fast"],
                                                                      build=functools.partial(built.get, "cute_fast")))
    monkeypatch.setattr(runtime, "capabilities", lambda: caps)
    monkeypatch.setattr(dispatch, "capabilities", lambda: caps)
    monkeypatch.setattr(runtime, "first_working", recording("file"))
    monkeypatch.setattr(dispatch, "first_working", recording("dispatcher"))
    monkeypatch.setattr(runtime, "describe_kernel", lambda name, kernel: name)
    runtime.choose_kernel({name: paths.IN_A_FILE.get(name) or (paths.PATHS[name].unavailable, paths.PATHS[name].build)
                           for name in export_path("hybrid").candidates})
    mine = dispatch.Dispatcher()
    data = generate_input(128, 256, 1)
    mine._plan(data, (data.a.shape, caps.cuda, None, None))
    assert (seen["file"][0][0], seen["dispatcher"][0][0]) == CHOSEN[machine]
    assert seen["dispatcher"][0] == paths.fallback_paths(caps, caps.cuda)
    assert seen["file"][0][-1] == "exact"
    expected = {"cute_fast": "built cute_fast", "scaled_mm_permuted": scaled_mm.gemv_cublas_permuted,
                "exact": fallback.exact_gemv}
    assert seen["file"][1] == expected[CHOSEN[machine][0]]
