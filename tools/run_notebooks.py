#!/usr/bin/env python3
"""Execute the workbook's notebooks in order with papermill; stop at the first failure.

Each notebook runs in a fresh kernel of this interpreter with notebooks/ as working directory, so
relative paths in a notebook behave as in JupyterLab. The executed copy (outputs, or the traceback
on failure) is written to --out, with what the kernel wrote below Python (its processes' output,
already in the cells), if anything, in NN_topic.log beside it; a re-run overwrites both.

Mode: `--small` and `--full` set every notebook's `small` parameter; without either it is left to
the notebook (small on a CPU, full on a GPU). Figures of full GPU runs replace the committed ones in
figures/ (and figures/INDEX.md); every other run writes them to build/figures/ (nvfp4lib.bench.plots).
"""

import argparse
import contextlib
import fnmatch
import os
import re
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
DEFAULT_OUT = REPO_ROOT / "build" / "notebooks"
# Notebooks whose full mode needs no GPU and takes seconds on a 2-core CPU: the tests run them in
# full mode too, so that full-mode-only code is checked without a GPU.
FULL_MODE_ON_CPU = ("01_fp4_quantization.ipynb", "02_scale_swizzling.ipynb")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class NotebookFailed(RuntimeError):
    """A notebook raised: the message names the cell, its first line and the error."""


def discover(pattern: str = "*") -> list[Path]:
    """Numbered notebooks (NN_topic.ipynb) in run order; PATTERN is a glob or a substring of the name."""
    found = sorted(NOTEBOOKS_DIR.glob("[0-9]*.ipynb"))
    return [p for p in found if fnmatch.fnmatch(p.name, pattern) or pattern in p.name]


@contextlib.contextmanager
def _kernel_env():
    """The kernel inherits our environment: let it import nvfp4lib from this checkout even when the
    package is not installed (an existing environment on a GPU node), and prefer this interpreter's
    own `python3` kernel over one registered per user."""
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), saved.get("PYTHONPATH")]))
    os.environ["JUPYTER_PREFER_ENV_PATH"] = "1"
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _kernel_output_to(log_path: Path):
    """The notebook kernel's own stdout and stderr go to `log_path`, not to this terminal.

    What a kernel and the processes it starts write to its file descriptors (a submission's
    self-check in a subprocess, a C library's warning) is copied by ipykernel into the cells and
    also echoed to the kernel's terminal, where it would cut into this runner's progress line. The
    kernel inherits its descriptors when it starts, so this runner lends it the log for the run."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log_path, "wb") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in ((1, saved[0]), (2, saved[1])):
            os.dup2(copy, fd)
            os.close(copy)
        if log_path.exists() and log_path.stat().st_size == 0:
            log_path.unlink()  # nothing was written: no file


def _describe(path: Path, out_path: Path, exc: Exception) -> str:
    """Where the notebook failed, in the numbering of the committed notebook (1 = first cell)."""
    import nbformat

    source, count = getattr(exc, "source", None), getattr(exc, "exec_count", None)
    if source is None and out_path.exists():  # a timeout or a dead kernel: the last cell started
        for cell in nbformat.read(out_path, as_version=4).cells:
            if cell.cell_type == "code" and cell.metadata.get("papermill", {}).get("start_time"):
                source, count = cell.source, cell.get("execution_count")
    cells = nbformat.read(path, as_version=4).cells
    number = next((i for i, c in enumerate(cells, 1) if c.cell_type == "code" and c.source == source), None)
    first_line = ((source or "").strip().splitlines() or ["?"])[0]
    where = (f"cell {number}" if number else "a cell added by papermill") + (f" (In [{count}])" if count else "")
    if hasattr(exc, "ename"):
        error = "\n".join(_ANSI.sub("", line) for line in exc.traceback[-12:]) or f"{exc.ename}: {exc.evalue}"
    else:
        error = f"{type(exc).__name__}: {exc}"
    return f"{path.name} failed in {where}: {first_line}\n{error}\nexecuted copy: {out_path}"


def run_notebook(path: Path, out_path: Path, *, small: bool | None = None, seed: int | None = None,
                 timeout: int | None = None) -> None:
    """Execute one notebook into out_path; raise NotebookFailed saying where it failed."""
    import papermill

    parameters = {"small": small} if seed is None else {"small": small, "seed": seed}
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.unlink(missing_ok=True)
    log_path = out_path.with_suffix(".log")
    try:
        with _kernel_env(), _kernel_output_to(log_path):
            papermill.execute_notebook(
                str(path), str(out_path), parameters=parameters, kernel_name="python3",
                language="python", cwd=str(Path(path).parent), execution_timeout=timeout,
                progress_bar=False, extra_arguments=["--IPKernelApp.log_level=ERROR"],
            )
    except Exception as exc:  # papermill errors, cell timeouts, dead kernels
        said = f"\nthe kernel's own output: {log_path}" if log_path.exists() else ""
        raise NotebookFailed(_describe(Path(path), out_path, exc) + said) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--small", action="store_true", help="force small mode (small=True)")
    mode.add_argument("--full", action="store_true",
                      help="force full mode (small=False); default: auto, small on a CPU and full on a GPU")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for executed copies (default build/notebooks)")
    ap.add_argument("--only", metavar="PATTERN", default="*", help="run only notebooks matching a glob or substring")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell (default 1800)")
    ap.add_argument("--seed", type=int, default=None, help="override the notebooks' seed parameter")
    args = ap.parse_args(argv)

    try:
        import ipykernel, papermill  # noqa: F401  (fail early, with the fix, rather than mid-run)
    except ImportError as err:
        print(f"{err.name} is missing in {sys.executable}: pip install papermill ipykernel", file=sys.stderr)
        return 2
    notebooks = discover(args.only)
    if not notebooks:
        print(f"no notebook in {NOTEBOOKS_DIR} matches {args.only!r}", file=sys.stderr)
        return 2
    mode = "small" if args.small else "full" if args.full else "auto (small on a CPU, full on a GPU)"
    print(f"{len(notebooks)} notebooks, mode {mode}, into {args.out}", flush=True)
    t0 = time.perf_counter()
    for i, path in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {path.name} ... ", end="", flush=True)
        start = time.perf_counter()
        try:
            run_notebook(path, args.out / path.name, small=True if args.small else (False if args.full else None),
                         seed=args.seed, timeout=args.timeout)
        except NotebookFailed as err:
            print(f"FAILED ({time.perf_counter() - start:.1f} s)\n{err}", flush=True)
            return 1
        print(f"ok ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{len(notebooks)} of {len(notebooks)} notebooks passed in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
