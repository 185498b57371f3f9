"""Harmless everywhere: lora_otel never writes to a descriptor it does not still own (issue 12,
items 2 and two bullets of 10).

Each case is a real traced program (``LORA_OTEL=1``) doing what daemonising code and some
launchers do — ``os.closerange(3, N)``, then opening its own files — and the assertions are on
what the user would check: their file's bytes, exactly; the journal still complete; where files
appear.
"""

from __future__ import annotations

import os
import platform
import subprocess
import threading
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for

from lora_otel.analysis.evidence import StackRequest, send_request
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

# Both the common bound and "every descriptor there can be" (the daemon idiom).
CLOSE_TO = ["1024", "os.sysconf('SC_OPEN_MAX')"]


def _run(tmp_path: Path, src: str, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "prog.py").write_text(src)
    e = clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.05", **env)
    return subprocess.run(
        [PYTHON, "prog.py", *args], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=timeout
    )


CSV_PROG = r"""
import os, sys, time
import lora_otel

os.closerange(3, %s)
f = open("rows.csv", "w")
for i in range(20):
    with lora_otel.stage("row"):
        f.write("%%d,%%d\n" %% (i, i * i))
        f.flush()
    time.sleep(0.02)                 # beats (every 0.05 s) go on meanwhile
lora_otel.mark("rows written")       # a human line: stdout, the --log copy, the journal
f.close()
"""


@pytest.mark.parametrize("close_to", CLOSE_TO)
def test_closerange_then_csv_gets_only_its_rows(tmp_path: Path, close_to: str) -> None:
    """After ``os.closerange(3, N)`` the program's CSV holds exactly the rows it wrote — no beat,
    span record or human line of lora_otel's — and the journal and the ``--log`` copy go on: every
    ``row`` span is in the journal, the mark's line is in the log; when the journal's own
    descriptor was closed, one line says it was reopened."""
    # (LORA_OTEL_LOG: the copy made at start; an argv --log not there yet waits until needed, issue 36 item 4)
    r = _run(tmp_path, CSV_PROG % close_to, LORA_OTEL_LOG=str(tmp_path / "run.log"))
    assert r.returncode == 0, r.stderr
    expected = "".join("%d,%d\n" % (i, i * i) for i in range(20))
    assert (tmp_path / "rows.csv").read_bytes() == expected.encode()
    j = read_journal(tmp_path / "run.log.otel.jsonl")
    rows = [s for s in j.spans if s.name == "row"]
    assert len(rows) == 20 and all(s.end_ns is not None for s in rows)
    assert j.exit is not None and j.exit["code"] == 0
    assert "rows written" in (tmp_path / "run.log").read_text()
    reopened = [ln.msg for ln in j.lines if ln.msg.startswith("the journal's descriptor")]
    if close_to != "1024":  # everything closed: the journal was reopened, and says so once
        assert len(reopened) == 1, [ln.msg for ln in j.lines]
        assert "closed or reused by the program" in reopened[0]


FORK_PROG = r"""
import os
import lora_otel

os.closerange(3, %s)
files = [open("results-%%d.txt" %% i, "w") for i in range(4)]   # the numbers lora_otel had
pid = os.fork()
if pid == 0:
    lora_otel.mark("child at work")  # a record: the child takes over (its journal, the parent's let go)
    for f in files:
        f.write("child result\n")
        f.flush()
    g = open("child-own.txt", "w")   # a file of the child's own, opened after the fork
    g.write("child own\n")
    g.close()
    os._exit(0)
os.waitpid(pid, 0)
for f in files:
    f.write("parent result\n")
    f.close()
"""


@pytest.mark.parametrize("close_to", CLOSE_TO)
def test_forked_child_results_land_in_the_users_file(tmp_path: Path, close_to: str) -> None:
    """A forked child of a program that closed every descriptor and opened its results files writes
    its results to those files (lora_otel's fork handler must not close a number that is the
    program's now), and to a file it opens itself; parent and child (which says something, so it
    has a journal) each have a complete journal holding none of it."""
    r = _run(tmp_path, FORK_PROG % close_to)
    assert r.returncode == 0, r.stderr
    for i in range(4):
        assert (tmp_path / ("results-%d.txt" % i)).read_bytes() == b"child result\nparent result\n"
    assert (tmp_path / "child-own.txt").read_bytes() == b"child own\n"
    found = journals(tmp_path)
    assert len(found) == 2, found
    for p in found:
        text = p.read_text()
        assert "child result" not in text and "child own" not in text
        assert read_journal(p).exit is not None


