"""What a blocked job waits on — a descriptor, a path, a child — and its other end, along the chain
of waits (issue 37, item 1: the first and fourth bullets; item 2: the advice).

The slow tests run real programs that really hang, traced (``LORA_OTEL=1``), inside a stage with a
2 s limit, and read the watchdog's why line in the job's ``--log``:

- a job in ``input()`` whose stdin is a pipe from a launcher that waits for it and never writes;
- a job opening a FIFO nobody opens for writing, and one reading a FIFO whose writer sleeps;
- a job reading a socket whose local peer (a server) itself waits on a pipe it holds both ends of;
- a job in ``subprocess.run`` of a child that reads its standard input, a pipe nobody writes.

Each also gathers the evidence itself (`evidence.gather`, no signal) and, with
``LORA_OTEL_RECORD_EVIDENCE=<dir>``, records it (paths made generic) as ``<dir>/<case>.json``;
tests/test_rules_over_evidence.py runs `explain` over the recordings in tests/data/evidence.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import evidence_cases as cases
import pytest
from procs import PYTHON, REPO, clean_env, lora_otel_cli, wait_for

from lora_otel.analysis import verdict
from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX, gather
from lora_otel.analysis.stall import Stall
from lora_otel.analysis.waits import KEY
from lora_otel.journal.reader import Journal, read_journal
from lora_otel.journal.records import Span

STAGE = "ask"
LIMIT = "%s=2" % STAGE


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def start(
    tmp_path: Path, files: dict[str, str], argv: list[str], traced: bool = True, **popen: Any
) -> subprocess.Popen:
    for name, source in files.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
    with open(tmp_path / ("%s.txt" % argv[0].split(".")[0]), "wb") as out:
        popen.setdefault("stdout", out)
        popen.setdefault("stderr", subprocess.STDOUT)
        return subprocess.Popen(
            [PYTHON, *argv],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1" if traced else "0", LORA_OTEL_STALL_AFTER=LIMIT),
            start_new_session=True,
            **popen,
        )


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(timeout=30)
    if proc.stdin is not None:
        proc.stdin.close()


def why_line(tmp_path: Path, needle: str) -> str:
    """The watchdog's line with the diagnosis in the job's --log."""
    return wait_for(
        lambda: [
            x
            for x in text(tmp_path / "run.log").splitlines()
            if ("STALLED:" in x or "is stalled: " in x) and needle in x
        ],
        timeout=90,
        what="the watchdog's line with %r in run.log" % needle,
    )[0]


def a_stall() -> Stall:
    return Stall("alive", Span(STAGE, "a" * 16, None, "b" * 32, 1), 30.0, 2.0, "")


KEEP = ("process.state", "process.wait_channel", "python.stacks", "py_spy.dump")


def record(case: str, tmp_path: Path, evidence: dict[str, Any], journal: Journal, expect: dict[str, Any]) -> None:
    """With ``LORA_OTEL_RECORD_EVIDENCE=<dir>``: the evidence the rule reads, as ``<dir>/<case>.json`` in
    tests/evidence_cases.py's format, the test's directory and the interpreter's path made generic."""
    out = cases.record_dir()
    if out is None:
        return
    kept = {k: v for k, v in evidence.items() if k.startswith(KEY) or k[len(PREFIX) :] in KEEP}
    stall = a_stall()
    raw = json.dumps(
        {
            "case": case,
            "source": "tests/test_waits.py (real run, paths made generic)",
            "stall": {"kind": stall.kind, "stage": STAGE, "open_for_s": stall.open_for_s, "limit_s": stall.limit_s},
            "now_ns": None,
            "journal": {"pid": journal.pid, "main_frames": journal.main_frames, "root_attrs": {}},
            "evidence": kept,
            "expect": {k: v for k, v in expect.items() if k != "no_advice"}
            | ({"advice": ""} if expect.get("no_advice") else {}),
        },
        indent=1,
        ensure_ascii=False,
    )
    for mine, generic in (
        (str(tmp_path), "/work/job"),
        (os.path.dirname(PYTHON), "/usr/bin"),
        (str(REPO), "/opt/venv/lib/python3/site-packages"),
        (sys.base_prefix, "/usr"),
    ):
        raw = raw.replace(mine, generic)
    (out / ("%s.json" % case)).write_text(raw + "\n", encoding="utf-8")


