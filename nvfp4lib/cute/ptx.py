"""The CuTe DSL, imported once, and the PTX instructions the CuTe kernels use, as DSL ops.

The DSL is optional: the rest of the package works without it. It is imported here, guarded, and the other
CuTe modules take its names from this module, so there is one place that says whether it is there and new
enough (`DSL_PROBLEM`; the kernels are built and checked with nvidia-cutlass-dsl 4.3 to 4.8,
`device.MIN_CUTE_DSL`). What differs between those releases is met here, once: inline PTX goes through
the MLIR op that all of them have (`inline_ptx`), pointers are passed as their addresses, shared memory is
allocated in bytes (`smem_words`), and the packed fp16 FMA is written out (`fma_rn_f16x2`); `launch.compile_artifact`
reads PTX and cubins from the compiler's dump folder.

Each op below is one `inline_ptx` block wrapped as a DSL user op (``@dsl_user_op``: it takes the
caller's source location, so compiler diagnostics point at the kernel line that called it). Called from inside
a ``@cute.kernel``, an op is traced inline: it emits exactly the PTX written here and nothing else, so the
kernels choose every load and conversion instruction themselves. The ops take and return the DSL's 32-bit
registers (``Int32``, ``Float32``), whatever the PTX types inside. ISA facts they rely on are modelled, and
checked on any machine, in `nvfp4lib.study.decode_models`."""

from __future__ import annotations

import re

from nvfp4lib.device import cute_dsl_version_problem, installed_cute_dsl_version

try:  # an exported file runs this block among its imports, above every inlined function: builtins only
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float16, Float32, Int16, Int32, Int64, Uint32
    from cutlass.cutlass_dsl import dsl_user_op
    from cutlass._mlir.dialects import llvm
    DSL_IMPORT_ERROR = None
except ImportError as not_there:  # pragma: no cover - exercised on machines without the DSL
    cutlass = cute = llvm = None
    Float16 = Float32 = Int16 = Int32 = Int64 = Uint32 = None  # only traced code uses them
    DSL_IMPORT_ERROR = f"{type(not_there).__name__}: {not_there}"

    def dsl_user_op(op):
        """Without the DSL the ops are still defined, so this module imports; nothing can trace them."""
        return op


def dsl_problem() -> str | None:
    """Why the installed CuTe DSL cannot build the kernels (None: it can)."""
    if cute is None:
        return (f"the CuTe DSL could not be imported ({DSL_IMPORT_ERROR}); "
                f"pip install 'nvidia-cutlass-dsl>=4.3' apache-tvm-ffi")
    return cute_dsl_version_problem(installed_cute_dsl_version(cutlass))


DSL_PROBLEM = dsl_problem()
"""Checked once, at import: None, or why compiling a kernel is refused (a missing or too old DSL)."""


# --------------------------------------------------------------------------- inline PTX, on every DSL release

_PLACEHOLDER = re.compile(r"\{\$([wr])(\d+)\}")


def _constraint(dtype) -> str:
    """The inline-assembly register class of a DSL scalar type: f32, or b16 / b32 / b64 by width."""
    return "f" if dtype is Float32 else {16: "h", 32: "r", 64: "l"}[dtype.width]


