"""The local leaderboard against files written to fool it: every one ends in a verdict that says what
happened (a FAIL naming it, or no pass where a check could not run), within a bound, with no
traceback, nothing left running and nothing printed after the verdict.

Each file below is evaluated through the real evaluator (its API, or its command line in a
subprocess); the bounds on wall time are generous (a busy 2-core machine) and bound hangs only.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from nvfp4lib.contract import Shape
from nvfp4lib.leaderboard import answers, child
from nvfp4lib.leaderboard.answers import BadAnswer
from nvfp4lib.leaderboard.evaluate import ISOLATION, evaluate, main
from nvfp4lib.leaderboard.judge import judge, output_problem, timed_problem
from nvfp4lib.leaderboard.process import Called, Output, Timed
from nvfp4lib.leaderboard.report import EXIT_CODES, Report, printable
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, SubmissionError, read_submission
from nvfp4lib.locations import PACKAGE_DIR
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import reference_gemv
from tests.leaderboard_helpers import SANDBOXED, kill_marked, marker, needs_bwrap, no_sandbox, running  # noqa: F401

SHAPE = (128, 256, 1)
CPU = not torch.cuda.is_available()
BOUND_S = 180  # wall-clock bound of one evaluation here: only a hang passes it

PROLOGUE = f'''\
{DIRECTIVE}
import torch

VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
TABLES = {{}}  # device -> VALUES there


def table(device):
    """VALUES on `device`, made by the first call there only: a tensor from a Python list is a copy
    from the host, which makes the host wait for the current stream (on a stream still busy, the
    call would return only once its work is done)."""
    if device not in TABLES:
        TABLES[device] = torch.tensor(VALUES, dtype=torch.float64, device=device)
    return TABLES[device]


def decode(packed, scales):
    byte = packed.view(torch.uint8).long()
    values = table(packed.device)[torch.stack((byte & 15, byte >> 4), dim=-1).flatten(-2)]
    return (values.unflatten(-1, (-1, 16)) * scales.float().double().unsqueeze(-1)).flatten(-2)


def gemv(data):
    a, b, sfa, sfb, _, _, c = data
    for l in range(a.shape[2]):
        c[:, 0, l] = (decode(a[:, :, l], sfa[:, :, l]) @ decode(b[0:1, :, l], sfb[0:1, :, l])[0]).half()
    return c


def rehearse(data):
    """gemv into a scratch output: afterwards every kernel gemv launches is loaded, the current
    stream's memory pool holds every block gemv takes and cuBLAS has its workspace for that stream,
    so the next gemv there loads no kernel and allocates no device memory (either can make the host
    wait for the device)."""
    gemv((*data[:6], torch.empty_like(data[6])))
'''


def hostile(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(PROLOGUE + "\n\n" + textwrap.dedent(body).strip() + "\n")
    return path


def run_cli(path: Path, *args: str, timeout: float = BOUND_S):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nvfp4lib.leaderboard.evaluate", str(path), *args],
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def no_traceback(*texts: str) -> bool:
    return not any("Traceback" in t for t in texts)


# ---------------------------------------------------------------------------------------------
# 1. Verdicts mean what they say


def test_exit_codes_and_what_is_not_defended_are_in_the_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for words in ("0 PASSED: every check of the mode ran here and passed", "4 INCOMPLETE", "3 SKIPPED",
                  "128 + N FAILED", "bubblewrap", "PID and network namespaces", "there is no sandbox", "dir_fd",
                  "the floor", "the secret seed never leaves it"):
        assert words in out, words
    assert " ".join(EXIT_CODES.split()) in out


@pytest.mark.skipif(not CPU, reason="the behaviour without CUDA")
def test_benchmark_mode_without_cuda_is_not_a_pass_for_a_kernel_that_returns_zeros(tmp_path):
    path = hostile(tmp_path, "zeros", "def custom_kernel(data):\n    return data[6].zero_()")
    report = evaluate(path, "benchmark")
    assert (report.verdict, report.exit_code) == ("INCOMPLETE", 4)
    assert report.summary() == ("INCOMPLETE: 0 checks passed, but not checked here: benchmark mode (timing needs a "
                                "CUDA GPU) (only the import was checked)")


@pytest.mark.skipif(not CPU, reason="the behaviour without CUDA")
def test_the_default_mode_on_a_cpu_names_the_shapes_it_did_not_check(tmp_path):
    """Right on the shapes a CPU runs, wrong on every other: not PASSED, and the line says why."""
    path = hostile(tmp_path, "wrong_beyond_cpu_shapes", '''
        def custom_kernel(data):
            out = gemv(data)
            return out.neg_() if data[0].shape[0] * data[0].shape[1] * 2 * data[0].shape[2] > 1 << 20 else out
    ''')
    report = evaluate(path)
    assert report.ok and all(c.ok for c in report.cases) and len(report.cases) == 16
    assert report.exit_code == 4 and report.summary() == (
        "INCOMPLETE: 16 checks passed, but not checked here: 5 of the 9 test shapes (without CUDA only those of "
        "M*K*L <= 1048576 run unless --all-shapes); benchmark mode (timing needs a CUDA GPU)")


def test_a_report_passes_only_when_nothing_is_missing_or_wrong():
    report = Report(Path("f.py"), "test", "cpu")
    assert (report.verdict, report.exit_code) == ("PASSED", 0)
    report.unchecked.append("ranked mode (timing needs a CUDA GPU)")
    assert (report.verdict, report.exit_code) == ("INCOMPLETE", 4)
    report.skipped = "needs a CUDA GPU"
    assert (report.verdict, report.exit_code) == ("SKIPPED", 3)
    report.failures.append("wrong result")
    assert (report.verdict, report.exit_code) == ("FAILED", 1)
    report.interrupted = signal.SIGTERM
    assert report.exit_code == 128 + signal.SIGTERM


# ---------------------------------------------------------------------------------------------
# 2. The parent decides: every answer is checked, every fact established here

GOOD_CALL = {"kind": "called", "seq": 3, "us": None, "device": "cpu",
             "output": {"type": "Tensor", "tensor": True, "exact": True, "layout": "torch.strided", "device": "cpu",
                        "dtype": "torch.float16", "shape": [128, 1, 1], "shares": [], "values": True}}


def forged(**changes) -> bytes:
    message = json.loads(json.dumps(GOOD_CALL))
    for key, value in changes.items():
        target, _, field = key.rpartition("__")
        (message[target] if target else message)[field] = value
    return json.dumps(message).encode()


@pytest.mark.parametrize("data, message", [
    (b"hello", "not JSON"),
    (b"\xff\xfe", "not UTF-8 (byte 0xff at offset 0)"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    (b"[]", "a JSON list, expected an object"),
    (b'{"kind": "called", "seq": 3, "us": NaN}', "NaN is not a number JSON allows"),
    (b'{"kind": 7}', "kind: expected 'called' or 'error', got 7"),
    (b'{"kind": "ready"}', "kind: expected 'called' or 'error', got 'ready'"),
    (b'{"kind": "error", "seq": 3}', "no field 'error'"),
    (b'{"kind": "error", "seq": 3, "error": ["x"]}', "error: expected a string of at most 2000 characters"),
    (b'{"kind": "error", "seq": 3, "error": "' + b"x" * 3000 + b'"}', "at most 2000 characters"),
    (b'{"kind": "error", "seq": 3, "error": "x", "extra": 1}', "unexpected field 'extra'"),
    (b'{"kind": "error", "seq": 4, "error": "x"}', "seq: expected 3 (the request it answers), got 4"),
    (b'{"kind": "error", "seq": true, "error": "x"}', "seq: expected an integer"),
    (b'{"kind": "error", "seq": 1' + b"0" * 5000 + b', "error": "x"}', "not JSON"),
    (forged(us=-1.0), "us: expected a number from 0"),
    (forged(us="fast"), "us: expected a number"),
    (forged(us=1e300), "us: expected a number from 0 to 1e+12"),
    (forged(inputs="x"), "unexpected field 'inputs'"),  # what the inputs hold is read in the evaluator
    (forged(output=None), "output: expected an object, got None"),
    (forged(output__values="yes"), "output.values: expected true or false, got 'yes'"),
    (forged(output__shape=[[[[1]]]]), "output.shape[0]: expected an integer"),
    (forged(output__shape=[1] * 17), "output.shape: expected a list of 0 to 16 items"),
    (forged(output__shares=["c"]), "output.shares[0]: expected one of a, b, sfa, sfb, sfa_permuted, sfb_permuted"),
    (forged(output__type={"__class__": "Tensor"}), "output.type: expected a string"),
])
def test_every_malformed_or_forged_answer_is_refused_naming_what_is_wrong(data, message):
    with pytest.raises(BadAnswer, match=None) as refused:
        answers.parse(data, {"called": answers.CALLED, "error": answers.ERROR}, seq=3)
    assert message in str(refused.value), str(refused.value)
    assert answers.parse(forged(), {"called": answers.CALLED, "error": answers.ERROR}, seq=3)["seq"] == 3


@pytest.mark.parametrize("name, act, message", [
    ("garbage", 'os.write(FD, struct.pack("<Q", 5) + b"hello")', "sent an answer that is not one (not JSON"),
    ("deep", 'body = b"[" * 400000 + b"]" * 400000\nos.write(FD, struct.pack("<Q", len(body)) + body)',
     "sent an answer that is not one (JSON nested too deeply to read)"),
    ("huge", 'os.write(FD, struct.pack("<Q", 1 << 40))', "announced an answer of 1099511627776 bytes"),
    ("out_of_turn", 'body = json.dumps({"kind": "error", "seq": 99, "error": "forged"}).encode()\n'
                    'os.write(FD, struct.pack("<Q", len(body)) + body)',
     "seq: expected 3 (the request it answers), got 99"),  # after the timing of calls of nothing, the import
])
def test_a_forged_answer_on_the_answer_pipe_is_a_fail_naming_it(tmp_path, name, act, message):
    """The submission writes its own 'answer' to the evaluator's pipe before the runner can."""
    body = ("import json, os, struct, sys\nFD = int(sys.argv[2])\n\n\ndef custom_kernel(data):\n"
            + textwrap.indent(act, "    ") + "\n    return gemv(data)")
    path = hostile(tmp_path, f"forged_{name}", body)
    started = time.monotonic()
    report = evaluate(path, "test", shapes=[SHAPE])
    assert time.monotonic() - started < BOUND_S
    assert len(report.failures) == 1 and message in report.failures[0], report.failures
    assert report.verdict == "FAILED" and len(report.cases) == 1


