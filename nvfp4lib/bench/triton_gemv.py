"""Triton NVFP4 GEMV kernels: the lookup kernel a Triton user writes first, and Blackwell's block-scaled dot.

Both are peers of the CuTe DSL kernel (nvfp4lib.cute.gemv): they read the leaderboard tensors in
place, through their strides, and cover all L batches in one launch (program grid: row blocks x L).

* `TritonGemv`: per program BLOCK_M rows of one batch; a loop over K in BLOCK_K chunks loads the
  packed bytes of A as [rows, scale blocks, 8 bytes] and those of the vector (row 0 of b; rows
  1..127 are never read), splits the nibbles (the low one is the even element), decodes every code
  by a gather from a 16-entry fp32 table (``decode="bits"``: by bit operations instead), sums each
  16-element block's products over the last axis, multiplies the block sums by both block scales
  (gathered from a 256-entry fp32 table of every E4M3 code, so subnormal and negative scales are
  exact) and accumulates in fp32. Every block term is exact in fp32 (16 code products are
  multiples of 1/4 of at most 576 in magnitude, and each scale adds 4 significant bits), so the
  only rounding is the fp32 sum over blocks and the final fp16 store. Tuned with
  ``triton.autotune`` over `LOOKUP_CONFIGS`, keyed on (M, K/2, L). The first call of a key times
  every config, which runs the kernel several times on the caller's tensors: c is only written
  (never read or accumulated into), so each run leaves the same correct c, and no
  ``reset_to_zero`` or ``restore_value`` is needed. Its times are in the benchmark's results
  (``triton_nvfp4``, ``triton_nvfp4_bits``).
* `TritonDotScaledGemv` (Blackwell, sm_100+): the same GEMV as ``tl.dot_scaled`` on E2M1
  operands with float8e4nv (E4M3) scales per 16 elements, the NVFP4 form Triton lowers to the
  tensor cores' block-scaled MMA (``kind::mxf4nvf4``, ``scale_vec::4X``). The vector is the MMA's
  column 0 of `DOT_N` (the other columns are zero codes with zero scales) and column 0 of the
  result is stored. Tensor cores read block scales as unsigned (UE4M3), while this problem's
  scales may be negative: a negative scale's sign is moved onto its block's 16 codes
  (x * -s = -x * s, and negating an E2M1 code flips its bit 3), which is exact.

`why_unavailable()` and `dot_scaled_unavailable()` say why a kernel cannot run here (None: it
can). This module imports without Triton; the kernels are defined only where Triton imports.
"""

from __future__ import annotations

import functools

import torch

from nvfp4lib.caches import TupleCache
from nvfp4lib.contract import BLOCK_SIZE, byte_view, validate_gemv_input
from nvfp4lib.device import Capabilities, capabilities, missing
from nvfp4lib.formats import E2M1_VALUES, decode_e4m3
from nvfp4lib.messages import describe_error

try:  # Triton is optional: the rest of the package works without it.
    import triton
    import triton.language as tl
    TRITON_IMPORT_ERROR = None
except ImportError as not_there:  # pragma: no cover - exercised on machines without Triton
    triton = tl = None
    TRITON_IMPORT_ERROR = describe_error(not_there)

BLACKWELL = (10, 0)  # the first compute capability with block-scaled tensor-core MMAs
DOT_N = 16  # MMA columns the vector is padded to (column 0 holds it)
BLOCK_SCALED_MMA = "mxf4nvf4"  # in the PTX of an MMA on E2M1 operands with E4M3 scales per 16

LOOKUP_CONFIGS = (  # (BLOCK_M rows, BLOCK_K elements, num_warps, num_stages): 32 bytes of A per thread and step
    (1, 2048, 1, 3), (2, 1024, 1, 3), (2, 2048, 2, 3), (4, 1024, 2, 3),
    (4, 2048, 4, 3), (8, 1024, 4, 3), (8, 2048, 8, 2), (16, 512, 4, 3),
)
DECODES = ("table", "bits")  # E2M1 decode of `TritonGemv`: a gather from a 16-entry table, or bit operations
DOT_SCALED_CONFIGS = (  # (BLOCK_M rows, BLOCK_K elements, num_warps, num_stages); Triton 3.6 lowers
    # BLOCK_M = 64 to no block-scaled MMA (its compile fails), so 128 rows: the MMA's M
    (128, 256, 4, 3), (128, 128, 4, 4), (128, 512, 4, 2), (128, 256, 8, 3),
)


