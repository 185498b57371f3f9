"""Recorded evidence of real stalls (tests/data/evidence/*.json), in one format, and what the rules
must say over it: the loader of tests/test_rules_over_evidence.py and of any test that reads a case.

One file per case::

    {
     "case": "fifo_open_no_writer",           # the file's stem
     "source": "tests/test_waits.py ...",      # the test (real run) that recorded it
     "stall": {"kind": "alive"|"frozen"|"between", "stage": "ask", "open_for_s": 30.0, "limit_s": 2.0,
               "attrs": {...}, "after": null, "reason": "", "frozen_after_s": null},   # the last four optional
     "now_ns": 1796667610391086308,           # when the evidence was gathered (null: not read)
     "journal": {"pid": 4712, "main_frames": [[file, line, function], ...], "root_attrs": {...},
                 "path": "/job/lora-otel/x.otel.jsonl", "records": [...]},          # or null: none
     "peers": [<journal>, ...],               # optional: the job's other processes' journals
     "peer_stacks": {"<journal path>": "<Python stacks>"},                         # optional
     "evidence": {"lora_otel.evidence.process.state": "S (sleeping)", ...},         # evidence.gather's keys
     "expect": {"rule": "FIFO", "sentence": [regex, ...], "advice": [regex, ...] or ""},
     "diagnosis": {"rule": ..., "sentence": ..., "advice": ...}                     # optional: the real run's words
    }

A journal is its ``records`` (the journal's lines, the beats but the last left out) where the rules
read more than its pid, main thread's frames and root attributes; otherwise those three fields.
A journal with no ``exit`` record counts as running (its process ran when the evidence was read).
``expect.sentence``/``expect.advice`` are regular expressions each searched in the sentence/advice;
``"advice": ""`` says the evidence supports no step, so the diagnosis must give none. ``expect`` is
what is *true* about the case, written by whoever adds the file, not copied from the diagnosis.

Recording: run the real test with ``LORA_OTEL_RECORD_EVIDENCE=<dir>`` in its environment; the
sidecar, the local watchdog and ``inspect`` write one such file per diagnosis there
(`lora_otel.analysis.recording`, ``expect`` null); the tests' own ``record`` helpers write there too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import pytest

import lora_otel.analysis
from lora_otel.analysis.diagnose import Diagnosis, explain
from lora_otel.analysis.stall import FROZEN_AFTER_S, Stall
from lora_otel.journal.reader import Journal
from lora_otel.journal.records import JournalBuilder, Span

DATA = Path(__file__).resolve().parent / "data" / "evidence"
RULE = "lora_otel.diagnosis.rule"


def record_dir() -> Optional[Path]:
    """Where a test records its case: the directory ``LORA_OTEL_RECORD_EVIDENCE`` names (``1``:
    tests/data/evidence itself), or None: not recording."""
    value = os.environ.get("LORA_OTEL_RECORD_EVIDENCE", "")
    if value in ("", "0"):
        return None
    out = DATA if value == "1" else Path(value)
    out.mkdir(parents=True, exist_ok=True)
    return out


def record_explained(stall: Stall, evidence: dict[str, Any], journal: Optional[Journal], source: str) -> None:
    """For a test that gathers and diagnoses by itself (not through the sidecar): with
    ``LORA_OTEL_RECORD_EVIDENCE=<dir>``, record the case as the sidecar would (`recording.record`)."""
    out = record_dir()
    if out is not None:
        from lora_otel.analysis import recording

        found = explain(stall, evidence, journal)
        recording.record(stall, evidence, journal, found, source=source, env={recording.ENV: str(out)})


def paths() -> list[Path]:
    return sorted(DATA.glob("*.json"))


def load(path: Path | str) -> dict[str, Any]:
    """The case at ``path`` (or named so under tests/data/evidence)."""
    path = Path(path)
    if not path.suffix:
        path = DATA / ("%s.json" % path)
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def journal_of(fields: dict[str, Any], name: str = "job") -> Journal:
    """The `Journal` a case's journal fields describe."""
    path = fields.get("path") or "/job/lora-otel/%s.otel.jsonl" % name
    if "records" in fields:
        builder = JournalBuilder(path)
        for number, record in enumerate(fields["records"], start=1):
            builder.feed_line(number, json.dumps(record).encode())
        return builder.finish()
    root = Span("process", "c" * 16, None, "b" * 32, 1, attrs=dict(fields.get("root_attrs") or {}))
    return Journal(path=path, spans=[root], root=root, pid=fields.get("pid"), main_frames=fields.get("main_frames"))


def journals_of(case: dict[str, Any]) -> tuple[Optional[Journal], list[Journal]]:
    """The case's journal (None: none) and its peers."""
    job = journal_of(case["journal"]) if case.get("journal") else None
    peers = [journal_of(p, "peer%d" % i) for i, p in enumerate(case.get("peers") or [], start=1)]
    return job, peers


