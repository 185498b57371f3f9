"""Which processes and threads are the workers of the pool the main thread waits on (issue 37-R).

A cold trial found the `worker pool` rule naming processes that are not the pool's workers:
multiprocessing's resource tracker and a Manager's server as workers, an unrelated short child as
a ``ThreadPoolExecutor``'s worker (whose workers are threads), a worker that had exited normally
as "holding a task", and a forked worker's parent frames (copied at the fork) as its own.
`lora_otel.analysis.poolmembers` reads them apart; tested here over frames, over the recorded
evidence of real runs (``tests/data/evidence/pool_*.json``), and on the real programs (slow).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from procs import lora_otel_cli, wait_for
from test_local_beat import launch_detached, messages, stop

from lora_otel.analysis import diagnose, poolmembers, pools
from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX, gather
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import Journal, read_journal

# (a format of their own: the journals of every process of the pool, and the pids gone by then)
EVIDENCE = Path(__file__).resolve().parent / "data" / "evidence" / "pools"
RECORDED = [
    "pool_thread_task_waits_on_same_pool",
    "pool_process_executor_worker_retired",
    "pool_datasets_map_manager_server",
    "pool_spawn_child_died_at_start",
]

# --- the reading, over frames ---------------------------------------------------------------------


def test_helpers_are_not_workers() -> None:
    assert poolmembers.helper_role([["<string>", 1, "<module>"], ["multiprocessing/resource_tracker.py", 227, "main"]])
    assert "Manager" in poolmembers.helper_role(
        [["multiprocess/managers.py", 176, "serve_forever"], ["threading.py", 629, "wait"]]
    )
    assert poolmembers.helper_role([], "python -c from multiprocessing.forkserver import main; main(3, 4)")
    # a worker whose task talks to a manager (a proxy's call) is a worker
    assert not poolmembers.helper_role(
        [["multiprocess/pool.py", 125, "worker"], ["multiprocess/managers.py", 822, "_callmethod"]]
    )
    assert not poolmembers.helper_role(
        [["multiprocessing/pool.py", 114, "worker"], ["job.py", 5, "task"]], "python job.py"
    )


def test_a_forked_workers_parent_frames_are_not_its_own() -> None:
    frames = [
        ["job.py", 3, "<module>"],
        ["datasets/arrow_dataset.py", 3623, "map"],
        ["multiprocess/popen_fork.py", 71, "_launch"],
        ["multiprocess/process.py", 314, "_bootstrap"],
        ["multiprocess/process.py", 108, "run"],
        ["multiprocess/pool.py", 114, "worker"],
    ]
    assert poolmembers.own_frames(frames) == frames[4:]
    assert poolmembers.own_frames(frames[:2]) == frames[:2]


def test_a_spawned_worker_running_the_main_module_again_is_starting() -> None:
    assert poolmembers.starting([["<frozen runpy>", 88, "_run_code"], ["/job/train.py", 2, "<module>"]])
    assert not poolmembers.starting([["concurrent/futures/process.py", 240, "_process_worker"], ["job.py", 5, "f"]])
    assert not poolmembers.starting([["job.py", 5, "task"]])


def _thread(name: str, *frames: tuple[str, int, str]) -> tuple[str, list[Any]]:
    return ('Thread 7 (idle): "%s"' % name, [list(f) for f in frames])


WAITS = _thread(
    "ThreadPoolExecutor-0_0",
    ("threading.py", 327, "wait"),
    ("concurrent/futures/_base.py", 451, "result"),
    ("/job/job.py", 7, "wait_on_future"),
    ("concurrent/futures/thread.py", 58, "run"),
    ("concurrent/futures/thread.py", 83, "_worker"),
    ("threading.py", 982, "run"),
)
IDLE = _thread(
    "ThreadPoolExecutor-0_1",
    ("threading.py", 327, "wait"),
    ("queue.py", 171, "get"),
    ("concurrent/futures/thread.py", 81, "_worker"),
    ("threading.py", 982, "run"),
)
SLEEPS = _thread(
    "ThreadPoolExecutor-0_2",
    ("/job/job.py", 12, "upload"),
    ("concurrent/futures/thread.py", 58, "run"),
    ("concurrent/futures/thread.py", 83, "_worker"),
)


def test_thread_pool_workers_from_the_stacks() -> None:
    [worker] = poolmembers.thread_workers([WAITS, _thread("tqdm", ("tqdm/_monitor.py", 60, "run"))])
    assert worker.task == "wait_on_future (job.py:7)" and worker.waits_future
    parts, advice = poolmembers.thread_pool_parts([worker], 3)
    assert parts[0] == "its only worker thread runs wait_on_future (job.py:7), which itself waits for a future's result"
    assert "never runs" in parts[1] and "separate executor" in advice
    # one worker free: no deadlock claimed, no advice
    parts, advice = poolmembers.thread_pool_parts(poolmembers.thread_workers([WAITS, IDLE]), 3)
    assert parts[-1] == "1 other worker thread waits for work" and advice == ""
    parts, advice = poolmembers.thread_pool_parts(poolmembers.thread_workers([SLEEPS]), 3)
    assert parts == ["its only worker thread runs upload (job.py:12)"] and advice == ""
    parts, _ = poolmembers.thread_pool_parts(poolmembers.thread_workers([IDLE]), 3)
    assert parts == ["its only worker thread waits for work: no task of this pool is running"]


# --- the rule over the recorded real cases --------------------------------------------------------


def _journals(case: dict[str, Any], tmp: Path) -> list[Journal]:
    out = []
    for name, records in case["journals"].items():
        path = tmp / ("%s.otel.jsonl" % name)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        out.append(read_journal(path))
    return out


@pytest.mark.parametrize("name", RECORDED)
def test_the_recorded_cases(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = json.loads((EVIDENCE / ("%s.json" % name)).read_text())
    journals = _journals(case, tmp_path)
    # The journals' processes ran when the evidence was gathered (the analysis still asks /proc).
    # (those the case lists as gone were gone by then: no exit record, not in /proc)
    gone = set(case.get("gone", []))
    running = {j.path: "gone" if j.pid in gone else "running" for j in journals if j.exit is None and j.exec is None}
    for module in (pools, diagnose):
        monkeypatch.setattr(
            module, "process_state", lambda j, real=module.process_state: running.get(j.path) or real(j)
        )
    job = journals[0]
    assert job.root is not None
    stall = Stall(case["stall"]["kind"], job.root, case["stall"]["open_for_s"], case["stall"]["limit_s"], "")
    found = explain(stall, case["evidence"], job, journals, now_ns=case["now_ns"])
    assert found.attrs["lora_otel.diagnosis.rule"] == case["expect"]["rule"]
    for fragment in case["expect"]["sentence"]:
        assert fragment in found.sentence, found.sentence
    for fragment in case["expect"].get("not", []):
        assert fragment not in found.sentence, found.sentence
    for fragment in case["expect"]["advice"]:
        assert fragment in found.advice, found.advice
    if not case["expect"]["advice"]:
        assert found.advice == ""


def test_without_the_thread_pools_worker_no_process_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded thread-pool case with its worker thread cut from the stacks and an unrelated
    child that ended: "cannot tell", never that child."""
    case = json.loads((EVIDENCE / "pool_thread_task_waits_on_same_pool.json").read_text())
    journals = _journals(case, tmp_path)
    job = journals[0]
    assert job.root is not None
    evidence = dict(case["evidence"])
    stacks = str(evidence[PREFIX + "python.stacks"])
    evidence[PREFIX + "python.stacks"] = "\n\n".join(
        block for block in stacks.split("\n\n") if "concurrent/futures/thread.py" not in block
    )
    evidence[PREFIX + "process.children"] = [{"pid": 4242, "state": "Z", "cmdline": "uname -p"}]
    monkeypatch.setattr(pools, "process_state", lambda j: "running")
    stall = Stall("between", job.root, 30.0, 4.0, "")
    found = explain(stall, evidence, job, journals, now_ns=case["now_ns"])
    if found.attrs["lora_otel.diagnosis.rule"] == "worker pool":
        assert "4242" not in found.sentence and "cannot tell" in found.sentence, found.sentence


