"""A diagnosis's growing durations (`lora_otel.analysis.ages`): marked while the sentence is built,
located in the stall record, and brought up to the time a view reads the record."""

from __future__ import annotations

from pathlib import Path

from lora_otel.analysis import ages
from lora_otel.analysis.diagnose import Diagnosis, explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.analysis.verdict import from_record
from lora_otel.journal.reader import format_duration, read_journal
from lora_otel.journal.records import Span


def test_outside_collecting_a_growing_duration_is_plain_text() -> None:
    assert ages.growing(5_250_000_000) == "5.25 s"


def test_marks_resolve_to_offsets_and_a_later_reading_grows_only_them() -> None:
    with ages.collecting() as found:
        sentence = "sampled over %s, waited %s, then %s." % (
            "5.25 s",  # a fixed duration that reads like the growing one: left as it is
            ages.growing(5_250_000_000),
            ages.growing(2e9),
        )
    text, where = ages.resolve(sentence, found)
    assert text == "sampled over 5.25 s, waited 5.25 s, then 2 s."
    assert [text[o : o + n] for o, n, _ in where] == ["5.25 s", "2 s"]
    assert ages.aged(text, where, 18_000_000_000) == "sampled over 5.25 s, waited 23.2 s, then 20 s."
    assert ages.aged(text, where, 0) == text


def test_ages_that_do_not_fit_the_sentence_are_left_alone() -> None:
    """A record edited by hand, or a sentence that is not the one the ages were taken on."""
    text = "waited 5.25 s."
    for bad in ([[7, 6, 1]], [[99, 6, 5_250_000_000]], [["7", 6, 5_250_000_000]], "x", None, [[7, 6]]):
        assert ages.aged(text, bad, 10**9) == text, bad
    assert ages.aged(text, [[7, 6, 5_250_000_000]], 10**9) == "waited 6.25 s."


def test_a_prefix_shifts_the_ages() -> None:
    found = Diagnosis("waited 5.25 s.", {}, [[7, 6, 5_250_000_000]])
    moved = ages.shifted(found.ages, len("Slower than the baseline; "))
    text = "Slower than the baseline; " + found.sentence
    assert ages.aged(text, moved, 10**9) == "Slower than the baseline; waited 6.25 s."


def test_explain_gives_the_ages_of_its_sentence() -> None:
    """The DataLoader rule's "for 30 s" grows; the stall's other words do not."""
    span = Span("training", "a" * 16, None, "b" * 32, 1)
    stall = Stall("alive", span, 30.0, 5.0, "training open for 30 s (limit 5 s)")
    stacks = (
        "Current thread 0x1 (most recent call first):\n"
        '  File "/x/torch/utils/data/dataloader.py", line 5 in _next_data\n'
        '  File "/w/train.py", line 9 in <module>\n'
    )
    found = explain(stall, {PREFIX + "python.stacks": stacks})
    assert "for 30 s" in found.sentence, found.sentence
    assert "\ue000" not in found.sentence and "\ue001" not in found.sentence
    [[offset, length, ns]] = found.ages
    assert found.sentence[offset : offset + length] == "30 s" and ns == 30_000_000_000


def test_a_view_reads_the_record_as_of_now(tmp_path: Path) -> None:
    """`from_record` (inspect, watch, the report) of a journal whose process is still running: the
    diagnosis's duration grows by the time since the record, as the headline's does."""
    import json
    import os

    path = tmp_path / "job.otel.jsonl"
    start = 1_000_000_000_000
    records = [
        {"v": 1, "k": "start", "ts": start, "span_id": "a" * 16, "trace_id": "b" * 32, "name": "process",
         "parent_id": None, "pid": os.getpid(), "attrs": {}},
        {"v": 1, "k": "stall", "ts": start + 30 * 10**9, "span_id": None, "stage": None, "kind": "between",
         "limit_s": 5.0, "open_s": 30.0, "diagnosis": "The main thread waits for its Pool for 30 s.",
         "by": "watchdog", "ages": [[39, 4, 30 * 10**9]]},
    ]  # fmt: skip
    assert records[1]["diagnosis"].index("30 s") == 39
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    journal = read_journal(path)
    verdict = from_record(journal, start + 48 * 10**9)
    assert verdict is not None and verdict.open_s == 48.0, verdict
    assert verdict.diagnosis == "The main thread waits for its Pool for 48 s.", verdict.diagnosis
    assert from_record(journal).diagnosis == "The main thread waits for its Pool for 30 s."


