"""Matplotlib setup, figure saving, and where each figure came from.

Figures are committed artifacts, so they are written under stable names at a fixed size and dpi,
without the matplotlib version stamp. A committed figure must say which machine and run made it,
and a run on a weaker machine must never replace it: only a full-mode run on the device that made
the committed figures (or any GPU while figures/ has none) writes into figures/ and records the
figure in figures/INDEX.md. Every other run (a CPU, small mode, another GPU, an interactive session
that did not declare its mode) writes into build/figures/ and says so.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Mapping

import matplotlib

# Headless machines (CI, GPU nodes) have no display: pick a file-only backend before pyplot is
# imported. Inside a Jupyter kernel the inline backend is already chosen; leave it alone.
if (
    "MPLBACKEND" not in os.environ
    and "ipykernel" not in sys.modules
    and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
):
    matplotlib.use("Agg")

from nvfp4lib import locations  # noqa: E402

DPI = 110
INDEX_NAME = "INDEX.md"
INDEX_COLUMNS = ("figure", "notebook", "device", "commit", "date", "mode", "torch")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_INDEX_HEADER = """# Figures

Every PNG committed in this folder, with the run that made it: its device, commit, date, mode and
the PyTorch it ran with. A figure drawn from recorded results (the 00_* figures, from a `make bench`
CSV) is credited to the run that measured them: the device, commit, date and PyTorch of the CSV's own
columns. Rows are written by `nvfp4lib.bench.plots.save_figure` when a full-mode run on a GPU saves a
figure here; runs on a CPU, in small mode or on another device write to build/figures/ instead and
leave this folder alone.