FROZEN_READ = r"""
libc = ctypes.PyDLL(None)             # its calls keep the GIL: the process is frozen while in one
byte = ctypes.create_string_buffer(1)
sys.setswitchinterval(1e6)
libc.write(1, ready, len(ready))
libc.read(0, byte, 1)                 # the test sends the stack request meanwhile
sys.setswitchinterval(0.005)
"""
"""The program says ``ready`` and waits for a line with the GIL held, as a frozen process does: the
stack request signal (faulthandler, which walks every thread's frames without the GIL) is sent by
lora_otel only to a frozen process, because a thread running Python meanwhile (the beat, every 50 ms
here) can change its frames under the dump and crash the process (SIGSEGV: 7 of 20 such programs,
flooded with requests while waiting in ``sys.stdin.readline()``)."""

STACKS_PROG = r"""
import ctypes, os, sys, time
import lora_otel
from lora_otel._boot import core

os.closerange(3, os.sysconf("SC_OPEN_MAX"))
rows = open("rows.csv", "wb")
ckpts = [open("ckpt-%d.bin" % i, "wb") for i in range(4)]   # the numbers lora_otel had
for c in ckpts:
    c.write(bytes(range(256)))
    c.flush()
reopened = b"stack dumps go to a reopened stacks file"
while not (core.journal_path and reopened in open(core.journal_path, "rb").read()):
    time.sleep(0.01)                  # until a beat has found its stacks file closed, and reopened it
ready = b"READY\n"
FROZEN_READ
time.sleep(0.5)
for c in ckpts:
    c.close()
rows.close()
""".replace("FROZEN_READ\n", FROZEN_READ)


def _stack_signal() -> int:
    """The signal that asks the preamble's faulthandler for a stack dump."""
    from lora_otel._boot import preamble

    return preamble.stack_signal()


READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine())


def _request_stacks_when_frozen(pid: int) -> None:
    """Once the program's main thread waits in ``read(0, ...)`` holding the GIL (`FROZEN_READ`; its
    ``/proc/PID/syscall``), send it the stack request as lora_otel's watchdog does
    (`evidence.send_request`): to that thread (``tgkill``), so the dump is made before it reads on."""
    if READ_SYSCALL is not None:
        wait_for(
            lambda: Path("/proc/%d/syscall" % pid).read_text().split()[:2] == [str(READ_SYSCALL), "0x0"],
            30,
            "the main thread in read(0, ...)",
        )
    send_request(pid, StackRequest(signal=_stack_signal(), path="", tid=pid))


