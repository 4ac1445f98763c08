"""Check and time the CuTe DSL kernels on this GPU: ``python -m nvfp4lib.bench.cute_bench``.

One run checks every kernel variant against the reference on the test shapes and on extra shapes
(`harness.check_once`: the kernel gets a clone with c poisoned, its output is checked against the
untouched input), then times each variant at the benchmark shapes three ways (`harness.measure`):
kernel time (calls back to back, host cost hidden), leaderboard time (the leaderboard's own method:
its flush enqueued right before each call, the mean until its stopping rule stops) and host-visible
time (each call with the GPU idle: host cost included). In the same run it measures the
streaming-read ceilings of the same byte counts (`ceilings.read_ceilings`: the best of a CuTe
(`ceilings.StreamRead`), a Triton and a PyTorch read), against which each kernel is
judged: "% of best read" is the best read's time as a percentage of the kernel's, per measure.
``--csv`` writes the reads and the kernels in the benchmark CSV's schema (`report.write_csv`).

Kernels are named as everywhere in the package, lowercase words joined by underscores: ``cute_naive``,
``cute_fast`` (the per-K default config, ``--configs default``), ``cute_generic`` (``--configs generic``: the
wide or tiled kernel per K, the rule before the per-K kernel served every K,
`study.generic_kernels.generic_config`), and a fixed config as ``cute_fast[...]`` listing the
`FastConfig` fields that differ from their defaults, e.g. ``cute_fast[rows_per_warp=8,unroll=1]``, or
``cute_tiled[...]`` for the tiled kernel's `TiledConfig` (both in `nvfp4lib.study.generic_kernels`),
``cute_wholek[...]`` for the per-K kernel's `whole_k.WholeKConfig` (`kernel_name`). These names are the
rows' ``path`` in the CSV. A kernel whose config cannot run a shape's K (a per-K block too small for it)
says so ("refused") and is neither checked nor timed there. ``--shapes 128x4608x2,...`` times other shapes
than the benchmark's (the checks always run the test and extra shapes).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from nvfp4lib.bench.ceilings import CeilingIndex, ceiling_table, read_ceilings
from nvfp4lib.bench.harness import check_once, measure, timing_fields
from nvfp4lib.bench.report import context_fields, write_csv
from nvfp4lib.bench.timing import FLUSHES, cell_text
from nvfp4lib.contract import Shape
from nvfp4lib.cute.gemv import CuteGemv
from nvfp4lib.cute.decode import block_dot, decode_b_word, decode_word_bitops
from nvfp4lib.cute.whole_k import WholeKConfig, accumulate_rows
from nvfp4lib.device import capabilities, installed_cute_dsl_version, missing
from nvfp4lib.problem import BENCHMARK_SHAPES, EXTRA_SHAPES, TEST_SHAPES, bytes_moved, generate_input
from nvfp4lib.study.generic_kernels import FastConfig, TiledConfig, generic_config, loads_xor

DEFAULT_CONFIGS = ("default",)  # the per-K choice of nvfp4lib.cute.gemv.default_config


def parse_tiled_config(text: str) -> TiledConfig:
    """'tRxWxN[-loads][-DECODE][-reg][:QUALIFIERS]' -> TiledConfig(rows_per_block=R, warps_per_block=W,
    chunks_per_step=N, ...): the tiled kernel; -reg loads the lookup table into registers."""
    try:
        text, _, a_load = text.partition(":")
        flags = text.split("-")
        rows, warps, chunks = (int(v) for v in flags[0][1:].lower().split("x"))
        decode = [f for f in flags[1:] if f in ("lut", "bitops", "hw")]
        cfg = TiledConfig(rows, warps, chunks, compute="loads" not in flags, decode=decode[-1] if decode else "auto",
                          lut_registers="reg" in flags, **({"a_load": a_load} if a_load else {}))
    except (ValueError, TypeError) as err:
        raise SystemExit(f"--configs: expected tRxWxN such as t32x8x2, got {text!r} ({err})") from None
    return cfg


def parse_config(text: str) -> FastConfig | TiledConfig:
    """'RxWxU[xB][-perm][-loads][-DECODE][-reg][-pfN][:QUALIFIERS]' -> FastConfig(R, W, U, B, ...); a text
    starting with "t" is a tiled config (`parse_tiled_config`).

    -perm reads the permuted scales; -loads times the loads alone (no decode, no math:
    wrong results, not checked); -lut, -bitops or -hw picks the FP4 decode; -reg loads the lookup
    table into registers; -pfN prefetches the A rows N steps ahead into L2;
    :QUALIFIERS sets the PTX qualifiers of the A loads, e.g. ':.nc' or ':.L2::256B'.
    """
    if text.startswith("t"):
        return parse_tiled_config(text)
    if text.startswith("w"):
        return parse_whole_k_config(text)
    try:
        text, _, a_load = text.partition(":")
        flags = text.split("-")
        values = [int(v) for v in flags[0].lower().split("x")]
        decode = [f for f in flags[1:] if f in ("lut", "bitops", "hw")]
        prefetch = [int(f[2:]) for f in flags[1:] if f.startswith("pf")]
        cfg = FastConfig(*values, compute="loads" not in flags, permuted_scales="perm" in flags,
                         decode=decode[-1] if decode else "auto", prefetch=prefetch[-1] if prefetch else 0,
                         lut_registers="reg" in flags,
                         **({"a_load": a_load} if a_load else {}))
    except (ValueError, TypeError) as err:
        raise SystemExit(f"--configs: expected RxWxU[xB] such as 2x4x2x4, got {text!r} ({err})") from None
    return cfg


RULES = {"default": None, "generic": generic_config}
"""The --configs that pick a config per K: the package's default (`cute.gemv.default_config`), and the
generic kernels' rule of before."""


