"""Streaming-read ceilings: the fastest that any kernel which must read a shape's bytes can be,
under the same flush and timing as the GEMV, measured in the same run.

A ceiling is the best of several independent reads of a buffer of exactly the shape's byte count
(`problem.bytes_moved`, rounded up to whole 64-byte groups), never one implementation's:

* "cute": `StreamRead` (a CuTe DSL kernel), 16-byte loads, 4 independent ones per thread, in address order;
* "triton": a Triton kernel with 16-byte loads, the best of `TRITON_LAUNCH_SHAPES` for each buffer;
* "torch": PyTorch's own reduction, `torch.amax` over an int32 view of the buffer (no copy);
* "triton-xor-<hint>": `TritonRead(hint)`, the fastest independent read's form (int32 XOR, one 4-8 KB block
  per program, the best of `TRITON_SMALL_LAUNCH_SHAPES`), with no hint, ``evict_first`` or ``.cg``.

Each read is timed with kernel time and leaderboard time (nvfp4lib.bench.harness.measure; leaderboard time
as its mean, the leaderboard's figure, and its median). Besides the
reads after the flush the GEMV is timed with (path "read-<name>": the L2 left full of dirty lines,
whose write-back competes with the read), `read_ceilings` times the same reads after a flush whose
dirty lines were written back first ("read-<name>-clean", `timing.flush_l2` mode "clean") and over
2 GiB (shape_set "ceiling"), so that the floor can be taken apart: the fixed cost of a call (launch,
first-load latency, tail), the write-back of the flush's dirty lines, and bytes over bandwidth.
"""

import functools
from typing import Callable, Iterable, NamedTuple

import torch

from nvfp4lib.bench import triton_gemv
from nvfp4lib.bench.harness import measure, timing_fields
from nvfp4lib.bench.timing import (BENCHMARK_RULE, CPU_BANDWIDTH_BYTES, FLUSHES, GPU_BANDWIDTH_BYTES, StoppingRule,
                                   gbps, percent, text_table, time_column, time_kernel)
from nvfp4lib.contract import Shape
from nvfp4lib.device import NO_CUDA, capabilities, missing, tvm_ffi_problem
from nvfp4lib.messages import describe_error
from nvfp4lib.problem import bytes_moved

READ_GROUP_BYTES = 64  # buffers are whole groups of 16 int32 words: every read sees the same bytes
TRITON_LAUNCH_SHAPES = tuple((block, warps) for block in (2048, 4096, 8192, 16384) for warps in (4, 8, 16))
"""(int32 words per program, warps per program) tried for the Triton read "triton" of each buffer."""
TRITON_SMALL_LAUNCH_SHAPES = tuple((block, warps) for block in (1024, 2048) for warps in (1, 2, 4, 8))
"""(int32 words per program, warps per program): one 4 KB or 8 KB block per program, 1 to 16 loads of
16 bytes per thread, tried for each XOR read ("triton-xor-<hint>")."""
TRITON_HINTS = {"plain": ("", ""), "evict-first": ("evict_first", ""), "cg": ("", ".cg")}
"""A hint's name -> (tl.load eviction_policy, cache_modifier). "evict-first" compiles to
``ld.global.L1::evict_first.L2::cache_hint`` under an L2 evict_first policy; "cg" to ``ld.global.cg``
(cached in L2 only). ptxas refuses .cg together with evict_first."""
FASTEST_NOTE = "fastest read here"
READ_MEASURES = ("kernel", "leaderboard")  # the measures every read is timed by


