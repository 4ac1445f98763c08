"""The verdict on a call, decided in the evaluator from what it read back from the submission's
process: the output's kind, whether it was finished when the call returned (on the caller's
stream), whether the inputs changed (their bytes compared here), its values against
nvfp4lib.reference, and whether a time it sent is one a device can take (`too_fast`). Nothing
here runs in, or takes a judgement from, the submission's process.
"""

from __future__ import annotations

import torch

from nvfp4lib.contract import Shape
from nvfp4lib.leaderboard.process import Called, Output, Timed
from nvfp4lib.leaderboard.report import CaseResult
from nvfp4lib.problem import bytes_moved
from nvfp4lib.reference import TOLERANCE, check

# the leaderboard's atol and rtol, as reference.check applies them (ref: the exact product)
TOLERANCE_RULE = f"|out - ref| <= {TOLERANCE:g} + {TOLERANCE:g} * |ref| per element of the fp16 output"


def output_problem(description: dict, c_shape, c_device: str) -> str | None:
    """What is wrong with the kind of a returned object (None if it is a dense float16 tensor like c,
    on c's device, sharing no input's memory, whose values were sent)."""
    if not description["tensor"]:
        return f"returned {description['type']}, expected the tensor c"
    if description["layout"] == "nested":
        return "returned a nested tensor, expected a dense tensor like c"
    if not description["exact"]:
        return f"returned a {description['type']} (a torch.Tensor subclass), expected a plain tensor like c"
    if description["layout"] != "torch.strided":
        return f"returned a tensor with layout {description['layout']}, expected torch.strided (dense, as c)"
    if description["device"] != c_device:
        return f"returned a tensor on {description['device']}, expected {c_device} (as c)"
    if description["dtype"] != "torch.float16":
        return f"returned dtype {description['dtype']}, expected torch.float16 (as c)"
    if description["shape"] is None or tuple(description["shape"]) != tuple(c_shape):
        shown = None if description["shape"] is None else tuple(description["shape"])
        return f"returned shape {shown}, expected {tuple(c_shape)} (as c)"
    if description["shares"]:
        names = description["shares"]
        return (f"returned a tensor that shares memory with the input{'s' if len(names) > 1 else ''} "
                f"{', '.join(names)} (expected c or a tensor of its own)")
    if not description["values"]:
        return "returned a tensor like c, but its process sent none of its values"
    return None


def unordered_work(output: Output, c_device: str) -> str | None:
    """Whether the output changed after the call returned: the copy made on the caller's stream
    right after the call (what the public harness checks) against one made once the device was
    idle (None if they are the same bits)."""
    differ = int((output.at_return.view(torch.int16) != output.settled.view(torch.int16)).sum())
    if not differ:
        return None
    n = output.at_return.numel()
    if c_device.startswith("cuda"):
        return (f"work the caller's stream never waited for: {differ} of {n} elements of the output changed after "
                f"the call returned (a copy made on the caller's stream right after the call differs from one "
                f"made once the device was idle); the public harness checks the output on the caller's stream "
                f"right after the call: make that stream wait for the work (e.g. "
                f"torch.cuda.current_stream().wait_stream(side)) before returning")
    return (f"the output changed after the call returned: {differ} of {n} elements differ between a copy made "
            f"right after the call and one made later (work still running, e.g. a thread, after the call returned)")


def changed_inputs(names: list[str]) -> str:
    return (f"changed its input{'s' if len(names) > 1 else ''} {', '.join(names)} in place (inputs are "
            f"read-only: the leaderboard hands the kernel a copy and checks against the original)")


def judge(called: Called, data, shape: Shape, case: str, earlier=()):
    """The verdict on one call's answer for the input `data` -> (CaseResult, the output as float32,
    or None). `earlier` are correct outputs of earlier calls on other inputs: a wrong output equal
    to one of them is reported as stale (a result cached across calls)."""
    if called.error is not None:
        return CaseResult(shape, case, False, called.error), None
    c = data[-1]
    problem = output_problem(called.output.description, c.shape, called.device)
    if problem:
        return CaseResult(shape, case, False, problem), None
    late = unordered_work(called.output, called.device)
    if late:
        return CaseResult(shape, case, False, late), None
    out = called.output.at_return
    result = check(out, data)
    copy = out.float()
    if called.changed:
        why = changed_inputs(called.changed) + ("" if result.ok else "; the result is wrong too")
        return CaseResult(shape, case, False, f"{why}\n{result.message}"), copy
    if result.ok:
        return CaseResult(shape, case, True, f"{result.message}; {TOLERANCE_RULE}"), copy
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


def floor_us(shape: Shape, copy_gbps: float) -> float:
    """The time no device goes under: the bytes a call must move at the copy bandwidth measured here."""
    return bytes_moved(shape) / copy_gbps / 1e3


def too_fast(samples_us, shape: Shape, copy_gbps: float, name=lambda i: f"timed call {i}") -> str | None:
    """The first time below the floor (`floor_us`; None if none is). `name(i)` names the i-th call (from 1)."""
    nbytes, floor = bytes_moved(shape), floor_us(shape, copy_gbps)
    for i, us in enumerate(samples_us, 1):
        if us < floor:
            return (f"{name(i)}: {us:.3g} us, below the floor of {floor:.3g} us (the {nbytes} bytes it must "
                    f"move at the {copy_gbps:.0f} GB/s copy bandwidth measured here): no device moves them that "
                    f"fast, so the time was not measured honestly")
    return None


def timed_problem(timed: Timed, shape: Shape, copy_gbps: float) -> str | None:
    """What is wrong with benchmark mode's timed calls (None if nothing): the kernel's error, the
    first call whose output was not a tensor like c or was not finished when the call returned, or
    a time below the floor (`too_fast`)."""
    if timed.error is not None:
        return timed.error
    c_shape = (shape.m, 1, shape.l)
    for i, output in enumerate(timed.outputs, 1):
        problem = (output_problem(output.description, c_shape, timed.device)
                   or unordered_work(output, timed.device))
        if problem:
            return f"timed call {i}: {problem}"
    return too_fast(timed.samples_us, shape, copy_gbps)
