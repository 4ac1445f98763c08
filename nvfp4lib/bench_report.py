"""Benchmark results as files, tables and figures: the CSV that ``nvfp4lib.suite`` writes (one
row per path and shape, the environment in every row), the tables it prints, and the two figures
``00_roofline`` (bytes per call against time, with the measured ceiling) and ``00_benchmark_bars``
(all paths and peers at the benchmark shapes). Notebook 00 reads results through this module.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Iterable

from nvfp4lib.bench import cell_text, gbps, geomean, percent, text_table
from nvfp4lib.device import Capabilities, capabilities
from nvfp4lib.paths import BUILD_DIR, REPO_ROOT
from nvfp4lib.problem import B200_SPEED_OF_LIGHT_US, Shape, bytes_moved

BENCH_DIR = BUILD_DIR / "bench"
RESULTS_DIR = REPO_ROOT / "results"  # committed results of full runs, one CSV per device
FIGURE_NAMES = ("00_roofline", "00_benchmark_bars")
CPU_NOTE = "CPU: timings are not meaningful"

ENV_FIELDS = ("python", "platform", "torch", "cuda_runtime", "driver", "gpu", "sm", "fp4_gemm", "cute_dsl",
              "cute_arch", "nvfp4lib")
COLUMNS = (
    "path", "kind", "label", "shape_set", "m", "k", "l", "bytes", "status", "note",
    "kernel_us", "kernel_p10_us", "kernel_p90_us", "kernel_reps",
    "leaderboard_us", "leaderboard_p10_us", "leaderboard_p90_us", "leaderboard_reps", "host_us",
    "kernel_gbps", "leaderboard_gbps", "kernel_pct_of_copy", "leaderboard_pct_of_copy", "max_abs_err",
    "timing", "copy_gbps", "reduction_gbps", "device_slug", "quick", "date", "commit",
    *(f"env_{f}" for f in ENV_FIELDS),
)
"""CSV columns. status: ok | inexact (outside rtol = atol = 1e-3, still timed) | error (raised) | skipped (not on this device).
Ceiling rows have kind "ceiling", shape_set "ceiling" and only bytes and kernel_gbps filled."""


def device_slug(caps: Capabilities | None = None) -> str:
    """File-name form of this device: "NVIDIA H200" -> "h200"; "cpu" without CUDA."""
    caps = caps or capabilities()
    if not caps.cuda:
        return "cpu"
    name = re.sub(r"^nvidia\s+", "", caps.name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def shape_text(row: dict) -> str:
    return f"{row['m']}x{row['k']}x{row['l']}"


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
_TEXT_COLUMNS = {"path", "kind", "label", "shape_set", "status", "note", "timing", "device_slug", "date", "commit",
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
                speedups.append(cell_text(p / r["leaderboard_us"] if p else None, ".2f"))
            body.append([r["path"], shape_text(r), cell_text(r["kernel_us"], ".1f"), cell_text(r["leaderboard_us"], ".1f"),
                         cell_text(r.get("host_us"), ".1f"), cell_text(bw, ".0f"),
                         cell_text(percent(bw, copy) if copy else None, ".1f"), *speedups])
        title = f"{shape_set} shapes" + (f" ({CPU_NOTE})" if cpu else "")
        out += [title, text_table(header, body), ""]
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
    return text_table(["path", "smallest", "leaderboard us", "largest", "GB/s (kernel)",
                          "fixed cost = data time at"], body)


def geomean_table(rows: list[dict]) -> str:
    """Geometric mean over the benchmark shapes (the leaderboard's score), per path with all shapes timed."""
    shapes = {(r["m"], r["k"], r["l"]) for r in rows}
    body = []
    for name in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == name]
        if len(mine) != len(shapes):
            continue
        geo = [geomean(r[f"{m}_us"] for r in mine) for m in ("kernel", "leaderboard")]
        body.append([name, f"{len(mine)} shapes", f"{geo[0]:.1f}", f"{geo[1]:.1f}"])
    return text_table(["geomean", "over", "kernel us", "leaderboard us"], body)


# ------------------------------------------------------------------------------ figures


def _colors(timed: list[dict]) -> dict[str, str]:
    """The paths drawn, nvfp4lib's before the peers, each with its colour from
    nvfp4lib.plots.path_color: the same in every figure and on every machine (peers are greys)."""
    from nvfp4lib.plots import path_color

    ours = [r["path"] for r in timed if r["kind"] != "peer"]
    theirs = [r["path"] for r in timed if r["kind"] == "peer"]
    return {n: path_color(n) for n in dict.fromkeys(ours + theirs)}


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
