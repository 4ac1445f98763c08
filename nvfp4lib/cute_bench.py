"""Check and time the CuTe DSL kernels on this GPU: ``python -m nvfp4lib.cute_bench``.

One run measures the ceiling (a large device-to-device copy), checks every kernel
variant against the reference on the test shapes and on extra shapes with the output
poisoned first, then times each variant at the benchmark shapes both ways: kernel time
(calls back to back) and leaderboard time (each call on its own, host cost included).
"""

from __future__ import annotations

import argparse
import csv
import sys


from .bench import copy_bandwidth_gbps, gbps, percent, time_kernel, time_leaderboard
from .cute_gemv import CuteGemv, FastConfig
from .device import capabilities
from .problem import BENCHMARK_SHAPES, TEST_SHAPES, Shape, bytes_moved, generate_input
from .reference import check, poison_

EXTRA_SHAPES = [Shape(128, 64, 1), Shape(128, 192, 3), Shape(1024, 4096, 8), Shape(16384, 2048, 8), Shape(16384, 1024, 1)]
DEFAULT_CONFIGS = ("4x4x2x4",)


def parse_config(text: str) -> FastConfig:
    """'RxWxU[xB][-perm][-loads][:QUALIFIERS]' -> FastConfig(R, W, U, B, ...).

    -perm reads the permuted scales; -loads times the loads alone (no decode, no math:
    wrong results, not checked);
    :QUALIFIERS sets the PTX qualifiers of the A loads, e.g. ':.nc' or ':.L2::256B'.
    """
    try:
        text, _, a_load = text.partition(":")
        flags = text.split("-")
        values = [int(v) for v in flags[0].lower().split("x")]
        cfg = FastConfig(*values, compute="loads" not in flags, permuted_scales="perm" in flags,
                         **({"a_load": a_load} if a_load else {}))
    except (ValueError, TypeError):
        raise SystemExit(f"--configs: expected RxWxU[xB] such as 2x4x2x4, got {text!r}") from None
    if 128 % cfg.rows_per_block or cfg.rows_per_warp > 32:
        raise SystemExit(f"--configs: rows per block R*W must divide 128 (and R <= 32), got {text!r}")
    return cfg


def variants(configs):
    yield "naive", CuteGemv("naive")
    for text in configs:
        yield f"fast {text}", CuteGemv("fast", parse_config(text))


def check_all(kernels, shapes, seed: int) -> bool:
    ok_all = True
    for shape in shapes:
        data = generate_input(*shape, seed=seed, mode="full", device="cuda")
        for name, kernel in kernels:
            if not kernel.cfg.compute:
                continue
            poison_(data[-1])
            result = check(kernel(data), data)
            ok_all &= result.ok
            status = "ok" if result.ok else "FAIL " + result.message
            print(f"check {name:>12} {shape.m}x{shape.k}x{shape.l}: {status}", flush=True)
    return ok_all


def time_all(kernels, shapes, ceiling: float, reps: int, flush: str = "write"):
    rows = []
    for shape in shapes:
        data = generate_input(*shape, seed=1, mode="full", device="cuda")
        nbytes = bytes_moved(shape)
        for name, kernel in kernels:
            n = reps if name != "naive" else max(3, reps // 20)
            k = time_kernel(lambda: kernel(data), reps=n, flush=flush)
            lb = time_leaderboard(lambda: kernel(data), reps=n, flush=flush)
            rows.append(dict(
                kernel=name, m=shape.m, k=shape.k, l=shape.l, bytes=nbytes, flush=flush,
                kernel_us=round(k.median_us, 2), kernel_pct=round(percent(gbps(nbytes, k.median_us), ceiling), 1),
                leaderboard_us=round(lb.median_us, 2), host_us=round(lb.host_us, 2),
            ))
            print("time  {kernel:>12} {m}x{k}x{l}: kernel {kernel_us} us ({kernel_pct} % of copy), "
                  "leaderboard {leaderboard_us} us, host {host_us} us".format(**rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="fast-kernel configs RxWxU")
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
