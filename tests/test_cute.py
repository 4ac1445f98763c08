"""CuTe DSL kernels: cross-compiled PTX on any machine, correctness on a CUDA GPU. The core's kernels (the naive
and the per-K ones, `nvfp4lib.cute`) and the generic ones of the study wing (`nvfp4lib.study.generic_kernels`),
which run through the same host."""

import dataclasses
import re
import sys
from types import SimpleNamespace

import pytest
import torch

from nvfp4lib import device
from nvfp4lib.study import ptx_reading
from nvfp4lib.contract import NVFP4InputError, Shape
from nvfp4lib.device import capabilities
from nvfp4lib.problem import BENCHMARK_SHAPES, EXTRA_SHAPES, TEST_SHAPES, generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.cute.constants import LUT_HI, LUT_LO

cute_gemv = pytest.importorskip("nvfp4lib.cute.gemv")
cute_decode = pytest.importorskip("nvfp4lib.cute.decode")
cute_ptx = pytest.importorskip("nvfp4lib.cute.ptx")
cute_launch = pytest.importorskip("nvfp4lib.cute.launch")
cute_whole_k = pytest.importorskip("nvfp4lib.cute.whole_k")
generic = pytest.importorskip("nvfp4lib.study.generic_kernels")
pytestmark = pytest.mark.cute
if cute_ptx.cute is None:
    pytest.skip("CuTe DSL (nvidia-cutlass-dsl) is not installed", allow_module_level=True)

TARGETS = ("sm_90a", "sm_100a")
PER_K_DEFAULTS = tuple(f"per_k{k}" for k in cute_gemv.PER_K_DEFAULTS)
"""The per-K kernels the default config runs at the K of `cute_gemv.PER_K_DEFAULTS`, as ptx's variants."""


@pytest.fixture(scope="module")
def ptx():
    """PTX of every (variant, target), compiled once; no GPU needed. "fast" is the generic fast kernel's
    `FastConfig()`, "tiled" the tiled kernel's default config (`generic.TILED`), "per_k<K>" the default config at
    that K."""
    texts = {(v, t): cute_gemv.compile_ptx(v, t, cfg) for v, cfg in (("naive", None), ("fast", generic.FastConfig()))
             for t in TARGETS}
    texts |= {(f"per_k{k}", t): cute_gemv.compile_ptx("fast", t, cute_gemv.default_config(k), k)
              for k in cute_gemv.PER_K_DEFAULTS for t in TARGETS}
    return texts | {("tiled", t): cute_gemv.compile_ptx("fast", t, generic.TILED) for t in TARGETS}


def _wide_global_loads(text):
    """128-bit loads from global memory: ld.global.*.v4.{u32,b32,f32} or 16-byte cp.async."""
    return re.findall(r"ld\.global[\w.:]*\.v4\.[bfu]32", text) + re.findall(r"cp\.async[\w.:]*\.shared\.global \[[^]]+\], \[[^]]+\], 16", text)


@pytest.mark.parametrize("variant", ["fast", "tiled", *PER_K_DEFAULTS])
def test_blackwell_fast_kernels_use_hardware_fp4_conversion(ptx, variant):
    assert ".target sm_100a" in ptx[variant, "sm_100a"]
    assert "cvt.rn.f16x2.e2m1x2" in ptx[variant, "sm_100a"]


@pytest.mark.parametrize("variant", ["naive", "fast", "tiled", *PER_K_DEFAULTS])
def test_hopper_build_has_no_fp4_instruction(ptx, variant):
    text = ptx[variant, "sm_90a"]
    assert ".target sm_90a" in text
    assert "e2m1" not in text


@pytest.mark.parametrize("variant", ["fast", "tiled", *PER_K_DEFAULTS])
@pytest.mark.parametrize("target", TARGETS)
def test_fast_kernels_read_a_with_128_bit_loads(ptx, variant, target):
    assert len(_wide_global_loads(ptx[variant, target])) >= 2


@pytest.mark.parametrize("target", TARGETS)
def test_tiled_kernel_keeps_decoded_b_in_shared_memory(ptx, target):
    """B decoded once per block: 128-bit shared stores, one barrier, then 128-bit shared loads per chunk."""
    counts = ptx_reading.opcode_counts(ptx["tiled", target])
    assert counts["st.shared.v4.b32"] >= 4 and counts["ld.shared.v4.b32"] >= 4 * generic.TILED.chunks_per_step
    assert counts["bar.sync"] + counts["barrier.sync"] == 1, counts


