#!/usr/bin/env python3
"""Use the workbook the way a reader does: JupyterLab on 127.0.0.1, a notebook run through the
server's kernel, and the notebook page rendered in a real (headless) Chromium.

Steps: start `jupyter lab` on a free loopback port with a random token and throw-away settings,
list notebooks/ through the REST API, open a session for one notebook and execute every code cell
over the kernel's websocket (as the Lab UI does; `small = True` is set after the parameters cell),
then load the notebook's Lab URL in headless Chromium, wait until the page shows the notebook's
title, check that the page attached to the same kernel, and take a screenshot. Everything stops at
the end. Needs jupyterlab (which brings tornado) and a Chromium binary (Debian: `chromium`).

    python tools/lab_smoke.py [--notebook 02_scale_swizzling] [--screenshot lab.png]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_NOTEBOOK = "02_scale_swizzling"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Headless, no sandbox (CI runs as root), and no background traffic to the outside world.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000", "--remote-debugging-address=127.0.0.1",
                  "--remote-debugging-port=0")
# Lab settings for the throw-away settings folder: never autosave (the notebooks under the server's
# root are the committed ones) and never ask about news.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}
SERVER_START_S = 90
CELL_TIMEOUT_S = 300
PAGE_TIMEOUT_S = 120


class LabFailed(RuntimeError):
    """A step of the smoke run failed; the message says which and includes the server log tail."""


def find_chromium() -> str | None:
    """The Chromium to drive: $NVFP4_CHROMIUM, or the first of chromium / chromium-browser / google-chrome on PATH."""
    explicit = os.environ.get("NVFP4_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def missing_requirement() -> str | None:
    """Why this machine cannot run the smoke test (None: it can)."""
    for module, fix in (("jupyterlab", "pip install jupyterlab"), ("tornado", "pip install tornado"),
                        ("ipykernel", "pip install ipykernel")):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed in {sys.executable}: {fix}"
    if find_chromium() is None:
        return "no Chromium found (Debian: apt-get install chromium; or set NVFP4_CHROMIUM)"
    return None


def wait_until(check, timeout: float, what: str, interval: float = 0.25):
    """Poll check() until it returns something truthy; LabFailed after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the process group we started (the server and its kernels, or Chromium and its
    helpers), then SIGKILL to whatever is left after `grace` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# --------------------------------------------------------------------------- the server