def kernel_name(variant: str, cfg=None) -> str:
    """The kernel's name: "cute_naive"; "cute_fast" for the per-K default config (``cfg=None``), "cute_generic"
    for `generic_config`; else "cute_fast[...]" (a `FastConfig`) or "cute_tiled[...]" (a `TiledConfig`) with the
    fields of ``cfg`` that differ from its class's defaults, in the order of its fields ("cute_fast[]":
    FastConfig() itself)."""
    if variant == "naive":
        return "cute_naive"
    if cfg is None or cfg is generic_config:
        return "cute_fast" if cfg is None else "cute_generic"
    changed = [f"{field.name}={getattr(cfg, field.name)}" for field in dataclasses.fields(cfg)
               if getattr(cfg, field.name) != field.default]
    if isinstance(cfg, WholeKLoadsOnly):
        changed.append("compute=False")
    kind = "tiled" if isinstance(cfg, TiledConfig) else "wholek" if isinstance(cfg, WholeKConfig) else "fast"
    return f"cute_{kind}[{','.join(changed)}]"


def variants(configs):
    """(kernel_name, CuteGemv) of the naive kernel and of the fast kernel with each of ``configs``
    (texts for `parse_config`, or a name of `RULES`)."""
    yield kernel_name("naive"), CuteGemv("naive")
    for text in configs:
        cfg = RULES[text] if text in RULES else parse_config(text)
        yield kernel_name("fast", cfg), CuteGemv("fast", cfg)


def computes(kernel, shape) -> bool:
    """Whether ``kernel`` computes at this shape (a loads-only config does not: its results are wrong)."""
    return kernel.config_for(shape.k).compute


def shape_set(shape) -> str:
    """The CSV's shape_set of a timed shape: "benchmark", or "sweep" for another (--shapes)."""
    return "benchmark" if shape in BENCHMARK_SHAPES else "sweep"


def parse_shapes(text: str) -> list[Shape]:
    """'MxKxL,MxKxL,...' -> the shapes to time (--shapes)."""
    try:
        return [Shape(*(int(v) for v in item.lower().split("x"))) for item in text.split(",")]
    except (ValueError, TypeError) as err:
        raise SystemExit(f"--shapes: expected MxKxL[,MxKxL...] such as 4096x4608x2, got {text!r} ({err})") from None


def check_all(kernels, shapes, seed: int, device: str = "cuda") -> bool:
    """Check every computing kernel on full-range data at every shape (a line per check); True if all pass."""
    ok_all = True
    for shape in shapes:
        data = generate_input(*shape, seed=seed, mode="full", device=device)
        for name, kernel in kernels:
            refused = refusal(kernel, data)
            if not refused and not computes(kernel, shape):
                continue
            if refused:
                print(f"check {name} {shape.m}x{shape.k}x{shape.l}: refused ({refused})", flush=True)
                continue
            result = check_once(kernel, data)
            ok_all &= result.ok
            status = "ok" if result.ok else "FAIL " + result.message
            print(f"check {name} {shape.m}x{shape.k}x{shape.l}: {status}", flush=True)
    return ok_all


