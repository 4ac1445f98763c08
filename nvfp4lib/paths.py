"""Where the workbook keeps things, found from this file so notebooks and tests work from any cwd.

The package is meant to be used from a checkout (``pip install -e .``): the repository root is the
folder above this package. Figures go to ``figures/`` unless ``NVFP4_FIGURES_DIR`` says otherwise, so
test runs can write them into a temporary folder instead of the committed one.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
BUILD_DIR = REPO_ROOT / "build"

FIGURES_ENV_VAR = "NVFP4_FIGURES_DIR"


def figures_dir() -> Path:
    """The figures folder, read from the environment at call time (so a later override applies)."""
    override = os.environ.get(FIGURES_ENV_VAR)
    return Path(override).expanduser().resolve() if override else REPO_ROOT / "figures"

