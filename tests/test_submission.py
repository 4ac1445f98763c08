"""Exported one-file submissions: self-contained, readable, and correct through the local leaderboard.

Every path is exported once per module. The files are imported in a fresh interpreter in which
nvfp4lib cannot be found (as on the leaderboard machine); the paths that run without CUDA pass the
local leaderboard's test mode here, and the CuTe files cross-compile their kernels without a GPU.
"""

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import nvfp4lib
from nvfp4lib import device, scaled_mm
from nvfp4lib.evaluate import evaluate, load_submission
from nvfp4lib.problem import generate_input
from nvfp4lib.submission import (DIRECTIVE, PATHS, TASK_IMPORT, ExportError, export_source, inline_objects, main,
                                 write_submission)

CPU_PATHS = [name for name, spec in PATHS.items() if not spec.needs_cuda]
CUDA_PATHS = [name for name, spec in PATHS.items() if spec.needs_cuda]
# What each CuTe file cross-compiles in the clean interpreter: (variant, target) pairs.
CROSS_COMPILE = {"cute_fast": [("fast", "sm_100a"), ("fast", "sm_90a")], "cute_naive": [("naive", "sm_90a")]}

# Runs in a fresh interpreter: hide nvfp4lib (sys.path and any installed finder), provide `task`,
# import each file, and for the CuTe files compile the kernels through the file's own code.
CLEAN_IMPORT = textwrap.dedent('''
    import importlib.abc, importlib.util, json, os, sys, types

    class HideNvfp4lib(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "nvfp4lib":
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, HideNvfp4lib())
    sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or os.getcwd(), "nvfp4lib"))]
    import torch

    task = types.ModuleType("task")
    task.input_t, task.output_t = tuple, torch.Tensor
    sys.modules["task"] = task
    results = {}
    for name, path, compile_for in json.loads(sys.argv[1]):
        result = results[name] = {"ok": False}
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            result.update(ok=True, backend=module.BACKEND, nvfp4lib_found=importlib.util.find_spec("nvfp4lib") is not None)
            if compile_for and module.cute is not None:
                for variant, arch in compile_for:
                    module.compile_gemv(variant, arch)
                result["compiled"] = compile_for
        except Exception as err:
            result["error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(results))
''')


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    return {name: write_submission(name, folder / f"{name}.py") for name in PATHS}


