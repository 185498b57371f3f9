"""Every rule over the evidence real stalls recorded (tests/data/evidence/*.json, the format in
tests/evidence_cases.py), in milliseconds a case: the rule, the sentence's facts and the advice —
or none — that are true of each case. To add a case: run its real test with
``LORA_OTEL_RECORD_EVIDENCE=<dir>``, copy the file here, write its ``expect`` (CONTRIBUTING.md)."""

from __future__ import annotations

import re
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
def test_without_the_deciding_facts_there_is_no_such_step(path: Path) -> None:
    """Only the process's state left (what /proc says it does): no evidence, no journal, no peers.
    The case's advice does not come back: a step comes from the deciding facts, never from the
    rule's name alone."""
    case = cases.load(path)
    expect = case["expect"]
    if not expect["advice"]:
        return
    state = "lora_otel.evidence.process.state"
    bare = {**case, "journal": None, "peers": [], "peer_stacks": {}}
    found = cases.run(bare, {k: v for k, v in case["evidence"].items() if k == state})
    assert not all(re.search(p, found.advice) for p in expect["advice"]), found.advice
