"""Path colours (nvfp4lib.bench.plots.path_color): a path has one colour in every figure and on every
machine, whatever else a figure draws and in whatever order, under each of its names."""

import os
import random
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from nvfp4lib.bench.peers import all_paths  # noqa: E402
from nvfp4lib.bench import report as bench_report
from nvfp4lib.leaderboard import export
from nvfp4lib.bench import suite
from nvfp4lib.device import capabilities  # noqa: E402
from nvfp4lib.locations import REPO_ROOT  # noqa: E402
from nvfp4lib.bench.plots import PATH_COLORS, path_color  # noqa: E402
from nvfp4lib.problem import BENCHMARK_SHAPES, bytes_moved  # noqa: E402


def _suite_names() -> list[str]:
    ran, skipped = suite.discover_paths(capabilities())
    return [p.name for p in ran] + [name for name, _ in skipped]


def _committed_names() -> list[str]:
    """The path names of the committed result CSVs: the names of the registry, no other spelling
    (kernel configs timed by `make bench-cute`, `cute_fast[...]`, are named by their config instead)."""
    rows = [r for csv in bench_report.committed_results() for r in bench_report.load_results(csv)
            if "path" in r]  # a CSV of another schema: test_suite's test of the committed results names it
    return sorted({r["path"] for r in rows if r.get("kind") != "ceiling" and "[" not in r["path"]})


NAMING_SCHEMES = {
    "suite": _suite_names(),
    "peers.all_paths()": list(all_paths()),
    "export.EXPORTS": list(export.EXPORTS),
    "committed results": _committed_names(),
}
UNKNOWN = ["cute-fast-v2", "my_kernel", "Peer-Triton", "x"]


@pytest.mark.parametrize("scheme", NAMING_SCHEMES)
def test_every_path_has_a_fixed_colour_distinct_within_its_scheme(scheme):
    names = NAMING_SCHEMES[scheme]
    assert names, scheme
    assert all(n in PATH_COLORS for n in names), [n for n in names if n not in PATH_COLORS]
    colors = [path_color(n) for n in names]
    assert len(set(colors)) == len(colors), dict(zip(names, colors))


def test_fixed_colours_are_distinct_and_valid():
    assert len(set(PATH_COLORS.values())) == len(PATH_COLORS)
    assert all(to_hex(c) == c for c in PATH_COLORS.values())


def test_the_fixed_colours_are_those_of_the_registry_paths():
    """One colour per registry path, plus the dispatcher and the hybrid file; no colour of a name gone."""
    assert set(PATH_COLORS) == set(all_paths()) | {"dispatch", export.HYBRID}


def test_unknown_names_get_a_valid_colour_that_does_not_depend_on_the_process():
    """The fallback must not use Python's per-process salted hash of strings."""
    here = [path_color(n) for n in UNKNOWN]
    assert all(to_hex(c) == c for c in here)
    code = f"from nvfp4lib.bench.plots import path_color; print(' '.join(path_color(n) for n in {UNKNOWN!r}))"
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, MPLBACKEND="Agg")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             cwd=REPO_ROOT, env=env)
        assert out.stdout.split() == here


def _rows(names: list[str]) -> list[dict]:
    """Benchmark-shape rows of a suite CSV for these paths (each of the kind the registry gives it)."""
    rows = []
    for s in BENCHMARK_SHAPES:
        for i, name in enumerate(names):
            kind = all_paths()[name].kind if name in all_paths() else "nvfp4lib"
            rows.append(dict(path=name, kind=kind, label=name,
                             shape_set="benchmark", m=s.m, k=s.k, l=s.l, bytes=bytes_moved(s), status="ok",
                             kernel_us=10.0 + i, leaderboard_us=15.0 + i, host_us=2.0, timing="cuda-events",
                             env_gpu="NVIDIA H200"))
    return rows


def _bar_colors(rows: list[dict]) -> dict[str, str]:
    fig = bench_report.bars_figure(rows)
    try:
        return {bars.get_label(): to_hex(bars.patches[0].get_facecolor()) for bars in fig.axes[0].containers}
    finally:
        plt.close(fig)


def test_a_figure_colours_each_path_by_its_name_alone():
    names = NAMING_SCHEMES["suite"] + UNKNOWN[:2]
    everything = _bar_colors(_rows(names))
    assert everything == {n: path_color(n) for n in names}
    rng = random.Random(0)
    for _ in range(3):
        some = rng.sample(names, 3)
        assert _bar_colors(_rows(some)) == {n: everything[n] for n in some}
    assert _bar_colors(_rows(names[::-1])) == everything