# The per-K kernel's forms that only a benchmark runs: the core's kernel with other A-load qualifiers or another
# `sum_rows`.


def carveout_problem() -> str | None:
    """Why the installed CuTe DSL cannot launch a kernel with a preferred shared-memory carveout, or None."""
    import cutlass
    from cutlass.base_dsl.dsl import BaseDSL

    if "preferred_smem_carveout" in {field.name for field in dataclasses.fields(BaseDSL.LaunchConfig)}:
        return None
    return (f"needs the launch option preferred_smem_carveout (CuTe DSL 4.6 or newer), which CuTe DSL "
            f"{installed_cute_dsl_version(cutlass)} does not have")


@dataclasses.dataclass(frozen=True)
class WholeKQualified(WholeKConfig):
    """The per-K kernel with other PTX qualifiers for its A loads (``:QUALIFIERS``, before their L2 evict_first
    policy), e.g. '.L1::evict_first' (the best read's) for the core's '.nc.L1::no_allocate'; or launched with a
    preferred shared-memory carveout (``-cN``: N % of the SM's 228 KB for shared memory, the rest L1; ``-cd``: -1,
    the driver's default), a host setting that is in neither the PTX nor the cubin. Without a carveout the DSL
    chooses one for a kernel with more than one resident block (`WholeKConfig.min_blocks_per_sm`), the driver for
    the others."""

    a_load: str = WholeKConfig.a_load
    smem_carveout: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.a_load, str) or not re.fullmatch(r"(\.[A-Za-z0-9_]+(::[A-Za-z0-9_]+)?)*", self.a_load):
            raise ValueError(f"a_load: expected PTX qualifiers such as '.L1::evict_first', got {self.a_load!r}")
        if self.smem_carveout is not None and (type(self.smem_carveout) is not int or
                                               not -1 <= self.smem_carveout <= 100):
            raise ValueError(f"smem_carveout: expected -1 (the driver's default) or a percentage 0 to 100, got "
                             f"{self.smem_carveout!r}")

    def compile(self, arch, k, options="", tvm_ffi=None):
        """The core's compile (`WholeKConfig.compile`), launched with this form's carveout if it has one."""
        if self.smem_carveout is None:
            return super().compile(arch, k, options, tvm_ffi)
        problem = carveout_problem()
        if problem:
            raise RuntimeError(f"smem_carveout: {problem}")
        return super().compile(arch, k, options, tvm_ffi, preferred_smem_carveout=self.smem_carveout)


class WholeKLoadsOnly(WholeKQualified):
    """The per-K kernel's loads alone (``-loads``): every loaded word XORed into each row's sum (`loads_xor`),
    no decode and no math, a wrong result that times the access pattern."""

    compute = False

    def sum_rows(self, acc, plan, decode: str, loaded, zero) -> None:
        b_words, sfb_pairs, a_words, sfa_pairs = loaded
        touched = loads_xor(b_words + a_words + [sfb_pairs + sfa_pairs])
        for q in range(plan.rows_per_thread):
            acc[q] = acc[q] + touched


class WholeKBitTrick(WholeKQualified):
    """The per-K kernel with the bit-trick decode (``-bitops``: A as value * 2^-14, B true fp16, packed fp16 block
    sums), for the comparison with the lookup in docs/cute_kernel_notes.md; otherwise `accumulate_rows`'s order."""

    DECODES = ("bitops",)

    def sum_rows(self, acc, plan, decode: str, loaded, zero) -> None:
        accumulate_rows(acc, plan, decode, loaded, zero, _bit_trick_b_chunk, _bit_trick_dots)


def _bit_trick_b_chunk(words, decode: str, lookup) -> list:
    """A chunk of B as true fp16 halves, 8 per word (`decode.decode_b_word`)."""
    return [x for w in words for x in decode_b_word(w, False)]


def _bit_trick_dots(a_words, b_dec, decode: str, lookup):
    """The chunk's two block sums with A decoded by the bit trick (`decode.decode_word_bitops`)."""
    return (block_dot(a_words[0:2], b_dec[0:8], decode_word_bitops),
            block_dot(a_words[2:4], b_dec[8:16], decode_word_bitops))


