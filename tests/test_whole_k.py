"""The per-K kernels (nvfp4lib.cute.whole_k): launch shapes, the exactness of their block sums by
enumeration, their bit-exact model against the reference, the PTX of both targets, and on a GPU the
kernels against the model bit for bit."""

import csv
import dataclasses
import re

import numpy as np
import pytest
import torch

from nvfp4lib.bench import cute_bench
from nvfp4lib.contract import NVFP4InputError, Shape
from nvfp4lib.device import capabilities
from nvfp4lib.problem import BENCHMARK_SHAPES, EXTRA_SHAPES, TEST_SHAPES, generate_input
from nvfp4lib.reference import check, poison_, reference_gemv
from nvfp4lib.study import ptx_reading
from nvfp4lib.study import whole_k_model as wm

whole_k = pytest.importorskip("nvfp4lib.cute.whole_k")
WholeKConfig, plan_for = whole_k.WholeKConfig, whole_k.plan_for

VARIANTS = ("w2x4x1", "w1x4x1", "w2x8x1", "w2x2x1", "w2x4x1-bitops", "w2x4x1-loads")
"""The configs docs/cute_kernel_notes.md predicts ("per-K kernels"), as cute_bench --configs takes them."""


# ------------------------------------------------------------------------------------ launch shapes


@pytest.mark.parametrize("k, rows, warps, threads_per_row, chunks", [
    (16384, 4, 8, 256, 2), (7168, 4, 4, 128, 2), (2048, 4, 1, 32, 2), (64, 4, 1, 32, 1), (4608, 4, 3, 96, 2)])
