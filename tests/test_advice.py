"""What to do: each rule's advice (`Diagnosis.advice`) over recorded or constructed evidence, in
milliseconds — a step only where the evidence supports one, never a guess — and how every view
carries it (the stall record, the job's lines, inspect's text and JSON, a died process's last
stall). The real job that stalls on a file lock and shows it everywhere is in test_advice_real.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import JournalBuilder

from lora_otel.analysis import hubcache
from lora_otel.analysis.diagnose import RULES, Diagnosis, advice_line, explain, with_baseline
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.filelocks import KEY as LOCK
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import Journal, read_journal
from lora_otel.journal.records import Span

CASES = Path(__file__).resolve().parent / "data" / "evidence"


def a_stall(name: str = "load model", kind: str = "alive", attrs: Any = None) -> Stall:
    span = Span(name, "a" * 16, None, "b" * 32, 1, attrs=attrs or {})
    return Stall(kind, span, 30.0, 5.0, "%s open for 30 s (limit 5 s)" % name)


def a_journal(pid: int = 4712, **attrs: Any) -> Journal:
    root = Span("process", "c" * 16, None, "b" * 32, 1, attrs=attrs)
    return Journal(path="/nowhere/%d.otel.jsonl" % pid, spans=[root], root=root, pid=pid)


def rule_of(found: Diagnosis) -> str:
    return str(found.attrs["lora_otel.diagnosis.rule"])


# The recorded cases (test_advice_real.py) are explained in tests/test_rules_over_evidence.py.


# --- each rule --------------------------------------------------------------------------------


def test_zombie_and_stopped_say_who_reaps_or_resumes_it() -> None:
    found = explain(a_stall(), {PREFIX + "process.state": "Z (zombie)"}, a_journal(**{"process.parent_pid": 4711}))
    assert found.advice.startswith("Its parent (pid 4711) must reap it"), found.advice
    found = explain(a_stall(), {PREFIX + "process.state": "T (stopped)"}, a_journal(pid=4712))
    assert found.advice == "Resume it: kill -CONT 4712 (a job stopped with Ctrl-Z in a shell: fg).", found.advice
    assert found.attrs["lora_otel.diagnosis.advice"] == found.advice


def test_memory_pressure_names_the_limit_to_raise() -> None:
    evidence = {
        PREFIX + "process.state": "D (disk sleep)",
        PREFIX + "process.wait_channel": "reclaim_throttle",
        PREFIX + "process.rss_bytes": 40_000_000,
        PREFIX + "memory.limit_bytes": 50_331_648,
        PREFIX + "memory.limit_from": "/sys/fs/cgroup/job/memory.max",
    }
    found = explain(a_stall(), evidence)
    assert rule_of(found) == "memory pressure"
    assert "raise the job's memory limit (50 MB now, /sys/fs/cgroup/job/memory.max)" in found.advice, found.advice
    assert "a smaller batch size" in found.advice
    del evidence[PREFIX + "memory.limit_bytes"]
    evidence[PREFIX + "memory.swap_in_pages_per_s"] = 500.0
    assert "free memory on the machine" in explain(a_stall(), evidence).advice


def pipe_evidence(reader: dict[str, Any]) -> dict[str, Any]:
    return {
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "anon_pipe_write",
        PREFIX + "pipe.main_thread_writing": True,
        PREFIX + "pipe.writing_threads": ["4712 anon_pipe_write"],
        PREFIX + "pipe.fd1.inode": 34094,
        PREFIX + "pipe.fd1.queued_bytes": 65536,
        PREFIX + "pipe.fd1.capacity_bytes": 65536,
        PREFIX + "pipe.fd1.readers": [reader],
    }


def test_full_pipe_names_who_must_read_it() -> None:
    """The reader is the job's parent (the launcher that waits for it): "the program that started
    this job"; another process: "the program that holds its read end"; a stopped one is resumed;
    one that is running (busy or slow) or that is the job itself gives no step."""
    launcher = {"pid": 4711, "cmdline": "python ui.py", "state": "S", "wchan": "do_wait", "reading": False}
    job = a_journal(4712, **{"process.parent_pid": 4711})
    found = explain(a_stall(), pipe_evidence(launcher), job)
    assert rule_of(found) == "full pipe"
    assert found.advice == (
        "The program that started this job (pid 4711 python ui.py) must read the job's stdout while the job runs "
        "(Popen.communicate(), or a thread reading the pipe), or start the job with stdout to a file."
    ), found.advice
    other = a_journal(4712, **{"process.parent_pid": 99})
    assert explain(a_stall(), pipe_evidence(launcher), other).advice.startswith(
        "The program that holds its read end (pid 4711 python ui.py) must read"
    )
    stopped = {**launcher, "state": "T", "wchan": "do_signal_stop"}
    assert "kill -CONT 4711" in explain(a_stall(), pipe_evidence(stopped), job).advice
    for reader in ({**launcher, "state": "R"}, {**launcher, "pid": 4712}):
        assert explain(a_stall(), pipe_evidence(reader), job).advice == "", reader


def lock_evidence(**facts: Any) -> dict[str, Any]:
    return {
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "locks_lock_inode_wait",
        **{LOCK + k: v for k, v in facts.items()},
    }


def test_file_lock_held_by_a_live_process_vs_nobody() -> None:
    held = lock_evidence(
        how="flock", path="/data/m.lock", holders=["pid 4711 (python prefetch.py)"], holder_pid=4711, found_by="fd"
    )
    found = explain(a_stall(), held, a_journal(4712))
    assert rule_of(found) == "file lock"
    assert found.advice == (
        "Wait for pid 4711 (python prefetch.py) to finish with /data/m.lock, or stop it if it should not be "
        "running: the kernel frees its lock when it ends."
    ), found.advice
    stale = lock_evidence(
        how="soft",
        path="/data/m.lock",
        recorded_pid=999999,
        recorded_alive=False,
        stale=True,
        owner_uid=1000,
        job_uid=1000,
    )
    found = explain(a_stall(), stale, a_journal(4712))
    assert found.advice == (
        "Remove /data/m.lock: no process holds it or has it open and pid 999999 written in it is gone, so nothing "
        "else is using it."
    ), found.advice
    # the job holding it itself, a pid on another host, an unknown file: no step
    for facts in (
        {"how": "flock", "path": "/data/m.lock", "holders": ["this process itself"], "holder_pid": 4712},
        {"how": "soft", "path": "/data/m.lock", "recorded_pid": 7, "recorded_host": "other"},
        {"how": "filelock", "error": "which file is not known"},
    ):
        assert explain(a_stall(), lock_evidence(**facts), a_journal(4712)).advice == "", facts


HUB_STACKS = (
    "Current thread 0x1 (most recent call first):\n"
    '  File "/usr/lib/python3.11/socket.py", line 707 in readinto\n'
    '  File "/v/site-packages/huggingface_hub/file_download.py", line 5 in get\n'
    '  File "{job}", line 2 in <module>\n'
)


def test_hub_download_of_a_cached_model_says_offline(tmp_path: Path) -> None:
    """HF_HUB_OFFLINE=1 only when the repo the program's own line names has a snapshot in the
    job's cache; a repo not cached, or none named, gives no step."""
    job = tmp_path / "job.py"
    job.write_text('import transformers\nm = transformers.AutoModel.from_pretrained("org/tiny-model")\n')
    cache = tmp_path / "hub"
    stacks = HUB_STACKS.format(job=job)
    assert hubcache.repo_ids(stacks) == ["org/tiny-model"]
    facts = hubcache.facts(1, stacks, {"HF_HUB_CACHE": str(cache)})
    assert facts[hubcache.KEY + "cached"] == []
    evidence = {
        PREFIX + "python.stacks": stacks,
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "sk_wait_data",
        **facts,
    }
    found = explain(a_stall(), evidence)
    assert rule_of(found) == "hub download" and found.advice == "", found
    snapshot = cache / "models--org--tiny-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    evidence.update(hubcache.facts(1, stacks, {"HF_HUB_CACHE": str(cache)}))
    found = explain(a_stall(), evidence)
    assert found.advice == (
        "org/tiny-model is in the local Hugging Face cache already (%s): start the job with HF_HUB_OFFLINE=1 "
        "to load it from there without the network." % cache
    ), found.advice
    offline = hubcache.facts(1, stacks, {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert explain(a_stall(), {**evidence, **offline}).advice == ""
    assert hubcache.cache_dir({"HF_HOME": "/h"}) == "/h/hub"
    assert hubcache.cache_dir({"HOME": "/home/u"}) == "/home/u/.cache/huggingface/hub"


def rank_journal(path: Path, rank: int, world: int = 2, steps: int = 2) -> JournalBuilder:
    b = JournalBuilder(path)
    b.process(
        0.0,
        alive=True,
        attrs={
            "process.pid": os.getpid(),
            "host.name": "node-%d" % rank,
            "rank": rank,
            "world_size": world,
            "lora_otel.env.MASTER_ADDR": "10.0.0.1",
            "lora_otel.env.MASTER_PORT": "29500",
        },
    )
    b.start("training", 1.0)
    for t in range(2, 11):
        b.beat(float(t), steps=steps, last_step_t=2.0)
    return b


COLLECTIVE = (
    "Current thread 0x1 (most recent call first):\n"
    '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce\n'
    '  File "/work/train.py", line 16 in <module>\n'
)


def test_collective_names_the_ranks_that_never_arrived_and_the_address(tmp_path: Path) -> None:
    me = rank_journal(tmp_path / "r0.otel.jsonl", 0)
    peer = rank_journal(tmp_path / "r1.otel.jsonl", 1)
    peer.exit(4.0, code=1, how="exception", message="RuntimeError: boom")
    j = me.read()
    training = next(s for s in j.spans if s.name == "training")
    stall = Stall("alive", training, 8.0, 3.0, "no optimizer step for 8 s (limit 3 s)")
    found = explain(stall, {PREFIX + "python.stacks": COLLECTIVE}, j, [peer.read()], now_ns=me.ns(10.5))
    assert rule_of(found) == "collective" and "rank 1 never arrived" in found.sentence
    assert found.advice.startswith("Find out why rank 1 (pid %d on node-1) did not reach all_reduce: " % os.getpid())
    assert "`lora-otel inspect %s`" % (tmp_path / "r1.otel.jsonl") in found.advice
    assert "(the ranks meet at 10.0.0.1:29500, MASTER_ADDR:MASTER_PORT)" in found.advice, found.advice
    alone = explain(stall, {PREFIX + "python.stacks": COLLECTIVE}, j, [], now_ns=me.ns(10.5))
    assert "cannot tell which rank" in alone.sentence and alone.advice == ""


RENDEZVOUS = (
    "Current thread 0x1 (most recent call first):\n"
    '  File "/v/site-packages/torch/distributed/rendezvous.py", line 189 in _create_c10d_store\n'
    '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 1500 in init_process_group\n'
    '  File "/work/job.py", line 11 in <module>\n'
)


def test_rendezvous_names_the_ranks_to_start_and_the_address(tmp_path: Path) -> None:
    me = rank_journal(tmp_path / "r0.otel.jsonl", 0, world=3).read()
    peer = rank_journal(tmp_path / "r1.otel.jsonl", 1, world=3).read()
    stall = a_stall("init_process_group")
    found = explain(stall, {PREFIX + "python.stacks": RENDEZVOUS}, me, [peer])
    assert rule_of(found) == "rendezvous"
    assert found.advice == (
        "Start rank 2 of world size 3 with MASTER_ADDR and MASTER_PORT that reach 10.0.0.1:29500 (this one is "
        "rank 0); if this job was meant to run alone, unset WORLD_SIZE and RANK in its environment."
    ), found.advice
    two = rank_journal(tmp_path / "r2.otel.jsonl", 2, world=3).read()
    found = explain(stall, {PREFIX + "python.stacks": RENDEZVOUS}, me, [peer, two])
    assert (
        found.advice == "Every rank of the 3 is running: check that each one can reach 10.0.0.1:29500 "
        "(MASTER_ADDR:MASTER_PORT)."
    ), found.advice


DATALOADER = (
    "Current thread 0x1 (most recent call first):\n"
    '  File "/usr/lib/python3.11/selectors.py", line 415 in select\n'
    '  File "/v/site-packages/torch/utils/data/dataloader.py", line 1133 in _try_get_data\n'
    '  File "/work/job.py", line 18 in <module>\n'
)


def test_dataloader_names_the_stuck_worker_and_num_workers_0() -> None:
    stuck = {"pid": 4711, "state": "S", "wchan": "hrtimer_nanosleep", "cpu_percent": 0, "cmdline": ""}
    idle = {"pid": 4713, "state": "S", "wchan": "pipe_read", "cpu_percent": 0, "cmdline": ""}
    evidence = {PREFIX + "python.stacks": DATALOADER, PREFIX + "process.children": [stuck, idle]}
    found = explain(a_stall("training"), evidence)
    assert rule_of(found) == "DataLoader"
    assert found.advice.startswith("See where worker pid 4711 is (py-spy dump --pid 4711);"), found.advice
    assert "num_workers=0" in found.advice and "4713" not in found.advice
    evidence[PREFIX + "process.children"] = [idle]
    assert explain(a_stall("training"), evidence).advice == ""


def test_exit_joins_names_the_thread_to_make_daemon() -> None:
    stacks = (
        "Thread 0x2 (most recent call first):\n"
        '  File "/work/job.py", line 5 in upload\n'
        '  File "/usr/lib/python3.11/threading.py", line 1010 in run\n'
        '  File "/usr/lib/python3.11/threading.py", line 1073 in _bootstrap_inner\n'
        '  File "/usr/lib/python3.11/threading.py", line 1030 in _bootstrap\n'
        "\n"
        "Current thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 1147 in _wait_for_tstate_lock\n'
        '  File "/usr/lib/python3.11/threading.py", line 1590 in _shutdown\n'
    )
    stall = a_stall("exit", attrs={"lora_otel.exit.threads": ["uploader"]})
    found = explain(stall, {PREFIX + "python.stacks": stacks})
    assert rule_of(found) == "exit joins", found.sentence
    assert found.advice == (
        "Make thread uploader a daemon thread (threading.Thread(..., daemon=True)), or end its loop and join it "
        "before the program returns."
    ), found.advice


def test_rules_without_evidence_for_a_step_give_none() -> None:
    """Disk I/O, the network, CUDA init, a sleep, cannot tell: no step the evidence supports."""
    for evidence in (
        {PREFIX + "process.state": "D (disk sleep)", PREFIX + "process.wait_channel": "io_schedule"},
        {PREFIX + "process.state": "S (sleeping)", PREFIX + "process.wait_channel": "hrtimer_nanosleep"},
        {},
    ):
        found = explain(a_stall(), evidence)
        assert found.advice == "" and "lora_otel.diagnosis.advice" not in found.attrs, found


def test_the_baseline_keeps_the_advice() -> None:
    found = Diagnosis("The process is stopped.", {"lora_otel.diagnosis.advice": "Resume it."}, advice="Resume it.")
    kept = with_baseline(found, a_stall(), a_journal(), ValueError("no baseline"))
    assert kept.advice == "Resume it."


def test_every_rule_that_gives_advice_has_an_example() -> None:
    assert {r.name for r in RULES if r.advice} >= {"full pipe", "file lock", "hub download", "rendezvous"}
    assert advice_line("") == "" and advice_line("Resume it.") == "what to do: Resume it."


# --- the views --------------------------------------------------------------------------------


def stall_record(b: JournalBuilder, t: float, **fields: Any) -> None:
    b.raw(json.dumps({"v": 1, "k": "stall", "ts": b.ns(t), **fields}).encode() + b"\n")


def stalled_journal(path: Path, advice: str = "Resume it: kill -CONT 4712.") -> JournalBuilder:
    b = JournalBuilder(path)
    b.process(0.0, alive=True)
    span = b.start("load model", 1.0)
    b.beat(2.0)
    stall_record(
        b,
        3.0,
        span_id=span,
        stage="load model",
        kind="alive",
        limit_s=1.0,
        open_s=2.0,
        learned=None,
        evidence={},
        diagnosis="The process is stopped (SIGSTOP or a debugger), not running at all.",
        by="watchdog",
        advice=advice,
    )
    return b


def test_the_stall_records_advice_reaches_the_verdict_and_views(tmp_path: Path) -> None:
    from lora_otel.analysis.verdict import from_record
    from lora_otel.journal.tree import View

    b = stalled_journal(tmp_path / "j.otel.jsonl")
    journal = read_journal(str(b.path))
    verdict = from_record(journal, b.ns(4.0))
    assert verdict is not None and verdict.advice == "Resume it: kill -CONT 4712."
    assert verdict.to_json()["advice"] == "Resume it: kill -CONT 4712."
    lines = View(journal, "gone", b.ns(4.0), verdict=verdict, stalled=True).text_lines()
    assert lines[1].startswith("STALLED: load model open for") and lines[2] == "what to do: Resume it: kill -CONT 4712."
    # the process died after: the died record keeps the stall's advice readable
    stall_record(
        b,
        5.0,
        span_id=None,
        stage="load model",
        kind="died",
        limit_s=None,
        open_s=4.0,
        learned=None,
        evidence={},
        diagnosis="The process was killed.",
        by="watchdog",
    )
    verdict = from_record(read_journal(str(b.path)), b.ns(6.0))
    assert verdict is not None and verdict.kind == "died" and verdict.advice == "Resume it: kill -CONT 4712."
    assert "Before, it was stalled" in verdict.diagnosis


def test_the_watchdog_writes_the_advice_after_the_why_line(tmp_path: Path) -> None:
    """`write_stall`: the record's ``advice``, and the line ``what to do: …`` right after the why
    line (and after a STALLED line the watchdog writes for the job)."""
    from lora_otel.export import watchdog

    said: list[str] = []

    class Lines(watchdog.JobLines):
        def say(self, journal: Journal, msg: str, alive: bool) -> list[str]:
            said.append(msg)
            return []

    b = JournalBuilder(tmp_path / "j.otel.jsonl")
    b.process(0.0, alive=True)
    b.start("load model", 1.0)
    journal = read_journal(str(b.path))
    span = next(s for s in journal.spans if s.name == "load model")
    for stall, first in (
        (Stall("alive", span, 30.0, 5.0, "x"), "why load model is stalled: "),
        (Stall("frozen", span, 30.0, 5.0, "x"), "STALLED: "),
    ):
        said.clear()
        record = watchdog.stall_record(stall, "The process is stopped.", {}, "watchdog", b.ns(31), None, "Resume it.")
        assert record["advice"] == "Resume it."
        watchdog.write_stall(str(b.path), journal, stall, record, Lines(), lambda _m: None)
        assert [m.split(":")[0] + ": " if m.startswith("why") else m[: len(first)] for m in said][:1] == [first]
        assert said[1] == "what to do: Resume it.", said
    assert "advice" not in watchdog.stall_record(stall, "x", {}, "watchdog", 1, None, "")
    stalls = read_journal(str(b.path)).stalls
    assert stalls[-1]["advice"] == "Resume it."


DEADLOCK_JOB = """\
import threading
lock_a, lock_b = threading.Lock(), threading.Lock()
def worker():
    with lock_b:
        with lock_a:
            pass
with lock_a:
    with lock_b:
        pass
"""


def test_a_deadlock_whose_places_the_source_shows_says_take_the_locks_in_one_order(tmp_path: Path) -> None:
    """Both threads' waits and the locks they hold are on the source: one order for both locks.
    A thread waiting on a lock nobody is seen holding gives no step."""
    job = tmp_path / "job.py"
    job.write_text(DEADLOCK_JOB, encoding="utf-8")
    stacks = (
        "Thread 0x2 (most recent call first):\n"
        '  File "%s", line 5 in worker\n'
        '  File "/usr/lib/python3.11/threading.py", line 1010 in run\n'
        "\n"
        "Current thread 0x1 (most recent call first):\n"
        '  File "%s", line 8 in <module>\n'
    ) % (job, job)
    found = explain(a_stall("training"), {PREFIX + "python.stacks": stacks})
    assert rule_of(found) == "thread locks" and found.sentence.startswith("Deadlock: "), found.sentence
    assert found.advice == (
        "Take lock_b and lock_a in one order in every thread (the main thread takes lock_b at job.py:8 in <module> "
        "while holding lock_a; thread worker() takes lock_a at job.py:5 in worker while holding lock_b), or hold "
        "one lock for both."
    ), found.advice
    alone = stacks.split("\n\n", 1)[1]
    found = explain(a_stall("training"), {PREFIX + "python.stacks": alone})
    assert found.sentence.startswith("Waiting for a lock") and found.advice == "", found