"""

_mode: str | None = None  # "small" / "full", declared by resolve_small (or declare_mode)


def resolve_small(small: bool | None) -> bool:
    """A notebook's `small` parameter made definite (None: small on a CPU, full on a GPU).

    The answer is remembered as the run's mode, so that the figures of this run go where a run of
    that mode belongs and the index records it."""
    if small is not None and not isinstance(small, bool):  # papermill's -r (raw) gives "False", which is true
        raise ValueError(f"small: expected True, False or None, got {small!r} (a {type(small).__name__}; pass "
                         f"`-p small False` to papermill, not `-r`)")
    if small is None:
        from nvfp4lib.device import capabilities

        small = not capabilities().cuda
    declare_mode("small" if small else "full")
    return bool(small)


def declare_mode(mode: str) -> None:
    """Say what kind of run saves the next figures: "full" (eligible for figures/) or another word."""
    global _mode
    _mode = mode


def _device_name() -> str:
    from nvfp4lib.device import capabilities

    caps = capabilities()
    return caps.name if caps.cuda else "CPU"


def read_index(directory: Path | None = None) -> dict[str, dict[str, str]]:
    """figures/INDEX.md as {figure file name: row}; empty if there is no index."""
    path = (directory or locations.COMMITTED_FIGURES_DIR) / INDEX_NAME
    if not path.exists():
        return {}
    rows = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(INDEX_COLUMNS) and cells[0].endswith(".png"):
            rows[cells[0]] = dict(zip(INDEX_COLUMNS, cells))
    return rows


def _write_index(rows: dict[str, dict[str, str]], directory: Path) -> None:
    lines = ["| " + " | ".join(INDEX_COLUMNS) + " |", "|" + "---|" * len(INDEX_COLUMNS)]
    lines += ["| " + " | ".join(rows[name][c] for c in INDEX_COLUMNS) + " |" for name in sorted(rows)]
    (directory / INDEX_NAME).write_text(_INDEX_HEADER + "\n".join(lines) + "\n")


def committed_device() -> str | None:
    """The device that made the committed figures (None if figures/ has no index yet)."""
    return next((row["device"] for row in read_index().values()), None)


def figure_destination() -> tuple[Path, str]:
    """(folder, why) for the figures of this run; see the module docstring for the rule."""
    override = os.environ.get(locations.FIGURES_ENV_VAR)
    device, committed = _device_name(), committed_device()
    eligible = _mode == "full" and device != "CPU" and committed in (None, device)
    if override:
        folder = Path(override).expanduser().resolve()
        if folder == locations.COMMITTED_FIGURES_DIR.resolve() and not eligible:
            raise ValueError(f"{locations.FIGURES_ENV_VAR}: {override!r} is the committed figures' folder, which only "
                             f"a full run on {committed or 'a GPU'} may write (this is a {_mode or 'undeclared'} run on "
                             f"{device}); leave it unset, or point it elsewhere")
        return folder, f"{locations.FIGURES_ENV_VAR} is set"
    if eligible:
        return locations.COMMITTED_FIGURES_DIR, f"full run on {device}"
    run = f"{_mode} run" if _mode else "run of undeclared mode"
    return locations.BUILD_FIGURES_DIR, (f"{run} on {device}; the committed figures come from full runs on "
                                     f"{committed or 'a GPU'}, so they are left as they are")


def _notebook_of(name: str) -> str:
    """The notebook that draws figure `name`, from its number prefix ("01_..." -> 01_fp4_quantization)."""
    found = sorted(locations.NOTEBOOKS_DIR.glob(name.split("_")[0] + "_*.ipynb"))
    return found[0].stem if found else "-"


_said: set[Path] = set()


def save_figure(fig, name: str, measured: Mapping[str, str] | None = None) -> Path:
    """Write ``fig`` as ``<name>.png`` where this run's figures belong and return the path.

    ``name`` is a stem such as ``"01_e2m1_grid"`` (no folder, no extension): notebooks and the
    README refer to figures by these names, so they must not depend on run order or time. Prints
    one line naming the file; the first time a folder is used, also why this folder.
    ``measured``: for a figure of recorded numbers, the run that measured them (device, commit, date,
    torch; `bench.report.measured_run`), which the index then credits instead of this run.
    """
    if not _NAME.match(name) or name.lower().endswith(".png"):
        raise ValueError(f"figure name must be a plain stem like '01_e2m1_grid', got {name!r}")
    out_dir, why = figure_destination()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    if out_dir == locations.COMMITTED_FIGURES_DIR:
        rows = read_index()
        import torch

        this_run = {"device": _device_name(), "commit": locations.checkout_commit(),
                    "date": datetime.date.today().isoformat(), "torch": torch.__version__}
        credited = {key: (measured or this_run)[key] for key in this_run}
        rows[path.name] = {"figure": path.name, "notebook": _notebook_of(name), "mode": _mode, **credited}
        _write_index(rows, out_dir)
    if out_dir not in _said:
        _said.add(out_dir)
        print(f"figures of this run go to {_shown(out_dir)}/ ({why})")
    print(f"saved {_shown(path)}")
    return path


def show_committed_figure(name: str, what: str) -> Path | None:
    """Show the committed figure `name` where this machine does not measure `what` (a CPU), named
    with the run that made it (its figures/INDEX.md row: device, commit, torch, date, mode) -> its path,
    or None (and a line saying so) where no such figure is committed."""
    path = locations.COMMITTED_FIGURES_DIR / f"{name}.png"
    row = read_index().get(path.name)
    if row is None or not path.is_file():
        print(f"{what}: no committed figure {_shown(path)}; a run on a GPU draws it")
        return None
    print(f"{what}: not measured here; the committed figure {_shown(path)}, from a {row['mode']} run on "
          f"{row['device']} at commit {row['commit']} with torch {row['torch']} ({row['date']}; listed in "
          f"figures/{INDEX_NAME})")
    try:
        from IPython.display import Image, display
    except ImportError:  # outside IPython the line above is all there is
        return path
    display(Image(filename=str(path)))
    return path


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(locations.REPO_ROOT))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------ colours

# One colour per kernel path, the same in every figure and on every machine. Keys are the names of
# nvfp4lib.bench.peers.all_paths() (the package's paths and the peers) and of the two entry points.
# Families share a hue: CuTe blues, torch._scaled_mm reds and oranges, the entry points green and
# purple, peers greys and light greens.
PATH_COLORS = {
    "cute_fast": "#1f77b4",
    "cute_naive": "#aec7e8",
    "cute_fast_graph": "#17becf",
    "scaled_mm_reference": "#d62728",
    "scaled_mm_permuted": "#ff7f0e",
    "scaled_mm_transposed": "#8c564b",
    "scaled_mm_functional": "#e377c2",
    "scaled_mm_streams": "#ffbb78",
    "scaled_mm_graph": "#bcbd22",
    "dispatch": "#2ca02c",
    "hybrid": "#9467bd",
    "reference": "#c49c94",
    "peer_eager": "#404040",
    "peer_compiled": "#808080",
    "peer_bf16": "#b3b3b3",
    "triton_nvfp4": "#98df8a",
    "triton_nvfp4_bits": "#dbdb8d",
    "triton_dot_scaled": "#c5b0d5",
}
# Names outside PATH_COLORS get a colour from another palette, picked by a checksum of the name.
_FALLBACK_COLORS = tuple(matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20b"].colors)


def path_color(name: str) -> str:
    """The colour of path `name` (hex): fixed for the workbook's paths, else chosen from the name
    alone, so it never depends on which other paths a figure draws or in what order."""
    if name in PATH_COLORS:
        return PATH_COLORS[name]
    return _FALLBACK_COLORS[zlib.crc32(name.encode()) % len(_FALLBACK_COLORS)]