def test_inputs_changed_behind_replaced_comparisons_are_found_here(tmp_path):
    """torch's comparisons and the runner's builtins replaced in the submission's process: the bytes
    of the inputs after the call are compared in the evaluator, which nothing there can replace."""
    path = hostile(tmp_path, "changes_inputs_and_hides_it", '''
        import builtins
        import torch

        torch.equal = lambda *args, **kwargs: True
        torch.Tensor.equal = lambda *args, **kwargs: True
        torch.Tensor.__eq__ = lambda *args, **kwargs: True
        torch.allclose = lambda *args, **kwargs: True
        builtins.issubclass = lambda *args: True
        REAL_STORAGE, ORIGINALS = torch.Tensor.untyped_storage, {}

        def lying_storage(self):  # the storage of an untouched copy, for the input it changed
            original = ORIGINALS.get(self.data_ptr())
            return REAL_STORAGE(self if original is None else original)

        torch.Tensor.untyped_storage = lying_storage

        def custom_kernel(data):
            out = gemv(data)
            ORIGINALS[data[0].data_ptr()] = data[0].clone()
            data[0].view(torch.uint8).zero_()        # through a view
            REAL_STORAGE(data[3]).fill_(0)           # through the storage
            return out
    ''')
    report = evaluate(path, "test", shapes=[SHAPE])
    assert len(report.cases) == 4 and not any(c.ok for c in report.cases)
    for case in report.cases:
        assert case.message.startswith("changed its inputs a, sfb in place (inputs are read-only"), case.message


