"""Where figures go and how figures/INDEX.md records them (nvfp4lib.bench.plots).

A run may replace the committed figures only in full mode on a GPU that is the device of the
committed figures; every other run writes to build/figures/. The index has one row per committed PNG.
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from nvfp4lib import locations  # noqa: E402
from nvfp4lib.bench import plots


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A throw-away repository layout with the committed-figures folder and the build folder."""
    monkeypatch.delenv(locations.FIGURES_ENV_VAR, raising=False)
    monkeypatch.setattr(locations, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(locations, "COMMITTED_FIGURES_DIR", tmp_path / "figures")
    monkeypatch.setattr(locations, "BUILD_FIGURES_DIR", tmp_path / "build" / "figures")
    monkeypatch.setenv(locations.COMMIT_ENV_VAR, "0123456789abcdef")
    monkeypatch.setattr(plots, "_said", set())
    (tmp_path / "figures").mkdir()
    yield tmp_path
    plots.declare_mode(None)


def _save(name="01_example"):
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    try:
        return plots.save_figure(fig, name)
    finally:
        plt.close(fig)


def test_cpu_run_never_touches_committed_figures(repo, monkeypatch):
    monkeypatch.setattr(plots, "_device_name", lambda: "CPU")
    for mode in ("full", "small", None):
        plots.declare_mode(mode)
        path = _save()
        assert path.parent == repo / "build" / "figures"
    assert list((repo / "figures").iterdir()) == []


def test_full_gpu_run_writes_committed_figure_and_index_row(repo, monkeypatch):
    monkeypatch.setattr(plots, "_device_name", lambda: "NVIDIA H200")
    plots.declare_mode("full")
    path = _save("02_first")
    _save("01_second")
    assert path.parent == repo / "figures"
    rows = plots.read_index()
    assert sorted(rows) == ["01_second.png", "02_first.png"]
    assert rows["02_first.png"]["device"] == "NVIDIA H200"
    assert rows["02_first.png"]["mode"] == "full"
    assert rows["02_first.png"]["commit"] == "0123456789ab"
    assert rows["02_first.png"]["torch"] == torch.__version__, "the PyTorch the figure was made with"


def test_small_or_other_device_goes_to_build(repo, monkeypatch):
    monkeypatch.setattr(plots, "_device_name", lambda: "NVIDIA H200")
    plots.declare_mode("full")
    _save("01_kept")
    before = (repo / "figures" / "INDEX.md").read_text()
    plots.declare_mode("small")
    assert _save("01_kept").parent == repo / "build" / "figures"
    monkeypatch.setattr(plots, "_device_name", lambda: "NVIDIA B200")
    plots.declare_mode("full")
    assert _save("01_kept").parent == repo / "build" / "figures"
    assert (repo / "figures" / "INDEX.md").read_text() == before


def test_environment_override_wins(repo, monkeypatch):
    monkeypatch.setenv(locations.FIGURES_ENV_VAR, str(repo / "elsewhere"))
    plots.declare_mode("full")
    assert _save().parent == repo / "elsewhere"


def test_resolve_small_declares_the_mode(repo):
    assert plots.resolve_small(True) is True and plots._mode == "small"
    assert plots.resolve_small(False) is False and plots._mode == "full"


def test_committed_index_lists_every_committed_png():
    """The repository's own figures/: one index row per PNG, no row without a PNG."""
    pngs = {p.name for p in locations.COMMITTED_FIGURES_DIR.glob("*.png")}
    rows = plots.read_index()
    assert set(rows) == pngs, f"unlisted: {sorted(pngs - set(rows))}, listed but missing: {sorted(set(rows) - pngs)}"
    assert {r["mode"] for r in rows.values()} <= {"full"}
    assert len({r["device"] for r in rows.values()}) <= 1, "committed figures come from one device"


def test_a_committed_figure_is_shown_with_the_run_that_made_it(repo, monkeypatch, capsys):
    monkeypatch.setattr(plots, "_device_name", lambda: "NVIDIA H200")
    plots.declare_mode("full")
    path = _save("02_measured")
    capsys.readouterr()
    assert plots.show_committed_figure("02_measured", "the times") == path
    out = capsys.readouterr().out
    assert out.startswith("the times: not measured here; the committed figure figures/02_measured.png, from a full "
                          f"run on NVIDIA H200 at commit 0123456789ab with torch {torch.__version__} (")
    assert plots.show_committed_figure("02_absent", "the times") is None
    assert capsys.readouterr().out == "the times: no committed figure figures/02_absent.png; a run on a GPU draws it\n"


def test_a_figure_of_recorded_numbers_is_credited_to_the_run_that_measured_them(repo, monkeypatch):
    """A figure drawn from a results CSV (notebook 00's) names the CSV's run in the index, not the
    checkout that drew it: device, commit, date and torch from the rows' own columns."""
    from nvfp4lib.bench import report as bench_report

    monkeypatch.setattr(plots, "_device_name", lambda: "NVIDIA H200")
    plots.declare_mode("full")
    rows = [dict(path="copy", kind="ceiling"),
            dict(path="cute_fast", env_gpu="NVIDIA H200", date="2026-11-30", commit="feedc0ffee12", env_torch="2.9.1")]
    fig, ax = plt.subplots(figsize=(1, 1))
    try:
        plots.save_figure(fig, "00_recorded", measured=bench_report.measured_run(rows))
    finally:
        plt.close(fig)
    row = plots.read_index()["00_recorded.png"]
    assert (row["device"], row["commit"], row["date"], row["torch"], row["mode"]) == \
        ("NVIDIA H200", "feedc0ffee12", "2026-11-30", "2.9.1", "full")
    _save("01_drawn_here")
    assert plots.read_index()["01_drawn_here.png"]["commit"] == "0123456789ab", "other figures: this run's commit"


def test_the_committed_progression_figure_and_its_printed_log_are_one_run():
    """Notebook 04 on a CPU shows figures/04_progression.png and the times of
    results/h200_nb04_progression.log side by side: both must come from the same run."""
    import re

    log = (locations.RESULTS_DIR / "h200_nb04_progression.log").read_text().splitlines()[0]
    row = plots.read_index()["04_progression.png"]
    logged = re.search(r"\bcommit ([0-9a-f]{7,40})\b", log).group(1)
    assert row["commit"] == logged, f"figures/INDEX.md: {row['commit']}, the log: {logged}"
    assert row["device"] in log and row["torch"] in log and row["date"] in log, (row, log)