def check_now(case: str, tmp_path: Path, pid: int, expect: dict[str, Any]) -> None:
    """Gather the evidence now (no signal), diagnose it, check it against ``expect``, record it."""
    path = tmp_path / "run.log.otel.jsonl"
    journal = read_journal(path)
    assert journal.pid == pid, (journal.pid, pid)
    evidence = gather(pid, None)
    found = explain(a_stall(), evidence, journal)
    assert_expected(found, expect, evidence)
    record(case, tmp_path, evidence, journal, expect)


def assert_expected(found: Any, expect: dict[str, Any], evidence: Any = None) -> None:
    shown = "%s\n(advice: %s)\n%s" % (found.sentence, found.advice, json.dumps(evidence, default=str)[:3000])
    assert found.attrs["lora_otel.diagnosis.rule"] == expect["rule"], shown
    for fragment in expect.get("sentence", []):
        assert re.search(fragment, found.sentence), (fragment, shown)
    for fragment in expect.get("advice") or []:
        assert re.search(fragment, found.advice), (fragment, shown)
    if expect.get("no_advice") or expect.get("advice") == "":
        assert found.advice == "", shown


# --- a prompt on stdin, a pipe from a launcher that waits for the job ------------------------------

PROMPT_JOB = """\
import lora_otel
with lora_otel.stage("ask"):
    answer = input("overwrite the output directory? [y/N] ")
"""

UI = """\
import subprocess, sys
p = subprocess.Popen([sys.executable, "job.py", "--log", "run.log"], stdin=subprocess.PIPE)
open("job.pid", "w").write(str(p.pid))
p.wait()  # never writes to the job's stdin
"""

PROMPT = {
    "rule": "descriptor wait",
    "sentence": [
        r"^The main thread waits to read its standard input \(fd 0, a pipe\) at job\.py:3 in <module>",
        r"its write end is held by pid \d+ \(`python\S* ui\.py`\), which waits for its child this job "
        r"\(pid \d+\) to exit — each waits for the other\.$",
    ],
    "advice": [r"asks for input on its standard input", r"/dev/null", r"skips the prompt"],
}


@pytest.mark.slow
def test_a_prompt_on_stdin_from_a_launcher_that_never_writes(tmp_path: Path) -> None:
    launcher = start(tmp_path, {"job.py": PROMPT_JOB, "ui.py": UI}, ["ui.py"])
    try:
        line = why_line(tmp_path, "waits to read its standard input")
        job = int(text(tmp_path / "job.pid"))
        assert line.startswith("[lora-otel][%d][" % job), line
        assert "pid %d (`" % launcher.pid in line and "ui.py`), which waits for its child this job" in line, line
        journal = read_journal(tmp_path / "run.log.otel.jsonl")
        [stall] = journal.stalls
        assert stall["diagnosis"] in line
        assert stall["evidence"]["wait.call"].startswith("read fd 0 pipe:["), stall["evidence"]
        assert stall["evidence"]["wait.chain_pids"] == "%d, %d" % (launcher.pid, job), stall["evidence"]
        shown = lora_otel_cli("inspect", str(tmp_path / "run.log.otel.jsonl"), cwd=tmp_path)
        assert stall["diagnosis"] in shown.stdout, shown.stdout
        quiet = verdict.quiet_evidence(journal)  # what inspect reads of a live stall with no record: no signal
        assert explain(a_stall(), quiet, journal).sentence.startswith(
            "The main thread waits to read its standard input (fd 0, a pipe)"
        ), quiet
        check_now("stdin_prompt_pipe_from_launcher", tmp_path, job, PROMPT)
    finally:
        stop(launcher)


# --- a FIFO nobody opens for writing; a FIFO whose writer sleeps ----------------------------------

FIFO_JOB = """\
import os, lora_otel
os.mkfifo("in.fifo")
open("job.pid", "w").write(str(os.getpid()))
with lora_otel.stage("ask"):
    with open("in.fifo") as f:
        data = f.read()
"""

FIFO_OPEN = {
    "rule": "descriptor wait",
    "sentence": [
        r"^The main thread waits to open the FIFO /\S+/in\.fifo at job\.py:5 in <module>( → \w+)? "
        r"\(a FIFO's open waits",
        r"no other process has it open\.$",
    ],
    "advice": [r"^Start the program that opens /\S+/in\.fifo from the other side"],
}


