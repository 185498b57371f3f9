"""The recorder (`lora_otel.analysis.recording`, ``LORA_OTEL_RECORD_EVIDENCE=<dir>``): a stall's
evidence and journal written as a case in tests/evidence_cases.py's format, redacted, the job's
paths made generic; explained again from the file, it gives the same diagnosis. Pure: no process."""

from __future__ import annotations

import json
from pathlib import Path

import evidence_cases as cases

from lora_otel.analysis import recording
from lora_otel.analysis.diagnose import explain
from lora_otel.journal.reader import read_journal

SECRET = "hf_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF"


def a_live_case(tmp_path: Path) -> tuple[dict, Path]:
    """A recorded case (a job reading a FIFO whose writer sleeps) as it would be live: its journal
    a real file under ``tmp_path``, whose working directory it is, and a secret on a command line."""
    case = cases.load("fifo_read_writer_sleeps")
    text = json.dumps(case["evidence"]).replace("/work/job", str(tmp_path)).replace("[REDACTED]", SECRET)
    journal = tmp_path / "lora-otel" / "job.otel.jsonl"
    journal.parent.mkdir()
    start = {
        "v": 1,
        "k": "start",
        "ts": 1,
        "trace_id": "b" * 32,
        "span_id": "c" * 16,
        "parent_id": None,
        "name": "process",
        "pid": case["journal"]["pid"],
        "attrs": {"process.working_directory": str(tmp_path), "process.pid": case["journal"]["pid"]},
    }
    journal.write_text(json.dumps(start) + "\n")
    return {**case, "evidence": json.loads(text)}, journal


def test_unset_records_nothing(tmp_path: Path) -> None:
    case, path = a_live_case(tmp_path)
    journal = read_journal(path)
    stall = cases.stall_of(case, journal)
    found = explain(stall, case["evidence"], journal)
    assert recording.record(stall, case["evidence"], journal, found, env={}) is None
    assert recording.record(stall, case["evidence"], journal, found, env={recording.ENV: "0"}) is None


def test_a_recording_is_a_case_that_explains_the_same_way(tmp_path: Path) -> None:
    case, path = a_live_case(tmp_path)
    journal = read_journal(path)
    stall = cases.stall_of(case, journal)
    found = explain(stall, case["evidence"], journal)
    out = tmp_path / "recorded"
    written = recording.record(
        stall, case["evidence"], journal, found, now_ns=5, source="a test", env={recording.ENV: str(out)}
    )
    assert written is not None and Path(written).parent == out
    text = Path(written).read_text(encoding="utf-8")
    assert SECRET not in text and "[REDACTED]" in text
    assert str(tmp_path) not in text and "/job/in.fifo" in text
    again = json.loads(text)
    assert again["case"] == "descriptor_wait-%d" % case["journal"]["pid"] and again["expect"] is None
    assert again["journal"]["records"][0]["name"] == "process"
    assert again["diagnosis"]["rule"] == found.attrs["lora_otel.diagnosis.rule"]
    redone = cases.run(again)
    assert redone.sentence == again["diagnosis"]["sentence"]
    assert redone.advice == again["diagnosis"]["advice"] and redone.advice


def test_a_journal_that_cannot_be_read_is_recorded_by_its_fields(tmp_path: Path) -> None:
    case, path = a_live_case(tmp_path)
    journal = read_journal(path)
    path.unlink()
    fields = recording.journal_case(journal)
    assert "records" not in fields and fields["pid"] == case["journal"]["pid"]
    assert cases.journal_of(fields).pid == journal.pid