def why_unavailable(caps: Capabilities | None = None) -> str | None:
    """Why `TritonGemv` cannot run here, or on the machine `caps` describes (None: Triton imports and
    there is a CUDA GPU)."""
    if triton is None:
        return f"needs Triton (not installed: {TRITON_IMPORT_ERROR}); pip install triton"
    return missing(caps or capabilities(), "cuda")


def dot_scaled_unavailable(caps: Capabilities | None = None) -> str | None:
    """Why `TritonDotScaledGemv` cannot run here, or on the machine `caps` describes (None: it can).

    Beyond `why_unavailable`: a Blackwell GPU (sm_100+), a Triton with ``tl.dot_scaled``, and one
    that compiles it for this GPU, with E4M3 scales per 16 elements (NVFP4; Triton's documented
    form is MX: E8M0 scales per 32), to the block-scaled MMA rather than an emulation.
    """
    caps = caps or capabilities()
    reason = why_unavailable(caps)
    if reason is not None:
        return reason
    major, minor = caps.sm
    if (major, minor) < BLACKWELL:
        return (f"needs sm_100 or newer (Blackwell's block-scaled tensor-core MMA behind tl.dot_scaled); "
                f"this GPU is sm_{major}{minor}")
    if not hasattr(tl, "dot_scaled"):
        return f"needs tl.dot_scaled, which Triton {triton.__version__} does not have"
    return _nvfp4_dot_scaled_problem(major * 10 + minor)


@functools.cache
def _nvfp4_dot_scaled_problem(capability: int) -> str | None:
    """Compile the dot-scaled kernel for this GPU once: None if it uses the block-scaled MMA."""
    try:
        ptx = compile_ptx("dot_scaled", capability)
    except Exception as err:  # noqa: BLE001 - any compiler failure means "cannot run"; the message is kept
        return (f"Triton {triton.__version__} cannot compile tl.dot_scaled on e2m1 operands with float8e4nv "
                f"scales per 16 elements (NVFP4) for sm_{capability}: {describe_error(err, 400)}")
    if BLOCK_SCALED_MMA not in ptx:
        return (f"Triton {triton.__version__} compiles tl.dot_scaled with NVFP4 scales for sm_{capability} "
                f"without the block-scaled MMA ({BLOCK_SCALED_MMA}): an emulation, not this peer")
    return None


# --------------------------------------------------------------------------- device code

