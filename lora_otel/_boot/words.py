"""How a duration, a time and a stall are written: one formatter each, for the job's own lines
(`narrate`, `core`) and for every view (the reading side reaches them through `seam`), so that the
job's lines, ``inspect``, ``watch`` and the report give the same figure in the same words.

Standard library only, no side effects: the preamble loads it.
"""

from __future__ import annotations

import time

# Taken at import (the preamble's), kept in a tuple as `core._CLOCKS` is: freezegun replaces the
# module attributes that are ``time`` functions, a tuple's items it leaves alone.
_CLOCKS = (time.gmtime, time.strftime)


def duration(seconds: float | None) -> str:
    """``14 ms``, ``460 ms``, ``2.31 s``, ``12.3 s``, ``312 s``: three significant figures (whole
    seconds from 100 s), milliseconds under a second. Negative or None counts as 0. Monotonic: a
    time at or past its limit never reads below it when both are written here."""
    s = max(seconds or 0.0, 0.0)
    if s >= 0.9995:  # (not "1000 ms")
        if s >= 100:
            return f"{s:.0f} s"
        return f"{s:.3g} s"
    ms = s * 1000
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms:.2g} ms"


def iso_time(ns: int) -> str:
    """``2026-11-30T22:13:48.123Z``: a Unix time in nanoseconds, ISO-8601 UTC with milliseconds."""
    s, rem = divmod(ns, 1_000_000_000)
    return _CLOCKS[1]("%Y-%m-%dT%H:%M:%S", _CLOCKS[0](s)) + ".%03dZ" % (rem // 1_000_000)


CANNOT_TELL = "Cannot tell from the evidence."
"""A STALLED line's diagnosis when the evidence gave none."""


def stall_what(
    stage: str | None,
    kind: str,
    open_s: float | None,
    limit_s: float | None,
    since: str = "",
    limit_why: str = "",
) -> str:
    """``import x open for 131 s (limit 120 s)``, ``training: no optimizer step for 19 s (limit 3 s:
    20x the median step of 150 ms)``, ``frozen in cuda init: no beat for 12 s (limit 10 s)``, ``no
    stage open for 130 s since import torch ended (limit 120 s)``, ``died in load model after 45 s``:
    the stall, in the same words and figures in the job's own lines and every view. ``open_s``: how
    long the stage has been open (training: since the last step; frozen: since the last beat;
    between: since a stage was last open); ``since``: what the quiet time counts from, where known;
    ``limit_why``: why the limit is what it is, where it is not the one given."""
    limit = " (limit %s%s)" % (duration(limit_s), ": " + limit_why if limit_why else "") if limit_s else ""
    if kind == "died":
        return "died in %s" % (stage or "no stage") + (" after %s" % duration(open_s) if open_s is not None else "")
    if kind == "frozen":
        return "frozen%s: no beat for %s%s" % (" in " + stage if stage else "", duration(open_s), limit)
    if kind == "between" or not stage:
        return "no stage open for %s%s%s" % (duration(open_s), " since " + since if since else "", limit)
    if stage == "training":
        return "training: no optimizer step for %s%s" % (duration(open_s), limit)
    return "%s open for %s%s" % (stage, duration(open_s), limit)


def learned_why(source: str, usual_s: float | None) -> str:
    """``learned from 5 earlier runs, usually 2.1 s``: a learned limit's ``limit_why`` (`stall_what`)."""
    return "learned from %s" % source + (", usually %s" % duration(usual_s) if usual_s is not None else "")


def stalled_line(what: str, diagnosis: str | None) -> str:
    """``STALLED: <what> — <diagnosis>`` (`stall_what`); ``diagnosis`` "": `CANNOT_TELL`; None:
    the line says only what stalled (a view that has not diagnosed it)."""
    if diagnosis is None:
        return "STALLED: %s" % what
    return "STALLED: %s \u2014 %s" % (what, diagnosis or CANNOT_TELL)