def test_odd_outputs_are_named(tmp_path):
    """An alias of an input, a hostile object, a tensor that requires grad (fine), a copy with other strides (fine)."""
    path = hostile(tmp_path, "odd_outputs", '''
        CALLS = []

        class Hostile:
            def __str__(self):
                raise RuntimeError("no")

            def __getattr__(self, name):
                raise RuntimeError(name)

        def custom_kernel(data):
            CALLS.append(None)
            c = data[6]
            if len(CALLS) == 1:  # float16 values over the bytes of sfa_permuted
                raw = torch.empty(0, dtype=torch.uint8).set_(data[4].untyped_storage())
                return raw[:2 * c.numel()].view(torch.float16).view(c.shape)
            if len(CALLS) == 2:
                return Hostile()
            if len(CALLS) == 3:
                return gemv(data).detach().requires_grad_()
            return gemv(data).contiguous().clone()
    ''')
    report = evaluate(path, "test", shapes=[SHAPE])
    messages = [c.message.splitlines()[0] for c in report.cases]
    assert messages[:2] == ["returned a tensor that shares memory with the input sfa_permuted (expected c or a "
                            "tensor of its own)", "returned Hostile, expected the tensor c"]
    assert [c.ok for c in report.cases] == [False, False, True, True], messages


def test_stream_order_is_judged_from_the_two_copies():
    """The output copied on the caller's stream right after the call differs from the one once the
    device was idle: work that stream never waited for. On a CPU, work after the return."""
    data = generate_input(*SHAPE, seed=1, mode="leaderboard")
    right = reference_gemv(data).half().contiguous()
    late = torch.full_like(right, float("nan"))
    description = {"type": "Tensor", "tensor": True, "exact": True, "layout": "torch.strided", "device": "cuda:0",
                   "dtype": "torch.float16", "shape": list(right.shape), "shares": [], "values": True}
    result, copy = judge(Called(output=Output(description, late, right), device="cuda:0"), data, SHAPE, "x")
    assert not result.ok and copy is None
    assert result.message.startswith("work the caller's stream never waited for: 128 of 128 elements of the output "
                                     "changed after the call returned")
    cpu = dict(description, device="cpu")
    result, _ = judge(Called(output=Output(cpu, late, right), device="cpu"), data, SHAPE, "x")
    assert result.message.startswith("the output changed after the call returned: 128 of 128 elements differ")
    timed = Timed(samples_us=[1.0, 1.0], outputs=[Output(description, right, right), Output(description, late, right)],
                  device="cuda:0")
    assert timed_problem(timed, Shape(*SHAPE), 1e9).startswith("timed call 2: work the caller's stream never waited for")
    assert judge(Called(output=Output(cpu, right, right.clone()), device="cpu"), data, SHAPE, "x")[0].ok
    assert output_problem(dict(cpu, values=False), right.shape, "cpu") == (
        "returned a tensor like c, but its process sent none of its values")