def read_buffer(nbytes: int, device) -> torch.Tensor:
    """Random bytes (never all zero), `nbytes` rounded up to whole READ_GROUP_BYTES groups."""
    if nbytes < 1:
        raise ValueError(f"nbytes: expected a positive byte count, got {nbytes}")
    size = -(-nbytes // READ_GROUP_BYTES) * READ_GROUP_BYTES
    return torch.randint(0, 256, (size,), dtype=torch.uint8, device=device)


# ---------------------------------------------------------------------------------------------
# The reads: each says why it cannot run here, or binds to a buffer


def _needs_cuda(device: torch.device) -> str | None:
    """The reads of a GPU's memory need the buffer there."""
    return None if device.type == "cuda" else NO_CUDA


class BoundRead(NamedTuple):
    call: Callable[[], object]  # reads the whole buffer once
    note: str                   # how (e.g. the launch shape chosen)
    sink: torch.Tensor          # where the read stores what it found: a result that keeps the loads alive


class TorchRead:
    name, label = "torch", "streaming read: torch.amax over int32"

    def why_not(self, device: torch.device) -> str | None:
        return None

    def bind(self, buf: torch.Tensor, tune_reps: int) -> BoundRead:
        words = buf.view(torch.int32)
        sink = torch.empty((), dtype=torch.int32, device=buf.device)
        return BoundRead(lambda: torch.amax(words, 0, out=sink), "torch.amax of an int32 view", sink)


@functools.cache
def _triton_read_kernel():
    """The Triton read, compiled on first launch: a program folds BLOCK int32 words (16-byte loads: the
    buffer and the word count are multiples of 16 bytes and 16 words; eviction policy EVICT and cache
    modifier CACHE, a hint of `TRITON_HINTS`) by a sum, or by an XOR with XOR set, and stores the result
    only if it equals a value no buffer of ours gives, so the loads cannot be removed."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_words(src, n_words, sink, BLOCK: tl.constexpr, XOR: tl.constexpr, EVICT: tl.constexpr,
                   CACHE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        words = tl.load(src + offsets, mask=offsets < n_words, other=0, cache_modifier=CACHE, eviction_policy=EVICT)
        if XOR:
            total = tl.xor_sum(words, axis=0)
        else:
            total = tl.sum(words, axis=0)
        if total == 0x5EEDF00D:  # the magic word: no buffer of ours folds to it
            tl.store(sink, total)

    return triton, read_words


class TritonRead:
    """A Triton read, the best of its launch shapes per buffer. Without a hint, "triton": a sum over
    2048-16384 words (8-64 KB) per program (`TRITON_LAUNCH_SHAPES`), no cache hint. With a hint of
    `TRITON_HINTS`, "triton-xor-<hint>": the fastest independent read's form, an int32 XOR over one 4-8 KB
    block per program (`TRITON_SMALL_LAUNCH_SHAPES`) under that hint; these isolate what the launch
    shapes and the hints are worth (docs/cute_kernel_notes.md, "The ceiling")."""

    def __init__(self, hint: str | None = None):
        if hint is not None and hint not in TRITON_HINTS:
            raise ValueError(f"hint: expected None or one of {tuple(TRITON_HINTS)}, got {hint!r}")
        self.hint, xor = hint, hint is not None
        self.name = f"triton-xor-{hint}" if xor else "triton"
        self.label = "streaming read: Triton, 16-byte loads" + (
            f", int32 XOR, 4-8 KB per program, {hint}" if xor else "")
        self.launch_shapes = TRITON_SMALL_LAUNCH_SHAPES if xor else TRITON_LAUNCH_SHAPES

    def why_not(self, device: torch.device) -> str | None:
        return _needs_cuda(device) or triton_gemv.why_unavailable()

    def launch(self, buf: torch.Tensor, block: int, warps: int) -> BoundRead:
        """The read of `buf` with one launch shape."""
        triton, kernel = _triton_read_kernel()
        xor, (evict, cache) = self.hint is not None, TRITON_HINTS[self.hint or "plain"]
        words = buf.view(torch.int32)
        sink = torch.zeros(1, dtype=torch.int32, device=buf.device)
        grid = (triton.cdiv(words.numel(), block),)
        return BoundRead(lambda: kernel[grid](words, words.numel(), sink, BLOCK=block, XOR=xor, EVICT=evict,
                                              CACHE=cache, num_warps=warps),
                         f"BLOCK={block} words, num_warps={warps}" + (f", {self.hint}" if xor else ""), sink)

    def bind(self, buf: torch.Tensor, tune_reps: int) -> BoundRead:
        """The launch shape with the best kernel time on this buffer."""
        timed = {}
        for block, warps in self.launch_shapes:
            bound = self.launch(buf, block, warps)
            timed[block, warps] = (time_kernel(bound.call, warmup=2, reps=tune_reps).median_us, bound)
        _, best = min(timed.values(), key=lambda item: item[0])
        return best._replace(note=f"{best.note} (best of {len(timed)} launch shapes)")


TRITON_XOR_READS = tuple(TritonRead(hint) for hint in TRITON_HINTS)


def compile_stream_read(arch: str | None = None, options: str = "", tvm_ffi: bool | None = None):
    """The CuTe DSL kernel of `StreamRead`, compiled (`cute.launch.compile_launch`) for TVM-FFI calls where
    apache-tvm-ffi is installed (or as `tvm_ffi` says), else for the DSL's plain call path (src pointer,
    16-byte vector count, sink pointer, stream). `arch` None compiles for this GPU;
    e.g. "sm_100a" cross-compiles without one. `options` are extra CuTe DSL compile options (e.g.
    --keep-ptx --dump-dir DIR). (This module has no `from __future__ import annotations`: the DSL
    reads the kernels' annotations, which name the locally imported `cutlass` and `cute`.)"""
    from nvfp4lib.cute.launch import compile_launch
    from nvfp4lib.cute.ptx import cute, cutlass, ld_global_v4_if

    threads, loads = StreamRead.THREADS, StreamRead.LOADS

    @cute.kernel
    def kernel(src: cute.Tensor, n_vec: cutlass.Int32, sink: cute.Tensor):
        total = cute.arch.grid_dim()[0] * threads
        first = cute.arch.block_idx()[0] * threads + cute.arch.thread_idx()[0]
        x = cutlass.Int32(0)
        for u in cutlass.range_constexpr(loads):
            i = first + u * total
            for w in ld_global_v4_if(src.iterator + cutlass.Int64(i) * 16, i < n_vec, ".nc.L1::no_allocate"):
                x = x ^ w
        if x == cutlass.Int32(0x5EEDF00D):
            sink[0] = x

    @cute.jit
    def launch(src_ptr: cutlass.Int64, n_vec: cutlass.Int32, sink_ptr: cutlass.Int64, stream):
        src = cute.make_tensor(cute.make_ptr(cutlass.Uint8, src_ptr, cute.AddressSpace.gmem, assumed_align=16),
                               cute.make_layout(n_vec * 16))
        sink = cute.make_tensor(cute.make_ptr(cutlass.Int32, sink_ptr, cute.AddressSpace.gmem, assumed_align=4),
                                cute.make_layout(1))
        blocks = (n_vec + threads * loads - 1) // (threads * loads)
        kernel(src, n_vec, sink).launch(grid=[blocks, 1, 1], block=[threads, 1, 1], stream=stream)

    return compile_launch(launch, [cutlass.Int64(0), cutlass.Int32(1), cutlass.Int64(0)], arch, options, tvm_ffi)


class StreamRead:
    """A loads-only kernel that reads a buffer once in address order, 16 bytes per load.

    Every thread issues 4 independent 128-bit loads, thread t reading vectors t, t + T,
    t + 2T, t + 3T (T threads in all), so the whole GPU sweeps one compact window of
    memory, the access pattern DRAM serves best. It XORs what it read and writes it only
    if it equals a value no buffer of ours produces, so the loads cannot be removed.
    """

    THREADS, LOADS = 256, 4

    def __init__(self):
        tvm_ffi = tvm_ffi_problem() is None
        self.fn = compile_stream_read(tvm_ffi=tvm_ffi)
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")
        self._stream = torch._C._cuda_getCurrentRawStream  # the raw handle of a device's current stream
        if tvm_ffi:  # plain integers and the stream's handle
            self._arguments = lambda src, n_vec, sink, stream: (src, n_vec, sink, stream)
        else:  # the plain call path's Int64/Int32 values and the driver's CUstream (as `cute.gemv` passes them)
            from cuda.bindings.driver import CUstream
            from nvfp4lib.cute.ptx import Int32, Int64
            self._arguments = lambda src, n_vec, sink, stream: (Int64(src), Int32(n_vec), Int64(sink), CUstream(stream))

    def __call__(self, buf: torch.Tensor) -> None:
        """Read `buf` (uint8, a whole number of 16-byte vectors, e.g. `read_buffer`) once."""
        stream = self._stream(buf.device.index)
        self.fn(*self._arguments(buf.data_ptr(), buf.numel() // 16, self.sink.data_ptr(), stream))


@functools.cache
def stream_reader() -> StreamRead:
    """One compiled StreamRead per process."""
    return StreamRead()


class CuteRead:
    name, label = "cute", "streaming read: CuTe StreamRead, 16-byte loads"

    def why_not(self, device: torch.device) -> str | None:
        return _needs_cuda(device) or missing(capabilities(), "cute_dsl")

    def bind(self, buf: torch.Tensor, tune_reps: int) -> BoundRead:
        reader = stream_reader()
        return BoundRead(lambda: reader(buf), f"{reader.THREADS} threads x {reader.LOADS} loads of 16 bytes",
                         reader.sink)


READS = (CuteRead(), TritonRead(), TorchRead(), *TRITON_XOR_READS)


# ---------------------------------------------------------------------------------------------
# Measuring


def _row(read, shape_set: str, shape: Shape | None, nbytes: int, flush: str, **fields) -> dict:
    path = f"read-{read.name}" + ("-clean" if flush == "clean" else "")
    label = read.label + (", after a clean flush" if flush == "clean" else "")
    m, k, l = shape if shape is not None else (None, None, None)
    return dict(path=path, kind="ceiling", label=label, shape_set=shape_set, m=m, k=k, l=l, bytes=nbytes,
                flush=flush, **fields)


def _mark_fastest(rows: list[dict]) -> None:
    """Append FASTEST_NOTE to the note of the fastest read (leaderboard time) of each size and flush."""
    groups: dict = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["shape_set"], r["m"], r["k"], r["l"], r["bytes"], r["flush"]), []).append(r)
    for group in groups.values():
        best = min(group, key=lambda r: r["leaderboard_us"])
        best["note"] = "; ".join(filter(None, [best["note"], FASTEST_NOTE]))


def read_ceilings(tasks: Iterable[tuple[str, Shape]], *, clean: bool = True, large: bool = True,
                  rule: StoppingRule = BENCHMARK_RULE, warmup: int = 10, reps: int = 100, tune_reps: int = 20,
                  device=None, reads=None, log: Callable[[str], None] | None = None) -> list[dict]:
    """Time every read that can run here on the byte count of each (shape_set, shape) task ->
    rows in the schema of the benchmark CSV (nvfp4lib.bench.report.COLUMNS), kind "ceiling".

    Per task and read: kernel and leaderboard time (`timing_fields`) after the GEMV's flush
    (path "read-<name>"), and with `clean` for the "benchmark" tasks also after a clean flush
    ("read-<name>-clean"); with `large` the same reads of 2 GiB (16 MiB without CUDA) with
    shape_set "ceiling" and no shape. A read that cannot run here gives one "skipped" row saying
    why; one that fails to build or run gives "skipped" rows too, noted "failed here: <the error>"
    (a ceiling that cannot be measured is no failure of the paths it bounds). The fastest read of
    each size and flush by leaderboard time has FASTEST_NOTE in its note. `reads` None: every read of
    `READS`."""
    reads = READS if reads is None else reads
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    say = log or (lambda line: None)
    usable, rows = [], []
    for read in reads:
        why = read.why_not(dev)
        if why is None:
            usable.append(read)
        else:
            rows.append(dict(path=f"read-{read.name}", kind="ceiling", label=read.label, shape_set="ceiling",
                             status="skipped", note=why))
            say(f"read {read.name}: skipped, {why}")
    sizes = [(shape_set, shape, bytes_moved(shape)) for shape_set, shape in tasks]
    if large:
        sizes.append(("ceiling", None, GPU_BANDWIDTH_BYTES if dev.type == "cuda" else CPU_BANDWIDTH_BYTES))
    for shape_set, shape, nbytes in sizes:
        buf = read_buffer(nbytes, dev)
        flushes = ["dirty"] + (["clean"] if clean and shape_set == "benchmark" else [])
        measured = []
        for read in usable:
            try:
                call, note, _ = read.bind(buf, tune_reps)
                call()
            except Exception as err:  # noqa: BLE001 - a read that fails is reported, the others go on
                measured += [_row(read, shape_set, shape, nbytes, flush, status="skipped",
                                  note=f"failed here: {describe_error(err, 160)}") for flush in flushes]
                continue
            for flush in flushes:
                timings = measure(call, READ_MEASURES, rule=rule, warmup=warmup, reps=reps, flush=flush)
                measured.append(_row(read, shape_set, shape, nbytes, flush, status="ok", note=note,
                                     **timing_fields(timings, nbytes)))
        del buf
        where = "x".join(map(str, shape)) if shape is not None else f"{nbytes / 2**20:g} MiB"
        say(f"read {where} ({nbytes / 1e6:.1f} MB), leaderboard time: " + ", ".join(
            f"{r['path']} {r['leaderboard_us']:.2f} us" if r["status"] == "ok" else f"{r['path']} {r['note']}"
            for r in measured))
        rows += measured
    _mark_fastest([r for r in rows if r["status"] != "skipped"])
    return rows


def read_rows(rows: Iterable[dict]) -> list[dict]:
    """The streaming reads (`read_ceilings` rows, or a benchmark CSV's) in `rows` that ran."""
    return [r for r in rows if r.get("kind") == "ceiling" and (r.get("path") or "").startswith("read-")
            and r.get("status") == "ok"]


def bandwidth_ceiling(rows: Iterable[dict], name: str) -> float | None:
    """The GB/s of the suite's 2 GiB ceiling row `name` ("copy" or "reduction") in `rows`; None without it."""
    return next((r["kernel_gbps"] for r in rows if r.get("path") == name and r.get("kind") == "ceiling"), None)


class CeilingIndex:
    """The ceilings in some rows (`read_ceilings`', a benchmark CSV's), found in one pass over them: the best
    read of each shape after each flush by each of `READ_MEASURES`, and the copy bandwidth (the ceiling
    of results without reads). A table holds every row against the same ceilings: it indexes them once."""

    def __init__(self, rows: Iterable[dict]):
        rows = list(rows)
        self.copy_gbps = bandwidth_ceiling(rows, "copy")
        self.has_reads = False
        self._best: dict[tuple[str, str], dict[Shape, dict]] = {(f, m): {} for f in FLUSHES for m in READ_MEASURES}
        for r in read_rows(rows):
            self.has_reads = True
            if r.get("m") is None:  # the large buffer: no shape's ceiling
                continue
            shape = Shape(r["m"], r["k"], r["l"])
            for name in READ_MEASURES:
                key, best = time_column(name), self._best["clean" if r["path"].endswith("-clean") else "dirty", name]
                if r.get(key) is not None and (shape not in best or r[key] < best[shape][key]):
                    best[shape] = r

    def best_reads(self, flush: str = "dirty", measure_name: str = "leaderboard") -> dict[Shape, dict]:
        """{shape: the read row with the lowest <measure_name>_us at that shape and flush}: its ceiling."""
        if (flush, measure_name) not in self._best:
            raise ValueError(f"flush, measure_name: expected one of {FLUSHES} and one of {READ_MEASURES}, "
                             f"got {flush!r}, {measure_name!r}")
        return dict(self._best[flush, measure_name])

    def percent_of_read(self, row: dict, flush: str = "dirty") -> dict:
        """{"kernel_pct_of_read", "leaderboard_pct_of_read"}: the best read of the row's shape after
        `flush`, by each measure, as a percentage of the row's time by that measure (100 % = as fast as
        reading its bytes can be). Measures without a read or a time are left out."""
        shape = Shape(row["m"], row["k"], row["l"])
        fields = {}
        for name in READ_MEASURES:
            best, us = self.best_reads(flush, name).get(shape), row.get(time_column(name))
            if best is not None and us:
                fields[time_column(name, "pct_of_read")] = 100.0 * best[time_column(name)] / us
        return fields

    def percent_of_ceiling(self, row: dict) -> float | None:
        """A row's kernel time against its ceiling: with reads, `percent_of_read` after the row's flush;
        without, the row's bandwidth as a percentage of the copy's. None where neither exists."""
        if self.has_reads:
            return self.percent_of_read(row, row.get("flush") or "dirty").get("kernel_pct_of_read")
        if self.copy_gbps and row.get("kernel_us"):
            return percent(gbps(row["bytes"], row["kernel_us"]), self.copy_gbps)
        return None


def ceiling_index(rows: Iterable[dict] | CeilingIndex) -> CeilingIndex:
    """`rows` as a `CeilingIndex` (an index as it is): what the functions below take either of."""
    return rows if isinstance(rows, CeilingIndex) else CeilingIndex(rows)


def best_reads(rows: Iterable[dict] | CeilingIndex, flush: str = "dirty",
               measure_name: str = "leaderboard") -> dict[Shape, dict]:
    """`CeilingIndex.best_reads` of `rows` (or of their index)."""
    return ceiling_index(rows).best_reads(flush, measure_name)


def percent_of_read(row: dict, reads: Iterable[dict] | CeilingIndex, flush: str = "dirty") -> dict:
    """`CeilingIndex.percent_of_read` of `reads` (pass their index when calling this for many rows)."""
    return ceiling_index(reads).percent_of_read(row, flush)


def large_read(rows: Iterable[dict]) -> dict | None:
    """The fastest read (kernel time) of the large buffer (shape_set "ceiling", no shape) in `rows`."""
    large = [r for r in read_rows(rows) if r.get("m") is None and r.get("shape_set") == "ceiling"]
    return min(large, key=lambda r: r["kernel_us"], default=None)


class Floor(NamedTuple):
    """A shape's floor, the best read of its bytes by kernel time (us), taken apart."""
    shape: Shape
    nbytes: int
    dirty: dict  # the best read after the GEMV's flush (the L2 left full of dirty lines)
    clean: dict  # the best read after a clean flush
    streaming_us: float  # the bytes at the bandwidth of the large buffer's fastest read

    @property
    def fixed_us(self) -> float:
        """The fixed cost of a call (launch, first-load latency, tail): the clean read beyond streaming."""
        return self.clean["kernel_us"] - self.streaming_us

    @property
    def writeback_us(self) -> float:
        """The write-back of the flush's dirty lines: the read after the usual flush beyond the clean one."""
        return self.dirty["kernel_us"] - self.clean["kernel_us"]


def floors(rows: Iterable[dict]) -> list[Floor]:
    """Per shape read after both flushes, its floor taken apart (`Floor`): bytes over bandwidth, the
    fixed cost of a call and the write-back of the flush, adding up to the read after the usual
    flush. Needs `read_ceilings` rows with the large buffer (`large_read`); empty without it."""
    rows = list(rows)
    large = large_read(rows)
    if large is None:
        return []
    bandwidth = gbps(large["bytes"], large["kernel_us"])
    index = CeilingIndex(rows)
    dirty, clean = index.best_reads("dirty", "kernel"), index.best_reads("clean", "kernel")
    return [Floor(s, dirty[s]["bytes"], dirty[s], clean[s], dirty[s]["bytes"] / bandwidth / 1e3)
            for s in dirty if s in clean]


def floor_table(rows: Iterable[dict]) -> str:
    """`floors` as a table: per shape the best reads after both flushes and the three parts, in us."""
    def read(r: dict) -> str:
        return f"{r['kernel_us']:.2f} ({r['path'].removeprefix('read-').removesuffix('-clean')})"

    body = [[f"{f.shape.m}x{f.shape.k}x{f.shape.l}", f"{f.nbytes / 1e6:.1f}", read(f.dirty), read(f.clean),
             *(f"{x:.2f}" for x in (f.streaming_us, f.fixed_us, f.writeback_us))] for f in floors(rows)]
    header = ["shape", "MB", "after the usual flush", "after a clean flush", "bytes over bandwidth",
              "fixed cost of a call", "write-back of the flush"]
    return text_table(header, body, left=1) if body else "(no shape was read after both flushes)"


def ceiling_table(rows: Iterable[dict]) -> str:
    """Per size and flush: each read's leaderboard time (the mean, as the leaderboard reports it, and the
    median) and kernel time (us), and the fastest read by leaderboard time (mean) with its bandwidth."""
    reads = read_rows(rows)
    names = list(dict.fromkeys(r["path"].removeprefix("read-").removesuffix("-clean") for r in reads))
    groups: dict = {}
    for r in reads:
        groups.setdefault((r["m"], r["k"], r["l"], r["bytes"], r["path"].endswith("-clean")), []).append(r)
    body = []
    for (m, k, l, nbytes, clean), group in groups.items():
        by_name = {r["path"].removeprefix("read-").removesuffix("-clean"): r for r in group}
        best = min(group, key=lambda r: r["leaderboard_us"])
        cells = [f"{r['leaderboard_us']:.2f} / {_median_text(r)} / {r['kernel_us']:.2f}" if r else "-"
                 for r in (by_name.get(n) for n in names)]
        winner = best["path"].removeprefix("read-").removesuffix("-clean")
        body.append([f"{m}x{k}x{l}" if m is not None else "large", f"{nbytes / 1e6:.1f}", "clean" if clean else "dirty",
                     *cells, winner, f"{best['leaderboard_gbps']:.0f}"])
    header = ["shape", "MB", "flush", *(f"{n} us (lb mean / median / kernel)" for n in names), "best", "best GB/s"]
    return text_table(header, body, left=1) if body else "(no streaming read ran)"


def _median_text(row: dict) -> str:
    """The median of a read's leaderboard times, "-" in rows measured before it was recorded."""
    median = row.get("leaderboard_median_us")
    return "-" if median is None else f"{median:.2f}"

