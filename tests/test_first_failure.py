"""The first failure of a job, named in every view (issue 21 item 3).

A job of several processes leads with the one that went wrong first — ordered by when each ended
(its exit record, or its traced parent's reap of it: the ``child exit`` event) or, gone without
either, when it was last seen alive — and how it ended; the errors that follow it (a lost peer, a
launcher reporting its children) are listed after it, as consequences.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import JournalBuilder
from procs import PYTHON, clean_env, lora_otel_cli, wait_for

from lora_otel.analysis.job import read_dir
from lora_otel.journal.reader import read_journal

# A parent starts A and B. B is SIGKILLed (as the OOM killer would); the parent reaps it, then tells
# A, which fails with "lost peer B" as a rank whose peer died does; the parent exits 1.
JOB = r"""
import os, signal, subprocess, sys, time
role = sys.argv[1]
if role == "B":
    import lora_otel
    with lora_otel.stage("load"):  # (a stage makes it a job: watched, its death told)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
elif role == "A":
    while not os.path.exists("b-gone"):
        time.sleep(0.05)
    raise RuntimeError("lost peer B")
else:
    a = subprocess.Popen([sys.executable, "job.py", "A", "--log", "a.log"])
    b = subprocess.Popen([sys.executable, "job.py", "B", "--log", "b.log"])
    print("pids", a.pid, b.pid, flush=True)
    b.wait()
    open("b-gone", "w").close()
    a.wait()
    sys.exit(1)