class LabServer:
    """`jupyter lab` on 127.0.0.1 with a random token; settings, runtime files and checkpoints in a
    temporary folder (nothing of the user's configuration is read or written, nothing is added
    next to the notebooks), the repository as its root."""

    def __init__(self, root: Path = REPO_ROOT, workdir: Path | None = None, env: dict | None = None):
        self.root = Path(root)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="nvfp4-lab-"))
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = self.workdir / "jupyter-lab.log"
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LabServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _env(self) -> dict:
        env = dict(os.environ)
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR",
                     "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR"):
            env[name] = str(self.workdir / name.lower())
        # The kernel imports nvfp4lib from this checkout and is this interpreter's own python3.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")]))
        env["JUPYTER_PREFER_ENV_PATH"] = "1"
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        for plugin, values in LAB_SETTINGS.items():
            path = self.workdir / "jupyterlab_settings_dir" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--ServerApp.shutdown_no_activity_timeout=600", "--MappingKernelManager.cull_idle_timeout=0",
               # checkpoints (made when a notebook is opened) go to the temporary folder, not notebooks/
               f"--FileCheckpoints.checkpoint_dir={self.workdir / 'checkpoints'}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=self._env(), stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until(self._ready, SERVER_START_S, f"jupyter lab on {self.base}")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise LabFailed(f"jupyter lab exited with code {self.proc.returncode}\n{self.log_tail()}")
        try:
            return self.api("GET", "/api/status") is not None
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc)
            self.proc = None
            self.log.close()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "server log (tail):\n" + "\n".join(text.splitlines()[-lines:])

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 30):
        """One REST call, authenticated with the token header; the decoded JSON (None if empty)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def lab_url(self, path: str) -> str:
        return f"{self.base}/lab/tree/{path}?reset&token={self.token}"

    def ws_url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def listening_addresses(self) -> set[str] | None:
        """Local addresses with a listening TCP socket on our port, from /proc (None where there is no /proc)."""
        found = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            if not os.path.exists(table):
                return None
            with open(table) as f:
                for line in f.readlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    address, port = local.split(":")
                    if state == "0A" and int(port, 16) == self.port:
                        found.add(address)
        return found


# --------------------------------------------------------------------------- the kernel


@dataclass
class CellRun:
    """What one code cell produced, as the kernel sent it."""

    index: int  # 1-based, in the notebook file, counting every cell
    source: str
    outputs: list = field(default_factory=list)
    status: str = ""

    def mime_types(self) -> set[str]:
        return {m for out in self.outputs for m in out.get("data", {})}


def _message(msg_type: str, content: dict, session: str) -> dict:
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": session, "username": "smoke",
              "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content,
            "channel": "shell", "buffers": []}


async def _execute_cells(server: LabServer, kernel_id: str, cells: list[tuple[int, str]],
                         timeout: float) -> list[CellRun]:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    request = HTTPRequest(server.ws_url(f"/api/kernels/{kernel_id}/channels?session_id={session}"),
                          headers={"Authorization": f"token {server.token}"})
    ws = await asyncio.wait_for(websocket_connect(request), 30)
    runs = []
    try:
        for index, source in cells:
            run = CellRun(index, source)
            msg = _message("execute_request", {"code": source, "silent": False, "store_history": True,
                                               "user_expressions": {}, "allow_stdin": False,
                                               "stop_on_error": True}, session)
            ws.write_message(json.dumps(msg))
            replied = idle = False
            while not (replied and idle):
                raw = await asyncio.wait_for(ws.read_message(), timeout)
                if raw is None:
                    raise LabFailed(f"the kernel websocket closed during cell {index}")
                reply = json.loads(raw)
                if reply.get("parent_header", {}).get("msg_id") != msg["header"]["msg_id"]:
                    continue
                kind, content = reply["msg_type"], reply["content"]
                if kind in ("stream", "display_data", "execute_result", "error"):
                    run.outputs.append({"output_type": kind, **content})
                elif kind == "status" and content.get("execution_state") == "idle":
                    idle = True
                elif kind == "execute_reply":
                    replied, run.status = True, content.get("status", "")
            runs.append(run)
            if run.status != "ok":
                break
    finally:
        ws.close()
    return runs


def run_notebook(server: LabServer, path: str, *, small: bool = True,
                 timeout: float = CELL_TIMEOUT_S) -> tuple[dict, list[CellRun]]:
    """Open a session for notebooks/<path> and execute its code cells in order over the kernel
    websocket; after the cell tagged `parameters`, `small = True` (as papermill would inject).
    Returns the session and one CellRun per executed cell; stops at the first failing cell."""
    model = server.api("GET", f"/api/contents/{path}?content=1&type=notebook")
    cells = []
    for i, cell in enumerate(model["content"]["cells"], 1):
        if cell["cell_type"] != "code":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        cells.append((i, source))
        if "parameters" in cell.get("metadata", {}).get("tags", []) and small:
            cells.append((i, "small = True  # injected: small mode"))
    sess = server.api("POST", "/api/sessions", {"path": path, "type": "notebook", "name": Path(path).name,
                                                 "kernel": {"name": "python3"}})
    return sess, asyncio.run(_execute_cells(server, sess["kernel"]["id"], cells, timeout))


def describe_failure(run: CellRun) -> str:
    errors = [o for o in run.outputs if o["output_type"] == "error"]
    detail = f"{errors[0]['ename']}: {errors[0]['evalue']}" if errors else f"status {run.status!r}"
    first = (run.source.strip().splitlines() or ["?"])[0]
    return f"cell {run.index} ({first}) failed: {detail}"


# --------------------------------------------------------------------------- the browser


@dataclass
class PageCheck:
    title_found: str
    screenshot: bytes
    kernel_names: list[str]


class Chromium:
    """Headless Chromium driven over the DevTools protocol (its port bound to 127.0.0.1 only)."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.profile = self.workdir / "chromium-profile"
        self.log_path = self.workdir / "chromium.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, url: str) -> None:
        self.profile.mkdir(parents=True, exist_ok=True)
        cmd = [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", url]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        self.port = int(wait_until(lambda: self._read_port(port_file), 60, "Chromium's DevTools port"))

    def _read_port(self, port_file: Path):
        if self.proc.poll() is not None:
            raise LabFailed(f"Chromium exited with code {self.proc.returncode}:\n"
                            + self.log_path.read_text(errors="replace")[-2000:])
        text = port_file.read_text() if port_file.exists() else ""
        return text.splitlines()[0] if text.strip() else None

    def page_ws_url(self) -> str:
        def page():
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            return pages[0]["webSocketDebuggerUrl"] if pages else None
        return wait_until(page, 30, "a page target")

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc, grace=5)
            self.proc = None
            self.log.close()


