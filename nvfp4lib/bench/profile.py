"""Hardware counters of the CuTe kernels: ``python -m nvfp4lib.bench.profile`` (``make profile``).

Runs Nsight Compute over the default kernel and every version of notebook 04's progression, plus the
per-K kernels, at the three benchmark shapes, and writes one CSV, results/<device>_profile.csv. One
``ncu`` process profiles a child Python process (``--child``) that calls each (kernel, shape) once, in a
fixed order, and writes what it launched to a manifest; ncu's CSV (one line per launch and metric,
documented format: "ID", ..., "Kernel Name", ..., "Metric Name", "Metric Unit", "Metric Value") is read
with the csv module (`parse_ncu_csv`) and joined to the manifest by launch order. Clocks are left
alone (``--clock-control none``). ncu flushes the caches before each replay pass, so the counters are
those of a kernel that starts with a clean L2: DRAM bytes written are the kernel's own output plus
nothing of a flush (the leaderboard's dirty write-back is measured by the timings, not here).

Columns: DRAM bytes read and written, DRAM throughput (% of peak), L2 hit rate, L2 write-back bytes
(DRAM writes), achieved occupancy, issue-slot utilisation, warp instructions executed x 32 per 16-byte
chunk of A (comparable with the static SASS counts per chunk of docs/cute_kernel_notes.md), and the three
largest warp stall reasons with their share of all stalls. `find_profile` finds the CSV for a notebook,
`load_profile` reads it back and `where_time_goes` says in one line what a row shows.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nvfp4lib.bench.report import (PROFILE_SUFFIX, context_fields, device_slug, is_device_run, load_results,
                                   write_csv)
from nvfp4lib.device import capabilities
from nvfp4lib.locations import RESULTS_DIR
from nvfp4lib.problem import BENCHMARK_SHAPES, Shape

PROGRESSION = ("naive", "1x4x1-bitops", "1x4x2-bitops", "4x4x2x4-bitops", "4x4x2x4-perm-bitops", "4x4x2x4-lut",
               "4x4x2x4-lut-reg", "8x4x1x4-lut-reg", "t32x8x2-reg", "default", "4x4x2x4-lut-reg-pf1", "4x4x2x4-loads",
               "t32x8x2-loads")
"""Notebook 04's progression (its STEPS, imported from here), as `cute_bench.variants` takes them
("naive" first: the naive kernel)."""
PER_K = ("w2x4x1", "w1x4x1", "w2x8x1", "w2x2x1", "w2x4x1-bitops", "w2x4x1-loads")
"""The per-K kernels (nvfp4lib.cute.whole_k) docs/cute_kernel_notes.md predicts."""
CONFIGS = PROGRESSION + PER_K

KERNEL_REGEX = "regex:^kernel_cutlass_kernel"  # every CuTe DSL kernel of the package, none of PyTorch's
STALL_REGEX = r"regex:^smsp__warp_issue_stalled_[a-z_]+_per_warp_active\.pct$"
METRICS = {  # column -> ncu metric
    "duration_us": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct_of_peak": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warp_instructions": "smsp__inst_executed.sum",
}
STALL_PREFIX, STALL_SUFFIX = "smsp__warp_issue_stalled_", "_per_warp_active.pct"
COLUMNS = ("config", "kernel", "m", "k", "l", "status", "note", "duration_us", "dram_read_bytes", "dram_write_bytes",
           "dram_pct_of_peak", "l2_hit_pct", "l2_writeback_bytes", "occupancy_pct", "issue_active_pct",
           "warp_instructions", "inst_per_chunk", "stall_1", "stall_1_share", "stall_2", "stall_2_share", "stall_3",
           "stall_3_share", "device", "date", "commit")
INT_COLUMNS = ("m", "k", "l")
TEXT_COLUMNS = ("config", "kernel", "status", "note", "stall_1", "stall_2", "stall_3", "device", "date", "commit")
UNITS = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
"""Metric units -> the factor to the CSV's (bytes, microseconds); other units (%, inst, ratio) stay as they are."""
NOTHING = "needs ncu and a CUDA GPU; nothing profiled"


