"""Every GEMV path and its peers, side by side on this machine: ``python -m nvfp4lib.suite``.

One run on the GPU it starts on measures the ceilings (a device-to-device copy and a read-only
reduction), then, for each path that can run here, checks it once per shape against the float64
reference with the output poisoned, and times it both ways (kernel time: calls back to back;
leaderboard time: each call on its own, host cost included; the L2 is flushed before every call).
The shapes are the three leaderboard benchmark shapes and a sweep of sizes, A from about 1 MB to
about 256 MB at L = 1 and L = 4, wide enough to show where launch overhead stops mattering.

The results go to ``build/bench/<device>.csv`` (one row per path and shape, with the environment
in every row), a printed table, and two figures: ``00_roofline`` (bytes per call against time,
with the measured ceiling) and ``00_benchmark_bars`` (all paths and peers at the benchmark shapes).
Without CUDA the suite runs scaled-down shapes with wall-clock timing so that every code path is
exercised; those numbers say nothing about speed, and the CSV and the figures say so.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import fnmatch
import gc
import importlib
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from nvfp4lib import peers, scaled_mm
from nvfp4lib.bench import copy_bandwidth_gbps, gbps, percent, reduction_bandwidth_gbps, time_kernel, time_leaderboard
from nvfp4lib.device import Capabilities, capabilities, environment_report
from nvfp4lib.paths import BUILD_DIR, REPO_ROOT
from nvfp4lib.problem import B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, Shape, bytes_moved, generate_input
from nvfp4lib.reference import check, poison_

BENCH_DIR = BUILD_DIR / "bench"
RESULTS_DIR = REPO_ROOT / "results"  # committed results of full runs, one CSV per device
FIGURE_NAMES = ("00_roofline", "00_benchmark_bars")
CPU_NOTE = "CPU: timings are not meaningful"

# A codes of the sweep: 2**n elements per call = 2**(n-1) bytes (plus 1/8 for the scales).
GPU_SWEEP_EXPONENTS = tuple(range(21, 30))  # 1 MiB .. 256 MiB
GPU_QUICK_EXPONENTS = (21, 25, 29)
CPU_SWEEP_EXPONENTS = (16, 18)
CPU_QUICK_EXPONENTS = (16, 17)
SWEEP_BATCHES = (1, 4)

ENV_FIELDS = ("python", "platform", "torch", "cuda_runtime", "driver", "gpu", "sm", "fp4_gemm", "cute_dsl",
              "cute_arch", "nvfp4lib")
COLUMNS = (
    "path", "kind", "label", "shape_set", "m", "k", "l", "bytes", "status", "note",
    "kernel_us", "kernel_p10_us", "kernel_p90_us", "kernel_reps",
    "leaderboard_us", "leaderboard_p10_us", "leaderboard_p90_us", "leaderboard_reps", "host_us",
    "kernel_gbps", "leaderboard_gbps", "kernel_pct_of_copy", "leaderboard_pct_of_copy", "max_abs_err",
    "timing", "copy_gbps", "reduction_gbps", "device_slug", "quick", "date",
    *(f"env_{f}" for f in ENV_FIELDS),
)
"""CSV columns. status: ok | inexact (outside rtol = atol = 1e-3, still timed) | error (raised) | skipped (not on this device).
Ceiling rows have kind "ceiling", shape_set "ceiling" and only bytes and kernel_gbps filled."""


# ------------------------------------------------------------------------------ what is timed


@dataclass(frozen=True)
class BenchPath:
    """One way to compute the GEMV. `bind(data)` does any untimed preparation and returns the
    zero-argument callable that is checked and timed; it returns c."""

    name: str  # as in --only and the CSV, e.g. "cute-fast"
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


def _call(fn: Callable) -> Callable:
    return lambda data: (lambda: fn(data))


def _cute_paths(caps: Capabilities):
    names = ("naive", "fast")
    if not (caps.cuda and caps.cute_dsl):
        why = "needs a CUDA GPU" if not caps.cuda else "needs the CuTe DSL (pip install -e '.[cute]')"
        return [], [(f"cute-{v}", why) for v in names]

    def path(variant):
        from nvfp4lib.cute_gemv import CuteGemv
        runner = _once(lambda: CuteGemv(variant))
        return BenchPath(f"cute-{variant}", "nvfp4lib", f"CuTe {variant}", lambda data: _call(runner())(data))

    return [path(v) for v in names], []


def _scaled_mm_paths(caps: Capabilities):
    names = [f"scaled_mm-{v}" for v in scaled_mm.VARIANTS]
    if not caps.fp4_gemm:
        return [], [(n, "FP4 torch._scaled_mm needs Blackwell (sm_100+)") for n in names]
    paths, skipped = [], []
    for variant, fn in scaled_mm.VARIANTS.items():
        reason = scaled_mm.functional_unavailable_reason() if variant == "functional" else None
        if reason:
            skipped.append((f"scaled_mm-{variant}", reason))
        else:
            paths.append(BenchPath(f"scaled_mm-{variant}", "nvfp4lib", f"_scaled_mm {variant}", _call(fn)))
    return paths, skipped


def _raise(error: Exception) -> Callable:
    def bind(data):
        raise error
    return bind


def _dispatch_paths():
    """The dispatcher `custom_kernel`, if this checkout has it (imported only now, on purpose)."""
    label = "dispatch (custom_kernel)"
    try:
        module = importlib.import_module("nvfp4lib.dispatch")
    except Exception as e:  # noqa: BLE001 - a broken module is an error of that path, not of the suite
        if isinstance(e, ModuleNotFoundError) and e.name == "nvfp4lib.dispatch":
            return [], [("dispatch", "nvfp4lib.dispatch is not in this checkout")]
        return [BenchPath("dispatch", "nvfp4lib", label, _raise(e))], []  # an error at every shape
    explain = getattr(module, "explain", None)
    describe = (lambda data: f"chose {explain(data)}") if explain else None
    return [BenchPath("dispatch", "nvfp4lib", label, _call(module.custom_kernel), describe)], []


def _bind_bf16(data):
    prepared = peers.prepare_bf16_weights(data)  # ahead of time: not part of a call
    return lambda: peers.bf16_gemv(prepared, data)


PEER_PATHS = (
    BenchPath("peer-eager", "peer", "eager dequant + matmul", _call(peers.eager_dequant_matmul)),
    BenchPath("peer-compiled", "peer", "torch.compile dequant-reduce", _call(peers.compiled_dequant_reduce)),
    BenchPath("peer-bf16", "peer", "cuBLAS bf16 GEMV (pre-dequantized)", _bind_bf16),
)


def discover_paths(caps: Capabilities | None = None) -> tuple[list[BenchPath], list[tuple[str, str]]]:
    """(paths that can run here, [(name, why not)] for the others), nvfp4lib paths first."""
    caps = caps or capabilities()
    found, skipped = [], []
    for paths, why in (_cute_paths(caps), _scaled_mm_paths(caps), _dispatch_paths()):
        found += paths
        skipped += why
    return found + list(PEER_PATHS), skipped


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
    reps: int  # at most this many calls per timing
    min_reps: int  # at least this many, even for slow paths
    budget_s: float  # aim for about this much time per path, shape and timing mode
    cuda: bool

    @staticmethod
    def for_machine(cuda: bool, quick: bool) -> "Plan":
        if cuda:
            return Plan(list(BENCHMARK_SHAPES), sweep_shapes(GPU_QUICK_EXPONENTS if quick else GPU_SWEEP_EXPONENTS),
                        reps=20 if quick else 100, min_reps=5 if quick else 10,
                        budget_s=0.25 if quick else 0.5, cuda=True)
        factor = 16 if quick else 8
        return Plan([scaled_down(s, factor) for s in BENCHMARK_SHAPES],
                    sweep_shapes(CPU_QUICK_EXPONENTS if quick else CPU_SWEEP_EXPONENTS),
                    reps=2 if quick else 3, min_reps=1, budget_s=0.2, cuda=False)

    def tasks(self) -> list[tuple[str, Shape]]:
        return [("benchmark", s) for s in self.benchmark] + [("sweep", s) for s in self.sweep]


def device_slug(caps: Capabilities | None = None) -> str:
    """File-name form of this device: "NVIDIA H200" -> "h200"; "cpu" without CUDA."""
    caps = caps or capabilities()
    if not caps.cuda:
        return "cpu"
    name = re.sub(r"^nvidia\s+", "", caps.name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


# ------------------------------------------------------------------------------ measuring


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _first_line(text: str, limit: int = 160) -> str:
    line = (str(text).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _reps_for(fn: Callable, plan: Plan) -> int:
    """As many calls as fit the time budget, between plan.min_reps and plan.reps."""
    start = time.perf_counter()
    fn()
    _sync(plan.cuda)
    per_call = max(time.perf_counter() - start, 1e-6)
    return max(plan.min_reps, min(plan.reps, int(plan.budget_s / per_call)))


def measure(path: BenchPath, data, plan: Plan) -> dict:
    """Check one path on `data` once, then time it both ways; a row of the CSV (without context)."""
    row: dict = {"status": "ok", "note": ""}
    try:
        fn = path.bind(data)
        poison_(data[6])
        result = check(fn(), data)
    except Exception as e:  # noqa: BLE001 - a path that raises is reported, the suite goes on
        return {"status": "error", "note": f"{type(e).__name__}: {_first_line(e)}"}
    row["max_abs_err"] = result.max_abs_err
    if not result.ok:  # still timed: a peer's accuracy is part of the comparison
        row.update(status="inexact", note=_first_line(result.message.replace("\n", "; "), 300))
    try:
        reps = _reps_for(fn, plan)
        warmup = min(10, reps)
        timings = {"kernel": time_kernel(fn, warmup=warmup, reps=reps),
                   "leaderboard": time_leaderboard(fn, warmup=warmup, reps=reps)}
    except Exception as e:  # noqa: BLE001
        return dict(row, status="error", note=f"while timing: {type(e).__name__}: {_first_line(e)}")
    for mode, t in timings.items():
        row.update({f"{mode}_us": t.median_us, f"{mode}_p10_us": t.p10_us, f"{mode}_p90_us": t.p90_us,
                    f"{mode}_reps": t.n})
    row["host_us"] = timings["leaderboard"].host_us
    if row["status"] == "inexact":
        return row
    if path.name == "peer-compiled" and peers.compile_note:
        row["note"] = peers.compile_note
    if path.describe is not None:
        try:
            row["note"] = _first_line(path.describe(data))
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


def _shape_text(row: dict) -> str:
    return f"{row['m']}x{row['k']}x{row['l']}"


def _add_bandwidth(row: dict, copy: float) -> None:
    for mode in ("kernel", "leaderboard"):
        us = row.get(f"{mode}_us")
        if us:
            row[f"{mode}_gbps"] = gbps(row["bytes"], us)
            row[f"{mode}_pct_of_copy"] = percent(row[f"{mode}_gbps"], copy)


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
    for name, why in skipped:
        say(f"skipped {name}: {why}")

    copy, reduction = copy_bandwidth_gbps(), reduction_bandwidth_gbps()
    say(f"ceilings: copy {copy:.0f} GB/s (read + write), reduction {reduction:.0f} GB/s (read)")
    env = environment_report()
    common = {"timing": "cuda-events" if caps.cuda else "wall", "copy_gbps": copy, "reduction_gbps": reduction,
              "device_slug": slug, "quick": quick, "date": datetime.date.today().isoformat(),
              **{f"env_{f}": env.get(f) for f in ENV_FIELDS}}
    cpu_note = "" if caps.cuda else CPU_NOTE
    rows = [dict(common, path="copy", kind="ceiling", label="device-to-device copy", shape_set="ceiling",
                 bytes=None, status="ok", kernel_gbps=copy, note="read + write counted"),
            dict(common, path="reduction", kind="ceiling", label="row-sum reduction", shape_set="ceiling",
                 bytes=None, status="ok", kernel_gbps=reduction, note="read counted")]
    rows += [dict(common, path=n, kind="peer" if n.startswith("peer-") else "nvfp4lib", label=n,
                  shape_set="-", status="skipped", note=why) for n, why in skipped]

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{slug}.csv"
    tasks = plan.tasks()
    bar = _Progress(len(tasks) * len(paths), enabled=progress)
    try:
        for shape_set, shape in tasks:
            data = generate_input(*shape, seed=seed, device=device)
            for path in paths:
                context = dict(common, path=path.name, kind=path.kind, label=path.label, shape_set=shape_set,
                               m=shape.m, k=shape.k, l=shape.l, bytes=bytes_moved(shape))
                row = dict(context, **measure(path, data, plan))
                if row["status"] == "ok":
                    _add_bandwidth(row, copy)
                    row["note"] = "; ".join(filter(None, [row["note"], cpu_note]))
                else:
                    bar.write(f"{row['status'].upper()} {path.name} {_shape_text(row)}: {row['note']}")
                rows.append(row)
                bar.step(f"{path.name} {_shape_text(row)}")
            del data
            write_csv(rows, csv_path)  # after every shape, so an interrupted run keeps what it measured
            if caps.cuda:  # give the next, possibly much larger, shape the memory back
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        bar.close()

    write_csv(rows, csv_path)
    say(summary_table(rows))
    say(f"wrote {csv_path}")
    if figures:
        target = figures_dir if figures_dir is not None else (None if caps.cuda else out_dir / "figures")
        for name, saved in save_figures(make_figures(rows), target).items():
            say(f"wrote {saved}")
    if not caps.cuda:
        say(CPU_NOTE)
    return csv_path


# ------------------------------------------------------------------------------ CSV


def _format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def write_csv(rows: list[dict], path: Path | str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _format_value(row.get(c)) for c in COLUMNS})


_INT_COLUMNS = {"m", "k", "l", "bytes", "kernel_reps", "leaderboard_reps"}
_TEXT_COLUMNS = {"path", "kind", "label", "shape_set", "status", "note", "timing", "device_slug", "date",
                 *(f"env_{f}" for f in ENV_FIELDS)}


def _parse(column: str, text: str):
    if text == "":
        return None
    if column in _TEXT_COLUMNS:
        return text
    if column == "quick":
        return text == "True"
    try:
        return int(text) if column in _INT_COLUMNS else float(text)
    except ValueError:
        return text


def load_results(path: Path | str) -> list[dict]:
    """The rows of a suite CSV with numbers as numbers and empty cells as None."""
    with open(path, newline="") as f:
        return [{c: _parse(c, v) for c, v in row.items()} for row in csv.DictReader(f)]


def find_results(slug: str | None = None) -> Path | None:
    """The best results CSV for a notebook: this device's `make bench` output, else a committed
    results/<device>.csv for it, else any committed results CSV; None if there is none.
    A CPU run's CSV is never chosen: its timings are not meaningful."""
    slug = slug or device_slug()
    candidates = []
    if slug != "cpu":
        candidates += [BENCH_DIR / f"{slug}.csv", RESULTS_DIR / f"{slug}.csv"]
    candidates += sorted(p for p in RESULTS_DIR.glob("*.csv") if p.stem != "cpu")
    return next((p for p in candidates if p.is_file()), None)


