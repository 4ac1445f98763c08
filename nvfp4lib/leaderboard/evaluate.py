"""A local leaderboard: check and time a one-file submission the way the leaderboard does.

``python -m nvfp4lib.leaderboard.evaluate submission.py [--mode test|benchmark|ranked|both|all]
[--seed N] [--secret-seed N] [--reps N] [--all-shapes] [--timeout S] [--time-limit S] [--show-output]``

The command line of nvfp4lib.leaderboard.modes.evaluate (see there for the modes; `--help` for
what is isolated and the exit codes). The submission runs in a process of its own, started fresh
for each mode (nvfp4lib.leaderboard.child, managed by nvfp4lib.leaderboard.process); this process
makes the inputs and judges every answer (nvfp4lib.leaderboard.judge). The verdict is the last
line, printed once every process the submission started has ended: PASSED only when every check
of the mode ran here and passed (nvfp4lib.leaderboard.report).

The names the workbook's notebooks and tests import from here are those of the modules above.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

from nvfp4lib.leaderboard.modes import (CALL_TIMEOUT_S, CHECK_CASES, TIME_LIMIT_S, TIMED_CASES, CheckFailed,
                                        evaluate, import_isolated, is_b200, run_benchmarks, run_case, run_tests)
from nvfp4lib.leaderboard.process import (BWRAP_ENV_VAR, OUTPUT_PREFIX, EvaluationInterrupted, SubmissionProcess,
                                          SubmissionProcessEnded)
from nvfp4lib.leaderboard.protocol import (CASES, CPU_MAX_ELEMENTS, CPU_TEST_SHAPES, MAX_GENERATOR_SEED, MAX_SECONDS,
                                           MAX_SEED_OPTION, MODES, PHASES, RANKED_SEED_STEP, TIMED, TIMED_PHASES,
                                           BadArgument, check_integer, check_seconds, check_secret_seed,
                                           combine_seed, data_seed, seed_of_benchmark, seed_of_test, stopping_rules)
from nvfp4lib.leaderboard.report import (EXIT_CODES, EXIT_FAILED, EXIT_USAGE, BenchResult, CaseResult, Report,
                                         format_bench_table, shown_path)
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, PACKAGE, SubmissionError, read_submission
from nvfp4lib.messages import describe_error
from nvfp4lib.problem import TEST_SHAPES

__all__ = ["BadArgument", "BenchResult", "CALL_TIMEOUT_S", "CASES", "CHECK_CASES", "CPU_MAX_ELEMENTS",
           "CPU_TEST_SHAPES", "CaseResult", "CheckFailed", "DIRECTIVE", "EvaluationInterrupted", "MAX_GENERATOR_SEED",
           "MAX_SECONDS", "MAX_SEED_OPTION", "MODES", "PHASES", "RANKED_SEED_STEP", "Report", "SubmissionError",
           "SubmissionProcess", "SubmissionProcessEnded", "TIMED", "TIMED_CASES", "TIMED_PHASES", "TIME_LIMIT_S",
           "check_integer", "check_seconds", "check_secret_seed", "combine_seed", "data_seed", "evaluate",
           "format_bench_table", "import_isolated", "is_b200", "main", "read_submission", "run_benchmarks", "run_case",
           "run_tests", "seed_of_benchmark", "seed_of_test", "stopping_rules"]

ISOLATION = f"""\
What is checked: each mode's file runs in a fresh Python process of its own, with its own pipes
for stdout and stderr (shown with --show-output, each line prefixed {OUTPUT_PREFIX.strip()!r}). This
process makes the inputs (the secret seed never leaves it), hands the kernel a copy of them, and
judges what it reads back: the output (its kind, and its values as copied on the caller's stream
right after the call, as the public harness checks them, into memory allocated before the call so
that nothing in between waits for the device; a value that differs in a second copy, made once
the device is idle, is work that stream never waited for, e.g. on a side stream not joined before
the return: a FAIL), and the inputs after the call (their bytes, read here from memory the two
processes share, compared with this process's own copy: a, b, sfa, sfb, sfa_permuted and
sfb_permuted are read-only). Calls are timed with clocks bound to torch's C functions before the
file is imported; a time below the bytes the call moves at the copy bandwidth measured here, or
(benchmark mode) a run that this process's clock says took much longer than its times and the
timing's own cost, is a FAIL. Every answer of the submission's process is checked field by field
before it is used; anything else (garbage, a forgery of the wrong form, too much, too deep, not
UTF-8, out of turn, a closed pipe) is a FAIL that names it. Every wait has a deadline: --timeout
per call (its import counting as one), and --time-limit for the whole evaluation (absolute: its
processes are killed when it is reached). Every way a submission can fail ends in a FAIL: an
exception, sys.exit or os._exit at import or in a call, a crash or signal, an overrun, an output of
the wrong type, subclass, layout, device, dtype or shape or sharing an input's memory, wrong or
unwritten or stale values, changed inputs. A missing file, a folder, a FIFO, a file that is not
UTF-8 or not .py fails without running.

