"""The poll loop rule over the evidence real runs recorded (tests/data/evidence/poll_loop_*.json,
written by tests/test_poll_loops.py with ``LORA_OTEL_RECORD_EVIDENCE``): the rule, the sentence's
facts and the advice are checked with every case in tests/test_rules_over_evidence.py; here, the same
evidence with a fact taken away gives no step."""

from __future__ import annotations

from pathlib import Path

import evidence_cases as cases
import pytest

from lora_otel.analysis.polling import KEY

CASES = [p for p in cases.paths() if p.stem.startswith("poll_loop_")]


def load(path: Path) -> dict:
    return cases.load(path)


def run(case: dict, evidence: dict):
    return cases.run(case, evidence)


def test_there_are_recorded_cases() -> None:
    assert len(CASES) >= 4


# The rule over each case as recorded: tests/test_rules_over_evidence.py; here, the same words.


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_same_words_as_the_real_run(path: Path) -> None:
    case = load(path)
    assert run(case, case["evidence"]).sentence == case["diagnosis"]["sentence"]


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
