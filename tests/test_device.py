"""Capabilities are probed consistently, and the environment report is complete."""

import importlib.util

import pytest
import torch

import nvfp4lib
from nvfp4lib.device import Capabilities, _cute_arch, capabilities, environment_report, print_environment


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
        assert caps.hw_e2m1 == (caps.sm[0] >= 10) and caps.cute_arch == _cute_arch(caps.sm)
    else:
        assert caps.sm is None and caps.cute_arch is None
        assert not caps.fp4_gemm and not caps.hw_e2m1
    if caps.fp4_gemm:
        assert caps.sm[0] >= 10, "FP4 GEMM is only probed on sm_100+"


def test_cute_arch_names():
    assert _cute_arch((10, 0)) == "sm_100a"
    assert _cute_arch((9, 0)) == "sm_90a"
    assert _cute_arch((8, 9)) == "sm_89"
    assert _cute_arch((12, 0)) == "sm_120"
    assert _cute_arch(None) is None


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
