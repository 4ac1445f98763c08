"""Exported one-file submissions: self-contained, readable, self-checked, and correct through the
local leaderboard.

Every path is exported once per module. The files are imported in a fresh interpreter in which
nvfp4lib cannot be found (as on the leaderboard machine); every path passes the local leaderboard's
test mode here (the CuTe files through their fallback, the emulation, when there is no GPU), and
the CuTe file cross-compiles its kernels without a GPU, with and without apache-tvm-ffi.
"""

import ast
import dataclasses
import importlib.util
import inspect
import sys
import textwrap

import pytest
import torch

import nvfp4lib
from nvfp4lib import device, dispatch, paths, scaled_mm
from nvfp4lib.cute import gemv as cute_gemv
from nvfp4lib.leaderboard import export as submission
from nvfp4lib.contract import NVFP4InputError, validate_gemv_input
from nvfp4lib.leaderboard.evaluate import evaluate, import_isolated
from nvfp4lib.formats import unpack_fp4
from nvfp4lib.layouts import to_permuted
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.leaderboard.export import (EXPORTS, TASK_IMPORT, ExportError, SelfCheckedKernel, export_path, export_source,
                                 inline_objects, main, write_submission)
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, load_submission

CHECKED_PATHS = [name for name in EXPORTS if export_path(name).candidates]  # self-checked, with a fallback
CUDA_PATHS = [name for name in EXPORTS if export_path(name).needs_cuda]
# Evaluated for every file in one interpreter without nvfp4lib: its BACKEND, and for the cute_fast
# file the kernels it cross-compiles (tracing a kernel runs every helper it calls, so a helper
# missing from the file fails there). The probe file reports whether nvfp4lib can be imported.
CROSS_COMPILE = (("fast", "sm_100a"), ("fast", "sm_90a"), ("naive", "sm_90a"))
PROBE = (f"(submission.BACKEND, [type(submission.compile_gemv(*job)).__name__ for job in {CROSS_COMPILE!r}] "
         f"if submission.SUBMISSION_PATH == 'cute_fast' and submission.cute is not None else None)")
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
    return {name: write_submission(name, folder / f"{name}.py") for name in EXPORTS}


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


@pytest.mark.parametrize("streams", [-1, True, 2.5])
def test_streams_must_be_a_count(streams, tmp_path, capsys):
    with pytest.raises(ExportError, match=r"--streams: expected an integer >= 0 \(0 = the caller's stream\)"):
        export_source("scaled_mm_transposed", streams=streams)
    if streams == -1:
        assert main(["--path", "scaled_mm_transposed", "--streams", "-1", "--out", str(tmp_path / "s.py")]) == 2
        assert "--streams: expected an integer >= 0" in capsys.readouterr().err
        assert not (tmp_path / "s.py").exists()


def test_existing_file_is_kept_without_force(tmp_path, capsys):
    out = tmp_path / "submission.py"
    out.write_text("# mine\n")
    assert main(["--path", "scaled_mm_permuted", "--out", str(out)]) == 2
    assert f"--out: {out} exists; pass --force to overwrite it" in capsys.readouterr().err
    assert out.read_text() == "# mine\n"
    assert main(["--path", "scaled_mm_permuted", "--out", str(out), "--force"]) == 0
    assert out.read_text().startswith(DIRECTIVE)


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


@pytest.mark.parametrize("name", EXPORTS)
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
    for obj in (scaled_mm.gemv_scaled_mm_transposed, scaled_mm.blocked_scales, scaled_mm.emulated_scaled_mm_fp4):
        assert inspect.getsource(obj) in source, f"{obj.__name__} is not inlined verbatim"
    assert "# nvfp4lib/scaled_mm.py" in source and "# nvfp4lib/layouts.py" in source


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


def test_file_holds_only_what_its_path_needs(exported):
    reference = exported["scaled_mm_reference"].read_text()
    assert "def gemv_scaled_mm_transposed" not in reference and "cutlass.cute" not in reference
    assert "def generate_input" not in reference and "class SelfCheckedKernel" not in reference
    for name in CHECKED_PATHS:  # the kernel, its fallback and the self-check, nothing else
        text = exported[name].read_text()
        assert "class CuteGemv" in text and "def gemv_scaled_mm_permuted" in text, name
        assert "class SelfCheckedKernel" in text and "def reference_gemv" in text, name
        assert "def gemv_scaled_mm_transposed" not in text and "def calibrate" not in text, name