if triton is not None:

    @triton.jit
    def _e2m1_scaled_down(codes):
        """int32 E2M1 codes -> fp32 values times 2^-14, without a table: the code's 3 magnitude bits
        placed in bits 11..9 of an fp16 (its 2 low exponent bits and top mantissa bit) and its sign in
        bit 15 make that fp16 (normal and subnormal codes alike); fp16 -> fp32 is exact."""
        bits = ((codes & 7) << 9) | ((codes & 8) << 12)
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _e2m1(codes, table_ptr, DECODE: tl.constexpr):
        """int32 E2M1 codes -> fp32 values: gathered from the 16-entry table, or by `_e2m1_scaled_down`
        (an exact factor 2^14 that the caller folds in elsewhere)."""
        if DECODE == "table":
            return tl.load(table_ptr + codes)
        else:
            return _e2m1_scaled_down(codes)

    @triton.jit
    def _gemv_lookup_kernel(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, e2m1_ptr, e4m3_ptr,
                            M, K_HALF, K_BLOCKS, L,  # K_HALF and L only key the autotuning
                            stride_am, stride_ak, stride_al, stride_bk, stride_bl,
                            stride_sam, stride_sak, stride_sal, stride_sbk, stride_sbl,
                            stride_cm, stride_cl,
                            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr):
        """c[rows, 0, batch] for BLOCK_M rows of one batch. A step's bytes are held as [rows, scale
        blocks, 8 bytes], so each block's sum is a sum over the last axis."""
        GROUPS: tl.constexpr = BLOCK_K // 16  # scale blocks per step (8 bytes each)
        batch = tl.program_id(1).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        a_rows = a_ptr + batch * stride_al + rows64[:, None, None] * stride_am
        sfa_rows = sfa_ptr + batch * stride_sal + rows64[:, None] * stride_sam
        b_row = b_ptr + batch * stride_bl  # row 0 of b: the vector
        sfb_row = sfb_ptr + batch * stride_sbl
        in_block = tl.arange(0, 8)
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for first_group in range(0, K_BLOCKS, GROUPS):
            groups = first_group + tl.arange(0, GROUPS)
            group_ok = groups < K_BLOCKS
            cols = groups[:, None] * 8 + in_block[None, :]  # [GROUPS, 8] byte offsets in a row
            a = tl.load(a_rows + cols[None, :, :] * stride_ak, mask=row_ok[:, None, None] & group_ok[None, :, None],
                        other=0).to(tl.int32)
            b = tl.load(b_row + cols * stride_bk, mask=group_ok[:, None], other=0).to(tl.int32)
            b_even = _e2m1(b & 15, e2m1_ptr, DECODE)  # the low nibble holds the even element
            b_odd = _e2m1(b >> 4, e2m1_ptr, DECODE)
            if DECODE == "bits":  # B exact: the 2^-14 stays on A's values only
                b_even = b_even * 16384.0
                b_odd = b_odd * 16384.0
            a_even = _e2m1(a & 15, e2m1_ptr, DECODE)
            a_odd = _e2m1(a >> 4, e2m1_ptr, DECODE)
            pairs = a_even * b_even[None, :, :] + a_odd * b_odd[None, :, :]
            block_sums = tl.sum(pairs, axis=2)  # [BLOCK_M, GROUPS], exact
            sa_codes = tl.load(sfa_rows + groups[None, :] * stride_sak, mask=row_ok[:, None] & group_ok[None, :],
                               other=0)
            sb_codes = tl.load(sfb_row + groups * stride_sbk, mask=group_ok, other=0)
            sa = tl.load(e4m3_ptr + sa_codes.to(tl.int32))
            sb = tl.load(e4m3_ptr + sb_codes.to(tl.int32))
            acc += tl.sum(block_sums * sa * sb[None, :], axis=1)
        if DECODE == "bits":
            acc = acc * 16384.0  # exact: undoes the 2^-14 of A's values
        tl.store(c_ptr + batch * stride_cl + rows64 * stride_cm, acc.to(tl.float16), mask=row_ok)

    @triton.jit
    def _signs_to_codes(codes, scales, ROWS: tl.constexpr, GROUPS: tl.constexpr):
        """(codes [ROWS, GROUPS * 8], scales [ROWS, GROUPS]) uint8 -> the same products with every
        scale's sign bit cleared and moved onto the 16 E2M1 codes (8 bytes) of its block."""
        scale_bits = scales.to(tl.int32)
        flips = (scale_bits >> 7) * 0x88  # both nibbles' sign bits where the scale is negative
        blocks = tl.reshape(codes.to(tl.int32), (ROWS, GROUPS, 8)) ^ flips[:, :, None]
        return tl.reshape(blocks, (ROWS, GROUPS * 8)).to(tl.uint8), (scale_bits & 0x7F).to(tl.uint8)

    @triton.jit
    def _gemv_dot_scaled_kernel(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr,
                                M, K_HALF, K_BLOCKS, L,
                                stride_am, stride_ak, stride_al, stride_bk, stride_bl,
                                stride_sam, stride_sak, stride_sal, stride_sbk, stride_sbl,
                                stride_cm, stride_cl,
                                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
        """c[rows, 0, batch] for BLOCK_M rows of one batch as a block-scaled MMA with the vector in column 0."""
        HALF: tl.constexpr = BLOCK_K // 2
        GROUPS: tl.constexpr = BLOCK_K // 16
        batch = tl.program_id(1).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        in_vector = (tl.arange(0, BLOCK_N) == 0)[:, None]  # [BLOCK_N, 1]: column 0 of the MMA's B
        a_rows = a_ptr + batch * stride_al + rows64[:, None] * stride_am
        sfa_rows = sfa_ptr + batch * stride_sal + rows64[:, None] * stride_sam
        b_row = b_ptr + batch * stride_bl
        sfb_row = sfb_ptr + batch * stride_sbl
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, K_HALF, HALF):
            cols = start + tl.arange(0, HALF)
            col_ok = cols < K_HALF
            groups = start // 8 + tl.arange(0, GROUPS)
            group_ok = groups < K_BLOCKS
            a = tl.load(a_rows + cols[None, :] * stride_ak, mask=row_ok[:, None] & col_ok[None, :], other=0)
            sa = tl.load(sfa_rows + groups[None, :] * stride_sak, mask=row_ok[:, None] & group_ok[None, :], other=0)
            b = tl.load(b_row + cols[None, :] * stride_bk, mask=col_ok[None, :], other=0)  # [1, HALF]
            sb = tl.load(sfb_row + groups[None, :] * stride_sbk, mask=group_ok[None, :], other=0)  # [1, GROUPS]
            a, sa = _signs_to_codes(a, sa, BLOCK_M, GROUPS)
            b, sb = _signs_to_codes(b, sb, 1, GROUPS)
            b_cols = tl.where(in_vector, b, tl.zeros((BLOCK_N, HALF), dtype=tl.uint8))  # [BLOCK_N, HALF]
            sb_cols = tl.where(in_vector, sb, tl.zeros((BLOCK_N, GROUPS), dtype=tl.uint8))
            acc = tl.dot_scaled(a, sa.to(tl.float8e4nv, bitcast=True), "e2m1",
                                b_cols.T, sb_cols.to(tl.float8e4nv, bitcast=True), "e2m1", acc)
        column0 = (tl.arange(0, BLOCK_N) == 0)[None, :]
        out = tl.sum(tl.where(column0, acc, 0.0), axis=1)  # column 0 of the result (the others are zero)
        tl.store(c_ptr + batch * stride_cl + rows64 * stride_cm, out.to(tl.float16), mask=row_ok)

    def _autotuned(kernel, table, **constexprs):
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_K": k, **constexprs}, num_warps=w, num_stages=s)
                   for m, k, w, s in table]
        return triton.autotune(configs, key=["M", "K_HALF", "L"])(kernel)

    _KERNELS = {"lookup": _gemv_lookup_kernel, "dot_scaled": _gemv_dot_scaled_kernel}
    _TUNED = {  # (variant, decode) -> the autotuned kernel; each keeps its best config per (M, K/2, L)
        **{("lookup", decode): _autotuned(_gemv_lookup_kernel, LOOKUP_CONFIGS, DECODE=decode) for decode in DECODES},
        ("dot_scaled", None): _autotuned(_gemv_dot_scaled_kernel, DOT_SCALED_CONFIGS, BLOCK_N=DOT_N),
    }


