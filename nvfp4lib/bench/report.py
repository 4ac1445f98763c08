"""Benchmark results as files, tables and figures: the CSV that ``nvfp4lib.bench.suite`` writes (one
row per path and shape, the environment in every row), the tables it prints, and the two figures
``00_roofline`` (bytes per call against time, with the measured ceiling) and ``00_benchmark_bars``
(all paths and peers at the benchmark shapes). Notebook 00 reads results through this module.

Three time measures (nvfp4lib.bench.timing), each labelled by its own name: kernel time (median, calls
back to back), leaderboard time (the mean, timed as the public harness does: its flush keeps the
GPU busy, so host cost is hidden) and host-visible time (median, the GPU idle at each call, host
cost included). The ceiling of a path is the best streaming read of exactly its bytes
(nvfp4lib.bench.ceilings) where the results have one, else the device-to-device copy bandwidth; every
table and figure says which. A score (a speed-up, the bars of the figure) compares leaderboard time.
"""

from __future__ import annotations

import csv
import datetime
import re
from pathlib import Path
from typing import Collection, Iterable, Sequence

from nvfp4lib.bench.ceilings import READ_MEASURES, CeilingIndex, bandwidth_ceiling, best_reads, ceiling_index, read_rows
from nvfp4lib.bench.timing import MEASURES, STATISTIC, cell_text, gbps, geomean, text_table, time_column
from nvfp4lib.contract import Shape
from nvfp4lib.device import Capabilities, capabilities, environment_report
from nvfp4lib.locations import BUILD_DIR, REPO_ROOT, RESULTS_DIR, checkout_commit
from nvfp4lib.problem import B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, bytes_moved

BENCH_DIR = BUILD_DIR / "bench"
CPU_NOTE = "CPU: timings are not meaningful"

ENV_FIELDS = ("python", "platform", "torch", "cuda_runtime", "driver", "gpu", "sm", "fp4_gemm", "cute_dsl",
              "cute_arch", "nvfp4lib")
COLUMNS = (
    "path", "kind", "label", "shape_set", "m", "k", "l", "bytes", "status", "note", "flush",
    "kernel_us", "kernel_p10_us", "kernel_p90_us", "kernel_reps",
    "leaderboard_us", "leaderboard_p10_us", "leaderboard_p90_us", "leaderboard_reps", "leaderboard_std_us",
    "leaderboard_err_us", "leaderboard_median_us",
    "host_visible_us", "host_visible_p10_us", "host_visible_p90_us", "host_visible_reps", "host_us",
    "kernel_gbps", "leaderboard_gbps", "kernel_pct_of_copy", "leaderboard_pct_of_copy",
    "kernel_pct_of_read", "leaderboard_pct_of_read", "max_abs_err",
    "timing", "copy_gbps", "reduction_gbps", "device_slug", "quick", "date", "commit",
    *(f"env_{f}" for f in ENV_FIELDS),
)
"""CSV columns; the timing ones are `harness.timing_fields`'s. kernel_us and host_visible_us are medians,
leaderboard_us the mean (as the leaderboard reports it) with its std, standard error and median
(leaderboard_median_us); host_us is the CPU time inside a call. *_pct_of_read: the best streaming read
of the same bytes after the same flush, as a percentage of the row's time by that measure. status: ok | inexact (outside reference.TOLERANCE,
still timed) | error (raised) | skipped (not on this device). Ceiling rows have kind "ceiling": "copy"
and "reduction" (shape_set "ceiling", only kernel_gbps filled) and the streaming reads "read-<name>" and
"read-<name>-clean" of nvfp4lib.bench.ceilings (timed like a path; flush "dirty" or "clean")."""



