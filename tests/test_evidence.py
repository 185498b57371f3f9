"""Evidence gathered from outside real stalled processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from procs import journal_has_open, journals, wait_for
from test_hangs import kill_and_reap, make_module, start_traced

from lora_otel.analysis.evidence import PREFIX, gather, network_facts, process_facts, stack_request
from lora_otel.journal.reader import read_journal


def stacks_registered(path: Path) -> None:
    """Wait for the stack dump, which a process registers when it becomes a job (its first beat)."""
    wait_for(lambda: "lora_otel.stacks.signal" in read_journal(path).root.attrs, what="the stack dump")


@pytest.mark.slow
def test_sleeping_import_evidence(tmp_path: Path) -> None:
    """A process sleeping in an import: state sleeping, ~0 % CPU, RSS and threads, its stack names the import."""
    make_module(tmp_path, "slowmod", "import time\ndef wait_for_hub():\n    time.sleep(600)\nwait_for_hub()\n")
    proc = start_traced(tmp_path, "import slowmod\n")
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import slowmod"), what="import span")
        [path] = journals(tmp_path / "lora-otel")
        stacks_registered(path)
        # The first sample may hold the start-up work still going (the first beat's promotion);
        # a sleeping process is idle in some sample soon after, however loaded the machine.
        ev = wait_for(
            lambda: (
                (e := gather(proc.pid, stack_request(read_journal(path))))[PREFIX + "process.cpu_percent"] < 20 and e
            ),
            timeout=60,
            what="an idle sample",
        )
        assert ev[PREFIX + "process.state"].startswith("S")
        assert ev[PREFIX + "process.rss_bytes"] > 1_000_000
        assert ev[PREFIX + "process.threads"] >= 2  # main + beat
        assert "wait_for_hub" in ev[PREFIX + "python.stacks"] and "slowmod.py" in ev[PREFIX + "python.stacks"]
        assert PREFIX + "net.received_bytes" in ev
        assert proc.poll() is None
    finally:
        kill_and_reap(proc)


@pytest.mark.slow
def test_busy_and_stopped_processes(tmp_path: Path) -> None:
    """A spinning import shows high CPU; once SIGSTOPped its state says stopped, the stacks are not
    waited for, and they land in the stacks file once the process continues."""
    make_module(tmp_path, "busymod", "while True:\n    pass\n")
    proc = start_traced(tmp_path, "import busymod\n")
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import busymod"), what="import span")
        stacks_registered(journals(tmp_path / "lora-otel")[0])
        # A loaded machine gives a spinning process less than a core in one sample; in one of them it
        # has most of it.
        wait_for(
            lambda: process_facts(proc.pid, sample_s=0.5)[PREFIX + "process.cpu_percent"] > 50,
            timeout=60,
            what="a busy sample",
        )
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: process_facts(proc.pid, 0.05)[PREFIX + "process.state"].startswith("T"), what="stopped")
        [path] = journals(tmp_path / "lora-otel")
        ev = gather(proc.pid, stack_request(read_journal(path)))
        stacks = read_journal(path).root.attrs["lora_otel.stacks.path"]
        assert "the process is stopped" in ev[PREFIX + "python.stacks.error"]
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: os.path.exists(stacks) and "busymod" in Path(stacks).read_text(), what="the deferred dump")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        kill_and_reap(proc)


def test_gone_process_gives_errors_not_exceptions() -> None:
    """A pid that does not exist: error entries, never an exception."""
    ev = process_facts(2**22 + 12345, sample_s=0)
    assert PREFIX + "process.error" in ev
    assert PREFIX + "net.error" in network_facts(2**22 + 12345)


def test_oom_watch_keeps_the_first_count_of_each_cgroup(tmp_path: Path, monkeypatch) -> None:
    """While the OOM killer's victim dies, the kernel moves it to the root memory cgroup, so a last
    look at /proc/<pid>/cgroup names the root (seen on this machine's cgroup v1: ``4:memory:/``
    just before the task is gone). That look must not replace the job's cgroup and its count: the
    kill in the job's cgroup is still told. The kernel files are real files here, in a temporary
    directory standing in for /sys/fs/cgroup (the real OOM kill is tests/test_sidecar.py::test_oom_killer)."""
    from lora_otel.analysis import oom

    job, root = tmp_path / "job", tmp_path / "root"
    for d, count in ((job, 0), (root, 7)):
        d.mkdir()
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill %d\n" % count)
    where = {"cgroup": str(job)}
    monkeypatch.setattr(oom, "memory_cgroup", lambda pid: where["cgroup"])
    watch = oom.OomWatch(str(job), 0)
    watch.see(1234)
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")  # the kill
    where["cgroup"] = str(root)  # the dying task, as the last look saw it
    watch.see(1234)
    assert watch.struck() == "the OOM killer (oom_kill 0 \u2192 1 in its memory cgroup)"
    assert watch.struck() is None, "each kill is told once"


POLL_LOOP = """\
import sys, time
print("polling", flush=True)
def poll_for_release():
    while True:
        end = time.perf_counter() + 0.008  # the check between two sleeps: a few ms on the CPU
        while time.perf_counter() < end:
            pass
        time.sleep(0.05)
poll_for_release()
"""


@pytest.mark.slow
def test_a_poll_loop_reads_as_its_sleep_not_on_cpu() -> None:
    """A loop that polls with short sleeps is awake between two of them now and then; one read of
    its wait channel caught it so ("on CPU"), and the job's line said "Cannot tell why" where "The
    main thread is sleeping" was right (TRL's exit handler, under load). The channel read most
    often over the sample is the one given: the sleep, every time."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", POLL_LOOP], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "polling\n"
        channels = [process_facts(proc.pid, sample_s=0.2)[PREFIX + "process.wait_channel"] for _ in range(30)]
        sleeps = ("hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "do_select", "core_sys_select")
        assert all(c.startswith(sleeps) for c in channels), channels
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_a_spinning_process_reads_as_on_cpu() -> None:
    """The other side of the same rule: a thread that never waits has no wait channel, however
    little of a CPU a loaded machine gives it (runnable, not running, is no wait either)."""
    import subprocess
    import sys

    code = "print('spinning', flush=True)\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "spinning\n"
        facts = process_facts(proc.pid, sample_s=0.5)
        assert facts[PREFIX + "process.wait_channel"] == "(none: on CPU or not shown)", facts
        assert facts[PREFIX + "process.state"].startswith("R"), facts
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_a_process_stopped_during_the_sample_reads_as_stopped() -> None:
    """A process asleep in most reads of the sample and then stopped (SIGSTOP) is stopped now: its
    state and wait channel are the last read's, not the sleep read most often (a hostile trial:
    "S (sleeping)" for a stopped process, and for one that had died, against "Z" before)."""
    import subprocess
    import sys
    import threading
    import time

    code = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        got: list = []
        t = threading.Thread(target=lambda: got.append(process_facts(proc.pid, sample_s=6.0)))
        t.start()
        # Two thirds into the sample: most reads found the sleep; the stop comes 2 s before the
        # sample's end, far from what a loaded machine delays this thread by.
        time.sleep(4.0)
        os.kill(proc.pid, signal.SIGSTOP)
        t.join()
        assert got[0][PREFIX + "process.state"].startswith("T"), got[0]
        assert "sleep" not in got[0][PREFIX + "process.wait_channel"], got[0]
    finally:
        proc.kill()
        proc.communicate()
