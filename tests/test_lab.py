"""`make lab` as a reader uses it: the Makefile's server, notebook 01 opened in a real browser
(Debian's `chromium`, headless, driven by Playwright), the kernel "Python (nvfp4)" picked in the
Kernel menu's dialog, Run > Run All Cells, and the executed page checked and photographed into
build/lab/01_fp4_quantization.png for a person to look at.

`make lab PYTHON=<this interpreter>` gets a free loopback port, a token and throw-away Jupyter
folders; it registers the kernel in this checkout's build/jupyter, where the server it starts looks first. Autosave is off and checkpoints and
figures go to the temporary folder, so the committed notebooks and figures must be byte-for-byte
unchanged afterwards. Every wait has a deadline. Skipped, saying why, without playwright, jupyterlab
or chromium.
"""

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from nvfp4lib.locations import BUILD_DIR, COMMITTED_FIGURES_DIR, FIGURES_ENV_VAR, NOTEBOOKS_DIR, REPO_ROOT

pytestmark = pytest.mark.slow

pytest.importorskip("jupyterlab", reason="jupyterlab is not installed: pip install -e '.[dev]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("no `chromium` on PATH (Debian: apt-get install chromium)", allow_module_level=True)

NOTEBOOK = "notebooks/01_fp4_quantization.ipynb"
CODE = ["".join(c["source"]) for c in json.loads((REPO_ROOT / NOTEBOOK).read_text())["cells"]
        if c["cell_type"] == "code"]  # the sources of its code cells, in order
KERNEL = "Python (nvfp4)"  # the display name `make lab` registers
SCREENSHOT = BUILD_DIR / "lab" / "01_fp4_quantization.png"
WINDOW = {"width": 1400, "height": 1000}
SERVER_START_S, STEP_S, RUN_S = 120, 120, 300  # generous: CI is a busy 2-core machine
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp{,6} notation
# Lab settings for the run: never autosave (the server's root is this checkout), no news prompt
# over the page, every cell laid out and no blank tail, so that one screenshot holds the notebook.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none", "scrollPastEnd": False},
}
# The run is over: every code cell is on the page, none is queued or running, the kernel is idle.
RUN_OVER_JS = """n => {
  const prompts = Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt'),
                             e => e.textContent.trim());
  const status = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator')?.dataset.status;
  return status === 'idle' && prompts.length === n && !prompts.includes('[*]:')
    && prompts.some(p => /^\\[\\d+\\]:$/.test(p));
}"""
# What each code cell shows: its prompt, first line and outputs. An error renders like stderr
# (data-mime-type application/vnd.jupyter.stderr), so TRACEBACK below tells the two apart.
CELLS_JS = """() => Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell'), c => ({
  prompt: c.querySelector('.jp-InputPrompt').textContent.trim(),
  source: c.querySelector('.jp-InputArea-editor .cm-line')?.textContent ?? '',
  outputs: Array.from(c.querySelectorAll('.jp-OutputArea-output'),
                      o => ({mime: o.dataset.mimeType ?? '', text: o.innerText})),
}))"""
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|Cell In\[\d+\], line \d+")


