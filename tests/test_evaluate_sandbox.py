"""The local leaderboard against files that reach for the evaluator itself: its timing, its process
(limits, timer slack, orphans, command line, environment), the interpreter's site-packages, the
bytes it reads back, an earlier file's process; and the ways its command line meets a user (a
closed or full stdout, odd file names, a device without memory, odd outputs).

Each file is evaluated through the real evaluator. Where a test needs bubblewrap it skips without
it (CI installs it); `no_sandbox` shows what a machine without it gets. The timed modes run on a
CPU's wall clock through `run_benchmarks`; the GPU tests (marked) run the fixtures of
tests/leaderboard_fixtures through `evaluate` as `python -m nvfp4lib.leaderboard.evaluate` does.
"""

import gc
import io
import os
import site
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from nvfp4lib.contract import Shape
from nvfp4lib.leaderboard import evaluate as command_line
from nvfp4lib.leaderboard import modes, process as processes
from nvfp4lib.leaderboard.evaluate import SubmissionProcess, evaluate, import_isolated, main, run_benchmarks
from nvfp4lib.leaderboard.judge import TOLERANCE_RULE, too_fast
from nvfp4lib.leaderboard.protocol import combine_seed
from nvfp4lib.leaderboard.submission_file import DIRECTIVE
from nvfp4lib.problem import bytes_moved
from tests.leaderboard_helpers import SANDBOXED, marker, needs_bwrap

FIXTURES = Path(__file__).parent / "leaderboard_fixtures"
SHAPE = Shape(128, 256, 1)
CPU = not torch.cuda.is_available()
BOUND_S = 180  # wall-clock bound of one evaluation here: only a hang passes it
GEMV = (FIXTURES / "fake_event.py").read_text().split("class InstantEvent")[0] + "gemv = custom_kernel\n"  # correct


