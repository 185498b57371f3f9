"""Issue 37 item 1 (a poll loop): a job sleeping in a loop is told what the loop polls and that
object's state, with a next step where that state supports one.

Real processes: the job, launched as a UI launches it (``LORA_OTEL=1``, its output into a file, its
local watchdog, a 2 s stall limit), polls a lock file nobody holds (torch cpp_extension's
``FileBaton`` pattern, written here: the path is an attribute of ``self``, which only the beat's
dump gives), a pid (alive; a child that ended and was never reaped), a port (nobody listens; a
child started with that port that does not listen). What must hold is what the user sees: the
job's ``STALLED`` and ``why`` lines, the watchdog's record, and the advice `explain` gives over
the record's evidence. ``LORA_OTEL_RECORD_EVIDENCE=<dir>`` writes each case's evidence there
(paths and pids made generic) for tests/data/evidence.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import textwrap
from pathlib import Path
from typing import Optional

import evidence_cases as cases
import pytest
from procs import PYTHON, clean_env, journals, wait_for

from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import read_journal
from lora_otel.journal.records import Span

pytestmark = pytest.mark.slow

LIMIT = "load model=2"

BATON = """\
import os, time


class FileBaton:
    '''torch.utils.file_baton's shape: a lock file, created by the first process, waited on by the others.'''

    def __init__(self, lock_file_path, wait_seconds=0.1):
        self.lock_file_path = lock_file_path
        self.wait_seconds = wait_seconds

    def try_acquire(self):
        try:
            self.fd = os.open(self.lock_file_path, os.O_CREAT | os.O_EXCL)
            return True
        except FileExistsError:
            return False

    def wait(self):
        while os.path.exists(self.lock_file_path):
            time.sleep(self.wait_seconds)
"""

JOB_BATON = """\
import os, lora_otel
from file_baton import FileBaton

def jit_compile(build_directory):
    baton = FileBaton(os.path.join(build_directory, "lock"))
    if baton.try_acquire():
        raise SystemExit("the test expected the lock to be taken already")
    baton.wait()

with lora_otel.stage("load model"):
    jit_compile(os.path.join(os.getcwd(), "build"))
"""


def launch(tmp_path: Path, source: str, **env: str) -> subprocess.Popen:
    (tmp_path / "job.py").write_text(textwrap.dedent(source), encoding="utf-8")
    with open(tmp_path / "log.txt", "wb") as out:
        return subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_STALL_AFTER=LIMIT, **env),
            start_new_session=True,
        )


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=20)


def stall_record(tmp_path: Path, pid: int) -> dict:
    journal = wait_for(
        lambda: next((j for j in map(read_journal, journals(tmp_path / "j")) if j.pid == pid), None),
        timeout=60,
        what="the job's journal",
    )
    return wait_for(lambda: read_journal(journal.path).stalls, timeout=90, what="the watchdog's stall record")[-1]


def job_lines(tmp_path: Path) -> tuple[str, str]:
    """The job's own STALLED and why lines (waited for)."""

    def lines() -> Optional[tuple[str, str]]:
        text = (tmp_path / "log.txt").read_text(encoding="utf-8", errors="replace")
        stalled = [line for line in text.splitlines() if "] STALLED: " in line]
        why = [line for line in text.splitlines() if "] why load model is stalled: " in line]
        return (stalled[0], why[0]) if stalled and why else None

    return wait_for(lines, timeout=90, what="the job's STALLED and why lines")


def advice_of(record: dict) -> tuple[str, str, str]:
    """(rule, sentence, advice) of `explain` over the record's evidence, as every view reads it."""
    span = Span(record["stage"], record["span_id"], None, "0" * 32, record["ts"])
    stall = Stall(record["kind"], span, float(record["open_s"]), float(record["limit_s"]), "")
    evidence = {PREFIX + key: value for key, value in record["evidence"].items()}  # (the record keeps them short)
    found = explain(stall, evidence, now_ns=record["ts"])
    return found.attrs.get("lora_otel.diagnosis.rule", ""), found.sentence, found.advice


