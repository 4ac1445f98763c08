"""Matplotlib setup and figure saving shared by the notebooks.

Figures are committed artifacts, so they are written under stable names at a fixed size and dpi,
without the matplotlib version stamp, and re-running a notebook overwrites them in place.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import matplotlib

# Headless machines (CI, GPU nodes) have no display: pick a file-only backend before pyplot is
# imported. Inside a Jupyter kernel the inline backend is already chosen; leave it alone.
if (
    "MPLBACKEND" not in os.environ
    and "ipykernel" not in sys.modules
    and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
):
    matplotlib.use("Agg")

from nvfp4lib.paths import figures_dir  # noqa: E402

DPI = 110
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def save_figure(fig, name: str) -> Path:
    """Write ``fig`` to ``<figures dir>/<name>.png`` and return the path.

    ``name`` is a stem such as ``"01_e2m1_grid"`` (no folder, no extension): notebooks and the
    README refer to figures by these names, so they must not depend on run order or time.
    """
    if not _NAME.match(name) or name.lower().endswith(".png"):
        raise ValueError(f"figure name must be a plain stem like '01_e2m1_grid', got {name!r}")
    out_dir = figures_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return path