@pytest.mark.parametrize("name", CHECKED_PATHS)
def test_checked_files_try_their_kernel_then_the_fallback_order(exported, name):
    """One fallback order, paths.FALLBACK_ORDER, written into every self-checked file."""
    tree = ast.parse(exported[name].read_text())
    setup = next(s for s in tree.body if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "KERNEL")
    candidates = ast.literal_eval(setup.value.args[0])
    first = {"cute_naive": "cute_naive", "cute_fast": "cute_fast", "hybrid": "cute_fast"}[name]
    assert candidates == [first, *paths.FALLBACK_ORDER[1:]] == list(export_path(name).candidates)
    assert paths.FALLBACK_ORDER == ("cute_fast", "scaled_mm_permuted")
    assert all(candidate in paths.PATHS for candidate in candidates)


def test_functions_keep_their_names_and_docstrings(exported):
    module = load_submission(exported["hybrid"])
    for name in ("gemv_scaled_mm_permuted", "capabilities", "validate_gemv_input"):
        original = getattr(scaled_mm, name, None) or getattr(device, name, None) or \
            getattr(sys.modules["nvfp4lib.contract"], name)
        assert getattr(module, name).__doc__ == original.__doc__


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
        assert value[0].startswith("torch._scaled_mm on the permuted scales: emulated")


@pytest.mark.cute
def test_cute_file_compiles_its_kernels_without_nvfp4lib(isolated):
    ok, value = isolated["cute_fast"]
    assert ok, value
    assert value[1] and len(value[1]) == len(CROSS_COMPILE)


@pytest.mark.parametrize("name", EXPORTS)
def test_path_passes_the_local_leaderboard_test_mode(exported, name):
    report = evaluate(exported[name], "test")
    assert report.ok, report.summary()
    assert report.cases and all(case.ok for case in report.cases)
    assert report.submission_path == name and not report.skipped


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
@pytest.mark.parametrize("name", CUDA_PATHS)
def test_cute_file_without_cuda_says_why_and_runs_its_fallback(exported, name, capsys):
    """No CUDA GPU is an expected reason to fall back: information on stdout, no warning on stderr."""
    module = load_submission(exported[name])
    said = capsys.readouterr()
    assert said.out.splitlines() == [f"{name} cannot run here (the CuTe kernel needs the inputs on a CUDA GPU); "
                                     "using scaled_mm_permuted", "self-check ok: scaled_mm_permuted on cpu"]
    assert said.err == ""
    assert module.BACKEND.startswith("torch._scaled_mm on the permuted scales: emulated")
    data = generate_input(128, 256, 1, seed=11)
    poison_(data.c)
    assert check(module.custom_kernel(data), data).ok


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
    expression = ("(submission.sys.modules.__setitem__('tvm_ffi', None), submission.has_tvm_ffi(), "
                  "type(submission.compile_gemv('fast', 'sm_100a')).__name__)[1:]")
    (ok, value), = import_isolated([exported["cute_fast"]], expression).values()
    assert ok, value
    assert ast.literal_eval(value) == (False, "CudaDialectJitCompiledFunction")


# ---------------------------------------------------------------------------------------------
# The self-check and the fallback (the runtime code the files inline, run in the package)


def test_self_check_input_covers_every_code_and_signed_scales():
    for m, k, l in submission.SELF_CHECK_SHAPES:
        for signed in (True, False):
            data = submission.self_check_input(m, k, l, "cpu", signed)
            assert validate_gemv_input(data) == (m, k, l)
            a, b, sfa, sfb, sfa_p, sfb_p, _ = data
            for codes in (unpack_fp4(a[:, :, 0]), unpack_fp4(b[0, :, 0])):  # the vector is row 0
                assert set(codes[..., 0::2].unique().tolist()) == set(range(16))  # low nibbles
                assert set(codes[..., 1::2].unique().tolist()) == set(range(16))  # high nibbles
            scales = torch.cat([sfa.float().flatten(), sfb[0].float().flatten()])
            assert ((scales < 0).any().item(), (scales > 0).any().item(), (scales == 0).any().item()) == \
                (signed, True, True)
            assert torch.equal(sfa_p.view(torch.uint8), to_permuted(sfa).view(torch.uint8))
            assert torch.equal(sfb_p.view(torch.uint8), to_permuted(sfb).view(torch.uint8))


def _ignores_sign(data):
    """A plausible bug: the emulation on |A| (sign bits of the codes cleared)."""
    a, *rest = data
    return scaled_mm.gemv_scaled_mm_permuted(((a.view(torch.uint8) & 0x77).view(torch.float4_e2m1fn_x2), *rest))


def test_self_check_catches_a_wrong_kernel_and_passes_a_right_one():
    assert submission.self_check(scaled_mm.gemv_scaled_mm_permuted, "cpu") is None
    assert submission.self_check(_ignores_sign, "cpu").startswith("wrong result at (m, k, l) = (128, 256, 2)")
    assert submission.self_check(lambda data: data.c, "cpu").startswith("wrong result")  # c left as poisoned


