"""What went wrong, said in one line: the form every report, log and fallback message of the
package uses for a text or an exception (a CSV note, a line on stderr, a skip reason)."""

from __future__ import annotations

import textwrap


def first_line(text, limit: int | None = None) -> str:
    """The first non-empty line of `text`, stripped; with `limit`, at most that many characters,
    cut between words (" ..." marks the cut)."""
    line = (str(text).strip().splitlines() or [""])[0].strip()
    return line if limit is None else textwrap.shorten(line, width=limit, placeholder=" ...")


def describe_error(err: BaseException, limit: int | None = None) -> str:
    """The exception as "Type: message" (just "Type" without one); with `limit`, the message's
    first line only and at most `limit` characters in all (see `first_line`)."""
    text = str(err).strip() if limit is None else first_line(err)
    described = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return described if limit is None else first_line(described, limit)
