"""Streaming-read ceilings: rows in the benchmark CSV's schema, the best read per shape, and the
reads' logic on a CPU (the Triton read in Triton's interpreter where Triton is installed)."""

import math
import os
import subprocess
import sys

import pytest
import torch

from nvfp4lib.bench import report as bench_report
from nvfp4lib.bench import ceilings
from nvfp4lib.bench.timing import StoppingRule
from nvfp4lib.bench.ceilings import (FASTEST_NOTE, TorchRead, best_reads, ceiling_table, percent_of_read, read_buffer,
                               read_ceilings)
from nvfp4lib.contract import Shape
from nvfp4lib.device import tvm_ffi_problem
from nvfp4lib.locations import REPO_ROOT
from nvfp4lib.problem import bytes_moved

FEW = StoppingRule(max_calls=3, budget_s=1e9)


def test_read_buffer_is_whole_groups_of_random_bytes():
    for nbytes in (1, 64, 65, bytes_moved(Shape(128, 192, 3))):
        buf = read_buffer(nbytes, "cpu")
        assert buf.dtype == torch.uint8 and buf.numel() % 64 == 0 and 0 <= buf.numel() - nbytes < 64
    assert int(read_buffer(1 << 16, "cpu").count_nonzero()) > 0
    with pytest.raises(ValueError, match="nbytes"):
        read_buffer(0, "cpu")


class _Failing:
    name, label = "broken", "a read that fails"

    def why_not(self, device):
        return None

    def bind(self, buf, tune_reps):
        raise RuntimeError("cannot compile\nsecond line")


class _Absent:
    name, label = "absent", "a read this machine lacks"

    def why_not(self, device):
        return "needs something absent"


class _Slow(TorchRead):
    """The torch read, three times over: slower whatever the machine's noise."""
    name, label = "slow", "three reads"

    def bind(self, buf, tune_reps):
        call, _, sink = super().bind(buf, tune_reps)
        return ceilings.BoundRead(lambda: [call() for _ in range(3)], "three amax", sink)


def test_read_ceilings_rows(capsys):
    tasks = [("benchmark", Shape(128, 256, 2)), ("sweep", Shape(256, 128, 1))]
    rows = read_ceilings(tasks, rule=FEW, warmup=1, reps=3, reads=(TorchRead(), _Slow(), _Failing(), _Absent()),
                         log=print)
    skipped = [(r["path"], r.get("shape_set"), r["note"]) for r in rows if r["status"] == "skipped"]
    failed = "failed here: RuntimeError: cannot compile"
    assert skipped == [("read-absent", "ceiling", "needs something absent"),
                       ("read-broken", "benchmark", failed), ("read-broken-clean", "benchmark", failed),
                       ("read-broken", "sweep", failed), ("read-broken", "ceiling", failed)]
    ok = [r for r in rows if r["status"] == "ok"]
    # per read: each task after the GEMV's flush, the benchmark task also after a clean one, and the large read
    for name in ("torch", "slow"):
        mine = [(r["path"], r["shape_set"], r["bytes"]) for r in ok if r["path"].startswith(f"read-{name}")]
        assert mine == [(f"read-{name}", "benchmark", bytes_moved(tasks[0][1])),
                        (f"read-{name}-clean", "benchmark", bytes_moved(tasks[0][1])),
                        (f"read-{name}", "sweep", bytes_moved(tasks[1][1])),
                        (f"read-{name}", "ceiling", 16 << 20)]
    for r in ok:
        assert r["kind"] == "ceiling" and r["kernel_us"] > 0 and r["leaderboard_reps"] == 3
        assert r["leaderboard_gbps"] == pytest.approx(r["bytes"] / r["leaderboard_us"] / 1e3)
        assert set(r) <= set(bench_report.COLUMNS)
    fastest = [r for r in ok if FASTEST_NOTE in r["note"]]
    assert len(fastest) == 4, "one fastest read per size and flush"
    for r in fastest:
        rivals = [o for o in ok if (o["bytes"], o["flush"]) == (r["bytes"], r["flush"])]
        assert r["leaderboard_us"] == min(o["leaderboard_us"] for o in rivals)
    out = capsys.readouterr().out
    assert "read 128x256x2" in out and "read-broken failed here: RuntimeError" in out
    table = ceiling_table(rows)
    assert "torch us (lb mean / median / kernel)" in table and "slow us (lb mean / median / kernel)" in table
    assert len(table.splitlines()) == 6
    for r in ok:  # the mean is the leaderboard's figure; the median is kept beside it
        assert r["leaderboard_median_us"] > 0 and f"{r['leaderboard_median_us']:.2f}" in table