# ------------------------------------------------------------------------------ tables


def _ceiling(rows: list[dict], name: str) -> float | None:
    return next((r["kernel_gbps"] for r in rows if r.get("path") == name and r.get("kind") == "ceiling"), None)


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("kind") != "ceiling" and r.get("status") in ("ok", "inexact")]


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _format_table(header: list[str], body: list[list[str]]) -> str:
    """Text columns: the first two left-aligned (names), the rest right-aligned (numbers)."""
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, body)])


def summary_table(rows: list[dict], shape_sets: Iterable[str] = ("benchmark", "sweep")) -> str:
    """Time, GB/s, % of the copy ceiling and speed-up over each peer, per path and shape.

    GB/s and % of copy come from kernel time (what the memory system sustained); speed-ups from
    leaderboard time (what a score compares). The geomean over the benchmark shapes is the score."""
    timed = _timed(rows)
    copy = _ceiling(rows, "copy")
    peer_names = list(dict.fromkeys(r["path"] for r in timed if r["kind"] == "peer"))
    peer_time = {(r["path"], r["m"], r["k"], r["l"]): r["leaderboard_us"] for r in timed if r["kind"] == "peer"}
    header = ["path", "shape", "kernel us", "leaderboard us", "host us", "GB/s", "% copy",
              *(f"x {n.removeprefix('peer-')}" for n in peer_names)]
    out = []
    cpu = any(r.get("timing") == "wall" for r in timed)
    for shape_set in shape_sets:
        chosen = [r for r in timed if r["shape_set"] == shape_set]
        if not chosen:
            continue
        body = []
        for r in chosen:
            bw = gbps(r["bytes"], r["kernel_us"])
            speedups = []
            for n in peer_names:
                p = peer_time.get((n, r["m"], r["k"], r["l"]))
                speedups.append(_cell(p / r["leaderboard_us"] if p else None, ".2f"))
            body.append([r["path"], _shape_text(r), _cell(r["kernel_us"], ".1f"), _cell(r["leaderboard_us"], ".1f"),
                         _cell(r.get("host_us"), ".1f"), _cell(bw, ".0f"),
                         _cell(percent(bw, copy) if copy else None, ".1f"), *speedups])
        title = f"{shape_set} shapes" + (f" ({CPU_NOTE})" if cpu else "")
        out += [title, _format_table(header, body), ""]
        if shape_set == "benchmark":
            out += [geomean_table(chosen), ""]
    if copy:
        out.append(f"% copy: of the measured device-to-device copy, {copy:.0f} GB/s; "
                   "x <peer>: the peer's leaderboard time / this path's")
    return "\n".join(out).rstrip()


