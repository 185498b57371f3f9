"""Every rule over the evidence real stalls recorded (tests/data/evidence/*.json, the format in
tests/evidence_cases.py), in milliseconds a case: the rule, the sentence's facts and the advice —
or none — that are true of each case. To add a case: run its real test with
``LORA_OTEL_RECORD_EVIDENCE=<dir>``, copy the file here, write its ``expect`` (CONTRIBUTING.md)."""

from __future__ import annotations

import time
from pathlib import Path

import evidence_cases as cases
import pytest

from lora_otel.analysis.diagnose import RULES

PATHS = cases.paths()


def test_there_are_recorded_cases_of_many_rules() -> None:
    rules = {cases.load(p)["expect"]["rule"] for p in PATHS if cases.load(p).get("expect")}
    assert len(PATHS) >= 30 and len(rules) >= 10, sorted(rules)
    named = {rule.name for rule in RULES}
    assert rules <= named | {"none"}, rules - named


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_the_rules_say_what_is_true_of_the_case(path: Path) -> None:
    case = cases.load(path)
    assert case["case"] == path.stem and case.get("source"), "name the case by its file and the test that recorded it"
    started = time.perf_counter()
    found = cases.run(case)
    took = time.perf_counter() - started
    cases.check(found, case.get("expect"), path.name)
    assert took < 1.0, "%.3f s: a recorded case is explained in milliseconds" % took


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_with_no_evidence_but_the_state_there_is_no_step(path: Path) -> None:
    """The process's state alone (what /proc says it is doing) supports no step of the kind the
    case's advice gives: the advice comes from the deciding facts, not from the rule's name."""
    case = cases.load(path)
    keep = ("lora_otel.evidence.process.state",)
    found = cases.run(case, {k: v for k, v in case["evidence"].items() if k in keep})
    expect = case["expect"]
    if expect["advice"]:
        import re

        assert not all(re.search(p, found.advice) for p in expect["advice"]), found.advice