def submission(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(GEMV + "\n\n" + textwrap.dedent(body).strip() + "\n")
    return path


def run_cli(path, *args: str, **kwargs):
    return subprocess.run([sys.executable, "-m", "nvfp4lib.leaderboard.evaluate", str(path), *args],
                          capture_output=True, text=True, timeout=BOUND_S, **kwargs)


def benchmarks(path: Path, mode: str, calls: int = 4):
    """run_benchmarks of the file at SHAPE on a CPU (copy bandwidth 100 GB/s, `calls` timed calls)."""
    cpu, rule = torch.device("cpu"), processes.StoppingRule(max_calls=calls, budget_s=1e9, min_wall_s=1e9)
    with SubmissionProcess(cpu, timeout=60, deadline=time.monotonic() + 600, time_limit=600) as process:
        assert process.load(path).ok
        return run_benchmarks(process, [SHAPE], cpu, copy_gbps=100.0, mode=mode, rule=rule, warmup_rule=None)


# ---------------------------------------------------------------------------------------------
# 1. Timing the submission cannot touch


@pytest.mark.parametrize("mode", ["benchmark", "ranked"])
@pytest.mark.parametrize("name", ["frozen_clock", "fake_event"])
def test_a_replaced_clock_or_event_does_not_change_the_times(name, mode):
    """time.perf_counter frozen, torch.cuda.Event faked: the times are taken with what the timing
    code bound before the import, so they are the kernel's own, none of them 0."""
    rows, checks = benchmarks(FIXTURES / f"{name}.py", mode)
    assert all(c.ok for c in checks) and len(rows) == 1, [c.message for c in checks]
    assert rows[0].timing.n == 4 and min(rows[0].timing.samples) > 0


@pytest.mark.parametrize("mode, name", [("benchmark", "timed calls"), ("ranked", "ranked timed calls")])
def test_a_time_below_the_floor_is_a_fail_naming_the_floor_and_the_time(mode, name):
    """The file rewrites the evaluator's timing code in its own process: only the floor is left."""
    rows, checks = benchmarks(FIXTURES / "reaches_the_timer.py", mode)
    floor = bytes_moved(SHAPE) / 100.0 / 1e3
    assert not rows and [c.case for c in checks] == [name]
    assert f"0.001 us, below the floor of {floor:.3g} us (the {bytes_moved(SHAPE)} bytes it must move at the " \
           f"100 GB/s copy bandwidth measured here)" in checks[0].message, checks[0].message
    assert checks[0].message.startswith("timed call 1" + (" (seed " if mode == "ranked" else ": "))


def test_a_time_below_the_floor_is_named_so_however_long_the_calls_took(tmp_path):
    """Slow calls (1 s each here) reported as 0.001 us: the clock's check would end the process too, but how much
    its clock leaves unexplained depends on how busy the machine is; the floor does not, so the floor is named."""
    path = tmp_path / "slow_and_below_the_floor.py"
    path.write_text((FIXTURES / "plausible_times.py").read_text().replace("REPORTED_US = 50.0", "REPORTED_US = 0.001"))
    rows, checks = benchmarks(path, "benchmark")
    assert not rows and len(checks) == 1 and "0.001 us, below the floor of" in checks[0].message, checks[0].message


def test_the_floor_is_the_bytes_moved_at_the_copy_bandwidth():
    shape, gbps = Shape(7168, 16384, 1), 4268.0
    floor = bytes_moved(shape) / gbps / 1e3
    assert too_fast([floor, 2 * floor], shape, gbps) is None
    assert too_fast([floor, floor * 0.999], shape, gbps).startswith(f"timed call 2: {floor * 0.999:.3g} us, below")


def test_benchmark_times_the_evaluators_clock_cannot_explain_are_a_fail():
    """Plausible times (50 us, above the floor) for calls that each took a second here."""
    rows, checks = benchmarks(FIXTURES / "plausible_times.py", "benchmark")
    assert not rows and len(checks) == 1 and not checks[0].ok
    message = checks[0].message
    assert message.startswith("the timed calls: 4 calls took ") and "sent (0.0002 s in all)" in message, message
    assert message.endswith("those times were not measured honestly")


class ClockHeld(SubmissionProcess):
    """A SubmissionProcess with no process behind it: only its hold of times to the clock runs."""

    def __init__(self, cost_before_s: float, cost_now_s: float):
        self.device, self.ended = torch.device("cuda"), None
        self.call_cost_s, self.cost_now_s = cost_before_s, cost_now_s

    def _call_cost_now(self) -> float:
        return self.cost_now_s

    def _end(self, message: str):
        raise processes.SubmissionProcessEnded(message)


@pytest.mark.parametrize("calls, took, sent_us, before, now, honest", [
    # the run of an honest file while two other test runs shared the GPU (measured), judged with the cost
    # measured before the import: neither the times sent nor that cost explain the wall time
    (5, 0.0373, 22.8, 2494e-6, 2494e-6, False),
    (5, 0.0373, 22.8, 2494e-6, 7.5e-3, True),      # the same where a call of nothing now costs three times as much
    (5, 0.0501, 183.2, 2559e-6, 9.8e-3, True),     # the naive kernel's run of that time, with a cost as its calls took
    (14, 0.102, 1e-3, 2550e-6, 2550e-6, False),    # measured: a file that rewrote its timer, alone on the GPU
    (14, 0.102, 1e-3, 2550e-6, 1e-3, False),       # a GPU less busy now than then keeps the earlier cost
    (5, 0.0496, 183.6, 2446e-6, 4118e-6, True),    # measured: the naive kernel's run while three other test runs
    # shared the GPU, its two launches a call waiting for time slices where the call of nothing's one did
])
def test_the_wall_clock_check_uses_what_a_call_of_nothing_costs_now_on_a_busier_gpu(calls, took, sent_us, before,
                                                                                     now, honest):
    held = ClockHeld(before, now)
    if honest:
        held._hold_to_clock([sent_us] * calls, took)
    else:  # the FAIL names both costs, before the import and now
        with pytest.raises(processes.SubmissionProcessEnded, match=rf"own cost \({before * 1e6:.0f} us, now "
                           rf"{now * 1e6:.0f} us a call\) explain at most .* not measured honestly"):
            held._hold_to_clock([sent_us] * calls, took)


@pytest.mark.gpu
def test_a_call_of_nothing_is_timed_here_and_gives_back_its_memory():
    reserved = torch.cuda.memory_reserved()
    assert 0 < SubmissionProcess._call_cost_now() < 1.0
    assert torch.cuda.memory_reserved() <= reserved  # its cache emptied


# ---------------------------------------------------------------------------------------------
# 2. The submission's processes cannot reach the evaluator


@needs_bwrap
def test_limits_timer_slack_and_signals_of_every_process_it_sees_leave_the_evaluator_alone(tmp_path):
    """It lowers the CPU time and open files of every process it can see, writes their timer
    slack, and signals them: none of them is the evaluator, whose own settings stay as they were."""
    path = submission(tmp_path, "reaches_for_its_parents", '''
        import os, resource, signal

        def everyone():
            return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]

        def custom_kernel(data):
            for pid in everyone():
                for limit in (resource.RLIMIT_CPU, resource.RLIMIT_NOFILE):
                    try:
                        resource.prlimit(pid, limit, (1, 1))
                    except OSError:
                        pass
                try:
                    with open(f"/proc/{pid}/timerslack_ns", "w") as slack:
                        slack.write("5000000000")
                except OSError:
                    pass
                for signum in (signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):
                    try:
                        os.kill(pid, signum)
                    except OSError:
                        pass
            print(f"SAW {len(everyone())}", flush=True)
            return gemv(data)
    ''')
    before = {name: Path(f"/proc/self/{name}").read_text() for name in ("limits", "timerslack_ns")}
    report = evaluate(path, "test", shapes=[SHAPE])
    assert report.ok and len(report.cases) == 4, report.summary()
    assert {name: Path(f"/proc/self/{name}").read_text() for name in before} == before
    assert "SAW 1" in report.output  # the sandbox's first process: the evaluator is not there to see


@needs_bwrap
def test_orphans_are_reaped_in_the_sandbox_and_none_is_left_to_the_evaluator(tmp_path):
    """300 orphans a call: their parent gone, they are the sandbox's first process's to reap. The file counts
    zombies once every orphan has exited (and so became one), until none is left or 30 s have passed."""
    path = submission(tmp_path, "leaves_orphans", '''
        import os, time

        def zombies():
            found = 0
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    found += open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
                except OSError:
                    pass
            return found

        def custom_kernel(data):
            read_end, write_end = os.pipe()  # each orphan holds write_end until it exits
            for _ in range(300):
                child = os.fork()
                if child == 0:
                    if os.fork() == 0:
                        os._exit(0)
                    os._exit(0)
                os.waitpid(child, 0)
            os.close(write_end)
            os.read(read_end, 1)  # end of file: every orphan has exited, so no new zombie can appear
            os.close(read_end)
            stop = time.monotonic() + 30
            while zombies() and time.monotonic() < stop:
                time.sleep(0.05)
            print(f"ZOMBIES {zombies()}", flush=True)
            return gemv(data)
    ''')
    report = evaluate(path, "test", shapes=[SHAPE])
    assert report.ok, report.summary()
    assert report.output.count("ZOMBIES 0") == 4, report.output[-500:]
    mine = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]
    assert mine == [], "children of the evaluator after the verdict"


