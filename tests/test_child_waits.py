"""A parent joining a child that has not ended: what the child waits on itself (issue 37,
`lora_otel.analysis.childwaits`). The fast tests read recorded evidence
(tests/data/evidence/join_before_draining_a_queue.json, lock_held_at_fork_child_joined.json); the
slow one runs a real job that hangs (CPython#91594: ``Process.join()`` before ``Queue.get()``)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import evidence_cases as cases
import pytest
from procs import wait_for
from test_local_beat import launch_detached, stop
from test_pools import START, inspect_text, stalled_with, workers

from lora_otel.analysis import childwaits

DATA = Path(__file__).parent / "data" / "evidence"
KEY = "lora_otel.evidence.wait.threads"


def _case(name: str) -> dict:
    return cases.load(DATA / ("%s.json" % name))


def test_a_feeder_blocked_on_the_pipe_the_parent_holds_says_each_waits_for_the_other() -> None:
    found = cases.run(_case("join_before_draining_a_queue"))
    assert re.search(r"feeder thread \(thread \d+; .*\) waits to write to a pipe \(pipe:\[\d+\]", found.sentence)
    assert "whose read end this process holds" in found.sentence and "each waits for the other" in found.sentence
    assert "Queue.get()" in found.advice


def test_a_plain_thread_on_such_a_pipe_gets_the_generic_step_not_the_queue_one() -> None:
    """No queue's frames in the child (its main thread does not join a feeder): a pipe's step."""
    case = copy.deepcopy(_case("join_before_draining_a_queue"))
    for row in case["evidence"]["lora_otel.evidence.process.children"]:
        row["frames"] = [f for f in row.get("frames") or () if "queues.py" not in f[0]]
    for peer in case["peers"]:
        peer["main_frames"] = [f for f in peer.get("main_frames") or () if "queues.py" not in f[0]]
        peer.pop("records", None)
    found = cases.run(case)
    assert "feeder" not in found.sentence and re.search(r"its thread \d+ waits to write to a pipe", found.sentence)
    assert "each waits for the other" in found.sentence
    assert "Queue" not in found.advice and "Read the pipe's end in the parent" in found.advice


def test_without_the_wait_facts_the_child_is_named_by_its_place_only() -> None:
    case = copy.deepcopy(_case("join_before_draining_a_queue"))
    del case["evidence"][KEY]
    found = cases.run(case)
    assert "has not ended" in found.sentence and "waits to write" not in found.sentence and not found.advice


def test_a_lock_in_a_child_forked_while_threads_ran() -> None:
    found = cases.run(_case("lock_held_at_fork_child_joined"))
    assert "waits to acquire a lock at job.py:18 in load" in found.sentence
    assert "forked while 2 other threads of the parent ran" in found.sentence
    assert "spawn" in found.advice


def test_a_lock_with_no_other_thread_at_the_fork_gives_no_step() -> None:
    row = _case("lock_held_at_fork_child_joined")["evidence"]["lora_otel.evidence.process.children"][0]
    said = childwaits.lock_wait(row, 0)
    assert said is not None and "acquire a lock" in said.phrase and "fork" not in said.phrase and not said.advice
    assert childwaits.lock_wait(row, None) == said


def test_a_join_in_the_standard_library_is_not_called_a_lock_wait() -> None:
    row = _case("join_before_draining_a_queue")["evidence"]["lora_otel.evidence.process.children"][0]
    assert childwaits.lock_wait(row, 3) is None


JOIN_PY = (
    START
    + """import multiprocessing

def produce(results):
    results.put(b"x" * 1000000)  # more than a pipe holds

if __name__ == "__main__":
    results = multiprocessing.Queue()
    p = multiprocessing.Process(target=produce, args=(results,))
    p.start()
    p.join()  # the queue is read only after the join
    print(len(results.get()))
"""
)


@pytest.mark.slow
def test_a_real_join_before_the_queue_is_read(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOIN_PY)
    proc = launch_detached(tmp_path, "job.py", LORA_OTEL_STALL_AFTER="between=3")
    log = tmp_path / "log.txt"
    try:
        [line] = wait_for(lambda: stalled_with(log, "feeder thread"), timeout=120, what="the why line")
        [child] = workers(tmp_path)
        assert "child pid %d it waits for has not ended" % child.pid in line, line
        assert re.search(
            r"waits to write to a pipe .*whose read end this process holds.*each waits for the other", line
        )
        text = inspect_text(tmp_path)
        assert "feeder thread" in text and "Queue.get()" in text, text
    finally:
        stop(proc)


def test_a_child_reading_a_pipe_the_parent_holds_gets_the_step_to_write_or_close_it() -> None:
    threads = copy.deepcopy(_case("join_before_draining_a_queue")["evidence"][KEY])
    child = threads[0]["other"][0]
    child.update(op="read", syscall="read", main=True, tid=child["pid"])
    for other in child["other"]:
        other["role"] = "writer"
    said = childwaits.descriptor_wait(threads, threads[0]["pid"], child["pid"])
    assert said is not None and said.phrase.startswith("its main thread waits to read a pipe"), said
    assert "whose write end this process holds" in said.phrase and "each waits for the other" in said.phrase
    assert said.advice == childwaits.PIPE_WRITE_ADVICE


def test_a_pipe_held_by_another_process_is_named_without_a_step() -> None:
    threads = copy.deepcopy(_case("join_before_draining_a_queue")["evidence"][KEY])
    child = threads[0]["other"][0]
    child["other"] = [{"pid": 99999, "role": "reader", "state": "S", "wchan": "do_select", "loop": False}]
    said = childwaits.descriptor_wait(threads, threads[0]["pid"], child["pid"])
    assert said is not None and "whose read end is held by pid 99999" in said.phrase and not said.advice