def record_case(name: str, record: dict, tmp_path: Path, pids: dict[int, int], expect: dict) -> None:
    """With ``LORA_OTEL_RECORD_EVIDENCE=<dir>``: the case's evidence, generic, as ``<dir>/<name>.json``
    (tests/evidence_cases.py's format)."""
    out = cases.record_dir()
    if out is None:
        return
    text = json.dumps(record, sort_keys=True)
    text = text.replace(str(tmp_path), "/work/job").replace(PYTHON, "python")
    for real, generic in sorted(pids.items(), key=lambda kv: -len(str(kv[0]))):
        text = re.sub(r"(?<!\d)%d(?!\d)" % real, str(generic), text)
    generic = json.loads(text)
    case = {
        "case": name,
        "source": "tests/test_poll_loops.py (real run, paths and pids made generic)",
        "stall": {
            "kind": generic["kind"],
            "stage": generic["stage"],
            "open_for_s": generic["open_s"],
            "limit_s": generic["limit_s"],
        },
        "now_ns": generic["ts"],
        "journal": None,
        "evidence": {PREFIX + key: value for key, value in generic["evidence"].items()},
        "expect": {
            "rule": expect["rule"],
            "sentence": [cases.literal(x) for x in expect["sentence"]],
            "advice": [cases.literal(x) for x in expect["advice"]] or "",
        },
        "diagnosis": {"sentence": generic["diagnosis"]},
    }
    Path(out, name + ".json").write_text(json.dumps(case, indent=1) + "\n", encoding="utf-8")


# --- a lock file nobody holds ------------------------------------------------------------------


@pytest.mark.parametrize("py_spy", ["", "0"], ids=["py-spy", "beat only"])
def test_a_file_baton_waiting_on_a_leftover_lock_says_remove_it(tmp_path: Path, py_spy: str) -> None:
    """The path is ``self.lock_file_path``: py-spy's locals show no attribute, the beat's dump does
    (asked after py-spy, or alone with ``LORA_OTEL_PY_SPY=0``)."""
    (tmp_path / "file_baton.py").write_text(BATON, encoding="utf-8")
    (tmp_path / "build").mkdir()
    lock = tmp_path / "build" / "lock"
    lock.write_bytes(b"")  # the run that created it died before its release()
    job = launch(tmp_path, JOB_BATON, **({"LORA_OTEL_PY_SPY": py_spy} if py_spy else {}))
    try:
        stalled, why = job_lines(tmp_path)
        assert "main thread at job.py:11 in <module> → job.py:8 in jit_compile → file_baton.py:20 in wait" in stalled
        want = (
            "why load model is stalled: The main thread polls for %s to disappear (os.path.exists(self.lock_file_path) "
            "at file_baton.py:20 in wait, every 0.1 s); the file exists (" % lock
        )
        assert want in why, why
        assert why.endswith("no process has it open: a leftover from a run that ended without removing it."), why
        record = stall_record(tmp_path, job.pid)
        rule, _, advice = advice_of(record)
        assert rule == "poll loop"
        assert advice == "Remove %s (no process has it open, so no run is using it) and the job goes on." % lock
        if py_spy:
            return
        record_case(
            "poll_loop_stale_baton",
            record,
            tmp_path,
            {job.pid: 4711},
            {
                "rule": "poll loop",
                "sentence": ["polls for /work/job/build/lock to disappear", "no process has it open"],
                "advice": ["Remove /work/job/build/lock"],
            },
        )
    finally:
        stop(job)


def test_a_lock_file_another_process_has_open_names_it_and_gives_no_removal(tmp_path: Path) -> None:
    (tmp_path / "file_baton.py").write_text(BATON, encoding="utf-8")
    (tmp_path / "build").mkdir()
    lock = tmp_path / "build" / "lock"
    lock.write_bytes(b"")
    holder = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import sys, time\nf = open(sys.argv[1])\nprint('ready', flush=True)\ntime.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        env=clean_env(),
        start_new_session=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
    job = launch(tmp_path, JOB_BATON)
    try:
        _, why = job_lines(tmp_path)
        assert "polls for %s to disappear" % lock in why
        assert "is held open by pid %d (" % holder.pid in why, why
        rule, _, advice = advice_of(stall_record(tmp_path, job.pid))
        assert rule == "poll loop" and "Remove" not in advice
        assert advice.startswith("See what pid %d, which has it open, is doing" % holder.pid), advice
    finally:
        stop(job, holder)
        holder.stdout.close()