def _parent(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


SNOOPS = '''
    import os

    def custom_kernel(data):
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            for name in ("cmdline", "environ", "maps"):
                try:
                    print(f"{pid} {name}:", open(f"/proc/{pid}/{name}", "rb").read().replace(b"\\0", b" "))
                except OSError as err:
                    print(f"{pid} {name}: {err}")
        return gemv(data)
'''


@needs_bwrap
def test_the_secret_seed_is_not_where_the_submission_can_read_it(tmp_path):
    """Every command line, environment and memory map it can read: the evaluator's are not among them."""
    proc = run_cli(submission(tmp_path, "snoops", SNOOPS), "--mode", "test", "--secret-seed", "987654321",
                   "--show-output")
    assert proc.returncode == (4 if CPU else 0), proc.stdout[-2000:]
    assert "[submission] 1 cmdline:" in proc.stdout and "987654321" not in proc.stdout


def test_without_a_sandbox_a_secret_seed_from_stdin_is_not_on_the_command_line(tmp_path):
    proc = run_cli(submission(tmp_path, "snoops", SNOOPS), "--mode", "test", "--secret-seed", "-", "--show-output",
                   input="987654321\n", env=dict(os.environ, NVFP4_BWRAP="off"))
    assert proc.returncode == (4 if CPU else 0), proc.stdout[-2000:]
    assert "evaluate" in proc.stdout and "987654321" not in proc.stdout, "it reads the evaluator's command line"


def test_a_secret_seed_from_stdin_is_the_one_mixed_in(monkeypatch):
    given = []
    monkeypatch.setattr(command_line, "evaluate", lambda *args, **kwargs: given.append(kwargs) or _Passed())
    monkeypatch.setattr(sys, "stdin", io.StringIO("123456\n"))
    assert main(["f.py", "--secret-seed", "-"]) == 0 and given[0]["secret_seed"] == 123456
    assert combine_seed(3, given[0]["secret_seed"]) == combine_seed(3, 123456)


class _Passed:
    exit_code, verdict = 0, "PASSED"


@needs_bwrap
def test_site_packages_and_the_package_are_read_only_to_the_submission(tmp_path):
    """A .pth in site-packages would rig every later run of this interpreter: it cannot be written."""
    name = f"planted_{marker()}.pth"
    targets = [*site.getsitepackages(), site.getusersitepackages(), str(processes.PACKAGE_DIR)]
    path = submission(tmp_path, "plants_a_pth", f'''
        import os

        for folder in {targets!r}:
            try:
                with open(os.path.join(folder, {name!r}), "w") as planted:
                    planted.write("# planted")
                print("WROTE", folder)
            except OSError as err:
                print("REFUSED", type(err).__name__)

        def custom_kernel(data):
            return gemv(data)
    ''')
    try:
        report = evaluate(path, "test", shapes=[SHAPE])
        assert report.ok and "WROTE" not in report.output and "REFUSED" in report.output, report.output
    finally:
        for folder in targets:
            Path(folder, name).unlink(missing_ok=True)
    assert not any(Path(folder, name).exists() for folder in targets)


def test_inputs_zeroed_behind_every_copy_the_submission_can_reach_are_seen(tmp_path):
    """It zeroes sfa and replaces what copies bytes in its process (ctypes, mmap, copy_, the runner's
    own functions): the evaluator reads the inputs' memory itself."""
    path = submission(tmp_path, "zeroes_and_hides", '''
        import ctypes, gc, mmap

        def custom_kernel(data):
            out = gemv(data)
            data[2].view(torch.uint8).zero_()
            ctypes.c_char = ctypes.c_byte
            mmap.mmap = None
            torch.Tensor.copy_ = lambda self, other, *args, **kwargs: self
            for found in gc.get_objects():
                if type(found).__name__ == "SimpleNamespace" and hasattr(found, "copy"):
                    found.copy = lambda dst, src, *args, **kwargs: dst
            return out
    ''')
    report = evaluate(path, "test", shapes=[SHAPE])
    assert report.cases and not any(c.ok for c in report.cases)
    assert report.cases[0].message.startswith("changed its input sfa in place"), report.cases[0].message


def test_import_isolated_checks_each_file_in_a_fresh_process(tmp_path):
    """A first file plants a fake nvfp4lib and a helper module: the second finds neither."""
    first, second = tmp_path / "plants.py", tmp_path / "uses_what_was_planted.py"
    first.write_text("import sys, types\nsys.modules['nvfp4lib'] = types.ModuleType('nvfp4lib')\n"
                     "sys.modules['planted'] = types.ModuleType('planted')\ndef custom_kernel(data):\n    pass\n")
    second.write_text("import planted\nimport nvfp4lib\ndef custom_kernel(data):\n    pass\n")
    results = import_isolated([first, second])
    assert results[str(first.resolve())] == (True, "custom_kernel")
    assert results[str(second.resolve())] == (False, "raised ModuleNotFoundError: No module named 'planted'")
    second.write_text("import nvfp4lib\ndef custom_kernel(data):\n    pass\n")
    ok, error = import_isolated([first, second])[str(second.resolve())]
    assert not ok and "No module named 'nvfp4lib': the leaderboard machine does not have nvfp4lib" in error


# ---------------------------------------------------------------------------------------------
# 3. The isolation line says what ran


@needs_bwrap
def test_the_isolation_line_names_bubblewrap_and_what_it_does_not_cover(tmp_path):
    report = evaluate(submission(tmp_path, "correct", ""), "test", shapes=[SHAPE])
    assert report.isolation.startswith("bubblewrap (") and "PID and network namespaces" in report.isolation
    assert "not covered: what they can read" in report.isolation


@pytest.mark.parametrize("setting, why", [
    ("off", "no sandbox (NVFP4_BWRAP=off)"),
    ("/nonexistent/bwrap", "no sandbox (NVFP4_BWRAP=/nonexistent/bwrap is not a program)"),
    ("FAILING", "cannot run here: bwrap: setting up uid map: Permission denied"),
])
def test_where_bubblewrap_cannot_run_the_isolation_line_says_what_is_not_covered(tmp_path, monkeypatch, setting,
                                                                                 why):
    if setting == "FAILING":  # a bwrap that refuses, as without user namespaces
        setting = str(tmp_path / "bwrap")
        Path(setting).write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
        os.chmod(setting, 0o755)
    monkeypatch.setenv(processes.BWRAP_ENV_VAR, setting)
    processes.sandbox.cache_clear()
    try:
        report = evaluate(submission(tmp_path, "correct", ""), "test", shapes=[SHAPE])
    finally:
        processes.sandbox.cache_clear()
    assert report.ok and len(report.cases) == 4, report.summary()
    assert why in report.isolation and "not covered: the submission's processes can read the package" in \
        report.isolation, report.isolation


def test_a_bwrap_named_by_a_relative_path_runs_the_evaluation(tmp_path, monkeypatch):
    """The submission's process starts in its work folder: the evaluator resolves the path it was given first."""
    if not SANDBOXED:
        pytest.skip("no bwrap here")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "bwrap").symlink_to(processes.sandbox(False).command[0])  # the one this run uses
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(processes.BWRAP_ENV_VAR, "tools/bwrap")
    bwrap = str(tmp_path / "tools" / "bwrap")
    processes.sandbox.cache_clear()
    try:
        report = evaluate(submission(tmp_path, "correct", ""), "test", shapes=[SHAPE])
    finally:
        processes.sandbox.cache_clear()
    assert report.ok and report.isolation.startswith(f"bubblewrap ({bwrap})"), (report.summary(), report.isolation)


