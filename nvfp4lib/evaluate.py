"""A local leaderboard: check and time a one-file submission the way the leaderboard does.

``python -m nvfp4lib.leaderboard.evaluate submission.py [--mode test|benchmark|ranked|both|all] [--secret-seed N]
[--timeout S] [--time-limit S]``

The submission runs in its own Python process, started fresh for each mode (as the leaderboard
does), with a stand-in ``task`` module for ``from task import input_t, output_t`` and without
nvfp4lib, which the leaderboard machine does not have. This process generates the inputs,
computes the reference and judges every answer, so nothing the submission does in its process
can change what it is compared with. Each call gets a copy of the inputs, as on the leaderboard;
a call that changes them fails here. A call longer than `CALL_TIMEOUT_S` (--timeout) or an
evaluation longer than `TIME_LIMIT_S` (--time-limit) kills the process and fails. Whatever the
submission does (raise, exit, crash, hang, return the wrong kind of object) ends in a FAIL that
names it. It is not a sandbox: see `python -m nvfp4lib.leaderboard.evaluate --help` for what is isolated.

The modes (`MODES`; "both" is test and benchmark, "all" adds ranked):

* test: the test shapes on the leaderboard's own data and on full-range data
  (nvfp4lib.problem.generate_input), with the output poisoned first so an element left unwritten
  shows up, then new inputs twice (the tensors of the previous call overwritten in place, then
  new tensors) so a result cached from an earlier call is caught. Every output is compared with
  nvfp4lib.reference at rtol = atol = 1e-3.
* benchmark: the leaderboard's benchmark mode. A warm-up benchmark of the first shape (not
  reported), then per benchmark shape one checked call and leaderboard time
  (nvfp4lib.bench.timing.leaderboard_time, run in the submission's process: the leaderboard's flush
  enqueued right before each call) on that one input, until the leaderboard's stopping rule says
  stop. The figure is the MEAN ("leaderboard time (mean)", with std, error, best and worst), held
  against this device's copy bandwidth and, on a B200, the speed of light.
* ranked: what the leaderboard calls its "leaderboard" mode, the one it ranks by. As benchmark
  mode, but before every timed call a new input with the seed advanced by
  harness.RANKED_SEED_STEP, made here and passed to the submission's process untimed; that
  process times the call (bench.time_one_call) and every result is checked here against the
  untouched input; the first failing shape ends the mode. Passing each input between the
  processes costs time the leaderboard does not spend, so within the rule's wall-clock limit
  fewer calls may be timed here than there; each call is timed the same way.

`--secret-seed N` mixes a secret into every seed as the leaderboard does (harness.combine_seed),
so that the data cannot be known from the public seeds.

Without CUDA, test mode runs `CPU_TEST_SHAPES` (the test shapes of at most 2^20 elements of A,
so that a CPU run takes seconds) and the timed modes are skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import numbers
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

import nvfp4lib.bench.timing
from nvfp4lib.bench import harness
from nvfp4lib.bench.timing import (StoppingRule, Timing, copy_bandwidth_gbps, gbps, geomean, leaderboard_time, percent,
                            text_table)
from nvfp4lib.contract import NAMES, Shape
from nvfp4lib.device import capabilities
from nvfp4lib.locations import PACKAGE_DIR
from nvfp4lib.bench.harness import CheckFailed, RANKED_SEED_STEP, check_integer, combine_seed
from nvfp4lib.problem import B200_SPEED_OF_LIGHT_US, BENCHMARK_SHAPES, TEST_SHAPES, bytes_moved, generate_input
from nvfp4lib.reference import check, poison_
from nvfp4lib.leaderboard.submission_file import (DIRECTIVE, MISSING_PACKAGE, PACKAGE, SubmissionError, TASK_SOURCE, has_directive,
                                      load_submission, read_submission)  # noqa: F401 - part of this module's interface

PHASES = {"test": ("test",), "benchmark": ("benchmark",), "ranked": ("ranked",), "both": ("test", "benchmark"),
          "all": ("test", "benchmark", "ranked")}  # a mode's phases, each in a fresh process
MODES = tuple(PHASES)
TIMED_PHASES = tuple(harness.MODES)  # "benchmark", "ranked": the phases that time calls
CPU_MAX_ELEMENTS = 1 << 20  # M * K * L of the test shapes run without CUDA
CPU_TEST_SHAPES = [s for s in TEST_SHAPES if s.m * s.k * s.l <= CPU_MAX_ELEMENTS]
CASES = ("leaderboard data", "full-range data", "same tensors, new values", "new tensors")
RTOL = ATOL = 1e-3
MAX_SEED = 2**32 - 1
CALL_TIMEOUT_S = 120.0  # per call (the import counts as one): room for a first call that compiles kernels
TIME_LIMIT_S = 900.0    # the whole evaluation
_STOP_GRACE_S = 10.0    # a process asked to stop may run its exit handlers this long
_MAX_ANSWER_BYTES = 1 << 20
_DETAILED_FAILURES = 3  # failures printed in full at the end; the rest by their first line


class SubmissionProcessEnded(RuntimeError):
    """The submission's process is gone (it exited, crashed, hung or answered garbage); the message says how."""


# ---------------------------------------------------------------------------------------------
# The submission's process