@pytest.fixture
def fake_paths(monkeypatch):
    """Replace build_path with a table: name -> kernel (a callable, or an exception raised when building)."""
    table = {}

    def build(name):
        kernel = table[name]
        if isinstance(kernel, Exception):
            raise kernel
        return f"fake {name}", kernel, True

    monkeypatch.setattr(submission, "build_path", build)
    return table


def test_a_failing_build_falls_back_with_one_line(fake_paths, capsys):
    fake_paths.update(first=RuntimeError("NVVM_ERROR_COMPILATION: unsupported operation\nmore"),
                      second=scaled_mm.gemv_scaled_mm_permuted)
    namespace = {}
    kernel = SelfCheckedKernel(["first", "second"], namespace, device="cpu")
    said = capsys.readouterr()
    assert said.err.splitlines() == [
        "self-check: first failed (RuntimeError: NVVM_ERROR_COMPILATION: unsupported operation); "
        "using second instead"]
    assert said.out.splitlines() == ["self-check ok: second on cpu"]
    assert (kernel.name, namespace["BACKEND"]) == ("second", "fake second")


def test_a_path_that_cannot_run_here_is_information_not_a_warning(fake_paths, capsys):
    """Passed over with a line on stdout when another path runs; on stderr when none is left."""
    fake_paths.update(gpu_only=submission.PathUnavailable("needs a CUDA GPU"), here=scaled_mm.gemv_scaled_mm_permuted)
    kernel = SelfCheckedKernel(["gpu_only", "here"], {}, device="cpu")
    said = capsys.readouterr()
    assert said.out.splitlines() == ["gpu_only cannot run here (needs a CUDA GPU); using here",
                                     "self-check ok: here on cpu"]
    assert said.err == "" and kernel.name == "here"
    SelfCheckedKernel(["gpu_only"], {}, device="cpu")
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.splitlines() == ["gpu_only cannot run here (needs a CUDA GPU); no path is left: custom_kernel "
                                     "will raise"]


def test_a_wrong_result_falls_back(fake_paths, capsys):
    fake_paths.update(sign_bug=_ignores_sign, right=scaled_mm.gemv_scaled_mm_permuted)
    kernel = SelfCheckedKernel(["sign_bug", "right"], {}, device="cpu")
    said = capsys.readouterr()
    first, = said.err.splitlines()
    assert first.startswith("self-check: sign_bug failed (wrong result at (m, k, l) = (128, 256, 2): ")
    assert first.endswith("; using right instead") and said.out.splitlines() == ["self-check ok: right on cpu"]
    assert kernel.name == "right"


def test_a_failing_first_call_falls_back_and_later_calls_go_straight_to_the_kernel(fake_paths, capsys):
    calls = []

    def breaks_on_its_first_real_call(data):
        calls.append(data.a.shape)
        if len(calls) > len(submission.SELF_CHECK_SHAPES):  # the self-check passes, the real call does not
            raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")
        return scaled_mm.gemv_scaled_mm_permuted(data)

    fake_paths.update(flaky=breaks_on_its_first_real_call, steady=scaled_mm.gemv_scaled_mm_permuted)
    namespace = {}
    namespace["KERNEL"] = SelfCheckedKernel(["flaky", "steady"], namespace, device="cpu")
    assert capsys.readouterr().out.splitlines() == ["self-check ok: flaky on cpu"]
    data = generate_input(256, 512, 2, seed=5)
    poison_(data.c)
    assert check(namespace["KERNEL"](data), data).ok
    said = capsys.readouterr()
    assert said.err.splitlines() == [
        "first call: flaky failed (RuntimeError: CUDA_ERROR_NO_BINARY_FOR_GPU); using steady instead"]
    assert said.out.splitlines() == ["self-check ok: steady on cpu"]
    assert namespace["KERNEL"] is scaled_mm.gemv_scaled_mm_permuted  # no wrapper left on the hot path
    assert namespace["BACKEND"] == "fake steady"


def test_an_input_error_on_the_first_call_is_the_callers(fake_paths, capsys):
    fake_paths.update(only=scaled_mm.gemv_scaled_mm_permuted)
    namespace = {}
    namespace["KERNEL"] = kernel = SelfCheckedKernel(["only"], namespace, device="cpu")
    with pytest.raises(NVFP4InputError, match="data: expected a 7-tuple"):
        namespace["KERNEL"]((1, 2))
    assert namespace["KERNEL"] is kernel and kernel.name == "only"  # nothing fell back
    data = generate_input(128, 256, 1, seed=6)
    assert check(namespace["KERNEL"](data), data).ok and namespace["KERNEL"] is scaled_mm.gemv_scaled_mm_permuted