def test_the_bundled_bwrap_runs_from_its_folder(tmp_path):
    """tools/bundle_bwrap.sh copies this machine's bwrap and its libraries for a machine without it."""
    script = Path(__file__).parent.parent / "tools" / "bundle_bwrap.sh"
    if not SANDBOXED:
        pytest.skip("no bwrap here to bundle")
    done = subprocess.run(["bash", str(script), str(tmp_path / "bundle")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    version = subprocess.run([str(tmp_path / "bundle" / "bwrap"), "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("bubblewrap ")
    assert {"libselinux.so.1", "libcap.so.2", "libpcre2-8.so.0"} <= {p.name for p in (tmp_path / "bundle" / "lib")
                                                                     .iterdir()}


# ---------------------------------------------------------------------------------------------
# 4. What a user meets


def test_a_closed_stdout_ends_quietly_with_the_verdicts_exit_code(tmp_path):
    path = submission(tmp_path, "correct", "")
    done = subprocess.run(["bash", "-c", f'"{sys.executable}" -m nvfp4lib.leaderboard.evaluate "{path}" --mode test '
                                         f'| head -1; exit "${{PIPESTATUS[0]}}"'],
                          capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode == (4 if CPU else 0) and "Traceback" not in done.stderr and done.stderr == "", done.stderr
    assert done.stdout.startswith("local leaderboard: ") and done.stdout.count("\n") == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_stdout_is_said_on_stderr_and_the_exit_code_is_the_verdicts(tmp_path):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "nvfp4lib.leaderboard.evaluate",
                               str(submission(tmp_path, "correct", "")), "--mode", "test"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=BOUND_S)
    assert done.returncode == (4 if CPU else 0) and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("the lines of the evaluation could not be written to stdout (No space left on "
                                   f"device); exit code {done.returncode} is the verdict's "
                                   f"({'INCOMPLETE' if CPU else 'PASSED'})")


def test_a_file_name_cannot_rewrite_the_lines_it_is_printed_in(tmp_path):
    path = tmp_path / "x\x1b[2K\rPASSED: 39 checks\n.py"
    path.write_text(f"{DIRECTIVE}\ndef kernel(data):\n    return data[6]\n")
    proc = run_cli(path, "--mode", "test")
    assert proc.returncode == 1 and not any(ch in proc.stdout for ch in "\x1b\r"), proc.stdout
    lines = proc.stdout.splitlines()
    shown = str(path).replace("\x1b", "\\x1b").replace("\r", "\\r").replace("\n", "\\n")
    assert lines[0].startswith(f"local leaderboard: {shown} (test)")
    assert lines[-2:] == [f"FAILED: 1 problem(s) in {shown}", f"  - {shown}: defines no function custom_kernel(data)"]
    assert not any(line.startswith("PASSED") for line in lines)


def test_a_device_without_memory_for_the_inputs_names_what_the_submission_holds(tmp_path, monkeypatch):
    """The evaluator's own allocation fails while the submission's process holds the device's memory."""
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 58.00 MiB")

    gib = 2**30
    monkeypatch.setattr(modes, "generate_input", no_memory)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(2.5 * gib), int(139.8 * gib)))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(0.5 * gib))
    report = evaluate(submission(tmp_path, "correct", ""), "test", shapes=[SHAPE])
    assert report.failures == [
        "the evaluator could not allocate its inputs on cpu: 2.5 GiB of its 139.8 GiB were free, 136.8 GiB held "
        "outside the evaluator's own 0.5 GiB: by the submission's process (or another program there); a submission "
        "must leave the device the room the leaderboard's inputs take"]


def _wait_for_free_memory_to_settle(limit_s: float = 60.0, settled_s: float = 2.0) -> None:
    """Until what the GPU has free stays the same for ``settled_s``, at most ``limit_s``: a process an earlier test
    ended can release its memory after it is reaped, after the next file has measured what is free (nvidia-smi need
    not list such a process, as it may not in a container)."""
    end = time.monotonic() + limit_s
    free, since = torch.cuda.mem_get_info()[0], time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < settled_s:
        time.sleep(0.1)
        now = torch.cuda.mem_get_info()[0]
        if now != free:
            free, since = now, time.monotonic()


@pytest.mark.gpu
def test_a_file_that_holds_the_gpus_memory_is_named(tmp_path):
    path = submission(tmp_path, "holds_the_memory", '''
        import threading
        import time

        HELD = []


        def hold_what_is_free():
            """All but 16-24 MiB of the device, and whatever is released there later, for as long as the process
            lives: what an earlier process or this one frees after the import is held before the evaluator's next
            allocation (a file that held memory only once could leave the room of A, 56 MiB, free again)."""
            while True:
                free, _ = torch.cuda.mem_get_info()
                if free > (24 << 20):
                    try:
                        HELD.append(torch.empty(free - (16 << 20), dtype=torch.uint8, device="cuda"))
                    except torch.OutOfMemoryError:
                        pass  # taken by another meanwhile: asked again
                time.sleep(0.01)


        torch.cuda.empty_cache()  # the flush's buffer this process has cached goes back to the device, to be held
        threading.Thread(target=hold_what_is_free, daemon=True).start()
        time.sleep(1.0)

        def custom_kernel(data):
            return gemv(data)
    ''')
    # No block that earlier tests freed (or left to the garbage collector) stays in the evaluator's cache,
    # where it could hold the inputs: released before the file measures what is free.
    gc.collect()
    torch.cuda.empty_cache()
    torch.zeros(1, device="cuda")  # the evaluator's own CUDA context exists before the file takes the rest
    _wait_for_free_memory_to_settle()  # and no memory an ended process still held is freed after it does
    before = (torch.cuda.mem_get_info(), torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
    lines = []
    # A benchmark shape as the test case: its A alone (58.7 MB) is more than the 24 MiB at most left. (With 256 MiB
    # left, an evaluator that had loaded its kernels and cuBLAS before could still allocate the inputs.) Whichever
    # allocation meets the full device, the evaluator's inputs or the submission's copy of them (which one does
    # differs between machines: an H200 and an H100 here), the failure says where the memory is.
    report = evaluate(path, "test", shapes=[Shape(7168, 16384, 1)], log=lines.append)
    assert any("held outside the evaluator's own" in f and "by the submission's process" in f
               for f in report.failures), (report.failures, before, torch.cuda.memory_reserved(), lines)


def test_a_nested_tensor_is_named_as_one(tmp_path):
    path = submission(tmp_path, "returns_nested", '''
        CALLS = []

        def custom_kernel(data):
            CALLS.append(None)
            rows = list(gemv(data)[:, 0, 0].float().split(64))
            return torch.nested.nested_tensor(rows, layout=torch.jagged if len(CALLS) % 2 else torch.strided)
    ''')
    report = evaluate(path, "test", shapes=[SHAPE])
    assert [c.message for c in report.cases] == ["returned a nested tensor, expected a dense tensor like c"] * 4


def test_a_pass_line_states_the_tolerance_it_applied(tmp_path):
    report = evaluate(submission(tmp_path, "correct", ""), "test", shapes=[SHAPE])
    assert TOLERANCE_RULE == "|out - ref| <= 0.001 + 0.001 * |ref| per element of the fp16 output"
    for case in report.cases:
        assert case.ok and case.line().endswith(f"; {TOLERANCE_RULE}"), case.line()


# ---------------------------------------------------------------------------------------------
# 5. The timing fixtures on a GPU, as `python -m nvfp4lib.leaderboard.evaluate FILE --mode M` runs them


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["benchmark", "ranked"])
@pytest.mark.parametrize("name", ["fake_event", "frozen_clock"])
def test_on_a_gpu_a_faked_event_or_a_frozen_clock_gets_the_kernels_own_times(name, mode):
    report = evaluate(FIXTURES / f"{name}.py", mode, warmup=2, reps=20)
    assert report.ok, report.summary()
    rows = report.bench or report.ranked
    assert len(rows) == 3 and all(r.timing.mean_us > 100 for r in rows), report.summary()  # a slow kernel: ms


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["benchmark", "ranked"])
def test_on_a_gpu_a_time_below_the_floor_is_a_fail(mode):
    report = evaluate(FIXTURES / "reaches_the_timer.py", mode, warmup=2, reps=20)
    assert report.verdict == "FAILED" and not report.bench and not report.ranked
    assert any("0.001 us, below the floor of" in f for f in report.failures), report.failures


@pytest.mark.gpu
def test_on_a_gpu_benchmark_times_its_clock_cannot_explain_are_a_fail():
    report = evaluate(FIXTURES / "plausible_times.py", "benchmark", warmup=5, reps=20)
    assert report.verdict == "FAILED" and not report.bench
    assert any(f.endswith("those times were not measured honestly") for f in report.failures), report.failures