def test_a_late_output_is_judged_late_without_the_reference(monkeypatch):
    """Its values at return are not what the kernel computed: nothing is compared with the reference."""
    import nvfp4lib.leaderboard.judge as judging

    def no_reference(*args, **kwargs):
        raise AssertionError("the reference was computed for an output that was not finished")

    monkeypatch.setattr(judging, "check", no_reference)
    data = generate_input(*SHAPE, seed=1, mode="leaderboard")
    right = reference_gemv(data).half().contiguous()
    late = torch.full_like(right, float("nan"))
    description = {"type": "Tensor", "tensor": True, "exact": True, "layout": "torch.strided", "device": "cuda:0",
                   "dtype": "torch.float16", "shape": list(right.shape), "shares": [], "values": True}
    output = Output(description, late, right)
    result, copy = judge(Called(output=output, device="cuda:0"), data, SHAPE, "x")
    assert (result.ok, result.message, copy) == (False, judging.unordered_work(output, "cuda:0"), None)


# ---------------------------------------------------------------------------------------------
# 3. The work folder, the file, the clock


BREAKS_ITS_FOLDER = '''
    import os, shutil
    here = os.getcwd()
    print(f"FOLDER {{here}}", flush=True)
    for name in ("inputs.pt", "output.pt", "config.json"):
        os.mkfifo(os.path.join(here, name))
    os.chdir("/")
    shutil.rmtree(here)
    os.symlink({outside!r}, here)

    def custom_kernel(data):
        return gemv(data)
'''