What is closed off: under bubblewrap (`bwrap` on PATH, or {BWRAP_ENV_VAR}=/path/to/bwrap; the
evaluation's first lines say which isolation it ran under) the submission and every process it
starts run in PID and network namespaces of their own, without capabilities, on a read-only view
of the file system (site-packages and {PACKAGE} too) with an empty /tmp of their own, no /run, and
{PACKAGE}'s folders empty: they cannot see, signal, limit or read this process (its command line,
environment and memory), write anything outside their /tmp, or reach the network; orphans are
reaped inside, and all of them end when the submission's process ends (or this one dies), before
the verdict. In any case {PACKAGE} cannot be imported in the submission's process (its folders
are off sys.path, a finder refuses its name, Python's opening of its files is refused). A signal
that would end this process (SIGTERM, SIGHUP, SIGINT, ...) ends the evaluation with a FAILED
verdict instead.

What is NOT isolated: without bubblewrap ({BWRAP_ENV_VAR}=off, or where it cannot run) there is
no sandbox: the guards are Python's own, and the submission's processes can read {PACKAGE}'s files
by other routes (os.open(..., dir_fd=...), ctypes, another program), write to site-packages,
signal, limit or read this process, use the network, and outlive the evaluation by leaving its
session. Even under bubblewrap the submission runs with your user's rights to read: your other
files, other copies of {PACKAGE} (a git checkout's objects, other clones); it can fill the memory
and start processes without bound. Inside its process it can change anything, the evaluator's own
code there too: its times are then held only against the floor and this process's clock, and on
a GPU the inputs' bytes come back through that process. A process the kernel cannot kill yet
(stuck in a driver call) is named, not waited for. Evaluate only code you would run yourself.

{EXIT_CODES}"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad arguments end in one FAILED line (after the usage) and exit code 2."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"FAILED: {message}\n")


def _cli(check, convert=float):
    """An argparse type from a checker of nvfp4lib.leaderboard.protocol (it raises BadArgument)."""
    def parse(text: str):
        try:
            value = convert(text)
        except (ValueError, OverflowError):
            value = text
        try:
            return check(value)
        except BadArgument as err:
            raise argparse.ArgumentTypeError(err.detail) from err
    return parse


