"""Durations in a diagnosis that keep growing while the stall lasts.

A stall record is written once, but its sentence is read later: ``waits for its Pool for 5.25 s``
read 18 s on is a wait of 23 s. A rule formats such a duration with `growing`; `explain` then knows
where in the sentence each one is (`Diagnosis.ages`: offset, length, nanoseconds), the stall record
keeps them (``ages``), and a view brings each one up to the time it is read (`aged`). Durations that
do not grow (a sample's length, a limit) are formatted as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Optional

from lora_otel.journal.reader import format_duration

_OPEN, _CLOSE = "\ue000", "\ue001"
"""Private-use characters around a growing duration's index while a sentence is being built."""

MAX_NS = 10**20
"""An age past this (three thousand years: a record edited by hand) is left as written."""

_collected: ContextVar[Optional[list[int]]] = ContextVar("lora_otel_growing", default=None)


def growing(ns: float) -> str:
    """``ns`` formatted (`format_duration`), marked as an age that grows while the stall lasts
    when called inside `collecting`; plain text otherwise."""
    ns = max(round(ns), 0)
    found = _collected.get()
    if found is None:
        return format_duration(ns)
    found.append(ns)
    return "%s%d%s" % (_OPEN, len(found) - 1, _CLOSE)


@contextmanager
def collecting() -> Iterator[list[int]]:
    """Inside: `growing` marks what it formats (the nanoseconds go in the list yielded)."""
    found: list[int] = []
    token = _collected.set(found)
    try:
        yield found
    finally:
        _collected.reset(token)


def resolve(sentence: str, found: list[int]) -> tuple[str, list[list[int]]]:
    """``sentence`` with its marks replaced by the durations, and ``[offset, length, ns]`` of each."""
    out: list[str] = []
    ages: list[list[int]] = []
    pos = length = 0
    while True:
        start = sentence.find(_OPEN, pos)
        end = sentence.find(_CLOSE, start + 1) if start >= 0 else -1
        if start < 0 or end < 0:
            break
        out.append(sentence[pos:start])
        length += start - pos
        index = sentence[start + 1 : end]
        ns = found[int(index)] if index.isdigit() and int(index) < len(found) else None
        text = format_duration(ns) if ns is not None else ""
        if ns is not None:
            ages.append([length, len(text), ns])
        out.append(text)
        length += len(text)
        pos = end + 1
    out.append(sentence[pos:])
    return "".join(out).replace(_OPEN, "").replace(_CLOSE, ""), ages


def shifted(ages: list[list[int]], by: int) -> list[list[int]]:
    """``ages`` of a sentence that got ``by`` characters put before it."""
    return [[offset + by, length, ns] for offset, length, ns in ages]


def aged(sentence: str, ages: Any, later_ns: int) -> str:
    """``sentence`` (as recorded, with its record's ``ages``) with each growing duration brought
    ``later_ns`` on. Ages that do not fit the sentence (a record edited by hand) are left alone."""
    if not isinstance(ages, list) or later_ns <= 0:
        return sentence
    out: list[str] = []
    pos = 0
    for item in ages:
        if not (isinstance(item, list) and len(item) == 3 and all(type(v) is int for v in item)):
            continue
        offset, length, ns = item
        if not 0 <= ns <= MAX_NS:
            continue
        if offset < pos or offset + length > len(sentence) or sentence[offset : offset + length] != format_duration(ns):
            continue
        out.append(sentence[pos:offset])
        out.append(format_duration(ns + later_ns))
        pos = offset + length
    out.append(sentence[pos:])
    return "".join(out)