@pytest.mark.parametrize("variant", ["naive", "fast", "tiled", *PER_K_DEFAULTS])
@pytest.mark.parametrize("target", TARGETS)
def test_no_local_memory(ptx, variant, target):
    assert not re.search(r"\.local\b|ld\.local|st\.local", ptx[variant, target])


@pytest.mark.parametrize("config", ["WIDE", "TALL"])
@pytest.mark.parametrize("target", TARGETS)
def test_machine_code_has_no_spills_and_fits_the_grid(config, target):
    """ptxas's own accounting, read from the cubin: no local-memory frame (no spills), and few
    enough registers for blocks_per_sm blocks per SM, which the persistent grid assumes."""
    cfg = getattr(generic, config)
    resources = ptx_reading.cubin_resources(cute_gemv.compile_cubin("fast", target, cfg))
    assert resources["frame_bytes"] == 0, resources
    assert 0 < resources["registers"] <= 65536 // (32 * cfg.warps_per_block * cfg.blocks_per_sm), resources


TILED_BLOCKS_PER_SM = 4  # resident tiled blocks per SM that the measured configs had at least


@pytest.mark.parametrize("target", TARGETS)
def test_tiled_machine_code_has_no_spills_and_keeps_four_blocks_per_sm(target):
    """The tiled kernel's grid is a block per tile; at least 4 blocks of 8 warps must fit an SM by
    registers (65536 per SM) and by shared memory (B decoded for max_k, at most 48 KB per block)."""
    cfg = generic.TILED
    resources = ptx_reading.cubin_resources(cute_gemv.compile_cubin("fast", target, cfg))
    assert resources["frame_bytes"] == 0, resources
    assert 0 < resources["registers"] <= 65536 // (32 * cfg.warps_per_block * TILED_BLOCKS_PER_SM), resources
    smem = cfg.max_k // 32 * generic.TILED_SMEM_BYTES_PER_CHUNK
    assert smem <= generic.STATIC_SMEM_BYTES and TILED_BLOCKS_PER_SM * smem <= 227 * 1024


@pytest.mark.parametrize("variant", ["fast", "tiled"])
def test_hopper_fast_kernels_decode_with_a_register_lookup(ptx, variant):
    """The default sm_90a decode: prmt looks codes up in a table held in two immediates, dp4a multiplies."""
    text = ptx[variant, "sm_90a"]
    assert cute_gemv.resolve_decode("sm_90a") == "lut"
    assert "dp4a.s32.s32" in text
    table = re.findall(r"prmt\.b32\s+%r\d+, (\d+), (\d+), %r\d+;", text)
    assert table and set(table) == {(str(LUT_LO), str(LUT_HI))}
    assert "dp4a" not in ptx[variant, "sm_100a"]


@pytest.mark.parametrize("config", ["WIDE", "TILED"])
def test_default_configs_keep_the_lookup_table_in_registers(config):
    """Warp 0 stores a copy of the table per lane in shared memory, each lane loads its own, and A's
    lookups take the table from registers (`generic_kernels.lut_table`); B's decode in the tiled kernel's
    prologue may keep the immediates."""
    cfg = getattr(generic, config)
    text = cute_gemv.compile_ptx("fast", "sm_90a", cfg)
    assert "st.shared.v2.b32 [%r" in text and "ld.shared.v2.b32" in text
    for word in (LUT_LO, LUT_HI):  # warp 0 stores the table's two words
        assert re.search(rf"mov\.b32\s+%r\d+, {word};", text), word
    chunks = cfg.rows_per_warp * cfg.unroll if config == "WIDE" else cfg.chunks_per_step  # of A per lane and step
    from_registers = re.findall(r"prmt\.b32\s+%r\d+, %r\d+, %r\d+, %r\d+;", text)
    assert len(from_registers) >= 16 * chunks  # 4 words x 4 lookups per 16-byte chunk of A
    assert f", {LUT_LO};" not in cute_gemv.compile_ptx("fast", "sm_100a", cfg)  # the hardware decode needs no table