def test_when_every_path_fails_the_file_imports_and_the_call_says_why(fake_paths, capsys):
    fake_paths.update(one=RuntimeError("no"), two=_ignores_sign)
    kernel = SelfCheckedKernel(["one", "two"], {}, device="cpu")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "self-check: one failed (RuntimeError: no); no path is left: custom_kernel will raise"
    assert err[1].startswith("self-check: two failed (wrong result") and len(err) == 2
    with pytest.raises(RuntimeError, match="no GEMV path passed its self-check"):
        kernel(generate_input(128, 256, 1))


def test_a_cute_kernel_that_does_not_compile_falls_back_to_scaled_mm(monkeypatch, capsys):
    """The real path: a machine that looks like a B200 with the DSL, where compiling fails."""
    caps = dataclasses.replace(device.capabilities(), cuda=True, name="NVIDIA B200", sm=(10, 0), cute_dsl=True,
                               cute_arch="sm_100a", hw_e2m1=True)
    monkeypatch.setattr(submission, "capabilities", lambda: caps)
    monkeypatch.setattr(cute_gemv, "capabilities", lambda: caps)

    def fails(*args, **kwargs):
        raise RuntimeError("NVVM_ERROR_COMPILATION: unsupported operation")

    monkeypatch.setattr(cute_gemv, "compile_gemv", fails)
    cute_gemv._compiled.cache_clear()
    try:
        kernel = SelfCheckedKernel(export_path("hybrid").candidates, {}, device="cpu")
    finally:
        cute_gemv._compiled.cache_clear()
    said = capsys.readouterr()
    assert said.err.splitlines()[-1] == ("self-check: cute_fast failed (RuntimeError: NVVM_ERROR_COMPILATION: "
                                         "unsupported operation); using scaled_mm_permuted instead")
    assert said.out.splitlines()[-1] == "self-check ok: scaled_mm_permuted on cpu"
    assert kernel.kernel is scaled_mm.gemv_scaled_mm_permuted


def test_fail_path_is_checked_and_written_into_the_file(tmp_path):
    with pytest.raises(ExportError, match=r"--fail-path 'nope': not a path of 'hybrid' "
                                          r"\(its paths: cute_fast, scaled_mm_permuted\)"):
        export_source("hybrid", fail=("nope",))
    with pytest.raises(ExportError, match=r"--fail-path 'scaled_mm': not a path of 'hybrid'"):  # an old name
        export_source("hybrid", fail=("scaled_mm",))
    with pytest.raises(ExportError, match="'scaled_mm_permuted' has no fallback"):
        export_source("scaled_mm_permuted", fail=("cute_fast",))
    text = export_source("hybrid", fail=("scaled_mm_permuted",))
    assert ("KERNEL = SelfCheckedKernel(['cute_fast', 'scaled_mm_permuted'], globals(), "
            "fail=('scaled_mm_permuted',))") in text
    assert "`python -m nvfp4lib.leaderboard.export --path hybrid --fail-path scaled_mm_permuted`" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the CuTe kernel would pass")
def test_file_whose_every_path_fails_imports_and_raises_when_called(tmp_path, capsys):
    path = write_submission("hybrid", tmp_path / "broken.py", fail=("scaled_mm_permuted",))
    module = load_submission(path)
    assert module.BACKEND == "no path passed its self-check"
    assert ("self-check: scaled_mm_permuted failed (RuntimeError: made to fail on purpose (exported with "
            "--fail-path))") in capsys.readouterr().err
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="building the CuTe path would compile for this GPU")
@pytest.mark.parametrize("machine", MACHINES)
def test_dispatcher_and_exported_files_follow_one_order(machine, monkeypatch):
    """Where nothing is measured or forced, the dispatcher's choice is the first candidate of the
    hybrid file that can run there, and both run the same function."""
    caps = dataclasses.replace(device.capabilities(), **MACHINES[machine])
    monkeypatch.setattr(submission, "capabilities", lambda: caps)
    decision = dispatch.choose((4096, 7168, 8), caps=caps)
    runnable = []
    for name in export_path("hybrid").candidates:
        try:
            submission.build_path(name)  # compiles nothing here: this machine has no GPU to compile for
        except RuntimeError:
            continue
        runnable.append(name)
    assert decision.path == runnable[0]
    if decision.path == "scaled_mm_permuted":
        assert submission.build_path("scaled_mm_permuted")[1] is paths.PATHS["scaled_mm_permuted"].build()