# --- the real programs (slow) ---------------------------------------------------------------------

THREAD_POOL_PY = """import torch  # a trainer (the watchdog calls a quiet process stuck once it has imported torch)
from concurrent.futures import ThreadPoolExecutor
executor = ThreadPoolExecutor(max_workers=1)
def wait_on_future():
    f = executor.submit(pow, 5, 2)
    return f.result()
print("saving checkpoint in background", flush=True)
print(executor.submit(wait_on_future).result())
"""

RETIRED_PY = """from concurrent.futures import ProcessPoolExecutor
def shard(i):
    return i * i
if __name__ == "__main__":
    import torch  # a trainer (imported here: the spawned worker skips it and starts fast)
    print("preprocessing shards", flush=True)
    with ProcessPoolExecutor(1, max_tasks_per_child=2) as exe:
        futs = [exe.submit(shard, i) for i in range(10)]
        print([f.result() for f in futs])
"""


def _all(tmp: Path) -> list[Journal]:
    return [read_journal(p) for p in sorted((tmp / "lora-otel").glob("*.otel.jsonl"))]


def _top(tmp: Path) -> Journal:
    journals = _all(tmp)
    pids = {j.pid for j in journals}
    [job] = [j for j in journals if j.root is not None and j.root.attrs.get("process.parent_pid") not in pids]
    return job