OP_INSTRUCTIONS = {  # each PTX op of cute_ptx -> a kernel that calls it and the instruction it emits
    "ld_global_v4_if": ("fast", "sm_90a", "ld.global.nc.L1::no_allocate.v4.u32"),
    "ld_global_u16_if": ("fast", "sm_90a", "ld.global.nc.u16"),
    "ld_global_u32": ("naive", "sm_90a", "ld.global.u32"),
    "e4m3x2_to_f32": ("fast", "sm_90a", "cvt.rn.f16x2.e4m3x2"),
    "half2_to_f32_pair": ("naive", "sm_90a", "cvt.f32.f16"),
    "e2m1x8_to_f16x2": ("fast", "sm_100a", "cvt.rn.f16x2.e2m1x2"),
    "s32_to_f32": ("fast", "sm_90a", "cvt.rn.f32.s32"),
    "prmt": ("naive", "sm_90a", "prmt.b32"),
    "prmt_table": ("fast", "sm_90a", "prmt.b32"),
    "dp4a": ("fast", "sm_90a", "dp4a.s32.s32"),
    "prefetch_l2_if": ("fast prefetch=1", "sm_90a", "cp.async.bulk.prefetch.L2.global"),
    "st_shared": ("tiled", "sm_90a", "st.shared.v4.b32"),
    "ld_shared": ("tiled", "sm_90a", "ld.shared.v4.b32"),
    "fma_rn_f16x2": ("naive", "sm_90a", "fma.rn.f16x2"),
    "prmt_lookup": ("tiled", "sm_90a", "prmt.b32"),
    "l2_policy": ("wholek", "sm_90a", "createpolicy.fractional.L2::evict_first.b64"),
    "ld_global_v4_policy": ("wholek", "sm_90a", "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32"),
    "fma_rn_f32": ("wholek", "sm_90a", "fma.rn.f32"),
    "warp_word_offset": ("wholek k=7168", "sm_90a", "shr.u32"),  # rows of several warps
}


def _ptx_of(ptx, variant: str, target: str) -> str:
    """The PTX of "naive", "fast", "tiled", "wholek" (the per-K kernel's `WholeKConfig()` at K = 2048, or at
    "wholek k=<int>"), or "fast <field>=<int>" (the default fast config with one field changed)."""
    if variant.startswith("wholek"):
        from nvfp4lib.cute import whole_k

        return cute_gemv.compile_ptx("fast", target, whole_k.WholeKConfig(), int(variant.partition("k=")[2] or 2048))
    if " " not in variant:
        return ptx[variant, target]
    field, value = variant.split(" ")[1].split("=")
    return cute_gemv.compile_ptx("fast", target, generic.FastConfig(**{field: int(value)}))


def test_every_ptx_op_is_a_dsl_user_op_that_a_kernel_emits(ptx):
    ops = {name for name, fn in vars(cute_ptx).items()
           if callable(fn) and getattr(fn, "__module__", None) == cute_ptx.__name__ and hasattr(fn, "__wrapped__")}
    assert ops == set(OP_INSTRUCTIONS), "a new op of cute_ptx needs its line in OP_INSTRUCTIONS"
    for name, (variant, target, instruction) in OP_INSTRUCTIONS.items():
        assert instruction in ptx_reading.opcode_counts(_ptx_of(ptx, variant, target)), (name, instruction)


def test_bitops_decode_compiles_for_hopper():
    cfg = generic.FastConfig(decode="bitops")
    text = cute_gemv.compile_ptx("fast", "sm_90a", cfg)
    assert "e2m1" not in text and "dp4a" not in text
    assert "fma.rn.f16x2" in text  # packed fp16 products of the bit-trick decode


def test_config_is_validated():
    with pytest.raises(ValueError, match="variant"):
        cute_gemv.compile_ptx("fastest", "sm_90a")
    with pytest.raises(ValueError, match="k: the default config compiles one kernel per K"):
        cute_gemv.compile_ptx("fast", "sm_90a")
    with pytest.raises(ValueError, match="rows_per_block: expected a divisor of 128 and a multiple of warps_per_block"):
        generic.TiledConfig(rows_per_block=24)
    with pytest.raises(ValueError, match="rows_per_block"):
        generic.TiledConfig(rows_per_block=4, warps_per_block=8)
    with pytest.raises(ValueError, match="chunks_per_step: expected >= 1, got 0"):
        generic.TiledConfig(chunks_per_step=0)
    with pytest.raises(ValueError, match="max_k: expected a multiple of 64 whose decoded B fits 49152 bytes"):
        generic.TiledConfig(max_k=32768)
    with pytest.raises(ValueError, match="decode.*sm_100a or newer"):
        cute_gemv.compile_ptx("fast", "sm_90a", generic.FastConfig(decode="hw"))
    with pytest.raises(ValueError, match="decode"):
        cute_gemv.resolve_decode("sm_90a", "table")


