"""Every GEMV path and its peers, side by side on this machine: ``python -m nvfp4lib.bench.suite``.

One run on the GPU it starts on measures the ceilings: a 2 GiB device-to-device copy and read-only
reduction, and per shape the streaming reads of exactly its bytes (nvfp4lib.bench.ceilings, the best of
several independent reads, under the same flush and timing; the "% of read" figures use the best).
Then, for each path that can run here, it checks it once per shape against the exact reference
(nvfp4lib.bench.harness: the path gets a clone with c poisoned and is judged on the untouched input) and
times it three ways (nvfp4lib.bench.harness.measure): kernel time (calls back to back), leaderboard time
(the leaderboard's own method: its flush right before each call, host cost hidden, the mean) and
host-visible time (each call with the GPU idle, host cost included).
The shapes are the three leaderboard benchmark shapes and a sweep of sizes, A from about 1 MB to
about 256 MB at L = 1 and L = 4, wide enough to show where launch overhead stops mattering.

The results go to ``build/bench/<device>.csv``, a printed table and two figures, all made by
``nvfp4lib.bench.report``.
Without CUDA the suite runs scaled-down shapes with wall-clock timing so that every code path is
exercised; those numbers say nothing about speed, and the CSV and the figures say so.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from nvfp4lib.bench.ceilings import READ_MEASURES, CeilingIndex, ceiling_table, read_ceilings
from nvfp4lib.bench.harness import check_bound, measure, timing_fields
from nvfp4lib.bench.peers import all_paths
from nvfp4lib.bench.plots import declare_mode
from nvfp4lib.bench.report import (BENCH_DIR, CPU_NOTE, context_fields, device_slug, load_results, make_figures,
                                   save_figures, shape_text, summary_table, write_csv)
from nvfp4lib.bench.timing import BENCHMARK_RULE, StoppingRule, copy_bandwidth_gbps, percent, reduction_bandwidth_gbps
from nvfp4lib.contract import Shape, shape_of
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.dispatch import custom_kernel, explain
from nvfp4lib.messages import describe_error, first_line
from nvfp4lib.paths import GemvPath
from nvfp4lib.problem import BENCHMARK_SHAPES, bytes_moved, generate_input


# A codes of the sweep: 2**n elements per call = 2**(n-1) bytes (plus 1/8 for the scales).
GPU_SWEEP_EXPONENTS = tuple(range(21, 30))  # 1 MiB .. 256 MiB
GPU_QUICK_EXPONENTS = (21, 25, 29)
CPU_SWEEP_EXPONENTS = (16, 18)
CPU_QUICK_EXPONENTS = (16, 17)
SWEEP_BATCHES = (1, 4)


# ------------------------------------------------------------------------------ what is timed


@dataclass(frozen=True)
class BenchPath:
    """One way to compute the GEMV. `bind(data)` does any untimed preparation and returns the
    zero-argument callable that is checked and timed; it returns c."""

    name: str  # as in --only and the CSV: a name of peers.all_paths(), or "dispatch"
    kind: str  # "nvfp4lib" or "peer"
    label: str
    bind: Callable
    describe: Callable | None = None  # data -> text for the CSV's note (e.g. what a dispatcher picked)


def _once(factory: Callable) -> Callable:
    """`factory()` on first use, then the same object (or the same exception) every time.

    Building a CuTe runner compiles a kernel; a failure must not be retried for every shape."""
    outcome: list = []

    def get():
        if not outcome:
            try:
                outcome.append((True, factory()))
            except Exception as e:  # noqa: BLE001 - re-raised at every use, reported per shape
                outcome.append((False, e))
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    return get


def _bench_path(path: GemvPath) -> BenchPath:
    if path.timed_call is not None:
        return BenchPath(path.name, path.kind, path.label, path.timed_call, path.describe)
    runner = _once(path.build)
    return BenchPath(path.name, path.kind, path.label, lambda data: functools.partial(runner(), data),
                     path.describe)  # the build fetched when the call is bound, not in every timed call


def _dispatch_path() -> BenchPath:
    return BenchPath("dispatch", "nvfp4lib", "dispatch (custom_kernel)", lambda data: (lambda: custom_kernel(data)),
                     lambda data: f"chose {explain(data)}")


def discover_paths(caps: Capabilities | None = None) -> tuple[list[BenchPath], list[tuple[str, str]]]:
    """(the paths of `peers.all_paths` that can run here and the dispatcher, [(name, why not)] for
    the others), nvfp4lib's paths first, then the peers; the exact reference is not timed."""
    caps = caps or capabilities()
    found, skipped = [], []
    for path in sorted(all_paths().values(), key=lambda p: p.kind != "nvfp4lib"):
        if path.kind == "yardstick":
            continue
        why = path.why_not_timed(caps, caps.cuda)
        if why is None:
            found.append(_bench_path(path))
        else:
            skipped.append((path.name, why))
    found.insert(sum(p.kind == "nvfp4lib" for p in found), _dispatch_path())
    return found, skipped


