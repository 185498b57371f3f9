"""Issue 37 (hostile trial, item 6): the beat's dump of a frame's locals runs no code of the
program's and survives any value. A ``self.__dict__`` key of a ``str`` subclass whose ``__str__``
sleeps (or raises ``SystemExit``) once stalled the beat, so the watchdog wrote a second, wrong
"frozen" STALLED; an int too long to print emptied the frame's locals, so the polled path was
unknown. Real process: a ``LORA_OTEL=1`` job polling a leftover lock file through
``self.lock_file_path``, its stacks asked of the beat only (``LORA_OTEL_PY_SPY=0``)."""

from __future__ import annotations

import pytest
from test_poll_loops import BATON, job_lines, launch, stall_record, stop

pytestmark = pytest.mark.slow

JOB_HOSTILE = """\
import os, time, lora_otel
from file_baton import FileBaton


class Sleepy(str):
    def __str__(self):
        time.sleep(600)
        return "x"

    __format__ = __repr__ = lambda self, *a: time.sleep(600) or "x"


class Exiting(str):
    def __str__(self):
        raise SystemExit("the program's __str__ ran")

    __format__ = __repr__ = __str__


def jit_compile(build_directory):
    baton = FileBaton(os.path.join(build_directory, "lock"))
    baton.__dict__[Sleepy("sleepy")] = 1
    baton.__dict__[Exiting("exiting")] = 2
    baton.huge = 10 ** 5000
    baton.note = Sleepy("a value of a str subclass")
    if baton.try_acquire():
        raise SystemExit("the test expected the lock to be taken already")
    baton.wait()

with lora_otel.stage("load model"):
    jit_compile(os.path.join(os.getcwd(), "build"))
"""


def test_a_hostile_key_and_a_huge_int_neither_stall_the_beat_nor_hide_the_locals(tmp_path) -> None:
    """The job's why line names the polled lock file (its frame's locals are there), the stacks file
    shows the huge int as ``<int of N bits>``, the job is told of one stall only (no "frozen"/"no beat"
    line: the beat went on), and the job is still alive (nothing was raised into it)."""
    (tmp_path / "file_baton.py").write_text(BATON, encoding="utf-8")
    (tmp_path / "build").mkdir()
    lock = tmp_path / "build" / "lock"
    lock.write_bytes(b"")
    job = launch(tmp_path, JOB_HOSTILE, LORA_OTEL_PY_SPY="0")
    try:
        _, why = job_lines(tmp_path)
        assert "polls for %s to disappear" % lock in why, why
        record = stall_record(tmp_path, job.pid)
        assert record["kind"] != "frozen", record
        stacks = "".join(p.read_text(errors="replace") for p in (tmp_path / "j").rglob("*.stacks.txt"))
        assert "    local self.huge = <int of 16610 bits>\n" in stacks, stacks
        assert "local self.lock_file_path = '%s'" % lock in stacks
        assert "sleepy" not in stacks and "exiting" not in stacks and "self.note" not in stacks
        assert job.poll() is None, "the job ended: something was raised into it"
        log = (tmp_path / "log.txt").read_text(errors="replace")
        assert "no beat" not in log and "frozen" not in log, log
        assert log.count("] STALLED: ") == 1, log
    finally:
        stop(job)