def overhead_table(rows: list[dict], l: int = 1) -> str:
    """Per path, from the sweep at batch count `l`: the time of the smallest call (mostly fixed
    cost: launch, host work, ramp-up), the bandwidth at the largest, and the size at which moving
    the data takes as long as that fixed cost. Well above that size, launch overhead stops mattering."""
    sweep = [r for r in _timed(rows) if r["shape_set"] == "sweep" and r["l"] == l]
    body = []
    for name in dict.fromkeys(r["path"] for r in sweep):
        mine = sorted((r for r in sweep if r["path"] == name), key=lambda r: r["bytes"])
        if len(mine) < 2:
            continue
        small, big = mine[0], mine[-1]
        bw = gbps(big["bytes"], big["kernel_us"])
        crossover = small["leaderboard_us"] * bw * 1e3  # bytes moved at bw during the fixed cost
        body.append([name, f"{small['bytes'] / 1e6:.3g} MB", f"{small['leaderboard_us']:.1f}",
                     f"{big['bytes'] / 1e6:.3g} MB", f"{bw:.0f}", f"{crossover / 1e6:.3g} MB"])
    if not body:
        return f"(no path has two or more sweep sizes at L = {l})"
    return _format_table(["path", "smallest", "leaderboard us", "largest", "GB/s (kernel)",
                          "fixed cost = data time at"], body)


