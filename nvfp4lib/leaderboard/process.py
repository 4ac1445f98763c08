"""The submission's process, from the evaluator's side: starting it in a sandbox, talking to it
within deadlines, and ending it together with everything it started.

* `sandbox` is bubblewrap's command line (`bwrap` on PATH, or the one BWRAP_ENV_VAR names): the
  submission's process and every process it starts run in PID and network namespaces of their own,
  without capabilities, on a read-only view of the file system with an empty /tmp and the
  package's folders empty. They cannot see, signal, limit or read this process; orphans are reaped
  inside; all of them end when the submission's process ends or this one dies. Where bwrap cannot
  run, the process runs without it, and the sandbox's `description` says what is then not covered.
* `SubmissionProcess` starts nvfp4lib.leaderboard.child in a session of its own with its own pipes:
  requests, answers, and its stdout and stderr (read here, never this process's own); tensors go
  through a shared memory file, written and read here. Every wait has a deadline (the per-call
  `timeout`, never past the evaluation's `deadline`); an answer is read only up to the size an
  answer may have and checked (nvfp4lib.leaderboard.answers) before anything uses it; the times
  it sends are held against this process's clock. Whatever goes wrong (an overrun, an exit, a
  crash, an answer that is not one) ends the process and raises `SubmissionProcessEnded` naming it.
* `signals_as_failures` turns the first signal that would end the evaluator (SIGTERM, SIGHUP,
  SIGINT, ...) into `EvaluationInterrupted`, raised where the evaluation can still end in a verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import glob
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import nvfp4lib.bench.timing
from nvfp4lib.bench.timing import StoppingRule
from nvfp4lib.contract import NAMES
from nvfp4lib.leaderboard import answers, child
from nvfp4lib.leaderboard.answers import BadAnswer
from nvfp4lib.leaderboard.report import printable
from nvfp4lib.leaderboard.submission_file import MISSING_PACKAGE, PACKAGE, TASK_SOURCE, read_submission
from nvfp4lib.locations import PACKAGE_DIR
from nvfp4lib.messages import first_line

CHILD_PROGRAM = Path(child.__file__).resolve()
TIMING_SOURCE = Path(nvfp4lib.bench.timing.__file__).read_text()  # read once, before any submission runs
BWRAP_ENV_VAR = "NVFP4_BWRAP"  # the bwrap to run submissions under (a path), or "off": none (what a machine without gets)
SANDBOX_CHILD, SANDBOX_WORK = "/tmp/leaderboard_child.py", "/tmp/submission_work"  # inside the sandbox, on its own /tmp
TOOL_CACHES = {"XDG_CACHE_HOME": "/tmp/.cache", "TRITON_HOME": "/tmp", "CUDA_CACHE_PATH": "/tmp/.nv"}
STOP_GRACE_S = 10.0      # a process asked to stop may run its exit handlers this long
KILL_WAIT_S = 5.0        # ending every process a submission started may take this long
OUTPUT_KEPT_BYTES = 64 << 10    # the tail of the submission's stdout and stderr kept for the report
OUTPUT_SHOWN_BYTES = 1 << 20    # shown line by line (show_output) up to this much
OUTPUT_PREFIX = "[submission] "
# What a timed call that does nothing costs here, measured before the file is imported: these many calls.
BASELINE_RULE = StoppingRule(max_calls=20, budget_s=1e9, min_wall_s=1e9)
# Timed calls may take this much longer than the times sent back, COST_SHARE times their harness's own cost and these
# slacks explain: each time times WALL_SHARE, a slack per call, one per run (a CPU's more). On a GPU busier now than
# before the import, a call's flush, kernels and sync each wait for time slices: CONTENDED_WAITS times the extra.
WALL_SHARE, COST_SHARE, CONTENDED_WAITS = 1.25, 1.25, 3
WALL_SLACK_PER_CALL_S, WALL_SLACK_S = 0.2e-3, {"cuda": 0.02, "cpu": 2.0}
_PAGE = 4096
_PIPE_BYTES = 1 << 20
_CHUNK = 1 << 20
_POLL_S = 0.5            # the longest a wait sleeps before it looks at the clock again


class SubmissionProcessEnded(RuntimeError):
    """The submission's process is gone (it exited, crashed, hung or answered garbage); the message says how."""