def select(names: Iterable[str], patterns: Iterable[str] | None) -> set[str]:
    """Names matching any of the glob patterns (all names when `patterns` is None)."""
    names = list(names)
    if patterns is None:
        return set(names)
    return {n for n in names for p in patterns if fnmatch.fnmatchcase(n, p)}


# ------------------------------------------------------------------------------ where


def sweep_shapes(exponents: Iterable[int], batches: Iterable[int] = SWEEP_BATCHES) -> list[Shape]:
    """Shapes of 2**n A elements per call, split over L batches, each batch about square (K >= M)."""
    shapes = []
    for l in batches:
        for n in exponents:
            per_batch = 2 ** n // l
            log = per_batch.bit_length() - 1
            k = 2 ** ((log + 1) // 2)
            shapes.append(Shape(per_batch // k, k, l))
    return shapes


def scaled_down(shape: Shape, factor: int) -> Shape:
    """A CPU-sized stand-in for a benchmark shape, keeping M % 128 == 0, K % 64 == 0 and L."""
    m = max(128, round(shape.m / factor / 128) * 128)
    k = max(64, round(shape.k / factor / 64) * 64)
    return Shape(m, k, shape.l)


@dataclass(frozen=True)
class Plan:
    """Shapes and repetitions of one run."""

    benchmark: list[Shape]
    sweep: list[Shape]
    reps: int  # at most this many calls per kernel or host-visible timing
    min_reps: int  # at least this many, even for slow paths
    budget_s: float  # aim for about this much time per path, shape and timing mode
    cuda: bool
    rule: StoppingRule = BENCHMARK_RULE  # when leaderboard time stops: the leaderboard's own rule on a full GPU run

    @staticmethod
    def for_machine(cuda: bool, quick: bool) -> "Plan":
        if cuda:
            reps = 20 if quick else 100
            return Plan(list(BENCHMARK_SHAPES), sweep_shapes(GPU_QUICK_EXPONENTS if quick else GPU_SWEEP_EXPONENTS),
                        reps=reps, min_reps=5 if quick else 10, budget_s=0.25 if quick else 0.5, cuda=True,
                        rule=dataclasses.replace(BENCHMARK_RULE, max_calls=reps) if quick else BENCHMARK_RULE)
        factor = 16 if quick else 8
        reps = 2 if quick else 3
        return Plan([scaled_down(s, factor) for s in BENCHMARK_SHAPES],
                    sweep_shapes(CPU_QUICK_EXPONENTS if quick else CPU_SWEEP_EXPONENTS),
                    reps=reps, min_reps=1, budget_s=0.2, cuda=False, rule=StoppingRule(max_calls=reps, budget_s=0.2))

    def tasks(self) -> list[tuple[str, Shape]]:
        return [("benchmark", s) for s in self.benchmark] + [("sweep", s) for s in self.sweep]


# ------------------------------------------------------------------------------ measuring


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _warmup(reps: int) -> int:
    return min(10, reps)


def _reps_for(fn: Callable, plan: Plan) -> int:
    """As many calls as fit the time budget, between plan.min_reps and plan.reps."""
    start = time.perf_counter()
    fn()
    _sync(plan.cuda)
    per_call = max(time.perf_counter() - start, 1e-6)
    return max(plan.min_reps, min(plan.reps, int(plan.budget_s / per_call)))


def check_and_time(path: BenchPath, data, plan: Plan) -> dict:
    """Check one path once (on a clone of `data`, c poisoned, judged against `data`), then time
    it on that clone three ways (nvfp4lib.bench.harness.measure); a row of the CSV (without context)."""
    row: dict = {"status": "ok", "note": ""}
    try:
        result, fn = check_bound(path.bind, data)
    except Exception as e:  # noqa: BLE001 - a path that raises is reported, the suite goes on
        return {"status": "error", "note": describe_error(e, 160)}
    row["max_abs_err"] = result.max_abs_err
    if not result.ok:  # still timed: a peer's accuracy is part of the comparison
        row.update(status="inexact", note=first_line(result.message.replace("\n", "; "), 300))
    try:
        reps = _reps_for(fn, plan)
        nbytes = bytes_moved(shape_of(data))
        row.update(timing_fields(measure(fn, rule=plan.rule, warmup=_warmup(reps), reps=reps), nbytes))
    except Exception as e:  # noqa: BLE001
        return dict(row, status="error", note=f"while timing: {describe_error(e, 160)}")
    if row["status"] == "inexact":
        return row
    if path.describe is not None:
        try:
            row["note"] = first_line(path.describe(data), 160)
        except Exception:  # noqa: BLE001 - a description is optional
            pass
    return row


class _Progress:
    """tqdm when installed, else a printed counter."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, unit="run", dynamic_ncols=True)
            except ImportError:
                pass

    def step(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            self.bar.update()
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {text}", flush=True)

    def write(self, text: str) -> None:
        (self.bar.write if self.bar is not None else print)(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(*, quick: bool = False, out_dir: Path | str | None = None, only: Iterable[str] | None = None,
        figures_dir: Path | str | None = None, figures: bool = True, seed: int = 0,
        progress: bool = True, verbose: bool = True) -> Path:
    """Measure everything selected on this machine; write the CSV (and figures); return the CSV's path.

    `figures_dir=None` saves the figures to the workbook's figures folder after a GPU run, and to
    `<out_dir>/figures` after a CPU run (so a CPU run never replaces figures of real measurements).
    `verbose=False` prints only failures (and no table).
    """
    say = print if verbose else (lambda *args, **kwargs: None)
    caps = capabilities()
    plan = Plan.for_machine(caps.cuda, quick)
    device = "cuda" if caps.cuda else "cpu"
    out_dir = Path(out_dir) if out_dir is not None else BENCH_DIR
    slug = device_slug(caps)
    paths, skipped = discover_paths(caps)
    chosen = select([p.name for p in paths] + [n for n, _ in skipped], only)
    paths = [p for p in paths if p.name in chosen]
    skipped = [(n, why) for n, why in skipped if n in chosen]

    say(caps.summary())
    if not caps.cuda:
        say(f"{CPU_NOTE}: scaled-down shapes, wall-clock time; this only exercises the code")
    for name, why in skipped:  # a path that could run here as an emulation is not timed: its time says nothing
        emulated = all_paths()[name].unavailable(caps, caps.cuda) is None
        say(f"skipped {name}, " + (f"not timed: {why}; the benchmark times no emulation" if emulated
                                   else f"cannot run here: {why}"))

    copy, reduction = copy_bandwidth_gbps(), reduction_bandwidth_gbps()
    say(f"ceilings: copy {copy:.0f} GB/s (read + write), reduction {reduction:.0f} GB/s (read)")
    tasks = plan.tasks()
    reads = read_ceilings(tasks, rule=plan.rule, warmup=_warmup(plan.reps), reps=plan.reps,
                          tune_reps=max(plan.min_reps, 10) if caps.cuda else 1, log=say if verbose else None)
    say(ceiling_table(reads))
    read_index = CeilingIndex(reads)
    common = dict(context_fields(caps, quick), copy_gbps=copy, reduction_gbps=reduction)
    cpu_note = "" if caps.cuda else CPU_NOTE
    rows = [dict(common, path="copy", kind="ceiling", label="device-to-device copy", shape_set="ceiling",
                 bytes=None, status="ok", kernel_gbps=copy, note="read + write counted"),
            dict(common, path="reduction", kind="ceiling", label="row-sum reduction", shape_set="ceiling",
                 bytes=None, status="ok", kernel_gbps=reduction, note="read counted")]
    rows += [dict(common, **r) for r in reads]
    registry = all_paths()
    rows += [dict(common, path=n, kind=registry[n].kind, label=registry[n].label,
                  shape_set="-", status="skipped", note=why) for n, why in skipped]

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{slug}.csv"
    bar = _Progress(len(tasks) * len(paths), enabled=progress)
    try:
        for shape_set, shape in tasks:
            data = generate_input(*shape, seed=seed, device=device)
            for path in paths:
                context = dict(common, path=path.name, kind=path.kind, label=path.label, shape_set=shape_set,
                               m=shape.m, k=shape.k, l=shape.l, bytes=bytes_moved(shape))
                row = dict(context, **check_and_time(path, data, plan))
                if row["status"] == "ok":  # % of the copy's bandwidth and of the best read of the same bytes
                    row.update({f"{m}_pct_of_copy": percent(row[f"{m}_gbps"], copy) for m in READ_MEASURES},
                               **read_index.percent_of_read(row))
                    row["note"] = "; ".join(filter(None, [row["note"], cpu_note]))
                else:
                    bar.write(f"{row['status'].upper()} {path.name} {shape_text(row)}: {row['note']}")
                rows.append(row)
                bar.step(f"{path.name} {shape_text(row)}")
            del data
            write_csv(rows, csv_path)  # after every shape, so an interrupted run keeps what it measured
            if caps.cuda:  # give the next, possibly much larger, shape the memory back
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        bar.close()

    if not tasks:  # otherwise the loop wrote every row
        write_csv(rows, csv_path)
    say(summary_table(rows))
    say(f"wrote {csv_path}")
    if figures:
        declare_mode("quick" if quick else "full")  # only a full run may replace committed figures
        target = figures_dir if figures_dir is not None else (None if caps.cuda else out_dir / "figures")
        for name, saved in save_figures(make_figures(rows), target).items():
            say(f"wrote {saved}")
    if not caps.cuda:
        say(CPU_NOTE)
    return csv_path


# ------------------------------------------------------------------------------ command line


def _patterns(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [p for v in values for p in v.split(",") if p]


def _not_a_folder(folder: Path) -> Path | None:
    """The file in the way of `folder` (itself, or the nearest existing folder above it), if any."""
    for path in (folder, *folder.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def is_failure(row: dict) -> bool:
    """Whether a CSV row fails the run: a path that raised, or one of nvfp4lib's paths outside the
    leaderboard's tolerance at a benchmark shape. A peer outside it, or rounding at a sweep size
    beyond the leaderboard's K, is reported but is no failure."""
    return row["status"] == "error" or (row["status"] == "inexact" and row["kind"] == "nvfp4lib"
                                        and row["shape_set"] == "benchmark")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4lib.bench.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--out", type=Path, default=BENCH_DIR, help="folder for <device>.csv (default build/bench)")
    parser.add_argument("--only", nargs="+", metavar="PATH",
                        help="path names or globs, e.g. 'cute_*' peer_bf16 (see --list)")
    parser.add_argument("--figures-dir", type=Path, default=None,
                        help="where to save the figures (default: figures/ after a GPU run, <out>/figures on a CPU)")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the paths, which run here and why not")
    args = parser.parse_args(argv)
    blocked = _not_a_folder(args.out)
    if blocked is not None:
        parser.error(f"argument --out: expected a folder (for <device>.csv), but {blocked} is a file")

    paths, skipped = discover_paths()
    known = [p.name for p in paths] + [n for n, _ in skipped]
    if args.list:
        for p in paths:
            print(f"{p.name:<22} {p.label}")
        for name, why in skipped:
            print(f"{name:<22} not timed here: {why}")
        return 0
    only = _patterns(args.only)
    if only is not None and not select(known, only):
        print(f"--only {' '.join(only)}: matches none of {', '.join(known)}", file=sys.stderr)
        return 2
    csv_path = run(quick=args.quick, out_dir=args.out, only=only, figures_dir=args.figures_dir,
                   figures=not args.no_figures, seed=args.seed, progress=not args.no_progress)
    rows = load_results(csv_path)
    for r in rows:
        if r["status"] in ("inexact", "error"):
            print(f"{r['status']}: {r['path']} {shape_text(r)}: {r['note']}", file=sys.stderr)
    return 1 if any(map(is_failure, rows)) else 0


if __name__ == "__main__":
    sys.exit(main())