def test_default_plan_per_k(k, rows, warps, threads_per_row, chunks):
    plan = plan_for(WholeKConfig(), k)
    assert (plan.rows_per_block, plan.threads // 32, plan.threads_per_row, plan.chunks_per_thread) == \
        (rows, warps, threads_per_row, chunks)
    assert plan.threads_per_row * plan.chunks_per_thread >= plan.n_chunks > plan.threads_per_row * (chunks - 1)


def test_variants_hold_every_test_shape_and_refuse_what_they_cannot():
    for text in VARIANTS:
        cfg = cute_bench.parse_config(text)
        for shape in TEST_SHAPES + EXTRA_SHAPES + BENCHMARK_SHAPES:
            plan = plan_for(cfg, shape.k)
            assert plan.threads <= 1024 and 128 % plan.rows_per_block == 0
    for rows, slots in ((q, s) for q in (1, 2, 4, 8, 16, 32) for s in (1, 2, 4, 8, 16, 32) if q * s <= 128):
        plan = plan_for(WholeKConfig(chunks_per_thread=8, rows_per_thread=rows, row_slots=slots), 64)
        assert plan.rows_per_block <= plan.threads  # one thread writes each row: none is left unwritten
    with pytest.raises(NVFP4InputError, match="a: expected K <= 16384 for the whole-K kernel with 2 row slots"):
        plan_for(WholeKConfig(chunks_per_thread=1, row_slots=2), 32768)
    with pytest.raises(NVFP4InputError, match="multiple of 64"):
        plan_for(WholeKConfig(), 96)
    for bad, why in [(dict(rows_per_thread=3), "rows_per_thread"), (dict(chunks_per_thread=9), "chunks_per_thread"),
                     (dict(row_slots=256), "row_slots"), (dict(decode="table"), "decode"),
                     (dict(rows_per_thread=64), "rows_per_thread: expected a power of two up to 32, got 64"),
                     (dict(rows_per_thread=32, row_slots=8), "rows_per_thread x row_slots: .* up to 128, got 256")]:
        with pytest.raises(ValueError, match=why):
            WholeKConfig(**bad)


def test_cute_bench_names_and_parses_the_per_k_configs():
    assert cute_bench.parse_config("w2x4x1") == WholeKConfig()
    assert cute_bench.kernel_name("fast", WholeKConfig()) == "cute_wholek[]"
    assert cute_bench.kernel_name("fast", cute_bench.parse_config("w1x8x2-bitops")) == \
        "cute_wholek[chunks_per_thread=1,rows_per_thread=8,row_slots=2,decode=bitops]"
    assert not cute_bench.parse_config("w2x4x1-loads").compute
    assert cute_bench.kernel_name("fast", cute_bench.parse_config("w2x4x1-loads")) == "cute_wholek[compute=False]"
    assert isinstance(cute_bench.parse_config("w2x4x1-bitops"), cute_bench.WholeKBitTrick)
    with pytest.raises(ValueError, match="decode: expected one of"):
        WholeKConfig(decode="bitops")  # the core's per-K kernel decodes with "hw" or "lut"
    with pytest.raises(SystemExit, match="w2x4"):
        cute_bench.parse_config("w2x4")

    from nvfp4lib.cute.gemv import CuteGemv  # without a GPU nothing is compiled

    runner = CuteGemv("fast", WholeKConfig(chunks_per_thread=1, row_slots=2))
    assert cute_bench.refusal(runner, generate_input(128, 64, 1)) is None
    big = generate_input(128, 64, 1)
    big = (torch.empty(128, 16384, 1, dtype=torch.uint8), *big[1:])  # only a's shape is read: K = 32768
    assert "K <= 16384" in cute_bench.refusal(runner, big)
    assert runner.cfg.refusal(32768) == cute_bench.refusal(runner, big) and runner.cfg.refusal(16384) is None
    assert cute_bench.refusal(CuteGemv("fast"), big) is None  # the default config holds K = 32768


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_scale_hints_load_the_scales_under_their_operands_policies_and_change_nothing_else(arch):
    """``scale_hints`` (``-hints``): each scale load under the L2 policy its operand loads with (A's scales
    evict_first, B's evict_last), the same loads otherwise, and no other instruction changes."""
    from nvfp4lib.cute.gemv import compile_ptx

    plain, hinted = WholeKConfig(chunks_per_thread=1), cute_bench.parse_config("w1x4x1-hints")
    assert hinted == dataclasses.replace(plain, scale_hints=True)
    assert cute_bench.kernel_name("fast", hinted) == "cute_wholek[chunks_per_thread=1,scale_hints=True]"
    before, after = (compile_ptx("fast", arch, cfg, 7168) for cfg in (plain, hinted))
    counts_before, counts_after = ptx_reading.opcode_counts(before), ptx_reading.opcode_counts(after)
    assert counts_before.pop("ld.global.nc.u16") == counts_after.pop("ld.global.nc.L2::cache_hint.u16") == 1 + 4
    assert counts_before == counts_after  # B's chunk and its 4 rows' chunks, each with its scale pair
    policies = dict(re.findall(r"createpolicy\.fractional\.L2::(\w+)\.b64 (%rd\d+)", after))
    used = [p for _, p in re.findall(r"ld\.global\.nc\.L2::cache_hint\.u16 %rs\d+, \[(%rd\d+)\], (%rd\d+);", after)]
    assert sorted(used) == sorted([policies["evict_last"]] + [policies["evict_first"]] * 4), (policies, used)
    with pytest.raises(ValueError, match="scale_hints: expected True or False, got 'yes'"):
        WholeKConfig(scale_hints="yes")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_benchmark_form_loads_a_with_other_qualifiers_and_only_a(arch):
    """``:QUALIFIERS`` (`cute_bench.WholeKQualified`) replaces the A loads' qualifiers before their L2 policy and
    nothing else: B keeps its own, the kernel is otherwise the same instructions; without it the core's config."""
    from nvfp4lib.cute.gemv import compile_ptx

    def loads(text):
        return re.findall(r"ld\.global[.\w:]*", text)

    plain, hinted = cute_bench.parse_config("w2x2x1"), cute_bench.parse_config("w2x2x1:.L1::evict_first")
    assert type(plain) is WholeKConfig and isinstance(hinted, cute_bench.WholeKQualified)
    assert cute_bench.kernel_name("fast", hinted) == "cute_wholek[rows_per_thread=2,a_load=.L1::evict_first]"
    assert cute_bench.kernel_name("fast", cute_bench.parse_config("w2x2x1-loads:.nc")) == \
        "cute_wholek[rows_per_thread=2,a_load=.nc,compute=False]"
    before, after = (compile_ptx("fast", arch, cfg, 16384) for cfg in (plain, hinted))
    a_before = [x for x in loads(before) if "no_allocate" in x]
    assert a_before and set(a_before) == {"ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32"}
    swapped = [x.replace("ld.global.nc.L1::no_allocate.", "ld.global.L1::evict_first.") for x in loads(before)]
    assert loads(after) == swapped
    assert before.replace("ld.global.nc.L1::no_allocate.", "ld.global.L1::evict_first.") == after
    for bad in ("w2x2x1:;ret;", "w2x2x1:nc", "w2x2x1:.L1::evict_first }"):
        with pytest.raises(SystemExit, match="a_load: expected PTX qualifiers"):
            cute_bench.parse_config(bad)


def test_a_carveout_or_a_block_cap_sets_the_launch_and_nothing_in_the_kernel():
    """``-cN`` / ``-cd`` (`cute_bench.WholeKQualified.smem_carveout`) launch the core's kernel with a preferred
    shared-memory carveout, ``-sN`` (`WholeKConfig.max_blocks_per_sm`) with at most N blocks resident per SM, host
    settings: the PTX is the config's own; values out of range and flags the parser does not know are refused,
    naming them."""
    from nvfp4lib.cute.gemv import compile_ptx

    def body(text):
        return "\n".join(line for line in text.splitlines() if not line.startswith("//"))

    for text, core, field, value in (("w2x2x1-c0", "w2x2x1", "smem_carveout", 0),
                                     ("w1x4x1-m5-hints-cd", "w1x4x1-m5-hints", "smem_carveout", -1),
                                     ("w2x2x1-loads-c100", "w2x2x1-loads", "smem_carveout", 100),
                                     ("w2x2x1-hints-s3", "w2x2x1-hints", "max_blocks_per_sm", 3),
                                     ("w2x2x1-loads-s8", "w2x2x1-loads", "max_blocks_per_sm", 8)):
        cfg, plain = cute_bench.parse_config(text), cute_bench.parse_config(core)
        assert type(cfg) is type(plain) if field == "max_blocks_per_sm" else isinstance(cfg, cute_bench.WholeKQualified)
        assert getattr(cfg, field) == value and cfg != plain, text
        assert cute_bench.kernel_name("fast", cfg).split(f"{field}=")[1].split(",")[0].rstrip("]") == str(value)
        assert body(compile_ptx("fast", "sm_90a", cfg, 16384)) == body(compile_ptx("fast", "sm_90a", plain, 16384))
    for bad, message in (("w2x2x1-c101", "smem_carveout: expected -1 .* or a percentage 0 to 100, got 101"),
                         ("w2x2x1-s9", "max_blocks_per_sm: expected 0 to 8, got 9"),
                         ("w2x2x1-cx", "unknown flag -cx: expected -loads"), ("w2x2x1-hint", "unknown flag -hint")):
        with pytest.raises(SystemExit, match=message):
            cute_bench.parse_config(bad)


@pytest.mark.parametrize("blocks", range(1, 9))
def test_the_capping_shared_memory_fits_that_many_blocks_an_sm_and_not_one_more(blocks):
    """A cap of N (``max_blocks_per_sm``) reserves `reserved_smem` bytes of dynamic shared memory a block: with the
    1 KB the system reserves for each block and the kernels' 1 KB of static shared memory, N blocks fit an SM's 228 KB
    and N + 1 do not, and no block asks more than the 227 KB one block may have."""
    per_block = WholeKConfig(max_blocks_per_sm=blocks).reserved_smem() + 1024 + 1024
    assert blocks * per_block <= 228 * 1024 < (blocks + 1) * per_block
    assert per_block - 1024 <= 227 * 1024
    assert WholeKConfig().reserved_smem() is None


def test_the_default_per_k_kernels_are_the_fastest_measured():
    """`gemv.PER_K_DEFAULTS` against its sources: at K = 16384 and 7168 the launch shape is the computing per-K
    config of results/h200_per_k.csv with the least leaderboard time and the least kernel time, faster than the
    fast kernel's default there (K = 2048's two row slots were not among them); and in the recorded run that
    chose the rest, results/h100_kernel_vs_read.csv (an H100 80GB HBM3), under each of its CuTe DSL releases (two
    at least), the default took less leaderboard time at its K than every other per-K config timed there, the
    default with its scale hints switched and, for a capped default, without its cap among them. The default's
    row is ``cute_fast``, or its config by name where the run timed it so (the sweep that chose it)."""
    from nvfp4lib.cute import gemv

    with open("results/h200_per_k.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    with open("results/h100_kernel_vs_read.csv", newline="") as f:
        recorded = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    for k in (16384, 7168):
        shape = dataclasses.replace(gemv.PER_K_DEFAULTS[k], min_blocks_per_sm=0, scale_hints=False, max_blocks_per_sm=0)
        per_k = [r for r in rows if r["path"].startswith("cute_wholek[") and int(r["k"]) == k
                 and "compute=False" not in r["path"]]
        assert len(per_k) == 5, k  # the computing configs of nvfp4lib.bench.profile.PER_K
        for measure in ("leaderboard_us", "kernel_us"):
            best = min(per_k, key=lambda r: float(r[measure]))  # noqa: B023
            assert best["path"] == cute_bench.kernel_name("fast", shape), (k, measure)
        fast = next(r for r in rows if r["path"] == "cute_fast" and int(r["k"]) == k)
        assert float(best["leaderboard_us"]) < float(fast["leaderboard_us"])
    for k, cfg in gemv.PER_K_DEFAULTS.items():
        at_k = [r for r in recorded if r["kind"] == "nvfp4lib" and int(r["k"]) == k]
        releases = {r["env_cute_dsl"] for r in at_k}
        assert len(releases) >= 2, (k, releases)
        own = cute_bench.kernel_name("fast", cfg)
        alternatives = {cute_bench.kernel_name("fast", dataclasses.replace(cfg, scale_hints=not cfg.scale_hints)),
                        cute_bench.kernel_name("fast", dataclasses.replace(cfg, max_blocks_per_sm=0))} - {own}
        for release in releases:
            timed = [r for r in at_k if r["env_cute_dsl"] == release]
            (default,) = [r for r in timed if r["path"] in ("cute_fast", own)]
            others = [r for r in timed if r["path"].startswith("cute_wholek[") and r["path"] != own]
            assert alternatives <= {r["path"] for r in others}, (k, release)
            for r in others:
                assert float(default["leaderboard_us"]) < float(r["leaderboard_us"]), (k, release, r["path"])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_resident_block_count_sets_the_registers_ptxas_may_use(arch):
    """``min_blocks_per_sm`` N (``-mN``) is the launch's ``.minnctapersm N``: ptxas fits N blocks per SM (its
    ``-maxrregcount`` is ignored for the kernels' ``.reqntid``), so 32 cap the registers and 8 (at K = 2048, blocks
    of 128 threads) let it use more than it takes unasked; 0 adds no directive. Compiled also without a GPU, where
    every CuTe DSL release asks the driver for the SM's shared memory (`launch.compile_gemv_launch` answers it)."""
    from nvfp4lib.cute.gemv import compile_cubin, compile_ptx

    capped, eight, unasked = (cute_bench.parse_config("w1x4x1-m32"), cute_bench.parse_config("w1x4x2-m8"),
                              WholeKConfig(chunks_per_thread=1, row_slots=2))
    assert cute_bench.kernel_name("fast", capped) == "cute_wholek[chunks_per_thread=1,min_blocks_per_sm=32]"
    assert eight == dataclasses.replace(unasked, min_blocks_per_sm=8)  # 128 threads a block
    for cfg, directive in ((capped, ".minnctapersm 32"), (eight, ".minnctapersm 8\n"), (unasked, None)):
        text = compile_ptx("fast", arch, cfg, 2048)
        assert (directive in text) if directive else "minnctapersm" not in text, (cfg, arch)
    registers = {cfg: ptx_reading.cubin_resources(compile_cubin("fast", arch, cfg, 2048))["registers"]
                 for cfg in (capped, eight, unasked)}
    assert registers[capped] <= 65536 // (32 * 64) < registers[unasked] < registers[eight] <= 65536 // (8 * 128), \
        registers
    for bad in ("w1x4x1-m33", "w2x2x1-loads-m40"):
        with pytest.raises(SystemExit, match=r"min_blocks_per_sm: expected 0 to 32, got \d+"):
            cute_bench.parse_config(bad)
    with pytest.raises(ValueError, match="min_blocks_per_sm: expected 0 to 32, got -1"):
        WholeKConfig(min_blocks_per_sm=-1)


@pytest.mark.skipif(capabilities().cuda, reason="with a GPU the driver answers for the SM's shared memory")
def test_without_a_gpu_a_kernel_with_resident_blocks_compiles_for_any_target():
    """Without a GPU the DSL's question for more than one resident block (the SM's shared memory) is answered, so
    the config itself compiles (not the DSL's missing-driver error) for a target the package does not know too,
    and the answer reaches neither the PTX nor the cubin: the same PTX as through `compile_ptx`."""
    from nvfp4lib.cute.gemv import compile_ptx

    cfg = WholeKConfig(chunks_per_thread=1, min_blocks_per_sm=8)
    assert type(cfg.compile("sm_120a", 2048, tvm_ffi=False)).__name__ == "CudaDialectJitCompiledFunction"
    text = compile_ptx("fast", "sm_120a", cfg, 2048)
    assert ".minnctapersm 8\n" in text and ".target sm_120a" in text


# ------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("decode", ["bitops", "hw"])
def test_fp16_block_sums_are_exact_for_every_reachable_accumulator(decode):
    """Every accumulator value the 8 fma.rn.f16 of a lane can reach from +0, every code pair at each step:
    no FMA rounds; partial sums stay within 1152 units (2^-16 with the bit trick, 1/4 with true values)."""
    found = wm.fp16_accumulation_check(decode)
    assert found["max_units"] == 8 * 144 and found["unit"] == (2.0 ** -16 if decode == "bitops" else 0.25)
    assert found["fmas_checked"] > 10 ** 6
    with pytest.raises(AssertionError, match="fma.rn.f16"):  # 16 products per lane would round
        wm.fp16_accumulation_check(decode, products_per_lane=16)


def test_lookup_integers_and_the_two_accumulator_block_sum_are_exact():
    assert wm.lut_accumulation_check() == {"max_product": 144, "max_block": 2304}
    rng = np.random.default_rng(25)
    pairs = np.stack(np.meshgrid(np.arange(256), np.arange(256), indexing="ij"), -1).reshape(-1, 2)
    values = np.array([float(v) for v in wm.e2m1_f16_bits(np.arange(16)).view(np.float16)])
    for position in range(8):
        a = rng.integers(0, 256, (len(pairs), 8), dtype=np.uint8)
        b = rng.integers(0, 256, (len(pairs), 8), dtype=np.uint8)
        a[:, position], b[:, position] = pairs[:, 0], pairs[:, 1]
        got = wm.block_dot_lut2(list(a.view("<u4").T), list(b.view("<u4").T)).astype(np.float64)
        codes = lambda x: np.stack([values[x & 15], values[x >> 4]], -1).reshape(len(x), 16)  # noqa: E731
        assert np.array_equal(got / 4, (codes(a) * codes(b)).sum(1)), position


@pytest.mark.parametrize("shape", [Shape(128, 256, 1), Shape(256, 7168, 1), Shape(128, 192, 3), Shape(384, 2048, 2),
                                   Shape(128, 4608, 1), Shape(128, 16384, 1)], ids=lambda s: "x".join(map(str, s)))
def test_model_decodes_agree_bit_for_bit_and_match_the_reference(shape):
    data = generate_input(*shape, seed=shape.m + shape.k, mode="full")
    plan = plan_for(WholeKConfig(), shape.k)
    results = {d: wm.plan_model(data, plan, d) for d in ("hw", "lut", "bitops")}
    for decode in ("lut", "bitops"):
        assert np.array_equal(results["hw"][0].view(np.uint32), results[decode][0].view(np.uint32)), decode
    fp16 = results["lut"][1]
    result = check(torch.from_numpy(fp16).unsqueeze(1), data)
    assert result.ok, result.message
    exact16 = reference_gemv(data)[:, 0, :].numpy().astype(np.float16)
    assert np.array_equal(fp16.view(np.uint16), exact16.view(np.uint16))  # no fp32 rounding crossed an fp16 tie here


@pytest.mark.parametrize("k", [64, 256, 1536, 4608, 20480])
def test_default_config_at_other_k_matches_the_reference_through_its_model(k):
    """Away from the measured K the default is still a per-K kernel (`gemv.per_k_rule`): its model, every
    decode bit for bit alike, passes the reference's check."""
    from nvfp4lib.cute import gemv

    data = generate_input(128, k, 2 if k <= 1536 else 1, seed=k, mode="full")
    plan = plan_for(gemv.default_config(k), k)
    results = {d: wm.plan_model(data, plan, d) for d in ("hw", "lut")}
    assert np.array_equal(results["hw"][0].view(np.uint32), results["lut"][0].view(np.uint32))
    result = check(torch.from_numpy(results["hw"][1]).unsqueeze(1), data)
    assert result.ok, result.message


def test_exactness_text_names_the_bounds():
    for phrase in ("1152", "2048", "2^-24", ".ftz", "fma.rn.f32"):
        assert phrase in wm.EXACTNESS


# ------------------------------------------------------------------------------------ PTX, both targets

@pytest.fixture(scope="module")
def ptx():
    if whole_k.cute is None:
        pytest.skip("CuTe DSL (nvidia-cutlass-dsl) is not installed")
    from nvfp4lib.cute.gemv import compile_ptx

    texts = {(arch, k): compile_ptx("fast", arch, WholeKConfig(), k)
             for arch in ("sm_90a", "sm_100a") for k in (16384, 7168, 2048)}
    texts["sm_90a", "bitops"] = compile_ptx("fast", "sm_90a", cute_bench.parse_config("w2x4x1-bitops"), 2048)
    return texts


@pytest.mark.cute
@pytest.mark.parametrize("k", [16384, 7168, 2048])
def test_blackwell_build_uses_the_hardware_conversion_and_wide_hinted_loads(ptx, k):
    text = ptx["sm_100a", k]
    plan = plan_for(WholeKConfig(), k)
    assert ".target sm_100a" in text and "cvt.rn.f16x2.e2m1x2" in text and "dp4a" not in text
    loads = re.findall(r"ld\.global[\w.:]*\.v4\.u32", text)
    per_thread = plan.chunks_per_thread * (plan.rows_per_thread + 1)  # its chunks of A for each row, and of B
    assert len(loads) == per_thread
    assert loads.count("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32") == plan.chunks_per_thread * \
        plan.rows_per_thread
    assert loads.count("ld.global.nc.L1::evict_last.L2::cache_hint.v4.u32") == plan.chunks_per_thread
    assert "createpolicy.fractional.L2::evict_first.b64" in text and "createpolicy.fractional.L2::evict_last.b64" in text
    assert not re.search(r"\.local\b|ld\.local|st\.local", text)


@pytest.mark.cute
@pytest.mark.parametrize("k", [16384, 7168, 2048, "bitops"])
def test_hopper_build_has_no_fp4_instruction_and_no_local_memory(ptx, k):
    text = ptx["sm_90a", k]
    assert ".target sm_90a" in text and "e2m1" not in text
    assert not re.search(r"\.local\b|ld\.local|st\.local", text)
    counts = ptx_reading.opcode_counts(text)
    assert counts["ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32"] >= 1
    if k == "bitops":  # packed fp16 block sums that keep subnormals
        assert counts["fma.rn.f16x2"] > 0 and not any(".ftz" in op and "f16" in op for op in counts)
    else:
        assert counts["dp4a.s32.s32"] > 0 and counts["prmt.b32"] > 0


@pytest.mark.cute
def test_sm100_fp16_block_sums_keep_subnormals_and_each_block_is_one_fma(ptx):
    counts = ptx_reading.opcode_counts(ptx["sm_100a", 16384])
    plan = plan_for(WholeKConfig(), 16384)
    assert counts["fma.rn.f16x2"] > 0 and not any(".ftz" in op and "f16" in op for op in counts)
    assert counts["fma.rn.f32"] == 2 * plan.chunks_per_thread * plan.rows_per_thread  # one per 16-element block


@pytest.mark.cute
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("text", ["w2x4x1", "w1x4x1", "w2x8x1"])
def test_machine_code_has_no_spills(arch, text):
    if whole_k.cute is None:
        pytest.skip("CuTe DSL (nvidia-cutlass-dsl) is not installed")
    cfg = cute_bench.parse_config(text)
    from nvfp4lib.cute.gemv import compile_cubin

    resources = ptx_reading.cubin_resources(compile_cubin("fast", arch, cfg, 16384))
    assert resources["frame_bytes"] == 0 and 0 < resources["registers"] <= 168, resources


@pytest.mark.cute
def test_cute_gemv_compiles_a_per_k_config_once_per_k(monkeypatch):
    """On a machine that looks like a B200 (compiling needs no GPU): no kernel at construction, one per K on
    first use, the same object for the same K."""
    from nvfp4lib.cute import gemv

    if whole_k.cute is None:
        pytest.skip("CuTe DSL (nvidia-cutlass-dsl) is not installed")
    monkeypatch.setattr(gemv, "cute_arch", lambda: "sm_100a")
    compiles = []
    monkeypatch.setattr(WholeKConfig, "compile", lambda cfg, arch, k, options="", tvm_ffi=None:
                        compiles.append((arch, cfg, k)) or object())
    from nvfp4lib.cute.launch import compiled_kernel as cache
    cache.cache_clear()
    try:
        runner = gemv.CuteGemv("fast", WholeKConfig())
        assert compiles == []  # no K yet
        first = runner.cfg.compiled(runner.arch, 2048, runner.tvm_ffi)
        assert runner.cfg.compiled(runner.arch, 2048, runner.tvm_ffi) is first
        assert runner.cfg.compiled(runner.arch, 4096, runner.tvm_ffi) is not first
        assert compiles == [("sm_100a", WholeKConfig(), 2048), ("sm_100a", WholeKConfig(), 4096)]
        refusing = gemv.CuteGemv("fast", WholeKConfig(chunks_per_thread=1, row_slots=2))
        monkeypatch.setattr(gemv, "validate_gemv_input", lambda data, device: Shape(128, 32768, 1))
        with pytest.raises(NVFP4InputError, match="a: expected K <= 16384 for the whole-K kernel"):
            refusing.prepare(generate_input(128, 256, 1))
        default = gemv.CuteGemv("fast")  # compiles the table's kernels at their K, at construction
        assert compiles[2:] == [("sm_100a", cfg, k) for k, cfg in gemv.PER_K_DEFAULTS.items()]
        assert all(default.config_for(k) is cfg for k, cfg in gemv.PER_K_DEFAULTS.items())
    finally:
        cache.cache_clear()


# ------------------------------------------------------------------------------------ on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not capabilities().cuda, reason="needs a CUDA GPU")
@pytest.mark.parametrize("text", ["w2x2x1-c0", "w1x4x1-m5-hints-cd", "w1x4x2-m8-c100", "w2x2x1-hints-s3",
                                  "w1x4x2-m8-s2"])
def test_a_kernel_launched_with_a_carveout_or_a_block_cap_still_matches_the_reference_on_gpu(text):
    """The shared-memory carveout (CuTe DSL 4.6 or newer) and the cap on resident blocks are host settings: the
    kernel's results stay exact."""
    from nvfp4lib.cute import gemv

    if "-c" in text and cute_bench.carveout_problem():
        pytest.skip(cute_bench.carveout_problem())
    for shape in (Shape(256, 16384, 1), Shape(128, 7168, 2), Shape(256, 2048, 3)):
        data = generate_input(*shape, seed=shape.m + shape.k, mode="full", device="cuda")
        poison_(data.c)
        result = check(gemv.gemv_cute(data, "fast", cute_bench.parse_config(text)), data)
        assert result.ok, (shape, result.message)


@pytest.mark.gpu
@pytest.mark.skipif(not capabilities().cuda, reason="needs a CUDA GPU")
@pytest.mark.parametrize("text", [v for v in VARIANTS if not v.endswith("-loads")])
@pytest.mark.parametrize("shape", TEST_SHAPES + EXTRA_SHAPES, ids=lambda s: f"{s.m}x{s.k}x{s.l}")
def test_matches_the_reference_and_its_model_bit_for_bit_on_gpu(text, shape):
    from nvfp4lib.cute import gemv

    cfg = cute_bench.parse_config(text)
    data = generate_input(*shape, seed=shape.m + shape.k, mode="full", device="cuda")
    poison_(data.c)
    out = gemv.gemv_cute(data, "fast", cfg)
    result = check(out, data)
    assert result.ok, result.message
    if shape.m * shape.k * shape.l > 1 << 24:
        return  # the numpy model of the largest shapes takes minutes on the host: the check above suffices there
    decode = gemv.resolve_decode(capabilities().cute_arch, cfg.decode)
    _, model16 = wm.plan_model(data, plan_for(cfg, shape.k), decode)
    got = out[:, 0, :].cpu().numpy()
    assert np.array_equal(got.view(np.uint16), model16.view(np.uint16))


def test_config_model_models_the_kernel_each_config_runs():
    """What a check of the default runner compares against: the per-K plan for a per-K config, the fast
    kernel's lane order for the fast and tiled kernels."""
    from nvfp4lib.cute import gemv
    from nvfp4lib.study import decode_models, generic_kernels

    data = generate_input(128, 2048, 2, seed=5, mode="full")
    per_k = wm.config_model(data, gemv.default_config(2048), "hw")
    expected = wm.plan_model(data, plan_for(gemv.PER_K_DEFAULTS[2048], 2048), "hw")
    assert all(np.array_equal(x.view(np.uint32 if x.dtype == np.float32 else np.uint16),
                              y.view(np.uint32 if y.dtype == np.float32 else np.uint16)) for x, y in zip(per_k, expected))
    fast = wm.config_model(data, generic_kernels.TILED, "lut")[0]
    assert np.array_equal(fast.view(np.uint32), decode_models.fast_kernel_model(data, "lut")[0].view(np.uint32))