class EvaluationInterrupted(BaseException):
    """A signal that would have ended the evaluator arrived; the evaluation stops with a verdict."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------------------------------------
# Signals

# the signals whose default action ends a process and that a handler can catch; the fault signals
# (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) are left alone: a handler cannot resume after one
_CATCHABLE = ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF",
              "SIGXCPU", "SIGXFSZ", "SIGIO", "SIGPWR", "SIGSTKFLT", "SIGABRT")
_received: list[int] = []


def _on_signal(signum, frame):
    _received.append(signum)
    if len(_received) == 1:  # the first ends the evaluation; later ones find it ending already
        raise EvaluationInterrupted(signum)


def _catchable() -> list[int]:
    found = [getattr(signal, name) for name in _CATCHABLE if hasattr(signal, name)]
    if hasattr(signal, "SIGRTMIN"):
        found += list(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    return found


@contextlib.contextmanager
def signals_as_failures():
    """While inside: the first catchable signal whose handler is the default raises
    EvaluationInterrupted. Only in the main thread (elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in _catchable():
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                previous[signum] = signal.signal(signum, _on_signal)
    _received.clear()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _signals_held():
    """Cleanup that a signal must not cut short: the signals wait (in the kernel) until it is done."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _catchable())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


# ---------------------------------------------------------------------------------------------
# The sandbox


@dataclass(frozen=True)
class Sandbox:
    """bwrap's command line up to the program it runs (None: no sandbox), and what isolates the submission."""
    command: list[str] | None
    description: str


@functools.cache
def sandbox(cuda: bool) -> Sandbox:
    """The sandbox submissions run in here (`cuda`: with the NVIDIA device files), tried once."""
    folders = child.package_folders(PACKAGE, str(PACKAGE_DIR))
    named = os.environ.get(BWRAP_ENV_VAR) or None
    bwrap = shutil.which(named or "bwrap") if named != "off" else None
    if bwrap is None:
        why = (f"{BWRAP_ENV_VAR}=off" if named == "off" else f"{BWRAP_ENV_VAR}={named} is not a program" if named
               else f"no bwrap on PATH (install bubblewrap, or name one with {BWRAP_ENV_VAR})")
        return Sandbox(None, _unsandboxed(folders, why))
    bwrap = os.path.abspath(bwrap)  # the submission's process starts in its work folder: no relative path
    command = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--cap-drop", "ALL"]
    for name in sorted(os.listdir("/")):  # all of / read-only, but its own /proc, /dev and /tmp, and no /run
        path = "/" + name
        if name not in ("proc", "dev", "tmp", "run"):
            command += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    command += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    needed = [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), *sys.path,
              *os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)]  # the interpreter's, where it lies in /tmp
    for path in sorted({os.path.realpath(p) for p in needed if p and os.path.isdir(p)}):
        if child.inside(path, "/tmp"):
            command += ["--ro-bind", path, path]
    command += ["--dir", SANDBOX_WORK, "--chdir", SANDBOX_WORK, "--ro-bind", str(CHILD_PROGRAM), SANDBOX_CHILD,
                "--setenv", "TMPDIR", "/tmp", *(a for item in TOOL_CACHES.items() for a in ("--setenv", *item))]
    for folder in folders:
        command += ["--tmpfs", folder]
    for device in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dxg")) if cuda else ():
        command += ["--dev-bind", device, device]
    try:
        probe = subprocess.run([*command, "--", sys.executable, "-c", "pass"], capture_output=True, text=True,
                               timeout=60)
        failure = None if probe.returncode == 0 else probe.stderr.strip() or f"exit code {probe.returncode}"
    except (OSError, subprocess.SubprocessError) as err:
        failure = str(err)
    if failure:
        return Sandbox(None, _unsandboxed(folders, f"{bwrap} cannot run here: {first_line(failure, 300)}"))
    return Sandbox(command, (
        f"bubblewrap ({bwrap}): the submission's processes in PID and network namespaces of their own, without "
        f"capabilities, on a read-only file system (an empty /tmp, no /run, {' and '.join(folders)} empty): they "
        f"cannot see, signal, limit or read the evaluator, and end with the submission's process; not covered: what "
        f"they can read (your other files, other copies of {PACKAGE}), memory and process limits, times from a file "
        f"that rewrites the evaluator's objects in its own process (held against a floor and this process's clock)"))


