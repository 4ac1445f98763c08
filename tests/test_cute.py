"""CuTe DSL kernels: cross-compiled PTX on any machine, correctness on a CUDA GPU."""

import re

import pytest
import torch

from nvfp4lib.device import capabilities
from nvfp4lib.problem import TEST_SHAPES, Shape, generate_input
from nvfp4lib.reference import check, poison_

cute_gemv = pytest.importorskip("nvfp4lib.cute_gemv")
pytestmark = pytest.mark.cute
if cute_gemv.cute is None:
    pytest.skip("CuTe DSL (nvidia-cutlass-dsl) is not installed", allow_module_level=True)

TARGETS = ("sm_90a", "sm_100a")
EXTRA_SHAPES = [Shape(128, 64, 1), Shape(128, 192, 3), Shape(1024, 4096, 8), Shape(16384, 1024, 8)]


@pytest.fixture(scope="module")
def ptx():
    """PTX of every (variant, target), compiled once; no GPU needed."""
    return {(v, t): cute_gemv.compile_ptx(v, t) for v in ("naive", "fast") for t in TARGETS}


def _wide_global_loads(text):
    """128-bit loads from global memory: ld.global.*.v4.{u32,b32,f32} or 16-byte cp.async."""
    return re.findall(r"ld\.global[\w.:]*\.v4\.[bfu]32", text) + re.findall(r"cp\.async[\w.:]*\.shared\.global \[[^]]+\], \[[^]]+\], 16", text)


def test_blackwell_fast_kernel_uses_hardware_fp4_conversion(ptx):
    assert ".target sm_100a" in ptx["fast", "sm_100a"]
    assert "cvt.rn.f16x2.e2m1x2" in ptx["fast", "sm_100a"]


@pytest.mark.parametrize("variant", ["naive", "fast"])
def test_hopper_build_has_no_fp4_instruction(ptx, variant):
    text = ptx[variant, "sm_90a"]
    assert ".target sm_90a" in text
    assert "e2m1" not in text


@pytest.mark.parametrize("target", TARGETS)
def test_fast_kernel_reads_a_with_128_bit_loads(ptx, target):
    assert len(_wide_global_loads(ptx["fast", target])) >= 2


@pytest.mark.parametrize("variant", ["naive", "fast"])
@pytest.mark.parametrize("target", TARGETS)
def test_no_local_memory(ptx, variant, target):
    assert not re.search(r"\.local\b|ld\.local|st\.local", ptx[variant, target])


def test_config_is_validated():
    with pytest.raises(ValueError, match="variant"):
        cute_gemv.compile_gemv("fastest", "sm_90a")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_cpu_call_gives_clear_error():
    data = generate_input(128, 256, 1)
    with pytest.raises(Exception, match="(?i)cuda"):
        cute_gemv.gemv_cute(data)


@pytest.mark.gpu
@pytest.mark.skipif(not capabilities().cuda, reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["naive", "fast"])
@pytest.mark.parametrize("shape", TEST_SHAPES + EXTRA_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_matches_reference_on_gpu(variant, shape):
    data = generate_input(*shape, seed=shape.m + shape.k, mode="full", device="cuda")
    poison_(data[-1])
    result = check(cute_gemv.gemv_cute(data, variant), data)
    assert result.ok, result.message
