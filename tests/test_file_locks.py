"""Issue 21 items 5 and 7: a job waiting on a file lock is told which file and who holds it (or
that nobody does: a stale lock), and every view gives durations as of when it is read.

Real processes: the job, launched as a UI launches it (``LORA_OTEL=1``, its output into a file,
its local watchdog), waits on a lock a second, untraced process really holds (``fcntl.flock``,
``filelock.FileLock``, a file kept open), or on a lock file nobody holds. What must hold is what
the user sees: the watchdog's ``stall`` record and ``lora-otel inspect``'s ``STALLED`` line name
the lock file, the holder's pid and command line. A polled lock's file is read from the waiting
frames' locals by py-spy (the watchdog attaches to the job at a stall); those cases need py-spy
to be able to read a process here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, lora_otel_cli, wait_for

from lora_otel.analysis.evidence import PREFIX, python_stacks, stack_request
from lora_otel.analysis.filelocks import py_spy_path
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

LIMIT = "load model=2"
"""The stage's stall limit the jobs run with; the tests wait for the watchdog's record (>= 60 s)."""

HUB_LOCK = ".cache/huggingface/hub/.locks/models--some-org--some-model/" + "0123456789abcdef" * 4 + ".lock"
"""A lock path laid out as huggingface_hub's (longer than the 128 characters py-spy shows of a value by default)."""

HOLDER = """\
import fcntl, os, sys, time
how, path = sys.argv[1], sys.argv[2]
if how == "flock":
    f = open(path, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
elif how == "filelock":
    import filelock
    lock = filelock.FileLock(path)
    lock.acquire()
elif how == "soft":
    import filelock
    lock = filelock.SoftFileLock(path)
    lock.acquire()
elif how == "open":
    f = open(path, "w")
open(path + ".ready", "w").close()
time.sleep(600)
"""


def launch(tmp_path: Path, source: str, **env: str) -> subprocess.Popen:
    """``python job.py`` with LORA_OTEL=1, its stdout and stderr into log.txt, journals in ./j."""
    (tmp_path / "job.py").write_text(textwrap.dedent(source), encoding="utf-8")
    with open(tmp_path / "log.txt", "wb") as out:
        return subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), **env),
            start_new_session=True,
        )


def hold(tmp_path: Path, how: str, name: str = "model.lock") -> subprocess.Popen:
    """An untraced process holding ``name`` (``how``: flock, filelock, open), once it says so."""
    (tmp_path / "holder.py").write_text(HOLDER, encoding="utf-8")
    path = tmp_path / name
    proc = subprocess.Popen(
        [PYTHON, "holder.py", how, str(path)], cwd=tmp_path, env=clean_env(), start_new_session=True
    )
    wait_for((tmp_path / (name + ".ready")).exists, timeout=60, what="the holder to take the lock")
    return proc


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=20)


def the_journal(tmp_path: Path, pid: int):
    return wait_for(
        lambda: next((j for j in map(read_journal, journals(tmp_path / "j")) if j.pid == pid), None),
        what="the job's journal",
    )


def stall_record(tmp_path: Path, pid: int) -> dict:
    """The watchdog's stall record of the job (waited for)."""
    path = the_journal(tmp_path, pid).path
    return wait_for(lambda: read_journal(path).stalls, timeout=60, what="the watchdog's stall record")[-1]


def stalled_line(journal_path: str) -> str:
    r = lora_otel_cli("inspect", journal_path)
    assert r.returncode == 0, r.stderr
    [line] = [line for line in r.stdout.splitlines() if line.startswith("STALLED: ")]
    return line


def holder_phrase(holder: subprocess.Popen) -> str:
    return "held by pid %d (%s holder.py " % (holder.pid, PYTHON)


@pytest.fixture(scope="module")
def py_spy_reads() -> None:
    """py-spy is here and may read a process (ptrace): the polled cases need it."""
    spy = py_spy_path()
    if spy is None:
        pytest.skip("py-spy is not installed")
    proc = subprocess.Popen([PYTHON, "-c", "import time\ntime.sleep(60)"])
    try:
        time.sleep(0.5)
        r = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip("py-spy cannot read a process here: %s" % r.stderr.strip()[-200:])
    finally:
        proc.kill()
        proc.wait()


# --- 5. the lock file and its holder ------------------------------------------------------------