def test_a_pid_file_of_a_run_that_died_named_by_a_global_is_a_leftover(tmp_path: Path) -> None:
    """The path is a module global (py-spy shows no global; the beat's dump gives those the code
    names), and the loop is at module level; the pid written in the file is gone."""
    dead = subprocess.Popen([PYTHON, "-c", "pass"])
    dead.wait()
    (tmp_path / "train.pid").write_text("%d\n" % dead.pid, encoding="utf-8")
    job = launch(
        tmp_path,
        """\
        import os, time, lora_otel
        PIDFILE = os.path.abspath("train.pid")
        with lora_otel.stage("load model"):
            while os.path.exists(PIDFILE):  # another run is training
                time.sleep(0.5)
        """,
    )
    try:
        _, why = job_lines(tmp_path)
        pidfile = tmp_path / "train.pid"
        assert (
            "polls for %s to disappear (os.path.exists(PIDFILE) at job.py:5 in <module>, every 0.5 s)" % pidfile in why
        ), why
        assert "the pid written in it, %d, is gone, and no process has it open: a leftover" % dead.pid in why, why
        record = stall_record(tmp_path, job.pid)
        rule, _, advice = advice_of(record)
        assert rule == "poll loop" and advice.startswith("Remove %s " % pidfile)
        record_case(
            "poll_loop_pidfile_dead_run",
            record,
            tmp_path,
            {job.pid: 4711, dead.pid: 4690},
            {
                "rule": "poll loop",
                "sentence": ["polls for /work/job/train.pid to disappear", "the pid written in it, 4690, is gone"],
                "advice": ["Remove /work/job/train.pid"],
            },
        )
    finally:
        stop(job)


def test_a_loop_paced_by_a_timed_event_wait_is_read_as_a_poll(tmp_path: Path) -> None:
    """``while os.path.exists(lock): stop.wait(0.2)``: the main thread waits on a lock (futex), not in
    a sleep; the loop is still a poll, and the thread locks rule does not claim it."""
    (tmp_path / "run.lock").write_bytes(b"")
    job = launch(
        tmp_path,
        """\
        import os, threading, lora_otel
        stop = threading.Event()
        def wait_turn(lock_path):
            while os.path.exists(lock_path):
                if stop.wait(0.2):
                    return
        with lora_otel.stage("load model"):
            wait_turn(os.path.abspath("run.lock"))
        """,
    )
    try:
        _, why = job_lines(tmp_path)
        want = "polls for %s to disappear (os.path.exists(lock_path) at job.py:5 in wait_turn, every 0.2 s)" % (
            tmp_path / "run.lock"
        )
        assert want in why, why
        assert why.endswith("no process has it open: a leftover from a run that ended without removing it."), why
        rule, _, advice = advice_of(stall_record(tmp_path, job.pid))
        assert rule == "poll loop" and advice.startswith("Remove %s " % (tmp_path / "run.lock"))
    finally:
        stop(job)


# --- a pid ----------------------------------------------------------------------------------------


def test_a_loop_waiting_for_a_live_pid_names_it_and_its_command(tmp_path: Path) -> None:
    other = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(600)"], env=clean_env(), start_new_session=True)
    job = launch(
        tmp_path,
        """\
        import os, sys, time, lora_otel
        def wait_for_exit(pid):
            while os.path.exists("/proc/%%d" %% pid):
                time.sleep(0.2)
        with lora_otel.stage("load model"):
            wait_for_exit(int(sys.argv[1]) if len(sys.argv) > 1 else %d)
        """
        % other.pid,
    )
    try:
        _, why = job_lines(tmp_path)
        assert (
            "The main thread polls pid %d to exit (os.path.exists('/proc/%%d' %% pid) at job.py:4 in wait_for_exit, "
            "every 0.2 s); pid %d is alive: " % (other.pid, other.pid) in why
        ), why
        assert "-c import time; time.sleep(600) (sleeping)" in why, why
        record = stall_record(tmp_path, job.pid)
        rule, _, advice = advice_of(record)
        assert rule == "poll loop" and advice.startswith("The job goes on when pid %d (" % other.pid)
        record_case(
            "poll_loop_pid_alive",
            record,
            tmp_path,
            {job.pid: 4711, other.pid: 4800},
            {
                "rule": "poll loop",
                "sentence": ["polls pid 4800 to exit", "pid 4800 is alive"],
                "advice": ["The job goes on when pid 4800"],
            },
        )
    finally:
        stop(job, other)


def test_a_loop_polling_a_child_that_ended_unreaped_says_zombie_and_reap(tmp_path: Path) -> None:
    job = launch(
        tmp_path,
        """\
        import os, subprocess, sys, time, lora_otel
        def wait_for_exit(pid):
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)
        with lora_otel.stage("load model"):
            child = subprocess.Popen([sys.executable, "-c", "pass"])
            wait_for_exit(child.pid)
        """,
    )
    try:
        _, why = job_lines(tmp_path)
        assert "The main thread polls pid " in why and "(os.kill(pid, 0) at job.py:8 in wait_for_exit" in why, why
        assert "has ended, but this process (its parent) has not collected its exit status (reaped it)" in why, why
        record = stall_record(tmp_path, job.pid)
        rule, _, advice = advice_of(record)
        assert rule == "poll loop" and advice.startswith("Reap the child"), advice
        child = record["evidence"]["poll.value"]
        record_case(
            "poll_loop_pid_zombie",
            record,
            tmp_path,
            {job.pid: 4711, child: 4712},
            {"rule": "poll loop", "sentence": ["polls pid 4712", "stays a zombie"], "advice": ["Reap the child"]},
        )
    finally:
        stop(job)


