"""A thread that ends by an uncaught exception is journaled (``thread exception``, through a
wrapper of ``threading.excepthook`` that always runs the hook it wraps), and a main thread left
waiting on a queue that thread filled is told why (red-rover#23): real jobs, and the rule over
recorded evidence with and without that event."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import evidence_cases as cases
import pytest
from procs import PYTHON, clean_env, wait_for
from test_local_beat import launch_detached, stop
from test_pools import inspect_text, stalled_with, top

from lora_otel.journal.reader import read_journal

PREFETCH_PY = """import argparse, queue, threading
argparse.ArgumentParser().parse_known_args()
import torch
batches = queue.Queue(maxsize=4)

def prefetch():
    for i in range(100):
        if i == 3:
            raise OSError("corrupt shard: data/shard-0003.tar")
        batches.put(i)

threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
for step in range(100):
    batch = batches.get()
"""

OWN_HOOK_PY = """import sys, threading, time
time.sleep(2.5)  # a job by now (promoted at its first beat), the hook wrapped
def mine(args):
    print("mine:", args.exc_type.__name__, args.thread.name, flush=True)
threading.excepthook = mine if sys.argv[1] == "after" else threading.excepthook
def boom():
    raise ValueError("bad row 7")
t = threading.Thread(target=boom, name="loader")
t.start()
t.join()
def quiet():
    raise SystemExit(0)
t = threading.Thread(target=quiet, name="quitter")
t.start()
t.join()
"""

CASE = cases.DATA / "queue_filler_thread_raised.json"


@pytest.mark.slow
def test_a_queue_whose_filler_thread_raised(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(PREFETCH_PY)
    proc = launch_detached(tmp_path, "job.py", LORA_OTEL_STALL_AFTER="between=3")
    log = tmp_path / "log.txt"
    try:
        [line] = wait_for(lambda: stalled_with(log, "thread prefetch ended"), timeout=120, what="the why line")
        assert re.search(
            r"the main thread waits in Queue\.get\(\) at job\.py:14 in <module> .*; thread prefetch ended at "
            r"[\d:TZ.-]+ by an uncaught OSError \(\"corrupt shard: data/shard-0003\.tar\"\) raised at job\.py:9 in "
            r"prefetch, so it will not put or set anything more\.",
            line,
        ), line
        text = log.read_text()
        assert "what to do: Fix the OSError that thread prefetch raised at job.py:9 in prefetch" in text, text
        assert "Exception in thread prefetch" in text  # the interpreter's own hook still ran
        assert "thread prefetch ended" in inspect_text(tmp_path)
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_the_programs_own_hook_runs(tmp_path: Path, when: str) -> None:
    """The program's hook runs: one it installs after ours replaces the wrapper (not journaled
    then); the default one (``before``: ours wraps it) still prints, and the error is journaled.
    A thread's SystemExit is no error."""
    (tmp_path / "job.py").write_text(OWN_HOOK_PY)
    done = subprocess.run(
        [PYTHON, "job.py", when],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    job = wait_for(lambda: top(tmp_path), timeout=60, what="the journal")
    events = [a for _, name, a in read_journal(job.path).root.events if name == "thread exception"]
    if when == "after":
        assert "mine: ValueError loader" in done.stdout, done.stdout
    else:
        assert "Exception in thread loader" in done.stderr and "ValueError: bad row 7" in done.stderr, done.stderr
        assert [
            (e["thread.name"], e["exception.type"], e["exception.message"], e["code.function"]) for e in events
        ] == [("loader", "ValueError", "bad row 7", "boom")], events


def test_recorded_queue_filler_thread_raised() -> None:
    case = cases.load(CASE)
    cases.check(cases.run(case), case["expect"], CASE.name)


def test_without_the_thread_exception_no_thread_is_blamed() -> None:
    case = copy.deepcopy(cases.load(CASE))
    case["journal"]["records"] = [r for r in case["journal"]["records"] if r.get("name") != "thread exception"]
    found = cases.run(case)
    assert found.attrs.get(cases.RULE) != "thread ended", found.sentence
    assert "prefetch" not in found.sentence and "OSError" not in found.advice, found