def geomean_table(rows: list[dict]) -> str:
    """Geometric mean over the benchmark shapes (the leaderboard's score), per path with all shapes timed."""
    shapes = {(r["m"], r["k"], r["l"]) for r in rows}
    body = []
    for name in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == name]
        if len(mine) != len(shapes):
            continue
        geo = [math.exp(sum(math.log(r[f"{m}_us"]) for r in mine) / len(mine)) for m in ("kernel", "leaderboard")]
        body.append([name, f"{len(mine)} shapes", f"{geo[0]:.1f}", f"{geo[1]:.1f}"])
    return _format_table(["geomean", "over", "kernel us", "leaderboard us"], body)


# ------------------------------------------------------------------------------ figures

_PEER_GREYS = ("0.25", "0.5", "0.7", "0.85")


def _colors(timed: list[dict]) -> dict[str, object]:
    """One colour per path, the same in both figures: colours for nvfp4lib paths, greys for peers."""
    import matplotlib

    ours = list(dict.fromkeys(r["path"] for r in timed if r["kind"] != "peer"))
    theirs = list(dict.fromkeys(r["path"] for r in timed if r["kind"] == "peer"))
    palette = matplotlib.colormaps["tab10"]
    colors = {n: palette(i % 10) for i, n in enumerate(ours)}
    colors.update({n: _PEER_GREYS[i % len(_PEER_GREYS)] for i, n in enumerate(theirs)})
    return colors


