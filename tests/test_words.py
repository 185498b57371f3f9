"""One formatter each for durations, times and the STALLED line (issue 37, item 3): the job's own
lines, the watchdog's, ``inspect``, ``watch`` and the report write the same figure the same way."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from lora_otel._boot import narrate
from lora_otel._boot.seam import duration, iso_time, stall_what, stalled_line
from lora_otel.analysis.learned import Learned
from lora_otel.analysis.stall import Stall
from lora_otel.analysis.verdict import Verdict
from lora_otel.export import watchdog
from lora_otel.journal.reader import format_duration
from lora_otel.journal.records import Span


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 ms"),
        (0.00005, "0.05 ms"),
        (0.014, "14 ms"),
        (0.46, "460 ms"),
        (0.9997, "1 s"),
        (2.314, "2.31 s"),
        (4.0, "4 s"),
        (12.34, "12.3 s"),
        (20.1, "20.1 s"),
        (312.4, "312 s"),
        (-3.0, "0 ms"),
        (None, "0 ms"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text
    if seconds is not None and seconds >= 0:
        assert format_duration(round(seconds * 1e9)) == text, "the views' name for it, in ns"


def _value(text: str) -> float:
    number, unit = text.split()
    return float(number) / (1000 if unit == "ms" else 1)


def test_duration_never_reads_a_time_past_its_limit_as_below_it() -> None:
    """Monotonic: ``open for 12 s (limit 12.6 s)`` cannot happen when both are written here."""
    values = [i / 997 for i in range(0, 200_000, 7)]
    shown = [_value(duration(v)) for v in values]
    assert all(a <= b for a, b in zip(shown, shown[1:]))


def test_iso_time_is_utc_with_milliseconds() -> None:
    for ns in (0, 1_764_540_828_123_456_789, 1_764_540_828_999_999_999):
        seconds, rest = divmod(ns, 1_000_000_000)
        moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
        assert iso_time(ns) == f"{moment:%Y-%m-%dT%H:%M:%S}.{rest // 1_000_000:03d}Z"
    assert watchdog.format_line(7, "hi", 1_764_540_828_123_456_789) == "[lora-otel][7][2025-11-30T22:13:48.123Z] hi\n"


def _span(name: str) -> Span:
    if name == "process":
        return Span("process", "a" * 16, None, "b" * 32, 1)
    return Span(name, "c" * 16, "a" * 16, "b" * 32, 1)


LEARNED = Learned("import x", 2.5, 3.0, 5, "5 earlier runs")


@pytest.mark.parametrize(
    ("stall", "want"),
    [
        (Stall("alive", _span("import x"), 20.1, 20.0, "r"), "STALLED: import x open for 20.1 s (limit 20 s) — D"),
        (
            Stall("alive", _span("training"), 19.4, 3.0, "r", limit_why="20x the median step of 150 ms"),
            "STALLED: training: no optimizer step for 19.4 s (limit 3 s: 20x the median step of 150 ms) — D",
        ),
        (
            Stall("between", _span("process"), 130.2, 120.0, "r", after="import torch"),
            "STALLED: no stage open for 130 s since import torch ended (limit 120 s) — D",
        ),
        (
            Stall("frozen", _span("load model"), 131.0, 10.0, "r", silent_s=10.46),
            "STALLED: frozen in load model: no beat for 10.5 s (limit 10 s) — D",
        ),
        (
            Stall("alive", _span("import x"), 31.0, 30.0, "r", learned=LEARNED),
            "STALLED: import x open for 31 s (limit 30 s: learned from 5 earlier runs, usually 2.5 s) — D",
        ),
    ],
)
def test_one_stalled_line_for_the_watchdog_and_every_view(stall: Stall, want: str) -> None:
    """The watchdog's line (the job's stderr) and a view's (`Verdict.line`: inspect, watch, the
    report) of the same stall are one text."""
    assert watchdog.stalled_line(stall, "D") == want
    record = watchdog.stall_record(stall, "D", {}, "watchdog", 10**18)
    open_s = stall.silent_s if stall.kind == "frozen" else stall.open_for_s
    view = Verdict(
        record["stage"],
        record["kind"],
        open_s,
        record["limit_s"],
        "D",
        "watchdog",
        record["learned"],
        record["evidence"],
        limit_why=record.get("limit_why", ""),
    )
    assert view.line() == want


def test_the_jobs_own_stalled_line_is_written_the_same_way() -> None:
    """The job's own line knows where its main thread is, not why: the same words and figures,
    then the place."""
    ep = narrate._Episode("stage", "x", "import x", 0)
    line = narrate._stalled(ep, 20.1, 20.0, None)
    assert (
        line
        == stalled_line(stall_what("import x", "alive", 20.1, 20.0), None)
        == "STALLED: import x open for 20.1 s (limit 20 s)"
    )
    ep = narrate._Episode("between", "x", "import torch", 0)
    assert (
        narrate._stalled(ep, 4.04, 4.0, None)
        == "STALLED: no stage open for 4.04 s since import torch ended (limit 4 s)"
    )


def test_a_view_without_a_diagnosis_says_only_what_stalled() -> None:
    assert stalled_line("import x open for 3 s", None) == "STALLED: import x open for 3 s"
    assert (
        stalled_line("import x open for 3 s", "") == "STALLED: import x open for 3 s — Cannot tell from the evidence."
    )
    assert re.fullmatch(r"died in load model after 45 s", stall_what("load model", "died", 45.0, None))