def _read(path, shape, kernel_us, leaderboard_us, status="ok"):
    return dict(path=path, kind="ceiling", m=shape.m, k=shape.k, l=shape.l, bytes=bytes_moved(shape), status=status,
                kernel_us=kernel_us, leaderboard_us=leaderboard_us)


def test_best_reads_and_percent_of_read(tmp_path):
    big, small = Shape(256, 1024, 2), Shape(128, 64, 1)
    rows = [_read("read-cute", big, 10.0, 22.0), _read("read-triton", big, 12.0, 20.0),
            _read("read-torch", big, 5.0, 5.0, status="error"), _read("read-torch-clean", big, 8.0, 18.0),
            _read("read-torch", small, 3.0, 4.0), dict(_read("read-torch", big, 1.0, 1.0), m=None),  # the large read
            dict(path="copy", kind="ceiling", status="ok", kernel_gbps=4000.0)]
    for loaded in (rows, None):
        if loaded is None:  # the same through the CSV
            bench_report.write_csv(rows, tmp_path / "r.csv")
            loaded = bench_report.load_results(tmp_path / "r.csv")
        lb, kernel, clean = best_reads(loaded), best_reads(loaded, measure_name="kernel"), best_reads(loaded, "clean")
        assert {s: r["path"] for s, r in lb.items()} == {big: "read-triton", small: "read-torch"}
        assert kernel[big]["path"] == "read-cute"
        assert {s: r["path"] for s, r in clean.items()} == {big: "read-torch-clean"}
    row = dict(m=big.m, k=big.k, l=big.l, kernel_us=25.0, leaderboard_us=40.0)
    assert percent_of_read(row, rows) == {"kernel_pct_of_read": pytest.approx(40.0),
                                          "leaderboard_pct_of_read": pytest.approx(50.0)}
    assert percent_of_read(row, rows, "clean") == {"kernel_pct_of_read": pytest.approx(32.0),
                                                   "leaderboard_pct_of_read": pytest.approx(45.0)}
    assert percent_of_read(dict(row, m=512), rows) == {}
    with pytest.raises(ValueError, match="flush"):
        best_reads(rows, "warm")
    with pytest.raises(ValueError, match="measure_name"):
        best_reads(rows, measure_name="host-visible")  # the reads are timed by kernel and leaderboard time only
    index = ceilings.CeilingIndex(iter(rows))  # one pass over the rows: an iterator will do
    assert index.has_reads and index.copy_gbps == 4000.0
    for flush in ("dirty", "clean"):
        assert percent_of_read(row, index, flush) == percent_of_read(row, rows, flush)
        assert index.best_reads(flush, "kernel") == best_reads(rows, flush, "kernel")
    # the ceiling of a row: the best read by kernel time after the row's flush, else the copy's bandwidth
    assert bench_report.percent_of_ceiling(row, index) == pytest.approx(40.0)
    assert bench_report.percent_of_ceiling(dict(row, flush="clean"), rows) == pytest.approx(32.0)
    copy_only = ceilings.CeilingIndex(rows[-1:])
    assert not copy_only.has_reads and copy_only.best_reads() == {}
    assert bench_report.percent_of_ceiling(dict(row, bytes=10**8), copy_only) == pytest.approx(100.0)  # 4000 GB/s
    assert bench_report.percent_of_ceiling(row, []) is None


def test_gpu_reads_say_why_they_cannot_run_here():
    cpu = torch.device("cpu")
    assert ceilings.TritonRead().why_not(cpu) == "needs a CUDA GPU"
    assert ceilings.CuteRead().why_not(cpu) == "needs a CUDA GPU"
    assert TorchRead().why_not(cpu) is None


