"""Capabilities are probed consistently, and the environment report is complete."""

import dataclasses
import importlib.util
import inspect

import pytest
import torch

import nvfp4lib
from nvfp4lib import device
from nvfp4lib.device import (Capabilities, _fp4_gemm_reason, capabilities, cute_arch, environment_report,
                             print_environment)


def test_capabilities_are_cached():
    assert capabilities() is capabilities()
    assert isinstance(capabilities(), Capabilities)


def test_capabilities_are_consistent():
    caps = capabilities()
    assert caps.cuda == torch.cuda.is_available()
    assert caps.cute_dsl == (importlib.util.find_spec("cutlass") is not None)
    assert (caps.cute_dsl_version is not None) == caps.cute_dsl
    if caps.cuda:
        assert caps.sm == tuple(torch.cuda.get_device_capability())
        assert caps.hw_e2m1 == (caps.sm[0] >= 10) and caps.cute_arch == cute_arch(caps.sm)
    else:
        assert caps.sm is None and caps.cute_arch is None
        assert not caps.fp4_gemm and not caps.hw_e2m1
    if caps.fp4_gemm:
        assert caps.sm[0] >= 10, "FP4 GEMM is only probed on sm_100+"
    assert cute_arch() == caps.cute_arch  # the kernels' target, without the probes


def test_cute_arch_names():
    assert cute_arch((10, 0)) == "sm_100a"
    assert cute_arch((9, 0)) == "sm_90a"
    assert cute_arch((8, 9)) == "sm_89"
    assert cute_arch((12, 0)) == "sm_120"


def test_summary_is_one_line():
    text = capabilities().summary()
    assert "\n" not in text and "FP4 GEMM" in text


def test_environment_report():
    report = environment_report()
    for key in ("python", "platform", "torch", "cuda_runtime", "driver", "gpu", "cute_dsl", "nvfp4lib"):
        assert key in report
    assert report["nvfp4lib"] == nvfp4lib.__version__ == "0.1.0"
    assert report["torch"] == torch.__version__
    assert report["cute_dsl"] == capabilities().cute_dsl_version


def test_print_environment(capsys):
    print_environment()
    out = capsys.readouterr().out
    assert "nvfp4lib: 0.1.0" in out and "summary:" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_report_names_the_device():
    report = environment_report()
    assert report["gpu"] == torch.cuda.get_device_name() and report["cuda_runtime"] == torch.version.cuda


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] >= 10,
                    reason="needs a CUDA GPU older than sm_100")
def test_no_fp4_gemm_before_blackwell():
    assert not capabilities().fp4_gemm and not capabilities().hw_e2m1


def test_fp4_gemm_reason_says_why_not():
    caps = capabilities()
    assert (caps.fp4_gemm_reason is None) == caps.fp4_gemm
    assert _fp4_gemm_reason(False, None) == "no CUDA GPU"
    assert _fp4_gemm_reason(True, (9, 0)) == "sm_90: FP4 GEMM needs sm_100 or newer"


def test_fp4_probe_keeps_the_exception(monkeypatch):
    """A Blackwell whose PyTorch has no FP4 cuBLAS: the probe's error becomes the reason, not a silent False."""
    def no_fp4(*args, **kwargs):
        raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul\nmore")

    monkeypatch.setattr(torch, "_scaled_mm", no_fp4)
    monkeypatch.setattr(torch, "zeros", lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8))
    monkeypatch.setattr(torch, "ones", lambda *args, **kwargs: torch.empty(0))
    reason = _fp4_gemm_reason(True, (10, 0))
    assert reason == ("the FP4 torch._scaled_mm probe raised RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED "
                      "when calling cublasLtMatmul")


