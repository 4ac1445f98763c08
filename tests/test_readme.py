"""What README (and docs/, results/) say, held against what they describe: every python block that calls
the package runs as written, in a fresh interpreter (on a CPU at a small size); every `nvfp4lib.*` name
resolves; the first results table and the sentences about its run are the committed CSV's numbers; the
counters README cites are those of the committed profile; each embedded figure names the run that
figures/INDEX.md credits it to, and notebook 00's figures are credited to the CSV they draw."""

import importlib
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nvfp4lib.bench import plots
from nvfp4lib.bench import report as bench_report
from nvfp4lib.bench.profile import load_profile
from nvfp4lib.locations import REPO_ROOT, RESULTS_DIR
from nvfp4lib.problem import BENCHMARK_SHAPES

README = REPO_ROOT / "README.md"
TEXT = README.read_text()
RESULTS_CSV = RESULTS_DIR / "h200.csv"  # the run of README's first table
PROFILE_CSV = RESULTS_DIR / "h200_profile.csv"  # the counters README cites
SMALL_SHAPE = (128, 256, 1)  # what a block's generate_input(M, K, L, ...) becomes on a CPU


# ------------------------------------------------------------------------------ the python blocks


def _python_blocks() -> list[tuple[int, str]]:
    """(line, source) of every ```python block of README that uses the package."""
    blocks = [(TEXT[:m.start()].count("\n") + 2, m.group(1))
              for m in re.finditer(r"^```python\n(.*?)^```", TEXT, re.S | re.M)]
    return [(line, source) for line, source in blocks if "nvfp4lib" in source]


def _as_run_here(source: str) -> str:
    """The block as written; without CUDA its generate_input sizes shrink to SMALL_SHAPE (the CPU runs
    the emulation, seconds at the benchmark shapes)."""
    if torch.cuda.is_available():
        return source
    return re.sub(r"generate_input\(\s*\d+\s*,\s*\d+\s*,\s*\d+", "generate_input(%d, %d, %d" % SMALL_SHAPE, source)


def test_readme_has_python_blocks_that_call_the_package():
    assert _python_blocks(), "README holds no python block that uses nvfp4lib"