def journal_with(tmp_path: Path, stall: dict, *, start_ago_s: float = 60.0, beat_after: bool = False) -> tuple:
    """A journal of this (running) process started ``start_ago_s`` ago with one ``stall`` record
    (``ts`` as given, relative to now in seconds under ``at_s``), optionally a beat after it."""
    import json
    import os
    import time

    now = time.time_ns()
    start = now - int(start_ago_s * 1e9)
    records = [
        {"v": 1, "k": "start", "ts": start, "span_id": "a" * 16, "trace_id": "b" * 32, "name": "process",
         "parent_id": None, "pid": os.getpid(), "config": {"beat_s": 1.0, "beat_record_every": 60}, "attrs": {}},
        {"v": 1, "k": "stall", "span_id": None, "stage": None, "limit_s": 5.0, "by": "watchdog",
         **{k: v for k, v in stall.items() if k != "at_s"}, "ts": now + int(stall["at_s"] * 1e9)},
    ]  # fmt: skip
    if beat_after:
        records.append({"v": 1, "k": "beat", "ts": now - 8 * 10**9, "steps": 0, "last_step_ts": None})
    path = tmp_path / "job.otel.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.utime(path, ns=(start, start))  # no touch since the start: the records say when it lived
    return read_journal(path), now


POOL = "The main thread waits for its Pool for 30 s."


def test_hand_edited_numbers_past_belief_are_not_read(tmp_path: Path) -> None:
    """From the hostile trial: an age of 10**400 ns, or an ``open_s``/``limit_s`` of 10**400 or
    1e300, crashed inspect, watch and the report with OverflowError. Now the age is left as
    written and such an ``open_s`` or ``limit_s`` is no figure at all."""
    journal, now = journal_with(
        tmp_path, {"at_s": -30, "kind": "between", "open_s": 30.0, "diagnosis": POOL, "ages": [[39, 4, 10**400]]}
    )
    verdict = from_record(journal, now)
    assert verdict is not None and verdict.diagnosis == POOL
    for bad in ({"open_s": 10**400}, {"open_s": 1e300}, {"limit_s": 1e300}, {"limit_s": 10**400}):
        stall = {"at_s": -30, "kind": "between", "open_s": 30.0, "diagnosis": POOL, **bad}
        journal, now = journal_with(tmp_path, stall)
        verdict = from_record(journal, now)
        assert verdict is not None, bad
        assert verdict.line().startswith("STALLED: no stage open for "), (bad, verdict.line())
        assert len(verdict.line()) < 200, verdict.line()


def test_a_frozen_record_followed_by_a_beat_no_longer_holds(tmp_path: Path) -> None:
    """From the hostile trial: a job frozen, recorded, then beating again read `frozen: no beat for
    375 ms (limit 10 s) — … (no beat for 12 s)`. A beat after the record ends that stall."""
    stall = {"at_s": -10, "kind": "frozen", "open_s": 12.0, "diagnosis": "The process is frozen (no beat for 12 s)."}
    journal, now = journal_with(tmp_path, stall, beat_after=True)
    assert from_record(journal, now) is None
    journal, now = journal_with(tmp_path, stall)
    verdict = from_record(journal, now)
    assert verdict is not None and verdict.kind == "frozen"


def test_a_record_dated_before_the_process_is_capped_at_its_age(tmp_path: Path) -> None:
    """From the hostile trial: a record with ``ts`` 0 read `no stage open for 1796320248 s` under a
    tree line saying the process is 91 s old. The stall lasts at most as long as the process."""
    stall = {"at_s": -3600, "kind": "between", "open_s": 30.0, "diagnosis": POOL, "ages": [[39, 4, 30 * 10**9]]}
    journal, now = journal_with(tmp_path, stall, start_ago_s=60)
    verdict = from_record(journal, now)
    assert verdict is not None and verdict.open_s is not None and 59 <= verdict.open_s <= 61, verdict
    assert verdict.diagnosis.endswith("for %s." % format_duration(round(verdict.open_s * 1e9))), verdict.diagnosis
