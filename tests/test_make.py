"""The Makefile's targets as README describes them, without running their slow parts: `make lab`
registers its kernel inside the checkout (the venv, or build/jupyter with PYTHON=...), never for the
user, under the name the notebooks give, and starts the server that finds it first; `make submission`
succeeds when every check this machine can run passed (the evaluator's INCOMPLETE) and fails on every
other non-zero verdict.

`make -n` prints the commands a target would run; where a test runs one, it runs exactly that line.
"""

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys

import nbformat
import pytest

from nvfp4lib.leaderboard.report import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_PASSED, EXIT_SKIPPED, EXIT_USAGE
from nvfp4lib.locations import NOTEBOOKS_DIR, REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")

INSTALL = re.compile(r"-m ipykernel install (?P<where>.+?) --name (?P<name>\S+) ")
SERVER = re.compile(r'^JUPYTER_PATH="(?P<path>[^"]+)" .* -m jupyter lab ')


def _make(*args, env=None, check=True) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in (env or os.environ).items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-C", str(REPO_ROOT), "--no-print-directory", *args], capture_output=True,
                         text=True, timeout=120, env=clean)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _lab_commands(*args) -> tuple[re.Match, re.Match, list[str]]:
    """(the kernel install line, the server line, every line) that `make lab` would run."""
    lines = _make("-n", "lab", *args).stdout.splitlines()
    installs = [m for m in map(INSTALL.search, lines) if m]
    servers = [m for m in map(SERVER.search, lines) if m]
    assert len(installs) == 1 and len(servers) == 1, "\n".join(lines)
    return installs[0], servers[0], lines


def test_lab_registers_its_kernel_in_the_venv_never_for_the_user():
    install, server, lines = _lab_commands()
    assert not any("--user" in line for line in lines), lines
    assert install["where"] == "--sys-prefix" and ".venv/bin/python -m ipykernel" in install.string
    assert server["path"] == str(REPO_ROOT / ".venv" / "share" / "jupyter"), "the server looks there first"


def test_lab_with_an_interpreter_registers_its_kernel_in_the_checkout(tmp_path):
    """An interpreter's prefix may be shared by other checkouts (or not writable): the kernel goes to
    build/jupyter of this checkout, and the server looks there first."""
    install, server, _ = _lab_commands(f"PYTHON={sys.executable}")
    prefix = REPO_ROOT / "build" / "jupyter"
    assert install["where"] == f'--prefix "{prefix}"'
    assert server["path"] == str(prefix / "share" / "jupyter")


def test_the_lab_kernel_is_the_notebooks_kernel():
    install, _, _ = _lab_commands()
    for path in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        assert nbformat.read(path, as_version=4).metadata["kernelspec"]["name"] == install["name"], path.name


def test_the_lab_kernel_installs_and_the_server_finds_it_before_a_users_own(tmp_path):
    """The install line as make runs it (with the build folder in a temporary one), then what Jupyter
    lists under the server's JUPYTER_PATH, with a stale kernel of the same name in the user's folder."""
    pytest.importorskip("ipykernel", reason="ipykernel is not installed: pip install -e '.[dev]'")
    pytest.importorskip("jupyter_client", reason="jupyter_client is not installed: pip install -e '.[dev]'")
    build = tmp_path / "build"
    install, server, _ = _lab_commands(f"PYTHON={sys.executable}", f"BUILD_DIR={build}")
    user = tmp_path / "user"
    stale = user / "kernels" / install["name"]
    stale.mkdir(parents=True)
    (stale / "kernel.json").write_text(json.dumps({"argv": ["/gone/python"], "display_name": "stale",
                                                   "language": "python"}))
    env = {**os.environ, "JUPYTER_DATA_DIR": str(user), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    subprocess.run(install.string, shell=True, check=True, capture_output=True, timeout=120, env=env)
    spec_dir = build / "jupyter" / "share" / "jupyter" / "kernels" / install["name"]
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and spec["display_name"] == "Python (nvfp4)"
    assert spec["env"]["PYTHONPATH"] == str(REPO_ROOT), "the kernel imports this checkout's nvfp4lib"
    listed = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"], check=True,
                            capture_output=True, text=True, timeout=120,
                            env={**env, "JUPYTER_PATH": server["path"]})
    found = json.loads(listed.stdout)["kernelspecs"][install["name"]]
    assert os.path.realpath(found["resource_dir"]) == os.path.realpath(spec_dir)


# ------------------------------------------------------------------------------ make submission

FAKE_PYTHON = """#!/bin/sh
# stands in for the interpreter: the export succeeds unless told otherwise, the evaluation exits as told
case "$*" in
  *nvfp4lib.leaderboard.export*) exit "${FAKE_EXPORT_EXIT:-0}" ;;
  *nvfp4lib.leaderboard.evaluate*) echo "the verdict"; exit "$FAKE_EVALUATE_EXIT" ;;
esac
exit 99
"""


@pytest.fixture
def fake_python(tmp_path):
    path = tmp_path / "python"
    path.write_text(FAKE_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("verdict, succeeds", [(EXIT_PASSED, True), (EXIT_INCOMPLETE, True), (EXIT_FAILED, False),
                                               (EXIT_USAGE, False), (EXIT_SKIPPED, False), (130, False)])
def test_submission_succeeds_when_every_check_this_machine_can_run_passed(fake_python, tmp_path, verdict, succeeds):
    out = _make("submission", f"PYTHON={fake_python}", f"BUILD_DIR={tmp_path}",
                env={**os.environ, "FAKE_EVALUATE_EXIT": str(verdict)}, check=False)
    assert (out.returncode == 0) == succeeds, out.stdout + out.stderr
    assert "the verdict" in out.stdout
    said = [line for line in out.stdout.splitlines() if line.startswith("make submission: ")]  # not make's echo
    assert len(said) == (verdict == EXIT_INCOMPLETE), out.stdout
    if said:
        assert said[0] == (f"make submission: {tmp_path}/submission.py exported; every check this machine can run "
                           "passed (the INCOMPLETE line above names what it could not check)")


def test_submission_fails_when_the_export_fails(fake_python, tmp_path):
    out = _make("submission", f"PYTHON={fake_python}", f"BUILD_DIR={tmp_path}",
                env={**os.environ, "FAKE_EXPORT_EXIT": "1", "FAKE_EVALUATE_EXIT": str(EXIT_INCOMPLETE)}, check=False)
    assert out.returncode != 0 and "the verdict" not in out.stdout, out.stdout + out.stderr


def test_submission_exports_the_named_path_into_the_build_folder(tmp_path):
    lines = _make("-n", "submission", "PYTHON=python3", "SUBMISSION=cute_fast", f"BUILD_DIR={tmp_path}").stdout
    export = next(shlex.split(line) for line in lines.splitlines() if "nvfp4lib.leaderboard.export" in line)
    assert export[export.index("--path") + 1] == "cute_fast"
    assert export[export.index("--out") + 1] == str(tmp_path / "submission.py")