class _DevTools:
    """The few DevTools protocol calls we need, over one page websocket."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, timeout: float = 30, **params) -> dict:
        self.next_id += 1
        ident = self.next_id
        self.ws.write_message(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            raw = await asyncio.wait_for(self.ws.read_message(), timeout)
            if raw is None:
                raise LabFailed(f"the DevTools connection closed during {method}")
            reply = json.loads(raw)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise LabFailed(f"{method}: {reply['error']}")
                return reply.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")


_TITLE_JS = """(() => {
  const h = document.querySelector('.jp-NotebookPanel .jp-MarkdownOutput h1');
  return h ? h.textContent : null;
})()"""
_KERNEL_NAME_JS = """Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-Toolbar-kernelName'))
  .map(e => e.textContent.trim())"""


async def _check_page(ws_url: str, title: str, timeout: float) -> PageCheck:
    from tornado.websocket import websocket_connect

    ws = await asyncio.wait_for(websocket_connect(ws_url, max_message_size=64 * 2**20), 30)
    try:
        tools = _DevTools(ws)
        await tools.call("Page.enable")
        deadline = time.monotonic() + timeout
        found = None
        while time.monotonic() < deadline:
            found = await tools.evaluate(_TITLE_JS)
            if found and title in found:
                break
            await asyncio.sleep(0.5)
        else:
            body = await tools.evaluate("document.body ? document.body.innerText.slice(0, 500) : ''")
            raise LabFailed(f"the page never showed the title {title!r} (last seen {found!r}); page text: {body!r}")
        names = []
        while time.monotonic() < deadline and not any(n and n != "No Kernel" for n in names):
            names = await tools.evaluate(_KERNEL_NAME_JS) or []
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # let fonts and the last layout settle before the picture
        shot = await tools.call("Page.captureScreenshot", format="png")
        return PageCheck(found, base64.b64decode(shot["data"]), names)
    finally:
        ws.close()


def check_page(chromium: Chromium, url: str, title: str, timeout: float = PAGE_TIMEOUT_S) -> PageCheck:
    """Load `url` in Chromium, wait for the notebook's title to render, return it with a screenshot."""
    chromium.start(url)
    return asyncio.run(_check_page(chromium.page_ws_url(), title, timeout))


def notebook_title(model: dict) -> str:
    """The text of the first markdown heading, as Lab renders it."""
    for cell in model["content"]["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown" and source.startswith("# "):
            return source.splitlines()[0][2:].strip()
    raise LabFailed("the notebook has no '# title' markdown cell")


def blank_fraction(png: bytes) -> float:
    """Share of the screenshot's pixels equal to its most common colour (1.0 = a blank page)."""
    import io

    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3].reshape(-1, 3)
    _, counts = np.unique((pixels * 255).astype(np.uint8), axis=0, return_counts=True)
    return counts.max() / len(pixels)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebook", default=DEFAULT_NOTEBOOK, help="stem of a notebook in notebooks/")
    ap.add_argument("--screenshot", type=Path, default=None, help="write the page screenshot here")
    ap.add_argument("--full", action="store_true", help="run with the notebook's own `small` (default: small = True)")
    args = ap.parse_args(argv)
    reason = missing_requirement()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    path = f"notebooks/{args.notebook}.ipynb"
    with tempfile.TemporaryDirectory(prefix="nvfp4-lab-") as tmp, \
            LabServer(workdir=Path(tmp), env={"NVFP4_FIGURES_DIR": str(Path(tmp) / "figures")}) as server, \
            Chromium(Path(tmp)) as chromium:
        try:
            listed = [e["name"] for e in server.api("GET", "/api/contents/notebooks")["content"]]
            print(f"server {server.base}: notebooks/ lists {len(listed)} entries")
            start = time.perf_counter()
            session, runs = run_notebook(server, path, small=not args.full)
            if runs[-1].status != "ok":
                raise LabFailed(describe_failure(runs[-1]))
            images = sum("image/png" in r.mime_types() for r in runs)
            print(f"{path}: {len(runs)} cells ran in {time.perf_counter() - start:.1f} s, {images} with a figure")
            model = server.api("GET", f"/api/contents/{path}?content=1")
            page = check_page(chromium, server.lab_url(path), notebook_title(model))
            print(f"page shows {page.title_found!r}; kernel {page.kernel_names}; "
                  f"blank share {blank_fraction(page.screenshot):.2f}")
            if args.screenshot:
                args.screenshot.write_bytes(page.screenshot)
        except LabFailed as err:
            print(f"FAILED: {err}\n{server.log_tail()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
