"""The torch._scaled_mm GEMV variants (the registry's scaled_mm_* paths) against the independent
exact reference.

On machines without FP4 GEMM (CPU, Hopper) the variants run the emulation, which decodes the
BLOCKED scale buffers exactly as cuBLAS reads them, so these tests check the layout code too.
Data on a CUDA device, where a Blackwell GPU runs cuBLAS's FP4 GEMM, has unsigned scales only
(`negative_scales=False`): cuBLAS reads NVFP4 block scales as UE4M3.
"""
import functools

import pytest
import torch

from nvfp4lib import scaled_mm
from nvfp4lib.contract import GemvInput, NVFP4InputError, Shape
from nvfp4lib.device import capabilities
from nvfp4lib.formats import as_fp4x2, dequantize_nvfp4, fp4_bytes, quantize_nvfp4
from nvfp4lib.layouts import permuted_as_blocked, to_blocked, to_permuted
from nvfp4lib.paths import PATHS
from nvfp4lib.problem import MODES, TEST_SHAPES, generate_input
from nvfp4lib.reference import TOLERANCE, check, poison_, reference_gemv

RTOL = ATOL = TOLERANCE
VARIANTS = ["scaled_mm_reference", "scaled_mm_permuted", "scaled_mm_transposed", "scaled_mm_functional"]
EXTRA_SHAPES = [Shape(256, 512, 3)]  # L = 3: more batches than a 2-stream pool


def _skip_if_unavailable(variant: str, on_cuda: bool = False) -> None:
    why_not = PATHS[variant].unavailable(capabilities(), on_cuda)
    if why_not:
        pytest.skip(why_not)


@functools.lru_cache(maxsize=None)
def _built(variant: str):
    """The registry path's callable, built once."""
    return PATHS[variant].build()


def test_the_variants_are_the_registrys_scaled_mm_paths():
    assert set(VARIANTS) <= {name for name in PATHS if name.startswith("scaled_mm_")}
    assert PATHS["scaled_mm_permuted"].build() is scaled_mm.gemv_scaled_mm_permuted
    assert PATHS["scaled_mm_reference"].build() is scaled_mm.gemv_scaled_mm_reference
    assert PATHS["scaled_mm_functional"].build() is scaled_mm.gemv_scaled_mm_functional
    transposed = PATHS["scaled_mm_transposed"].build()
    assert transposed.func is scaled_mm.gemv_scaled_mm_transposed and transposed.keywords == {"streams": 2}


def _seed(shape: Shape, mode: str) -> int:
    """A different, reproducible seed per case (str hashes change between runs)."""
    return shape.m + 7 * shape.k + 31 * shape.l + MODES.index(mode)


@functools.lru_cache(maxsize=None)
def _case(shape: Shape, mode: str, device: str = "cpu"):
    """Data and its reference, built once per (shape, mode): the float64 reference is the slow part."""
    data = generate_input(*shape, seed=_seed(shape, mode), mode=mode, device=device)
    return data, reference_gemv(data)


