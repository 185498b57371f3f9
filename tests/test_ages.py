"""A diagnosis's growing durations (`lora_otel.analysis.ages`): marked while the sentence is built,
located in the stall record, and brought up to the time a view reads the record."""

from __future__ import annotations

from pathlib import Path

from lora_otel.analysis import ages
from lora_otel.analysis.diagnose import Diagnosis, explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.analysis.verdict import from_record
from lora_otel.journal.reader import read_journal
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
