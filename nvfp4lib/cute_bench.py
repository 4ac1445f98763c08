"""Check and time the CuTe DSL kernels on this GPU: ``python -m nvfp4lib.cute_bench``.

One run measures the ceiling (a large device-to-device copy), checks every kernel
variant against the reference on the test shapes and on extra shapes with the output
poisoned first, then times each variant at the benchmark shapes both ways: kernel time
(calls back to back) and leaderboard time (each call on its own, host cost included).
Per shape it also times a pure streaming read of the same byte count the same way: the
most any kernel that must read those bytes can reach under this timing (start-up and
tail included), against which the GEMV's own time is judged as well.
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys

import torch

from .bench import copy_bandwidth_gbps, gbps, percent, time_kernel, time_leaderboard
from .cute_gemv import CuteGemv, FastConfig, _current_stream, _ld_global_v4_if, cute
from .device import capabilities
from .problem import BENCHMARK_SHAPES, TEST_SHAPES, Shape, bytes_moved, generate_input
from .reference import check, poison_

try:  # CuTe DSL is optional (see cute_gemv)
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
except ImportError:  # pragma: no cover
    cutlass = None

EXTRA_SHAPES = [Shape(128, 64, 1), Shape(128, 192, 3), Shape(1024, 4096, 8), Shape(16384, 2048, 8), Shape(16384, 1024, 1)]
DEFAULT_CONFIGS = ("default",)  # the per-K choice of cute_gemv.default_config


def parse_config(text: str) -> FastConfig:
    """'RxWxU[xB][-perm][-loads][-DECODE][:QUALIFIERS]' -> FastConfig(R, W, U, B, ...).

    -perm reads the permuted scales; -loads times the loads alone (no decode, no math:
    wrong results, not checked); -lut, -bitops or -hw picks the FP4 decode;
    :QUALIFIERS sets the PTX qualifiers of the A loads, e.g. ':.nc' or ':.L2::256B'.
    """
    try:
        text, _, a_load = text.partition(":")
        flags = text.split("-")
        values = [int(v) for v in flags[0].lower().split("x")]
        decode = [f for f in flags[1:] if f in ("lut", "bitops", "hw")]
        cfg = FastConfig(*values, compute="loads" not in flags, permuted_scales="perm" in flags,
                         decode=decode[-1] if decode else "auto",
                         **({"a_load": a_load} if a_load else {}))
    except (ValueError, TypeError):
        raise SystemExit(f"--configs: expected RxWxU[xB] such as 2x4x2x4, got {text!r}") from None
    if 128 % cfg.rows_per_block or cfg.rows_per_warp > 32:
        raise SystemExit(f"--configs: rows per block R*W must divide 128 (and R <= 32), got {text!r}")
    return cfg


class StreamRead:
    """A loads-only kernel that reads a buffer once in address order, 16 bytes per load.

    Every thread issues 4 independent 128-bit loads, thread t reading vectors t, t + T,
    t + 2T, t + 3T (T threads in all), so the whole GPU sweeps one compact window of
    memory, the access pattern DRAM serves best. It XORs what it read and writes it only
    if it equals a value no buffer of ours produces, so the loads cannot be removed.
    """

    THREADS, LOADS = 256, 4

    def __init__(self):
        threads, loads = self.THREADS, self.LOADS

        @cute.kernel
        def kernel(src: cute.Tensor, n_vec: cutlass.Int32, sink: cute.Tensor):
            total = cute.arch.grid_dim()[0] * threads
            first = cute.arch.block_idx()[0] * threads + cute.arch.thread_idx()[0]
            x = cutlass.Int32(0)
            for u in cutlass.range_constexpr(loads):
                i = first + u * total
                for w in _ld_global_v4_if(src.iterator + cutlass.Int64(i) * 16, i < n_vec, ".nc.L1::no_allocate"):
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

        self.fn = cute.compile(launch, cutlass.Int64(0), cutlass.Int32(1), cutlass.Int64(0), make_fake_stream(),
                               options="--enable-tvm-ffi")
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")

    def buffer(self, nbytes: int) -> torch.Tensor:
        """Random bytes (never all zeros), rounded up to whole 16-byte vectors."""
        return torch.randint(0, 256, (-(-nbytes // 16) * 16,), dtype=torch.uint8, device="cuda")

    def __call__(self, buf: torch.Tensor) -> None:
        self.fn(buf.data_ptr(), buf.numel() // 16, self.sink.data_ptr(), _current_stream(buf.device.index))


@functools.cache
def stream_reader() -> StreamRead:
    """One compiled StreamRead per process."""
    return StreamRead()


def variants(configs):
    yield "naive", CuteGemv("naive")
    for text in configs:
        yield f"fast {text}", CuteGemv("fast", None if text == "default" else parse_config(text))


def check_all(kernels, shapes, seed: int) -> bool:
    ok_all = True
    for shape in shapes:
        data = generate_input(*shape, seed=seed, mode="full", device="cuda")
        for name, kernel in kernels:
            if kernel.cfg is not None and not kernel.cfg.compute:
                continue
            poison_(data[-1])
            result = check(kernel(data), data)
            ok_all &= result.ok
            status = "ok" if result.ok else "FAIL " + result.message
            print(f"check {name:>12} {shape.m}x{shape.k}x{shape.l}: {status}", flush=True)
    return ok_all


def time_all(kernels, shapes, ceiling: float, reps: int, flush: str = "write"):
    rows = []
    reader = stream_reader()
    for shape in shapes:
        data = generate_input(*shape, seed=1, mode="full", device="cuda")
        nbytes = bytes_moved(shape)
        buf = reader.buffer(nbytes)
        read = time_kernel(lambda: reader(buf), reps=reps, flush=flush)  # noqa: B023 (timed here, in this iteration)
        read_pct = percent(gbps(nbytes, read.median_us), ceiling)
        print(f"read  {shape.m}x{shape.k}x{shape.l}: streaming read of the same {nbytes / 1e6:.1f} MB "
              f"{read.median_us:.2f} us ({read_pct:.1f} % of copy)", flush=True)
        for name, kernel in kernels:
            n = reps if name != "naive" else max(3, reps // 20)
            k = time_kernel(lambda: kernel(data), reps=n, flush=flush)
            lb = time_leaderboard(lambda: kernel(data), reps=n, flush=flush)
            rows.append(dict(
                kernel=name, m=shape.m, k=shape.k, l=shape.l, bytes=nbytes, flush=flush,
                kernel_us=round(k.median_us, 2), kernel_pct=round(percent(gbps(nbytes, k.median_us), ceiling), 1),
                read_us=round(read.median_us, 2), read_pct=round(read_pct, 1),
                pct_of_read=round(100 * read.median_us / k.median_us, 1),
                leaderboard_us=round(lb.median_us, 2), host_us=round(lb.host_us, 2),
            ))
            print("time  {kernel:>12} {m}x{k}x{l}: kernel {kernel_us} us ({kernel_pct} % of copy, {pct_of_read} % of "
                  "the streaming read), leaderboard {leaderboard_us} us, host {host_us} us".format(**rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="fast-kernel configs RxWxU..., or 'default'")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--flush", nargs="+", default=["write"], choices=["write", "clean"],
                        help="L2 flush before each timed call: 'write' as the leaderboard (leaves dirty "
                             "lines whose write-back competes with the kernel), 'clean' (no write-back)")
    parser.add_argument("--csv", help="write the timings here")
    args = parser.parse_args(argv)

    caps = capabilities()
    print(caps.summary())
    if not caps.cuda or not caps.cute_dsl:
        print("needs a CUDA GPU and CuTe DSL (nvidia-cutlass-dsl); nothing to time here")
        return 0
    kernels = list(variants(args.configs))
    ok = args.no_check or check_all(kernels, TEST_SHAPES + EXTRA_SHAPES, seed=0)
    ceiling = copy_bandwidth_gbps()
    print(f"ceiling: device-to-device copy {ceiling:.0f} GB/s (read + write, 2 GiB)")
    rows = [row for flush in args.flush for row in time_all(kernels, BENCHMARK_SHAPES, ceiling, args.reps, flush)]
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) + ["ceiling_gbps", "device"])
            writer.writeheader()
            for row in rows:
                writer.writerow(dict(row, ceiling_gbps=round(ceiling), device=caps.name))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
