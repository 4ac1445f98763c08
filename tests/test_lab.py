"""JupyterLab as a reader uses it: a server on 127.0.0.1, a notebook run to the end in the server's
kernel, and the notebook page rendered by a real browser (headless Chromium).

One server for the module; every wait is bounded (see tools/lab_smoke.py). Skipped, with the reason,
where jupyterlab or Chromium is missing. Figures go to a temporary folder, and the committed
notebooks must be byte-for-byte unchanged afterwards.
"""

import hashlib

import pytest

from nvfp4lib.locations import FIGURES_ENV_VAR, NOTEBOOKS_DIR
from tools import lab_smoke
from tools.run_notebooks import discover

pytestmark = pytest.mark.slow

_missing = lab_smoke.missing_requirement()
if _missing:
    pytest.skip(_missing, allow_module_level=True)

NOTEBOOK = "notebooks/02_scale_swizzling.ipynb"
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp{,6} notation


def _snapshot():
    """Every entry under notebooks/ (checkpoint folders included) and each file's hash."""
    return {str(p.relative_to(NOTEBOOKS_DIR)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(NOTEBOOKS_DIR.rglob("*"))}


@pytest.fixture(scope="module")
def committed():
    """notebooks/ before the server saw it."""
    return _snapshot()


@pytest.fixture(scope="module")
def lab(committed, tmp_path_factory):
    work = tmp_path_factory.mktemp("lab")
    with lab_smoke.LabServer(workdir=work, env={FIGURES_ENV_VAR: str(work / "figures")}) as server:
        yield server


@pytest.fixture(scope="module")
def executed(lab):
    """(session, cell runs) of NOTEBOOK executed through the server's kernel in small mode."""
    try:
        return lab_smoke.run_notebook(lab, NOTEBOOK, small=True)
    except lab_smoke.LabFailed as err:
        pytest.fail(f"{err}\n{lab.log_tail()}", pytrace=False)


def test_server_listens_on_loopback_only_and_wants_the_token(lab):
    addresses = lab.listening_addresses()
    if addresses is not None:
        assert addresses and addresses <= LOOPBACK, f"listening on {addresses}"
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab.base}/api/contents/notebooks", timeout=10)
    assert refused.value.code == 403


def test_contents_api_lists_every_notebook(lab):
    listing = lab.api("GET", "/api/contents/notebooks")
    assert listing["type"] == "directory"
    notebooks = {e["name"] for e in listing["content"] if e["type"] == "notebook"}
    assert {p.name for p in discover()} <= notebooks


def test_notebook_runs_to_the_end_in_the_server_kernel(lab, executed):
    session, runs = executed
    assert session["path"] == NOTEBOOK and session["kernel"]["name"] == "python3"
    assert runs[-1].status == "ok", lab_smoke.describe_failure(runs[-1]) + "\n" + lab.log_tail()
    model = lab.api("GET", f"/api/contents/{NOTEBOOK}")
    code_cells = [c for c in model["content"]["cells"] if c["cell_type"] == "code"]
    assert len(runs) == len(code_cells) + 1, "every code cell ran (plus the injected `small = True`)"
    errors = [r.index for r in runs if any(o["output_type"] == "error" for o in r.outputs)]
    assert not errors, f"cells {errors} raised"
    printed = "".join(o.get("text", "") for r in runs for o in r.outputs if o["output_type"] == "stream")
    assert "PASS" in printed, "the notebook's inline checks print PASS lines"


def test_figure_cells_display_png(executed):
    _, runs = executed
    figures = [r for r in runs if "image/png" in r.mime_types()]
    assert figures, "no cell displayed a PNG figure"
    saving = [r for r in runs if "save_figure(" in r.source]
    assert saving, "the notebook saves its figures with save_figure"
    assert all("image/png" in r.mime_types() for r in saving), \
        [r.index for r in saving if "image/png" not in r.mime_types()]


def test_notebook_page_renders_in_chromium(lab, executed, tmp_path):
    session, _ = executed
    title = lab_smoke.notebook_title(lab.api("GET", f"/api/contents/{NOTEBOOK}"))
    with lab_smoke.Chromium(tmp_path) as chromium:
        try:
            page = lab_smoke.check_page(chromium, lab.lab_url(NOTEBOOK), title)
        except lab_smoke.LabFailed as err:
            pytest.fail(f"{err}\n{lab.log_tail()}", pytrace=False)
        (tmp_path / "lab.png").write_bytes(page.screenshot)
        assert title in page.title_found
        assert any("Python 3" in name for name in page.kernel_names), page.kernel_names
        assert lab_smoke.blank_fraction(page.screenshot) < 0.95, f"blank page: {tmp_path / 'lab.png'}"
        # The page opened the notebook's existing session: one session for the path, same kernel,
        # and the browser is connected to it.
        sessions = [s for s in lab.api("GET", "/api/sessions") if s["path"] == NOTEBOOK]
        assert [s["kernel"]["id"] for s in sessions] == [session["kernel"]["id"]]
        lab_smoke.wait_until(
            lambda: lab.api("GET", f"/api/kernels/{session['kernel']['id']}")["connections"] >= 1,
            30, "the page to connect to the kernel")


def test_notebooks_folder_is_untouched(lab, executed, committed):
    """No notebook rewritten (autosave is off) and nothing added (checkpoints go elsewhere)."""
    assert _snapshot() == committed