# ---------------------------------------------------------------------------------------------
# ncu's CSV


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu ``--csv`` output (the details page: one line per launch and metric; lines before the header,
    e.g. ==PROF== messages or the program's output, are skipped) -> one dict per launch, in ID order:
    {"id", "kernel", "metrics": {metric name: value in bytes / microseconds / as printed}}."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("ncu output: no CSV header (a line starting with \"ID\")")
    rows = csv.DictReader(line for line in lines[start:] if not line.startswith("=="))
    launches: dict[int, dict] = {}
    for row in rows:
        launch_id = _number(row.get("ID"))
        if launch_id is None or not row.get("Metric Name"):
            continue
        launch = launches.setdefault(int(launch_id), {"id": int(launch_id), "kernel": row.get("Kernel Name", ""),
                                                      "metrics": {}})
        value = _number(row.get("Metric Value"))
        if value is not None:
            value *= UNITS.get((row.get("Metric Unit") or "").strip().lower(), 1.0)
        launch["metrics"][row["Metric Name"]] = value
    return [launches[i] for i in sorted(launches)]


def top_stalls(metrics: dict, n: int = 3) -> list[tuple[str, float]]:
    """The n largest warp stall reasons as (reason, share of all stall reasons), largest first."""
    stalls = {name[len(STALL_PREFIX):-len(STALL_SUFFIX)]: value for name, value in metrics.items()
              if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX) and value is not None}
    total = sum(stalls.values())
    ranked = sorted(stalls.items(), key=lambda item: -item[1])[:n]
    return [(reason, value / total if total else float("nan")) for reason, value in ranked]


def profile_row(entry: dict, launch: dict | None) -> dict:
    """One CSV row from a manifest entry (what the child launched) and its ncu launch (None: no counters)."""
    row = {key: entry.get(key) for key in ("config", "kernel", "m", "k", "l", "status", "note")}
    if launch is None:
        return row
    metrics = launch["metrics"]
    row.update({column: metrics.get(name) for column, name in METRICS.items()})
    row["l2_writeback_bytes"] = row["dram_write_bytes"]
    if row["warp_instructions"] is not None:
        chunks = entry["m"] * entry["k"] * entry["l"] / 32  # 16-byte chunks of A
        row["inst_per_chunk"] = row["warp_instructions"] * 32 / chunks
    for i, (reason, share) in enumerate(top_stalls(metrics), 1):
        row[f"stall_{i}"], row[f"stall_{i}_share"] = reason, share
    return row


def join(manifest: list[dict], launches: list[dict]) -> list[dict]:
    """Manifest entries and ncu launches by order: the i-th launched entry is the i-th profiled launch."""
    launched = iter(launches)
    rows = []
    for entry in manifest:
        launch = next(launched, None) if entry["status"] == "ok" else None
        if entry["status"] == "ok" and launch is None:
            entry = dict(entry, status="error", note="ncu reported no counters for this launch")
        rows.append(profile_row(entry, launch))
    return rows


# ---------------------------------------------------------------------------------------------
# Reading the CSV back


def load_profile(path) -> list[dict]:
    """The rows of a profile CSV, numbers as numbers (m, k, l as int), empty cells as None."""
    return load_results(path, int_columns=INT_COLUMNS, text_columns=TEXT_COLUMNS)


def find_profile(slug: str | None = None) -> Path | None:
    """The profile for a notebook: this device's `make profile` output (`output_path`), else a committed
    results/<device>_profile.csv (`report.is_device_run`); None if there is none."""
    committed = sorted(p for p in RESULTS_DIR.glob(f"*{PROFILE_SUFFIX}.csv") if is_device_run(p, PROFILE_SUFFIX))
    candidates = [output_path(None, slug), *committed]
    return next((p for p in candidates if p.is_file()), None)


def where_time_goes(row: dict) -> str:
    """One sentence: the kernel's time, its DRAM traffic and share of peak, L2 hits, occupancy, issue
    slots, instructions per chunk of A and its top stall reasons."""
    shape = f"{row['m']}x{row['k']}x{row['l']}"
    if row.get("status") != "ok" or row.get("duration_us") is None:
        return f"{row['config']} at {shape}: not profiled ({row.get('note') or row.get('status')})"

    def pct(x):
        return "-" if x is None else f"{x:.0f} %"

    stalls = ", ".join(f"{row[f'stall_{i}']} {100 * row[f'stall_{i}_share']:.0f} %" for i in (1, 2, 3)
                       if row.get(f"stall_{i}"))
    inst = "-" if row.get("inst_per_chunk") is None else f"{row['inst_per_chunk']:.0f}"
    return (f"{row['config']} at {shape}: {row['duration_us']:.1f} us, DRAM {row['dram_read_bytes'] / 1e6:.1f} MB read "
            f"at {pct(row.get('dram_pct_of_peak'))} of peak (L2 hits {pct(row.get('l2_hit_pct'))}), occupancy "
            f"{pct(row.get('occupancy_pct'))}, issue slots {pct(row.get('issue_active_pct'))} busy, {inst} "
            f"instructions per 16-byte chunk of A; stalls: {stalls or '-'}")


# ---------------------------------------------------------------------------------------------
# The child: one call of each (kernel, shape) under ncu