def inline_ptx(ptx: str, write_only_types=(), read_only_args=(), *, loc=None, ip=None):
    """``ptx`` as one inline-assembly op: ``{$wN}`` are its outputs (of ``write_only_types``), ``{$rN}`` its
    inputs (``read_only_args``: DSL scalars or CuTe pointers). Written on the MLIR ``llvm.inline_asm`` op, which
    every CuTe DSL release has (``cute.arch.inline_ptx`` is missing before 4.6 and takes no pointer in 4.6), so
    that every release emits the same PTX. Marked as having side effects, as CUTLASS marks its own: the
    compiler neither moves one across a barrier nor merges two. Returns None, one value, or a tuple."""
    n_out = len(write_only_types)
    asm = _PLACEHOLDER.sub(lambda m: f"${int(m[2]) + (n_out if m[1] == 'r' else 0)}", ptx)
    inputs = [(arg.llvm_ptr, "l") if isinstance(arg, cute.Pointer) else (arg.ir_value(loc=loc, ip=ip),
              _constraint(type(arg))) for arg in read_only_args]  # a CuTe pointer as its 64-bit address
    constraints = ",".join([f"={_constraint(t)}" for t in write_only_types] + [c for _, c in inputs])
    types = [t.mlir_type for t in write_only_types]
    result = None if n_out == 0 else types[0] if n_out == 1 else llvm.StructType.get_literal(types)
    out = llvm.inline_asm(result, [v for v, _ in inputs], asm, constraints, has_side_effects=True,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    if n_out <= 1:
        return write_only_types[0](out) if n_out else None
    return tuple(t(llvm.extractvalue(ty, out, [i], loc=loc, ip=ip))
                 for i, (t, ty) in enumerate(zip(write_only_types, types)))


def fixed_op(ptx: str, write_only_types, casts=None):
    """A DSL op of one fixed `inline_ptx` block: ``op(*inputs)``, input i cast by ``casts[i]`` unless that is
    None (``Int32(x)``: any 32-bit value as the register the PTX reads), its outputs ``write_only_types``."""
    @dsl_user_op
    def op(*inputs, loc=None, ip=None):
        inputs = [x if cast is None else cast(x) for cast, x in zip(casts, inputs)] if casts else inputs
        return inline_ptx(ptx, write_only_types, inputs, loc=loc, ip=ip)
    return op


# --------------------------------------------------------------------------- global loads


V4_WORDS = "{{$w0}, {$w1}, {$w2}, {$w3}}"  # the 4 words a 128-bit load writes, as an inline_ptx operand list


def _v4_load(load: str, args: list, pred, loc, ip):
    """The 128-bit load ``load`` (of `V4_WORDS`, its inputs ``args``), where ``pred`` is true and zeros elsewhere
    (``pred`` None: unpredicated)."""
    if pred is not None:
        load = (f"{{ .reg .pred p;\n setp.ne.b32 p, {{$r{len(args)}}}, 0;\n"
                " mov.b32 {$w0}, 0; mov.b32 {$w1}, 0; mov.b32 {$w2}, 0; mov.b32 {$w3}, 0;\n"
                f" @p {load} }}")
        args = [*args, Int32(pred)]
    return inline_ptx(load, write_only_types=[Int32] * 4, read_only_args=args, loc=loc, ip=ip)


@dsl_user_op
def ld_global_v4_if(ptr, pred, hint: str, *, loc=None, ip=None):
    """128-bit load (4 words) that yields zeros where ``pred`` is false (K tails, pipeline end).
    ``hint`` is the PTX qualifiers between ``ld.global`` and ``.v4``, e.g. ``".nc"``."""
    return _v4_load(f"ld.global{hint}.v4.u32 {V4_WORDS}, [{{$r0}}];", [ptr], pred, loc, ip)


@dsl_user_op
def ld_global_u16_if(ptr, pred, policy=None, *, loc=None, ip=None):
    """16-bit read-only load (two scale bytes) that yields 0 where ``pred`` is false (None: true), under the L2
    cache policy ``policy`` (`l2_policy`) where one is given."""
    hinted = policy is not None
    load = ".L2::cache_hint.u16 {$w0}, [{$r0}], {$r2}; }" if hinted else ".u16 {$w0}, [{$r0}]; }"
    return inline_ptx("{ .reg .pred p;\n setp.ne.b32 p, {$r1}, 0;\n mov.b16 {$w0}, 0;\n @p ld.global.nc" + load,
                      [Int16], [ptr, Int32(1 if pred is None else pred)] + [policy] * hinted, loc=loc, ip=ip)


ld_global_u32 = fixed_op("ld.global.u32 {$w0}, [{$r0}];", [Int32])
"""``ld_global_u32(ptr)``: plain 32-bit load (8 FP4 codes)."""


@dsl_user_op
def prefetch_l2_if(ptr, nbytes, max_bytes: int, pred, *, loc=None, ip=None):
    """Ask the L2 to fetch min(``nbytes``, ``max_bytes``) bytes (multiples of 16; ``ptr`` 16-byte
    aligned) from global memory where ``pred``: ``cp.async.bulk.prefetch.L2`` (sm_90+). A hint: no
    registers, nothing to wait for, so it puts more bytes in flight than a warp's registers can hold."""
    inline_ptx(
        "{ .reg .pred p; .reg .b32 n;\n setp.ne.b32 p, {$r2}, 0;\n"
        f" min.s32 n, {{$r1}}, {max_bytes};\n"
        " @p cp.async.bulk.prefetch.L2.global [{$r0}], n; }", read_only_args=[ptr, Int32(nbytes), Int32(pred)],
        loc=loc, ip=ip)


# --------------------------------------------------------------------------- shared memory
# Addresses are 32-bit shared-window addresses (``Pointer.toint()`` of a shared-memory pointer).


def smem_allocator():
    """A static shared-memory allocator, called inside a kernel: ``cutlass.memory``'s where the DSL has
    it (``cutlass.utils``' is deprecated there), ``cutlass.utils``' in older releases."""
    memory = getattr(cutlass, "memory", None)
    return (memory if memory is not None and hasattr(memory, "SmemAllocator") else cutlass.utils).SmemAllocator()


def smem_words(smem, n_words: int, byte_alignment: int):
    """The shared address of ``n_words`` 32-bit words from ``smem`` (`smem_allocator`), aligned as asked:
    ``allocate`` in bytes, which every release has (``allocate_array`` takes no alignment before 4.4)."""
    return smem.allocate(4 * n_words, byte_alignment).toint()


_VECTOR = {1: "", 2: ".v2", 4: ".v4"}


def _register_list(kind: str, first: int, n: int) -> str:
    """The operand text of ``n`` registers from placeholder ``first`` on: ``{$w0}``, or ``{{$w0}, {$w1}}``."""
    regs = ", ".join(f"{{${kind}{first + i}}}" for i in range(n))
    return regs if n == 1 else f"{{{regs}}}"


@dsl_user_op
def st_shared(addr, values, *, loc=None, ip=None):
    """Store 1, 2 or 4 32-bit values (``Int32`` or ``Float32``) to shared memory at ``addr`` (aligned to their
    size) with one ``st.shared``."""
    n = len(values)
    inline_ptx(f"st.shared{_VECTOR[n]}.b32 [{{$r0}}], {_register_list('r', 1, n)};",
               read_only_args=[Int32(addr), *values], loc=loc, ip=ip)


@dsl_user_op
def ld_shared(addr, dtype, n: int = 1, *, loc=None, ip=None):
    """Load ``n`` (1, 2 or 4) 32-bit values of ``dtype`` (``Int32`` or ``Float32``) from shared memory at
    ``addr`` (aligned to their size) with one ``ld.shared``: a tuple of them."""
    values = inline_ptx(f"ld.shared{_VECTOR[n]}.b32 {_register_list('w', 0, n)}, [{{$r0}}];",
                        write_only_types=[dtype] * n, read_only_args=[Int32(addr)], loc=loc, ip=ip)
    return values if n > 1 else (values,)


warp_word_offset = fixed_op("{ .reg .b32 w;\n shr.u32 w, {$r0}, 5;\n shl.b32 {$w0}, w, 2; }", [Int32], [Int32])
"""``warp_word_offset(thread)``: 4 * (thread // 32), the byte offset of a warp's 32-bit word, as one opaque op, so
that every release builds the same machine code: CuTe DSL 4.6 folds the plain arithmetic into its use
(``(t >> 3) & 28``), and ptxas then orders the kernel's loads differently."""


# --------------------------------------------------------------------------- conversions


e4m3x2_to_f32 = fixed_op("{ .reg .b32 h2; .reg .f16 lo, hi;\n cvt.rn.f16x2.e4m3x2 h2, {$r0};\n mov.b32 {lo, hi}, h2;\n"
                         " cvt.f32.f16 {$w0}, lo;\n cvt.f32.f16 {$w1}, hi; }", [Float32, Float32])
"""``e4m3x2_to_f32(pair)``: two E4M3 scales (one 16-bit load) -> two fp32, the lower byte's first (sm_89+)."""
half2_to_f32_pair = fixed_op("{ .reg .f16 lo, hi;\n mov.b32 {lo, hi}, {$r0};\n cvt.f32.f16 {$w0}, lo;\n"
                             " cvt.f32.f16 {$w1}, hi; }", [Float32, Float32])
"""``half2_to_f32_pair(h2)``: the two halves of a packed half2 (low half first), as fp32."""
e2m1x8_to_f16x2 = fixed_op("{ .reg .b8 b0, b1, b2, b3;\n mov.b32 {b0, b1, b2, b3}, {$r0};\n"
                           " cvt.rn.f16x2.e2m1x2 {$w0}, b0;\n cvt.rn.f16x2.e2m1x2 {$w1}, b1;\n"
                           " cvt.rn.f16x2.e2m1x2 {$w2}, b2;\n cvt.rn.f16x2.e2m1x2 {$w3}, b3; }", [Int32] * 4)
"""``e2m1x8_to_f16x2(word)``: the 8 E2M1 codes of a 32-bit word -> 4 half2 of their values, one
``cvt.rn.f16x2.e2m1x2`` per byte (sm_100a and newer). Half2 i holds byte i: its low nibble in the low half."""
s32_to_f32 = fixed_op("cvt.rn.f32.s32 {$w0}, {$r0};", [Float32])
"""``s32_to_f32(x)``: ``cvt.rn.f32.s32``, a 32-bit integer as fp32 (exact up to 2^24 in magnitude)."""


# --------------------------------------------------------------------------- integer byte operations


@dsl_user_op
def prmt(a, b, selector: int, *, loc=None, ip=None):
    """``prmt.b32`` with a constant selector: result byte i is byte ``(selector >> 4i) & 7`` of the
    8 bytes b:a (a's are 0-3), or that byte's sign replicated where ``(selector >> 4i) & 8``."""
    return inline_ptx(f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {selector};", write_only_types=[Int32],
                                read_only_args=[a, b], loc=loc, ip=ip)


@dsl_user_op
def prmt_table(table_lo: int, table_hi: int, selectors, *, loc=None, ip=None):
    """``prmt.b32`` as a table lookup: the 8 bytes of two constant words are the table, the low 16
    bits of ``selectors`` pick 4 of them (4 bits each, bit 3 the sign-replicate flag)."""
    return inline_ptx(f"prmt.b32 {{$w0}}, {table_lo}, {table_hi}, {{$r0}};", write_only_types=[Int32],
                                read_only_args=[selectors], loc=loc, ip=ip)


prmt_lookup = fixed_op("prmt.b32 {$w0}, {$r0}, {$r1}, {$r2};", [Int32])
"""``prmt_lookup(table_lo, table_hi, selectors)``: `prmt_table` with the table in registers: ptxas then keeps it
there, where it moves the immediates of `prmt_table` into a register again before most lookups."""
dp4a = fixed_op("dp4a.s32.s32 {$w0}, {$r0}, {$r1}, {$r2};", [Int32])
"""``dp4a(a, b, acc)``: ``dp4a.s32.s32``, acc + the sum of the products of the 4 signed bytes of a and of b."""


# --------------------------------------------------------------------------- cache policies, explicit fp32 FMA
# (the whole-K kernels of `nvfp4lib.cute.whole_k`)


@dsl_user_op
def l2_policy(kind: str, *, loc=None, ip=None):
    """A 64-bit L2 cache policy for the ``.L2::cache_hint`` loads below: ``createpolicy.fractional.L2::<kind>``
    over the whole access (fraction 1.0), e.g. ``kind`` "evict_first" (read once) or "evict_last" (read by every
    block). sm_80+; ptxas folds it into a uniform descriptor, so the loads pay nothing for it. On sm_90 the
    ``.L2::evict_first`` qualifier of ``ld`` itself needs 256-bit loads (sm_100), hence the policy."""
    return inline_ptx(f"createpolicy.fractional.L2::{kind}.b64 {{$w0}}, 1.0;", [Int64], loc=loc, ip=ip)


@dsl_user_op
def ld_global_v4_policy(ptr, policy, pred, hint: str, *, loc=None, ip=None):
    """128-bit load under an L2 cache policy (`l2_policy`): ``ld.global<hint>.L2::cache_hint.v4.u32``, ``hint``
    the qualifiers before it (e.g. ".nc.L1::no_allocate"). ``pred`` None: unpredicated (a K chunk that exists
    for every thread, known when the kernel is compiled); else zeros where ``pred`` is false."""
    return _v4_load(f"ld.global{hint}.L2::cache_hint.v4.u32 {V4_WORDS}, [{{$r0}}], {{$r1}};", [ptr, policy], pred,
                    loc, ip)


fma_rn_f16x2 = fixed_op("fma.rn.f16x2 {$w0}, {$r0}, {$r1}, {$r2};", [Int32], [Int32] * 3)
"""``fma_rn_f16x2(a, b, c)``: a * b + c on two packed halves at once (each operand a 32-bit word). Written out,
since ``cute.arch.fma_packed_f16x2`` is missing from some DSL releases (4.7)."""
fma_rn_f32 = fixed_op("fma.rn.f32 {$w0}, {$r0}, {$r1}, {$r2};", [Float32], [Float32] * 3)
"""``fma_rn_f32(a, b, c)``: a * b + c rounded once, written out so that the order of the accumulation is the
kernel's own and not the compiler's (`nvfp4lib.study.whole_k_model` models it)."""