# --------------------------------------------------------------------------- host code


def compile_ptx(variant: str = "lookup", capability: int = 90, block_m: int | None = None,
                block_k: int | None = None, num_warps: int = 4, num_stages: int = 3, decode: str = "table") -> str:
    """PTX of one variant ("lookup", with `decode`, or "dot_scaled") for compute capability `capability`
    (90: Hopper, 100: Blackwell), compiled without a GPU; block sizes default to the variant's first config."""
    if triton is None:
        raise RuntimeError(why_unavailable())
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _KERNELS[variant]
    first = (LOOKUP_CONFIGS if variant == "lookup" else DOT_SCALED_CONFIGS)[0]
    constexprs = {"BLOCK_M": block_m or first[0], "BLOCK_K": block_k or first[1]}
    if variant == "dot_scaled":
        constexprs["BLOCK_N"] = DOT_N
    else:
        constexprs["DECODE"] = decode
    # unit strides (K within a row, M within c) are specialized to 1 at launch, as here
    constexprs.update({name: 1 for name in ("stride_ak", "stride_bk", "stride_sak", "stride_sbk", "stride_cm")})
    pointers = {"a_ptr": "*u8", "b_ptr": "*u8", "sfa_ptr": "*u8", "sfb_ptr": "*u8", "c_ptr": "*fp16",
                "e2m1_ptr": "*fp32", "e4m3_ptr": "*fp32"}
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "i32") for name in kernel.arg_names}
    # what Triton's launcher sees at the benchmark shapes: 16-byte aligned tensors, sizes and strides
    # multiples of 16 (M, K/2, K/16, and the batch strides)
    aligned = [name for name in (*pointers, "M", "K_HALF", "K_BLOCKS", "stride_am", "stride_al", "stride_bl",
                                 "stride_sam", "stride_sal", "stride_sbl", "stride_cl") if name in kernel.arg_names]
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options).asm["ptx"]