def test_generic_config_fills_whole_steps():
    """The generic kernels' rule (before the per-K kernel served every K): WIDE steps cover 64 chunks of 16 bytes
    per row; where K/32 is not a multiple of 64, the tiled kernel (its warps run on into the next row), up to the
    K its shared memory holds."""
    for k, expected in [(4096, "WIDE"), (32768, "WIDE"), (4608, "TILED"), (256, "TILED"), (1536, "TILED"),
                        (16448, "WIDE")]:
        assert generic.generic_config(k) == getattr(generic, expected), k


@pytest.mark.parametrize("k, chunks, rows", [(64, 1, 4), (256, 1, 4), (1536, 1, 4), (4608, 1, 4), (8192, 1, 4),
                                             (8256, 2, 2), (20480, 3, 2), (65536, 8, 2), (262144, 8, 2)])
def test_default_config_is_a_per_k_kernel_at_every_k(k, chunks, rows):
    """Away from the measured K: one chunk of 4 rows per thread up to K = 8192, then chunks of 2 rows, at most 8
    chunks; every such K is held (at most 1024 threads per block)."""
    cfg = cute_gemv.default_config(k)
    assert (cfg.chunks_per_thread, cfg.rows_per_thread, cfg.row_slots, cfg.decode, cfg.compute) == \
        (chunks, rows, 1, "auto", True)
    assert cfg.refusal(k) is None


def test_a_k_the_per_k_kernel_cannot_hold_is_refused_naming_a():
    """Past 8 chunks of 1024 threads per row; the dispatcher then passes the path over for that K."""
    for k in (262208, 2**20):
        assert cute_gemv.default_config(k).refusal(k).startswith("a: expected K <= 262144 for the whole-K kernel")
    assert cute_gemv.CuteGemv("fast").refusal(2**20).startswith("a: expected K <= 262144")
    assert cute_gemv.CuteGemv("fast", generic.WIDE).refusal(2**20) is None


def test_the_rule_gives_the_measured_configs_at_the_measured_k():
    """`per_k_rule` is the measured table's pattern: at K = 16384 and 7168 it gives the launch shapes of
    results/h200_per_k.csv measured fastest; the row slots of K = 2048, the scale hints and the resident-block counts
    were measured at the benchmark K only, so elsewhere the rule leaves them out."""
    for k, cfg in cute_gemv.PER_K_DEFAULTS.items():
        unmeasured = dataclasses.replace(cfg, min_blocks_per_sm=0, scale_hints=False, row_slots=1, max_blocks_per_sm=0)
        assert cute_gemv.per_k_rule(k) == unmeasured, k


OTHER_K = (64, 256, 1536, 4608, 20480)


@pytest.fixture(scope="module")
def other_k_ptx():
    """PTX of the default config at K other than the benchmark's, for both targets."""
    return {(k, t): cute_gemv.compile_ptx("fast", t, k=k) for k in OTHER_K for t in TARGETS}


@pytest.mark.parametrize("k", OTHER_K)
def test_default_config_compiles_at_other_k_for_both_targets(other_k_ptx, k):
    plan = cute_whole_k.plan_for(cute_gemv.default_config(k), k)
    for target in TARGETS:
        text = other_k_ptx[k, target]
        assert f".target {target}" in text and not re.search(r"\.local\b|ld\.local|st\.local", text)
        assert ("cvt.rn.f16x2.e2m1x2" in text) == (target == "sm_100a") and ("dp4a" in text) == (target == "sm_90a")
        loads = re.findall(r"ld\.global[\w.:]*\.v4\.u32", text)
        assert len(loads) == plan.chunks_per_thread * (plan.rows_per_thread + 1), (k, target)


