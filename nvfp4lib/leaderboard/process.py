"""The submission's process, from the evaluator's side: starting it, talking to it within deadlines,
and ending it together with everything it started.

* `SubmissionProcess` starts nvfp4lib.leaderboard.child in a session of its own, in an empty folder,
  with its own pipes: requests, answers, and its stdout and stderr (read here, never this process's
  own). Every wait has a deadline (the per-call `timeout`, never past the evaluation's `deadline`);
  an answer is read only up to the size its request allows and checked (nvfp4lib.leaderboard.answers)
  before anything uses it; tensors travel as raw bytes on the pipes, so no file of the evaluator's
  lies where the submission could replace it. Whatever goes wrong (an overrun, an exit, a crash, an
  answer that is not one) ends the process and raises `SubmissionProcessEnded` naming it.
* `supervision` makes this process a child subreaper while submissions run (Linux; every
  `SubmissionProcess` holds it from its start to its close, the one entry): a process the
  submission starts stays in this process's tree even after it leaves its session or its parent
  dies, and `end_descendants` kills and reaps every one of them. It also turns this process
  non-dumpable meanwhile, so that processes of the same user cannot open its /proc files (its file
  descriptors, its memory) or trace it.
* `signals_as_failures` turns a signal that would end the evaluator (SIGTERM, SIGHUP, SIGINT, ...)
  into `EvaluationInterrupted`, raised where the evaluation can end in a verdict; cleanups run
  `shielded` from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import os
import re
import select
import shutil
import signal
import stat
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
from nvfp4lib.leaderboard.submission_file import MISSING_PACKAGE, PACKAGE, TASK_SOURCE, read_submission
from nvfp4lib.locations import PACKAGE_DIR

CHILD_PROGRAM = Path(child.__file__).resolve()
TIMING_SOURCE = Path(nvfp4lib.bench.timing.__file__).read_text()  # read once, before any submission runs
STOP_GRACE_S = 10.0      # a process asked to stop may run its exit handlers this long
KILL_WAIT_S = 5.0        # ending every process a submission started may take this long
OUTPUT_KEPT_BYTES = 64 << 10    # the tail of the submission's stdout and stderr kept for the report
OUTPUT_SHOWN_BYTES = 1 << 20    # shown line by line (show_output) up to this much
OUTPUT_PREFIX = "[submission] "
_PIPE_BYTES = 1 << 20
_CHUNK = 1 << 20
_POLL_S = 0.5            # the longest a wait sleeps before it looks at signals and the clock again


class SubmissionProcessEnded(RuntimeError):
    """The submission's process is gone (it exited, crashed, hung or answered garbage); the message says how."""


class EvaluationInterrupted(BaseException):
    """A signal that would have ended the evaluator arrived; the evaluation stops with a verdict."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal_name(self.signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------------------------------------
# Signals


class _SignalState:
    armed = False
    shield = 0
    received: int | None = None


_SIGNALS = _SignalState()
# the signals whose default action ends a process and that a handler can catch; the fault signals
# (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) are left alone: a handler cannot resume after one
_CATCHABLE = ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF",
              "SIGXCPU", "SIGXFSZ", "SIGIO", "SIGPWR", "SIGSTKFLT", "SIGABRT")


def _on_signal(signum, frame):
    if _SIGNALS.received is None:
        _SIGNALS.received = signum
    if _SIGNALS.armed and not _SIGNALS.shield:
        raise EvaluationInterrupted(signum)


def _catchable() -> list[int]:
    found = [getattr(signal, name) for name in _CATCHABLE if hasattr(signal, name)]
    if hasattr(signal, "SIGRTMIN"):
        found += list(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    return found


@contextlib.contextmanager
def signals_as_failures():
    """While inside: each catchable signal whose handler is the default raises EvaluationInterrupted
    (once; later ones are noted). Only in the main thread (elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread() or _SIGNALS.armed:
        yield
        return
    previous = {}
    for signum in _catchable():
        try:
            handler = signal.getsignal(signum)
            if handler in (signal.SIG_DFL, signal.default_int_handler):
                previous[signum] = signal.signal(signum, _on_signal)
        except (OSError, ValueError, RuntimeError):
            pass
    _SIGNALS.received, _SIGNALS.armed = None, True
    try:
        yield
    finally:
        _SIGNALS.armed = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def shielded():
    """Cleanup that a signal must not cut short: a signal meanwhile is raised when it is done."""
    _SIGNALS.shield += 1
    try:
        yield
    finally:
        _SIGNALS.shield -= 1
    if _SIGNALS.armed and not _SIGNALS.shield and _SIGNALS.received is not None:
        raise EvaluationInterrupted(_SIGNALS.received)


def interrupted() -> None:
    """Raise EvaluationInterrupted if a signal came in (for long steps between waits)."""
    if _SIGNALS.armed and not _SIGNALS.shield and _SIGNALS.received is not None:
        raise EvaluationInterrupted(_SIGNALS.received)


# ---------------------------------------------------------------------------------------------
# Every process a submission starts

_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def _prctl(option: int, value: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0))


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                fields = file.read().rpartition(b")")[2].split()
            table[int(name)] = (int(fields[1]), fields[0].decode())
        except (OSError, IndexError, ValueError):
            continue
    return table