@pytest.fixture(scope="module")
def clean_imports(exported, tmp_path_factory):
    """{path: outcome} of importing every exported file where nvfp4lib does not exist."""
    jobs = [(name, str(file), CROSS_COMPILE.get(name)) for name, file in exported.items()]
    proc = subprocess.run([sys.executable, "-c", CLEAN_IMPORT, json.dumps(jobs)], capture_output=True, text=True,
                          cwd=tmp_path_factory.mktemp("elsewhere"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# The command line


def test_list_names_every_path(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, spec in PATHS.items():
        assert f"{name}  " in out and spec.summary[:40] in out


def test_cli_writes_the_file(tmp_path, capsys):
    out = tmp_path / "nested" / "submission.py"
    assert main(["--path", "scaled_mm_permuted", "--out", str(out)]) == 0
    assert out.read_text().startswith(DIRECTIVE + "\n")
    assert "wrote" in capsys.readouterr().out


def test_unknown_path_is_a_clear_error(capsys):
    with pytest.raises(ExportError, match="unknown path 'cute_fastest'; choose one of: scaled_mm_reference"):
        export_source("cute_fastest")
    assert main(["--path", "cute_fastest"]) == 2
    assert "unknown path 'cute_fastest'" in capsys.readouterr().err


def test_streams_apply_to_the_transposed_path_only():
    assert "gemv_scaled_mm_transposed(data, streams=3)" in export_source("scaled_mm_transposed", streams=3)
    with pytest.raises(ExportError, match="--streams applies only to paths that take streams"):
        export_source("cute_fast", streams=2)


# ---------------------------------------------------------------------------------------------
# What a file contains


@pytest.mark.parametrize("name", PATHS)
def test_file_is_a_self_contained_leaderboard_entry(exported, name):
    source = exported[name].read_text()
    lines = source.splitlines()
    assert lines[0] == DIRECTIVE
    assert f"path {name!r}" in lines[1] and f"Generated by nvfp4lib {nvfp4lib.__version__}" in source
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


def test_inlined_code_is_the_package_source(exported):
    source = exported["scaled_mm_transposed"].read_text()
    for obj in (scaled_mm.gemv_scaled_mm_transposed, scaled_mm.BlockedScaleCache, scaled_mm.emulated_scaled_mm_fp4):
        assert inspect.getsource(obj) in source, f"{obj.__name__} is not inlined verbatim"
    assert "# nvfp4lib/scaled_mm.py" in source and "# nvfp4lib/layouts.py" in source


def test_function_local_package_imports_are_inlined(exported):
    """validate_gemv_input imports from layouts and problem inside its body: those lines go, the names come."""
    source = exported["scaled_mm_reference"].read_text()
    body = source[source.index("def validate_gemv_input"):]
    body = body[:body.index("\n\n\n")]
    assert "import" not in body
    assert "class Shape(NamedTuple)" in source and "def permuted_strides" in source


def test_file_holds_only_what_its_path_needs(exported):
    reference = exported["scaled_mm_reference"].read_text()
    assert "def gemv_scaled_mm_transposed" not in reference and "cutlass.cute" not in reference
    assert "def generate_input" not in reference  # from problem.py only Shape is needed
    cute = exported["cute_fast"].read_text()
    assert "def emulated_scaled_mm_fp4" not in cute and "class CuteGemv" in cute
    hybrid = exported["hybrid"].read_text()
    assert "class CuteGemv" in hybrid and "def gemv_scaled_mm_permuted" in hybrid


def test_functions_keep_their_names_and_docstrings(exported):
    module = load_submission(exported["hybrid"])
    for name in ("gemv_scaled_mm_permuted", "gemv_scaled_mm_transposed", "capabilities", "validate_gemv_input"):
        original = getattr(scaled_mm, name, None) or getattr(device, name, None) or \
            getattr(sys.modules["nvfp4lib.validate"], name)
        assert getattr(module, name).__doc__ == original.__doc__


# ---------------------------------------------------------------------------------------------
# Export errors


def test_reference_to_the_package_itself_is_an_error():
    with pytest.raises(ExportError, match="the nvfp4lib package itself"):
        inline_objects([device.environment_report])


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


@pytest.mark.parametrize("name", PATHS)
def test_file_imports_where_nvfp4lib_does_not_exist(clean_imports, name):
    outcome = clean_imports[name]
    assert outcome["ok"], outcome.get("error")
    assert not outcome["nvfp4lib_found"]
    assert outcome["backend"]


@pytest.mark.cute
@pytest.mark.parametrize("name", CROSS_COMPILE)
def test_cute_file_compiles_its_kernels_without_nvfp4lib(clean_imports, name):
    """Tracing a CuTe kernel runs every helper it calls, so a helper missing from the file fails here."""
    assert clean_imports[name].get("compiled") == CROSS_COMPILE[name], clean_imports[name].get("error")


@pytest.mark.parametrize("name", CPU_PATHS)
def test_path_passes_the_local_leaderboard_test_mode(exported, name):
    report = evaluate(exported[name], "test")
    assert report.ok, report.summary()
    assert report.cases and all(case.ok for case in report.cases)
    assert report.submission_path == name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
@pytest.mark.parametrize("name", CUDA_PATHS)
def test_cute_file_without_cuda_imports_and_is_skipped(exported, name):
    report = evaluate(exported[name], "test")
    assert report.ok and report.skipped and "needs a CUDA GPU" in report.skipped
    assert not report.cases
    module = load_submission(exported[name])
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        module.custom_kernel(generate_input(128, 256, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.cute] if n.startswith("cute") else [])
                                  for n in PATHS])
def test_path_passes_the_local_leaderboard_on_gpu(exported, name):
    report = evaluate(exported[name], "both", warmup=2, reps=5)
    assert report.ok, report.summary()
    assert len(report.bench) == 3 and report.geomean_us > 0
    if name in CUDA_PATHS:
        assert report.backend.startswith("CuTe DSL")