def _start_prog(tmp_path: Path, text: str) -> subprocess.Popen:
    """``text`` run as ``prog.py`` in ``tmp_path`` under lora_otel, beats every 50 ms, its standard
    streams piped to the test."""
    (tmp_path / "prog.py").write_text(text)
    return subprocess.Popen(
        [PYTHON, "prog.py"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.05"),
    )


def test_stack_dump_never_lands_in_the_users_file(tmp_path: Path) -> None:
    """A stack dump requested after the program closed every descriptor and opened its own files
    (binary checkpoints among them, on the numbers lora_otel had) goes to the stacks file beside the
    journal, not into a checkpoint: each checkpoint's bytes are exactly what the program wrote."""
    p = _start_prog(tmp_path, STACKS_PROG)
    try:
        assert p.stdout is not None and p.stdin is not None
        wait_for(lambda: b"READY" in p.stdout.readline(), 30, "READY")
        _request_stacks_when_frozen(p.pid)
        _, err = p.communicate(b"\n", timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    for i in range(4):
        assert (tmp_path / ("ckpt-%d.bin" % i)).read_bytes() == bytes(range(256))
    assert (tmp_path / "rows.csv").read_bytes() == b""
    stacks = list((tmp_path / "lora-otel").glob("*.stacks.txt"))
    assert len(stacks) == 1 and b"prog.py" in stacks[0].read_bytes()


REUSED_PROG = r"""
import ctypes, os, signal, sys, time
import lora_otel
from lora_otel._boot import preamble

with lora_otel.stage("load"):
    time.sleep(0.5)                   # a job: the stacks file is open, faulthandler writes to it
number = preamble._stacks_fd
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
os.closerange(3, os.sysconf("SC_OPEN_MAX"))
ckpt = os.open("ckpt.bin", os.O_WRONLY | os.O_CREAT, 0o644)
os.dup2(ckpt, number)                 # the program's checkpoint on the stacks file's number
r, w = os.pipe()
os.dup2(w, 2)                         # and its stderr a pipe whose reader is gone
os.close(r)
os.close(w)
while preamble._stacks_fd == number and preamble._stacks_interim < 0:
    time.sleep(0.01)                  # until a beat has seen it (faulthandler checks nothing itself)
ready = b"READY %s\n" % str(preamble._stacks_interim >= 0).encode()
FROZEN_READ
while preamble._stacks_interim >= 0:
    time.sleep(0.01)                  # until the stacks file is back
os.write(number, b"mine")
""".replace("FROZEN_READ\n", FROZEN_READ)


def test_a_stack_dump_asked_right_after_the_program_reused_the_stacks_number_misses_its_file(
    tmp_path: Path,
) -> None:
    """The program closes every descriptor, puts a checkpoint on the stacks file's number and its
    stderr on a pipe with no reader (SIGPIPE's default action on). A beat aims the dump at once at
    a number no process can hold, and reopens the stacks file only a second later (no number the
    program counts on is taken, not even for a moment, while it opens its files). A dump asked for
    in between writes nothing: not into the checkpoint, not into the dead pipe (SIGPIPE would end
    the program); the stacks file is back afterwards."""
    p = _start_prog(tmp_path, REUSED_PROG)
    try:
        assert p.stdout is not None and p.stdin is not None
        ready = p.stdout.readline()
        assert ready == b"READY True\n", ready  # aimed away before the reopen
        _request_stacks_when_frozen(p.pid)
        _, err = p.communicate(b"\n", timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert (tmp_path / "ckpt.bin").read_bytes() == b"mine"
    journal = "".join(j.read_text(errors="replace") for j in journals(tmp_path / "lora-otel"))
    assert "stack dumps go to a reopened stacks file" in journal


@pytest.mark.parametrize("log", ["/dev/stdout", "/dev/stderr"])
def test_log_to_the_terminal_stream_prints_each_line_once(tmp_path: Path, log: str) -> None:
    """``--log /dev/stdout`` (or ``/dev/stderr``): each lora_otel line appears once, not twice, and
    no journal is made in /dev (``/dev/stdout.otel.jsonl``): it goes where it would without
    ``--log``, ``./lora-otel/``."""
    stray = Path(log + ".otel.jsonl")
    existed = stray.exists()
    try:
        r = _run(tmp_path, "print('hello')\n", "--log", log)
        assert r.returncode == 0, r.stderr
        both = r.stdout + r.stderr
        assert sum(1 for ln in both.splitlines() if "] started pid" in ln) <= 1, both  # (0: a short run, item 9)
        assert r.stdout.count("hello") == 1
        assert existed or not stray.exists()
        assert len(journals(tmp_path / "lora-otel")) == 1
    finally:
        if stray.exists() and not existed:
            stray.unlink()


def test_log_fifo_gets_only_the_programs_lines(tmp_path: Path) -> None:
    """``--log`` naming a FIFO (a log shipper reading it): only what the program writes reaches
    the FIFO's reader, and no journal is created beside the FIFO."""
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    got: list = []

    def reader() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    prog = "f = open(%r, 'w'); f.write('program line\\n'); f.close()\n" % str(fifo)
    r = _run(tmp_path, prog, "--log", str(fifo))
    t.join(30)
    assert r.returncode == 0, r.stderr
    assert got == [b"program line\n"]
    assert not (tmp_path / "log.fifo.otel.jsonl").exists()
    assert len(journals(tmp_path / "lora-otel")) == 1


def test_forked_child_does_not_recreate_a_removed_journal_dir(tmp_path: Path) -> None:
    """A program that removes ``./lora-otel/`` (cleaning up) and then forks: the directory stays
    removed — no child creates it again."""
    prog = r"""
import os, shutil
shutil.rmtree("lora-otel")
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"""
    r = _run(tmp_path, prog)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "lora-otel").exists()


DAEMON = r"""
import os, sys, time
out = sys.argv[1]
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
import lora_otel
lora_otel.mark("daemon up")  # a record: the daemon's journal is open before the closerange
os.closerange(0, os.sysconf("SC_OPEN_MAX"))
pidfile = open(out + "/d.pid", "w")                    # descriptor 0
log = open(out + "/d.log", "a")                        # descriptor 1
records = open(out + "/d.records", "ab", buffering=0)  # descriptor 2: the program's data
for i in range(3):
    records.write(b"REC%d\n" % i)
    time.sleep(0.6)  # beats meanwhile: lora_otel finds its descriptors gone and says so
records.close()
os.rename(out + "/d.records", out + "/d.done")
os._exit(0)
"""


def test_daemon_whose_data_file_took_descriptor_2_gets_only_its_bytes(tmp_path: Path) -> None:
    """Daemonising code (double fork, ``setsid``, close every descriptor) whose data file then
    takes descriptor 2: lora_otel's lines (the journal reopened, the stacks file reopened) never
    land there — descriptor 2 is no longer the stderr the process started with, so they go to the
    journal only. (Before: two ``[lora-otel]`` lines were written between the program's records.)"""
    (tmp_path / "daemon.py").write_text(DAEMON)
    r = subprocess.run(
        [PYTHON, "daemon.py", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.2"),
    )
    assert r.returncode == 0, r.stderr
    wait_for(lambda: (tmp_path / "d.done").exists(), 30, "the daemon to finish")
    assert (tmp_path / "d.done").read_bytes() == b"REC0\nREC1\nREC2\n"
    daemon = [read_journal(p) for p in journals(tmp_path) if "REC" not in p.name]
    lines = [ln.msg for j in daemon for ln in j.lines]
    assert any("closed or reused by the program" in m for m in lines), lines


STDIO_GAPS = r"""
import os, sys, time
import lora_otel

with lora_otel.stage("setup"):       # a job from here (promoted in this thread), beating every 0.05 s
    saved = [os.dup(fd) for fd in (0, 1, 2)]
mine = [os.fstat(fd)[1:3] for fd in saved]  # (st_ino, st_dev) of the program's stdin, stdout, stderr
taken, lost = set(), set()
for cycle in range(int(sys.argv[1])):
    for fd in (0, 1, 2):             # as CPython's test_subprocess test_close_fds_0_1_2 does
        os.close(fd)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:    # meanwhile no number of these is anyone's but the program's
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
                taken.add(fd)
            except OSError:
                pass
    for fd in (0, 1, 2):
        os.dup2(saved[fd], fd)       # its own back, as the test's _restore_fds does
    time.sleep(0.3)
    for fd in (0, 1, 2):
        try:
            if os.fstat(fd)[1:3] != mine[fd]:
                lost.add(fd)
        except OSError:
            lost.add(fd)
        os.dup2(saved[fd], fd)
os.write(saved[1], ("taken=%s lost=%s\n" % (sorted(taken), sorted(lost))).encode())
"""


def test_beats_take_no_standard_number_the_program_closed_for_a_while(tmp_path: Path) -> None:
    """A program that closes descriptors 0-2 for a while and then puts its own back with ``dup2``
    (CPython's test_subprocess ``test_close_fds_0_1_2``; a daemon's ``/dev/null``) finds none of
    those numbers open meanwhile, and its own files under them afterwards: the beat, which would
    take the lowest free number for each file it reads, waits until they are back. (Before: a beat
    read ``/proc/self/status`` at 0, the program's ``dup2`` replaced it, and the beat's ``close(0)``
    closed the program's restored stdin; EBADF in the program, issue 36 item 10.)"""
    (tmp_path / "gaps.py").write_text(STDIO_GAPS)
    with open(os.devnull, "rb") as stdin:
        r = subprocess.run(
            [PYTHON, "gaps.py", "6"],
            cwd=tmp_path,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.05"),
        )
    assert r.returncode == 0, r.stderr
    assert "taken=[] lost=[]" in r.stdout, (r.stdout, r.stderr)