# Runs as `python -u -c _RUNNER REQUESTS_FD ANSWERS_FD CONFIG_FILE` in an empty folder. nvfp4lib is
# out of reach there: its folder's parent is taken off sys.path, a finder ahead of all others
# refuses the name (whatever an installed copy says), and an audit hook refuses to open any file
# in the package folder (so loading its files by path fails too). The timing code is the source
# of nvfp4lib/bench/timing.py run as a private module before those guards go up. Requests and answers
# are JSON lines; tensors travel as torch.save files in the evaluator's work folder.
_RUNNER = r'''
import atexit, dataclasses, importlib.abc, importlib.util, json, os, sys, types

import torch

requests, answers = os.fdopen(int(sys.argv[1]), "rb"), int(sys.argv[2])
with open(sys.argv[3]) as file:
    config = json.load(file)
PACKAGE, PACKAGE_DIR, DEVICE = config["package"], config["package_dir"], torch.device(config["device"])

timing = sys.modules["leaderboard_timing"] = types.ModuleType("leaderboard_timing")
exec(compile(config["timing_source"], f"<{PACKAGE}/bench.py, the timing code>", "exec"), timing.__dict__)
del sys.modules["leaderboard_timing"]


class RefusePackage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == PACKAGE:
            raise ModuleNotFoundError(config["missing"].format(name=name), name=name)


def refuse_package_files(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path == PACKAGE_DIR or path.startswith(PACKAGE_DIR + os.sep):
            raise PermissionError(f"{os.fsdecode(args[0])}: a submission cannot read {PACKAGE}'s files")


sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != os.path.dirname(PACKAGE_DIR)]
sys.path_importer_cache.clear()
for name in [n for n in sys.modules if n.partition(".")[0] == PACKAGE]:
    del sys.modules[name]
sys.meta_path.insert(0, RefusePackage())
sys.addaudithook(refuse_package_files)
task = sys.modules["task"] = types.ModuleType("task")
exec(config["task_source"], task.__dict__)
state = {}


def send(answer):
    data = (json.dumps(answer) + "\n").encode()
    while data:
        data = data[os.write(answers, data):]


def describe(err):
    try:
        if isinstance(err, SystemExit):
            return f"called sys.exit({err.code!r})"[:2000]
        text = str(err)
        return (f"raised {type(err).__name__}" + (f": {text}" if text else ""))[:2000]
    except BaseException:
        return f"raised {type(err).__name__} (its message cannot be shown)"


def load(request):
    spec = importlib.util.spec_from_file_location("submission", request["path"])
    module = sys.modules["submission"] = importlib.util.module_from_spec(spec)  # dataclasses, CuTe DSL
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("submission", None)
        raise
    kernel = getattr(module, "custom_kernel", None)
    state["kernel"] = kernel
    answer = {"ok": True, "has_kernel": callable(kernel), "needs_cuda": bool(getattr(module, "NEEDS_CUDA", False))}
    for key, name in (("submission_path", "SUBMISSION_PATH"), ("backend", "BACKEND")):
        value = getattr(module, name, None)
        answer[key] = None if value is None else str(value)
    if request["expression"]:
        answer["value"] = str(eval(request["expression"], {"submission": module}))
    return answer


def output_problem(out, c):
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected the tensor c"
    if type(out) is not torch.Tensor:
        return f"returned a {type(out).__name__} (a torch.Tensor subclass), expected a plain tensor like c"
    if out.layout != torch.strided:
        return f"returned a tensor with layout {out.layout}, expected torch.strided (dense, as c)"
    if out.device != c.device:
        return f"returned a tensor on {out.device}, expected {c.device} (as c)"
    if out.dtype != c.dtype:
        return f"returned dtype {out.dtype}, expected {c.dtype} (as c)"
    if out.shape != c.shape:
        return f"returned shape {tuple(out.shape)}, expected {tuple(c.shape)} (as c)"
    return None


def unchanged(before, after):
    if type(after) is not torch.Tensor or (after.dtype, after.shape, after.device) != (before.dtype, before.shape,
                                                                                       before.device):
        return False
    if before.element_size() == 1:  # bytes: every dtype (FP4 has no comparison) and NaN compare exactly
        before, after = before.view(torch.uint8), after.view(torch.uint8)
    return torch.equal(before, after)


def call(request):
    original = tuple(torch.load(request["inputs"], map_location=DEVICE, weights_only=True))
    if request["reuse"]:  # the previous call's tensors (and tuple), new values
        given = state["given"]
        for dst, src in zip(given, original):
            dst.copy_(src)
    else:
        given = state["given"] = tuple(t.clone() for t in original)
    us = None
    if request["timed"]:  # ranked mode: timed as the leaderboard times a call (it synchronizes after)
        out, us = timing.time_one_call(lambda: state["kernel"](given))
    else:
        out = state["kernel"](given)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
    problem = output_problem(out, original[-1])
    changed = [name for name, before, after in zip(config["input_names"], original, given)
               if not unchanged(before, after)]
    if problem is None:
        torch.save(out.detach().to("cpu", memory_format=torch.contiguous_format, copy=True), request["output"])
    return {"ok": True, "problem": problem, "changed": changed, "us": us}


def time_calls(request):
    kernel, given = state["kernel"], state["given"]
    result = timing.leaderboard_time(lambda: kernel(given), timing.StoppingRule(**request["rule"]))
    return {"ok": True, "timing": dataclasses.asdict(result)}


HANDLERS = {"load": load, "call": call, "time": time_calls}
send({"ok": True})  # ready: the time a request takes from here on is the submission's
for line in requests:
    request = json.loads(line)
    if request["kind"] == "stop":
        break
    try:
        answer = HANDLERS[request["kind"]](request)
    except BaseException as err:  # whatever the submission does, the evaluator gets an answer
        answer = {"ok": False, "error": describe(err)}
    send(answer)
atexit._run_exitfuncs()  # the submission's exit handlers, then out without tearing down torch (~0.5 s)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def _exit_status(info) -> str:
    """os.waitid's result as words: 'exit code 0', 'killed by signal SIGSEGV'."""
    if info.si_code == os.CLD_EXITED:
        return f"exit code {info.si_status}"
    try:
        name = signal.Signals(info.si_status).name
    except ValueError:
        name = str(info.si_status)
    return f"killed by signal {name}"


class SubmissionProcess:
    """A fresh Python process that holds one submission and calls it when asked.

    Every request has a time allowance (`timeout` per call, never past `deadline`, a
    time.monotonic() value); a process that overruns it, ends, or answers garbage is killed
    together with whatever it started, and the request raises SubmissionProcessEnded, whose
    message (also kept in `ended`) says what happened. Use it as a context manager.
    """

    def __init__(self, device: torch.device, timeout: float, deadline: float, time_limit: float):
        self.timeout, self.deadline, self.time_limit = timeout, deadline, time_limit
        self.ended: str | None = None
        self._ready = False
        self._buffer = b""
        self._work = tempfile.TemporaryDirectory(prefix="nvfp4lib-evaluate-")
        self.folder = Path(self._work.name)
        (self.folder / "cwd").mkdir()
        config = self.folder / "config.json"
        config.write_text(json.dumps({
            "package": PACKAGE, "package_dir": os.path.realpath(PACKAGE_DIR), "device": str(device),
            "missing": MISSING_PACKAGE, "task_source": TASK_SOURCE, "input_names": list(NAMES[:6]),
            "timing_source": Path(nvfp4lib.bench.timing.__file__).read_text()}))
        request_end, self._requests = os.pipe()
        self._answers, answer_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-c", _RUNNER, str(request_end), str(answer_end), str(config)],
                pass_fds=(request_end, answer_end), cwd=self.folder / "cwd", stdin=subprocess.DEVNULL,
                start_new_session=True)  # its own process group: killed as a whole
        except BaseException:
            for fd in (self._requests, self._answers):
                os.close(fd)
            self._work.cleanup()
            raise
        finally:
            os.close(request_end)
            os.close(answer_end)

    def __enter__(self) -> SubmissionProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def load(self, path, expression: str | None = None) -> dict:
        """Import the file -> {"ok", "error" or "has_kernel", "needs_cuda", "submission_path", "backend",
        and "value": str(eval(expression)) with the module bound to `submission`}."""
        return self._ask({"kind": "load", "path": str(Path(path).resolve()), "expression": expression},
                         "importing it")

    def call(self, data, reuse: bool = False, timed: bool = False) -> tuple[dict, torch.Tensor | None]:
        """custom_kernel on a copy of `data` (or, with `reuse`, on the previous call's tensors given
        `data`'s values) -> (answer, the float16 output on the CPU when it has the right kind).
        With `timed` the call is timed there as the leaderboard times it: answer["us"]."""
        inputs, output = self.folder / "inputs.pt", self.folder / "output.pt"
        torch.save(tuple(data), inputs)
        try:
            answer = self._ask({"kind": "call", "inputs": str(inputs), "output": str(output), "reuse": reuse,
                                "timed": timed}, "the call")
        finally:
            inputs.unlink(missing_ok=True)
        us = answer.get("us")
        if timed and answer["ok"] and (type(us) not in (int, float) or not 0 <= us < math.inf):
            self._end(f"the timed call: its process sent back no time ({us!r})")
        if not answer["ok"] or answer.get("problem"):
            return answer, None
        try:
            out = torch.load(output, map_location="cpu", weights_only=True)
            output.unlink()
            if type(out) is not torch.Tensor or out.dtype != torch.float16 or out.shape != data[-1].shape:
                raise ValueError(f"{type(out).__name__} instead of the output")
        except Exception as err:  # noqa: BLE001 - any unreadable answer is the submission's doing
            self._end(f"the call: its process sent back an unreadable output ({err})")
        return answer, out

    def time(self, rule: StoppingRule) -> dict:
        """Leaderboard time (bench.leaderboard_time) of custom_kernel on the last call's tensors, until
        `rule` says stop -> {"ok", "error" or "timing"}."""
        return self._ask({"kind": "time", "rule": dataclasses.asdict(rule)}, "the timed calls", calls=rule.max_calls)

    def _ask(self, request: dict, doing: str, calls: int = 1) -> dict:
        if self.ended:
            raise SubmissionProcessEnded(self.ended)
        if not self._ready:  # Python and torch starting up: not the submission's time
            self._answer("starting the process", self.deadline - time.monotonic(), self._overall_limit())
            self._ready = True
        left = self.deadline - time.monotonic()
        allowance = min(self.timeout * calls, left)
        limit = f"--timeout {self.timeout:g} s per call" if allowance < left else self._overall_limit()
        try:
            if allowance > 0:
                os.write(self._requests, (json.dumps(request) + "\n").encode())
        except OSError:
            self._end(f"{doing} was not started: the process had ended ({self._wait_status(_STOP_GRACE_S)})")
        return self._answer(doing, allowance, limit)

    def _overall_limit(self) -> str:
        return f"what was left of --time-limit {self.time_limit:g} s for the whole evaluation"

    def _answer(self, doing: str, allowance: float, limit: str) -> dict:
        """The next answer line, within `allowance` seconds (`limit` says where that came from)."""
        if allowance <= 0:
            self._end(f"{doing}: not started, the evaluation reached --time-limit {self.time_limit:g} s")
        end = time.monotonic() + allowance
        while b"\n" not in self._buffer:
            wait = end - time.monotonic()
            if wait <= 0 or not select.select([self._answers], [], [], wait)[0]:
                self._end(f"{doing} did not finish within {allowance:.3g} s ({limit}); the process was killed")
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                self._end(f"{doing} ended the process ({self._wait_status(_STOP_GRACE_S)}) without an answer")
            self._buffer += chunk
            if len(self._buffer) > _MAX_ANSWER_BYTES:
                self._end(f"{doing}: the process sent more than {_MAX_ANSWER_BYTES} bytes without an answer")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
            if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
                raise ValueError("not an answer")
        except ValueError as err:
            self._end(f"{doing}: the process sent an unreadable answer ({err})")
        return answer

    def _waitid(self):
        """The process's exit, without reaping it (its id stays reserved for killpg), or None if it runs."""
        return os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)

    def _wait_status(self, wait_s: float) -> str:
        end = time.monotonic() + wait_s
        while (info := self._waitid()) is None:
            if time.monotonic() > end:
                return "it closed its answer pipe"
            time.sleep(0.01)
        return _exit_status(info)

    def _kill(self) -> None:
        if self._proc.returncode is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()

    def _end(self, message: str):
        self._kill()
        self.ended = message
        raise SubmissionProcessEnded(message)

    def close(self) -> None:
        """Ask the process to stop (its exit handlers run, briefly), then kill it and what it started."""
        if not self.ended and self._proc.returncode is None:
            try:
                os.write(self._requests, b'{"kind": "stop"}\n')
                self._wait_status(min(self.timeout, _STOP_GRACE_S))
            except OSError:
                pass
        self._kill()
        for fd in (self._requests, self._answers):
            os.close(fd)
        self._work.cleanup()


def _device() -> torch.device:
    return torch.device("cuda" if capabilities().cuda else "cpu")


def import_isolated(paths, expression: str = "submission.custom_kernel.__name__", timeout: float = TIME_LIMIT_S):
    """Import each file in the kind of process `evaluate` runs submissions in (nvfp4lib out of
    reach; one process for all the files while none ends it) and evaluate `expression` there with
    the module bound to `submission` -> {path: (ok, value or error)}. `timeout` bounds the whole run."""
    paths = [str(Path(p).resolve()) for p in paths]
    deadline = time.monotonic() + timeout
    results, process = {}, None
    try:
        for path in paths:
            try:
                read_submission(path)
                if process is None or process.ended:
                    if process is not None:
                        process.close()
                    process = SubmissionProcess(_device(), timeout, deadline, timeout)
                answer = process.load(path, expression)
                results[path] = (True, answer["value"]) if answer["ok"] else (False, answer["error"])
            except (SubmissionError, SubmissionProcessEnded) as err:
                results[path] = (False, str(err))
    finally:
        if process is not None:
            process.close()
    return results


# ---------------------------------------------------------------------------------------------
# Test mode


@dataclass
class CaseResult:
    shape: Shape
    case: str
    ok: bool
    message: str

    def line(self) -> str:
        first = self.message.splitlines()[0] if self.message else ""
        return f"{'PASS' if self.ok else 'FAIL'}  {_shape(self.shape):<13} {self.case:<25} {first}"


def _shape(shape: Shape) -> str:
    return "x".join(map(str, shape))


def run_case(process: SubmissionProcess, data, shape: Shape, case: str, earlier=(), reuse: bool = False):
    """One call on poisoned output, checked against the reference from `data` (which the submission
    never sees: it gets a copy) -> (CaseResult, output copy or None).

    `earlier` are correct outputs of earlier calls on other inputs: a wrong output equal to one
    of them is reported as stale (a result cached across calls)."""
    *_, c = data
    poison_(c)
    try:
        answer, out = process.call(data, reuse)
    except SubmissionProcessEnded as err:
        return CaseResult(shape, case, False, str(err)), None
    return judge(answer, out, data, shape, case, earlier)


def judge(answer: dict, out: torch.Tensor | None, data, shape: Shape, case: str, earlier=()):
    """The verdict on one call's answer and output (`SubmissionProcess.call`) for the input `data`
    -> (CaseResult, output copy or None); `earlier` as for `run_case`."""
    if not answer["ok"] or answer["problem"]:
        return CaseResult(shape, case, False, answer.get("error") or answer["problem"]), None
    result = check(out, data, rtol=RTOL, atol=ATOL)
    copy = out.float()
    changed = answer["changed"]
    if changed:
        why = (f"changed its input{'s' if len(changed) > 1 else ''} {', '.join(changed)} in place (inputs are "
               f"read-only: the leaderboard hands the kernel a copy and checks against the original)"
               + ("" if result.ok else "; the result is wrong too"))
        return CaseResult(shape, case, False, f"{why}\n{result.message}"), copy
    if result.ok:
        return CaseResult(shape, case, True, result.message), copy
    n_nan = int(torch.isnan(copy).sum())
    if n_nan:
        why = (f"unwritten output: {n_nan} of {copy.numel()} elements still hold the NaN that c was "
               f"filled with before the call")
    elif any(e.shape == copy.shape and torch.equal(e, copy) for e in earlier):
        why = ("stale result: the output is an earlier call's, although the inputs are new "
               "(results must not be cached across calls)")
    else:
        why = "wrong result"
    return CaseResult(shape, case, False, f"{why}\n{result.message}"), copy


def data_seed(seed: int, secret_seed: int | None = None) -> int:
    """The seed an input is generated with: `seed`, with the secret seed (if any) mixed in as the
    leaderboard mixes it (harness.combine_seed)."""
    return seed if secret_seed is None else combine_seed(seed, secret_seed)


def seed_of_test(seed: int, shape_index: int, case_index: int) -> int:
    """The public seed of test case `case_index` (of CASES) at shape `shape_index`."""
    return 1000 * seed + 10 * shape_index + case_index


def seed_of_benchmark(seed: int, shape_index: int) -> int:
    """The public seed of the benchmark shape `shape_index` (its checked call; ranked mode advances it)."""
    return 1000 * seed + 500 + shape_index


def check_secret_seed(secret_seed, seed: int, n_test_shapes: int = len(TEST_SHAPES), ranked_calls: int = 0) -> int:
    """`secret_seed` if, mixed into every seed of an evaluation with `seed` (its tests over
    `n_test_shapes` shapes, its ranked mode advancing a seed `ranked_calls` times), it keeps them
    all valid generator seeds (<= 2**64 - 1); else a ValueError naming the largest that does."""
    secret_seed = check_integer("secret_seed", secret_seed, 0)
    largest = max(seed_of_test(seed, n_test_shapes - 1, len(CASES) - 1),
                  seed_of_benchmark(seed, len(BENCHMARK_SHAPES) - 1))
    room = harness.MAX_SEED - RANKED_SEED_STEP * ranked_calls - largest  # for total (total + 1) / 2
    most = (math.isqrt(8 * room + 1) - 1) // 2 - largest  # total = largest + secret
    if secret_seed > most:
        expected = f"an integer from 0 to {most}" if most >= 0 else "none at all (use a smaller --seed)"
        raise ValueError(f"secret_seed: expected {expected}: mixed into the seeds of --seed {seed} a larger one "
                         f"passes 2**64 - 1, the largest generator seed; got {secret_seed}")
    return secret_seed


def run_tests(process: SubmissionProcess, shapes, device, seed: int = 0, log: Callable[[str], None] | None = None, *,
              secret_seed: int | None = None):
    """The four CASES per shape; returns their CaseResults (stops where the process ends)."""
    results = []
    for i, shape in enumerate(shapes):
        earlier = []
        for offset, case in enumerate(CASES):
            # full range, but unsigned scales: NVFP4's scales are UE4M3 (never negative in the
            # leaderboard's data), and cuBLAS's FP4 GEMM reads them so
            data = generate_input(*shape, seed=data_seed(seed_of_test(seed, i, offset), secret_seed), device=device,
                                  mode="leaderboard" if case == CASES[0] else "full", negative_scales=False)
            result, output = run_case(process, data, shape, case, earlier, reuse=case == CASES[2])
            earlier += [output] if result.ok else []  # returned again for new inputs, it was cached
            results.append(result)
            if log:
                log(result.line())
            if process.ended:
                return results
    return results


# ---------------------------------------------------------------------------------------------
# Benchmark and ranked modes

CHECK_CASES = {"benchmark": "benchmark data", "ranked": "ranked data"}  # the obligatory check of a shape
TIMED_CASES = {"benchmark": "timed calls", "ranked": "ranked timed calls"}  # its timed calls, when they fail


@dataclass
class BenchResult:
    """One benchmark shape's leaderboard time. The leaderboard's figure is the mean,
    `timing.mean_us` (with std_us, err_us, best_us, worst_us); bandwidth and percentages follow it."""
    shape: Shape
    timing: Timing
    bandwidth_gbps: float
    percent_of_copy: float
    percent_of_b200_sol: float | None  # B200 speed-of-light time as a % of this time (B200 only)
    checked: int = 0  # timed results checked against the reference: every one in ranked mode, none in benchmark mode


def is_b200() -> bool:
    caps = capabilities()
    return caps.cuda and "B200" in caps.name


def stopping_rules(mode: str, reps: int | None = None, warmup: int | None = None):
    """The leaderboard's rules of `mode` (harness.MODES) -> (rule, warm-up rule or None). `reps`
    caps the timed calls per shape, `warmup` the calls of the warm-up benchmark (0: no warm-up)."""
    rules = harness.MODES[mode]
    rule = rules.rule if reps is None else dataclasses.replace(rules.rule, max_calls=reps)
    if warmup == 0:
        return rule, None
    return rule, rules.warmup_rule if warmup is None else dataclasses.replace(rules.warmup_rule, max_calls=warmup)


def _timed_in_process(process: SubmissionProcess, rule: StoppingRule) -> dict:
    """Benchmark mode's timed calls, made and timed in the submission's process -> its answer."""
    try:
        return process.time(rule)
    except SubmissionProcessEnded as err:
        return {"ok": False, "error": str(err)}


def _ranked_calls(process: SubmissionProcess, shape: Shape, seed: int, device, rule: StoppingRule, first_output):
    """Ranked mode's timed calls at one shape -> (Timing or None, CaseResult of a failure or None,
    results checked).

    Before every call a new input with the seed advanced by RANKED_SEED_STEP is made here and its c
    poisoned; the submission's process gets it (untimed) and times the call on a copy
    (bench.time_one_call); its result is judged here against the untouched input, as in test mode.
    `first_output` is the checked call's output, to name a result cached from it as stale."""
    current = {"seed": seed, "calls": 0}
    earlier = [first_output]  # the previous call's correct output: returned for a new input, it was cached

    def new_input():
        current["seed"] += RANKED_SEED_STEP
        current["data"] = generate_input(*shape, seed=current["seed"], mode="leaderboard", device=device)
        poison_(current["data"].c)

    def timed_there(call):
        answer, output = call()
        return (answer, output), answer.get("us")

    def check_result(called):
        answer, output = called
        current["calls"] += 1
        result, copy = judge(answer, output, current["data"], shape, TIMED_CASES["ranked"], earlier)
        if not result.ok:
            raise CheckFailed(f"timed call {current['calls']} (seed {current['seed']}): {result.message}")
        earlier[:] = [copy]

    try:
        timing = leaderboard_time(lambda: process.call(current["data"], timed=True), rule, before=new_input,
                                  after=check_result, time_call=timed_there)
    except (CheckFailed, SubmissionProcessEnded) as err:
        return None, CaseResult(shape, TIMED_CASES["ranked"], False, str(err)), current["calls"]
    return timing, None, current["calls"]


def run_benchmarks(process: SubmissionProcess, shapes, device, copy_gbps: float, *, mode: str = "benchmark",
                   seed: int = 0, secret_seed: int | None = None, rule: StoppingRule | None = None,
                   warmup_rule: StoppingRule | None = None, log: Callable[[str], None] | None = None):
    """The leaderboard's benchmark or ranked `mode` with the submission in `process` ->
    (BenchResults, CaseResults).

    First a warm-up benchmark of the first shape under `warmup_rule` (benchmark mode's calls, not
    reported; None: no warm-up), then per shape one checked call on a new input and leaderboard
    time under `rule` (default: the mode's, harness.MODES). Benchmark mode times custom_kernel on
    that input again and again in its process; ranked mode gives it a new input before every call
    and checks every result (`_ranked_calls`), and its first failing shape ends the run."""
    if mode not in TIMED_PHASES:
        raise ValueError(f"mode: expected one of {TIMED_PHASES}, got {mode!r}")
    ranked = harness.MODES[mode].ranked
    rule = harness.MODES[mode].rule if rule is None else rule
    say = log or (lambda line: None)
    rows, checks = [], []
    b200 = is_b200()
    if warmup_rule is not None and shapes:
        data = generate_input(*shapes[0], seed=data_seed(seed_of_benchmark(seed, 0), secret_seed), mode="leaderboard",
                              device=device)
        warm, _ = run_case(process, data, shapes[0], "warm-up")
        answer = _timed_in_process(process, warmup_rule) if warm.ok else {"ok": False, "error": warm.message}
        say(f"warm-up benchmark at {_shape(shapes[0])}: "
            + (f"{Timing(**answer['timing']).n} calls (not reported)" if answer["ok"] else "failed (the run says how)"))
    for i, shape in enumerate(shapes):
        shape_seed = data_seed(seed_of_benchmark(seed, i), secret_seed)
        data = generate_input(*shape, seed=shape_seed, mode="leaderboard", device=device)
        result, output = run_case(process, data, shape, CHECK_CASES[mode])
        timing, checked = None, 0
        if result.ok and ranked:
            timing, failure, checked = _ranked_calls(process, shape, shape_seed, device, rule, output)
            result = failure or result
        elif result.ok:
            answer = _timed_in_process(process, rule)
            if answer["ok"]:
                timing = Timing(**answer["timing"])
            else:
                result = CaseResult(shape, TIMED_CASES[mode], False, answer["error"])
        checks.append(result)
        say(result.line())
        if timing is not None:
            bw = gbps(bytes_moved(shape), timing.mean_us)
            sol = B200_SPEED_OF_LIGHT_US.get(shape)
            rows.append(BenchResult(shape, timing, bw, percent(bw, copy_gbps),
                                    percent(sol, timing.mean_us) if b200 and sol else None, checked))
        if process.ended or (ranked and not result.ok):
            break
    return rows, checks


@functools.cache
def _copy_bandwidth_gbps() -> float:
    """The ceiling, measured once per process (evaluating several files need not re-measure it)."""
    return copy_bandwidth_gbps()


def format_bench_table(rows: list[BenchResult]) -> str:
    """Per shape the leaderboard time (its mean, as the leaderboard reports it, with the standard
    error, std, best and worst), the timed calls, the bandwidth at the mean, % of copy bandwidth and
    (on a B200) % of speed of light; geomeans last."""
    show_sol = any(r.percent_of_b200_sol is not None for r in rows)
    header = (["shape", "leaderboard time (mean) us", "+- err", "std", "best", "worst", "calls", "GB/s", "% copy BW"]
              + (["% B200 SOL"] if show_sol else []))
    body = []
    for r in rows:
        t = r.timing
        cells = [_shape(r.shape), f"{t.mean_us:.2f}", f"{t.err_us:.2f}", f"{t.std_us:.2f}", f"{t.best_us:.2f}",
                 f"{t.worst_us:.2f}", str(t.n), f"{r.bandwidth_gbps:.0f}", f"{r.percent_of_copy:.1f}"]
        body.append(cells + ([f"{r.percent_of_b200_sol:.1f}"] if show_sol else []))
    if rows:
        cells = ["geomean", f"{geomean(r.timing.mean_us for r in rows):.2f}", "", "", "", "", "",
                 f"{geomean(r.bandwidth_gbps for r in rows):.0f}", f"{geomean(r.percent_of_copy for r in rows):.1f}"]
        body.append(cells + ([f"{geomean(r.percent_of_b200_sol for r in rows):.1f}"] if show_sol else []))
    lines = text_table(header, body, left=1).split("\n")
    if rows:
        lines.insert(len(lines) - 1, lines[1])  # a rule above the geomean row
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Every mode, as one report


@dataclass
class Report:
    file: Path
    mode: str
    device: str
    submission_path: str | None = None
    backend: str | None = None
    cases: list[CaseResult] = field(default_factory=list)
    bench: list[BenchResult] = field(default_factory=list)   # benchmark mode
    ranked: list[BenchResult] = field(default_factory=list)  # ranked mode
    copy_gbps: float | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def geomean_us(self) -> float | None:
        """Geomean over the shapes of benchmark mode's leaderboard time (the mean of each)."""
        return geomean(r.timing.mean_us for r in self.bench) if self.bench else None

    @property
    def ranked_geomean_us(self) -> float | None:
        """Geomean over the shapes of ranked mode's leaderboard time: what the leaderboard ranks by."""
        return geomean(r.timing.mean_us for r in self.ranked) if self.ranked else None

    def summary(self) -> str:
        if self.skipped:
            return f"SKIPPED: {self.skipped}"
        if self.failures:
            lines = [f"FAILED: {len(self.failures)} problem(s) in {self.file}"]
            for i, failure in enumerate(self.failures):
                text = failure if i < _DETAILED_FAILURES else failure.splitlines()[0]
                lines.append("  - " + text.replace("\n", "\n    "))
            return "\n".join(lines)
        timed = [f"{name} {us:.2f} us" for name, us in (("benchmark", self.geomean_us),
                                                         ("ranked", self.ranked_geomean_us)) if us is not None]
        checked = sum(r.checked for r in self.ranked)
        return (f"PASSED: {sum(c.ok for c in self.cases)} checks"
                + (f" and {checked} ranked results" if checked else "")
                + (f"; leaderboard time (mean), geomean: {', '.join(timed)}" if timed else ""))


def check_seconds(name: str, value) -> float:
    """`value` if it is a positive, finite number of seconds, else a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}")
    return float(value)


def _load(process: SubmissionProcess, path, report: Report, cuda: bool, say: Callable[[str], None]) -> bool:
    """Import the file in `process`; False (with the failure or the skip in `report`) if no call can follow."""
    try:
        answer = process.load(path)
    except SubmissionProcessEnded as err:
        report.failures.append(f"{path}: {err}")
        return False
    if not answer["ok"]:
        report.failures.append(f"{path}: importing it {answer['error']}")
        return False
    if not answer["has_kernel"]:
        report.failures.append(f"{path}: defines no function custom_kernel(data)")
        return False
    report.submission_path = answer["submission_path"]
    if answer["backend"] and report.backend is None:
        report.backend = answer["backend"]
        say(f"backend: {report.backend}")
    if answer["needs_cuda"] and not cuda:
        report.skipped = (f"{report.submission_path or Path(path).name} needs a CUDA GPU: the file imports "
                          f"here, but no check can run without one")
        return False
    return True


def evaluate(path, mode: str = "both", *, seed: int = 0, secret_seed: int | None = None, shapes=None,
             all_shapes: bool = False, warmup: int | None = None, reps: int | None = None,
             timeout: float = CALL_TIMEOUT_S, time_limit: float = TIME_LIMIT_S,
             log: Callable[[str], None] | None = None) -> Report:
    """Run the local leaderboard on one file; `log` (e.g. print) sees each line as it happens.

    `mode` is one of MODES (see the module's docstring). `shapes` overrides the test shapes;
    without CUDA the default is CPU_TEST_SHAPES unless `all_shapes`. `secret_seed` is mixed into
    every seed (`data_seed`). The timed modes follow the leaderboard's stopping rules; `reps` caps
    the timed calls per shape and `warmup` the calls of the warm-up benchmark (0: none). `timeout`
    bounds each call of the submission (its import counts as one) and `time_limit` the whole
    evaluation, in seconds. Nothing raises for a bad submission: problems end up in
    `Report.failures` (bad arguments raise ValueError).
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    seed = check_integer("seed", seed, 0, MAX_SEED)
    warmup = None if warmup is None else check_integer("warmup", warmup, 0)
    reps = None if reps is None else check_integer("reps", reps, 1)
    timeout, time_limit = check_seconds("timeout", timeout), check_seconds("time_limit", time_limit)
    caps = capabilities()
    if shapes is None:
        shapes = TEST_SHAPES if caps.cuda or all_shapes else CPU_TEST_SHAPES
    phases = list(PHASES[mode])
    if secret_seed is not None:
        ranked_calls = stopping_rules("ranked", reps)[0].max_calls if "ranked" in phases else 0
        secret_seed = check_secret_seed(secret_seed, seed, len(shapes), ranked_calls)
    deadline = time.monotonic() + time_limit
    say = log or (lambda line: None)
    device = torch.device("cuda" if caps.cuda else "cpu")
    report = Report(Path(path), mode, caps.summary())
    say(f"local leaderboard: {path} ({mode}) on {caps.summary()}"
        + ("; a secret seed is mixed into every seed" if secret_seed is not None else ""))
    try:
        source = read_submission(path)
    except SubmissionError as err:
        report.failures.append(str(err))
        say(report.summary())
        return report
    if not has_directive(source):
        report.failures.append(f"{path}: the leading comment lines lack the directive line {DIRECTIVE!r}")

    timed = [phase for phase in phases if phase in TIMED_PHASES]
    if timed and not caps.cuda:
        report.notes.append(f"timing needs a CUDA GPU: {' and '.join(timed)} skipped")
        say(report.notes[-1])
        phases = [phase for phase in phases if phase not in TIMED_PHASES] or ["import"]  # still checks the import
    for phase in phases:  # a fresh process per mode, as on the leaderboard
        with SubmissionProcess(device, timeout, deadline, time_limit) as process:
            if not _load(process, path, report, caps.cuda, say):
                break
            if phase == "test":
                if not caps.cuda and not all_shapes and list(shapes) == CPU_TEST_SHAPES:
                    report.notes.append(f"no CUDA: test shapes limited to M*K*L <= {CPU_MAX_ELEMENTS} "
                                        f"({len(CPU_TEST_SHAPES)} of {len(TEST_SHAPES)})")
                    say(report.notes[-1])
                report.cases += run_tests(process, shapes, device, seed, log, secret_seed=secret_seed)
            elif phase in TIMED_PHASES:
                if report.copy_gbps is None:
                    report.copy_gbps = _copy_bandwidth_gbps()
                    say(f"device copy bandwidth: {report.copy_gbps:.0f} GB/s (read + write)")
                rule, warmup_rule = stopping_rules(phase, reps, warmup)
                say(f"{phase} mode: " + ("a new input before every timed call, every result checked"
                                         if harness.MODES[phase].ranked else "one input, timed calls unchecked"))
                rows, checks = run_benchmarks(process, BENCHMARK_SHAPES, device, report.copy_gbps, mode=phase,
                                              seed=seed, secret_seed=secret_seed, rule=rule, warmup_rule=warmup_rule,
                                              log=log)
                if phase == "ranked":
                    report.ranked = rows
                else:
                    report.bench = rows
                report.cases += checks
                if rows:
                    say(format_bench_table(rows))
            if process.ended:
                break
    report.failures += [f"{_shape(c.shape)}, {c.case}: {c.message}" for c in report.cases if not c.ok]
    say(report.summary())
    return report


# ---------------------------------------------------------------------------------------------
# The command line

_ISOLATION = f"""\
What is isolated: the file runs in its own Python process (a fresh one per mode, in an empty
working folder) where {PACKAGE} cannot be imported (by any import route) or read (opening a file
in the package folder is refused); this process makes the inputs, hands the kernel a copy of
them, and checks the output against the untouched original. Every way a submission can fail
ends in a FAIL line and exit code 1: an exception, sys.exit or os._exit at import or in a call, a
crash or signal, a call longer than --timeout (the process is then killed), an evaluation longer
than --time-limit, an output of the wrong type, subclass, layout, device, dtype or shape, wrong or
unwritten or stale values, and a changed input (a, b, sfa, sfb, sfa_permuted, sfb_permuted are
read-only: the leaderboard would only check against an untouched copy, so a kernel that writes
to them might pass there, but it relies on that copy, and fails here). A file that is missing,
unreadable, not UTF-8 or not a .py file fails without running.

What is NOT isolated: this is not a sandbox. The submission can read and write other files,
use the network, and start other processes (which can import {PACKAGE}); it runs with your
permissions. Evaluate only code you would run yourself.

Exit code: 0 for PASSED only; 1 for FAILED, 2 for bad arguments, 3 for SKIPPED (a file that
declares NEEDS_CUDA, on a machine without one: no verdict), 130 when interrupted."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad arguments end in one FAILED line (after the usage) and exit code 2."""
        self.print_usage(sys.stderr)
        self.exit(2, f"FAILED: {message}\n")


def _cli(check, convert=float):
    """An argparse type from a checker that raises ValueError with the message to show."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = text
        try:
            return check(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).partition(": ")[2]) from err
    return parse


def main(argv=None) -> int:
    parser = _Parser(prog=f"python -m {PACKAGE}.evaluate", epilog=_ISOLATION,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="Check (and on a GPU, time) a one-file leaderboard submission.")
    parser.add_argument("file", help="the submission file, e.g. submission.py")
    parser.add_argument("--mode", choices=MODES, default="both",
                        help="test; benchmark (one input, timed calls unchecked); ranked (the leaderboard's "
                             "'leaderboard' mode: a new input before every timed call, every result checked); "
                             "both = test and benchmark (default); all = test, benchmark and ranked")
    parser.add_argument("--seed", type=_cli(lambda v: check_integer("seed", v, 0, MAX_SEED), int), default=0,
                        help=f"seed of the generated inputs, 0 to {MAX_SEED} (default 0)")
    parser.add_argument("--secret-seed", type=_cli(lambda v: check_integer("secret_seed", v, 0), int), metavar="N",
                        help="mixed into every seed as the leaderboard mixes its secret seed (default: none)")
    parser.add_argument("--reps", type=_cli(lambda v: check_integer("reps", v, 1), int),
                        help="at most this many timed calls per benchmark shape (default: the leaderboard's "
                             f"stopping rule alone decides, at most {harness.MODES['benchmark'].rule.max_calls} in "
                             f"benchmark and {harness.MODES['ranked'].rule.max_calls} in ranked mode)")
    parser.add_argument("--all-shapes", action="store_true", help="all test shapes even without CUDA (slow)")
    parser.add_argument("--timeout", type=_cli(lambda v: check_seconds("timeout", v)), default=CALL_TIMEOUT_S,
                        metavar="SECONDS", help=f"limit per call of the submission, its import counting as one; "
                                            f"the process is killed on expiry (default {CALL_TIMEOUT_S:g})")
    parser.add_argument("--time-limit", type=_cli(lambda v: check_seconds("time_limit", v)), default=TIME_LIMIT_S,
                        metavar="SECONDS", help=f"limit for the whole evaluation (default {TIME_LIMIT_S:g})")
    args = parser.parse_args(argv)
    if args.secret_seed is not None:
        ranked_calls = stopping_rules("ranked", args.reps)[0].max_calls if "ranked" in PHASES[args.mode] else 0
        try:
            check_secret_seed(args.secret_seed, args.seed, len(TEST_SHAPES), ranked_calls)
        except ValueError as err:
            parser.error(f"argument --secret-seed: {str(err).partition(': ')[2]}")
    try:
        report = evaluate(args.file, args.mode, seed=args.seed, secret_seed=args.secret_seed,
                          all_shapes=args.all_shapes, reps=args.reps, timeout=args.timeout,
                          time_limit=args.time_limit, log=print)
    except KeyboardInterrupt:
        print("FAILED: interrupted")
        return 130
    return 3 if report.skipped else (0 if report.ok else 1)


if __name__ == "__main__":
    sys.exit(main())
