"""A wait for a multiprocessing lock (a semaphore shared between processes): a real job whose
worker is SIGKILLed holding it (birdnet#73), told from the parent's ``child exit`` events; and the
rule over recorded evidence, with and without the killed child."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import evidence_cases as cases
import pytest
from procs import wait_for
from test_local_beat import launch_detached, stop
from test_pools import inspect_text, stalled_with

KILLED_HOLDER_PY = """import argparse, os, signal, multiprocessing
argparse.ArgumentParser().parse_known_args()
import torch

def work(lock):
    lock.acquire()
    os.kill(os.getpid(), signal.SIGKILL)  # killed inside its critical section (the OOM killer's way)

if __name__ == "__main__":
    lock = multiprocessing.Lock()
    p = multiprocessing.Process(target=work, args=(lock,))
    p.start()
    p.join()
    open("killed.pid", "w").write(str(p.pid))
    with lock:
        pass
"""

CASE = cases.DATA / "mp_lock_holder_killed.json"


@pytest.mark.slow
def test_a_lock_whose_holder_was_killed(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(KILLED_HOLDER_PY)
    out = cases.record_dir()
    extra = {"LORA_OTEL_RECORD_EVIDENCE": str(out)} if out is not None else {}
    proc = launch_detached(tmp_path, "job.py", LORA_OTEL_STALL_AFTER="between=3", **extra)
    log = tmp_path / "log.txt"
    try:
        [line] = wait_for(lambda: stalled_with(log, "multiprocessing lock"), timeout=120, what="the why line")
        pid = int((tmp_path / "killed.pid").read_text())
        assert re.search(
            r"The main thread waits for a multiprocessing lock \(lock\) at job\.py:15 in <module> — a semaphore "
            r"shared between processes; its child pid %d was killed by SIGKILL at [\d:TZ.-]+, and no other child "
            r"of it is alive to release it" % pid,
            line,
        ), line
        assert "what to do: Restart the job" in log.read_text()
        assert "pid %d was killed by SIGKILL" % pid in inspect_text(tmp_path)
    finally:
        stop(proc)


def test_recorded_killed_holder() -> None:
    case = cases.load(CASE)
    found = cases.run(case)
    cases.check(found, case["expect"], CASE.name)


def test_without_the_killed_child_only_the_wait_is_said() -> None:
    """The same evidence without the parent's record of its child's death: the wait is named (a
    multiprocessing lock), no holder is blamed, no advice."""
    case = copy.deepcopy(cases.load(CASE))
    records = case["journal"]["records"]
    case["journal"]["records"] = [
        r for r in records if not (r.get("k") == "event" and (r.get("attrs") or {}).get("child.signal"))
    ]
    found = cases.run(case)
    assert found.attrs.get(cases.RULE) == "process lock", found.sentence
    assert "waits for a multiprocessing lock" in found.sentence and "killed" not in found.sentence, found.sentence
    assert found.advice == ""


def test_a_child_still_alive_may_hold_it() -> None:
    """A child of the same job that still runs could release the lock: it is named, no advice."""
    case = copy.deepcopy(cases.load(CASE))
    pid = case["journal"]["pid"]
    root = next(r for r in case["journal"]["records"] if r.get("k") == "start" and r.get("parent_id") is None)
    child = dict(root, pid=pid + 100, ppid=pid, span_id="f" * 16)
    child["attrs"] = dict(root.get("attrs") or {}, **{"process.pid": pid + 100, "process.parent_pid": pid})
    case["peers"] = [{"path": "/job/lora-otel/child.otel.jsonl", "records": [child]}]
    found = cases.run(case)
    assert found.attrs.get(cases.RULE) == "process lock", found.sentence
    assert "pid %d still runs and may hold it" % (pid + 100) in found.sentence, found.sentence
    assert found.advice == ""


def _with_stacks(case: dict, stacks: str) -> dict:
    case = copy.deepcopy(case)
    case["evidence"]["lora_otel.evidence.python.stacks"] = stacks
    case["evidence"].pop("lora_otel.evidence.py_spy.dump", None)
    return case


def test_another_thread_at_work_may_hold_it() -> None:
    """A thread of the parent itself, at work in the program's code, could hold the lock: no dead
    holder is concluded, no advice."""
    case = cases.load(CASE)
    stacks = case["evidence"]["lora_otel.evidence.python.stacks"] + (
        '\nThread 0x0000000000001350 (most recent call first):\n  File "/job/job.py", line 30 in writer\n'
        '  File "/python/lib/python3.11/threading.py", line 975 in run\n'
        '  File "/python/lib/python3.11/threading.py", line 1038 in _bootstrap_inner\n'
        '  File "/python/lib/python3.11/threading.py", line 995 in _bootstrap\n'
    )
    found = cases.run(_with_stacks(case, stacks))
    assert found.attrs.get(cases.RULE) == "process lock", found.sentence
    assert "thread writer() of this process still runs and may hold it" in found.sentence, found.sentence
    assert found.advice == ""


def test_the_main_thread_holds_it_itself(tmp_path: Path) -> None:
    """``with lock:`` inside ``with lock:`` (a Lock, not an RLock): the main thread is its own
    holder, whatever became of the children."""
    job = tmp_path / "job.py"
    job.write_text("import multiprocessing\nlock = multiprocessing.Lock()\nwith lock:\n    with lock:\n        pass\n")
    stacks = (
        "Current thread 0x0000000000001347 (most recent call first):\n"
        '  File "/python/lib/python3.11/multiprocessing/synchronize.py", line 95 in __enter__\n'
        '  File "%s", line 4 in <module>\n' % job
    )
    found = cases.run(_with_stacks(cases.load(CASE), stacks))
    assert found.attrs.get(cases.RULE) == "process lock", found.sentence
    assert "holds that lock already" in found.sentence and "killed" not in found.sentence, found.sentence
    assert "RLock" in found.advice