@pytest.mark.parametrize("line, source", _python_blocks(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_every_python_block_that_calls_the_package_runs_as_written(line, source):
    """In a fresh interpreter, so that what the block imports is all it has (`import nvfp4lib` alone must
    register the op); a tensor the block names `c` must be the GEMV's output: float16 [M, 1, L]."""
    check = textwrap.dedent("""
        import torch as _torch
        _c = globals().get("c")
        if isinstance(_c, _torch.Tensor):
            assert _c.dtype == _torch.float16 and _c.dim() == 3 and _c.shape[1] == 1, (_c.dtype, _c.shape)
        print("block ran")
    """)
    out = subprocess.run([sys.executable, "-c", _as_run_here(source) + check], capture_output=True, text=True,
                         timeout=300, cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert out.returncode == 0 and out.stdout.endswith("block ran\n"), \
        f"README.md:{line}: the block failed:\n{source}\n{out.stdout[-2000:]}{out.stderr[-4000:]}"


# ------------------------------------------------------------------------------ dotted names

NAMED_IN = [README, *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "figures" / "INDEX.md",
            *sorted(p for p in RESULTS_DIR.iterdir() if p.suffix in (".md", ".log", ".csv"))]
DOTTED = re.compile(r"\bnvfp4lib(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _resolve(name: str) -> str | None:
    """None if `name` is a module of the package or an attribute reached from one, else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and not (module_name == err.name or module_name.startswith(err.name + ".")):
                return f"importing {module_name} needs {err.name}, which is not installed"
            continue
        for depth, attr in enumerate(parts[cut:], cut):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:depth])} has no attribute {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def test_every_nvfp4lib_name_in_the_docs_and_results_resolves():
    """A name the text gives must exist: import its module, getattr the rest. All unresolved names are
    listed, with where they are written."""
    found: dict[str, list[str]] = {}
    for path in NAMED_IN:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in DOTTED.findall(line):
                found.setdefault(name, []).append(f"{path.relative_to(REPO_ROOT)}:{number}")
    assert len(found) > 10, sorted(found)
    why = {name: _resolve(name) for name in sorted(found)}
    unresolved = [f"  {name}: {reason} (at {', '.join(found[name])})" for name, reason in why.items() if reason]
    assert not unresolved, f"{len(unresolved)} names that do not resolve:\n" + "\n".join(unresolved)


# ------------------------------------------------------------------------------ the first results table


@pytest.fixture(scope="module")
def recorded():
    return bench_report.load_results(RESULTS_CSV)


def _benchmark(rows, path: str) -> dict:
    got = bench_report.benchmark_rows(rows, path)
    assert set(got) == set(BENCHMARK_SHAPES), f"{RESULTS_CSV.name} has no {path} at every benchmark shape"
    return got


def _best_read_us(rows, shape) -> float:
    """The ceiling of README's table: the fastest read of the shape's bytes after the usual flush, by kernel time."""
    return min(r["kernel_us"] for r in rows if r["kind"] == "ceiling" and r.get("flush") == "dirty"
               and r["shape_set"] == "benchmark" and (r["m"], r["k"], r["l"]) == tuple(shape) and r["status"] == "ok")


def _decimals(cell: str) -> int:
    return len(cell.split(".")[1]) if "." in cell else 0


def _matches(cell: str, value: float) -> bool:
    """`cell` is `value` as written to the cell's own decimals."""
    return math.isclose(float(cell), value, abs_tol=0.5 * 10 ** -_decimals(cell) + 1e-9)


def _first_results_table() -> list[list[str]]:
    section = TEXT.split("## Results on an H200", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("| M x K x L | bytes | best read |")]
    assert lines, "README's first results table is gone"
    rows = section.split(lines[0], 1)[1].splitlines()[2:2 + len(BENCHMARK_SHAPES)]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_the_first_table_names_the_run_of_its_csv(recorded):
    """The paragraph over the table names the CSV's own commit, date, driver, PyTorch and CuTe DSL."""
    run = bench_report.measured_run(recorded)
    first = recorded[0]
    intro = TEXT.split("## Results on an H200", 1)[1].split("\n\n", 2)[1]
    expected = [f"at commit {run['commit'][:7]}", f"({run['date']})", f"driver {first['env_driver']}",
                f"PyTorch\n{run['torch']}" if f"PyTorch\n{run['torch']}" in intro else f"PyTorch {run['torch']}",
                f"CuTe DSL {first['env_cute_dsl']}", f"[`results/{RESULTS_CSV.name}`]"]
    missing = [e for e in expected if e not in intro]
    assert not missing, f"README's results paragraph should say {missing} (from {RESULTS_CSV.name}):\n{intro}"


def test_the_first_table_is_the_csvs_numbers(recorded):
    """Every cell of README's first table, to its own decimals, from results/h200.csv. A failure prints
    the rows as the CSV gives them (same columns, same decimals) to paste into README."""
    fast = _benchmark(recorded, "cute_fast")
    peers = {column: _benchmark(recorded, path) for column, path in
             ((7, "triton_nvfp4_bits"), (8, "peer_bf16"), (9, "peer_compiled"), (10, "peer_eager"))}
    table = _first_results_table()
    wrong, wanted = [], []
    for cells, shape in zip(table, BENCHMARK_SHAPES):
        assert cells[0] == " x ".join(map(str, shape)), cells
        row = fast[shape]
        values = {1: row["bytes"] / 1e6, 2: _best_read_us(recorded, shape), 3: row["leaderboard_us"],
                  4: row["kernel_us"], 5: row["kernel_pct_of_read"], 6: row["host_visible_us"]}
        speedups = {}
        for column, got in peers.items():
            values[column] = got[shape]["leaderboard_us"]
            speedups[column] = got[shape]["leaderboard_us"] / row["leaderboard_us"]
        expected = [cells[0]]
        for column in range(1, len(cells)):
            number = re.match(r"[\d.]+", cells[column]).group(0)
            shown = f"{values[column]:.{_decimals(number)}f}"
            if column in speedups:
                ratio = re.search(r"\(([\d.]+)x\)", cells[column]).group(1)
                shown += f" ({speedups[column]:.{_decimals(ratio)}f}x)"
                ok = _matches(number, values[column]) and _matches(ratio, speedups[column])
            else:
                ok = _matches(number, values[column])
            shown += cells[column][len(number):] if column in (1, 5) else ""
            expected.append(shown)
            if not ok:
                wrong.append(f"{cells[0]}, column {column + 1}: README {cells[column]!r}, {RESULTS_CSV.name} {shown!r}")
        wanted.append("| " + " | ".join(expected) + " |")
    assert not wrong, "\n".join(wrong) + f"\nthe rows from {RESULTS_CSV.name}:\n" + "\n".join(wanted)


def test_the_sentences_about_that_run_are_its_numbers(recorded):
    def three(path: str, decimals: int = 1) -> str:
        got = _benchmark(recorded, path)
        return " / ".join(f"{got[s]['leaderboard_us']:.{decimals}f}" for s in BENCHMARK_SHAPES)

    copy = next(r["kernel_gbps"] for r in recorded if r["path"] == "copy")
    said = {f"decoded from a table takes {three('triton_nvfp4')} us": "the Triton GEMV (triton_nvfp4)",
            f"takes {three('cute_naive')} us": "the naive CuTe kernel",
            f"device-to-device copy {copy:.0f} GB/s": "the copy"}
    flat = " ".join(TEXT.split())
    missing = [f"{what}: expected {text!r}" for text, what in said.items() if text not in flat]
    assert not missing, f"README, about the run of {RESULTS_CSV.name}:\n" + "\n".join(missing)


# ------------------------------------------------------------------------------ the counters


def test_the_counters_readme_cites_are_the_profiles():
    rows = {(r["config"], r["m"], r["k"], r["l"]): r for r in load_profile(PROFILE_CSV)}

    def row(config, shape):
        return rows[(config, *shape)]

    mid, short = BENCHMARK_SHAPES[1], BENCHMARK_SHAPES[2]
    default, same, loads = row("default", mid), row("w1x4x1", mid), row("w2x4x1-loads", mid)
    assert default["warp_instructions"] == same["warp_instructions"], "README calls them the same kernel"
    spread = abs(default["duration_us"] - same["duration_us"])
    dram = [r["dram_pct_of_peak"] for r in (default, same, loads)]
    said = [f"took {default['duration_us']:.1f} us under Nsight Compute in the profile's `default` row and "
            f"{same['duration_us']:.1f} us in its `w1x4x1` row",
            f"({int(default['warp_instructions']):,} warp instructions in both)",
            f"differ by {spread:.1f} us", f"took {loads['duration_us']:.1f} us, within that spread",
            f"at {min(dram):.0f}-{max(dram):.0f} % of its peak",
            f"it took {row('default', short)['duration_us']:.1f} us ({row('w1x4x1', short)['duration_us']:.1f} us "
            f"as `w1x4x1`) against {row('w2x4x1-loads', short)['duration_us']:.1f} us",
            f"at {row('default', short)['dram_pct_of_peak']:.0f} % of DRAM's peak (the loads "
            f"{row('w2x4x1-loads', short)['dram_pct_of_peak']:.0f} %), `long_scoreboard` "
            f"{100 * row('default', short)['stall_1_share']:.0f} %"]
    assert abs(loads["duration_us"] - default["duration_us"]) <= spread, "README: within that spread"
    assert row("default", short)["stall_1"] == "long_scoreboard"
    flat = " ".join(TEXT.split())
    missing = [text for text in said if text not in flat]
    assert not missing, f"README should say, from {PROFILE_CSV.name}:\n" + "\n".join(missing)


# ------------------------------------------------------------------------------ the figures


def test_each_embedded_figure_is_introduced_with_the_commit_index_credits_it_to():
    index = plots.read_index()
    image = re.compile(r"!\[[^\]]*\]\(figures/([^)]+\.png)\)")
    for m in image.finditer(TEXT):
        text_before = [p for p in TEXT[:m.start()].split("\n\n") if p.strip() and not image.fullmatch(p.strip())]
        before = re.sub(r"\n!\[.*", "", text_before[-1])  # the paragraph that introduces the figures
        commit = index[m.group(1)]["commit"]
        assert commit[:7] in before, f"README introduces figures/{m.group(1)} without commit {commit} ({before!r})"


def test_notebook_00s_figures_are_credited_to_the_csv_they_draw(recorded):
    index, run = plots.read_index(), bench_report.measured_run(recorded)
    for name in ("00_benchmark_bars.png", "00_roofline.png"):
        credited = {key: index[name][key] for key in ("device", "commit", "date", "torch")}
        assert credited == run, f"figures/INDEX.md credits {name} to {credited}; {RESULTS_CSV.name} is {run}"


def test_readme_paths_exist():
    """Every repository file README links to or names as `folder/file.ext` is there."""
    named = set(re.findall(r"\]\(((?:results|figures|docs|notebooks|tests|tools)/[^)#\s]+)\)", TEXT))
    named |= set(re.findall(r"`((?:results|figures|docs|tests|tools)/[\w./-]+\.\w+)`", TEXT))
    missing = sorted(p for p in named if not (REPO_ROOT / p).exists() and "<" not in p)
    assert not missing, missing
    assert Path(REPO_ROOT / "tests" / "test_lab.py").exists()
