"""The poll loop rule over the evidence real runs recorded (tests/data/evidence/poll_loop_*.json,
written by tests/test_poll_loops.py with ``LORA_OTEL_RECORD_EVIDENCE``): the rule, the sentence's
facts and the advice, in milliseconds; and the same evidence with a fact taken away gives no step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.polling import KEY
from lora_otel.analysis.stall import Stall
from lora_otel.journal.records import Span

CASES = sorted((Path(__file__).resolve().parent / "data" / "evidence").glob("poll_loop_*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def run(case: dict, evidence: dict):
    stall = case["stall"]
    span = Span(stall["stage"], "a" * 16, None, "b" * 32, 1)
    return explain(
        Stall(stall["kind"], span, stall["open_for_s"], stall["limit_s"], ""), evidence, now_ns=case["now_ns"]
    )


def test_there_are_recorded_cases() -> None:
    assert len(CASES) >= 4


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_rule_over_recorded_evidence(path: Path) -> None:
    case = load(path)
    found = run(case, case["evidence"])
    expect = case["expect"]
    assert found.attrs["lora_otel.diagnosis.rule"] == expect["rule"]
    for fragment in expect["sentence"]:
        assert fragment in found.sentence, found.sentence
    for fragment in expect["advice"]:
        assert fragment in found.advice, found.advice
    assert found.attrs.get("lora_otel.diagnosis.advice") == (found.advice or None)
    assert found.sentence == case["diagnosis"]  # the same words as the real run's


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_without_the_polled_objects_state_there_is_no_step(path: Path) -> None:
    case = load(path)
    state = ("exists", "pid_state", "listening", "open_by", "recorded_pid")
    evidence = {k: v for k, v in case["evidence"].items() if not k.startswith(tuple(KEY + s for s in state))}
    found = run(case, evidence)
    assert found.advice == "", found.advice


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_a_frozen_process_or_one_not_asleep_is_not_a_poll_loop(path: Path) -> None:
    case = load(path)
    awake = {**case["evidence"], "lora_otel.evidence.process.wait_channel": "futex_wait_queue"}
    assert run(case, awake).attrs["lora_otel.diagnosis.rule"] != "poll loop"