def parse_whole_k_config(text: str) -> WholeKConfig:
    """'wCxQxS[-loads][-DECODE][-mN][-hints][-cN][-sN][:QUALIFIERS]' -> WholeKConfig(chunks_per_thread=C,
    rows_per_thread=Q, row_slots=S, ...): the per-K kernel (`nvfp4lib.cute.whole_k`), e.g. w2x4x1; -loads times its
    loads alone (`WholeKLoadsOnly`), -mN asks for N of its blocks resident per SM (`WholeKConfig.min_blocks_per_sm`),
    -sN allows at most N (`WholeKConfig.max_blocks_per_sm`), -hints loads the scales under their operand's L2 policy
    (`WholeKConfig.scale_hints`), -cN (or -cd) launches it with a shared-memory carveout and :QUALIFIERS sets the PTX
    qualifiers of the A loads (both `WholeKQualified`), e.g. ':.L1::evict_first'."""
    try:
        spec, _, a_load = text.partition(":")
        flags = spec.split("-")
        chunks, rows, slots = (int(v) for v in flags[0][1:].lower().split("x"))
        decode = [f for f in flags[1:] if f in ("lut", "bitops", "hw")]
        blocks = [int(f[1:]) for f in flags[1:] if f.startswith("m") and f[1:].isdigit()]
        carveouts = [-1 if f == "cd" else int(f[1:]) for f in flags[1:] if f == "cd" or re.fullmatch(r"c\d+", f)]
        capped = [int(f[1:]) for f in flags[1:] if re.fullmatch(r"s\d+", f)]
        unknown = [f for f in flags[1:] if f not in ("loads", "lut", "bitops", "hw", "hints", "cd")
                   and not re.fullmatch(r"[mcs]\d+", f)]
        if unknown:
            raise ValueError(f"unknown flag -{unknown[0]}: expected -loads, -lut, -bitops, -hw, -mN, -hints, -cN, "
                             "-cd or -sN")
        qualified = {"a_load": a_load} if a_load else {}
        qualified |= {"smem_carveout": carveouts[-1]} if carveouts else {}
        kind = (WholeKLoadsOnly if "loads" in flags else WholeKBitTrick if "bitops" in decode
                else WholeKQualified if qualified else WholeKConfig)
        return kind(chunks, rows, slots, decode=decode[-1] if decode else "auto",
                    min_blocks_per_sm=blocks[-1] if blocks else 0, scale_hints="hints" in flags,
                    max_blocks_per_sm=capped[-1] if capped else 0, **qualified)
    except (ValueError, TypeError) as err:
        raise SystemExit(f"--configs: expected wCxQxS such as w2x4x1, got {text!r} ({err})") from None


def refusal(kernel, data) -> str | None:
    """Why ``kernel`` refuses this input (a config that cannot run its K: `refusal` of the config), or None."""
    return kernel.refusal(2 * data[0].shape[1])


