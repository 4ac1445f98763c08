"""Command lines and settings a user can get wrong: each gets one clear error naming what is wrong,
never a traceback or a silent wrong run (the benchmark suite's --out, the profiler's --shapes, a
notebook's `small`, NVFP4_FIGURES_DIR and NVFP4_COMMIT)."""

import pytest

from nvfp4lib import locations
from nvfp4lib.bench import plots, profile, suite
from tests.test_figures import _save, repo  # noqa: F401 - a fixture


def test_the_suites_out_must_be_a_folder(tmp_path, capsys):
    blocker = tmp_path / "results.csv"
    blocker.write_text("a file")
    for out in (blocker, blocker / "below"):
        with pytest.raises(SystemExit) as exit_:
            suite.main(["--out", str(out), "--quick"])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"argument --out: expected a folder (for <device>.csv), but {blocker} is a file")
    assert blocker.read_text() == "a file"


@pytest.mark.parametrize("shape", ["0x0x0", "128x0x1", "128x100x1", "128x256x0", "128x256", "ax256x1"])
def test_the_profilers_shapes_are_problem_shapes_even_for_a_dry_run(shape, capsys):
    with pytest.raises(SystemExit) as exit_:
        profile.main(["--shapes", shape, "--dry-run"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"argument --shapes: expected MxKxL with M, L >= 1 and K a positive multiple of 16, got {shape!r}")


def test_a_dry_run_of_good_shapes_prints_the_command(capsys):
    assert profile.main(["--shapes", "128x256x1", "--dry-run"]) == 0
    assert "--shapes 128x256x1" in capsys.readouterr().out


@pytest.mark.parametrize("small", ["False", "True", 0, 1.0])
def test_a_notebooks_small_is_true_false_or_none(repo, small):  # noqa: F811 - the fixture
    """A string (papermill's -r) would be true whatever it says: refused, naming the parameter."""
    with pytest.raises(ValueError, match=rf"small: expected True, False or None, got {small!r} \("):
        plots.resolve_small(small)


def test_figures_dir_on_the_committed_folder_is_refused_to_a_run_that_may_not_write_there(repo, monkeypatch):  # noqa: F811
    """A small CPU run pointed at figures/ must not replace what a full GPU run committed."""
    committed = locations.COMMITTED_FIGURES_DIR
    (committed / "01_example.png").write_bytes(b"committed")
    monkeypatch.setenv(locations.FIGURES_ENV_VAR, str(committed))
    plots.resolve_small(True)
    with pytest.raises(ValueError, match=r"NVFP4_FIGURES_DIR: .* is the committed figures' folder, which only a full "
                                         r"run on a GPU may write \(this is a small run on CPU\)"):
        _save()
    assert (committed / "01_example.png").read_bytes() == b"committed"
    monkeypatch.setenv(locations.FIGURES_ENV_VAR, str(repo / "elsewhere"))
    assert _save().parent == repo / "elsewhere"


@pytest.mark.parametrize("commit", ["abc|def", "abc\ndef", "a b", "abc`"])
def test_a_commit_that_would_break_the_figure_index_is_refused(monkeypatch, commit):
    monkeypatch.setenv(locations.COMMIT_ENV_VAR, commit)
    with pytest.raises(ValueError, match=r"NVFP4_COMMIT: expected a commit \(letters, digits"):
        locations.checkout_commit()
    monkeypatch.setenv(locations.COMMIT_ENV_VAR, "0123456789abcdef-dirty")
    assert locations.checkout_commit() == "0123456789ab"