def stall_of(case: dict[str, Any], job: Optional[Journal]) -> Stall:
    s = case["stall"]
    named = [sp for sp in (job.spans if job is not None else []) if sp.name == s.get("stage") and sp.end_ns is None]
    if job is not None and job.root is not None and (s["kind"] == "between" or s.get("stage") == job.root.name):
        span = job.root
    elif named:
        span = named[-1]  # the journal's own span (its parent, its attributes)
    else:
        span = Span(s.get("stage") or "process", "a" * 16, None, "b" * 32, 1, attrs=dict(s.get("attrs") or {}))
    return Stall(s["kind"], span, s["open_for_s"], s["limit_s"], s.get("reason") or "", after=s.get("after"))


@contextmanager
def running(journals: list[Journal]) -> Iterator[None]:
    """The journals with no exit (and no exec) count as running, as their processes were when the
    evidence was read: every analysis module's ``process_state`` answers so for them."""
    alive = {j.path for j in journals if j.exit is None and j.exec is None}
    with pytest.MonkeyPatch.context() as mp:
        for name in dir(lora_otel.analysis):
            module = getattr(lora_otel.analysis, name)
            real = getattr(module, "process_state", None)
            if real is not None and hasattr(module, "__file__"):
                mp.setattr(module, "process_state", lambda j, real=real: "running" if j.path in alive else real(j))
        yield


def run(case: dict[str, Any], evidence: Optional[dict[str, Any]] = None) -> Diagnosis:
    """``explain`` over the case (over ``evidence`` instead of its own, when given)."""
    import lora_otel.analysis.pools  # noqa: F401 - imported, so that `running` patches it

    job, peers = journals_of(case)
    stall = stall_of(case, job)
    frozen = case["stall"].get("frozen_after_s")
    with running(([job] if job else []) + peers):
        return explain(
            stall,
            case["evidence"] if evidence is None else evidence,
            job,
            peers,
            case.get("peer_stacks") or None,
            case.get("now_ns"),
            FROZEN_AFTER_S if frozen is None else frozen,
        )


def check(found: Diagnosis, expect: Optional[dict[str, Any]], where: str = "") -> None:
    """``found`` says what ``expect`` says is true: the rule, each sentence and advice pattern; no
    advice where ``expect["advice"]`` is ``""``; the advice attribute equal to the advice."""
    shown = "%s\n%s\n(advice: %s)" % (where, found.sentence, found.advice)
    assert expect, "%s: no expect — write what is true about the case (tests/evidence_cases.py)" % where
    assert found.attrs[RULE] == expect["rule"], shown
    assert expect["sentence"], "%s: say what the sentence must say" % where
    for pattern in expect["sentence"]:
        assert re.search(pattern, found.sentence), (pattern, shown)
    if expect["advice"] == "":
        assert found.advice == "" and "lora_otel.diagnosis.advice" not in found.attrs, shown
    else:
        assert expect["advice"], '%s: advice is a list of patterns, or "" for none' % where
        for pattern in expect["advice"]:
            assert re.search(pattern, found.advice), (pattern, shown)
        assert found.attrs.get("lora_otel.diagnosis.advice") == found.advice, shown


def literal(text: str) -> str:
    """``text`` as a pattern that matches it (spaces kept readable)."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


def add(recorded: Path, name: str, source: str, expect: dict[str, Any]) -> Path:
    """Add the recording at ``recorded`` (the recorder's file) as tests/data/evidence/<name>.json,
    with the test that recorded it and what is true about it."""
    case = json.loads(recorded.read_text(encoding="utf-8"))
    case["case"], case["source"], case["expect"] = name, source, expect
    path = DATA / ("%s.json" % name)
    path.write_text(json.dumps(case, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":  # PYTHONPATH=. python tests/evidence_cases.py RECORDED NAME --source ... --rule ...
    import argparse

    parser = argparse.ArgumentParser(description="Add a recorded case, with what is true about it.")
    parser.add_argument("recorded", type=Path)
    parser.add_argument("name")
    parser.add_argument("--source", required=True, help="the test that recorded it, e.g. tests/test_full_pipe.py")
    parser.add_argument("--rule", required=True)
    parser.add_argument("--sentence", action="append", required=True, help="a regex the sentence must match")
    parser.add_argument("--advice", action="append", default=[], help="a regex the advice must match")
    parser.add_argument("--no-advice", action="store_true", help="the evidence supports no step")
    args = parser.parse_args()
    if bool(args.advice) == args.no_advice:
        parser.error("give --advice patterns or --no-advice")
    print(
        add(
            args.recorded,
            args.name,
            args.source,
            {
                "rule": args.rule,
                "sentence": args.sentence,
                "advice": "" if args.no_advice else args.advice,
            },
        )
    )