def test_default_config_at_the_measured_k_is_its_per_k_kernel_and_holds_that_k():
    """The benchmark K run the per-K kernels measured fastest there: w2x2x1 at 16384, w1x4x1 with 5 blocks resident
    per SM at 7168, two row slots of w1x4x1 with 8 at 2048; each with hinted scale loads and its resident blocks
    capped by the shared memory each reserves, at 3, 3 and 6 per SM."""
    whole_k = pytest.importorskip("nvfp4lib.cute.whole_k")
    assert cute_gemv.PER_K_DEFAULTS == {
        16384: whole_k.WholeKConfig(2, 2, 1, scale_hints=True, max_blocks_per_sm=3),
        7168: whole_k.WholeKConfig(1, 4, 1, min_blocks_per_sm=5, scale_hints=True, max_blocks_per_sm=3),
        2048: whole_k.WholeKConfig(1, 4, 2, min_blocks_per_sm=8, scale_hints=True, max_blocks_per_sm=6)}
    assert sorted(cute_gemv.PER_K_DEFAULTS) == sorted({s.k for s in BENCHMARK_SHAPES})
    for k, cfg in cute_gemv.PER_K_DEFAULTS.items():
        assert cute_gemv.default_config(k) is cfg and cfg.compute and cfg.decode == "auto"
        assert cfg.refusal(k) is None
    runner = cute_gemv.CuteGemv()
    assert all(runner.config_for(k) is cfg for k, cfg in cute_gemv.PER_K_DEFAULTS.items())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_cpu_call_gives_clear_error():
    data = generate_input(128, 256, 1)
    with pytest.raises(Exception, match="(?i)cuda"):
        cute_gemv.gemv_cute(data)


KERNELS = {  # name -> (variant, config); None is the per-K default
    "naive": ("naive", None), "fast": ("fast", None),
    "fast-wide-bitops": ("fast", generic.FastConfig(decode="bitops")), "fast-tall": ("fast", generic.TALL),
    "fast-wide": ("fast", generic.WIDE), "tiled-16x8x4": ("fast", generic.TiledConfig(16, 8, 4)),
    "generic": ("fast", generic.generic_config),
    "tiled-bitops": ("fast", generic.TiledConfig(decode="bitops")),
}