def _unsandboxed(folders: list[str], why: str) -> str:
    return (f"no sandbox ({why}): {' and '.join(folders)} guarded in Python only (imports, and Python's opening of "
            f"files by path); not covered: the submission's processes can read the package by other routes, write "
            f"to site-packages, signal, limit or read the evaluator (its command line and environment too), use "
            f"the network, and outlive the evaluation by leaving its session; see --help")


OUT_OF_MEMORY = child.describe(torch.OutOfMemoryError())
"""How the submission's process words an out-of-memory error it raised (`child.describe`), message aside."""


def memory_held(device) -> str | None:
    """Where `device`'s memory was when an allocation there failed: what was free, and how much the submission's
    process (or another program) held outside this process's own; None without CUDA to ask."""
    try:
        free, total = torch.cuda.mem_get_info(device)
        own = torch.cuda.memory_reserved(device)
    except Exception:  # noqa: BLE001 - no CUDA to ask
        return None
    return (f"{free / 2**30:.1f} GiB of its {total / 2**30:.1f} GiB were free, {(total - free - own) / 2**30:.1f} GiB "
            f"held outside the evaluator's own {own / 2**30:.1f} GiB: by the submission's process (or another "
            f"program there)")


def _page(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


# ---------------------------------------------------------------------------------------------
# The process


@dataclass
class Loaded:
    """The answer to loading a file: its error, or what the file defines."""
    error: str | None = None
    has_kernel: bool = False
    needs_cuda: bool = False
    submission_path: str | None = None
    backend: str | None = None
    value: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Output:
    """One call's output as the submission's process described it, with its values (CPU float16, c's
    shape) copied on the caller's stream right after the call and again once the device was idle."""
    description: dict
    at_return: torch.Tensor | None = None
    settled: torch.Tensor | None = None


@dataclass
class Called:
    """The answer to one call: the kernel's error, or its output; the inputs it changed (found here,
    from their bytes after the call); with `timed`, the call's time."""
    error: str | None = None
    output: Output | None = None
    device: str = ""         # where c was, in the submission's process
    changed: list[str] = dataclasses.field(default_factory=list)
    us: float | None = None


@dataclass
class Timed:
    """The answer to a run of timed calls: the kernel's error, or each call's time and output."""
    error: str | None = None
    samples_us: list[float] = dataclasses.field(default_factory=list)
    outputs: list[Output] = dataclasses.field(default_factory=list)
    device: str = ""         # where c was, in the submission's process


def _shown(description: dict) -> dict:
    """An output's description with its strings made printable (they go into messages)."""
    return {k: printable(v) if isinstance(v, str) else v for k, v in description.items()}


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`'s storage on the CPU: a generated input is a view of all of its storage."""
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        raise ValueError("the inputs sent to a submission are views of all of their storage")
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    return raw.cpu() if raw.device.type != "cpu" else raw


class SubmissionProcess:
    """A fresh Python process that holds one submission and calls it when asked.

    Every request has a time allowance (`timeout` per call, never past `deadline`, a
    time.monotonic() value); a process that overruns it, ends, or answers anything but an answer
    is killed together with everything it started, and the request raises SubmissionProcessEnded,
    whose message (also kept in `ended`) says what happened. The submission's stdout and stderr are
    kept (`output`, the last OUTPUT_KEPT_BYTES) and, with `on_output`, passed on line by line,
    prefixed and with control characters escaped. `isolation` says what closes it off. Use it as a
    context manager.
    """

    def __init__(self, device: torch.device, timeout: float, deadline: float, time_limit: float,
                 on_output: Callable[[str], None] | None = None):
        self.timeout, self.deadline, self.time_limit = timeout, deadline, time_limit
        self.device = torch.device(device)
        self.on_output = on_output
        self.sandbox = sandbox(self.device.type == "cuda")
        self.isolation = self.sandbox.description
        self.ended: str | None = None
        self.call_cost_s: float | None = None  # a timed call that does nothing, measured before the import
        self.output_bytes = 0
        self.left_running = False  # whether its processes had not all ended KILL_WAIT_S after SIGKILL
        self._output, self._line = bytearray(), bytearray()
        self._shown = self._seq = self._size = 0
        self._exit_info = self._init = self._work = None
        self._ready_done = self._closed = self._busy = False
        self._inputs_end = 0  # where the last call's inputs end in the shared file
        self._fds: list[int] = []
        try:
            self._start()
        except BaseException:
            self._release()
            raise

    def _start(self) -> None:
        request_end, self._requests = os.pipe()
        self._answers, answer_end = os.pipe()
        self._out, out_end = os.pipe()
        self._shared = os.memfd_create("nvfp4lib-evaluate") if hasattr(os, "memfd_create") else os.dup(
            tempfile.TemporaryFile().fileno())
        info, info_end = os.pipe() if self.sandbox.command else (-1, -1)
        self._fds = [fd for fd in (self._requests, self._answers, self._out, self._shared, info) if fd >= 0]
        for fd in (self._requests, self._answers, self._out):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
            os.set_blocking(fd, False)
        fds = [request_end, answer_end, self._shared]
        if self.sandbox.command:
            argv = [*self.sandbox.command, "--info-fd", str(info_end), "--", sys.executable, "-P", "-u", SANDBOX_CHILD,
                    *map(str, fds), "1"]  # its parent there: the sandbox's first process, pid 1
        else:
            self._work = tempfile.mkdtemp(prefix="nvfp4lib-evaluate-")
            argv = [sys.executable, "-P", "-u", str(CHILD_PROGRAM), *map(str, fds), str(os.getpid())]
        try:
            self._proc = subprocess.Popen(
                argv, pass_fds=[*fds, *([info_end] if info_end >= 0 else [])], cwd=self._work or "/",
                stdin=subprocess.DEVNULL, stdout=out_end, stderr=out_end,
                start_new_session=True)  # its own session: it cannot signal this one's group
        finally:
            for fd in (request_end, answer_end, out_end, info_end):
                if fd >= 0:
                    os.close(fd)
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = None
            self._pidfd = os.pidfd_open(self._proc.pid)
            self._fds.append(self._pidfd)
        if info >= 0:
            self._find_init(info)

    def _find_init(self, info: int) -> None:
        """The sandbox's first process, from bwrap's --info-fd: its PID namespace ends when it ends."""
        data, stop = b"", time.monotonic() + min(60.0, max(0.0, self.deadline - time.monotonic()))
        while time.monotonic() < stop:  # bwrap writes it, then closes it, once the sandbox is set up
            if select.select([info], [], [], _POLL_S)[0]:
                chunk = os.read(info, 4096)
                if not chunk:
                    break
                data += chunk
        found = re.search(rb'"child-pid"\s*:\s*(\d+)', data)
        if found:
            with contextlib.suppress(OSError):
                self._init = os.pidfd_open(int(found.group(1)))
                self._fds.append(self._init)

    def __enter__(self) -> SubmissionProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _error(self, answer: dict) -> str:
        """The submission's error, in words; where its process ran out of GPU memory, where that memory was."""
        error = printable(answer["error"])
        held = memory_held(self.device) if error.startswith(OUT_OF_MEMORY) else None
        return f"{error} (on {self.device}: {held})" if held else error

    # -- requests

    def load(self, path, expression: str | None = None, source: str | None = None) -> Loaded:
        """Import the file (its text `source`, read here if not given) -> Loaded; with `expression`,
        Loaded.value is str(eval(expression)) with the module bound to `submission`."""
        path = str(Path(path).resolve())
        source = read_submission(path) if source is None else source
        answer = self._ask({"kind": "load", "path": path, "source": source, "expression": expression},
                           "importing it", {"loaded": answers.LOADED, "error": answers.ERROR})
        if answer["kind"] == "error":
            return Loaded(error=self._error(answer))
        texts = {k: None if answer[k] is None else printable(answer[k])
                 for k in ("submission_path", "backend", "value")}
        return Loaded(None, answer["has_kernel"], answer["needs_cuda"], **texts)

    def call(self, data, reuse: bool = False, timed: bool = False) -> Called:
        """custom_kernel on a copy of `data` (or, with `reuse`, on the previous call's tensors given
        `data`'s values) -> Called. With `timed` the call is timed there as the leaderboard times it.
        Whether an input changed is read here, from its bytes in the shared file after the call."""
        tensors = tuple(data)
        sent = [_storage_bytes(t) for t in tensors]
        offsets = [sum(_page(raw.numel()) for raw in sent[:i]) for i in range(len(sent) + 1)]
        specs = [{"dtype": str(t.dtype), "shape": list(t.shape), "stride": list(t.stride()), "offset": at,
                  "nbytes": raw.numel()} for t, raw, at in zip(tensors, sent, offsets)]
        c_shape = tuple(tensors[-1].shape)
        self._inputs_end = offsets[-1]
        self._grow(self._inputs_end + _page(4 * math.prod(c_shape)))
        for raw, at in zip(sent, offsets):
            self._write_shared(at, raw)
        started = time.monotonic()
        answer = self._ask({"kind": "call", "reuse": reuse, "timed": timed, "tensors": specs,
                            "output": self._inputs_end}, "the call", {"called": answers.CALLED, "error": answers.ERROR})
        if answer["kind"] == "error":
            return Called(error=self._error(answer))
        if timed and (answer["us"] is None or answer["us"] * 1e-6 > 1.01 * (time.monotonic() - started) + 1e-3):
            self._end(f"the timed call: its process sent back the time {answer['us']!r} us, which its call "
                      f"cannot have taken here")
        output = self._output_of(answer["output"], self._inputs_end, c_shape)
        changed = [name for name, raw, at in zip(NAMES, sent[:-1], offsets)
                   if not torch.equal(self._read_shared(at, raw.numel()), raw)]
        return Called(None, output, answer["device"], changed, answer["us"])

    def time(self, rule: StoppingRule, c_shape, floor_us: float = 0.0) -> Timed:
        """Leaderboard time (bench.leaderboard_time) of custom_kernel on the last call's tensors, until
        `rule` says stop -> Timed (`c_shape`: the shape of c, for the sizes of the outputs). Times that
        add up to more than the calls took here, or (given what a call of nothing costs there) leave
        too much of it unexplained, end the process; unless one is below ``floor_us`` (`judge.floor_us`):
        that fails the shape whatever the clock here says, and how much the clock leaves unexplained
        depends on how busy the machine is."""
        c_shape = tuple(c_shape)
        step = _page(4 * math.prod(c_shape))
        self._grow(self._inputs_end + step * rule.max_calls)
        started = time.monotonic()
        answer = self._ask({"kind": "time", "rule": dataclasses.asdict(rule), "baseline": False,
                            "output": self._inputs_end, "step": step}, "the timed calls",
                           {"timed": answers.timed(rule.max_calls), "error": answers.ERROR}, calls=rule.max_calls)
        took = time.monotonic() - started
        if answer["kind"] == "error":
            return Timed(error=self._error(answer))
        samples, outputs = answer["samples_us"], answer["outputs"]
        if len(samples) != len(outputs):
            self._end(f"the timed calls: its process sent {len(samples)} times for {len(outputs)} outputs")
        if min(samples, default=floor_us) >= floor_us:
            self._hold_to_clock(samples, took)
        return Timed(None, samples, [self._output_of(d, self._inputs_end + i * step, c_shape)
                                     for i, d in enumerate(outputs)], answer["device"])

    def _hold_to_clock(self, samples: list[float], took: float) -> None:
        """The times of a run of timed calls against how long the run took here (see `time` and COST_SHARE)."""
        sent = sum(samples) * 1e-6
        if sent > 1.01 * took + 1e-3:
            self._end(f"the timed calls: its process sent times that add up to {sent:.3g} s, more than the "
                      f"{took:.3g} s the calls took here")
        if self.call_cost_s is None:
            return
        slack = WALL_SHARE * sent + len(samples) * WALL_SLACK_PER_CALL_S + WALL_SLACK_S[self.device.type]
        costs = [self.call_cost_s]  # before the import, then (where that explains too little) now
        if took > slack + len(samples) * COST_SHARE * costs[0] and self.device.type == "cuda":
            costs.append(self._call_cost_now())
        per_call = costs[0] + CONTENDED_WAITS * max(0.0, costs[-1] - costs[0])
        if took > (explained := slack + len(samples) * COST_SHARE * per_call):
            each = " us, now ".join(f"{cost * 1e6:.0f}" for cost in costs)
            self._end(f"the timed calls: {len(samples)} calls took {took:.3g} s here, of which the times its process "
                      f"sent ({sent:.3g} s in all) and the timing's own cost ({each} us a call) explain at most "
                      f"{explained:.3g} s: those times were not measured honestly")

    @staticmethod
    def _call_cost_now() -> float:
        """A timed call of nothing here, now (s; 0 where the GPU cannot run BASELINE_RULE's calls): the floor stays."""
        started = time.monotonic()
        try:
            samples = nvfp4lib.bench.timing.leaderboard_time(lambda: None, BASELINE_RULE).samples
        except RuntimeError:  # torch.OutOfMemoryError and the CUDA errors are RuntimeErrors
            return 0.0
        finally:
            torch.cuda.empty_cache()
        return (time.monotonic() - started) / len(samples)

    def _output_of(self, description: dict, at: int, c_shape: tuple) -> Output:
        """An output as described, with its two copies read here from the shared file at byte `at`."""
        output = Output(_shown(description))
        if description["values"]:
            n = 2 * math.prod(c_shape)
            both = self._read_shared(at, 2 * n).view(torch.float16)
            output.at_return, output.settled = (both[i * n // 2:(i + 1) * n // 2].view(c_shape) for i in range(2))
        return output

    # -- the shared file

    def _grow(self, size: int) -> None:
        if size > self._size:
            os.ftruncate(self._shared, size)
            self._size = size

    def _write_shared(self, at: int, raw: torch.Tensor) -> None:
        view = memoryview(raw.numpy()).cast("B")
        while len(view):
            written = os.pwrite(self._shared, view, at)
            view, at = view[written:], at + written

    def _read_shared(self, at: int, n: int) -> torch.Tensor:
        data = bytearray(os.pread(self._shared, n, at)) if n else bytearray()
        if len(data) != n:
            self._end(f"the shared memory file was cut short by the submission's process ({len(data)} of {n} bytes "
                      f"at byte {at})")
        return torch.frombuffer(data, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)

    # -- the wire

    def _allowance(self, doing: str, calls: int = 1) -> tuple[float, str]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._end(f"{doing}: not started, the evaluation reached --time-limit {self.time_limit:g} s")
        if self.timeout * calls < left:
            return self.timeout * calls, f"--timeout {self.timeout:g} s per call"
        return left, f"what was left of --time-limit {self.time_limit:g} s for the whole evaluation"

    def _ready(self) -> None:
        """The config sent, the ready answer read (Python and torch starting up: not the submission's
        time), and then the cost of a timed call that does nothing measured (`call_cost_s`)."""
        if self._ready_done:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._end(f"starting the process: not started, the evaluation reached --time-limit {self.time_limit:g} s")
        overrun = (f"starting the process did not finish within {left:.3g} s (what was left of --time-limit "
                   f"{self.time_limit:g} s for the whole evaluation); the process was killed")
        end = time.monotonic() + left
        config = {"kind": "config", "package": PACKAGE, "folders": child.package_folders(PACKAGE, str(PACKAGE_DIR)),
                  "device": str(self.device), "missing": MISSING_PACKAGE, "task_source": TASK_SOURCE,
                  "input_names": list(NAMES[:6]), "timing_source": TIMING_SOURCE}
        self._io(end, "starting the process", overrun, send=memoryview(child.pack_message(config)))
        self._read_answer(end, "starting the process", overrun, {"ready": answers.READY})
        self._ready_done = True
        started = time.monotonic()
        answer = self._ask({"kind": "time", "rule": dataclasses.asdict(BASELINE_RULE), "baseline": True,
                            "output": 0, "step": 0}, "timing calls that do nothing (before the import)",
                           {"timed": answers.timed(BASELINE_RULE.max_calls, outputs=False)})
        self.call_cost_s = (time.monotonic() - started) / len(answer["samples_us"])

    def _ask(self, request: dict, doing: str, schemas: dict, calls: int = 1) -> dict:
        if self.ended:
            raise SubmissionProcessEnded(self.ended)
        self._ready()
        self._unasked(doing)
        allowance, limit = self._allowance(doing, calls)
        overrun = f"{doing} did not finish within {allowance:.3g} s ({limit}); the process was killed"
        end = time.monotonic() + allowance
        self._seq += 1
        self._busy = True  # until the whole answer is read: a process busy with a request gets no "stop"
        self._io(end, doing, overrun, send=memoryview(child.pack_message(dict(request, seq=self._seq))))
        answer = self._read_answer(end, doing, overrun, schemas, self._seq)
        self._busy = False
        return answer

    def _read_answer(self, end: float, doing: str, overrun: str, schemas: dict, seq: int | None = None) -> dict:
        (n,) = child.FRAME.unpack(self._read(end, doing, overrun, child.FRAME.size))
        if n > answers.MAX_ANSWER_BYTES:
            self._end(f"{doing}: its process announced an answer of {n} bytes, more than the "
                      f"{answers.MAX_ANSWER_BYTES} an answer may have")
        data = self._read(end, doing, overrun, n)
        try:
            return answers.parse(data, schemas, seq)
        except BadAnswer as err:
            self._end(f"{doing}: its process sent an answer that is not one ({err})")

    def _read(self, end: float, doing: str, overrun: str, n: int) -> bytearray:
        buffer = bytearray(n)
        self._io(end, doing, overrun, into=memoryview(buffer))
        return buffer

    def _unasked(self, doing: str) -> None:
        """Nothing may arrive on the answer pipe that no request asked for."""
        if self._exited():
            self._end(f"{doing} was not started: the process had ended ({self._status()})")
        if select.select([self._answers], [], [], 0)[0]:
            try:
                data = os.read(self._answers, 1 << 16)
            except BlockingIOError:
                return
            if data:
                self._end(f"{doing} was not started: the process had sent {len(data)} bytes that no request "
                          f"asked for (something of the submission's writing to the evaluator's pipe)")
            self._end(f"{doing} was not started: the process had closed its answer pipe ({self._status()})")

    def _io(self, end: float, doing: str, overrun: str, send: memoryview | None = None,
            into: memoryview | None = None) -> None:
        """Write all of `send` or fill all of `into` by `end` (else fail with `overrun`), reading the
        process's output meanwhile."""
        while (send is not None and len(send)) or (into is not None and len(into)):
            left = end - time.monotonic()
            if left <= 0:
                self._end(overrun)
            readable = [fd for fd in (self._answers if into is not None else -1, self._out,
                                      -1 if self._pidfd is None else self._pidfd) if fd >= 0]
            writable = [self._requests] if send is not None else []
            ready_r, ready_w, _ = select.select(readable, writable, [], min(left, _POLL_S if self._pidfd else 0.05))
            if self._out >= 0 and self._out in ready_r:
                self._read_output()
            if send is not None and ready_w:
                try:
                    send = send[os.write(self._requests, send[:_CHUNK]):]
                except BlockingIOError:
                    pass
                except OSError:
                    self._end(f"{doing}: the process stopped reading its requests ({self._status()})")
            if into is not None and self._answers in ready_r:
                into = self._fill(into, doing)
            if (self._pidfd in ready_r) if self._pidfd is not None else self._exited():
                while into is not None and len(into) and select.select([self._answers], [], [], 0)[0]:
                    into = self._fill(into, doing)  # what it wrote before it ended still counts
                if into is None or len(into):
                    self._end(f"{doing} ended the process ({self._status()}) without an answer")

    def _fill(self, into: memoryview, doing: str) -> memoryview:
        try:
            got = os.readv(self._answers, [into[:_CHUNK]])
        except BlockingIOError:
            return into
        except OSError as err:
            self._end(f"{doing}: its answer pipe could not be read ({err.strerror or err})")
        if got == 0:
            self._end(f"{doing} ended the process ({self._status()}) without an answer")
        return into[got:]

    def _read_output(self) -> None:
        try:
            data = os.read(self._out, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            os.close(self._out)
            self._fds.remove(self._out)
            self._out = -1
            return
        self.output_bytes += len(data)
        self._output += data
        del self._output[:-OUTPUT_KEPT_BYTES]
        if self.on_output is None:
            return
        self._line += data
        *lines, rest = self._line.split(b"\n")
        self._line = bytearray(rest[-OUTPUT_KEPT_BYTES:])
        for line in lines:
            self._show(line)

    def _show(self, line: bytes) -> None:
        if self._shown >= OUTPUT_SHOWN_BYTES:
            return
        self._shown += len(line) + 1
        if self._shown >= OUTPUT_SHOWN_BYTES:
            self.on_output(f"{OUTPUT_PREFIX}... (more than {OUTPUT_SHOWN_BYTES} bytes: the rest is not shown)")
            return
        self.on_output(OUTPUT_PREFIX + printable(line.decode("utf-8", "replace")))

    @property
    def output(self) -> str:
        """The last OUTPUT_KEPT_BYTES of what the submission wrote to stdout and stderr."""
        return printable(self._output.decode("utf-8", "replace"))

    # -- the end

    def _exited(self) -> bool:
        if self._exit_info is None:
            try:
                self._exit_info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
        return self._exit_info is not None

    def _status(self, wait_s: float = 0.5) -> str:
        """How the process ended ('exit code 0', 'killed by signal SIGSEGV'), waiting briefly for it."""
        stop = time.monotonic() + wait_s
        while not self._exited() and time.monotonic() < stop:
            time.sleep(0.01)
        info = self._exit_info
        if info is None:
            return "it closed its pipe" if self._proc.returncode is None else f"exit code {self._proc.returncode}"
        if info.si_code == os.CLD_EXITED and not (self.sandbox.command and info.si_status > 128):
            return f"exit code {info.si_status}"
        # bwrap exits with 128 + N for its program killed by signal N
        return f"killed by signal {signal_name(info.si_status - 128 * (info.si_code == os.CLD_EXITED))}"

    def _end(self, message: str):
        self.ended = message
        with _signals_held():
            self._kill()
        raise SubmissionProcessEnded(message)

    def _kill(self) -> None:
        """Kill the process and everything it started: under bwrap the sandbox's first process, whose
        PID namespace the kernel then empties before bwrap can end; without, its process group."""
        if self._proc.returncode is not None:
            return
        if self._init is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._init, signal.SIGKILL)
        else:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        try:
            self._proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            self.left_running = True  # stuck in the kernel: named, not waited for
            with contextlib.suppress(OSError):
                self._proc.kill()

    def close(self) -> None:
        """Ask the process to stop (its exit handlers run, briefly, within the deadline), then end it
        and everything it started, read what it wrote, and remove what it was given."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.ended and not self._busy and self._ready_done and not self._exited():
                grace = min(STOP_GRACE_S, self.timeout, max(0.0, self.deadline - time.monotonic()))
                with contextlib.suppress(SubmissionProcessEnded, OSError):
                    self._io(time.monotonic() + grace, "stopping", "stopping took too long",
                             send=memoryview(child.pack_message({"kind": "stop"})))
                    stop = time.monotonic() + grace
                    while not self._exited() and time.monotonic() < stop:
                        select.select([fd for fd in (self._out, self._pidfd) if fd is not None and fd >= 0], [], [],
                                      min(0.1, max(0.0, stop - time.monotonic())))
                        if self._out >= 0:
                            self._read_output()
        finally:
            with _signals_held():
                self._kill()
                while self._out >= 0 and select.select([self._out], [], [], 0)[0]:
                    self._read_output()
                if self._line and self.on_output is not None:
                    self._show(bytes(self._line))
                    self._line.clear()
                self._release()

    def _release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        if self._work is not None:  # without a sandbox: whatever the submission left or put in its place
            with contextlib.suppress(OSError):
                if os.path.islink(self._work) or not os.path.isdir(self._work):
                    os.unlink(self._work)
                else:
                    shutil.rmtree(self._work, ignore_errors=True)
            self._work = None