def device_slug(caps: Capabilities | None = None) -> str:
    """File-name form of this device: "NVIDIA H200" -> "h200"; "cpu" without CUDA."""
    caps = caps or capabilities()
    if not caps.cuda:
        return "cpu"
    name = re.sub(r"^nvidia\s+", "", caps.name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def context_fields(caps: Capabilities, quick: bool) -> dict:
    """The columns every row of a benchmark CSV repeats: how it was timed, where, when, what code."""
    env = environment_report()
    return {"timing": "cuda-events" if caps.cuda else "wall", "device_slug": device_slug(caps), "quick": quick,
            "date": datetime.date.today().isoformat(), "commit": checkout_commit(),
            **{f"env_{f}": env.get(f) for f in ENV_FIELDS}}


def shape_text(row: dict) -> str:
    return f"{row['m']}x{row['k']}x{row['l']}"


# ------------------------------------------------------------------------------ CSV


def _format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def write_csv(rows: list[dict], path: Path | str, columns: Sequence[str] = COLUMNS) -> None:
    """`rows` as a CSV of `columns` (default the benchmark schema; other keys are left out), empty cells
    for None, floats to 4 significant digits below 1 and to 2 decimals above."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _format_value(row.get(c)) for c in columns})


_INT_COLUMNS = {"m", "k", "l", "bytes", "kernel_reps", "leaderboard_reps", "host_visible_reps"}
_TEXT_COLUMNS = {"path", "kind", "label", "shape_set", "status", "note", "flush", "timing", "device_slug", "date",
                 "commit", *(f"env_{f}" for f in ENV_FIELDS)}


def _parse(column: str, text: str, int_columns: Collection[str], text_columns: Collection[str]):
    if text == "":
        return None
    if column in text_columns:
        return text
    if column == "quick":
        return text == "True"
    try:
        return int(text) if column in int_columns else float(text)
    except ValueError:
        return text


def load_results(path: Path | str, *, int_columns: Collection[str] = _INT_COLUMNS,
                 text_columns: Collection[str] = _TEXT_COLUMNS) -> list[dict]:
    """The rows of a suite CSV (`COLUMNS`) with numbers as numbers and empty cells as None; a CSV of
    another schema (`write_csv` with its columns) names its integer and its text columns, every other
    column is read as a float where it is one."""
    with open(path, newline="") as f:
        return [{c: _parse(c, v, int_columns, text_columns) for c, v in row.items()} for row in csv.DictReader(f)]


PROFILE_SUFFIX = "_profile"  # results/<device>_profile.csv: Nsight Compute counters (bench.profile), another schema


def committed_results() -> list[Path]:
    """The committed CSVs in the benchmark schema (`COLUMNS`): results/*.csv but the profiles."""
    return sorted(p for p in RESULTS_DIR.glob("*.csv") if not p.stem.endswith(PROFILE_SUFFIX))


def is_device_run(path: Path, suffix: str = "") -> bool:
    """Whether `path` is results/<device><suffix>.csv (a `device_slug`): one device's whole run (`make bench`;
    `make profile` with PROFILE_SUFFIX), not the CSV of one experiment beside it (results/<device>_<what>.csv),
    which a notebook must never take for the whole run."""
    device = path.stem[:len(path.stem) - len(suffix)]
    return path.stem.endswith(suffix) and re.fullmatch(r"[a-z0-9-]+", device) is not None


def find_results(slug: str | None = None) -> Path | None:
    """The best results CSV for a notebook: this device's `make bench` output, else a committed
    results/<device>.csv for it, else another device's (`is_device_run`); None if there is none.
    A CPU run's CSV is never chosen: its timings are not meaningful."""
    slug = slug or device_slug()
    candidates = []
    if slug != "cpu":
        candidates += [BENCH_DIR / f"{slug}.csv", RESULTS_DIR / f"{slug}.csv"]
    candidates += [p for p in committed_results() if is_device_run(p) and p.stem != "cpu"]
    return next((p for p in candidates if p.is_file()), None)


def measured_run(rows: list[dict]) -> dict[str, str]:
    """The run that measured `rows`, from their own columns (never from this checkout): device, date,
    commit and torch, as figures/INDEX.md records a figure drawn from them."""
    def first(column: str, missing: str) -> str:
        return next((str(r[column]) for r in rows if r.get(column)), missing)

    device = first("env_gpu", "CPU" if any(r.get("timing") == "wall" for r in rows) else "unknown device")
    return {"device": device, "date": first("date", "undated"), "commit": first("commit", "unknown"),
            "torch": first("env_torch", "unknown")}


def run_text(rows: list[dict]) -> str:
    """`measured_run` in words: "NVIDIA H200, 2026-12-01, commit 8ecbe5c, torch 2.11.0+cu130"."""
    run = measured_run(rows)
    return f"{run['device']}, {run['date']}, commit {run['commit']}, torch {run['torch']}"


def results_source(path: Path | str, rows: list[dict]) -> str:
    """Where recorded rows were measured, to print with every number taken from them: the file
    (relative to the checkout), the device, the date, the commit and the torch of the run."""
    path = Path(path)
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    return f"{shown}: {run_text(rows)}"


# ------------------------------------------------------------------------------ measures and ceilings

SCORE_MEASURE = "leaderboard"  # what a score compares: leaderboard time, the public harness's figure


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("kind") != "ceiling" and r.get("status") in ("ok", "inexact")]


def benchmark_rows(rows: list[dict], path: str) -> dict[Shape, dict]:
    """{shape: row} of path `path` at the benchmark shapes, where it ran (checked: ok or inexact)."""
    return {Shape(r["m"], r["k"], r["l"]): r for r in _timed(rows)
            if r["path"] == path and r["shape_set"] == "benchmark"}


def measures_in(rows: list[dict]) -> list[str]:
    """The measures (timing.MEASURES, in that order) that some timed path of `rows` has a time for."""
    timed = _timed(rows)
    return [m for m in MEASURES if any(r.get(time_column(m)) is not None for r in timed)]


def ceiling_note(rows: list[dict]) -> str:
    """Which ceiling the tables and figures of `rows` hold the paths against, in words."""
    if read_rows(rows):
        return "ceiling: the best streaming read of the same bytes after the same flush (nvfp4lib.bench.ceilings)"
    copy = bandwidth_ceiling(rows, "copy")
    return ("ceiling: the device-to-device copy" + (f", {copy:.0f} GB/s" if copy else " (not in these results)")
            + "; these results have no streaming reads")


def percent_of_ceiling(row: dict, rows: list[dict] | CeilingIndex) -> float | None:
    """A path's kernel time against its ceiling: where `rows` have streaming reads, the best read of
    the row's bytes after its flush as a percentage of the row's kernel time; else the row's
    bandwidth as a percentage of the copy's. None where neither exists. For many rows, pass
    `ceiling_index(rows)`: the ceilings are then found once (`ceilings.CeilingIndex.percent_of_ceiling`)."""
    return ceiling_index(rows).percent_of_ceiling(row)


# ------------------------------------------------------------------------------ tables


def _path_text(row: dict) -> str:
    return row["path"] + (" (clean flush)" if row.get("flush") == "clean" else "")


def summary_table(rows: list[dict], shape_sets: Iterable[str] = ("benchmark", "sweep")) -> str:
    """Per path and shape: the time by each measure, the host time inside a call, GB/s and % of the
    ceiling, and the speed-up over each peer.

    GB/s and % of the ceiling come from kernel time (what the memory system sustained); speed-ups
    from leaderboard time (what a score compares). The geomean over the benchmark shapes is the
    score. The notes under the tables name the ceiling."""
    timed = _timed(rows)
    measures, score = measures_in(rows), time_column(SCORE_MEASURE)
    held_against = ceiling_index(rows)
    reads = held_against.has_reads
    peer_names = list(dict.fromkeys(r["path"] for r in timed if r["kind"] == "peer"))
    peer_time = {(r["path"], r["m"], r["k"], r["l"]): r.get(score) for r in timed if r["kind"] == "peer"}
    header = ["path", "shape", *(f"{m} us" for m in measures), "host us", "GB/s", "% read" if reads else "% copy",
              *(f"x {n.removeprefix('peer_')}" for n in peer_names)]
    out = []
    cpu = any(r.get("timing") == "wall" for r in timed)
    for shape_set in shape_sets:
        chosen = [r for r in timed if r["shape_set"] == shape_set]
        if not chosen:
            continue
        body = []
        for r in chosen:
            speedups = []
            for n in peer_names:
                p = peer_time.get((n, r["m"], r["k"], r["l"]))
                speedups.append(cell_text(p / r[score] if p and r.get(score) else None, ".2f"))
            body.append([_path_text(r), shape_text(r), *(cell_text(r.get(time_column(m)), ".1f") for m in measures),
                         cell_text(r.get("host_us"), ".1f"), cell_text(gbps(r["bytes"], r["kernel_us"]), ".0f"),
                         cell_text(held_against.percent_of_ceiling(r), ".1f"), *speedups])
        title = f"{shape_set} shapes" + (f" ({CPU_NOTE})" if cpu else "")
        out += [title, text_table(header, body), ""]
        if shape_set == "benchmark":
            out += [geomean_table(chosen), ""]
    if out:
        out.append("us per call: " + ", ".join(f"{m} the {STATISTIC[m]}" for m in measures)
                   + (f"; x <peer>: the peer's {SCORE_MEASURE} time / this path's" if peer_names else ""))
        copy = held_against.copy_gbps
        if reads:
            out.append("% read: the best streaming read of the same bytes after the same flush (nvfp4lib.bench.ceilings), "
                       "as a percentage of the path's time, both by kernel time")
        elif copy:
            out.append(f"% copy: of the measured device-to-device copy, {copy:.0f} GB/s "
                       "(these results have no streaming reads)")
    return "\n".join(out).rstrip()


def overhead_table(rows: list[dict], l: int = 1) -> str:
    """Per path, from the sweep at batch count `l`: the time of the smallest call by each measure
    (mostly fixed cost), the bandwidth at the largest (kernel time), and the size at which moving
    the data at that bandwidth takes as long as the fixed cost. Well above that size the fixed cost
    stops mattering. Under kernel and leaderboard time the fixed cost is the GPU's (launch,
    first loads, tail: the host's cost is hidden); under host-visible time the host's work counts too."""
    sweep = [r for r in _timed(rows) if r["shape_set"] == "sweep" and r["l"] == l]
    measures = measures_in(rows)
    body = []
    for name in dict.fromkeys(r["path"] for r in sweep):
        mine = sorted((r for r in sweep if r["path"] == name), key=lambda r: r["bytes"])
        if len(mine) < 2:
            continue
        small, big = mine[0], mine[-1]
        bw = gbps(big["bytes"], big["kernel_us"])
        fixed = [small.get(time_column(m)) for m in measures]
        body.append([name, f"{small['bytes'] / 1e6:.3g} MB", *(cell_text(t, ".1f") for t in fixed),
                     f"{big['bytes'] / 1e6:.3g} MB", f"{bw:.0f}",
                     *("-" if t is None else f"{t * bw * 1e3 / 1e6:.3g} MB" for t in fixed)])  # bytes moved at bw in t
    if not body:
        return f"(no path has two or more sweep sizes at L = {l})"
    return text_table(["path", "smallest", *(f"{m} us" for m in measures), "largest", "GB/s (kernel)",
                       *(f"break-even, {m}" for m in measures)], body)


def geomean_table(rows: list[dict]) -> str:
    """Geometric mean over the benchmark shapes (the leaderboard's score), per measure, per path
    with all shapes timed."""
    shapes = {(r["m"], r["k"], r["l"]) for r in rows}
    measures = measures_in(rows)
    body = []
    for name in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == name]
        if len(mine) != len(shapes):
            continue
        times = [[r.get(time_column(m)) for r in mine] for m in measures]
        body.append([name, f"{len(mine)} shapes",
                     *(cell_text(geomean(t) if None not in t else None, ".1f") for t in times)])
    return text_table(["geomean", "over", *(f"{m} us" for m in measures)], body)


# ------------------------------------------------------------------------------ figures


def _colors(timed: list[dict]) -> dict[str, str]:
    """The paths drawn, nvfp4lib's before the peers, each with its colour from
    nvfp4lib.bench.plots.path_color: the same in every figure and on every machine (peers are greys)."""
    from nvfp4lib.bench.plots import path_color

    ours = [r["path"] for r in timed if r["kind"] != "peer"]
    theirs = [r["path"] for r in timed if r["kind"] == "peer"]
    return {n: path_color(n) for n in dict.fromkeys(ours + theirs)}


def _run_title(rows: list[dict], source: str | None) -> str:
    """What a figure's title says of its numbers: their file, device, date and commit (`source`, else
    `run_text`), and on a CPU that its timings are not meaningful."""
    wall = any(r.get("timing") == "wall" for r in rows)
    return (source or run_text(rows)) + (f" ({CPU_NOTE})" if wall else "")


def _bytes_axis(ax) -> None:
    """Log axis of bytes, labelled in MB at the decades."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:g} MB"))
    ax.xaxis.set_minor_formatter(NullFormatter())


_PANEL_TITLES = {"kernel": "kernel time: median, calls back to back",
                 "leaderboard": "leaderboard time: mean, timed as the public harness does (host cost hidden)",
                 "host-visible": "host-visible time: median, the GPU idle at each call (host cost counts)"}


def _best_read_points(rows: list[dict], measure: str) -> list[tuple[int, float]]:
    """(bytes, time) of the best streaming read at each shape, by `measure` (the reads are timed by
    kernel and leaderboard time only); empty without reads."""
    if measure not in READ_MEASURES:
        return []
    column = time_column(measure)
    return sorted((r["bytes"], r[column]) for r in best_reads(rows, measure_name=measure).values())


def roofline_figure(rows: list[dict], source: str | None = None):
    """Bytes per call against time per call (log-log), a panel per measure, with the ceilings; the
    title names where the numbers come from (`source`, see `make_figures`).

    The sweep is drawn as lines (solid L = 1, dashed L = 4), the benchmark shapes as stars. The
    ceiling is the best streaming read of the same bytes where the results have reads (a dashed
    black line through the reads), else the copy bandwidth; the copy and reduction lines are drawn
    for scale either way."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    timed = _timed(rows)
    colors = _colors(timed)
    labels = {r["path"]: r["label"] for r in timed}
    copy, reduction = bandwidth_ceiling(rows, "copy"), bandwidth_ceiling(rows, "reduction")
    batches = sorted({r["l"] for r in timed if r["shape_set"] == "sweep"})
    styles = dict(zip(batches, ("-", "--", ":", "-.")))
    measures = measures_in(rows) or ["kernel"]
    fig, axes = plt.subplots(1, len(measures), figsize=(5.2 * len(measures) + 1.5, 5), sharey=True, squeeze=False)
    axes = axes[0]
    sizes = [r["bytes"] for r in timed] or [1e6, 1e8]
    xs = [min(sizes) / 1.5, max(sizes) * 1.5]
    any_reads = False
    for ax, mode in zip(axes, measures):
        column = time_column(mode)
        for name, color in colors.items():
            mine = [r for r in timed if r["path"] == name and r.get(column) is not None]
            for l, style in styles.items():
                pts = sorted((r["bytes"], r[column]) for r in mine if r["shape_set"] == "sweep" and r["l"] == l)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=color, lw=1.3)
            bench = [(r["bytes"], r[column]) for r in mine if r["shape_set"] == "benchmark"]
            if bench:
                ax.plot(*zip(*bench), "*", ms=11, color=color, mec="black", mew=0.6)
        for bw, style in ((copy, "-"), (reduction, ":")):
            if bw:
                ax.plot(xs, [x / (bw * 1e3) for x in xs], style, color="black", lw=1.8, alpha=0.8)
        reads = _best_read_points(rows, mode)
        if reads:
            any_reads = True
            ax.plot(*zip(*reads), "--", marker="x", ms=5, color="black", lw=1.5)
        _bytes_axis(ax)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per call (A, B, scales, c)")
        ax.set_title(_PANEL_TITLES[mode], fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel("time per call (us), L2 flushed")
    handles = [Line2D([], [], color=c, marker="o", ms=5, lw=2, label=labels[n]) for n, c in colors.items()]
    handles += [Line2D([], [], color="grey", ls=s, label=f"sweep, L = {l}") for l, s in styles.items()]
    handles.append(Line2D([], [], ls="", marker="*", ms=11, color="white", mec="black", label="benchmark shapes"))
    if any_reads:
        handles.append(Line2D([], [], color="black", ls="--", marker="x", lw=1.5,
                              label="ceiling: best streaming read of the same bytes"))
    handles += [Line2D([], [], color="black", ls=s, lw=1.8, label=f"{t}, {bw:.0f} GB/s (2 GiB)")
                for bw, s, t in ((copy, "-", "copy" if any_reads else "ceiling: copy"), (reduction, ":", "reduction"))
                if bw]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(f"NVFP4 GEMV, time against bytes moved\n{_run_title(rows, source)}\n{ceiling_note(rows)}",
                 fontsize=10)
    fig.tight_layout()
    return fig


LEGEND_WIDTH_IN = 3.6  # inches the legend right of a figure's axes takes
SHAPE_LABEL_WIDTH_IN = 1.1  # inches a benchmark shape's two-line tick label needs ("7168x16384x1", "66.1 MB")


def bars_figure(rows: list[dict], source: str | None = None):
    """Every path and peer at the benchmark shapes (on a CPU, at their scaled-down stand-ins, which the
    title says): leaderboard time as bars, kernel time as dots, host-visible time as crosses, and per
    shape the ceiling; the title names where the numbers come from (`source`, see `make_figures`)."""
    import matplotlib.pyplot as plt

    timed = [r for r in _timed(rows) if r["shape_set"] == "benchmark"]
    colors = _colors(timed)
    shapes = list(dict.fromkeys((r["m"], r["k"], r["l"]) for r in timed))
    names = list(colors)
    scaled_down = any(Shape(*s) not in BENCHMARK_SHAPES for s in shapes)  # a CPU run's stand-ins
    copy = bandwidth_ceiling(rows, "copy")
    score = SCORE_MEASURE
    column = time_column(score)
    crosses = "host-visible" in measures_in(rows)
    reads = {(r["m"], r["k"], r["l"]): r[column] for r in best_reads(rows, measure_name=score).values()}
    axes_width = max(4.0, 1.2 + max(1, len(shapes)) * max(SHAPE_LABEL_WIDTH_IN, 0.45 * len(names)))
    fig, ax = plt.subplots(figsize=(axes_width + LEGEND_WIDTH_IN, 5))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        mine = {(r["m"], r["k"], r["l"]): r for r in timed if r["path"] == name and r.get(column) is not None}
        xs = [i + (j - (len(names) - 1) / 2) * width for i, s in enumerate(shapes) if s in mine]
        got = [mine[s] for s in shapes if s in mine]
        if not got:
            continue
        peer = got[0]["kind"] == "peer"
        ax.bar(xs, [r[column] for r in got], width, color=colors[name], edgecolor="black", lw=0.4,
               hatch="//" if peer else None, label=got[0]["label"])
        ax.plot(xs, [r["kernel_us"] for r in got], "o", color="black", ms=3)
        if crosses:
            ax.plot(xs, [r.get("host_visible_us") for r in got], "x", color="black", ms=4)
    for i, s in enumerate(shapes):
        if s in reads:
            ax.hlines(reads[s], i - 0.45, i + 0.45, colors="black", lw=1.5, linestyles="--")
        elif copy:
            ax.hlines(bytes_moved(Shape(*s)) / (copy * 1e3), i - 0.45, i + 0.45, colors="black", lw=1.5)
        if Shape(*s) in B200_SPEED_OF_LIGHT_US:
            ax.hlines(B200_SPEED_OF_LIGHT_US[Shape(*s)], i - 0.45, i + 0.45, colors="tab:red", lw=1.2,
                      linestyles="--")
    ax.plot([], [], "o", color="black", ms=3, label="kernel time (dot)")
    if crosses:
        ax.plot([], [], "x", color="black", ms=4, label="host-visible time (cross)")
    if reads:
        ax.plot([], [], "--", color="black", label=f"best streaming read of the same bytes ({score} time)")
    if copy and len(reads) < len(shapes):
        ax.plot([], [], "-", color="black", label="bytes / measured copy bandwidth")
    if any(Shape(*s) in B200_SPEED_OF_LIGHT_US for s in shapes):
        ax.plot([], [], "--", color="tab:red", label="B200 speed of light")
    ax.set_xticks(range(len(shapes)),
                  [f"{m}x{k}x{l}\n{bytes_moved(Shape(m, k, l)) / 1e6:.1f} MB" for m, k, l in shapes])
    ax.set_yscale("log")
    ax.set_ylabel(f"us per call (bars: {score} time, {STATISTIC[score]})")
    where = ("scaled-down stand-ins for the benchmark shapes (M and K cut to run on a CPU)" if scaled_down
             else "the benchmark shapes")
    ax.set_title(f"All paths and peers at {where}\n{_run_title(rows, source)}\n{ceiling_note(rows)}", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def make_figures(results, source: str | None = None) -> dict[str, object]:
    """The suite's figures from rows or a CSV path, by figure name: "00_roofline", "00_benchmark_bars".
    Their titles name where the numbers come from: `source` if given, else the file (`results_source`),
    else the run of the rows' own columns (`run_text`)."""
    if isinstance(results, (str, Path)):
        rows = load_results(results)
        source = source or results_source(results, rows)
    else:
        rows = list(results)
    return {"00_roofline": roofline_figure(rows, source), "00_benchmark_bars": bars_figure(rows, source)}


def save_figures(figures: dict, directory: Path | str | None = None) -> dict[str, Path]:
    """Save with nvfp4lib.bench.plots.save_figure (the workbook's figures folder), or into `directory`."""
    import matplotlib.pyplot as plt

    from nvfp4lib.bench.plots import DPI, save_figure

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