class _Supervision:
    """Child subreaper and non-dumpable while at least one user is inside (`supervision`)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.depth = 0
        self.known: set[int] = set()      # children this process had before: not the submission's
        self.live: set[int] = set()       # submission processes still in use: ended by their own close
        self.available = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
        self.subreaper = False
        self._restore: list[tuple[int, int]] = []

    def __enter__(self):
        with self.lock:
            if self.depth == 0 and self.available:
                self._restore = []
                try:
                    was = ctypes.c_int(0)
                    libc = ctypes.CDLL(None, use_errno=True)
                    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
                    self.subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
                    if self.subreaper:
                        self._restore.append((_PR_SET_CHILD_SUBREAPER, was.value))
                    dumpable = _prctl(_PR_GET_DUMPABLE)
                    if dumpable > 0 and _prctl(_PR_SET_DUMPABLE, 0) == 0:
                        self._restore.append((_PR_SET_DUMPABLE, dumpable))
                except (OSError, AttributeError):
                    self.subreaper = False
                me = os.getpid()
                self.known = {pid for pid, (ppid, _) in _process_table().items() if ppid == me}
            self.depth += 1
        return self

    def __exit__(self, *exc):
        with shielded(), self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.end_descendants()
                for option, value in reversed(self._restore):
                    _prctl(option, value)
                self._restore = []

    def end_descendants(self) -> list[int]:
        """Kill and reap every process that the submissions left (this process's children that it
        did not have before, other than live submission processes, and all their descendants) ->
        the pids still there after KILL_WAIT_S (a process the kernel cannot end yet)."""
        if not self.available:
            return []
        me, stop = os.getpid(), time.monotonic() + KILL_WAIT_S
        while True:
            table = _process_table()
            roots = {pid for pid, (ppid, _) in table.items()
                     if ppid == me and pid not in self.known and pid not in self.live}
            children: dict[int, list[int]] = {}
            for pid, (ppid, _) in table.items():
                children.setdefault(ppid, []).append(pid)
            tree, todo = set(), list(roots)
            while todo:
                pid = todo.pop()
                if pid not in tree:
                    tree.add(pid)
                    todo += children.get(pid, [])
            running = [pid for pid in tree if table.get(pid, (0, "Z"))[1] not in "ZX"]
            for pid in running:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            for pid in roots:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            if not tree:
                return []
            if time.monotonic() > stop:
                return sorted(running)
            time.sleep(0.005)


supervision = _Supervision()


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


def _exit_status(info) -> str:
    """os.waitid's result as words: 'exit code 0', 'killed by signal SIGSEGV'."""
    if info.si_code == os.CLD_EXITED:
        return f"exit code {info.si_status}"
    return f"killed by signal {signal_name(info.si_status)}"


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(line: str) -> str:
    """`line` with control characters (escape sequences, carriage returns) shown as escapes."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], line)


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
    prefixed and with control characters escaped. Use it as a context manager.
    """

    def __init__(self, device: torch.device, timeout: float, deadline: float, time_limit: float,
                 on_output: Callable[[str], None] | None = None):
        self.timeout, self.deadline, self.time_limit = timeout, deadline, time_limit
        self.device = torch.device(device)
        self.on_output = on_output
        self.ended: str | None = None
        self.isolation: dict | None = None
        self.output_bytes = 0
        self._output = bytearray()
        self._line = bytearray()
        self._shown = 0
        self._seq = 0
        self._exit_info = None
        self._closed = False
        self._busy = False
        self.left_running: list[int] = []  # pids the kernel had not ended KILL_WAIT_S after SIGKILL
        self._fds: list[int] = []
        supervision.__enter__()
        try:
            self._start()
        except BaseException:
            self._release()
            supervision.__exit__(None, None, None)
            raise

    def _start(self) -> None:
        self._work = tempfile.mkdtemp(prefix="nvfp4lib-evaluate-")
        self._work_fd = os.open(self._work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        request_end, self._requests = os.pipe()
        self._answers, answer_end = os.pipe()
        self._out, out_end = os.pipe()
        self._fds = [self._requests, self._answers, self._out]
        for fd in (self._requests, self._answers, self._out):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
            os.set_blocking(fd, False)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-u", str(CHILD_PROGRAM), str(request_end), str(answer_end), str(os.getpid())],
                pass_fds=(request_end, answer_end), cwd=self._work, stdin=subprocess.DEVNULL, stdout=out_end,
                stderr=out_end, start_new_session=True)  # its own session: it cannot signal this one's group
        finally:
            for fd in (request_end, answer_end, out_end):
                os.close(fd)
        supervision.live.add(self._proc.pid)
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
            self._fds.append(self._pidfd)
        except (AttributeError, OSError):
            self._pidfd = None

    def __enter__(self) -> SubmissionProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests

    def load(self, path, expression: str | None = None, source: str | None = None) -> Loaded:
        """Import the file (its text `source`, read here if not given) -> Loaded; with `expression`,
        Loaded.value is str(eval(expression)) with the module bound to `submission`."""
        path = str(Path(path).resolve())
        source = read_submission(path) if source is None else source
        answer, _ = self._ask({"kind": "load", "path": path, "source": source, "expression": expression},
                              "importing it", {"loaded": answers.LOADED, "error": answers.ERROR})
        if answer["kind"] == "error":
            return Loaded(error=printable(answer["error"]))
        texts = {k: None if answer[k] is None else printable(answer[k])
                 for k in ("submission_path", "backend", "value")}
        return Loaded(None, answer["has_kernel"], answer["needs_cuda"], **texts)

    def call(self, data, reuse: bool = False, timed: bool = False) -> Called:
        """custom_kernel on a copy of `data` (or, with `reuse`, on the previous call's tensors given
        `data`'s values) -> Called. With `timed` the call is timed there as the leaderboard times it."""
        tensors = tuple(data)
        sent = [_storage_bytes(t) for t in tensors]
        specs = [{"dtype": str(t.dtype), "shape": list(t.shape), "stride": list(t.stride()), "nbytes": raw.numel()}
                 for t, raw in zip(tensors, sent)]
        c_bytes = tensors[-1].numel() * tensors[-1].element_size()

        def frames(answer):
            if answer["kind"] != "called":
                return []
            sizes = [c_bytes, c_bytes] if answer["output"]["values"] else []
            for name, spec, entry in zip(NAMES, specs, answer["inputs"]):
                if entry["bytes"]:
                    if entry["nbytes"] != spec["nbytes"]:
                        raise BadAnswer(f"inputs: {name} sent with {entry['nbytes']} bytes, expected {spec['nbytes']}")
                    sizes.append(spec["nbytes"])
            return sizes

        started = time.monotonic()
        answer, received = self._ask({"kind": "call", "reuse": reuse, "timed": timed, "tensors": specs}, "the call",
                                     {"called": answers.CALLED, "error": answers.ERROR}, frames, sent)
        if answer["kind"] == "error":
            return Called(error=printable(answer["error"]))
        if timed and (answer["us"] is None or answer["us"] * 1e-6 > 1.01 * (time.monotonic() - started) + 1e-3):
            self._end(f"the timed call: its process sent back the time {answer['us']!r} us, which its call "
                      f"cannot have taken here")
        output = Output(_shown(answer["output"]))
        if output.description["values"]:
            output.at_return, output.settled = (self._as_c(received.pop(0), tuple(tensors[-1].shape)) for _ in range(2))
        changed = []
        for name, raw, spec, entry in zip(NAMES, sent, specs, answer["inputs"]):
            same = False
            if entry["bytes"]:
                got = received.pop(0)
                same = (entry["dtype"] == spec["dtype"] and entry["shape"] == spec["shape"]
                        and entry["stride"] == spec["stride"] and entry["offset"] == 0 and not entry["moved"]
                        and entry["device"] == answer["device"]
                        and torch.equal(torch.frombuffer(got, dtype=torch.uint8) if len(got) else raw[:0], raw))
            if not same:
                changed.append(name)
        return Called(None, output, answer["device"], changed, answer["us"])

    def time(self, rule: StoppingRule, c_shape) -> Timed:
        """Leaderboard time (bench.leaderboard_time) of custom_kernel on the last call's tensors, until
        `rule` says stop -> Timed (`c_shape`: the shape of c, for the sizes of the outputs)."""
        c_bytes = 2 * int(torch.Size(c_shape).numel())

        def frames(answer):
            return [] if answer["kind"] != "timed" else [
                c_bytes for d in answer["outputs"] for _ in range(2) if d["values"]]

        started = time.monotonic()
        answer, received = self._ask({"kind": "time", "rule": dataclasses.asdict(rule)}, "the timed calls",
                                     {"timed": answers.timed(rule.max_calls), "error": answers.ERROR}, frames,
                                     calls=rule.max_calls)
        if answer["kind"] == "error":
            return Timed(error=printable(answer["error"]))
        samples, outputs = answer["samples_us"], answer["outputs"]
        if len(samples) != len(outputs):
            self._end(f"the timed calls: its process sent {len(samples)} times for {len(outputs)} outputs")
        if sum(samples) * 1e-6 > 1.01 * (time.monotonic() - started) + 1e-3:
            self._end(f"the timed calls: its process sent times that add up to {sum(samples) * 1e-6:.3g} s, more "
                      f"than the {time.monotonic() - started:.3g} s the calls took here")
        shape = tuple(c_shape)
        result = []
        for description in outputs:
            output = Output(_shown(description))
            if description["values"]:
                output.at_return, output.settled = (self._as_c(received.pop(0), shape) for _ in range(2))
            result.append(output)
        return Timed(None, samples, result, answer["device"])

    @staticmethod
    def _as_c(raw: bytearray, shape: tuple) -> torch.Tensor:
        """A frame of c's values as a float16 tensor of ``shape`` (an empty frame: an empty tensor)."""
        return torch.frombuffer(raw, dtype=torch.float16).view(shape) if len(raw) else torch.empty(
            shape, dtype=torch.float16)

    # -- the wire

    def _allowance(self, doing: str, calls: int = 1) -> tuple[float, str]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._end(f"{doing}: not started, the evaluation reached --time-limit {self.time_limit:g} s")
        if self.timeout * calls < left:
            return self.timeout * calls, f"--timeout {self.timeout:g} s per call"
        return left, f"what was left of --time-limit {self.time_limit:g} s for the whole evaluation"

    def _ready(self) -> None:
        """The config sent and the ready answer read (Python and torch starting up: not the submission's time)."""
        if self.isolation is not None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._end(f"starting the process: not started, the evaluation reached --time-limit {self.time_limit:g} s")
        overrun = (f"starting the process did not finish within {left:.3g} s (what was left of --time-limit "
                   f"{self.time_limit:g} s for the whole evaluation); the process was killed")
        end = time.monotonic() + left
        config = {"kind": "config", "package": PACKAGE, "package_dir": os.path.realpath(PACKAGE_DIR),
                  "device": str(self.device), "missing": MISSING_PACKAGE, "task_source": TASK_SOURCE,
                  "input_names": list(NAMES[:6]), "timing_source": TIMING_SOURCE}
        self._io(end, "starting the process", overrun, send=memoryview(child.pack_message(config)))
        self.isolation = self._read_answer(end, "starting the process", overrun, {"ready": answers.READY})
        if self.isolation["pid"] != self._proc.pid:
            self._end(f"starting the process: its answer names pid {self.isolation['pid']}, not {self._proc.pid}")

    def _ask(self, request: dict, doing: str, schemas: dict, frames: Callable[[dict], list[int]] | None = None,
             payloads=(), calls: int = 1) -> tuple[dict, list[bytearray]]:
        if self.ended:
            raise SubmissionProcessEnded(self.ended)
        self._ready()
        self._unasked(doing)
        allowance, limit = self._allowance(doing, calls)
        overrun = f"{doing} did not finish within {allowance:.3g} s ({limit}); the process was killed"
        end = time.monotonic() + allowance
        self._seq += 1
        request = dict(request, seq=self._seq)
        self._busy = True  # until the whole answer is read: a process busy with a request gets no "stop"
        self._io(end, doing, overrun, send=memoryview(child.pack_message(request)))
        for payload in payloads:
            self._io(end, doing, overrun, send=memoryview(child.FRAME.pack(payload.numel())))
            if payload.numel():
                self._io(end, doing, overrun, send=memoryview(payload.numpy()).cast("B"))
        answer = self._read_answer(end, doing, overrun, schemas, self._seq)
        try:
            sizes = frames(answer) if frames else []
        except BadAnswer as err:
            self._end(f"{doing}: its process sent an answer that is not one ({err})")
        received = []
        for size in sizes:
            header = self._read(end, doing, overrun, child.FRAME.size)
            (n,) = child.FRAME.unpack(header)
            if n != size:
                self._end(f"{doing}: its process sent {n} bytes where {size} were expected")
            received.append(self._read(end, doing, overrun, size))
        self._busy = False
        return answer, received

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
            interrupted()
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
        if self._exit_info is None:
            return "it closed its pipe" if self._proc.returncode is None else f"exit code {self._proc.returncode}"
        return _exit_status(self._exit_info)

    def _end(self, message: str):
        self.ended = message
        with shielded():
            self._kill()
        raise SubmissionProcessEnded(message)

    def _kill(self) -> None:
        if self._proc.returncode is None:  # not reaped yet: its pid (and group id) are still its own
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(KILL_WAIT_S)
        supervision.live.discard(self._proc.pid)
        self.left_running = supervision.end_descendants()

    def close(self) -> None:
        """Ask the process to stop (its exit handlers run, briefly, within the deadline), then end it
        and everything it started, read what it wrote, and remove its folder."""
        if self._closed:
            return
        self._closed = True
        with shielded():
            try:
                if not self.ended and not self._busy and self.isolation is not None and not self._exited():
                    grace = min(STOP_GRACE_S, self.timeout, max(0.0, self.deadline - time.monotonic()))
                    with contextlib.suppress(SubmissionProcessEnded, OSError):
                        self._io(time.monotonic() + grace, "stopping", "stopping took too long", send=memoryview(
                            child.pack_message({"kind": "stop"})))
                        stop = time.monotonic() + grace
                        while not self._exited() and time.monotonic() < stop:
                            select.select([fd for fd in (self._out, self._pidfd) if fd is not None and fd >= 0], [],
                                          [], min(0.1, max(0.0, stop - time.monotonic())))
                            if self._out >= 0:
                                self._read_output()
                self._kill()
                while self._out >= 0 and select.select([self._out], [], [], 0)[0]:
                    self._read_output()
                if self._line and self.on_output is not None:
                    self._show(bytes(self._line))
                    self._line.clear()
            finally:
                self._release()
                supervision.__exit__(None, None, None)

    def _release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        work_fd = getattr(self, "_work_fd", None)
        if work_fd is not None:
            self._work_fd = None
            _empty_folder(work_fd)
            with contextlib.suppress(OSError):
                made = os.fstat(work_fd)
                now = os.lstat(self._work)
                if (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
                    os.rmdir(self._work)
                elif stat.S_ISDIR(now.st_mode):  # a folder the submission put in its place
                    shutil.rmtree(self._work, ignore_errors=True)
                else:                            # a link or a file the submission put there: not followed
                    os.unlink(self._work)
            os.close(work_fd)


def _empty_folder(fd: int) -> None:
    """Remove everything in the folder open as `fd`, following no link (whatever the submission put there)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(fd):
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.name, dir_fd=fd, ignore_errors=True)
                else:
                    os.unlink(entry.name, dir_fd=fd)
