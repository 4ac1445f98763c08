"""What an evaluation found, and its verdict: PASSED only when every check of the mode ran here and
passed; the verdicts and their exit codes are listed in EXIT_CODES (shown by `--help`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nvfp4lib.bench.timing import Timing, geomean, text_table
from nvfp4lib.contract import Shape

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED, EXIT_INCOMPLETE = 0, 1, 2, 3, 4
EXIT_SIGNAL_BASE = 128
EXIT_CODES = f"""\
Exit codes:
  {EXIT_PASSED}        PASSED: every check of the mode ran here and passed
  {EXIT_FAILED}        FAILED: a check failed or the file could not be checked (the lines below say why)
  {EXIT_USAGE}        bad arguments (nothing was evaluated)
  {EXIT_SKIPPED}        SKIPPED: the file declares NEEDS_CUDA and there is no CUDA here (nothing was checked)
  {EXIT_INCOMPLETE}        INCOMPLETE: every check that ran passed, but the mode could not be checked in full
           here (no CUDA for the timed modes, fewer test shapes); the line says what was not checked
  128 + N  FAILED: the evaluation was stopped by signal N (SIGINT 130, SIGTERM 143)"""
_DETAILED_FAILURES = 3  # failures printed in full at the end; the rest by their first line
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(line: str, newlines: bool = True) -> str:
    """`line` with control characters (escape sequences, carriage returns; newlines too unless
    `newlines`) shown as escapes: what the submission or a file name says cannot rewrite a line."""
    shown = _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], line)
    return shown if newlines else shown.replace("\n", "\\n")


def shown_path(path) -> str:
    """A file name as every line here prints it: on one line, its control characters escaped."""
    return printable(str(path), newlines=False)


def _geomean(values) -> float:
    """The geomean (timing.geomean), 0 where a value is 0 (a time below the clock's resolution)."""
    values = list(values)
    return 0.0 if values and min(values) <= 0 else geomean(values)


def shape_text(shape: Shape) -> str:
    return "x".join(map(str, shape))


@dataclass
class CaseResult:
    shape: Shape
    case: str
    ok: bool
    message: str

    def line(self) -> str:
        first = self.message.splitlines()[0] if self.message else ""
        return f"{'PASS' if self.ok else 'FAIL'}  {shape_text(self.shape):<13} {self.case:<25} {first}"


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
        cells = [shape_text(r.shape), f"{t.mean_us:.2f}", f"{t.err_us:.2f}", f"{t.std_us:.2f}", f"{t.best_us:.2f}",
                 f"{t.worst_us:.2f}", str(t.n), f"{r.bandwidth_gbps:.0f}", f"{r.percent_of_copy:.1f}"]
        body.append(cells + ([f"{r.percent_of_b200_sol:.1f}"] if show_sol else []))
    if rows:
        cells = ["geomean", f"{_geomean(r.timing.mean_us for r in rows):.2f}", "", "", "", "", "",
                 f"{_geomean(r.bandwidth_gbps for r in rows):.0f}", f"{_geomean(r.percent_of_copy for r in rows):.1f}"]
        body.append(cells + ([f"{_geomean(r.percent_of_b200_sol for r in rows):.1f}"] if show_sol else []))
    lines = text_table(header, body, left=1).split("\n")
    if rows:
        lines.insert(len(lines) - 1, lines[1])  # a rule above the geomean row
    return "\n".join(lines)


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
    unchecked: list[str] = field(default_factory=list)  # what the mode promises that could not be checked here
    skipped: str | None = None
    interrupted: int | None = None  # the signal that stopped the evaluation
    isolation: str | None = None    # how the submission's process was closed off (from its first answer)
    output: str = ""                # the tail of what the submission wrote to stdout and stderr
    output_bytes: int = 0

    @property
    def ok(self) -> bool:
        """No failure was found (see `verdict`: whether every check of the mode ran)."""
        return not self.failures

    @property
    def verdict(self) -> str:
        if self.failures:
            return "FAILED"
        if self.skipped:
            return "SKIPPED"
        return "INCOMPLETE" if self.unchecked else "PASSED"

    @property
    def exit_code(self) -> int:
        if self.interrupted is not None:
            return EXIT_SIGNAL_BASE + self.interrupted
        return {"PASSED": EXIT_PASSED, "FAILED": EXIT_FAILED, "SKIPPED": EXIT_SKIPPED,
                "INCOMPLETE": EXIT_INCOMPLETE}[self.verdict]

    @property
    def geomean_us(self) -> float | None:
        """Geomean over the shapes of benchmark mode's leaderboard time (the mean of each)."""
        return _geomean(r.timing.mean_us for r in self.bench) if self.bench else None

    @property
    def ranked_geomean_us(self) -> float | None:
        """Geomean over the shapes of ranked mode's leaderboard time: what the leaderboard ranks by."""
        return _geomean(r.timing.mean_us for r in self.ranked) if self.ranked else None

    def summary(self) -> str:
        if self.failures:
            lines = [f"FAILED: {len(self.failures)} problem(s) in {shown_path(self.file)}"]
            for i, failure in enumerate(self.failures):
                text = failure if i < _DETAILED_FAILURES else failure.splitlines()[0]
                lines.append("  - " + text.replace("\n", "\n    "))
            return "\n".join(lines)
        if self.skipped:
            return f"SKIPPED: {self.skipped}"
        timed = [f"{name} {us:.2f} us" for name, us in (("benchmark", self.geomean_us),
                                                         ("ranked", self.ranked_geomean_us)) if us is not None]
        checked = sum(r.checked for r in self.ranked)
        passed = (f"{sum(c.ok for c in self.cases)} checks" + (f" and {checked} ranked results" if checked else "")
                  + (f"; leaderboard time (mean), geomean: {', '.join(timed)}" if timed else ""))
        if self.unchecked:
            return (f"INCOMPLETE: {passed} passed, but not checked here: {'; '.join(self.unchecked)}"
                    + ("" if self.cases else " (only the import was checked)"))
        return f"PASSED: {passed}"