def time_all(kernels, shapes, *, reps: int = 100, flush: str = "dirty", reads: list[dict] | None = None,
             device: str = "cuda") -> list[dict]:
    """Time every kernel at every shape -> rows in the benchmark CSV's schema (path: the kernel's name).

    Each row has kernel, leaderboard and host-visible time (`harness.timing_fields`) and
    kernel_pct_of_read / leaderboard_pct_of_read against the best streaming read of the same
    bytes after the same flush. `reads` are `ceilings.read_ceilings` rows of these shapes; None
    measures them here (they are not part of the returned rows). `flush` (`timing.FLUSHES`) "dirty"
    times as the leaderboard does (leaderboard time with its own flush); "clean" flushes without
    dirty lines. `device` other than "cuda" is for testing the logic (wall clock)."""
    if flush not in FLUSHES:
        raise ValueError(f"flush: expected one of {FLUSHES}, got {flush!r}")
    if reads is None:
        reads = read_ceilings([(shape_set(s), s) for s in shapes], clean=flush == "clean", large=False,
                              reps=reps, device=device, log=print)
    rows, ceilings = [], CeilingIndex(reads)
    for shape in shapes:
        data = generate_input(*shape, seed=1, mode="full", device=device)
        nbytes = bytes_moved(shape)
        for name, kernel in kernels:
            refused = refusal(kernel, data)
            if refused:
                print(f"time  {name} {shape.m}x{shape.k}x{shape.l}: refused ({refused}), not timed", flush=True)
                continue
            kernel(data)  # compiles on first use, outside the timings
            n = reps if name != kernel_name("naive") else max(3, reps // 20)
            timings = measure(lambda: kernel(data), reps=n, warmup=min(10, n), flush=flush)  # noqa: B023
            note = f"flush {flush}" + ("" if computes(kernel, shape) else "; loads only: not checked")
            row = dict(path=name, kind="nvfp4lib", label=name, shape_set=shape_set(shape), m=shape.m, k=shape.k,
                       l=shape.l, bytes=nbytes, status="ok", note=note, flush=flush, **timing_fields(timings, nbytes))
            row.update(ceilings.percent_of_read(row, flush))
            rows.append(row)
            print(time_line(name, shape, row), flush=True)
    return rows


def time_line(name: str, shape: Shape, row: dict) -> str:
    """The line `time_all` prints for one kernel at one shape, which results logs keep (`read_time_lines`)."""
    return (f"time  {name} {shape.m}x{shape.k}x{shape.l}: kernel {row['kernel_us']:.2f} us "
            f"({cell_text(row.get('kernel_pct_of_read'), '.1f')} % of the best read), leaderboard "
            f"{row['leaderboard_us']:.2f} +- {row['leaderboard_err_us']:.2f} us "
            f"({cell_text(row.get('leaderboard_pct_of_read'), '.1f')} %), host-visible "
            f"{row['host_visible_us']:.2f} us (host {cell_text(row['host_us'], '.1f')} us)")


_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_TIME_LINE = re.compile(
    rf"time\s+(?P<path>\S+) (?P<m>\d+)x(?P<k>\d+)x(?P<l>\d+): kernel (?P<kernel_us>{_NUMBER}) us "
    rf"\((?P<kernel_pct_of_read>{_NUMBER}|-) % of the best read\), leaderboard (?P<leaderboard_us>{_NUMBER}) "
    rf"\+- (?P<leaderboard_err_us>{_NUMBER}) us \((?P<leaderboard_pct_of_read>{_NUMBER}|-) %\), "
    rf"host-visible (?P<host_visible_us>{_NUMBER}) us \(host (?P<host_us>{_NUMBER}|-) us\)")


def read_time_lines(text: str) -> dict[tuple[str, Shape], dict]:
    """{(kernel name, shape): row} from the `time_line`s in a run's printed output (a results log): the
    times and shares of the best read as printed (2 and 1 decimals), None where a share was not measured."""
    found = {}
    for line in text.splitlines():
        m = _TIME_LINE.fullmatch(line.strip())
        if m:
            shape = Shape(int(m["m"]), int(m["k"]), int(m["l"]))
            values = {key: None if value == "-" else float(value) for key, value in m.groupdict().items()
                      if key not in ("path", "m", "k", "l")}
            found[m["path"], shape] = dict(path=m["path"], m=shape.m, k=shape.k, l=shape.l, **values)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4lib.bench.cute_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                        help="fast-kernel configs RxWxU..., tiled ones tRxWxN..., per-K ones wCxQxS..., or "
                             f"{' or '.join(map(repr, RULES))} (a config per K)")
    parser.add_argument("--shapes", type=parse_shapes, default=BENCHMARK_SHAPES,
                        help="MxKxL[,MxKxL...]: the shapes to time (default: the benchmark shapes)")
    parser.add_argument("--reps", type=int, default=200, help="timed calls of kernel and host-visible time")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--flush", nargs="+", default=["dirty"], choices=FLUSHES,
                        help="L2 flush before each timed call: 'dirty' as the leaderboard (leaves dirty "
                             "lines whose write-back competes with the kernel), 'clean' (no write-back)")
    parser.add_argument("--csv", help="write the reads and the timings here (the benchmark CSV's columns)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps: expected an integer >= 1, got {args.reps}")

    caps = capabilities()
    print(caps.summary())
    why_not = missing(caps, "cuda", "cute_dsl")
    if why_not is not None:
        print(f"{why_not}; nothing to time here")
        return 0
    kernels = list(variants(args.configs))
    ok = args.no_check or check_all(kernels, TEST_SHAPES + EXTRA_SHAPES, seed=0)
    reads = read_ceilings([(shape_set(s), s) for s in args.shapes], clean="clean" in args.flush,
                          reps=args.reps, log=print)
    print(ceiling_table(reads))
    rows = [row for flush in args.flush for row in time_all(kernels, args.shapes, reps=args.reps, flush=flush,
                                                            reads=reads)]
    if args.csv:
        context = context_fields(caps, quick=False)
        write_csv([dict(context, **row) for row in reads + rows], args.csv)
        print(f"wrote {args.csv}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
