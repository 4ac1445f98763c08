"""Build the default CuTe kernels under several CuTe DSL releases, each installed into a folder of its own.

    python tools/dsl_matrix.py                          # every minor release 4.3-4.8 -> results/dsl_matrix.md
    python tools/dsl_matrix.py --releases 4.3.4,4.8.1 --out build/dsl_matrix.md
    python tools/dsl_matrix.py --releases 4.3.4,4.8.1 --install-only   # for tests/test_dsl_releases.py

Each release is installed once with pip (from the configured index, nothing else) into ``build/dsl/<release>``:
nvidia-cutlass-dsl and the nvidia-cutlass-dsl-libs-* distributions it requires, without their other
dependencies, which the running environment already has (torch, numpy, cuda-python). Then, per release, a fresh
interpreter with only that release's ``cutlass`` on its path compiles `cute.gemv.default_config(K)` for every
target and K asked (no GPU needed) and reports the PTX: its instruction count, its work instructions
(`study.ptx_reading.WORK`, per opcode) and the cubin's registers and local memory. The table says, for each
kernel, whether its work instructions match the newest release's exactly; the command exits 1 if a kernel fails
to compile or does not match.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("4.3.4", "4.3.5", "4.4.2", "4.5.3", "4.6.3", "4.7.1", "4.8.1")
"""The oldest supported release (`device.MIN_CUTE_DSL`), then the newest patch of each minor release."""
KS = (2048, 7168, 16384, 4096)  # the benchmarks' K, and one the leaderboard tests use
ARCHS = ("sm_90a", "sm_100a")
RESULT = "DSL_MATRIX_RESULT "  # the child's last line: this, then its JSON
DSL = "nvidia-cutlass-dsl"


def _requirement_name(line: str) -> str | None:
    """The distribution a Requires-Dist line names, where it is part of the DSL itself and not an extra."""
    name = re.match(r"[A-Za-z0-9_.-]+", line)[0].lower().replace("_", "-")
    return name if name.startswith(DSL) and "extra ==" not in line else None


def _requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's metadata."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def install(release: str, folder: Path) -> None:
    """pip-install the release's own distributions into ``folder``, once (a marker file says it is complete):
    each one downloaded, its DSL requirements followed, then all installed by one pip command (a second
    ``--target`` install into the same folder would replace the first's shared package folder)."""
    done = folder / ".complete"
    if done.exists():
        return
    wheels = folder.parent / f"{release}.wheels"
    wanted, seen = [DSL], {DSL}
    while wanted:
        name = wanted.pop()
        print(f"  pip download {name}=={release}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-d", str(wheels), f"{name}=={release}"], check=True)
        wheel = next(w for w in wheels.glob("*.whl")
                     if w.name.lower().replace("_", "-").startswith(f"{name}-{release}-"))
        for line in _requires(wheel):
            needed = _requirement_name(line)
            if needed and needed not in seen:
                seen.add(needed)
                wanted.append(needed)
    print(f"  pip install {len(seen)} wheels -> {folder}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "--no-index", "--target", str(folder), "--upgrade", *map(str, sorted(wheels.glob("*.whl")))],
                   check=True)
    shutil.rmtree(wheels)
    done.write_text(release)


def _use_only(folder: Path) -> None:
    """Put ``folder``'s CuTe DSL first on sys.path and drop every other one (the environment's own)."""
    sys.path[:] = [p for p in sys.path if "nvidia_cutlass_dsl" not in p]
    for sub in ("nvidia_cutlass_dsl/dsl_packages", "nvidia_cutlass_dsl/python_packages"):
        if (folder / sub).is_dir():
            sys.path.insert(0, str(folder / sub))
    sys.path.insert(0, str(folder))
    sys.path.insert(0, str(ROOT))


def _describe(cfg) -> str:
    """A config as its class and the fields it sets to other than their defaults."""
    changed = [f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg)
               if f.default is not dataclasses.MISSING and getattr(cfg, f.name) != f.default]
    return f"{type(cfg).__name__}({', '.join(changed)})"


def child(folder: Path, ks, archs) -> dict:
    """Compile the default kernels with the DSL in ``folder`` (this process only): one row per target and K."""
    _use_only(folder)
    import cutlass

    from nvfp4lib.cute import gemv
    from nvfp4lib.device import installed_cute_dsl_version
    from nvfp4lib.study.ptx_reading import cubin_resources, instructions, work_counts

    version = installed_cute_dsl_version(cutlass)
    rows = []
    for arch in archs:
        for k in ks:
            cfg = gemv.default_config(k)
            row = {"arch": arch, "k": k, "config": _describe(cfg)}
            started = time.monotonic()
            try:
                ptx = gemv.compile_ptx("fast", arch, cfg, k=k)
                cubin = gemv.compile_cubin("fast", arch, cfg, k=k)
            except Exception as err:  # noqa: BLE001 - the error is the result of this cell
                row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
            else:
                row.update(instructions=len(instructions(ptx)), work=work_counts(ptx), **cubin_resources(cubin))
            row["seconds"] = round(time.monotonic() - started, 1)
            rows.append(row)
    return {"release": version, "cutlass": str(Path(cutlass.__file__).parent), "rows": rows}


