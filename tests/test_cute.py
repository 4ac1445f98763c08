"""CuTe DSL kernels: cross-compiled PTX on any machine, correctness on a CUDA GPU."""

import re

import pytest
import torch

from nvfp4lib import ptx_tools
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


@pytest.mark.parametrize("config", ["WIDE", "TALL"])
@pytest.mark.parametrize("target", TARGETS)
def test_machine_code_has_no_spills_and_fits_the_grid(config, target):
    """ptxas's own accounting, read from the cubin: no local-memory frame (no spills), and few
    enough registers for blocks_per_sm blocks per SM, which the persistent grid assumes."""
    cfg = getattr(cute_gemv, config)
    resources = ptx_tools.cubin_resources(cute_gemv.compile_cubin("fast", target, cfg))
    assert resources["frame_bytes"] == 0, resources
    assert 0 < resources["registers"] <= 65536 // (32 * cfg.warps_per_block * cfg.blocks_per_sm), resources


def test_hopper_fast_kernel_decodes_with_a_register_lookup(ptx):
    """The default sm_90a decode: prmt looks codes up in a table held in two immediates, dp4a multiplies."""
    text = ptx["fast", "sm_90a"]
    assert cute_gemv.resolve_decode("sm_90a") == "lut"
    assert "dp4a.s32.s32" in text
    table = re.findall(r"prmt\.b32\s+%r\d+, (\d+), (\d+), %r\d+;", text)
    assert table and set(table) == {(str(cute_gemv._LUT_LO), str(cute_gemv._LUT_HI))}
    assert "dp4a" not in ptx["fast", "sm_100a"]


def test_bitops_decode_compiles_for_hopper():
    cfg = cute_gemv.FastConfig(decode="bitops")
    text = cute_gemv.compile_ptx("fast", "sm_90a", cfg)
    assert "e2m1" not in text and "dp4a" not in text
    assert "fma.rn.f16x2" in text  # packed fp16 products of the bit-trick decode


def test_config_is_validated():
    with pytest.raises(ValueError, match="variant"):
        cute_gemv.compile_gemv("fastest", "sm_90a")
    with pytest.raises(ValueError, match="decode.*sm_100a or newer"):
        cute_gemv.compile_gemv("fast", "sm_90a", cute_gemv.FastConfig(decode="hw"))
    with pytest.raises(ValueError, match="decode"):
        cute_gemv.resolve_decode("sm_90a", "table")


@pytest.mark.parametrize("k, expected", [(16384, "WIDE"), (2048, "WIDE"), (7168, "TALL"), (256, "TALL")])
def test_default_config_fills_whole_steps(k, expected):
    """WIDE steps cover 64 chunks of 16 bytes per row; where K/32 is not a multiple of 64, TALL."""
    cfg = cute_gemv.default_config(k)
    assert cfg == getattr(cute_gemv, expected)
    assert (k // 32) % (32 * cfg.unroll) == 0 or cfg.unroll == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_cpu_call_gives_clear_error():
    data = generate_input(128, 256, 1)
    with pytest.raises(Exception, match="(?i)cuda"):
        cute_gemv.gemv_cute(data)


KERNELS = {  # name -> (variant, config); None is the per-K default
    "naive": ("naive", None), "fast": ("fast", None),
    "fast-wide-bitops": ("fast", cute_gemv.FastConfig(decode="bitops")), "fast-tall": ("fast", cute_gemv.TALL),
}


@pytest.mark.gpu
@pytest.mark.skipif(not capabilities().cuda, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("shape", TEST_SHAPES + EXTRA_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_matches_reference_on_gpu(kernel, shape):
    variant, cfg = KERNELS[kernel]
    data = generate_input(*shape, seed=shape.m + shape.k, mode="full", device="cuda")
    poison_(data[-1])
    result = check(cute_gemv.gemv_cute(data, variant, cfg), data)
    assert result.ok, result.message
