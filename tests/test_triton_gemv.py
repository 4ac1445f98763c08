"""Triton NVFP4 GEMV kernels: correctness on a CUDA GPU with Triton; availability reasons, input errors and
(where Triton is installed) the compiled PTX on any machine.

Every GPU check uses new random data per run (the seed is in the failure message), c poisoned with NaN,
and the exact reference over every element. The first call of a shape is the autotuning call, which runs
each config on the caller's tensors: that is the call checked.
"""

import random
import re
import types

import pytest
import torch

from nvfp4lib.bench import triton_gemv
from nvfp4lib.contract import NVFP4InputError, Shape
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.problem import BENCHMARK_SHAPES, EXTRA_SHAPES, TEST_SHAPES, generate_input
from nvfp4lib.reference import check, poison_

_seeds = random.Random()  # seeded from the OS: fresh data every run
CPU = Capabilities(cuda=False, name="cpu", sm=None, fp4_gemm=False, cute_dsl=False, cute_dsl_version=None,
                   hw_e2m1=False, cute_arch=None)
HOPPER = Capabilities(cuda=True, name="NVIDIA H200", sm=(9, 0), fp4_gemm=False, cute_dsl=False, cute_dsl_version=None,
                      hw_e2m1=False, cute_arch="sm_90a")
BLACKWELL = Capabilities(cuda=True, name="NVIDIA B200", sm=(10, 0), fp4_gemm=True, cute_dsl=False,
                         cute_dsl_version=None, hw_e2m1=True, cute_arch="sm_100a")

PEERS = {  # name -> (what builds the runner, why it cannot run here)
    "triton_nvfp4": (triton_gemv.TritonGemv, triton_gemv.why_unavailable),
    "triton_nvfp4_bits": (lambda: triton_gemv.TritonGemv("bits"), triton_gemv.why_unavailable),
    "triton_dot_scaled": (triton_gemv.TritonDotScaledGemv, triton_gemv.dot_scaled_unavailable),
}
_runners: dict = {}


def _runner(name: str):
    """One runner per peer for the session (each keeps its validated inputs); skipped where it cannot run."""
    make, unavailable = PEERS[name]
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    if name not in _runners:
        _runners[name] = make()
    return _runners[name]


def _check_fresh(name: str, shape: Shape, mode: str) -> None:
    runner = _runner(name)
    seed = _seeds.randrange(2**31)
    data = generate_input(*shape, seed=seed, mode=mode, device="cuda")
    poison_(data.c)
    out = runner(data)
    assert out is data.c, "the result must be data's own c, written in place"
    result = check(out, data)
    assert result.ok, f"{name} {shape} {mode} seed={seed}: {result.message}"


# ------------------------------------------------------------------------------ on a CUDA GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PEERS))
@pytest.mark.parametrize("shape", TEST_SHAPES + EXTRA_SHAPES + BENCHMARK_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_matches_reference_on_full_range_data(name, shape):
    _check_fresh(name, shape, "full")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PEERS))
@pytest.mark.parametrize("shape", TEST_SHAPES + BENCHMARK_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_matches_reference_on_leaderboard_data(name, shape):
    _check_fresh(name, shape, "leaderboard")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PEERS))
def test_new_values_in_the_same_tensors_give_new_results(name):
    """Validation is remembered per set of tensors, never their values: refilled inputs are read again."""
    runner = _runner(name)
    shape = Shape(256, 1536, 2)
    data = generate_input(*shape, seed=_seeds.randrange(2**31), device="cuda")
    runner(data)
    seed = _seeds.randrange(2**31)
    new = generate_input(*shape, seed=seed, device="cuda")
    for field in ("a", "b", "sfa", "sfb", "sfa_permuted", "sfb_permuted"):
        getattr(data, field).view(torch.uint8).copy_(getattr(new, field).view(torch.uint8))
    poison_(data.c)
    result = check(runner(data), data)
    assert result.ok, f"seed={seed}: {result.message}"


# ------------------------------------------------------------------------------ on any machine


def test_module_imports_and_says_why_it_cannot_run_here():
    reason = triton_gemv.why_unavailable()
    if triton_gemv.triton is None or not capabilities().cuda:
        assert isinstance(reason, str) and reason.startswith("needs ")
        assert triton_gemv.dot_scaled_unavailable() == reason
    else:
        assert reason is None


def test_reasons_name_what_is_missing(monkeypatch):
    fake_triton = types.SimpleNamespace(__version__="0.0-test")
    monkeypatch.setattr(triton_gemv, "triton", None)
    assert triton_gemv.why_unavailable().startswith("needs Triton (not installed")
    monkeypatch.setattr(triton_gemv, "triton", fake_triton)
    assert triton_gemv.why_unavailable(CPU) == "needs a CUDA GPU"
    assert triton_gemv.why_unavailable(HOPPER) is None
    hopper = triton_gemv.dot_scaled_unavailable(HOPPER)
    assert "needs sm_100 or newer" in hopper and "sm_90" in hopper
    monkeypatch.setattr(triton_gemv, "tl", types.SimpleNamespace())
    assert triton_gemv.dot_scaled_unavailable(BLACKWELL) == "needs tl.dot_scaled, which Triton 0.0-test does not have"


