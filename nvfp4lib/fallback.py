"""Which path runs: the one fallback chooser of the dispatcher and of the exported files, and its self-check.

`first_working(candidates, build, device)` takes paths in order and returns the first that can run here,
builds, and computes small full-range inputs (`self_check_input`) right: every element within the
leaderboard's tolerance of a dequantize-and-matmul of the same codes and scales (`dequantized_gemv`, exact for
these inputs). The dispatcher calls it when it plans a shape, an exported file
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

from nvfp4lib.contract import B_ROWS, BLOCK_SIZE, GemvInput, validate_gemv_input
from nvfp4lib.device import capabilities
from nvfp4lib.formats import E2M1_VALUES
from nvfp4lib.layouts import to_permuted
from nvfp4lib.messages import describe_error
from nvfp4lib.reference import TOLERANCE

LOGGER = logging.getLogger(__name__)

SELF_CHECK_SHAPES = ((128, 256, 2), (128, 2048, 1), (128, 7168, 1), (128, 16384, 1))
"""What every candidate path runs before it is chosen: K = 256 (with L = 2, a second batch) and the K at
which `cute.gemv.PER_K_DEFAULTS` holds a measured per-K kernel (the benchmarks' K = 2048, 7168 and
16384), so each kernel a benchmark shape runs has passed the check first."""
SELF_CHECK_SEED = 20250


def self_check_input(m: int, k: int, l: int, device) -> GemvInput:
    """A small full-range input (M >= 128): every byte in A (every FP4 code in both nibbles), every code in both
    nibbles of the vector (B's padding rows hold other bytes, which no path may read), and E4M3 scales from zero
    through the subnormals to 448. In each pair of K blocks one operand's scale is any of the 127 codes with the
    sign bit clear (all of them in A's first block), the other's zero or one of the 7 subnormals: a block's
    product of scales is at most 448 * 7 * 2^-9, so c stays far inside fp16. cuBLAS reads the scales as unsigned
    UE4M3 and the leaderboard's are never negative, so no sign bit is set."""
    gen = torch.Generator().manual_seed(SELF_CHECK_SEED)
    a = torch.randint(0, 256, (l, m, k // 2), generator=gen, dtype=torch.uint8)
    b = torch.randint(0, 256, (l, B_ROWS, k // 2), generator=gen, dtype=torch.uint8)
    a[0, :128, :2] = torch.arange(256, dtype=torch.uint8).view(2, 128).T  # bytes 0-127 and 128-255 of rows 0-127
    codes = torch.arange(16, dtype=torch.uint8)
    b[:, 0, :16] = codes | (codes.flip(0) << 4)  # the vector, every batch
    blocks = k // BLOCK_SIZE
    wide = torch.randint(0, 127, (l, m + B_ROWS, blocks), generator=gen, dtype=torch.uint8)
    wide[0, :127, 0] = torch.arange(127, dtype=torch.uint8)
    narrow, a_wide = wide % 8, torch.arange(blocks) % 2 == 0
    sfa = torch.where(a_wide, wide[:, :m], narrow[:, :m])
    sfb = torch.where(a_wide, narrow[:, m:], wide[:, m:])
    plain = [x.to(device).view(dtype).permute(1, 2, 0) for x, dtype in (
        (a, torch.float4_e2m1fn_x2), (b, torch.float4_e2m1fn_x2), (sfa, torch.float8_e4m3fn),
        (sfb, torch.float8_e4m3fn), (torch.zeros(l, m, 1, dtype=torch.float16), torch.float16))]
    return GemvInput(*plain[:4], to_permuted(plain[2]), to_permuted(plain[3]), plain[4])


def dequantized_gemv(data) -> torch.Tensor:
    """float64 [M, 1, L]: A and the vector B[0] decoded from their codes and plain scales, then multiplied. Exact
    for `self_check_input`'s inputs: every term is a multiple of 2^-20 and every partial sum stays far below 2^53
    of those units, so float64 rounds nothing, whatever the order of the sum."""
    a, b, sfa, sfb = data[:4]
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=a.device)

    def values(codes, scales):  # [rows, K/2, L] FP4 bytes, [rows, K/16, L] scales -> float64 [rows, K, L]
        byte = codes.view(torch.uint8).long()
        nibbles = torch.stack([byte & 15, byte >> 4], dim=2).flatten(1, 2)  # the even element in the low nibble
        return table[nibbles] * scales.double().repeat_interleave(BLOCK_SIZE, dim=1)

    return torch.einsum("mkl,kl->ml", values(a, sfa), values(b[:1], sfb[:1])[0]).unsqueeze(1)


def exact_gemv(data) -> torch.Tensor:
    """`dequantized_gemv` of a checked 7-tuple, rounded into c: what an exported file runs where nothing else can
    (`paths.IN_A_FILE`). Slow (float64, every call), and exact up to float64's rounding of the sum."""
    validate_gemv_input(data)
    return data[6].copy_(dequantized_gemv(data))


@functools.lru_cache(maxsize=2 * len(SELF_CHECK_SHAPES))  # the shapes on the CPU and on one GPU
def _self_check_input_on(m: int, k: int, l: int, device: torch.device) -> tuple[GemvInput, torch.Tensor]:
    """`self_check_input` and its fp16 answer (`dequantized_gemv` rounded as the leaderboard's reference is),
    made once per shape and device for every path checked there."""
    data = self_check_input(m, k, l, device)
    return data, dequantized_gemv(data).half().double()


def self_check(kernel: Callable, device) -> str | None:
    """Run `kernel` on the `SELF_CHECK_SHAPES` inputs (output poisoned first) and compare every element with the
    dequantized product within the leaderboard's rtol = atol = `reference.TOLERANCE` (NaN, an unwritten element,
    never matches). None when every element matches; else what went wrong. Exceptions propagate."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for shape in SELF_CHECK_SHAPES:
        data, expected = _self_check_input_on(*shape, device)
        data.c.fill_(float("nan"))
        got = kernel(data).double()
        bad = ~torch.isclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE)
        if bad.any():
            m, _, l = bad.nonzero()[0].tolist()
            return (f"wrong result at (m, k, l) = {shape}: {int(bad.sum())} of {bad.numel()} elements; first at "
                    f"(m={m}, l={l}): got {got[m, 0, l].item():.6g}, expected {expected[m, 0, l].item():.6g}")
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


def judged(name: str, build: Callable[[str], Callable], device) -> tuple[Callable | None, PassedOver | None]:
    """(its kernel, None) where path `name` builds (``build(name)``) and passes `self_check` on `device`; else
    (None, why not)."""
    try:
        kernel = build(name)
    except Exception as err:  # noqa: BLE001 - whatever it is, this path is not usable here
        return None, PassedOver(name, "build", describe_error(err, 400))
    try:
        problem = self_check(kernel, device)
    except Exception as err:  # noqa: BLE001 - a kernel that raises on a valid input fails its check
        problem = describe_error(err, 400)
    return (kernel, None) if problem is None else (None, PassedOver(name, "self-check", problem))


def first_working(candidates, build: Callable[[str], Callable], device, *,
                  unavailable: Callable[[str], str | None] | None = None, judge=judged, recalled=()) -> Choice:
    """The first of `candidates` (path names, best first) that can run here (``unavailable(name)`` is None) and
    that ``judge(name, build, device)`` passes (`judged`: builds and passes `self_check`; the dispatcher's also
    remembers verdicts between calls and asks the kernel whether it takes the shape's K). Logs what it passed
    over, but for the failures of `recalled` (found, and logged, by an earlier call), and what it chose (see the
    module's docstring)."""
    passed, chosen, kernel = [], None, None
    for name in candidates:
        why = unavailable(name) if unavailable is not None else None
        kernel, verdict = (None, PassedOver(name, "cannot run", why)) if why is not None else judge(name, build, device)
        if verdict is None:
            chosen = name
            break
        passed.append(verdict)
    instead = f"using {chosen}" if chosen else "no path is left"
    for item in [item for item in passed if item not in recalled]:
        LOGGER.log(logging.INFO if item.stage == "cannot run" else logging.WARNING, "%s; %s", item, instead)
    if chosen is not None:
        caps, device = capabilities(), torch.device(device)
        where = f"{caps.name} (sm_{caps.sm[0]}{caps.sm[1]})" if device.type == "cuda" and caps.sm else device
        LOGGER.info("self-check ok: %s on %s", chosen, where)
    return Choice(chosen, kernel, tuple(passed))