def run_release(folder: Path, ks, archs, timeout: float) -> dict:
    """`child` in a fresh interpreter (one DSL per process: a second cannot be imported beside the first)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(folder),
           "--ks", ",".join(map(str, ks)), "--archs", ",".join(archs)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"release": folder.name, "failed": f"did not finish within {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT)]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"release": folder.name, "failed": f"exit code {done.returncode}: {tail}"}
    return json.loads(lines[-1][len(RESULT):])


def _work_text(work: dict) -> str:
    return ", ".join(f"{op} {n}" for op, n in work.items())


def report(results: list[dict], reference: dict) -> tuple[str, bool]:
    """(the markdown table, whether every kernel compiled and matched the reference release's work counts)."""
    ref = {(r["arch"], r["k"]): r for r in reference.get("rows", []) if "error" not in r}
    ok, lines = True, []
    for res in results:
        if "failed" in res:
            ok = False
            lines.append(f"| {res['release']} | all | | | FAILED: {res['failed']} | | | | |")
            continue
        for row in res["rows"]:
            where = f"| {res['release']} | {row['arch']} | {row['k']} | `{row['config']}` |"
            if "error" in row:
                ok = False
                lines.append(f"{where} error: {row['error']} | | | | |")
                continue
            base = ref.get((row["arch"], row["k"]))
            same = base is not None and base["work"] == row["work"]
            ok &= same
            lines.append(f"{where} compiled | {row['instructions']} | {sum(row['work'].values())} | "
                         f"{'yes' if same else 'NO'} | {row.get('registers', '?')} / {row.get('frame_bytes', '?')} |")
    head = ["| release | target | K | config | result | PTX instructions | work instructions | work as in "
            f"{reference.get('release', '?')} | registers / local bytes |", "|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + lines), ok


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _csv(text: str, convert=str) -> tuple:
    items = tuple(convert(x) for x in text.split(",") if x.strip())
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/dsl_matrix.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", type=_csv, default=RELEASES, help=f"default {','.join(RELEASES)}")
    parser.add_argument("--ks", type=lambda t: _csv(t, int), default=KS, help=f"default {','.join(map(str, KS))}")
    parser.add_argument("--archs", type=_csv, default=ARCHS, help=f"default {','.join(ARCHS)}")
    parser.add_argument("--dir", type=Path, default=ROOT / "build" / "dsl", help="where releases are installed")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "dsl_matrix.md", help="the markdown written")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per release (default 900)")
    parser.add_argument("--install-only", action="store_true",
                        help="install the releases and stop (tests/test_dsl_releases.py then compiles under each)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(child(args.child, args.ks, args.archs)), flush=True)
        return 0
    bad = [r for r in args.releases if not re.fullmatch(r"\d+\.\d+\.\d+", r)]
    if bad:
        parser.error(f"--releases: expected versions such as 4.3.5, got {bad[0]!r}")
    results = []
    for release in args.releases:
        folder = args.dir / release
        print(f"CuTe DSL {release}:", flush=True)
        try:
            install(release, folder)
        except subprocess.CalledProcessError as err:
            results.append({"release": release, "failed": f"pip could not install it (exit code {err.returncode})"})
            continue
        if args.install_only:
            continue
        results.append(run_release(folder, args.ks, args.archs, args.timeout))
        for row in results[-1].get("rows", []):
            print(f"  {row['arch']} K={row['k']}: {row.get('error') or 'compiled'} ({row['seconds']} s)", flush=True)
        if "failed" in results[-1]:
            print(f"  FAILED: {results[-1]['failed']}", flush=True)
    if args.install_only:
        failed = [r["release"] for r in results if "failed" in r]
        print(f"could not install: {', '.join(failed)}" if failed else f"installed in {args.dir}")
        return 1 if failed else 0
    newest = max((r for r in results if "rows" in r), key=lambda r: tuple(map(int, re.findall(r"\d+", r["release"]))),
                 default={})
    table, ok = report(results, newest)
    import torch

    text = "\n".join([
        "# The default CuTe kernels under each CuTe DSL release",
        "",
        f"`python tools/dsl_matrix.py --releases {','.join(args.releases)}` at commit {_commit()}, "
        f"{datetime.date.today().isoformat()}, Python {sys.version.split()[0]}, torch {torch.__version__}, "
        "on a machine without a GPU (every kernel cross-compiled; `cute.gemv.default_config(K)` at each K).",
        "Work instructions are the PTX opcodes of `nvfp4lib.study.ptx_reading.WORK` (memory accesses, barriers, "
        "reduction shuffles, conversions, lookups, integer and floating-point math), compared opcode by opcode with "
        "the newest release; the other PTX instructions (addresses, moves) are lowered by each release's own LLVM "
        "and differ by a few. Registers and local memory are read from the cubin.",
        "",
        table,
        "",
        f"Every kernel compiled and matched: {'yes' if ok else 'NO'}.",
        "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}: {'every kernel compiled and matched' if ok else 'FAILURES, see the table'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