@pytest.fixture
def fresh_probe():
    """The compile probe of `dot_scaled_unavailable` forgotten before and after the test."""
    triton_gemv._nvfp4_dot_scaled_problem.cache_clear()
    yield
    triton_gemv._nvfp4_dot_scaled_problem.cache_clear()


@pytest.mark.parametrize("ptx, expected", [
    (None, "Triton 0.0-test cannot compile tl.dot_scaled on e2m1 operands with float8e4nv scales per 16 elements "
           "(NVFP4) for sm_100: RuntimeError: no NVFP4 here"),
    ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "without the block-scaled MMA (mxf4nvf4): an emulation"),
    ("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X", None),
])
def test_dot_scaled_needs_a_triton_that_compiles_nvfp4_scales(monkeypatch, fresh_probe, ptx, expected):
    """On a Blackwell GPU the reason comes from compiling the kernel: a Triton that refuses E4M3 scales per
    16 elements, or lowers them to an emulation, cannot run this peer."""
    def compile_ptx(variant, capability):
        if ptx is None:
            raise RuntimeError("no NVFP4 here\nmore detail")
        return ptx

    monkeypatch.setattr(triton_gemv, "triton", types.SimpleNamespace(__version__="0.0-test"))
    monkeypatch.setattr(triton_gemv, "tl", types.SimpleNamespace(dot_scaled=None))
    monkeypatch.setattr(triton_gemv, "compile_ptx", compile_ptx)
    reason = triton_gemv.dot_scaled_unavailable(BLACKWELL)
    assert reason == expected if expected is None else expected in reason


@pytest.mark.parametrize("name", list(PEERS))
def test_bad_inputs_are_named(name):
    """Validation comes first, so these errors are the same with or without Triton and a GPU."""
    runner = PEERS[name][0]()
    good = generate_input(128, 256, 1)
    with pytest.raises(NVFP4InputError, match="data: expected a 7-tuple"):
        runner(good[:6])
    with pytest.raises(NVFP4InputError, match="c: expected dtype torch.float16"):
        runner(good._replace(c=good.c.float()))
    with pytest.raises(NVFP4InputError, match="a: expected M a multiple of 128"):
        runner(generate_input(64, 256, 1))
    batched = generate_input(128, 256, 2)
    with pytest.raises(NVFP4InputError, match="sfa: expected strides"):
        runner(batched._replace(sfa=batched.sfa.contiguous()))  # right shape, (M, K/16, L) storage
    with pytest.raises(NVFP4InputError, match="data: expected tensors on cuda"):
        runner(good)


# ------------------------------------------------------------------------------ compiled without a GPU


def test_bad_decode_is_refused():
    with pytest.raises(ValueError, match="decode: expected one of"):
        triton_gemv.TritonGemv("lut")


@pytest.mark.parametrize("decode", triton_gemv.DECODES)
def test_lookup_kernel_compiles_for_hopper_with_vector_loads_of_a(decode):
    """Every config, as Triton compiles it for sm_90: A arrives in 8-byte vector loads (one scale block of a
    row each), nothing spills, and only the table decode gathers a value per code."""
    pytest.importorskip("triton")
    for block_m, block_k, warps, stages in triton_gemv.LOOKUP_CONFIGS:
        ptx = triton_gemv.compile_ptx("lookup", 90, block_m, block_k, warps, stages, decode)
        config = (block_m, block_k, warps, stages)
        assert ".target sm_90" in ptx
        assert re.search(r"ld\.global[\w.:]*\.v[24]\.b32", ptx), config
        assert "ld.local" not in ptx and "st.local" not in ptx, config
        scalar_loads = len(re.findall(r"ld\.global[\w.:]*\.b32 ", ptx))
        bytes_per_thread = block_m * block_k // 2 // (32 * warps)
        assert (scalar_loads >= 2 * bytes_per_thread) == (decode == "table"), (config, scalar_loads)


def test_dot_scaled_kernel_compiles_to_the_nvfp4_block_scaled_mma():
    """For sm_100 the dot is Blackwell's MMA on E2M1 with E4M3 scales per 16 (scale_vec::4X), no emulation."""
    pytest.importorskip("triton")
    for block_m, block_k, warps, stages in triton_gemv.DOT_SCALED_CONFIGS:
        ptx = triton_gemv.compile_ptx("dot_scaled", 100, block_m, block_k, warps, stages)
        assert "tcgen05.mma" in ptx and f"kind::{triton_gemv.BLOCK_SCALED_MMA}" in ptx, (block_m, block_k)
        assert "scale_vec::4X" in ptx, (block_m, block_k)