def _snapshot():
    """Every entry under notebooks/ and figures/ (checkpoint folders included) and each file's hash."""
    return {str(p.relative_to(REPO_ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for folder in (NOTEBOOKS_DIR, COMMITTED_FIGURES_DIR) for p in sorted(folder.rglob("*"))}


def _wait_for(check, timeout, what):
    """check()'s first truthy value, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.25)
    return value


class Lab:
    """The running `make lab`: its address, token, throw-away folder and log."""

    def __init__(self, work, port, token, proc):
        self.work, self.port, self.token, self.proc = work, port, token, proc
        self.base = f"http://127.0.0.1:{port}"

    def api(self, method, path):
        request = urllib.request.Request(self.base + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def up(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"make lab exited with code {self.proc.returncode}\n{self.log_tail()}")
        with contextlib.suppress(OSError):
            return self.api("GET", "/api/status") is not None

    def kernel(self):
        """NOTEBOOK's kernel once the page is connected to it and it is idle (else None)."""
        for session in self.api("GET", "/api/sessions"):
            kernel = session["kernel"] if session["path"] == NOTEBOOK else None
            if kernel and kernel["execution_state"] == "idle" and kernel["connections"] >= 1:
                return kernel

    def log_tail(self, lines=30):
        return "make lab log (tail):\n" + "\n".join((self.work / "lab.log").read_text().splitlines()[-lines:])


@pytest.fixture(scope="module")
def committed():
    """notebooks/ and figures/ before the server saw them."""
    return _snapshot()


@pytest.fixture(scope="module")
def lab(committed, tmp_path_factory):
    """`make lab` on a free loopback port with a token; stopped, with its kernels, however the tests end."""
    work = tmp_path_factory.mktemp("lab")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = {**os.environ, FIGURES_ENV_VAR: str(work / "figures"), "JUPYTER_TOKEN": token,
           "JUPYTER_PORT": str(port), "JUPYTER_PORT_RETRIES": "0"}
    for name in ("MPLBACKEND", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # as typed in a fresh shell (also under make test)
        env.pop(name, None)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR",
                 "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR"):
        env[name] = str(work / name.lower())
    config = {"FileCheckpoints": {"checkpoint_dir": str(work / "checkpoints")},  # not next to the notebooks
              "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"}}
    (work / "jupyter_config_dir").mkdir()
    (work / "jupyter_config_dir" / "jupyter_server_config.json").write_text(json.dumps(config))
    for plugin, values in LAB_SETTINGS.items():
        path = work / "jupyterlab_settings_dir" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    with open(work / "lab.log", "w") as log:
        proc = subprocess.Popen(["make", "-C", str(REPO_ROOT), "lab", f"PYTHON={sys.executable}"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    server = Lab(work, port, token, proc)
    try:
        _wait_for(server.up, SERVER_START_S, f"make lab to serve {server.base}")
        yield server
    finally:
        with contextlib.suppress(OSError):
            server.api("POST", "/api/shutdown")  # the server stops its kernels, then itself
        for sig in (signal.SIGTERM, signal.SIGKILL):  # where it did not (a kernel left behind exits with it)
            try:
                proc.wait(30)
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its process group outlived make
        proc.wait(30)


def _menu(page, menu, item):
    """Pick `item` from the menu bar's `menu`, with the mouse."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu .lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def _screenshot(page, path):
    """The whole notebook in one picture: the window made as tall as the notebook, then a page shot."""
    scroller = page.locator(".jp-NotebookPanel .jp-WindowedPanel-outer")
    extra = scroller.evaluate("e => e.scrollHeight - e.clientHeight")
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": size["height"] + extra})
    page.wait_for_function("e => e.scrollHeight <= e.clientHeight + 1", arg=scroller.element_handle())
    scroller.evaluate("e => e.scrollTo(0, 0)")
    page.screenshot(path=path, full_page=True)


@pytest.fixture(scope="module")
def executed(lab):
    """NOTEBOOK opened, the kernel picked and every cell run through the page, as a reader does it;
    returns (the kernel picked, the toolbar's kernel name, what each code cell shows). The browser
    is closed on return, so nothing of it can save the notebook afterwards."""
    failed_shot = SCREENSHOT.with_suffix(".failed.png")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    for old in (SCREENSHOT, failed_shot):
        old.unlink(missing_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport=WINDOW)
        page.set_default_timeout(STEP_S * 1000)
        step = "opening the notebook"
        try:
            page.goto(f"{lab.base}/lab/tree/{NOTEBOOK}?reset&token={lab.token}")
            first = _wait_for(lab.kernel, STEP_S, "the kernel the notebook names")
            step = f"picking {KERNEL!r} in Kernel > Change Kernel…"
            _menu(page, "Kernel", "Change Kernel…")
            dialog = page.locator(".jp-Dialog")
            dialog.locator("select").select_option(label=KERNEL)
            dialog.get_by_role("button", name="Select Kernel").click()
            dialog.wait_for(state="detached")
            picked = _wait_for(lambda: (k := lab.kernel()) and k["id"] != first["id"] and k, STEP_S,
                               "the picked kernel to start")
            step = "Run > Run All Cells"
            _menu(page, "Run", "Run All Cells")
            page.wait_for_function(RUN_OVER_JS, arg=len(CODE), polling=500, timeout=RUN_S * 1000)
            shown = page.evaluate(CELLS_JS)
            toolbar = page.locator(".jp-NotebookPanel .jp-Toolbar-kernelName").inner_text().strip()
            step = "the screenshot"
            _screenshot(page, SCREENSHOT)
        except (sync_api.Error, TimeoutError, OSError) as err:
            prompts = "?"
            with contextlib.suppress(sync_api.Error):
                page.screenshot(path=failed_shot)
                prompts = " ".join(c["prompt"] for c in page.evaluate(CELLS_JS))
            pytest.fail(f"{step}: {err}\nprompts: {prompts}\n{lab.log_tail()}", pytrace=False)
        finally:
            browser.close()
    return picked, toolbar, shown


def test_server_listens_on_loopback_only_and_wants_the_token(lab):
    listening = set()  # local addresses of listening (state 0A) sockets on the port, where there is /proc
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for local, state in (line.split()[1:4:2] for line in f.readlines()[1:]):
                address, port = local.split(":")
                if state == "0A" and int(port, 16) == lab.port:
                    listening.add(address)
    assert listening <= LOOPBACK, f"listening on {listening}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab.base}/api/contents/notebooks", timeout=10)
    assert refused.value.code == 403


def test_the_picked_kernel_is_make_labs_with_this_checkout(lab, executed):
    picked, toolbar, _ = executed
    assert picked["name"] == "nvfp4" and toolbar == KERNEL
    spec = json.loads((BUILD_DIR / "jupyter" / "share" / "jupyter" / "kernels" / "nvfp4" / "kernel.json").read_text())
    assert spec["display_name"] == KERNEL and spec["argv"][0] == sys.executable
    assert spec["env"]["PYTHONPATH"] == str(REPO_ROOT), "the kernel imports this checkout's nvfp4lib"


def test_every_cell_ran_and_none_shows_an_error(executed):
    *_, shown = executed
    errors = [f"code cell {i} ({c['source']}):\n{o['text'][-1500:]}" for i, c in enumerate(shown, 1)
              for o in c["outputs"] if o["mime"] == "application/vnd.jupyter.stderr" and TRACEBACK.search(o["text"])]
    assert not errors, "\n".join(errors)
    not_run = [f"code cell {i} {c['prompt']} ({c['source']})" for i, c in enumerate(shown, 1)
               if not re.fullmatch(r"\[\d+\]:", c["prompt"])]
    assert not not_run, f"without an execution count: {not_run}"
    printed = "".join(o["text"] for c in shown for o in c["outputs"])
    assert "PASS" in printed, "the notebook's inline checks print PASS lines"


def test_figures_show_on_the_page_and_go_to_the_temporary_folder(lab, executed):
    *_, shown = executed
    saved = re.findall(r'save_figure\(fig, "(\w+)"\)', "".join(CODE))
    images = [c for c in shown if any(o["mime"] == "image/png" for o in c["outputs"])]
    assert saved and len(images) == len(saved)
    assert sorted(p.stem for p in (lab.work / "figures").glob("*.png")) == sorted(saved)


def test_screenshot_shows_the_whole_notebook(executed):
    from PIL import Image  # matplotlib's own dependency

    with Image.open(SCREENSHOT) as shot:
        pixels = shot.width * shot.height
        commonest = max(shot.convert("RGB").getcolors(pixels))[0]
        assert commonest / pixels < 0.95, f"a blank page: {SCREENSHOT}"
        assert shot.height > 2 * WINDOW["height"], f"one window, not the whole notebook: {SCREENSHOT}"


def test_committed_notebooks_and_figures_are_untouched(executed, committed):
    """Nothing saved (autosave is off), no checkpoint next to the notebooks, no figure replaced."""
    assert _snapshot() == committed
