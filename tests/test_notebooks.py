"""Every numbered notebook is committed clean and runs end to end in small mode; those whose full
mode needs no GPU (FULL_MODE_ON_CPU) run in full mode too.

Notebooks are discovered, so a new one is covered without editing this file. Execution goes
through the same runner as `make reproduce`; figures and executed copies go to a temporary folder.
"""

import nbformat
import pytest
from papermill.translators import PythonTranslator

from nvfp4lib.locations import FIGURES_ENV_VAR
from tools.run_notebooks import FULL_MODE_ON_CPU, NotebookFailed, discover, run_notebook

NOTEBOOKS = discover()
CELL_TIMEOUT_S = 300  # generous per cell; the whole notebook is expected to take well under a minute


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_clean(path):
    cells = nbformat.read(path, as_version=4).cells
    dirty = [i for i, c in enumerate(cells, 1)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"
    params = [c for c in cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, f"{path.name}: needs exactly one code cell tagged 'parameters', found {len(params)}"
    # What papermill can read is what it can override: e.g. an '=' inside a comment hides the line.
    found = {p.name for p in PythonTranslator.inspect(params[0])}
    missing = {"small", "seed"} - found
    assert not missing, (f"{path.name}: papermill cannot read {sorted(missing)} in the parameters cell "
                         "(write `name = value  # comment`, with no '=' in the comment)")


def _run(path, tmp_path, monkeypatch, small: bool) -> None:
    monkeypatch.setenv(FIGURES_ENV_VAR, str(tmp_path / "figures"))
    try:
        run_notebook(path, tmp_path / path.name, small=small, timeout=CELL_TIMEOUT_S)
    except NotebookFailed as err:
        pytest.fail(str(err), pytrace=False)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_in_small_mode(path, tmp_path, monkeypatch):
    _run(path, tmp_path, monkeypatch, small=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name in FULL_MODE_ON_CPU], ids=lambda p: p.stem)
def test_runs_in_full_mode(path, tmp_path, monkeypatch):
    _run(path, tmp_path, monkeypatch, small=False)


def test_full_mode_list_names_notebooks():
    assert set(FULL_MODE_ON_CPU) <= {p.name for p in NOTEBOOKS}