@pytest.mark.slow
def test_a_fifo_nobody_opens_for_writing(tmp_path: Path) -> None:
    job = start(tmp_path, {"job.py": FIFO_JOB}, ["job.py", "--log", "run.log"])
    try:
        line = why_line(tmp_path, "waits to open the FIFO")
        assert str(tmp_path / "in.fifo") in line, line
        check_now("fifo_open_no_writer", tmp_path, job.pid, FIFO_OPEN)
    finally:
        stop(job)


WRITER = """\
import os, time
fd = os.open("in.fifo", os.O_WRONLY)  # opens the FIFO, then never writes
open("writer.pid", "w").write(str(os.getpid()))
time.sleep(600)
"""

FIFO_READ = {
    "rule": "descriptor wait",
    "sentence": [
        r"^The main thread waits to read descriptor \d+ \(the FIFO /\S+/in\.fifo\) at job\.py:6 in <module>",
        r"its write end is held by pid \d+ \(`python\S* writer\.py`\), which sleeps",
    ],
    "advice": [r"^Look at pid \d+ \(`python\S* writer\.py`\), at the end of the chain"],
}


@pytest.mark.slow
def test_a_fifo_whose_writer_sleeps(tmp_path: Path) -> None:
    job = start(tmp_path, {"job.py": FIFO_JOB, "writer.py": WRITER}, ["job.py", "--log", "run.log"])
    writer = None
    try:
        wait_for(lambda: (tmp_path / "in.fifo").exists(), what="the FIFO")
        secret = "hf_" + "Q" * 30
        writer = start(tmp_path, {}, ["writer.py", "--hf_token", secret], stdout=subprocess.DEVNULL)
        line = why_line(tmp_path, "waits to read descriptor")
        # not part of the job (the test started it): named by its program and script only
        assert "writer.py`), which sleeps" in line and "--hf_token" not in line, line
        assert secret not in text(tmp_path / "run.log"), "another program's secret argument is left out"
        check_now("fifo_read_writer_sleeps", tmp_path, job.pid, FIFO_READ)
    finally:
        stop(job)
        if writer is not None:
            stop(writer)


# --- a socket whose local peer itself waits -----------------------------------------------------

SERVER = """\
import os, socket, sys
kind = sys.argv[1]
if kind == "tcp":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    addr = str(s.getsockname()[1])
else:
    s = socket.socket(socket.AF_UNIX); s.bind("srv.sock"); s.listen()
    addr = "srv.sock"
with open("addr.tmp", "w") as f:
    f.write(addr)
os.rename("addr.tmp", "addr")
c, _ = s.accept()
r, w = os.pipe()  # waits for the pipe it holds both ends of: a reply never comes
os.read(r, 1)
"""

CLIENT = """\
import os, socket, sys, lora_otel
kind, addr = sys.argv[1], open("addr").read()
with lora_otel.stage("ask"):
    c = socket.create_connection(("127.0.0.1", int(addr))) if kind == "tcp" else socket.socket(socket.AF_UNIX)
    if kind != "tcp":
        c.connect(addr)
    reply = c.recv(10)
"""


