"""Measure which GEMV path is fastest per shape class on this GPU: the dispatcher's `Table`.

The dispatcher only reads a table (`dispatch.load_table`, `dispatch.set_table`); making one is
benchmarking, so it lives here, on the benchmarking side, timed by the same harness as every
other measurement of the workbook. ``python -m nvfp4lib.bench.calibration`` (``make calibrate``)
measures it and saves it to `locations.DISPATCH_TABLE`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from nvfp4lib.bench.harness import check_bound, measure
from nvfp4lib.bench.timing import BENCHMARK_RULE, BENCHMARK_WARMUP_RULE, StoppingRule, geomean
from nvfp4lib.contract import Shape
from nvfp4lib.device import capabilities
from nvfp4lib.dispatch import DISPATCHER, Dispatcher, Table, save_table, shape_class
from nvfp4lib.locations import DISPATCH_TABLE
from nvfp4lib.messages import first_line
from nvfp4lib.paths import FALLBACK_ORDER, PATHS, check_name
from nvfp4lib.problem import BENCHMARK_SHAPES, generate_input

CANDIDATES = FALLBACK_ORDER  # the paths the dispatcher chooses between


def calibrate(shapes=BENCHMARK_SHAPES, candidates=CANDIDATES, *, rule: StoppingRule = BENCHMARK_RULE,
              warmup_rule: StoppingRule | None = BENCHMARK_WARMUP_RULE, seed: int = 0,
              install: Dispatcher | None = DISPATCHER, log: Callable[[str], None] | None = None) -> Table:
    """Time every available candidate on every shape here as the leaderboard times a submission,
    and keep per shape class the fastest one whose result passed the reference check.

    Each (shape, path): one call on a clone of the input, its c poisoned, checked against the
    untouched input (`harness.check_bound`), then leaderboard time of that call until `rule` says
    stop (`harness.measure`); a path's first timing is preceded by a warm-up benchmark under
    `warmup_rule` (None: none), as the leaderboard warms up a submission. Paths are ranked by the
    mean, the leaderboard's figure; several shapes of one class by the geometric mean of their
    means. `log` receives one line per (shape, path), before its work, for progress. The table is
    set on the dispatcher `install` (None: on none).

    Runs on whatever device this is (wall clock on a CPU, useful only to test the logic). Graph
    paths may be listed, but they win only when the very same tensors come back call after call
    (a new set of tensors means a new capture, milliseconds), so they are not candidates by default.
    """
    for name in candidates:
        check_name(name, "candidates")
    say = log or (lambda line: None)
    caps = capabilities()
    device = "cuda" if caps.cuda else "cpu"
    tab = Table(caps.name, f"{caps.sm[0]}.{caps.sm[1]}" if caps.sm else None)
    builder = install if install is not None else Dispatcher()
    timed: dict = {}  # class -> {path: [mean us per shape]}
    warmed: set = set()
    shapes = [Shape._make(s) for s in shapes]
    total = len(shapes) * len(candidates)
    for i, s in enumerate(shapes):
        key = shape_class(s)
        entry = tab.entries.setdefault(key, {"path": None, "mean_us": {}, "shapes": []})
        entry["shapes"].append(list(s))
        where = f"{s.m}x{s.k}x{s.l}"
        # unsigned scales, as NVFP4 has them: cuBLAS's FP4 GEMM reads its block scales as UE4M3
        data = generate_input(*s, seed=seed, device=device, negative_scales=False)
        for j, name in enumerate(candidates):
            step = f"({i * len(candidates) + j + 1}/{total})"
            why_not = PATHS[name].unavailable(caps, device == "cuda")
            if why_not is None:
                say(f"timing {name} at {where} {step} ...")
                fn = builder.build(name)
                result, call = check_bound(lambda given: lambda: fn(given), data)
                why_not = None if result.ok else f"wrong result at {tuple(s)}: {first_line(result.message)}"
            else:
                say(f"skipping {name} at {where} {step}: {why_not}")
            if why_not is not None:
                tab.skipped[name] = why_not
                continue
            if warmup_rule is not None and name not in warmed:
                measure(call, ("leaderboard",), rule=warmup_rule)
                warmed.add(name)
            t = measure(call, ("leaderboard",), rule=rule)["leaderboard"]
            timed.setdefault(key, {}).setdefault(name, []).append(t.mean_us)
    for key, entry in list(tab.entries.items()):
        n = len(entry["shapes"])
        # a path that failed or was skipped at any shape of the class is out of the running there
        geo = {p: geomean(v) for p, v in timed.get(key, {}).items() if len(v) == n}
        if not geo:
            del tab.entries[key]
            continue
        entry["mean_us"] = geo
        entry["path"] = min(geo, key=geo.get)
    if install is not None:
        install.set_table(tab)
    return tab


def main(argv=None) -> int:
    """Calibrate on this GPU and save the table; without a CUDA GPU say so and exit 0 (like every GPU target)."""
    parser = argparse.ArgumentParser(prog="python -m nvfp4lib.bench.calibration",
                                     description="Time the dispatcher's candidate paths per shape class on this GPU "
                                                 "and save its table.")
    parser.add_argument("--out", default=DISPATCH_TABLE, help=f"where to save the table (default {DISPATCH_TABLE})")
    args = parser.parse_args(argv)
    caps = capabilities()
    if not caps.cuda:
        print(f"calibrate: skipped, it times GPU kernels and this machine has {caps.summary()}")
        return 0
    print(f"wrote {save_table(args.out, calibrate(log=print))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