def test_flock_held_by_another_process_names_the_file_and_the_holder(tmp_path: Path) -> None:
    """The job blocks in ``fcntl.flock`` on a file another process holds: the stall record and
    inspect's STALLED line name the file, the holder's pid and its command line."""
    holder = hold(tmp_path, "flock")
    job = launch(
        tmp_path,
        """\
        import fcntl, lora_otel
        with lora_otel.stage("load model"):
            f = open("model.lock", "w")
            fcntl.flock(f, fcntl.LOCK_EX)
        """,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        want = "Waiting for a file lock on %s (fcntl.flock, blocked in the kernel, at job.py:4 in <module>), " % (
            tmp_path / "model.lock"
        )
        assert record["diagnosis"].startswith(want + holder_phrase(holder)), record["diagnosis"]
        assert record["evidence"]["file_lock.holder_pid"] == holder.pid
        line = stalled_line(the_journal(tmp_path, job.pid).path)
        assert line.startswith("STALLED: load model open for ") and want + holder_phrase(holder) in line
        assert "holder.py flock %s" % (tmp_path / "model.lock") in line, line
    finally:
        stop(job, holder)


def test_flock_held_by_the_process_itself_through_another_descriptor(tmp_path: Path) -> None:
    """flock locks an open file, not a process: a job that opens the lock file twice and locks it
    through both waits for itself, and the record says so (not that the lock is stale)."""
    job = launch(
        tmp_path,
        """\
        import fcntl, lora_otel
        with lora_otel.stage("load model"):
            first = open("model.lock", "w")
            fcntl.flock(first, fcntl.LOCK_EX)
            second = open("model.lock", "w")
            fcntl.flock(second, fcntl.LOCK_EX)
        """,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        assert record["diagnosis"] == (
            "Waiting for a file lock on %s (fcntl.flock, blocked in the kernel, at job.py:6 in <module>), held by "
            "this process itself (pid %d, through another descriptor)." % (tmp_path / "model.lock", job.pid)
        ), record["diagnosis"]
    finally:
        stop(job)


def test_filelock_polled_names_the_file_and_the_holder(tmp_path: Path, py_spy_reads: None) -> None:
    """The job waits in ``filelock.FileLock`` (it polls a non-blocking flock, the file closed
    between tries) on a lock another process's FileLock holds, at a path as long as a hub cache's:
    the record names the whole file (from the waiting frame's locals), the holder's pid and command
    line, and where the job called it."""
    name = HUB_LOCK
    (tmp_path / name).parent.mkdir(parents=True)
    holder = hold(tmp_path, "filelock", name)
    job = launch(
        tmp_path,
        """\
        import filelock, lora_otel
        with lora_otel.stage("load model"):
            with filelock.FileLock(%r):
                pass
        """
        % name,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        want = "Waiting for a file lock on %s (filelock polls it, at job.py:3 in <module>), %s" % (
            tmp_path / name,
            holder_phrase(holder),
        )
        assert record["diagnosis"].startswith(want), record["diagnosis"]
        assert want in stalled_line(the_journal(tmp_path, job.pid).path)
    finally:
        stop(job, holder)


def test_soft_lock_names_the_live_process_whose_pid_is_in_it(tmp_path: Path, py_spy_reads: None) -> None:
    """Another process's ``filelock.SoftFileLock`` (a file existing, no kernel lock): the record
    names the file and the live holder whose pid the file holds."""
    holder = hold(tmp_path, "soft")
    job = launch(
        tmp_path,
        """\
        import filelock, lora_otel
        with lora_otel.stage("load model"):
            with filelock.SoftFileLock("model.lock"):
                pass
        """,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        lock = tmp_path / "model.lock"
        assert record["diagnosis"] == (
            "Waiting for a file lock on %s (filelock polls it, at job.py:3 in <module>), held by pid %d (%s holder.py "
            "soft %s) (the pid written in the file)." % (lock, holder.pid, PYTHON, lock)
        ), record["diagnosis"]
    finally:
        stop(job, holder)


def test_inspect_without_a_record_names_the_lock_files_held_now(tmp_path: Path) -> None:
    """Before the watchdog's limit (no stall record yet), ``inspect --stall-after`` works the stall
    out itself and never attaches to the job, so the polled file is not known from its locals; it
    names the lock files other processes hold now, the holder among them, as candidates."""
    (tmp_path / HUB_LOCK).parent.mkdir(parents=True)
    holder = hold(tmp_path, "filelock", HUB_LOCK)
    job = launch(
        tmp_path,
        """\
        import filelock, lora_otel
        with lora_otel.stage("load model"):
            with filelock.FileLock(%r):
                pass
        """
        % HUB_LOCK,
    )
    try:
        journal = the_journal(tmp_path, job.pid)
        path = journal.path
        wait_for(lambda: any(s.name == "load model" for s in read_journal(path).spans), what="the stage")
        request = stack_request(read_journal(path))  # the request the watchdog makes at a stall
        assert request is not None and request.refusal is None, request

        def dump() -> str:
            return str(python_stacks(job.pid, request, py_spy=False).get(PREFIX + "python.stacks", ""))

        wait_for(lambda: "_poll_until_acquired" in dump(), what="a stack dump in filelock's wait")

        def stalled() -> str:
            r = lora_otel_cli("inspect", path, "--stall-after", "load model=1")
            return next((line for line in r.stdout.splitlines() if line.startswith("STALLED: ")), "")

        line = wait_for(stalled, timeout=60, what="inspect to call it stalled")
        assert (
            "— Waiting for a file lock (filelock polls it, at job.py:3 in <module>); which file is not known: not read "
            "(inspect does not attach to the process); lock files held now by other processes: %s by pid %d (%s "
            "holder.py filelock " % (tmp_path / HUB_LOCK, holder.pid, PYTHON)
        ) in line, line
    finally:
        stop(job, holder)


def test_stale_soft_lock_with_no_holder_is_called_stale(tmp_path: Path, py_spy_reads: None) -> None:
    """A soft lock file left behind (written by an older filelock: no pid in it), nobody holding
    it: the job waits in ``filelock.SoftFileLock`` forever, and the record says the lock is stale."""
    (tmp_path / "model.lock").write_text("")
    job = launch(
        tmp_path,
        """\
        import filelock, lora_otel
        with lora_otel.stage("load model"):
            with filelock.SoftFileLock("model.lock"):
                pass
        """,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        assert record["diagnosis"] == (
            "Waiting for a file lock on %s (filelock polls it, at job.py:3 in <module>); the lock is stale: "
            "no live process has it open." % (tmp_path / "model.lock")
        ), record["diagnosis"]
        assert record["evidence"]["file_lock.stale"] is True
    finally:
        stop(job)


def test_soft_lock_written_on_another_host_is_not_called_stale(tmp_path: Path, py_spy_reads: None) -> None:
    """A soft lock whose file names another host (a cache on a shared file system): its pid means
    nothing here, so the record says where it was written instead of calling it stale."""
    (tmp_path / "model.lock").write_text("4242\nother-node\n1\n")
    job = launch(
        tmp_path,
        """\
        import filelock, lora_otel
        with lora_otel.stage("load model"):
            with filelock.SoftFileLock("model.lock"):
                pass
        """,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        assert record["diagnosis"] == (
            "Waiting for a file lock on %s (filelock polls it, at job.py:3 in <module>); it was written by pid 4242 "
            "on other-node, which cannot be looked at from here." % (tmp_path / "model.lock")
        ), record["diagnosis"]
    finally:
        stop(job)


def test_polled_lock_file_loop_names_the_file_and_who_has_it_open(tmp_path: Path, py_spy_reads: None) -> None:
    """The program's own loop, ``while os.path.exists(lock_path): time.sleep(…)``, on a lock
    file another process keeps open: the record names the file and that process."""
    holder = hold(tmp_path, "open", "data.lock")
    job = launch(
        tmp_path,
        """\
        import os, time, lora_otel
        def wait_for_lock(lock_path):
            while os.path.exists(lock_path):
                time.sleep(0.1)
        with lora_otel.stage("load model"):
            wait_for_lock("data.lock")
        """,
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        want = (
            "Waiting for a file lock on %s (polled until it goes away, at job.py:4 in wait_for_lock), held open by "
            % (tmp_path / "data.lock")
        )
        assert record["diagnosis"].startswith(want + "pid %d (%s holder.py open " % (holder.pid, PYTHON)), record[
            "diagnosis"
        ]
        assert record["diagnosis"].endswith("(no lock on it in the kernel).")
    finally:
        stop(job, holder)


# --- 7. the words, everywhere: durations as of the reading ---------------------------------------


def _open_for(line: str) -> float:
    m = re.search(r" open for ([\d.]+) (m?s) ", line)
    assert m, line
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def test_a_stall_read_later_says_how_long_it_has_lasted_by_then(tmp_path: Path) -> None:
    """The watchdog's record says the stage was open for ~2 s when it was written; inspect and
    watch, read seconds later while the job is still stuck, say how long it has been open by then,
    not what the record said."""
    job = launch(
        tmp_path,
        "import time, lora_otel\nwith lora_otel.stage('load model'):\n    time.sleep(600)\n",
        LORA_OTEL_STALL_AFTER=LIMIT,
    )
    try:
        record = stall_record(tmp_path, job.pid)
        assert not record["diagnosis"].startswith("Waiting for a file lock"), record["diagnosis"]  # a sleep is not one
        wait_for(lambda: time.time_ns() - record["ts"] > 4e9, timeout=60, what="the record to be 4 s old")
        path = the_journal(tmp_path, job.pid).path
        read_at = time.time_ns()
        line = stalled_line(path)
        assert _open_for(line) >= record["open_s"] + (read_at - record["ts"]) / 1e9 - 0.01, (line, record)
        read_at = time.time_ns()
        w = lora_otel_cli("watch", "--once", path)
        [watched] = [line for line in w.stdout.splitlines() if line.startswith("STALLED: ")]
        assert _open_for(watched) >= record["open_s"] + (read_at - record["ts"]) / 1e9 - 0.01, (watched, record)
        doc = json.loads(lora_otel_cli("inspect", "--json", path).stdout)
        assert doc["stall"]["open_s"] > record["open_s"] + 4, doc["stall"]
    finally:
        stop(job)


def test_a_frozen_stall_read_later_says_how_long_the_beat_has_been_silent(tmp_path: Path) -> None:
    """A job frozen holding the GIL at the start of a stage: the watchdog's ``frozen`` record is
    read seconds later; inspect says how long the beat has been silent by then."""
    job = launch(
        tmp_path,
        """\
        import ctypes, lora_otel
        with lora_otel.stage("load model"):
            while True:  # a signal (the watchdog's stack request) ends one pause()
                ctypes.PyDLL(None).pause()
        """,
        LORA_OTEL_FROZEN_AFTER="2",
    )
    try:
        record = stall_record(tmp_path, job.pid)
        assert record["kind"] == "frozen", record
        wait_for(lambda: time.time_ns() - record["ts"] > 4e9, timeout=60, what="the record to be 4 s old")
        path = the_journal(tmp_path, job.pid).path
        silent_since = read_journal(path).last_life_ns
        read_at = time.time_ns()
        line = stalled_line(path)
        m = re.match(r"STALLED: frozen in load model: no beat for ([\d.]+) s \(limit 2 s\) — ", line)
        assert m and float(m.group(1)) >= (read_at - silent_since) / 1e9 - 0.01, (line, record)
    finally:
        stop(job)


def test_accept_names_the_address_it_listens_on(tmp_path: Path) -> None:
    """A stage blocked in ``socket.accept()`` (waiting for workers that never connect): inspect
    says which address it listens on."""
    job = launch(
        tmp_path,
        """\
        import socket, lora_otel
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        open("port", "w").write(str(s.getsockname()[1]))
        with lora_otel.stage("wait for workers"):
            s.accept()
        """,
    )
    try:
        port = int(wait_for(lambda: (tmp_path / "port").exists() and (tmp_path / "port").read_text(), what="the port"))
        path = the_journal(tmp_path, job.pid).path

        def stalled() -> str:
            r = lora_otel_cli("inspect", path, "--stall-after", "wait for workers=1")
            return next((line for line in r.stdout.splitlines() if line.startswith("STALLED: ")), "")

        line = wait_for(stalled, timeout=60, what="inspect to call it stalled")
        assert line.startswith("STALLED: wait for workers open for "), line
        assert "Waiting for a connection on 127.0.0.1:%d (accept" % port in line, line
        assert "); no client has connected." in line, line  # (inspect asks for no stacks: the beat's sample said where)
    finally:
        stop(job)


def test_an_old_main_thread_sample_says_how_old_it_is(tmp_path: Path) -> None:
    """A job that froze holding the GIL: its beat stopped, so the last sample of the main thread
    (in the sleep before) grows old; inspect says how old it is."""
    job = launch(
        tmp_path,
        """\
        import ctypes, time, lora_otel
        with lora_otel.stage("load model"):
            time.sleep(3)
            while True:  # a signal (the watchdog's stack request) ends one pause()
                ctypes.PyDLL(None).pause()
        """,
    )
    try:
        path = the_journal(tmp_path, job.pid).path
        journal = wait_for(
            lambda: (j := read_journal(path)).main_frames and j.main_frames[-1][-1] == "time.sleep" and j,
            what="a beat sampling the sleep",
        )
        wait_for(
            lambda: (j := read_journal(path)).last_life_ns and time.time_ns() - j.last_life_ns > 6e9,
            timeout=60,
            what="the beat to stop for 6 s",
        )
        r = lora_otel_cli("inspect", path)
        [main] = [line for line in r.stdout.splitlines() if line.startswith("main thread at ")]
        m = re.fullmatch(r"main thread at job\.py:3 in <module> → time\.sleep \(sampled ([\d.]+) s ago\)", main)
        assert m and float(m.group(1)) > 6, main
        assert journal.main_frames_ts is not None
    finally:
        stop(job)