def _real(tmp: Path, name: str, script: str, expect: dict[str, Any], settle: Any = None) -> None:
    (tmp / "job.py").write_text(script)
    proc = launch_detached(tmp, "job.py", LORA_OTEL_STALL_AFTER="arguments=4")
    log = tmp / "log.txt"
    try:

        def stalled() -> list[str]:
            if proc.poll() is not None:
                pytest.skip("the program ended: this Python does not hang here")
            if not log.exists():
                return []
            why = messages(log, "why ") + messages(log, "STALLED")
            return [m for m in why if "The main thread waits" in m]

        [line] = wait_for(stalled, timeout=180, what="the STALLED line with the worker pool's sentence")[:1]
        for fragment in expect["sentence"]:
            assert fragment in line, line
        for fragment in expect.get("not", []):
            assert fragment not in line, line
        advice = messages(log, "what to do: ")
        for fragment in expect["advice"]:
            assert advice and fragment in advice[0], advice
        text = lora_otel_cli("inspect", str(tmp / "lora-otel")).stdout
        assert expect["sentence"][0] in text, text
        job = _top(tmp)
        assert job.root is not None and job.pid is not None
        evidence = gather(job.pid, None)
        journals = _all(tmp)
        now = time.time_ns()
        open_s = (now - job.root.start_ns) / 1e9
        found = explain(Stall("arguments", job.root, open_s, 4.0, ""), evidence, job, journals, now_ns=now)
        assert found.attrs["lora_otel.diagnosis.rule"] == "worker pool"
        for fragment in expect["sentence"]:
            assert fragment in found.sentence, found.sentence
        for fragment in expect["advice"]:
            assert fragment in found.advice, found.advice
        if os.environ.get("LORA_OTEL_RECORD_EVIDENCE") == "1":
            from test_native import record  # its redaction and shape

            path = EVIDENCE / ("%s.json" % name)
            record(tmp, job, journals, evidence, open_s, now, path, expect["case"], expect)
            case = json.loads(path.read_text())
            case["stall"]["kind"], case["source"] = (
                "arguments",
                "tests/test_pool_members.py (real run, paths made generic)",
            )
            path.write_text(json.dumps(case, indent=1) + "\n")
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_thread_pool_task_waits_on_a_task_queued_behind_it(tmp_path: Path) -> None:
    """cpython#141617's example: a 1-worker ThreadPoolExecutor whose task waits on a task it submits
    to the same pool. Its worker is a thread: named from the stacks, no process named."""
    _real(
        tmp_path,
        "pool_thread_task_waits_on_same_pool",
        THREAD_POOL_PY,
        {
            "case": "a 1-worker ThreadPoolExecutor whose task waits for a task it submitted to the same pool "
            "(cpython#141617's example)",
            "rule": "worker pool",
            "sentence": [
                "waits for its ThreadPoolExecutor (result, called at job.py:8 in <module>)",
                "its only worker thread runs wait_on_future (job.py:6), which itself waits for a future's result",
                "a task queued behind it in the same pool never runs",
            ],
            "not": ["pid"],
            "advice": ["separate executor", "max_workers"],
        },
    )


@pytest.mark.slow
def test_a_process_pool_worker_retired_and_not_replaced(tmp_path: Path) -> None:
    """CPython gh-115634: ProcessPoolExecutor(max_tasks_per_child=2) retires its only worker and
    starts no other. The worker's exit record says it exited normally: never "holds a task"; the
    resource tracker is not a worker."""
    _real(
        tmp_path,
        "pool_process_executor_worker_retired",
        RETIRED_PY,
        {
            "case": "ProcessPoolExecutor(1, max_tasks_per_child=2): its worker retired after 2 tasks and no "
            "worker replaced it (CPython gh-115634)",
            "rule": "worker pool",
            "sentence": [
                "waits for its ProcessPoolExecutor (result, called at job.py:9 in <listcomp>)",
                "exited normally (exit code 0)",
                "no worker of the pool is running to take the tasks it waits for",
            ],
            "not": ["holds a task", "resource_tracker"],
            "advice": ["max_tasks_per_child", "gh-115634"],
        },
    )


def test_the_recorded_sentences_say_no_false_pid() -> None:
    for name in RECORDED:
        case = json.loads((EVIDENCE / ("%s.json" % name)).read_text())
        assert case["expect"]["rule"] in ("worker pool", "thread deadlock") and re.match(r"^[a-z]", case["case"], re.I)
