"""Run the CuTe DSL GEMV kernels under NVIDIA compute-sanitizer (memcheck, racecheck): ``make sanitize``.

The module starts itself as a child process under each sanitizer tool, in a small driver mode that
runs `gemv_cute` (variants "naive" and "fast") on the test shapes and on the package's extra shapes
(`nvfp4lib.problem.EXTRA_SHAPES`: the smallest K, a K that is not a multiple of 128, large M with
many batches), each on a clone of the input with c poisoned (`harness.check_once`) and the
result checked against the exact reference computed on the CPU. It then prints one
summary line per tool and exits non-zero if a sanitizer reported an error, a result was wrong, or
the driver failed. PyTorch's caching allocator is switched off in the child
(PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that every tensor is its own allocation and a read past its
end is caught rather than landing in a neighbour's pooled memory.

Without a CUDA GPU, the CuTe DSL or compute-sanitizer, it says which is missing and exits 0.

    python -m nvfp4lib.bench.sanitize [--tools memcheck,racecheck] [--variants naive,fast] [--shapes all|test|extra]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from nvfp4lib.bench.harness import check_once
from nvfp4lib.device import capabilities, missing
from nvfp4lib.locations import BUILD_DIR, REPO_ROOT
from nvfp4lib.problem import EXTRA_SHAPES, TEST_SHAPES, generate_input


TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
DEFAULT_TOOLS = ("memcheck", "racecheck")
VARIANTS = ("naive", "fast")
# Per tool: options beyond --tool. Leaks are the process's own business (PyTorch keeps its context);
# API errors from library probing are not kernel errors, and a failed launch fails the driver anyway.
TOOL_OPTIONS = {
    "memcheck": ["--leak-check", "no", "--report-api-errors", "no"],
    "racecheck": ["--racecheck-report", "all", "--report-api-errors", "no"],
    "initcheck": ["--report-api-errors", "no"],
    "synccheck": ["--report-api-errors", "no"],
}
ERROR_EXIT = 86  # what compute-sanitizer returns when it found errors (set by --error-exitcode)
CHILD_TIMEOUT_S = 3600


SHAPE_SETS = ("all", "test", "extra")


def shapes_for(which: str):
    """The shapes of --shapes `which`: the test shapes, problem.EXTRA_SHAPES, or both."""
    sets = {"test": list(TEST_SHAPES), "extra": list(EXTRA_SHAPES)}
    return sets["test"] + sets["extra"] if which == "all" else sets[which]


# --------------------------------------------------------------------------- driver (the child)


def drive(variants: list[str], which: str, seed: int) -> int:
    """Run every (variant, shape) once on the GPU and check it; 0 if all results are right."""
    from nvfp4lib.cute.gemv import gemv_cute  # imports the CuTe DSL: only in the child

    failed = 0
    for shape in shapes_for(which):
        cpu = generate_input(*shape, seed=seed, mode="full")  # same bytes as on the GPU (drawn on the CPU)
        gpu = generate_input(*shape, seed=seed, mode="full", device="cuda")
        for variant in variants:
            # on a clone with c poisoned; judged against the CPU copy, so the reference runs outside
            # the sanitizer's view
            result = check_once(lambda data: gemv_cute(data, variant), gpu, against=cpu)  # noqa: B023
            status = "ok" if result.ok else "WRONG"
            failed += not result.ok
            print(f"driver: {variant:5s} {shape.m}x{shape.k}x{shape.l}: {status} "
                  f"(max abs err {result.max_abs_err:.3g})", flush=True)
            if not result.ok:
                print(result.message, flush=True)
    print(f"driver: {failed} wrong result(s)", flush=True)
    return 1 if failed else 0


# --------------------------------------------------------------------------- parent


def find_sanitizer() -> str | None:
    """compute-sanitizer from $NVFP4_COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin."""
    explicit = os.environ.get("NVFP4_COMPUTE_SANITIZER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = Path(home or "/nonexistent") / "bin" / "compute-sanitizer"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def why_not() -> str | None:
    """Why the kernels cannot be sanitized here (None: they can)."""
    caps = capabilities()
    reason = missing(caps, "cuda", "cute_dsl")
    if reason is not None:
        return f"{reason}; this machine: {caps.summary()}"
    if find_sanitizer() is None:
        return "compute-sanitizer not found (CUDA toolkit; or set NVFP4_COMPUTE_SANITIZER)"
    return None


def _count(pattern: str, text: str) -> int | None:
    found = re.findall(pattern, text)
    return sum(int(n) for n in found) if found else None


def run_tool(tool: str, args) -> dict:
    """One child under compute-sanitizer --tool TOOL; what it found."""
    cmd = [find_sanitizer(), "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "20",
           *TOOL_OPTIONS[tool], sys.executable, "-m", "nvfp4lib.bench.sanitize", "--driver",
           "--variants", ",".join(args.variants), "--shapes", args.shapes, "--seed", str(args.seed)]
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        partial = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in (err.stdout, err.stderr) if p]
        output, code = "".join(partial) + f"\n(timed out after {args.timeout} s)", None
    checks = len(re.findall(r"^driver: \w+ +\d+x\d+x\d+: ", output, re.M))
    wrong = len(re.findall(r"^driver: \w+ +\d+x\d+x\d+: WRONG", output, re.M))
    errors = _count(r"ERROR SUMMARY: (\d+) error", output)
    if errors is None:  # racecheck prints its own summary line instead
        errors = _count(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", output)
    hazards = _count(r"RACECHECK SUMMARY: (\d+) hazard", output)
    log = Path(args.log_dir) / f"sanitize-{tool}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(output)
    expected_checks = len(args.variants) * len(shapes_for(args.shapes))
    ok = code == 0 and errors == 0 and not hazards and wrong == 0 and checks == expected_checks
    return {"tool": tool, "ok": ok, "exit": code, "errors": errors, "hazards": hazards, "checks": checks,
            "expected_checks": expected_checks, "wrong": wrong, "seconds": time.perf_counter() - start,
            "log": log, "output": output}


def summary_line(r: dict) -> str:
    hazards = "" if r["hazards"] is None else f", {r['hazards']} hazard(s)"
    errors = "no summary" if r["errors"] is None else f"{r['errors']} error(s)"
    return (f"{r['tool']:10s} {'OK' if r['ok'] else 'FAILED':6s} {errors}{hazards}; "
            f"{r['checks']}/{r['expected_checks']} kernel runs checked, {r['wrong']} wrong; "
            f"exit {r['exit']}; {r['seconds']:.0f} s; log {r['log']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nvfp4lib.bench.sanitize", description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS), help=f"comma-separated, from {TOOLS}")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated CuTe variants")
    ap.add_argument("--shapes", default="all", choices=SHAPE_SETS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=CHILD_TIMEOUT_S, help="seconds per tool")
    ap.add_argument("--log-dir", default=str(BUILD_DIR / "sanitize"))
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)  # the child's mode
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    tools = [t for t in args.tools.split(",") if t]
    bad = [v for v in args.variants if v not in VARIANTS] + [t for t in tools if t not in TOOLS]
    if bad:
        ap.error(f"unknown variant(s) or tool(s): {bad}; variants {VARIANTS}, tools {TOOLS}")

    if args.driver:
        return drive(args.variants, args.shapes, args.seed)

    reason = why_not()
    if reason:
        print(f"sanitize: skipped: {reason}")
        return 0
    print(f"sanitize: {find_sanitizer()}; tools {tools}; variants {args.variants}; "
          f"{len(shapes_for(args.shapes))} shapes ({args.shapes})", flush=True)
    results = []
    for tool in tools:
        result = run_tool(tool, args)
        results.append(result)
        print(summary_line(result), flush=True)
        if not result["ok"]:
            print("\n".join(result["output"].splitlines()[-40:]), flush=True)
    failed = [r["tool"] for r in results if not r["ok"]]
    print(f"sanitize: {'FAILED: ' + ', '.join(failed) if failed else 'OK'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