def test_the_work_folder_is_the_submissions_own_to_break(tmp_path):
    """FIFOs where the old evaluator kept its files, the folder deleted and replaced by a link to
    somewhere else: nothing of the evaluator's is there, and nothing the link points to is removed.
    In the sandbox all of it happens in the submission's own /tmp."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    report = evaluate(hostile(tmp_path, "breaks_its_folder", BREAKS_ITS_FOLDER.format(outside=str(outside))), "test",
                      shapes=[SHAPE])
    assert report.ok and len(report.cases) == 4 and all(c.ok for c in report.cases), report.summary()
    assert (outside / "keep.txt").read_text() == "kept"
    folder = report.output.split("FOLDER ", 1)[1].split("\n", 1)[0]
    assert SANDBOXED or not os.path.lexists(folder), "the link in place of the work folder was removed"


def test_without_a_sandbox_the_work_folder_is_the_submissions_own_to_break(tmp_path, monkeypatch, no_sandbox):
    """As above without bubblewrap, where the folder is made under tmp_path: where the checkout itself
    lies in the temporary folder, the link could not always be made there."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    test_the_work_folder_is_the_submissions_own_to_break(tmp_path)


def test_a_fifo_or_a_huge_file_as_the_submission_fails_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_submission(fifo)  # a blocking open would wait here for a writer
    assert evaluate(fifo, "test").failures == [f"{fifo}: not a regular file"]
    huge = tmp_path / "huge.py"
    with open(huge, "wb") as file:
        file.truncate(64 << 20)
    with pytest.raises(SubmissionError, match="bytes, more than the 16777216 a submission may have"):
        read_submission(huge)


def test_time_limit_is_absolute_whatever_the_file_does(tmp_path):
    """A call that never returns, SIGTERM ignored, exit handlers that never finish, a generous --timeout."""
    path = hostile(tmp_path, "never_ends", '''
        import atexit, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        atexit.register(time.sleep, 3600)

        def custom_kernel(data):
            while True:
                time.sleep(1)
    ''')
    started = time.monotonic()
    report = evaluate(path, "test", shapes=[SHAPE], timeout=600, time_limit=10)
    took = time.monotonic() - started
    assert took < 10 + 30, took  # the limit, then killing and reaping
    assert len(report.failures) == 1 and report.failures[0].endswith(
        "(what was left of --time-limit 10 s for the whole evaluation); the process was killed"), report.failures


# ---------------------------------------------------------------------------------------------
# 4. Every process the submission starts ends with the evaluation; signals end in a verdict


@needs_bwrap  # without, what leaves the session outlives the evaluation and can write to its stdout (see --help)
def test_what_the_submission_starts_ends_before_the_verdict_and_prints_nothing_after_it(tmp_path):
    """A grandchild in a new session (its parent gone), a process in a session of its own, a fork that
    outlives the call: all hold the submission's pipes, none the evaluator's; all are ended before
    the verdict line, which stays the last line; the evaluation does not wait for them."""
    mark = marker()
    path = hostile(tmp_path, "leaves_processes", f'''
        import os, subprocess, sys, time

        PARENT = os.getppid()

        def write_everywhere(text):
            for target in (1, 2):
                try:
                    os.write(target, text)
                except OSError:
                    pass
            try:
                with open(f"/proc/{{PARENT}}/fd/1", "wb") as out:
                    out.write(text)
            except OSError:
                pass

        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                write_everywhere(b"PASSED: written by a grandchild\\n")
                os.execvp("sh", ["sh", "-c", "sleep 300.{mark}; echo PASSED: written by a grandchild after the verdict"])
            os._exit(0)
        subprocess.Popen(["sleep", "300.{mark}"], start_new_session=True)

        def custom_kernel(data):
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "300.{mark}"])
            return gemv(data)
    ''')
    try:
        proc, took = run_cli(path, "--mode", "test", "--show-output")
    finally:
        kill_marked(mark)
    lines = proc.stdout.splitlines()
    assert proc.returncode == (4 if CPU else 0), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert lines[-1].startswith("INCOMPLETE: 16 checks passed" if CPU else "PASSED")
    assert "[submission] PASSED: written by a grandchild" in lines, "it ran, its lines marked as the submission's"
    assert not any(line.startswith("PASSED: written") for line in lines) and "after the verdict" not in proc.stdout
    assert no_traceback(proc.stdout, proc.stderr)
    assert took < 150, f"the evaluation waited for what the file started ({took:.1f} s)"
    assert not running(mark)