def test_sm100_skip_reason_shows_the_probe(monkeypatch):
    import conftest

    need = conftest.MARKER_NEEDS["sm100"]
    caps = dataclasses.replace(capabilities(), fp4_gemm=False,
                               fp4_gemm_reason="the FP4 torch._scaled_mm probe raised RuntimeError: CUBLAS")
    assert "(the FP4 torch._scaled_mm probe raised RuntimeError: CUBLAS)" in device.missing(caps, need)
    assert device.missing(dataclasses.replace(caps, fp4_gemm=True, fp4_gemm_reason=None), need) is None


def test_every_need_is_met_or_says_why():
    """One answer to "why can't this run here": a reason per unmet need, the first one of several."""
    none = dataclasses.replace(capabilities(), cuda=False, sm=None, fp4_gemm=False, cute_dsl=False,
                               fp4_gemm_reason="no CUDA GPU")
    every = dataclasses.replace(none, cuda=True, sm=(10, 0), fp4_gemm=True, cute_dsl=True, fp4_gemm_reason=None)
    assert set(device.NEEDS) == {"cuda", "cute_dsl", "fp4_gemm"}
    for need in device.NEEDS:
        assert device.missing(every, need) is None
        assert device.missing(none, need).startswith("needs ")
    assert device.missing(none, "cuda", "cute_dsl") == device.NO_CUDA
    assert device.missing(dataclasses.replace(none, cuda=True), "cuda", "cute_dsl").startswith("needs the CuTe DSL")
    with pytest.raises(ValueError, match="need: expected one of"):
        device.missing(every, "tensor cores")


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10,
                    reason="on an sm_100 GPU the check really runs (make blackwell-check)")
def test_blackwell_check_elsewhere_says_what_it_would_run(tmp_path, capsys):
    from tools import blackwell_check

    report = tmp_path / "report.md"
    assert blackwell_check.main(["--report", str(report)]) == 0
    text = report.read_text()
    assert "**Nothing ran**: this check needs an sm_100 (Blackwell) GPU; this machine: " in text
    for item in blackwell_check.ITEMS:
        assert f"| {item.name} | SKIP | 0.0 s | not an sm_100 GPU; would run: " in text
    assert "Nothing runs here" in capsys.readouterr().out


def test_blackwell_check_counts_all_skipped_as_a_failure():
    """The silent skip that hid a missing FP4 cuBLAS: sm100 tests that all skip fail the check, with why."""
    from tools import blackwell_check

    if capabilities().fp4_gemm:
        pytest.skip("here the sm100 tests run")
    with pytest.raises(blackwell_check.CheckFailed, match=r"0 passed, .* skipped .*nothing ran on this machine; "
                                                          r"skip reasons: .*needs Blackwell FP4 GEMM \("):
        blackwell_check.run_pytest("sm100_probe", "sm100", "tests/test_dispatch.py")


def test_calibrate_without_a_gpu_skips_and_says_why(monkeypatch, capsys):
    """`make calibrate` on a CPU: a one-line reason and exit 0, no minutes of emulated timing."""
    from nvfp4lib.bench import calibration

    monkeypatch.setattr(calibration, "capabilities",
                        lambda: dataclasses.replace(capabilities(), cuda=False, name="cpu", sm=None))
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: pytest.fail("calibrate ran without a GPU"))
    assert calibration.main([]) == 0
    assert "calibrate: skipped" in capsys.readouterr().out


def test_the_dispatch_table_has_one_path_and_save_table_makes_its_folder(tmp_path):
    from nvfp4lib import dispatch
    from nvfp4lib.locations import BUILD_DIR, DISPATCH_TABLE

    assert DISPATCH_TABLE.parent == BUILD_DIR
    assert inspect.signature(dispatch.save_table).parameters["path"].default == DISPATCH_TABLE
    assert inspect.signature(dispatch.load_table).parameters["path"].default == DISPATCH_TABLE
    table = dispatch.Table("NVIDIA B200", "10.0", {"L1-A2^20": {"path": "cute_fast", "mean_us": {}, "shapes": []}})
    saved = dispatch.Dispatcher().save_table(tmp_path / "new" / "folder" / "table.json", table)
    assert dispatch.Table.from_json(saved.read_text()) == table
