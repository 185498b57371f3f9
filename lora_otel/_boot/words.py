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