SIGNALS_EVERYONE = '''
    import os, signal

    def custom_kernel(data):
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
            for signum in (signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL) if pid == os.getppid() else ():
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass
        return gemv(data)
'''


@pytest.mark.skipif(not SANDBOXED, reason="needs bubblewrap")
def test_in_the_sandbox_no_signal_of_the_submission_reaches_the_evaluator(tmp_path):
    """SIGTERM, SIGSTOP and SIGKILL to its parent: there, the sandbox's first process, which takes none
    of them; the evaluator is not in its PID namespace. The evaluation ends as for any correct file."""
    proc, _ = run_cli(hostile(tmp_path, "signals_its_parent", SIGNALS_EVERYONE), "--mode", "test")
    assert no_traceback(proc.stdout, proc.stderr)
    assert proc.returncode == (4 if CPU else 0), proc.stdout[-2000:]
    assert proc.stdout.splitlines()[-1].startswith("INCOMPLETE: 16 checks passed" if CPU else "PASSED")


def test_without_a_sandbox_a_signal_from_the_submission_to_the_evaluator_ends_in_a_fail_line(tmp_path):
    """The evaluator turns SIGTERM into a FAILED verdict naming it: a non-zero exit, no traceback."""
    path = hostile(tmp_path, "signals_its_parent", '''
        import os, signal

        def custom_kernel(data):
            os.kill(os.getppid(), signal.SIGTERM)
            return gemv(data)
    ''')
    proc = subprocess.run([sys.executable, "-m", "nvfp4lib.leaderboard.evaluate", str(path), "--mode", "test"],
                          capture_output=True, text=True, timeout=BOUND_S, env=dict(os.environ, NVFP4_BWRAP="off"))
    lines = proc.stdout.splitlines()
    assert no_traceback(proc.stdout, proc.stderr)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout[-2000:]
    assert lines[-2:] == [f"FAILED: 1 problem(s) in {path}",
                          "  - the evaluation was stopped by SIGTERM (sent by the submission's processes or from "
                          "outside); everything the submission started was ended"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_sigterm_to_the_evaluator_ends_the_evaluation_with_a_verdict(tmp_path):
    """From outside: the evaluation stops, the submission's processes are ended, and the report says
    which signal stopped it."""
    mark, started = marker(), threading.Event()
    path = hostile(tmp_path, "hangs_in_a_call", f'''
        import subprocess, time

        def custom_kernel(data):
            subprocess.Popen(["sleep", "300.{mark}"], start_new_session=True)
            print("started", flush=True)
            time.sleep(300)
    ''')

    def send():  # only once the evaluation has its handler (the default one would end pytest)
        if started.wait(120) and signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
            os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Thread(target=send)
    timer.start()
    left = []
    try:
        report = evaluate(path, "test", shapes=[SHAPE], timeout=600, show_output=True,
                          log=lambda line: line.endswith("] started") and started.set())
        timer.join()
        left = running(mark)
    finally:
        kill_marked(mark)
    assert report.interrupted == signal.SIGTERM and report.exit_code == 128 + signal.SIGTERM
    assert report.failures[-1] == ("the evaluation was stopped by SIGTERM (sent by the submission's processes or "
                                   "from outside); everything the submission started was ended")
    assert report.summary().startswith("FAILED: ")
    assert not left or not SANDBOXED, "without a sandbox what left the session outlives it (see --help)"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handler is the default again"


# ---------------------------------------------------------------------------------------------
# 5. Isolation as described; the child program a module of its own


def test_the_help_says_what_holds_without_a_sandbox():
    text = " ".join(ISOLATION.split())
    assert "without bubblewrap (NVFP4_BWRAP=off, or where it cannot run) there is no sandbox" in text
    assert "os.open(..., dir_fd=...)" in text


def test_the_child_program_imports_only_the_standard_library_and_torch():
    """It runs where nvfp4lib cannot be imported: no import of the package, at any depth."""
    import ast

    tree = ast.parse(Path(child.__file__).read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    tops = {n.partition(".")[0] for n in names}
    assert tops - {"torch", "__future__"} <= set(sys.stdlib_module_names), tops
    assert Path(child.__file__).parent == PACKAGE_DIR / "leaderboard"


def test_control_characters_from_the_submission_are_shown_as_escapes():
    assert printable("\x1b[2K\rPASSED\ttab") == "\\x1b[2K\\rPASSED\ttab"


def test_the_package_guard_is_one_for_both_routes():
    err = child.refusal("nvfp4lib.reference", "nvfp4lib", "No module named {name!r}: gone")
    assert isinstance(err, ModuleNotFoundError) and str(err) == "No module named 'nvfp4lib.reference': gone"
    assert child.refusal("nvfp4libx", "nvfp4lib", "{name}") is None


# ---------------------------------------------------------------------------------------------
# 6. Work the caller's stream never waited for (GPU)
#
# The side stream's work must still be running when the call returns: nothing the kernel does
# after enqueuing the sleep may make the host wait for the device (a copy from the host, such as
# a tensor made from a Python list; an allocation of device memory; a kernel's first launch;
# .item(), .cpu() or printing a CUDA tensor), else the call returns only once the work is done and
# the output is rightly finished. So the decode table is made on the caller's stream, and gemv
# rehearsed on the side stream, before the sleep.

SIDE_STREAM = '''
    SIDE = torch.cuda.Stream()

    def custom_kernel(data):
        caller = torch.cuda.current_stream()
        table(data[0].device)
        SIDE.wait_stream(caller)  # the inputs are ready on the side stream
        with torch.cuda.stream(SIDE):
            rehearse(data)
            torch.cuda._sleep(100_000_000)  # tens of milliseconds of other work first
            out = gemv(data)
        {join}
        return out
'''


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["test", "benchmark", "ranked"])
def test_work_on_a_side_stream_the_caller_never_waits_for_fails_every_mode(tmp_path, mode):
    path = hostile(tmp_path, f"side_stream_{mode}", SIDE_STREAM.format(join="pass"))
    report = evaluate(path, mode, shapes=[SHAPE], warmup=2, reps=5)
    assert report.verdict == "FAILED" and not report.bench and not report.ranked, report.summary()
    assert any("work the caller's stream never waited for" in f for f in report.failures), report.failures


@pytest.mark.gpu
def test_work_on_a_side_stream_that_the_caller_waits_for_passes(tmp_path):
    path = hostile(tmp_path, "side_stream_joined", SIDE_STREAM.format(join="caller.wait_stream(SIDE)"))
    report = evaluate(path, "both", shapes=[SHAPE], warmup=2, reps=5)
    assert report.ok and len(report.bench) == 3, report.summary()


@pytest.mark.gpu
def test_a_kernel_that_leaves_another_stream_current_is_still_judged_on_the_callers(tmp_path):
    """Setting its side stream current and leaving it so: the copy after the call is still made on
    the caller's stream, so the unfinished output is caught."""
    path = hostile(tmp_path, "leaves_its_stream_current", '''
        SIDE = torch.cuda.Stream()

        def custom_kernel(data):
            table(data[0].device)
            SIDE.wait_stream(torch.cuda.current_stream())
            torch.cuda.set_stream(SIDE)
            rehearse(data)
            torch.cuda._sleep(100_000_000)
            return gemv(data)
    ''')
    report = evaluate(path, "test", shapes=[SHAPE])
    assert any("work the caller's stream never waited for" in f for f in report.failures), report.failures
