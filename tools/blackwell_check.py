#!/usr/bin/env python3
"""Everything this workbook can only check on a Blackwell (sm_100) GPU, in one command, with one report.

The workbook is developed on an H200 and a CPU-only CI, where the hardware FP4 decode and cuBLAS's
FP4 GEMM never run. On a B200 this runs, in order:

  sm100 tests          pytest -m sm100 (cuBLAS FP4 GEMM and everything that needs it); all of them
                       skipped counts as a failure here, with the probe's reason
  GPU tests            pytest -m "gpu and not sm100" (the CuTe kernels, streams, graphs, evaluate)
  hardware vs model    the CuTe fast kernel (hardware decode) bit for bit against its numpy model
                       (nvfp4lib.study.decode_models), and cuBLAS FP4 against the exact reference
  notebook 03, 04      notebooks 03_scaled_mm and 04_cute_kernel in full mode (run_notebooks)
  leaderboard: hybrid  the hybrid export through the local leaderboard (test and benchmark mode);
                       its import-time self-check must pick the CuTe kernel
  leaderboard: fallback  the same with the CuTe path made to fail (--fail-path cute_fast): it must
                       say so and run torch._scaled_mm instead (scaled_mm_permuted)

and writes build/blackwell_report.md: pass, fail or skip and the time of each item, with details.
On any other machine it prints what it would run and why each item is skipped, writes the report
saying so, and exits 0. Exit code: 1 if an item failed, else 0.

    python tools/blackwell_check.py [--only NAME ...] [--report PATH]
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from nvfp4lib.device import capabilities, environment_report  # noqa: E402
from nvfp4lib.locations import BUILD_DIR, NOTEBOOKS_DIR  # noqa: E402
from nvfp4lib.messages import describe_error, first_line  # noqa: E402

WORK_DIR = BUILD_DIR / "blackwell"
DEFAULT_REPORT = BUILD_DIR / "blackwell_report.md"
NOTEBOOK_TIMEOUT_S = 3600  # per cell
_TAIL_LINES = 25  # lines of a failing command's output kept in the report
_SKIP_LINE = re.compile(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$")  # pytest -rs: SKIPPED [n] file:line: reason


class CheckFailed(RuntimeError):
    """An item ran and found a problem; the message is its details."""


@dataclass(frozen=True)
class Item:
    name: str
    runs: str  # what it runs, in words (printed when skipped too)
    check: Callable[[], str]  # returns details on success, raises CheckFailed (or anything) on failure


@dataclass
class Outcome:
    item: Item
    status: str  # PASS, FAIL or SKIP
    seconds: float
    details: str


# ---------------------------------------------------------------------------------------------
# The items


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-_TAIL_LINES:])


def run_pytest(name: str, marker: str, *paths: str) -> str:
    """Run the tests selected by `marker` (in `paths`, default all); fail on a failure, an error, or
    nothing run at all (every test skipped: the skip reasons say why)."""
    junit = WORK_DIR / f"{name}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "-q", "-rs", f"--junitxml={junit}", *paths],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    if not junit.exists():
        raise CheckFailed(f"pytest wrote no results (exit code {proc.returncode}):\n{_tail(proc.stdout + proc.stderr)}")
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary = (f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
               f"{counts['skipped']} skipped (pytest -m \"{marker}\")")
    skips = sorted({m.group(1) for m in map(_SKIP_LINE.match, proc.stdout.splitlines()) if m})
    if counts["failures"] or counts["errors"] or proc.returncode not in (0, 5):
        raise CheckFailed(f"{summary}\n{_tail(proc.stdout)}")
    if passed == 0:
        raise CheckFailed(f"{summary}: nothing ran on this machine; skip reasons: {'; '.join(skips) or 'none'}")
    return summary + (f"; skip reasons: {'; '.join(skips)}" if skips else "")


def sm100_tests() -> str:
    return run_pytest("sm100_tests", "sm100")


def gpu_tests() -> str:
    return run_pytest("gpu_tests", "gpu and not sm100")


HARDWARE_SHAPES = ((128, 256, 1), (384, 7168, 2), (512, 4096, 2), (7168, 2048, 4))


def hardware_against_models() -> str:
    """The two things only this GPU computes, against their exact CPU-side models, on full-range data."""
    import numpy as np
    import torch

    from nvfp4lib import scaled_mm
    from nvfp4lib.study.whole_k_model import config_model
    from nvfp4lib.cute.gemv import CuteGemv
    from nvfp4lib.problem import generate_input
    from nvfp4lib.reference import check, poison_

    lines, problems = [], []
    runner = CuteGemv("fast")
    if runner.arch != "sm_100a":
        raise CheckFailed(f"the CuTe kernel was built for {runner.arch}, not sm_100a (no hardware decode)")
    for seed, shape in enumerate(HARDWARE_SHAPES):
        data = generate_input(*shape, seed=seed, mode="full", device="cuda")
        poison_(data.c)
        got = runner(data).cpu()[:, 0, :].numpy()
        cpu = tuple(t.cpu() for t in data)
        expected = config_model(cpu, runner.config_for(shape[1]), "hw")[1]
        differ = int((got.view(np.uint16) != expected.view(np.uint16)).sum())
        lines.append(f"CuTe hw decode {shape}: {differ} of {got.size} fp16 values differ from the model")
        if differ:
            problems.append(lines[-1])
        # cuBLAS reads the block scales as unsigned UE4M3, so its comparison uses |scales|
        scales = {name: getattr(data, name).clone() for name in ("sfa", "sfb", "sfa_permuted", "sfb_permuted")}
        for sf in scales.values():  # clones keep the strides
            sf.view(torch.uint8).bitwise_and_(0x7F)
        unsigned = data._replace(**scales)
        poison_(unsigned.c)
        result = check(scaled_mm.gemv_scaled_mm_permuted(unsigned), unsigned)
        ran = scaled_mm.last_backend
        lines.append(f"cuBLAS FP4 {shape} ({ran}), scales made non-negative: {first_line(result.message)}")
        if not result.ok or ran != scaled_mm.HARDWARE_BACKEND:
            problems.append(lines[-1])
    if problems:
        raise CheckFailed("\n".join(problems + ["", *lines]))
    return "\n".join(lines)


def _notebook(name: str) -> Callable[[], str]:
    def run() -> str:
        from tools.run_notebooks import run_notebook

        out = BUILD_DIR / "notebooks" / f"{name}.ipynb"
        run_notebook(NOTEBOOKS_DIR / f"{name}.ipynb", out, small=False, timeout=NOTEBOOK_TIMEOUT_S)
        return f"full mode; executed copy: {out.relative_to(REPO_ROOT)}"

    return run


def _leaderboard(fail: tuple[str, ...], expect: list[str]) -> Callable[[], str]:
    """Export the hybrid file (with `fail`), run the local leaderboard on it, and look for `expect`
    among the lines that say what runs: the evaluator's "backend: ..." and the file's own warnings
    (a path that fails its self-check; a path that cannot run here is logged at INFO, not printed)."""

    def run() -> str:
        from nvfp4lib.leaderboard.export import write_submission
        from nvfp4lib.leaderboard.process import OUTPUT_PREFIX

        file = write_submission("hybrid", WORK_DIR / f"hybrid{''.join('_fail_' + f for f in fail)}.py", fail=fail,
                                force=True)
        proc = subprocess.run([sys.executable, "-m", "nvfp4lib.leaderboard.evaluate", str(file), "--mode", "both",
                               "--show-output"], cwd=REPO_ROOT, capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        shown = [line.removeprefix(OUTPUT_PREFIX) for line in output.splitlines()]  # the file's own lines
        checks = [line for line in shown if line.startswith(("backend: ", "cute_fast ", "scaled_mm_"))]
        missing = [e for e in expect if not any(line.startswith(e) for line in checks)]
        summary = next((line for line in reversed(proc.stdout.splitlines())
                        if line.startswith(("PASSED", "FAILED", "SKIPPED", "INCOMPLETE"))), "")
        if proc.returncode != 0 or missing:
            raise CheckFailed(f"exit code {proc.returncode}; {summary}; expected self-check lines missing: "
                              f"{missing}\n{_tail(output)}")
        return "\n".join([f"{file.relative_to(REPO_ROOT)}: {summary}", *dict.fromkeys(checks), "",
                          _tail(proc.stdout)])

    return run


ITEMS = (
    Item("sm100 tests", "pytest -m sm100", sm100_tests),
    Item("GPU tests", 'pytest -m "gpu and not sm100"', gpu_tests),
    Item("hardware vs model", "the CuTe fast kernel bit for bit against the model of the config it runs at each K (whole_k_model.config_model, 'hw'); "
         "cuBLAS FP4 against the exact reference", hardware_against_models),
    Item("notebook 03", "notebooks/03_scaled_mm.ipynb in full mode", _notebook("03_scaled_mm")),
    Item("notebook 04", "notebooks/04_cute_kernel.ipynb in full mode", _notebook("04_cute_kernel")),
    Item("leaderboard: hybrid", "python -m nvfp4lib.leaderboard.evaluate on the hybrid export (self-check must pick cute_fast)",
         _leaderboard((), ["backend: CuTe DSL 'fast' kernel"])),
    Item("leaderboard: fallback", "the same with --fail-path cute_fast (it must fall back to scaled_mm_permuted)",
         _leaderboard(("cute_fast",), ["cute_fast could not be built (RuntimeError: made to fail on purpose",
                                       "backend: torch._scaled_mm on the permuted scales: cublas-fp4"])),
)


# ---------------------------------------------------------------------------------------------
# Running and reporting


def why_not_here() -> str | None:
    """Why this machine cannot run the items (None: it is an sm_100 GPU)."""
    caps = capabilities()
    if caps.sm is not None and caps.sm[0] == 10:
        return None
    return f"needs an sm_100 (Blackwell) GPU; this machine: {caps.summary()}"


def run_items(items) -> list[Outcome]:
    skip = why_not_here()
    if skip:
        print(f"Nothing runs here: this check {skip}.")
    outcomes = []
    for item in items:
        if skip:
            outcome = Outcome(item, "SKIP", 0.0, f"not an sm_100 GPU; would run: {item.runs}")
        else:
            print(f"[{item.name}] {item.runs} ...", flush=True)
            start = time.perf_counter()
            try:
                outcome = Outcome(item, "PASS", 0.0, item.check())
            except Exception as err:  # noqa: BLE001 - every failure of an item is reported, the rest still run
                details = str(err) if isinstance(err, CheckFailed) else describe_error(err)
                outcome = Outcome(item, "FAIL", 0.0, details)
            outcome.seconds = time.perf_counter() - start
        print(f"{outcome.status} {item.name} ({outcome.seconds:.1f} s): {first_line(outcome.details)}", flush=True)
        outcomes.append(outcome)
    return outcomes


def report_text(outcomes: list[Outcome]) -> str:
    env = environment_report()
    skip = why_not_here()
    lines = ["# Blackwell check", "",
             f"Run {datetime.datetime.now().isoformat(timespec='seconds')} with `python tools/blackwell_check.py` "
             f"on: {capabilities().summary()}.",
             "Versions: " + ", ".join(f"{k} {env[k]}" for k in ("torch", "cuda_runtime", "driver", "cute_dsl",
                                                               "nvfp4lib")) + ".", ""]
    if skip:
        lines += [f"**Nothing ran**: this check {skip}. Run it on a B200 (`make blackwell-check`).", ""]
    lines += ["| item | result | time | summary |", "|---|---|---|---|"]
    for o in outcomes:
        summary = first_line(o.details).replace("|", "\\|")
        lines.append(f"| {o.item.name} | {o.status} | {o.seconds:.1f} s | {summary} |")
    lines.append("")
    for o in outcomes:
        lines += [f"## {o.item.name}: {o.status}", "", f"Runs: {o.item.runs}.", "", "```", o.details, "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", choices=[i.name for i in ITEMS],
                        help="run only this item (repeatable); default: all")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help=f"report file (default {DEFAULT_REPORT})")
    args = parser.parse_args(argv)
    items = [i for i in ITEMS if not args.only or i.name in args.only]
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    outcomes = run_items(items)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(report_text(outcomes))
    print(f"report: {args.report}")
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
