"""Which path runs: the one fallback chooser of the dispatcher and of the exported files, and its self-check.

`first_working(candidates, build, device)` takes paths in order and returns the first that can run here,
builds, and computes small full-range inputs (`self_check_input`) right: within the leaderboard's tolerance of
the exact reference, every element written. The dispatcher calls it when it plans a shape, an exported file
(`nvfp4lib.leaderboard.runtime`) once at import, each with its first path followed by the rest of
`paths.FALLBACK_ORDER`: on one machine they run the same kernel.

A path that cannot run here (the CuTe kernel without a GPU) is information, logged at INFO:
``cute_fast cannot run here (the CuTe kernel needs the inputs on a CUDA GPU); using scaled_mm_permuted``. A
path that could run here but does not build, raises in its self-check or computes a wrong result is a failure,
logged as a WARNING; the choice at INFO (``self-check ok: <path> on <device>``). What a real call raises later
does not change the choice: it is the caller's."""

from __future__ import annotations

import functools
import logging
from typing import Callable, NamedTuple

import torch

from nvfp4lib.contract import GemvInput
from nvfp4lib.device import capabilities
from nvfp4lib.layouts import to_permuted
from nvfp4lib.messages import describe_error
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check, poison_

LOGGER = logging.getLogger(__name__)

SELF_CHECK_SHAPES = ((128, 256, 2), (128, 2048, 1), (128, 7168, 1), (128, 16384, 1))
"""What every candidate path runs before it is chosen: K = 256 (with L = 2, a second batch) and every K
at which the default CuTe kernel is specialised per K (`cute.gemv.default_config`: the benchmarks'
K = 2048, 7168 and 16384), so each kernel a benchmark shape runs has passed the check first."""
SELF_CHECK_SEED = 20250


def self_check_input(m: int, k: int, l: int, device, signed_scales: bool = False) -> GemvInput:
    """A small full-range input (M >= 128): every FP4 code in both nibbles of A and of the vector, and the E4M3
    scales `generate_input` draws in full mode (zeros, subnormals, up to 448). The scales' sign bits are cleared
    unless ``signed_scales``: cuBLAS reads NVFP4 block scales as unsigned UE4M3 (the sign bit is ignored) and the
    leaderboard's scales are never negative, so every path is held to the inputs it can be given."""
    a, b, sfa, sfb, _, _, c = generate_input(m, k, l, seed=SELF_CHECK_SEED, mode="full", device=device)
    every_byte = torch.arange(256, dtype=torch.uint8, device=device)
    a.view(torch.uint8)[:128, :2, 0] = every_byte.view(2, 128).T  # bytes 0-127 and 128-255 of rows 0-127
    codes = torch.arange(16, dtype=torch.uint8, device=device)
    b.view(torch.uint8)[0, :16, :] = (codes | (codes.flip(0) << 4)).unsqueeze(-1)  # the vector, every batch
    if not signed_scales:
        for sf in (sfa, sfb):
            sf.view(torch.uint8).bitwise_and_(0x7F)
    return GemvInput(a, b, sfa, sfb, to_permuted(sfa), to_permuted(sfb), c)


@functools.lru_cache(maxsize=2 * len(SELF_CHECK_SHAPES))  # the shapes on the CPU and on one GPU
def _self_check_input_on(m: int, k: int, l: int, device: torch.device) -> GemvInput:
    """`self_check_input`, made once per shape and device for every path checked there."""
    return self_check_input(m, k, l, device)


def self_check(kernel: Callable, device) -> str | None:
    """Run `kernel` on the `SELF_CHECK_SHAPES` inputs (output poisoned first) and compare it with the
    exact reference (`reference.check`: an integer dequantize-and-sum, the leaderboard's tolerance).
    None when every element matches; else what went wrong. Exceptions propagate. The inputs are made
    once per shape and device (c poisoned again for each check)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for shape in SELF_CHECK_SHAPES:
        data = _self_check_input_on(*shape, device)
        poison_(data.c)
        out = kernel(data)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result = check(out, data)
        if not result.ok:
            return f"wrong result at (m, k, l) = {shape}: {result.message.splitlines()[0]}"
    return None


class PassedOver(NamedTuple):
    """A candidate `first_working` did not choose: ``stage`` is "cannot run" (information: not this
    machine's path), "build" or "self-check" (a failure)."""
    name: str
    stage: str
    why: str

    def __str__(self) -> str:
        said = {"cannot run": "cannot run here", "build": "could not be built", "self-check": "failed its self-check"}
        return f"{self.name} {said[self.stage]} ({self.why})"


class Choice(NamedTuple):
    """What `first_working` chose (``name`` and ``kernel`` None when no candidate passed) and what
    it passed over, in order."""
    name: str | None
    kernel: Callable | None
    passed_over: tuple[PassedOver, ...]


def _where(device) -> str:
    device = torch.device(device)
    caps = capabilities()
    if device.type == "cuda" and caps.sm:
        return f"{caps.name} (sm_{caps.sm[0]}{caps.sm[1]})"
    return str(device)


def first_working(candidates, build: Callable[[str], Callable], device, *,
                  unavailable: Callable[[str], str | None] | None = None, checked: dict | None = None) -> Choice:
    """The first of `candidates` (path names, best first) that can run here (``unavailable(name)`` is None), builds
    (``build(name)``) and passes `self_check` on `device`. ``checked`` (name -> None or why it failed) remembers the
    verdicts between calls: a path found failing is passed over again without being built, one found working is not
    checked again. Logs what it passed over and what it chose (see the module's docstring)."""
    passed: list[PassedOver] = []
    recalled: set[str] = set()  # failures found by an earlier call: logged then
    chosen, kernel = None, None
    for name in candidates:
        why = unavailable(name) if unavailable is not None else None
        if why is not None:
            passed.append(PassedOver(name, "cannot run", why))
            continue
        known = checked is not None and name in checked
        if known and checked[name] is not None:
            passed.append(checked[name])
            recalled.add(name)
            continue
        try:
            kernel = build(name)
        except Exception as err:  # noqa: BLE001 - whatever it is, this path is not usable here
            verdict = PassedOver(name, "build", describe_error(err, 400))
        else:
            try:
                problem = None if known else self_check(kernel, device)
            except Exception as err:  # noqa: BLE001 - a kernel that raises on a valid input fails its check
                problem = describe_error(err, 400)
            verdict = None if problem is None else PassedOver(name, "self-check", problem)
        if checked is not None:
            checked[name] = verdict
        if verdict is None:
            chosen = name
            break
        passed.append(verdict)
        kernel = None
    instead = f"using {chosen}" if chosen else "no path is left"
    for item in passed:
        if item.name not in recalled:
            LOGGER.log(logging.INFO if item.stage == "cannot run" else logging.WARNING, "%s; %s", item, instead)
    if chosen is not None:
        LOGGER.info("self-check ok: %s on %s", chosen, _where(device))
    return Choice(chosen, kernel, tuple(passed))