"""


def run_job(tmp_path: Path) -> tuple[int, int]:
    """Run the job to its end, then wait for the watchdog's ``died`` record of B; A's and B's pids."""
    (tmp_path / "job.py").write_text(JOB)
    r = subprocess.run(
        [PYTHON, "job.py", "parent", "--log", "parent.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    a, b = (int(x) for x in next(x for x in r.stdout.splitlines() if x.startswith("pids ")).split()[1:])
    wait_for(
        lambda: (tmp_path / "b.log.otel.jsonl").exists() and read_journal(tmp_path / "b.log.otel.jsonl").stalls,
        timeout=60,
        what="the watchdog's died record for B",
    )
    return a, b


def first_failure_line(text: str, b: int) -> str:
    found = [line for line in text.splitlines() if line.startswith(f"child (pid {b}) died first")]
    assert found, text
    return found[0]


@pytest.mark.slow
def test_killed_child_is_named_before_the_peer_that_lost_it(tmp_path: Path) -> None:
    """B, SIGKILLed and reaped by its traced parent, is named first in ``inspect``, ``watch --once``,
    the report and its death line, with how it ended (SIGKILL); A's error comes after it, as a
    consequence; the parent's exit code 1 too."""
    a, b = run_job(tmp_path)

    inspect = lora_otel_cli("inspect", str(tmp_path))
    line = first_failure_line(inspect.stdout, b)
    assert line.startswith(f"child (pid {b}) died first: killed by SIGKILL"), line
    assert f"then, as consequences: child (pid {a}) failed: uncaught RuntimeError: lost peer B" in line, line
    assert "launcher (pid " in line and "failed with exit code 1 (a launcher reporting its children)" in line
    heading = inspect.stdout.splitlines()[0]
    assert "killed by SIGKILL" in heading and "lost peer" not in heading, heading
    assert re.search(rf"child +pid {b} +gone .*killed by SIGKILL .*\(its parent reaped it\)", inspect.stdout)
    assert "STALLED: died in load" in inspect.stdout and "The process was killed by SIGKILL" in inspect.stdout

    watch = lora_otel_cli("watch", "--once", str(tmp_path))
    assert first_failure_line(watch.stdout, b) == line

    report = lora_otel_cli("report", str(tmp_path), "-o", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report.html").read_text()
    assert f"child (pid {b}) died first: killed by SIGKILL" in html
    assert "lost peer B (exit code 1) (a lost peer)" in html

    death = wait_for(
        lambda: (  # (b.log is made by the watchdog to tell the death: B never needed it before, issue 36)
            (tmp_path / "b.log").exists()
            and [x for x in (tmp_path / "b.log").read_text().splitlines() if "was killed" in x]
        ),
        timeout=30,
        what="B's death line in b.log",
    )[0]
    assert f"process {b} was killed by SIGKILL (its parent reaped it) in load after" in death, death


def gone_process(directory: Path, name: str, number: int, parent: str | None) -> JournalBuilder:
    j = JournalBuilder(directory / name)
    j._last_id = number << 16
    j.process(0.0, parent_id=parent, attrs={"service.name": name})
    return j


def test_gone_without_a_word_is_ordered_by_when_last_seen_alive(tmp_path: Path) -> None:
    """Without a traced parent's reap, a process gone without an exit record is placed by its last
    sign of life: last seen at 1 s, it went before a peer that failed with a lost connection at 4 s."""
    launcher = gone_process(tmp_path, "launcher.otel.jsonl", 1, None)
    spawn = launcher.start("train", 0.1)
    a = gone_process(tmp_path, "a.otel.jsonl", 2, spawn)
    b = gone_process(tmp_path, "b.otel.jsonl", 3, spawn)
    b.beat(1.0)
    a.beat(3.9)
    a.end(a.root_id, 4.0, "error", "uncaught ConnectionResetError: peer closed")
    a.exit(4.0, code=1, how="exception", message="uncaught ConnectionResetError: peer closed")
    launcher.end(spawn, 4.5, "error")
    launcher.exit(4.6, code=1)
    jobs, _ = read_dir(str(tmp_path), a.ns(10))
    [job] = jobs
    assert job.callout is not None and job.callout.proc.journal.path.endswith("b.otel.jsonl"), job.callout
    assert job.callout.text.startswith("child (pid "), job.callout.text
    assert "died first: killed (no exit record)" in job.callout.text
    assert "ConnectionResetError: peer closed (exit code 1) (a connection reset)" in job.callout.text


def test_a_failure_right_after_an_unsure_death_may_be_first(tmp_path: Path) -> None:
    """A process gone without a word died some time after it was last seen alive: a peer that failed
    of its own error (not a lost peer) within that time is named first."""
    launcher = gone_process(tmp_path, "launcher.otel.jsonl", 1, None)
    spawn = launcher.start("train", 0.1)
    a = gone_process(tmp_path, "a.otel.jsonl", 2, spawn)
    b = gone_process(tmp_path, "b.otel.jsonl", 3, spawn)
    b.beat(1.0)
    a.end(a.root_id, 1.5, "error", "uncaught ValueError: bad shape")
    a.exit(1.5, code=1, how="exception", message="uncaught ValueError: bad shape")
    jobs, _ = read_dir(str(tmp_path), a.ns(10))
    [job] = jobs
    assert job.callout is not None and job.callout.proc.journal.path.endswith("a.otel.jsonl"), job.callout.text
    assert "failed first: uncaught ValueError: bad shape" in job.callout.text


class TestStallJudgedAgain:
    """A stall record is frozen when written; the job's verdict is judged again from the peers'
    later evidence."""

    def two_ranks(self, tmp_path: Path, rank1_alive: bool) -> tuple[JournalBuilder, JournalBuilder]:
        """Rank 0 waits in an all_reduce (its stall record says so); rank 1 is in training too."""
        t0 = time.time_ns() - 400 * 10**9
        ranks = []
        for rank in (0, 1):
            j = JournalBuilder(tmp_path / f"rank{rank}.otel.jsonl", t0=t0)
            j._last_id = (rank + 1) << 16
            j.process(
                0.0,
                alive=rank == 0 or rank1_alive,
                attrs={"service.name": "train", "rank": rank, "local_rank": rank, "world_size": 2},
            )
            ranks.append(j)
        rank0, rank1 = ranks
        training = rank0.start("training", 1.0)
        rank0.beat(100.0, steps=10, last_step_t=99.0)
        rank0.beat(399.0, steps=10, last_step_t=99.0)
        record = {
            "v": 1,
            "k": "stall",
            "ts": rank0.ns(200.0),
            "span_id": training,
            "stage": "training",
            "kind": "alive",
            "limit_s": 60.0,
            "open_s": 199.0,
            "learned": None,
            "evidence": {},
            "diagnosis": (
                "Waiting inside a collective (all_reduce, called at train.py:17 in <module>); rank 1 is in training."
            ),
            "by": "watchdog",
        }
        rank0.raw(json.dumps(record).encode() + b"\n")
        rank1.start("training", 1.0)
        rank1.beat(99.5, steps=10, last_step_t=99.0)
        return rank0, rank1

    def test_a_peer_dead_since_is_blamed_not_the_waiting_rank(self, tmp_path: Path) -> None:
        """Rank 0's record says it waits in a collective; rank 1 is found gone later: the job's
        callout names rank 1, and rank 0 as waiting for it."""
        rank0, rank1 = self.two_ranks(tmp_path, rank1_alive=False)
        jobs, _ = read_dir(str(tmp_path), time.time_ns())
        [job] = jobs
        assert job.callout is not None, job.phrase
        assert job.callout.proc.rank == 1, job.callout.text
        assert job.callout.text.startswith(f"rank 1 (pid {rank1.read().pid}) died first: killed (no exit record)")
        assert f"; rank 0 (pid {rank0.read().pid}) waits for it in a collective (in training" in job.callout.text
        assert job.outcome == "killed"

    def test_a_peer_stuck_elsewhere_is_blamed_though_stuck_later(self, tmp_path: Path, monkeypatch) -> None:
        """Rank 0 waits in a collective since 100 s; rank 1, stuck in a stage of its own since 150 s
        (it never reached the collective), is the one the job's callout names."""
        for name in ("LORA_OTEL_STALL_AFTER", "LORA_OTEL_FROZEN_AFTER"):
            monkeypatch.delenv(name, raising=False)
        _, rank1 = self.two_ranks(tmp_path, rank1_alive=True)
        rank1.start("import datasets", 150.0, attrs={"lora_otel.module": "datasets"})
        rank1.beat(399.0, steps=10, last_step_t=99.0)
        jobs, _ = read_dir(str(tmp_path), time.time_ns())
        [job] = jobs
        assert job.callout is not None and job.callout.kind == "stuck", job.phrase
        assert job.callout.proc.rank == 1, job.callout.text
        assert job.callout.text.startswith(f"rank 1 (pid {rank1.read().pid}) is the one stuck: in import datasets")
        assert "; rank 0 (pid " in job.callout.text and "waits for it in a collective" in job.callout.text


# The launcher's reaction to a death: it stops the other child with SIGTERM.
STOPS_THE_REST = r"""
import os, signal, subprocess, sys, time
role = sys.argv[1]
if role in ("A", "B"):
    import lora_otel
    with lora_otel.stage("load" if role == "B" else "wait for peer"):
        open(role + ".ready", "w").close()
        if role == "B":
            while not os.path.exists("A.ready"):
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
else:
    a = subprocess.Popen([sys.executable, "job.py", "A", "--log", "a.log"])
    b = subprocess.Popen([sys.executable, "job.py", "B", "--log", "b.log"])
    print("pids", a.pid, b.pid, flush=True)
    b.wait()
    a.terminate()
    a.wait()
    sys.exit(1)
"""


@pytest.mark.slow
def test_death_line_of_a_consequence_names_the_first_failure(tmp_path: Path) -> None:
    """B is SIGKILLed; the launcher then stops A with SIGTERM: A's death line says it was killed by
    SIGTERM and, before it, that B died first, killed by SIGKILL."""
    (tmp_path / "job.py").write_text(STOPS_THE_REST)
    r = subprocess.run(
        [PYTHON, "job.py", "parent", "--log", "parent.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    a, b = (int(x) for x in next(x for x in r.stdout.splitlines() if x.startswith("pids ")).split()[1:])
    death = wait_for(
        lambda: (
            (tmp_path / "a.log").exists()
            and [x for x in (tmp_path / "a.log").read_text().splitlines() if "was killed" in x]
        ),
        timeout=60,
        what="A's death line in a.log",
    )[0]
    assert f"process {a} was killed by SIGTERM (its parent reaped it) in wait for peer after" in death, death
    assert f"; before it, child (pid {b}) died first: killed by SIGKILL in load after" in death, death
    inspect = lora_otel_cli("inspect", str(tmp_path))
    line = first_failure_line(inspect.stdout, b)
    assert f"then, as consequences: child (pid {a}) died: killed by SIGTERM (stopped with SIGTERM)" in line, line


LATE_REAP_JOB = r"""
import os, signal, subprocess, sys, time
role = sys.argv[1]
if role == "B":
    import lora_otel
    with lora_otel.stage("load"):
        os.kill(os.getpid(), signal.SIGKILL)
elif role == "A":  # outlives B's death by 1.8 s: its parent, waiting on A first, reaps B only then
    b = int(sys.argv[2])
    while open("/proc/%d/stat" % b).read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.02)
    time.sleep(1.8)
else:
    b = subprocess.Popen([sys.executable, "job.py", "B", "--log", "b.log"])
    a = subprocess.Popen([sys.executable, "job.py", "A", str(b.pid)])
    a.wait()
    b.wait()
"""


@pytest.mark.slow
def test_a_child_reaped_late_is_still_told_by_its_signal(tmp_path: Path) -> None:
    """A launcher that waits on its children one after the other reaps a killed one only when the
    one before it ends (here 1.8 s after the death): the death line still says SIGKILL, from the
    parent's reap (the watchdog waited 1 s and wrote "killed (by a signal: SIGKILL, SIGTERM, ...)")."""
    (tmp_path / "job.py").write_text(LATE_REAP_JOB)
    r = subprocess.run(
        [PYTHON, "job.py", "parent", "--log", "parent.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    death = wait_for(
        lambda: (  # (b.log is made by the watchdog to tell the death: B never needed it before, issue 36)
            (tmp_path / "b.log").exists()
            and [x for x in (tmp_path / "b.log").read_text().splitlines() if "was killed" in x]
        ),
        timeout=60,
        what="B's death line in b.log",
    )[0]
    assert "was killed by SIGKILL (its parent reaped it) in load" in death, death