def _device_title(rows: list[dict]) -> str:
    name = next((r["env_gpu"] for r in rows if r.get("env_gpu")), None) or "CPU"
    wall = any(r.get("timing") == "wall" for r in rows)
    return name + (f" ({CPU_NOTE})" if wall else "")


def _bytes_axis(ax) -> None:
    """Log axis of bytes, labelled in MB at the decades."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:g} MB"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def roofline_figure(rows: list[dict]):
    """Bytes per call against time per call (log-log), both timings, with the measured ceilings.

    The sweep is drawn as lines (solid L = 1, dashed L = 4), the benchmark shapes as stars. A path
    on the ceiling line moves its bytes at the speed of the device-to-device copy."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    timed = _timed(rows)
    colors = _colors(timed)
    labels = {r["path"]: r["label"] for r in timed}
    copy, reduction = _ceiling(rows, "copy"), _ceiling(rows, "reduction")
    batches = sorted({r["l"] for r in timed if r["shape_set"] == "sweep"})
    styles = dict(zip(batches, ("-", "--", ":", "-.")))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    sizes = [r["bytes"] for r in timed] or [1e6, 1e8]
    xs = [min(sizes) / 1.5, max(sizes) * 1.5]
    for ax, mode in zip(axes, ("kernel", "leaderboard")):
        for name, color in colors.items():
            mine = [r for r in timed if r["path"] == name]
            for l, style in styles.items():
                pts = sorted((r["bytes"], r[f"{mode}_us"]) for r in mine if r["shape_set"] == "sweep" and r["l"] == l)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=color, lw=1.3)
            bench = [(r["bytes"], r[f"{mode}_us"]) for r in mine if r["shape_set"] == "benchmark"]
            if bench:
                ax.plot(*zip(*bench), "*", ms=11, color=color, mec="black", mew=0.6)
        for bw, style in ((copy, "-"), (reduction, ":")):
            if bw:
                ax.plot(xs, [x / (bw * 1e3) for x in xs], style, color="black", lw=1.8, alpha=0.8)
        _bytes_axis(ax)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per call (A, B, scales, c)")
        ax.set_title("kernel time (calls back to back)" if mode == "kernel"
                     else "leaderboard time (each call on its own, host included)", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel("median time per call (us), L2 flushed")
    handles = [Line2D([], [], color=c, marker="o", ms=5, lw=2, label=labels[n]) for n, c in colors.items()]
    handles += [Line2D([], [], color="grey", ls=s, label=f"sweep, L = {l}") for l, s in styles.items()]
    handles.append(Line2D([], [], ls="", marker="*", ms=11, color="white", mec="black", label="benchmark shapes"))
    handles += [Line2D([], [], color="black", ls=s, lw=1.8, label=f"{t} ceiling, {bw:.0f} GB/s")
                for bw, s, t in ((copy, "-", "copy"), (reduction, ":", "reduction")) if bw]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(f"NVFP4 GEMV, time against bytes moved: {_device_title(rows)}", fontsize=11)
    fig.tight_layout()
    return fig


def bars_figure(rows: list[dict]):
    """Every path and peer at the benchmark shapes: leaderboard time as bars, kernel time as dots."""
    import matplotlib.pyplot as plt

    timed = [r for r in _timed(rows) if r["shape_set"] == "benchmark"]
    colors = _colors(timed)
    shapes = list(dict.fromkeys((r["m"], r["k"], r["l"]) for r in timed))
    names = list(colors)
    copy = _ceiling(rows, "copy")
    fig, ax = plt.subplots(figsize=(max(7, 1.2 + 0.45 * len(names) * max(1, len(shapes))), 5))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        mine = {(r["m"], r["k"], r["l"]): r for r in timed if r["path"] == name}
        xs = [i + (j - (len(names) - 1) / 2) * width for i, s in enumerate(shapes) if s in mine]
        got = [mine[s] for s in shapes if s in mine]
        peer = got[0]["kind"] == "peer"
        ax.bar(xs, [r["leaderboard_us"] for r in got], width, color=colors[name], edgecolor="black", lw=0.4,
               hatch="//" if peer else None, label=got[0]["label"])
        ax.plot(xs, [r["kernel_us"] for r in got], "o", color="black", ms=3)
    for i, s in enumerate(shapes):
        nbytes = bytes_moved(Shape(*s))
        if copy:
            ax.hlines(nbytes / (copy * 1e3), i - 0.45, i + 0.45, colors="black", lw=1.5)
        if Shape(*s) in B200_SPEED_OF_LIGHT_US:
            ax.hlines(B200_SPEED_OF_LIGHT_US[Shape(*s)], i - 0.45, i + 0.45, colors="tab:red", lw=1.2,
                      linestyles="--")
    ax.plot([], [], "o", color="black", ms=3, label="kernel time (dot)")
    ax.plot([], [], "-", color="black", label="bytes / measured copy bandwidth")
    if any(Shape(*s) in B200_SPEED_OF_LIGHT_US for s in shapes):
        ax.plot([], [], "--", color="tab:red", label="B200 speed of light")
    ax.set_xticks(range(len(shapes)),
                  [f"{m}x{k}x{l}\n{bytes_moved(Shape(m, k, l)) / 1e6:.1f} MB" for m, k, l in shapes])
    ax.set_yscale("log")
    ax.set_ylabel("median us per call (bars: leaderboard timing)")
    ax.set_title(f"All paths and peers at the benchmark shapes: {_device_title(rows)}", fontsize=11)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def make_figures(results) -> dict[str, object]:
    """The suite's figures from rows or a CSV path: {"00_roofline": fig, "00_benchmark_bars": fig}."""
    rows = load_results(results) if isinstance(results, (str, Path)) else list(results)
    return {"00_roofline": roofline_figure(rows), "00_benchmark_bars": bars_figure(rows)}


def save_figures(figures: dict, directory: Path | str | None = None) -> dict[str, Path]:
    """Save with nvfp4lib.plots.save_figure (the workbook's figures folder), or into `directory`."""
    import matplotlib.pyplot as plt

    from nvfp4lib.plots import DPI, save_figure

    saved = {}
    for name, fig in figures.items():
        if directory is None:
            saved[name] = save_figure(fig, name)
        else:
            Path(directory).mkdir(parents=True, exist_ok=True)
            saved[name] = Path(directory) / f"{name}.png"
            fig.savefig(saved[name], dpi=DPI, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
    return saved


# ------------------------------------------------------------------------------ command line


def _patterns(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [p for v in values for p in v.split(",") if p]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--out", type=Path, default=BENCH_DIR, help="folder for <device>.csv (default build/bench)")
    parser.add_argument("--only", nargs="+", metavar="PATH",
                        help="path names or globs, e.g. 'cute-*' peer-bf16 (see --list)")
    parser.add_argument("--figures-dir", type=Path, default=None,
                        help="where to save the figures (default: figures/ after a GPU run, <out>/figures on a CPU)")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the paths, which run here and why not")
    args = parser.parse_args(argv)

    paths, skipped = discover_paths()
    known = [p.name for p in paths] + [n for n, _ in skipped]
    if args.list:
        for p in paths:
            print(f"{p.name:<22} {p.label}")
        for name, why in skipped:
            print(f"{name:<22} not here: {why}")
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
            print(f"{r['status']}: {r['path']} {r['m']}x{r['k']}x{r['l']}: {r['note']}", file=sys.stderr)
    # A failure of the workbook's own paths at the leaderboard's shapes fails the run; peers
    # outside the tolerance, and rounding at sweep sizes beyond the leaderboard's K, are reported.
    bad = [r for r in rows if r["status"] == "error"
           or (r["status"] == "inexact" and r["kind"] == "nvfp4lib" and r["shape_set"] == "benchmark")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