def socket_expect(kind: str) -> dict[str, Any]:
    what = r"a TCP connection 127\.0\.0\.1:\d+ → 127\.0\.0\.1:\d+" if kind == "tcp" else r"a Unix socket \S*srv\.sock"
    return {
        "rule": "descriptor wait",
        "sentence": [
            r"^The main thread waits to read descriptor \d+ \(%s\) at job\.py:7 in <module>" % what,
            r"the other end is held by pid \d+ \(`python\S* server\.py`\), which waits to read descriptor \d+ "
            r"\(a pipe\); the write end of that pipe is held by the same process itself",
        ],
        "advice": [r"^The process pid \d+ \(`python\S* server\.py`\) holds the write end of the pipe"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_socket_whose_local_peer_waits_on_a_pipe(tmp_path: Path, kind: str) -> None:
    server = start(tmp_path, {"server.py": SERVER, "job.py": CLIENT}, ["server.py", kind], stdout=subprocess.DEVNULL)
    job = None
    try:
        wait_for(lambda: (tmp_path / "addr").exists(), what="the server's address")
        job = start(tmp_path, {}, ["job.py", kind, "--log", "run.log"])
        line = why_line(tmp_path, "the other end is held by pid %d" % server.pid)
        assert "server.py`), which waits to read descriptor" in line, line  # (not the job's: no arguments)
        check_now("socket_%s_peer_waits" % kind, tmp_path, job.pid, socket_expect(kind))
    finally:
        if job is not None:
            stop(job)
        stop(server)


# --- subprocess.run of a child that reads its stdin -----------------------------------------------

PARENT = """\
import os, subprocess, sys, lora_otel
open("job.pid", "w").write(str(os.getpid()))
with lora_otel.stage("ask"):
    subprocess.run([sys.executable, "child.py"], capture_output=sys.argv[1] == "capture")
"""

CHILD = """\
import sys
line = sys.stdin.readline()
"""

CHILD_STDIN = {
    "rule": "descriptor wait",
    "sentence": [
        r"^The main thread waits for its child process to exit at job\.py:4 in <module> → subprocess\.py:\d+ in \w+",
        r": pid \d+ \(`python\S* child\.py`\) waits to read its standard input \(fd 0, a pipe\); the write end of that "
        r"pipe is held by pid \d+",
    ],
    "advice": [r"^The child pid \d+ \(`python\S* child\.py`\) waits to read its standard input", r"DEVNULL"],
}


CHILD_CAPTURED = {
    "rule": "descriptor wait",
    "sentence": [
        r"^The main thread waits for descriptor \d+ \(a pipe\) or descriptor \d+ \(a pipe\) to be readable at "
        r"job\.py:4 in <module> → selectors\.py:\d+ in \w+",
        r"; the other end is held by pid \d+ \(`python\S* child\.py`\), which waits to read its standard input "
        r"\(fd 0, a pipe\); the write end of that pipe is held by pid \d+",
    ],
    "advice": [r"^The process pid \d+ \(`python\S* child\.py`\) waits to read its standard input", r"DEVNULL"],
}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["wait", "capture"])
def test_a_parent_waiting_for_a_child_that_reads_its_stdin(tmp_path: Path, how: str) -> None:
    """``subprocess.run`` waits for the child (wait4), or with ``capture_output`` polls its output pipes
    (poll): either way the chain goes to the child, which reads its standard input (the parent's, a
    pipe the test holds and never writes)."""
    files = {"job.py": PARENT, "child.py": CHILD}
    parent = start(tmp_path, files, ["job.py", how, "--log", "run.log"], stdin=subprocess.PIPE)
    try:
        line = why_line(tmp_path, "waits to read its standard input (fd 0, a pipe)")
        assert "child.py`)" in line, line
        assert ("waits for its child process to exit" in line) == (how == "wait"), line
        assert "pid %d (`" % os.getpid() in line, "the chain ends at the test, which holds the pipe: %s" % line
        case = "child_reads_stdin" if how == "wait" else "child_reads_stdin_output_captured"
        check_now(case, tmp_path, parent.pid, CHILD_STDIN if how == "wait" else CHILD_CAPTURED)
    finally:
        stop(parent)


# --- a file on a FUSE mount whose server never answers --------------------------------------------

HANGFS = '''\
"""Runs the job in a private mount namespace (nothing of it is seen outside), with a FUSE mount at
./data/mnt whose server -- this process, holding /dev/fuse open -- never answers a request."""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
    sys.exit(77)
if libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None) != 0:  # MS_REC | MS_PRIVATE
    sys.exit(77)
mnt = os.path.abspath("data/mnt")  # not in the job's own directory: see the note below
os.makedirs(mnt, exist_ok=True)
try:
    fd = os.open("/dev/fuse", os.O_RDWR)
except OSError:
    sys.exit(77)
opts = "fd=%d,rootmode=40000,user_id=%d,group_id=%d" % (fd, os.getuid(), os.getgid())
if libc.mount(b"hangfs", mnt.encode(), b"fuse.hangfs", 0, opts.encode()) != 0:
    sys.exit(77)
pid = os.fork()
if pid == 0:
    os.close(fd)
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]], dict(os.environ, LORA_OTEL="1"))
with open("job.pid", "w") as f:
    f.write(str(pid))
os.waitpid(pid, 0)
'''

FUSE_JOB = """\
import lora_otel
with lora_otel.stage("ask"):
    with open("data/mnt/shards/000.bin", "rb") as f:
        data = f.read()
"""

FUSE = {
    "rule": "descriptor wait",
    "sentence": [
        r"^The main thread waits to open /\S+/mnt/shards/000\.bin on the fuse\.hangfs mount /\S+/mnt \(hangfs\) "
        r"at job\.py:3 in <module>",
        r"for the file system's server to answer \(state D, wait channel \w+\)",
        r"served by the only program holding /dev/fuse open, pid \d+ \(`python\S* hangfs\.py job\.py",
    ],
    "advice": [r"^Check the fuse\.hangfs mount /\S+/mnt from a shell \(`ls /\S+/mnt`\)", r"umount -l"],
}


# The mount is one level below the job's directory: with the dead mount *in* the directory of the job's
# journal, the sidecar itself hangs as it starts, in an lstat (newfstatat) of the mount point (read from
# its /proc/<pid>/syscall and /proc/<pid>/mem), so nothing is diagnosed — a limit of the sidecar, reported.


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse here")
def test_a_file_on_a_fuse_mount_that_never_answers(tmp_path: Path) -> None:
    """The main thread in state D opening a file on a FUSE mount: not "disk I/O" but the mount, its
    server (the one process holding /dev/fuse), and to check the mount."""
    server = start(
        tmp_path, {"hangfs.py": HANGFS, "job.py": FUSE_JOB}, ["hangfs.py", "job.py", "--log", "run.log"], traced=False
    )
    try:
        wait_for(lambda: (tmp_path / "job.pid").exists() or server.poll() is not None, what="the FUSE mount")
        if server.poll() == 77:
            pytest.skip("cannot mount FUSE in a private mount namespace here (no CAP_SYS_ADMIN or /dev/fuse)")
        line = why_line(tmp_path, "on the fuse.hangfs mount")
        assert "disk I/O" not in line, line
        check_now("fuse_mount_never_answers", tmp_path, int(text(tmp_path / "job.pid")), FUSE)
    finally:
        stop(server)


# --- the terminal: a prompt in the foreground, a read from the background -------------------------

TERM = '''\
"""Starts the job with a new terminal (a pty) as its standard input, in the background of that
terminal ("bg") or in its foreground ("fg"), as a shell does."""
import os, signal, sys, fcntl, termios
where = sys.argv[1]
master, slave = os.openpty()
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    job = os.fork()
    if job == 0:
        os.setpgid(0, 0)
        os.dup2(slave, 0)
        os.execve(sys.executable, [sys.executable, *sys.argv[2:]], dict(os.environ, LORA_OTEL="1"))
    os.setpgid(job, job)
    if where == "fg":
        os.tcsetpgrp(slave, job)
    with open("job.pid", "w") as f:
        f.write(str(job))
    os.waitpid(job, 0)
    os._exit(0)
os.waitpid(pid, 0)
'''

TERMINAL = {
    "fg": {
        "rule": "descriptor wait",
        "sentence": [
            r"^The main thread waits to read its standard input \(fd 0, the terminal /dev/pts/\d+\) "
            r"at job\.py:3 in <module>",
        ],
        "advice": [r"^It waits for an answer typed in its terminal"],
    },
    "bg": {
        "rule": "stopped",
        "sentence": [
            r"^The process is stopped, in a read of its standard input, the terminal /dev/pts/\d+ from the "
            r"background \(its process group \d+ is not the terminal's foreground group \d+\)",
            r"\(SIGTTIN\)",
        ],
        "advice": [r"^It reads its terminal from the background: bring it to the foreground \(`fg`\)"],
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["fg", "bg"])
def test_a_terminal_read_in_the_foreground_and_from_the_background(tmp_path: Path, where: str) -> None:
    """A prompt on the job's terminal: in the foreground it waits for an answer typed there; from the
    background the terminal stops it (SIGTTIN) — which the "stopped" rule used to call SIGSTOP or a
    debugger."""
    files = {"term.py": TERM, "job.py": PROMPT_JOB}
    term = start(tmp_path, files, ["term.py", where, "job.py", "--log", "run.log"], traced=False)
    try:
        line = why_line(tmp_path, "the terminal /dev/pts/")
        assert ("from the background" in line) == (where == "bg"), line
        check_now("terminal_%s" % where, tmp_path, int(text(tmp_path / "job.pid")), TERMINAL[where])
    finally:
        try:
            os.kill(int(text(tmp_path / "job.pid") or 0) or -1, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        stop(term)


# --- what the rule leaves to the others (hand-written evidence) -----------------------------------


def hand_written(wait: dict[str, Any], state: str = "S (sleeping)", wchan: str = "") -> dict[str, Any]:
    return {
        PREFIX + "process.state": state,
        PREFIX + "process.wait_channel": wchan or str(wait.get("wchan") or ""),
        KEY + "threads": [{"pid": 4712, "tid": 4712, "main": True, "cmdline": "python job.py", "state": "S", **wait}],
    }


def rule_for(evidence: dict[str, Any]) -> str:
    return explain(a_stall(), evidence).attrs["lora_otel.diagnosis.rule"]


def test_a_socket_with_no_local_peer_is_the_network_rule() -> None:
    """A read on a TCP connection to another host: no process here at its other end, the network tells it."""
    wait = {
        "syscall": "recvfrom",
        "op": "read",
        "fd": 5,
        "wchan": "wait_woken",
        "what": {
            "kind": "socket",
            "target": "socket:[1]",
            "proto": "tcp",
            "local": "10.0.0.2:40000",
            "remote": "10.0.0.5:443",
            "tcp_state": "ESTABLISHED",
        },
    }
    evidence = hand_written(wait)
    evidence[PREFIX + "net.tcp_connections"] = ["10.0.0.2:40000 -> 10.0.0.5:443 ESTABLISHED"]
    assert rule_for(evidence) == "network"


def test_an_event_loop_polling_its_own_wakeup_pipe_is_not_told() -> None:
    """asyncio's selector polls its own socket pair (and the network): the other end is the job itself."""
    job = {"pid": 4712, "role": "peer", "cmdline": "python job.py", "state": "S", "wchan": "ep_poll", "loop": True}
    wait = {
        "syscall": "epoll_wait",
        "op": "poll",
        "wchan": "ep_poll",
        "polled": [{"fd": 4, "op": "read", "what": {"kind": "socket", "proto": "unix"}, "other": [job]}],
    }
    assert rule_for(hand_written(wait)) != "descriptor wait"


def test_a_child_that_only_sleeps_is_the_worker_pool_rule() -> None:
    """waitpid on a child that sleeps: nothing this reading tells better; the pool rule (or a later one) speaks."""
    child = {"pid": 4713, "role": "child", "cmdline": "python step.py", "state": "S", "wchan": "hrtimer_nanosleep"}
    wait = {"syscall": "wait4", "op": "child", "child": 4713, "wchan": "do_wait", "other": [child]}
    assert rule_for(hand_written(wait)) != "descriptor wait"


def test_a_local_file_read_is_not_told() -> None:
    """A read of a regular file on a local disk: not a wait on another party."""
    wait = {
        "syscall": "read",
        "op": "read",
        "fd": 3,
        "wchan": "-",
        "what": {"kind": "file", "target": "/data/a.bin", "mount": "/", "fstype": "ext4"},
    }
    assert rule_for(hand_written(wait, "D (disk sleep)", "folio_wait_bit")) == "disk I/O"


def test_an_nfs_file_names_the_mount_and_never_the_disk() -> None:
    wait = {
        "syscall": "read",
        "op": "read",
        "fd": 3,
        "wchan": "rpc_wait_bit_killable",
        "state": "D",
        "what": {
            "kind": "file",
            "target": "/mnt/data/a.bin",
            "mount": "/mnt/data",
            "fstype": "nfs4",
            "source": "srv:/export",
        },
    }
    found = explain(a_stall(), hand_written(wait, "D (disk sleep)"))
    assert found.attrs["lora_otel.diagnosis.rule"] == "descriptor wait", found.sentence
    assert found.sentence.startswith(
        "The main thread waits to read descriptor 3 (the file /mnt/data/a.bin on the nfs4 mount /mnt/data "
        "(srv:/export))"
    ), found.sentence
    assert "`ls /mnt/data`" in found.advice and "srv:/export" in found.advice, found.advice


def test_a_pipe_with_no_visible_writer_gives_no_advice() -> None:
    """The read end's writer is another user's or in another PID namespace: said, and no step guessed."""
    wait = {
        "syscall": "read",
        "op": "read",
        "fd": 7,
        "wchan": "anon_pipe_read",
        "what": {"kind": "pipe", "target": "pipe:[9]", "queued_bytes": 0},
        "other": [],
    }
    found = explain(a_stall(), hand_written(wait))
    assert found.attrs["lora_otel.diagnosis.rule"] == "descriptor wait"
    assert "no process this user can see holds its write end" in found.sentence, found.sentence
    assert found.advice == ""