def main(argv=None) -> int:
    parser = _Parser(prog=f"python -m {PACKAGE}.leaderboard.evaluate", epilog=ISOLATION,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="Check (and on a GPU, time) a one-file leaderboard submission.")
    parser.add_argument("file", help="the submission file, e.g. submission.py")
    parser.add_argument("--mode", choices=MODES, default="both",
                        help="test; benchmark (one input, timed calls unchecked); ranked (the leaderboard's "
                             "'leaderboard' mode: a new input before every timed call, every result checked); "
                             "both = test and benchmark (default); all = test, benchmark and ranked")
    parser.add_argument("--seed", type=_cli(lambda v: check_integer("seed", v, 0, MAX_SEED_OPTION), int), default=0,
                        help=f"seed of the generated inputs, 0 to {MAX_SEED_OPTION} (default 0)")
    parser.add_argument("--secret-seed", type=_cli(lambda v: check_integer("secret_seed", v, 0), _secret),
                        metavar="N", help="mixed into every seed as the leaderboard mixes its secret seed (default: "
                                          "none); - reads it from stdin, so that it is not on this command line")
    parser.add_argument("--reps", type=_cli(lambda v: check_integer("reps", v, 1, 10**6), int),
                        help="at most this many timed calls per benchmark shape, 1 to 1000000 (default: the "
                             f"leaderboard's stopping rule alone decides, at most {TIMED['benchmark'].rule.max_calls} "
                             f"in benchmark and {TIMED['ranked'].rule.max_calls} in ranked mode)")
    parser.add_argument("--all-shapes", action="store_true",
                        help=f"all {len(TEST_SHAPES)} test shapes even without CUDA (slow; without it a CPU runs "
                             f"{len(CPU_TEST_SHAPES)} and the verdict is at best INCOMPLETE)")
    parser.add_argument("--timeout", type=_cli(lambda v: check_seconds("timeout", v)), default=CALL_TIMEOUT_S,
                        metavar="SECONDS", help=f"limit per call of the submission, its import counting as one; "
                                            f"the process is killed on expiry (default {CALL_TIMEOUT_S:g}, at most "
                                            f"{MAX_SECONDS:.0f})")
    parser.add_argument("--time-limit", type=_cli(lambda v: check_seconds("time_limit", v)), default=TIME_LIMIT_S,
                        metavar="SECONDS", help=f"limit for the whole evaluation (default {TIME_LIMIT_S:g}, at most "
                                            f"{MAX_SECONDS:.0f})")
    parser.add_argument("--show-output", action="store_true",
                        help=f"show what the submission writes to stdout and stderr, each line prefixed "
                             f"{OUTPUT_PREFIX.strip()!r} (always before the verdict)")
    args = parser.parse_args(argv)
    out = _Stdout()
    try:
        report = evaluate(args.file, args.mode, seed=args.seed, secret_seed=args.secret_seed,
                          all_shapes=args.all_shapes, reps=args.reps, timeout=args.timeout,
                          time_limit=args.time_limit, show_output=args.show_output, log=out)
    except BadArgument as err:  # checked by `evaluate` before it starts: --secret-seed's bound depends on the others
        parser.error(f"argument --{err.name.replace('_', '-')}: {err.detail}")
    except Exception as err:  # noqa: BLE001 - a fault of the evaluator itself still ends in one FAILED line
        out(f"FAILED: the evaluator itself failed ({describe_error(err, 500)}); no verdict on {shown_path(args.file)}")
        return EXIT_FAILED
    if out.lost is not None and out.lost.errno != errno.EPIPE:  # a closed pipe (| head) was meant
        print(f"the lines of the evaluation could not be written to stdout ({out.lost.strerror}); exit code "
              f"{report.exit_code} is the verdict's ({report.verdict})", file=sys.stderr)
    return report.exit_code


def _secret(text: str) -> int:
    """--secret-seed's number; "-": the first line of stdin."""
    return int(sys.stdin.readline() if text == "-" else text)


class _Stdout:
    """Each line to stdout at once. Once stdout takes no more (a pipe closed by `| head`, a full
    disk), the evaluation goes on unseen: stdout is pointed at the null device, so nothing is left
    to fail at exit, and `lost` keeps the error."""
    lost: OSError | None = None

    def __call__(self, line: str) -> None:
        if self.lost is None:
            try:
                print(line, flush=True)
            except OSError as err:
                self.lost = err
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
