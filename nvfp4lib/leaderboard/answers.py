"""What the evaluator accepts from the submission's process: every answer is read as data and
checked field by field (kind, names, types, sizes, nesting) before anything uses it.

The submission's process (nvfp4lib.leaderboard.child) runs code the submission can change, so an
answer can be anything: not JSON, JSON of the wrong shape, a forged answer of the right shape, a
huge or deeply nested one. `parse` turns the bytes of one answer into a dict of the expected
schema or raises `BadAnswer` naming what is wrong; nothing here trusts a value's type.
"""

from __future__ import annotations

import json
import math
from typing import Callable

from nvfp4lib.contract import NAMES
from nvfp4lib.leaderboard.child import TEXT_LIMIT

MAX_ANSWER_BYTES = 1 << 20  # the JSON part of one answer
MAX_VALUE_CHARS = 65536     # import_isolated's value
MAX_RANK = 16
MAX_US = 1e12               # a timed call of more than 11 days is no measurement


class BadAnswer(ValueError):
    """An answer that is not what its request asks for; the message says how."""


Check = Callable[[object, str], object]


def _shown(value) -> str:
    shown = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return shown if len(shown) <= 60 else shown[:57] + "..."


def string(limit: int = TEXT_LIMIT, optional: bool = False) -> Check:
    def check(value, where):
        if value is None and optional:
            return None
        if type(value) is not str or len(value) > limit:
            raise BadAnswer(f"{where}: expected a string of at most {limit} characters, got {_shown(value)}")
        return value
    return check


def boolean(value, where):
    if type(value) is not bool:
        raise BadAnswer(f"{where}: expected true or false, got {_shown(value)}")
    return value


def integer(low: int, high: int) -> Check:
    def check(value, where):
        if type(value) is not int or not low <= value <= high:
            raise BadAnswer(f"{where}: expected an integer from {low} to {high}, got {_shown(value)}")
        return value
    return check


def number(low: float, high: float, optional: bool = False) -> Check:
    def check(value, where):
        if value is None and optional:
            return None
        if type(value) not in (int, float) or not (math.isfinite(value) and low <= value <= high):
            raise BadAnswer(f"{where}: expected a number from {low:g} to {high:g}, got {_shown(value)}")
        return float(value)
    return check


def constant(expected) -> Check:
    def check(value, where):
        if type(value) is not type(expected) or value != expected:
            raise BadAnswer(f"{where}: expected {expected!r}, got {_shown(value)}")
        return value
    return check


def choice(*allowed: str) -> Check:
    def check(value, where):
        if type(value) is not str or value not in allowed:
            raise BadAnswer(f"{where}: expected one of {', '.join(allowed)}, got {_shown(value)}")
        return value
    return check


def array(item: Check, most: int, least: int = 0, optional: bool = False) -> Check:
    def check(value, where):
        if value is None and optional:
            return None
        if type(value) is not list or not least <= len(value) <= most:
            raise BadAnswer(f"{where}: expected a list of {least} to {most} items, got "
                            + (f"{len(value)} items" if type(value) is list else _shown(value)))
        return [item(x, f"{where}[{i}]") for i, x in enumerate(value)]
    return check


def record(**fields: Check) -> Check:
    """An object with exactly these fields."""
    def check(value, where):
        if type(value) is not dict:
            raise BadAnswer(f"{where}: expected an object, got {_shown(value)}")
        unexpected = sorted(k for k in value if k not in fields)
        if unexpected:
            raise BadAnswer(f"{where}: unexpected field {_shown(str(unexpected[0]))}")
        missing = [k for k in fields if k not in value]
        if missing:
            raise BadAnswer(f"{where}: no field {missing[0]!r}")
        return {k: fields[k](value[k], f"{where}.{k}" if where else k) for k in fields}
    return check


_SIZE = integer(0, 2**62)
SEQ = integer(0, 2**62)
READY = record(kind=constant("ready"))
ERROR = record(kind=constant("error"), seq=SEQ, error=string())
LOADED = record(kind=constant("loaded"), seq=SEQ, has_kernel=boolean, needs_cuda=boolean,
                submission_path=string(optional=True), backend=string(optional=True),
                value=string(MAX_VALUE_CHARS, optional=True))
OUTPUT = record(type=string(200), tensor=boolean, exact=boolean, layout=string(100, optional=True),
                device=string(100, optional=True), dtype=string(100, optional=True),
                shape=array(_SIZE, MAX_RANK, optional=True), shares=array(choice(*NAMES[:6]), 6), values=boolean)
CALLED = record(kind=constant("called"), seq=SEQ, us=number(0, MAX_US, optional=True), device=string(100),
                output=OUTPUT)


def timed(max_calls: int, outputs: bool = True) -> Check:
    """The answer to timed calls: a time per call, with (`outputs`) each call's output, or without (a baseline)."""
    return record(kind=constant("timed"), seq=SEQ, samples_us=array(number(0, MAX_US), max_calls, 1),
                  device=string(100), outputs=array(OUTPUT, max_calls, 1) if outputs else array(OUTPUT, 0))


def _refuse_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def decode(data: bytes) -> object:
    """The JSON value of an answer's bytes, or BadAnswer saying why there is none."""
    if len(data) > MAX_ANSWER_BYTES:
        raise BadAnswer(f"{len(data)} bytes, more than the {MAX_ANSWER_BYTES} an answer may have")
    try:
        source = bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadAnswer(f"not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})") from None
    try:
        return json.loads(source, parse_constant=_refuse_constant)
    except RecursionError:
        raise BadAnswer("JSON nested too deeply to read") from None
    except ValueError as err:
        raise BadAnswer(f"not JSON ({str(err)[:200]})") from None


def parse(data: bytes, schemas: dict[str, Check], seq: int | None = None) -> dict:
    """One answer, checked against the schema of the kind it names (one of `schemas`: kind -> schema)
    and, with `seq`, that it answers that request -> the checked dict; BadAnswer otherwise."""
    value = decode(data)
    if type(value) is not dict:
        raise BadAnswer(f"a JSON {type(value).__name__}, expected an object")
    kind = value.get("kind")
    if type(kind) is not str or kind not in schemas:
        raise BadAnswer(f"kind: expected {' or '.join(map(repr, schemas))}, got {_shown(kind)}")
    answer = schemas[kind](value, "")
    if seq is not None and answer["seq"] != seq:
        raise BadAnswer(f"seq: expected {seq} (the request it answers), got {answer['seq']}")
    return answer