def run_child(configs, shapes, manifest_path: str) -> int:
    """Call every config once at every shape (its kernel built by `cute_bench.variants` first, outside any
    other launch), appending one JSON line per call to the manifest; refused or failing calls are noted
    and launch nothing."""
    import torch

    from nvfp4lib.bench.cute_bench import refusal, variants
    from nvfp4lib.problem import generate_input

    kernels = {}  # config text -> (kernel name, CuteGemv)
    with open(manifest_path, "a") as manifest:
        for shape in shapes:
            data = generate_input(*shape, seed=1, mode="full", device="cuda")
            torch.cuda.synchronize()
            for text in configs:
                entry = dict(config=text, kernel=None, m=shape.m, k=shape.k, l=shape.l, status="ok", note="")
                try:
                    if text not in kernels:  # variants yields the naive kernel first, then the config's
                        *_, kernels[text] = variants([] if text == "naive" else [text])
                    entry["kernel"], runner = kernels[text]
                    refused = refusal(runner, data)
                    if refused:
                        entry.update(status="refused", note=refused)
                    else:
                        runner.prepare(data)  # validation and the per-K compile happen here, launching nothing
                        runner(data)
                        torch.cuda.synchronize()
                except Exception as err:  # noqa: BLE001 - one failing kernel does not stop the others
                    entry.update(status="error", note=f"{type(err).__name__}: {str(err)[:160]}")
                manifest.write(json.dumps(entry) + "\n")
                manifest.flush()
    return 0


# ---------------------------------------------------------------------------------------------
# The parent


def ncu_command(ncu: str, child: list[str]) -> list[str]:
    """The ncu command line that profiles ``child`` (a command) with the metrics above."""
    metrics = ",".join([*METRICS.values(), STALL_REGEX])
    return [ncu, "--clock-control", "none", "--csv", "--print-units", "base", "--kernel-name", KERNEL_REGEX,
            "--metrics", metrics, *child]


def why_not() -> str | None:
    """Why nothing can be profiled here (None: ncu and a CUDA GPU are there)."""
    import torch

    if not torch.cuda.is_available():
        return NOTHING + " (no CUDA GPU)"
    if not (os.environ.get("NCU") or shutil.which("ncu")):
        return NOTHING + " (ncu is not on PATH; set NCU=/path/to/ncu)"
    return None


def output_path(out: str | None, slug: str | None = None) -> Path:
    """`out`, else results/<device>_profile.csv for this device (or the device `slug`)."""
    return Path(out) if out else RESULTS_DIR / f"{slug or device_slug()}{PROFILE_SUFFIX}.csv"


def write_profile(rows: list[dict], path) -> None:
    """`rows` as a profile CSV (`COLUMNS`), its folder made if need be."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_csv(rows, path, COLUMNS)


def _shape(text: str) -> Shape:
    """MxKxL as the problem's shapes are: M, L >= 1, K a positive multiple of 16 (else a usage error)."""
    try:
        shape = Shape(*(int(v) for v in text.lower().split("x")))
    except (TypeError, ValueError):
        shape = None
    if shape is None or shape.m < 1 or shape.l < 1 or shape.k < 16 or shape.k % 16:
        raise argparse.ArgumentTypeError(f"expected MxKxL with M, L >= 1 and K a positive multiple of 16, got "
                                         f"{text!r}")
    return shape


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4lib.bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), help="cute_bench configs, 'naive', 'default'")
    parser.add_argument("--shapes", nargs="+", type=_shape, default=list(BENCHMARK_SHAPES), help="MxKxL")
    parser.add_argument("--out", help="the CSV to write (default results/<device>_profile.csv)")
    parser.add_argument("--dry-run", action="store_true", help="print the ncu command and stop")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.configs, args.shapes, args.manifest)
    shapes = [f"{s.m}x{s.k}x{s.l}" for s in args.shapes]
    with tempfile.TemporaryDirectory() as tmp:
        manifest_path = os.path.join(tmp, "manifest.jsonl")
        child = [sys.executable, "-m", "nvfp4lib.bench.profile", "--child", "--manifest", manifest_path,
                 "--configs", *args.configs, "--shapes", *shapes]
        command = ncu_command(os.environ.get("NCU") or shutil.which("ncu") or "ncu", child)
        if args.dry_run:
            print(" ".join(command))
            return 0
        problem = why_not()
        if problem:
            print(problem)
            return 0
        print(f"profiling {len(args.configs)} kernels x {len(args.shapes)} shapes under ncu ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        manifest = [json.loads(line) for line in open(manifest_path)] if os.path.exists(manifest_path) else []
        try:
            launches = parse_ncu_csv(done.stdout)
        except ValueError as err:
            print(f"ncu gave no counters (exit {done.returncode}): {err}\n{done.stderr[-2000:]}")
            return 1
    context = context_fields(capabilities(), quick=False)  # the benchmark CSV's; this schema keeps three
    rows = [dict(row, device=context["device_slug"], date=context["date"], commit=context["commit"])
            for row in join(manifest, launches)]
    if len([e for e in manifest if e["status"] == "ok"]) != len(launches):
        print(f"warning: {len(launches)} profiled launches for {len(manifest)} calls: rows joined by order may be off")
    path = output_path(args.out)
    write_profile(rows, path)
    for row in rows:
        print(where_time_goes(row))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
