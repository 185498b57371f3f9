"""Right about programs that are fine (issue 20): a test under freezegun or time-machine, a
notebook kernel sitting idle, a program under resource limits, a forking program on 3.12+, a
program that counts on its descriptor numbers. Each is a real traced program; what is asserted is
what its user sees (its output, its exit status, the journal's records, the files beside it)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals

YEAR = time.gmtime().tm_year


def run_job(tmp_path: Path, script: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(script)
    return subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def journal_text(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in journals(tmp_path / "lora-otel"))


def stacks_text(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (tmp_path / "lora-otel").glob("*.stacks.txt"))


# --- clocks the program patches ----------------------------------------------------------------

FROZEN = """\
import sys, time
lib, when = sys.argv[1:] if len(sys.argv) > 1 else (%r, %r)
import lora_otel
with lora_otel.stage("tests"):  # a job, in a stage
    if lib == "freezegun":
        import freezegun
        clock = freezegun.freeze_time(when)
    else:
        import time_machine
        clock = time_machine.travel(when, tick=False)
    with clock:
        time.sleep(8)  # neither library patches sleep: 8 real seconds at one frozen instant
print("done", flush=True)
"""


@pytest.mark.parametrize(
    ("lib", "when"),
    [("freezegun", "2020-01-01"), ("freezegun", "2040-01-01"), ("time_machine", "2020-01-01")],
)
def test_a_test_under_a_frozen_clock_is_not_frozen(tmp_path: Path, lib: str, when: str) -> None:
    """A user's test freezes time (freezegun's ``freeze_time``, time-machine's ``travel``) and waits
    8 real seconds, 4x the frozen limit: the job beats on the real clock, so it is not declared
    frozen, not signalled, its stacks not dumped; its lines and records carry the real time."""
    r = run_job(tmp_path, FROZEN % (lib, when), LORA_OTEL_FROZEN_AFTER="2", LORA_OTEL_NARRATE_S="1")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert "STALLED" not in r.stderr and "no beat" not in r.stderr, r.stderr
    text = journal_text(tmp_path)
    assert '"k":"stall"' not in text, text
    assert not stacks_text(tmp_path).strip()
    for line in r.stderr.splitlines():
        m = re.match(LINE_RE, line)
        if m:
            assert m.group(2).startswith(str(YEAR)), line
    stamps = [int(t) for t in re.findall(r'"ts":(\d+)', text)]
    assert stamps and all(time.gmtime(t / 1e9).tm_year == YEAR for t in stamps), sorted(set(stamps))[:5]


def test_a_mocked_sleep_does_not_make_the_beat_spin(tmp_path: Path) -> None:
    """A test replaces ``time.sleep`` with a mock (``unittest.mock.patch``) and waits 3 s for an
    event: the beat still sleeps a real second between beats (before, it called the mock
    thousands of times, spinning a core); the program's mock is called only by the program."""
    script = """\
import threading
from unittest import mock
import lora_otel
with lora_otel.stage("tests"), mock.patch("time.sleep") as sleep:
    threading.Event().wait(3)
print("sleep called %d times" % sleep.call_count, flush=True)
"""
    r = run_job(tmp_path, script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "sleep called 0 times\n", r.stderr
