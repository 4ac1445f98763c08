"""Where the workbook keeps things, found from this file so notebooks and tests work from any cwd.

The package is meant to be used from a checkout (``pip install -e .``): the repository root is the
folder above this package. Which of the two figure folders a run writes to is decided in
nvfp4lib.bench.plots; ``NVFP4_FIGURES_DIR`` overrides both (tests write into a temporary folder).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
BUILD_DIR = REPO_ROOT / "build"
RESULTS_DIR = REPO_ROOT / "results"  # committed results of full runs, one CSV per device
COMMITTED_FIGURES_DIR = REPO_ROOT / "figures"  # figures of full GPU runs, listed in its INDEX.md
BUILD_FIGURES_DIR = BUILD_DIR / "figures"       # figures of every other run
DISPATCH_TABLE = BUILD_DIR / "dispatch_table.json"  # the dispatcher's table measured on this GPU (make calibrate)

FIGURES_ENV_VAR = "NVFP4_FIGURES_DIR"
COMMIT_ENV_VAR = "NVFP4_COMMIT"  # the commit to record where the tree is a copy without .git


def checkout_commit() -> str:
    """The commit of this checkout (12 hex digits), so that a recorded result names the code that made it."""
    given = os.environ.get(COMMIT_ENV_VAR)
    if given:
        if not re.fullmatch(r"[0-9A-Za-z._+-]+", given):  # it lands in table cells and file names
            raise ValueError(f"{COMMIT_ENV_VAR}: expected a commit (letters, digits, '.', '_', '+' or '-'), got {given!r}")
        return given[:12]
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"