def _assert_matches(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements left unwritten"
    torch.testing.assert_close(out.float().cpu(), expected.cpu(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", TEST_SHAPES + EXTRA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_reference(variant, shape, mode):
    _skip_if_unavailable(variant)
    data, expected = _case(shape, mode)
    c = poison_(data.c)
    out = _built(variant)(data)
    assert out is c, "the result must be written into the given c"
    _assert_matches(out, expected)
    assert scaled_mm.last_backend == scaled_mm.describe_backend("cpu")


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_check_agrees(variant):
    """One end-to-end pass through reference.check, the checker every kernel uses."""
    _skip_if_unavailable(variant)
    data = generate_input(512, 1536, 2, seed=7)
    poison_(data.c)
    result = check(_built(variant)(data), data, rtol=RTOL, atol=ATOL)
    assert result.ok, result.message


def test_cpu_path_is_reported_as_emulated():
    data, _ = _case(TEST_SHAPES[0], "full")
    scaled_mm.gemv_scaled_mm_permuted(data)
    assert scaled_mm.last_backend.startswith("emulated (")
    assert scaled_mm.describe_backend("cpu").startswith("emulated (")


@pytest.mark.parametrize("options", [dict(), dict(streams=2), dict(side_stream=True),
                                     dict(streams=1, side_stream=True)])
def test_transposed_options_are_correct(options):
    data, expected = _case(EXTRA_SHAPES[0], "full")
    poison_(data.c)
    _assert_matches(scaled_mm.gemv_scaled_mm_transposed(data, **options), expected)


# --- the transposed variant reads the scales and codes as they are now -----------------------

@pytest.mark.parametrize("which", ["sfa", "sfb"])
def test_in_place_scale_change_is_seen(which):
    data = generate_input(256, 512, 2, seed=4)
    a, b, sfa, sfb, *_ = data
    before = scaled_mm.gemv_scaled_mm_transposed(data).clone()
    # Double the scales of one row of batch 1 (exact in E4M3: the largest drawn scale is 240).
    sf = sfa if which == "sfa" else sfb
    sf[0, :, 1] = (sf[0, :, 1].float() * 2).to(torch.float8_e4m3fn)
    poison_(data.c)
    after = scaled_mm.gemv_scaled_mm_transposed(data)
    _assert_matches(after, reference_gemv(data))
    if which == "sfa":  # only row 0 of batch 1 changes, and it doubles
        changed = torch.zeros_like(before, dtype=torch.bool)
        changed[0, 0, 1] = True
    else:  # b's row 0 is the vector: every output of batch 1 doubles
        changed = torch.zeros_like(before, dtype=torch.bool)
        changed[:, 0, 1] = True
    assert torch.equal(after[changed], 2 * before[changed])
    assert torch.equal(after[~changed], before[~changed])


def test_changed_a_is_seen():
    """An in-place change of a byte of A shows up in the next result, and only in its row."""
    data = generate_input(256, 512, 1, seed=6)
    before = scaled_mm.gemv_scaled_mm_transposed(data).clone()
    a_bytes = fp4_bytes(data.a)
    a_bytes[7, 0, 0] = a_bytes[7, 0, 0] ^ 0x88  # flip the sign of both codes in one byte
    poison_(data.c)
    after = scaled_mm.gemv_scaled_mm_transposed(data)
    _assert_matches(after, reference_gemv(data))
    assert torch.equal(after[8:], before[8:]) and torch.equal(after[:7], before[:7])


# --- the emulation itself ---------------------------------------------------------------------

def test_emulation_is_a_full_gemm():
    """All 128 columns, not just column 0, against dequantize + float64 matmul."""
    gen = torch.Generator().manual_seed(0)
    qa = quantize_nvfp4(torch.randn(256, 640, generator=gen), global_scale=1.0)
    qb = quantize_nvfp4(torch.randn(128, 640, generator=gen), global_scale=1.0)
    out = scaled_mm.emulated_scaled_mm_fp4(qa.codes, qb.codes.T, to_blocked(qa.scales),
                                           to_blocked(qb.scales), out_dtype=torch.float32)
    want = dequantize_nvfp4(qa).double() @ dequantize_nvfp4(qb).double().T
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


def test_emulation_reads_the_blocked_layout():
    """The plain row-major scale bytes have the right size but give wrong results."""
    data, _ = _case(Shape(256, 1024, 1), "full")
    a, b, sfa, sfb, sfa_p, sfb_p, _ = data
    mat1, mat2 = a[:, :, 0], b[:, :, 0].T
    blocked = scaled_mm.emulated_scaled_mm_fp4(mat1, mat2, permuted_as_blocked(sfa_p, 0),
                                               permuted_as_blocked(sfb_p, 0))
    assert torch.equal(blocked, scaled_mm.emulated_scaled_mm_fp4(mat1, mat2, to_blocked(sfa[:, :, 0]),
                                                                 to_blocked(sfb[:, :, 0])))
    plain = scaled_mm.emulated_scaled_mm_fp4(mat1, mat2, sfa[:, :, 0].contiguous().view(-1),
                                             sfb[:, :, 0].contiguous().view(-1))
    assert not torch.allclose(plain[:, 0].float(), blocked[:, 0].float(), rtol=RTOL, atol=ATOL)


def test_emulation_checks_like_scaled_mm():
    data, _ = _case(Shape(256, 1024, 1), "full")
    a, b, _, _, sfa_p, sfb_p, _ = data
    sa, sb = permuted_as_blocked(sfa_p, 0), permuted_as_blocked(sfb_p, 0)
    emu = scaled_mm.emulated_scaled_mm_fp4
    with pytest.raises(NVFP4InputError, match="column-major mat2"):
        emu(a[:, :, 0], as_fp4x2(fp4_bytes(b[:, :, 0]).T.contiguous()), sa, sb)
    with pytest.raises(NVFP4InputError, match="scale_a: expected a contiguous float8_e4m3fn blocked"):
        emu(a[:, :, 0], b[:, :, 0].T, sa[:-512], sb)
    with pytest.raises(NVFP4InputError, match="scale_b: expected .* got torch.uint8"):
        emu(a[:, :, 0], b[:, :, 0].T, sa, sb.view(torch.uint8))
    with pytest.raises(NVFP4InputError, match="mat1: expected a 2-D float4_e2m1fn_x2"):
        emu(fp4_bytes(a[:, :, 0]), b[:, :, 0].T, sa, sb)
    with pytest.raises(NVFP4InputError, match="multiples of 16"):
        emu(a[:, :, 0], b[:8, :, 0].T, sa, sb)


def _emulation_args():
    data, _ = _case(Shape(256, 1024, 1), "full")
    a, b, _, _, sfa_p, sfb_p, _ = data
    return a[:, :, 0], b[:, :, 0].T, permuted_as_blocked(sfa_p, 0), permuted_as_blocked(sfb_p, 0)


@pytest.mark.parametrize("out_dtype", [torch.int8, torch.bool, torch.uint8, torch.int32, torch.float64,
                                       torch.complex64, torch.float8_e4m3fn, torch.float4_e2m1fn_x2, None, "float16",
                                       float])
def test_emulation_refuses_the_outputs_scaled_mm_refuses(out_dtype):
    """torch._scaled_mm's FP4 GEMM writes fp16, bf16 or fp32: an int8 or bool output (which a cast
    would truncate) is refused, naming out_dtype."""
    with pytest.raises(NVFP4InputError, match=r"^out_dtype: expected one of torch\.float16, torch\.bfloat16, "
                                              r"torch\.float32 .*, got "):
        scaled_mm.emulated_scaled_mm_fp4(*_emulation_args(), out_dtype=out_dtype)


@pytest.mark.parametrize("out_dtype", scaled_mm.OUT_DTYPES)
def test_emulation_writes_each_output_dtype_scaled_mm_writes(out_dtype):
    args = _emulation_args()
    want = scaled_mm.emulated_scaled_mm_fp4(*args, out_dtype=torch.float32)
    got = scaled_mm.emulated_scaled_mm_fp4(*args, out_dtype=out_dtype)
    assert got.dtype == out_dtype and torch.equal(got, want.to(out_dtype))


def test_emulation_takes_scaled_mms_other_arguments_with_its_checks():
    args = _emulation_args()
    emu = scaled_mm.emulated_scaled_mm_fp4
    plain = emu(*args)
    bias = torch.linspace(-2, 2, 128, dtype=torch.float16)
    assert torch.equal(emu(*args, bias=bias), (emu(*args, out_dtype=torch.float32) + bias.float()).half())
    assert torch.equal(emu(*args, scale_result=torch.tensor(1.0)), plain)  # unused for a 16-bit output, as in torch
    with pytest.raises(NVFP4InputError, match=r"^use_fast_accum: expected False .*float4_e2m1fn_x2"):
        emu(*args, use_fast_accum=True)
    with pytest.raises(NVFP4InputError, match=r"^bias: expected 128 elements .* of torch\.float16 .*, got "
                                              r"torch\.bfloat16 with 128 elements"):
        emu(*args, bias=bias.bfloat16())
    with pytest.raises(NVFP4InputError, match=r"^bias: expected 128 elements .*, got torch\.float16 with 64"):
        emu(*args, bias=bias[:64])
    with pytest.raises(NVFP4InputError, match=r"^bias: expected None: .*no bias for a float32 output"):
        emu(*args, bias=bias.float(), out_dtype=torch.float32)
    with pytest.raises(NVFP4InputError, match=r"^bias: expected .*, got list"):
        emu(*args, bias=[0.0] * 128)
    with pytest.raises(NVFP4InputError, match=r"^scale_result: expected None or a float32 scalar tensor"):
        emu(*args, scale_result=torch.ones(2))
    with pytest.raises(NVFP4InputError, match=r"^scale_result: expected None or a float32 scalar tensor"):
        emu(*args, scale_result=1.0)
    mat1, mat2, sa, sb = args
    with pytest.raises(NVFP4InputError, match=r"^scale_b: expected a torch\.Tensor, got NoneType"):
        emu(mat1, mat2, sa, None)
    with pytest.raises(NVFP4InputError, match=r"^mat1, mat2, scale_a, scale_b: expected one device, got .*meta"):
        emu(mat1, mat2, sa, sb.to("meta"))


def _cancelling_input(pairs: int = 1024):
    """A valid input whose exact answer is 4 in every row: `pairs` products +6*448 * 6*448 (about
    2^22.8 each), one product 1*2 * 1*2 = 4 after them, then `pairs` products of -6*448 * 6*448.
    Every partial sum of the large products is a multiple of 2^12, exact in fp32; the 4 meets a
    partial sum of about 2^32 (or, split differently, at least 2^27 before the big ones cancel),
    where fp32's step is 16 or more, and is rounded away."""
    k = -(-(2 * pairs + 16) // 64) * 64
    a, b, sfa, sfb, _, _, c = generate_input(128, k, 1, seed=3)
    codes_a, codes_b, scales_a, scales_b = (t.view(torch.uint8) for t in (a, b, sfa, sfb))
    for t in (codes_a, codes_b, scales_a, scales_b):
        t.zero_()
    e4m3 = {v: torch.tensor(v).to(torch.float8_e4m3fn).view(torch.uint8) for v in (2.0, 448.0)}
    big, small = pairs // 16, pairs // 16  # scale blocks of large products before and after the small one
    for block in list(range(big)) + list(range(big + 1, 2 * big + 1)):
        codes_a[:, 8 * block:8 * block + 8, 0] = 0x77 if block < big else 0xFF  # +6 +6 / -6 -6 per byte
        codes_b[0, 8 * block:8 * block + 8, 0] = 0x77
        scales_a[:, block, 0], scales_b[0, block, 0] = e4m3[448.0], e4m3[448.0]
    codes_a[:, 8 * small, 0], codes_b[0, 8 * small, 0] = 0x02, 0x02  # 1.0 (low nibble), 0 (high)
    scales_a[:, small, 0], scales_b[0, small, 0] = e4m3[2.0], e4m3[2.0]
    return GemvInput(a, b, sfa, sfb, to_permuted(sfa), to_permuted(sfb), c)


def test_cancelling_products_are_exact_in_the_reference_and_lost_in_fp32_sums():
    """Documented behaviour, not a bug: the reference is exact (4 in every row), the emulation sums
    in fp32 like cuBLAS and returns 0 here, outside the leaderboard's rtol = atol = 1e-3 of the
    exact answer (so the local check fails it). The public leaderboard compares with its own
    torch._scaled_mm, another fp32 sum, whose order decides whether it sees 0 or 4."""
    data = _cancelling_input()
    exact = reference_gemv(data)
    assert torch.equal(exact, torch.full_like(exact, 4.0))
    out = scaled_mm.gemv_scaled_mm_permuted(data)
    assert torch.equal(out, torch.zeros_like(out)), "an fp32 sum that adds the 4 after the cancellation would keep it"
    result = check(out, data)
    assert not result.ok and "128 of 128 elements mismatch" in result.message
    # within the fp32 error bound the emulation documents: K * 2^-24 * sum |products|
    k = 2 * data.a.shape[1]
    assert 4.0 <= k * 2.0 ** -24 * (2 * 1024 * (6 * 448) ** 2 + 4)
    for doc in (scaled_mm.emulated_scaled_mm_fp4.__doc__, PATHS["scaled_mm_permuted"].summary):
        assert "fp32" in doc and "exact emulation" not in doc


# --- bad inputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_inputs_are_named(variant):
    _skip_if_unavailable(variant)
    fn = _built(variant)
    data = generate_input(128, 256, 1)
    with pytest.raises(NVFP4InputError, match="data: expected a 7-tuple"):
        fn(tuple(data)[:6])
    with pytest.raises(NVFP4InputError, match="a: expected dtype torch.float4_e2m1fn_x2"):
        fn(tuple(data._replace(a=fp4_bytes(data.a))))
    with pytest.raises(NVFP4InputError, match="c: expected shape"):
        fn(tuple(data._replace(c=torch.zeros(128, 1, 2, dtype=torch.float16))))
    two = generate_input(128, 256, 2)
    with pytest.raises(NVFP4InputError, match="a: expected strides"):  # right shape, wrong storage order
        fn(tuple(two._replace(a=as_fp4x2(fp4_bytes(two.a).contiguous()))))


@pytest.mark.parametrize("streams", [-1, 1.5, "2", True])
def test_bad_stream_count(streams):
    data = generate_input(128, 256, 1)
    with pytest.raises(NVFP4InputError, match="streams: expected an int >= 0"):
        scaled_mm.gemv_scaled_mm_transposed(data, streams=streams)


def test_functional_absent_raises_not_implemented(monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "scaled_mm", raising=False)
    assert torch.__version__ in scaled_mm.functional_unavailable_reason()
    with pytest.raises(NotImplementedError, match="not available in PyTorch"):
        scaled_mm.gemv_scaled_mm_functional(generate_input(128, 256, 1))


# --- hardware ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("shape", [Shape(256, 1024, 1), Shape(512, 4096, 2)], ids=str)
def test_cuda_emulation_matches_cpu(shape):
    # Same seed, same bytes (drawn on the CPU), laid out on the GPU as documented.
    data_cpu, data_gpu = (generate_input(*shape, seed=_seed(shape, "full"), device=device, negative_scales=False)
                          for device in ("cpu", "cuda"))
    expected = reference_gemv(data_cpu)
    for l in range(shape.l):
        args = lambda d: (d.a[:, :, l], d.b[:, :, l].T, permuted_as_blocked(d.sfa_permuted, l),
                          permuted_as_blocked(d.sfb_permuted, l))
        on_gpu = scaled_mm.emulated_scaled_mm_fp4(*args(data_gpu))
        on_cpu = scaled_mm.emulated_scaled_mm_fp4(*args(data_cpu))
        torch.testing.assert_close(on_gpu.cpu().float(), on_cpu.float(), rtol=RTOL, atol=ATOL)
    for variant in VARIANTS:
        if PATHS[variant].unavailable(capabilities(), True):
            continue
        poison_(data_gpu.c)
        _assert_matches(_built(variant)(data_gpu), expected)
        assert scaled_mm.last_backend == scaled_mm.describe_backend("cuda")


@pytest.mark.gpu
def test_cuda_streams_join_the_callers_stream():
    shape = Shape(512, 4096, 4)
    data = generate_input(*shape, seed=11, device="cuda", negative_scales=False)
    expected = reference_gemv(data)
    for options in (dict(streams=2), dict(streams=4, side_stream=True)):
        poison_(data.c)
        out = scaled_mm.gemv_scaled_mm_transposed(data, **options)
        snapshot = out.clone()  # queued on the caller's stream: must see every batch written
        torch.cuda.synchronize()
        _assert_matches(snapshot, expected)


@pytest.mark.gpu
def test_cuda_streams_order_with_a_non_default_caller_stream():
    """The side stream and the pool start after the caller's earlier work (c poisoned behind a
    long sleep) and finish before its later work (a copy of c queued right after the call)."""
    data = generate_input(512, 4096, 4, seed=12, device="cuda", negative_scales=False)
    expected = reference_gemv(data)
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())  # the data were made there
    with torch.cuda.stream(caller):
        torch.cuda._sleep(20_000_000)
        poison_(data.c)
        scaled_mm.gemv_scaled_mm_transposed(data, streams=2, side_stream=True)
        snapshot = data.c.clone()
    caller.synchronize()
    _assert_matches(snapshot, expected)


@pytest.mark.sm100
@pytest.mark.parametrize("shape", [Shape(128, 256, 1), Shape(384, 7168, 2), Shape(7168, 2048, 1)], ids=str)
def test_hardware_matches_emulation(shape):
    data = generate_input(*shape, seed=1, device="cuda", negative_scales=False)
    a, b, _, _, sfa_p, sfb_p, _ = data
    for l in range(shape.l):
        sa, sb = permuted_as_blocked(sfa_p, l), permuted_as_blocked(sfb_p, l)
        for args in ((a[:, :, l], b[:, :, l].T, sa, sb), (b[:, :, l], a[:, :, l].T, sb, sa)):
            hw = torch._scaled_mm(*args, out_dtype=torch.float16)
            emu = scaled_mm.emulated_scaled_mm_fp4(*args)
            torch.testing.assert_close(hw.float(), emu.float(), rtol=RTOL, atol=ATOL)
    expected = reference_gemv(data)
    for variant in VARIANTS:
        if PATHS[variant].unavailable(capabilities(), True):
            continue
        poison_(data.c)
        _assert_matches(_built(variant)(data), expected)
        assert scaled_mm.last_backend == scaled_mm.HARDWARE_BACKEND


def test_a_gemv_checks_its_tuple_once_not_each_batchs_gemm_arguments(monkeypatch):
    """The emulated GEMM of each batch runs on operands the 7-tuple's check made right: the public
    emulation's argument checks run for its own callers, not once per batch."""
    checked = []
    real = scaled_mm._check_scaled_mm_args
    monkeypatch.setattr(scaled_mm, "_check_scaled_mm_args", lambda *args: checked.append(1) or real(*args))
    data, expected = _case(EXTRA_SHAPES[0], "leaderboard")
    for variant in ("scaled_mm_reference", "scaled_mm_permuted", "scaled_mm_transposed"):
        poison_(data.c)
        _assert_matches(_built(variant)(data), expected)
    assert checked == []
    a, b = data.a[:, :, 0], data.b[:, :, 0]
    scaled_mm.emulated_scaled_mm_fp4(a, b.T, to_blocked(data.sfa[:, :, 0]), to_blocked(data.sfb[:, :, 0]))
    assert checked == [1]
