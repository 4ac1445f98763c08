"""`make bench` as a newcomer reads it: on a CPU each path left out says whether it cannot run here or
could run only as an emulation, which is not timed; the bars figure says when its shapes are scaled-down
stand-ins, names the file, device and commit of its numbers, and its shape labels do not overlap."""

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from nvfp4lib.bench import report as bench_report  # noqa: E402
from nvfp4lib.bench import suite  # noqa: E402
from nvfp4lib.bench.peers import all_paths  # noqa: E402
from nvfp4lib.device import capabilities  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A quick CPU run of one path that can run here, one that cannot and one that would be an emulation."""
    if capabilities().cuda:
        pytest.skip("what a CPU run prints and draws (a GPU runs the real shapes)")
    out = tmp_path_factory.mktemp("bench")
    capture = pytest.MonkeyPatch()
    lines: list[str] = []
    capture.setattr("builtins.print", lambda *args, **kwargs: lines.append(" ".join(map(str, args))))
    try:
        csv_path = suite.run(quick=True, out_dir=out, only=["peer_bf16", "cute_naive", "scaled_mm_reference"],
                             progress=False)
    finally:
        capture.undo()
    return csv_path, lines


def test_a_path_left_out_says_whether_it_cannot_run_or_would_be_an_emulation(cpu_run):
    _, lines = cpu_run
    caps = capabilities()
    emulation = all_paths()["scaled_mm_reference"].why_not_timed(caps, caps.cuda)
    assert "emulation" in emulation
    assert f"skipped scaled_mm_reference, not timed: {emulation}; the benchmark times no emulation" in lines
    cannot = all_paths()["cute_naive"].unavailable(caps, caps.cuda)
    assert f"skipped cute_naive, cannot run here: {cannot}" in lines
    assert not any(line.startswith("skipped peer_bf16") for line in lines)


def _tick_boxes(ax):
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    return [label.get_window_extent(renderer) for label in ax.get_xticklabels() if label.get_text()]


def test_the_cpu_bars_say_scaled_down_shapes_and_their_labels_do_not_overlap(cpu_run):
    csv_path, _ = cpu_run
    rows = bench_report.load_results(csv_path)
    figures = bench_report.make_figures(csv_path)
    try:
        ax = figures["00_benchmark_bars"].axes[0]
        title = ax.get_title()
        assert "scaled-down stand-ins for the benchmark shapes" in title and "at the benchmark shapes" not in title
        assert bench_report.results_source(csv_path, rows) in title and bench_report.CPU_NOTE in title
        boxes = _tick_boxes(ax)
        assert len(boxes) == 3, [label.get_text() for label in ax.get_xticklabels()]
        overlapping = [(a.x0, a.x1, b.x0, b.x1) for a, b in itertools.combinations(boxes, 2)
                       if a.x0 < b.x1 and b.x0 < a.x1]
        assert not overlapping, overlapping
    finally:
        for fig in figures.values():
            plt.close(fig)


@pytest.mark.parametrize("path", [p for p in bench_report.committed_results() if p.stem == "h200"],
                         ids=lambda p: p.name)
def test_the_committed_bars_name_the_run_of_their_numbers(path):
    rows = bench_report.load_results(path)
    run = bench_report.measured_run(rows)
    figures = bench_report.make_figures(path)
    try:
        for name, fig in figures.items():
            title = fig.axes[0].get_title() if name == "00_benchmark_bars" else fig.get_suptitle()
            assert f"{path.relative_to(bench_report.REPO_ROOT)}: {run['device']}" in title, title
            assert f"commit {run['commit']}" in title, title
        assert "at the benchmark shapes" in figures["00_benchmark_bars"].axes[0].get_title()
    finally:
        for fig in figures.values():
            plt.close(fig)