INTERPRETED_READ = """
import torch
from nvfp4lib.bench import ceilings

read = ceilings.TritonRead()
random_bytes = ceilings.read_buffer(3 * 4096 + 64, "cpu")
n_words = random_bytes.numel() // 4


def sink_after(buf, block, warps):
    call, _, sink = read.launch(buf, block, warps)
    call()
    return int(sink[0])


for block, warps in ((2048, 4), (4096, 8)):
    assert sink_after(random_bytes, block, warps) == 0
    for position in (0, n_words // 2, n_words - 1):
        planted = torch.zeros(n_words, dtype=torch.int32)
        planted[position] = 0x5EEDF00D
        assert sink_after(planted.view(torch.uint8), block, warps) == 0x5EEDF00D, (block, position)
print("interpreted read ok")
"""


def test_triton_read_in_the_interpreter():
    """The Triton kernel's logic on the CPU, in Triton's interpreter (set before Triton is imported,
    hence its own process): every word is read (a magic word planted anywhere in zeros makes its
    program's sum magic, and the sink is written), and random data writes nothing."""
    _run_interpreted(INTERPRETED_READ, "interpreted read ok")


def _run_interpreted(script: str, done_line: str) -> None:
    """Run ``script`` in its own process under Triton's interpreter (set before Triton is imported)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), *sys.path])))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done_line in done.stdout, done.stdout + done.stderr


def test_triton_launch_shapes_are_a_small_set_of_whole_vectors():
    assert 4 <= len(ceilings.TRITON_LAUNCH_SHAPES) <= 16
    for block, warps in ceilings.TRITON_LAUNCH_SHAPES:
        assert block % (32 * warps * 4) == 0, "every thread loads whole 16-byte vectors"
        assert math.log2(block).is_integer()


def test_triton_read_compiles_to_16_byte_loads_for_hopper():
    """Triton compiles without a GPU: the read for sm_90 loads with ld.global.v4.b32 (16 bytes) only,
    given what Triton's launcher knows of our buffers (16-byte aligned, word count a multiple of 16)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, kernel = ceilings._triton_read_kernel()
    for block, warps in ceilings.TRITON_LAUNCH_SHAPES:
        try:
            signature = {"src": "*i32", "n_words": "i32", "sink": "*i32", "BLOCK": "constexpr", "XOR": "constexpr",
                         "EVICT": "constexpr", "CACHE": "constexpr"}
            source = ASTSource(fn=kernel, signature=signature,
                               constexprs={"BLOCK": block, "XOR": False, "EVICT": "", "CACHE": ""},
                               attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
        except TypeError as err:
            pytest.skip(f"this Triton ({triton.__version__}) describes kernels differently: {err}")
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
        loads = [line for line in ptx.splitlines() if "ld.global" in line]
        assert loads and all(".v4.b32" in line for line in loads), (block, warps, loads[:3])
        assert len(loads) == block // (32 * warps * 4), "each thread loads its share of the block once"


@pytest.mark.cute
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("tvm_ffi", [True, False], ids=["tvm-ffi", "plain-call-path"])
def test_cute_stream_read_compiles_to_16_byte_loads_without_a_gpu(arch, tvm_ffi, tmp_path):
    """StreamRead's kernel, cross-compiled for either call path (a release without apache-tvm-ffi has only the
    plain one): LOADS predicated 16-byte loads per thread, each past L1, and the one guarded store of the sink
    that keeps them."""
    if tvm_ffi and (why := tvm_ffi_problem()) is not None:
        pytest.skip(f"TVM-FFI calls: {why}")
    ptx = ceilings.compile_stream_read(arch, f"--keep-ptx --dump-dir {tmp_path}", tvm_ffi).__ptx__
    lines = [line.strip() for line in ptx.splitlines()]
    loads = [line for line in lines if "ld.global" in line]
    assert len(loads) == ceilings.StreamRead.LOADS, loads
    assert all(line.startswith("@p ld.global.nc.L1::no_allocate.v4.u32") for line in loads), loads
    assert sum("st.global" in line for line in lines) == 1


@pytest.mark.gpu
def test_every_read_here_reads_every_byte_on_the_gpu():
    """A magic word planted first, in the middle or last in zeros reaches each read's sink (so the
    read covers the whole buffer); then rows for a small shape, every read measured."""
    device = torch.device("cuda")
    reads = [r for r in ceilings.READS if r.why_not(device) is None]
    n_words = (1 << 20) // 4 + 16
    for read in reads:
        for position in (0, n_words // 2, n_words - 1):
            planted = torch.zeros(n_words, dtype=torch.int32, device=device)
            planted[position] = 0x5EEDF00D
            call, _, sink = read.bind(planted.view(torch.uint8), tune_reps=2)
            sink.zero_()
            call()
            assert int(sink.reshape(-1)[0]) == 0x5EEDF00D, (read.name, position)
    rows = read_ceilings([("benchmark", Shape(256, 1024, 2))], large=False, rule=FEW, warmup=1, reps=3, tune_reps=2)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["path"] for r in ok} == {f"read-{r.name}" for r in reads} | {f"read-{r.name}-clean" for r in reads}
    assert all(math.isfinite(r["leaderboard_gbps"]) and r["leaderboard_reps"] == 3 for r in ok)


# ------------------------------------------------------------------ the Triton reads of the fastest independent read


def test_xor_reads_are_registered_named_and_compete_for_the_ceiling():
    """One read per hint, each named for it and tuned over the small launch shapes; the ceiling of a
    shape is the fastest of all reads, whichever that is."""
    names = [r.name for r in ceilings.READS]
    assert names[:3] == ["cute", "triton", "torch"]
    assert [r.name for r in ceilings.TRITON_XOR_READS] == ["triton-xor-plain", "triton-xor-evict-first", "triton-xor-cg"]
    assert set(ceilings.TRITON_XOR_READS) <= set(ceilings.READS) and len(set(names)) == len(names)
    assert ceilings.TRITON_HINTS["evict-first"] == ("evict_first", "") and ceilings.TRITON_HINTS["cg"] == ("", ".cg")
    for read in ceilings.TRITON_XOR_READS:
        assert read.launch_shapes == ceilings.TRITON_SMALL_LAUNCH_SHAPES and read.hint in read.label
        assert read.why_not(torch.device("cpu")) == "needs a CUDA GPU"
    with pytest.raises(ValueError, match="hint"):
        ceilings.TritonRead("evict-last")
    shape = Shape(256, 1024, 2)
    rows = [_read(f"read-{name}", shape, 10.0 + i, 20.0 - i) for i, name in enumerate(names)]
    assert best_reads(ceilings.CeilingIndex(rows)) == best_reads(rows)
    assert best_reads(rows)[shape]["path"] == f"read-{names[-1]}"  # the lowest leaderboard time wins
    assert best_reads(rows, measure_name="kernel")[shape]["path"] == "read-cute"


def test_read_paths_and_labels_are_those_of_the_committed_results():
    """The rows' path and label of every read, as results/*.csv and the notebooks hold them."""
    labels = {f"read-{r.name}": r.label for r in ceilings.READS}
    assert labels == {
        "read-cute": "streaming read: CuTe StreamRead, 16-byte loads",
        "read-triton": "streaming read: Triton, 16-byte loads",
        "read-torch": "streaming read: torch.amax over int32",
        **{f"read-triton-xor-{hint}": f"streaming read: Triton, 16-byte loads, int32 XOR, 4-8 KB per program, {hint}"
           for hint in ("plain", "evict-first", "cg")}}
    committed = {(r["path"], r["label"]) for r in bench_report.load_results(REPO_ROOT / "results" / "h200_per_k.csv")
                 if r.get("kind") == "ceiling" and r["path"].startswith("read-")}
    assert committed and {(path.removesuffix("-clean"), label.removesuffix(", after a clean flush"))
                          for path, label in committed} <= set(labels.items())
    triton = ceilings.TritonRead()
    assert (triton.hint, triton.launch_shapes) == (None, ceilings.TRITON_LAUNCH_SHAPES)


def test_small_launch_shapes_load_whole_vectors_in_4_or_8_kb_programs():
    assert len(ceilings.TRITON_SMALL_LAUNCH_SHAPES) == 8
    for block, warps in ceilings.TRITON_SMALL_LAUNCH_SHAPES:
        assert block * 4 in (4096, 8192) and block % (32 * warps * 4) == 0


INTERPRETED_XOR_READ = """
import torch
from nvfp4lib.bench import ceilings

n_words = (3 * 4096 + 64) // 4
for read in ceilings.TRITON_XOR_READS:
    for block, warps in ((1024, 2), (2048, 8)):
        call, _, sink = read.launch(ceilings.read_buffer(4 * n_words, "cpu"), block, warps)
        call()
        assert int(sink[0]) == 0, read.name
        for position in (0, n_words // 2, n_words - 1):
            planted = torch.zeros(n_words, dtype=torch.int32)
            planted[position] = 0x5EEDF00D
            call, _, sink = read.launch(planted.view(torch.uint8), block, warps)
            call()
            assert int(sink[0]) == 0x5EEDF00D, (read.name, block, position)
print("interpreted xor reads ok")
"""


def test_xor_reads_in_the_interpreter():
    """The XOR kernel on the CPU (Triton's interpreter): a magic word planted anywhere in zeros reaches
    the sink, random data writes nothing, under every hint."""
    _run_interpreted(INTERPRETED_XOR_READ, "interpreted xor reads ok")


def test_xor_reads_compile_to_16_byte_loads_with_their_hints_for_hopper():
    """For sm_90 (no GPU needed): every load is a 16-byte ld.global.v4.b32, with L1::evict_first under an L2
    evict_first policy, .cg, or no qualifier, as the hint says."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, kernel = ceilings._triton_read_kernel()
    expected = {"plain": "ld.global.v4.b32", "evict-first": "ld.global.L1::evict_first.L2::cache_hint.v4.b32",
                "cg": "ld.global.cg.v4.b32"}
    for hint, (evict, cache) in ceilings.TRITON_HINTS.items():
        for block, warps in ((1024, 1), (2048, 8)):
            signature = {"src": "*i32", "n_words": "i32", "sink": "*i32", "BLOCK": "constexpr", "XOR": "constexpr",
                         "EVICT": "constexpr", "CACHE": "constexpr"}
            try:
                source = ASTSource(fn=kernel, signature=signature,
                                   constexprs={"BLOCK": block, "XOR": True, "EVICT": evict, "CACHE": cache},
                                   attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
            except TypeError as err:
                pytest.skip(f"this Triton ({triton.__version__}) describes kernels differently: {err}")
            ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
            loads = [line.split()[1] for line in ptx.splitlines() if "ld.global" in line]
            assert loads and set(loads) == {expected[hint]}, (hint, block, warps, loads[:3])
            assert len(loads) == block // (32 * warps * 4)
def _sized_read(path: str, shape: Shape | None, nbytes: int, kernel_us: float) -> dict:
    m, k, l = shape if shape is not None else (None, None, None)
    return dict(path=path, kind="ceiling", shape_set="benchmark" if shape else "ceiling", m=m, k=k, l=l,
                bytes=nbytes, status="ok", flush="clean" if path.endswith("-clean") else "dirty", kernel_us=kernel_us,
                leaderboard_us=kernel_us + 1.0)


def test_the_floor_comes_apart_into_streaming_fixed_cost_and_write_back():
    """Bytes at the large read's bandwidth, the clean read beyond that, the usual read beyond the clean one."""
    shape = Shape(1024, 2048, 2)
    nbytes = bytes_moved(shape)
    rows = [_sized_read("read-torch", None, 10**9, 500.0),
            _sized_read("read-cute", None, 10**9, 250.0),  # 4000 GB/s, the fastest large read
            _sized_read("read-cute", shape, nbytes, 9.0), _sized_read("read-cute-clean", shape, nbytes, 7.0),
            _sized_read("read-torch", shape, nbytes, 12.0), _sized_read("read-torch-clean", shape, nbytes, 6.5),
            dict(_sized_read("read-triton", None, 10**9, 1.0), status="skipped")]
    assert ceilings.large_read(rows)["path"] == "read-cute"
    (floor,) = ceilings.floors(rows)
    assert floor.shape == shape and floor.dirty["path"] == "read-cute" and floor.clean["path"] == "read-torch-clean"
    assert floor.streaming_us == pytest.approx(nbytes / 4000.0 / 1e3)
    assert (floor.fixed_us, floor.writeback_us) == (pytest.approx(6.5 - floor.streaming_us), 2.5)
    assert floor.streaming_us + floor.fixed_us + floor.writeback_us == pytest.approx(9.0)
    table = ceilings.floor_table(rows)
    assert "fixed cost of a call" in table and "9.00 (cute)" in table and "6.50 (torch)" in table
    assert ceilings.floors(rows[2:]) == [] and "no shape was read" in ceilings.floor_table(rows[2:])