# --- a port ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WAIT_SERVER = """\
import socket, subprocess, sys, time, lora_otel
def wait_for_server(host, port):
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
with lora_otel.stage("load model"):
    %s
    wait_for_server("127.0.0.1", %d)
"""


def test_a_loop_waiting_for_a_port_nobody_listens_on(tmp_path: Path) -> None:
    port = free_port()
    job = launch(tmp_path, WAIT_SERVER % ("pass", port))
    try:
        _, why = job_lines(tmp_path)
        want = (
            "The main thread polls 127.0.0.1:%d for a connection (socket.create_connection((host, port), "
            "timeout=1) at job.py:8 in wait_for_server, every 0.2 s); nothing listens on port %d on this machine."
            % (port, port)
        )
        assert why.endswith(want), why
        record = stall_record(tmp_path, job.pid)
        rule, _, advice = advice_of(record)
        assert rule == "poll loop" and "port %d" % port in advice
        record_case(
            "poll_loop_port_nobody_listens",
            record,
            tmp_path,
            {job.pid: 4711, port: 8765},
            {
                "rule": "poll loop",
                "sentence": ["polls 127.0.0.1:8765 for a connection", "nothing listens on port 8765"],
                "advice": ["Start the server the job expects on port 8765"],
            },
        )
    finally:
        stop(job)


def test_a_port_the_child_started_for_it_does_not_listen_on_names_that_child(tmp_path: Path) -> None:
    port = free_port()
    start = 'server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--port", "%d"])' % port
    job = launch(tmp_path, WAIT_SERVER % (start, port))
    try:
        _, why = job_lines(tmp_path)
        assert "nothing listens on port %d on this machine; pid " % port in why, why
        assert "--port %d) was started with that port and does not listen on it." % port in why, why
        _, _, advice = advice_of(stall_record(tmp_path, job.pid))
        assert advice.startswith("See why pid "), advice
    finally:
        stop(job)


def test_a_port_something_listens_on_is_said_without_advice(tmp_path: Path) -> None:
    """A listener that never sends what the loop wants: the sentence says it listens, no step."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    job = launch(
        tmp_path,
        """\
        import socket, time, lora_otel
        def wait_for_banner(port):
            while True:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    if s.recv(16) == b"ready":
                        return
                time.sleep(0.2)
        with lora_otel.stage("load model"):
            wait_for_banner(%d)
        """
        % port,
    )
    try:
        _, why = job_lines(tmp_path)
        assert "something listens on port %d (pid %d" % (port, os.getpid()) in why, why
        _, _, advice = advice_of(stall_record(tmp_path, job.pid))
        assert advice == ""
    finally:
        stop(job)
        server.close()


def test_a_health_check_of_a_server_child_that_crashed_names_the_child(tmp_path: Path) -> None:
    """vLLM's and many UIs' shape: start the server, poll its health URL; the server died at start
    (never reaped: a zombie child), and nothing listens on the port."""
    port = free_port()
    job = launch(
        tmp_path,
        """\
        import subprocess, sys, time, urllib.request, lora_otel
        def wait_for_server(url):
            while True:
                try:
                    if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                        return
                except OSError:
                    pass
                time.sleep(0.2)
        with lora_otel.stage("load model"):
            server = subprocess.Popen([sys.executable, "-c", "raise SystemExit('out of memory')", "--port", "%d"])
            wait_for_server("http://127.0.0.1:%d")
        """
        % (port, port),
    )
    try:
        _, why = job_lines(tmp_path)
        assert "The main thread polls http://127.0.0.1:%d/health in a sleep loop (" % port in why, why
        assert "nothing listens on port %d on this machine; its child pid " % port in why, why
        assert why.endswith(" has ended (its exit status not yet collected)."), why
        record = stall_record(tmp_path, job.pid)
        rule, _, advice = advice_of(record)
        assert rule == "poll loop" and advice.startswith("Find out why its child pid "), advice
        child = int(re.search(r"its child pid (\d+)", why).group(1))
        record_case(
            "poll_loop_health_url_server_died",
            record,
            tmp_path,
            {job.pid: 4711, child: 4712, port: 8011},
            {
                "rule": "poll loop",
                "sentence": ["polls http://127.0.0.1:8011/health", "its child pid 4712", "has ended"],
                "advice": ["Find out why its child pid 4712"],
            },
        )
    finally:
        stop(job)