def _decode_tables(device) -> tuple[torch.Tensor, torch.Tensor]:
    """The E2M1 values of codes 0..15 and the E4M3 values of bytes 0..255, as fp32 on `device`."""
    e2m1 = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    e4m3 = decode_e4m3(torch.arange(256, dtype=torch.uint8)).to(device)
    return e2m1, e4m3


class _TritonRunner:
    """Validates each set of tensors once (remembered with `TupleCache`) and launches a tuned kernel."""

    variant = ""
    decode = None

    def __init__(self, cache_entries: int = 4):
        self._prepared = TupleCache(cache_entries)
        self._tables: dict = {}

    def unavailable(self) -> str | None:
        raise NotImplementedError

    def __call__(self, data) -> torch.Tensor:
        """Write c = A @ b[0] per batch into data's c (on the current stream) and return it."""
        launch, c = self._prepared.get(data, self._prepare)
        launch()
        return c

    def _prepare(self, data):
        shape = validate_gemv_input(data, device="cuda")
        reason = self.unavailable()
        if reason is not None:
            raise RuntimeError(f"{type(self).__name__}: {reason}")
        a, b, sfa, sfb, _, _, c = data
        a, b = byte_view(a, "a", torch.float4_e2m1fn_x2), byte_view(b, "b", torch.float4_e2m1fn_x2)
        sfa, sfb = byte_view(sfa, "sfa", torch.float8_e4m3fn), byte_view(sfb, "sfb", torch.float8_e4m3fn)
        m, k, l = shape
        args = [a, b, sfa, sfb, c]
        if self.variant == "lookup":
            if c.device not in self._tables:
                self._tables[c.device] = _decode_tables(c.device)
            args += self._tables[c.device]
        args += [m, k // 2, k // BLOCK_SIZE, l,
                 a.stride(0), a.stride(1), a.stride(2), b.stride(1), b.stride(2),
                 sfa.stride(0), sfa.stride(1), sfa.stride(2), sfb.stride(1), sfb.stride(2),
                 c.stride(0), c.stride(2)]
        kernel = _TUNED[self.variant, self.decode]

        def grid(meta):
            return triton.cdiv(m, meta["BLOCK_M"]), l

        def launch():
            with torch.cuda.device(c.device):
                kernel[grid](*args)

        return launch, c


class TritonGemv(_TritonRunner):
    """The Triton NVFP4 GEMV with lookup decode, autotuned per (M, K, L): ``TritonGemv()(data) -> c``.

    Writes data's c in place and returns it. Inputs are validated once per set of tensors; the
    first call of a shape also times `LOOKUP_CONFIGS` (harmless to c: it is only written).
    ``decode="bits"`` decodes E2M1 codes with bit operations instead of the table gathers.
    """

    variant = "lookup"

    def __init__(self, decode: str = "table", cache_entries: int = 4):
        if decode not in DECODES:
            raise ValueError(f"decode: expected one of {DECODES}, got {decode!r}")
        super().__init__(cache_entries)
        self.decode = decode

    def unavailable(self) -> str | None:
        return why_unavailable()


class TritonDotScaledGemv(_TritonRunner):
    """The GEMV as Triton's ``tl.dot_scaled`` on Blackwell: ``TritonDotScaledGemv()(data) -> c``.

    Writes data's c in place and returns it; `dot_scaled_unavailable()` says where it cannot run.
    The first call of a shape times `DOT_SCALED_CONFIGS`.
    """

    variant = "dot_scaled"

    def unavailable(self) -> str | None:
        return dot_scaled_unavailable()