@pytest.mark.gpu
@pytest.mark.skipif(not capabilities().cuda, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("shape", TEST_SHAPES + EXTRA_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_matches_reference_on_gpu(kernel, shape):
    variant, cfg = KERNELS[kernel]
    data = generate_input(*shape, seed=shape.m + shape.k, mode="full", device="cuda")
    poison_(data.c)
    result = check(cute_gemv.gemv_cute(data, variant, cfg), data)
    assert result.ok, result.message


# ------------------------------------------------------------------------ DSL version, TVM-FFI, bounds


def test_too_old_dsl_is_refused_with_the_version(monkeypatch):
    monkeypatch.setattr(cute_ptx.cutlass, "__version__", "4.3.0")
    problem = cute_ptx.dsl_problem()
    assert "nvidia-cutlass-dsl 4.3.0 is older than" in problem and "(4.3.4)" in problem
    assert device._probe_cute_dsl() is None  # so capabilities() reports no usable DSL and the paths skip
    monkeypatch.setattr(cute_launch, "DSL_PROBLEM", problem)  # what cute.launch read from cute.ptx at import
    with pytest.raises(RuntimeError, match="4.3.0 is older than"):
        cute_gemv.compile_ptx("fast", "sm_100a", k=2048)
    for fine in ("4.3.4", "4.6.3", "4.10.2", "@CUTLASS_IR_WHEEL_RELEASE_VERSION@"):
        monkeypatch.setattr(cute_ptx.cutlass, "__version__", fine)
        assert cute_ptx.dsl_problem() is None, fine


def test_missing_dsl_names_the_import_error(monkeypatch):
    monkeypatch.setattr(cute_ptx, "cute", None)
    monkeypatch.setattr(cute_ptx, "DSL_IMPORT_ERROR", "ModuleNotFoundError: No module named 'cutlass'")
    assert cute_ptx.dsl_problem().startswith("the CuTe DSL could not be imported (ModuleNotFoundError")


def test_without_tvm_ffi_the_kernels_take_the_plain_call_path(monkeypatch):
    """apache-tvm-ffi hidden: compiling no longer asks for it (that raised CONFIG_MISSING_TVM_FFI), and
    the plain call's arguments marshal with 64-bit addresses intact."""
    import ctypes

    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    assert device.tvm_ffi_problem() == "apache-tvm-ffi is not installed"
    fn = cute_gemv.default_config(7168).compile("sm_100a", 7168)
    assert type(fn).__name__ == "CudaDialectJitCompiledFunction"
    with pytest.raises(Exception, match="TVM FFI is not installed"):
        cute_gemv.default_config(7168).compile("sm_100a", 7168, tvm_ffi=True)
    from cuda.bindings.driver import CUstream

    pointers = (2**40 + 16, 2**33 + 32, 48, 64, 2**47 - 128)  # a, b, the scales read (permuted), c
    a, b, sfa_permuted, sfb_permuted, c = [SimpleNamespace(data_ptr=lambda p=p: p, shape=(7168, 3584, 4))
                                           for p in pointers]
    data = (a, b, None, None, sfa_permuted, sfb_permuted, c)
    args = cute_gemv.kernel_arguments(data, True, tvm_ffi=False)
    marshalled, _ = fn.generate_execution_args(*args, CUstream(0))
    assert [ctypes.cast(p, ctypes.POINTER(ctypes.c_int64)).contents.value for p in marshalled[:5]] == list(pointers)
    assert [ctypes.cast(p, ctypes.POINTER(ctypes.c_int32)).contents.value for p in marshalled[5:8]] == [3584, 7168, 4]
    assert cute_gemv.kernel_arguments(data, True, tvm_ffi=True) == (*pointers, 3584, 7168, 4)


def test_runner_without_tvm_ffi_says_so_and_compiles_for_the_plain_call(monkeypatch, capsys):
    """A machine that looks like a B200 (compiling needs no GPU): the runner notes the slower call path."""
    monkeypatch.setattr(cute_gemv, "cute_arch", lambda: "sm_100a")
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    cute_launch.compiled_kernel.cache_clear()
    try:
        runner = cute_gemv.CuteGemv("naive")
        compiled = cute_launch.compiled_kernel.cache_info().currsize
        kernel = runner.config_for(256).compiled(runner.arch, 256, runner.tvm_ffi)
        assert cute_launch.compiled_kernel.cache_info().currsize == compiled == 1  # compiled at construction
    finally:
        cute_launch.compiled_kernel.cache_clear()
    assert not runner.tvm_ffi and type(kernel).__name__ == "CudaDialectJitCompiledFunction"
    assert runner.config_for(256) == cute_gemv.NaiveConfig() and runner.config_for(256).permuted_scales
    assert "apache-tvm-ffi is not installed, so the kernels are called through the DSL's plain call path" in \
        capsys.readouterr().err


@pytest.mark.parametrize("shape, argument", [
    (Shape(2**24, 256, 128), "a: expected M \\* L <= 2147483520"),  # 2^31 rows over all batches
    (Shape(128, 2**25, 1), "b: expected 128 \\* K/2 <= 2147483647"),
])
def test_shapes_beyond_32_bit_indexing_are_refused(shape, argument, monkeypatch):
    with pytest.raises(NVFP4InputError, match=argument):
        cute_gemv.check_launch_bounds(shape)
    # the runner checks before it reads anything from the tensors
    monkeypatch.setattr(cute_gemv, "validate_gemv_input", lambda data, device: shape)
    with pytest.raises(NVFP4InputError, match=argument):
        cute_gemv.CuteGemv("fast")._arguments(generate_input(128, 256, 1))


def test_largest_supported_shapes_pass_the_bound_check():
    cute_gemv.check_launch_bounds(Shape(cute_gemv.MAX_ROWS, 64, 1))
    cute_gemv.check_launch_bounds(Shape(128, 2**25 - 64, 1))
    for shape in BENCHMARK_SHAPES + TEST_SHAPES:
        cute_gemv.check_launch_bounds(shape)


def test_tiled_kernel_refuses_a_k_beyond_its_shared_memory(monkeypatch):
    """B is decoded into shared memory sized for max_k at compile time: a longer K is refused by name."""
    monkeypatch.setattr(cute_gemv, "validate_gemv_input", lambda data, device: Shape(128, 16448, 1))
    with pytest.raises(NVFP4InputError, match="b: expected K <= 16384 for the tiled kernel.*got K = 16448"):
        cute_gemv.CuteGemv("fast", generic.TILED)._arguments(generate_input(128, 256, 1))
    assert generic.generic_config(16448) == generic.WIDE  # the generic rule never asks it to
    assert generic.TILED.refusal(16384) is None and generic.TILED.refusal(16448).startswith("b: expected K <=")
    assert generic.WIDE.refusal(2**20) is None
