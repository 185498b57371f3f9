"""Harmless everywhere, blocking (issue 20, items 2-4): lora_otel's lines on stderr never block the
program or lora_otel's own threads (a full pipe nobody reads, a terminal stopped with Ctrl-S) and
never change an exit status (a reader gone); its locks are never met held by a signal handler,
another thread or a forked child; ``fail_open`` lets ``KeyboardInterrupt`` and ``SystemExit``
through; and only the project's own test suite turns internal errors into failures."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals, wait_for

from lora_otel.journal.reader import Journal, read_journal

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipes, ptys and /proc of Linux")


def job_env(tmp_path: Path, **extra: str) -> dict:
    """``LORA_OTEL=1`` with the journals in ``tmp_path/journals``; stderr buffered as a user's is
    (no ``PYTHONUNBUFFERED`` from the test runner's environment)."""
    env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "journals"), **extra)
    env.pop("PYTHONUNBUFFERED", None)
    return env


def top_journal(tmp_path: Path) -> Journal:
    found = [read_journal(p) for p in journals(tmp_path / "journals")]
    top = [j for j in found if j.root is not None and j.root.parent_id is None]
    assert len(top) == 1, [j.path for j in found]
    return top[0]


def stop(proc: subprocess.Popen) -> None:
    """End ``proc``'s whole session (a job stuck as the bug would leave it, with its children), and
    close the test's ends of its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # (also when the job has exited: its children may not have)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def readline(stream, timeout: float = 90) -> bytes:
    """The next line of the job's ``stream`` (a pipe), waiting ``timeout`` s at most for it."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "no line from the job in %s s" % timeout
    return stream.readline()


def read_available(fd: int) -> bytes:
    """Everything readable from the pipe ``fd`` now, without waiting."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def assert_whole_lines(data: bytes) -> list[str]:
    """Every line in ``data`` is a whole ``[lora-otel]`` line (none cut by a partial write)."""
    lines = data.decode().splitlines()
    assert data.endswith(b"\n") or not data, data[-200:]
    bad = [line for line in lines if not re.match(LINE_RE, line)]
    assert not bad, bad[:3]
    return lines


# --- a full pipe, a stopped terminal, a reader gone -------------------------------------------

FILL_JOB = textwrap.dedent("""
    import sys, time, lora_otel
    n = 0
    with lora_otel.stage("slow stage"):
        start = time.monotonic()
        while time.monotonic() - start < 6 or n < 1000:  # > 64 KiB of lines, for 6 s
            lora_otel.mark("record %d %s" % (n, "x" * 200))
            n += 1
            time.sleep(0.002)
    print("PHASE1", n, flush=True)
    sys.stdin.readline()  # the launcher reads stderr now
    lora_otel.mark("after the drain")
    print("DONE", flush=True)
""")


@pytest.mark.slow
def test_a_full_stderr_pipe_nobody_reads_blocks_nothing(tmp_path: Path) -> None:
    """A launcher reads the job's stdout and leaves its stderr pipe unread for 6 s while the job,
    which writes nothing to stderr itself, makes lora_otel say > 64 KiB of lines: the job and the
    beat thread go on (the slow stage is narrated at 1 s and 3 s, in the journal), the pipe holds
    only whole lines, every line is in the journal, and once the launcher has read the pipe the
    next line says how many did not fit."""
    (tmp_path / "job.py").write_text(FILL_JOB)
    proc = subprocess.Popen(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=job_env(tmp_path, LORA_OTEL_NARRATE_S="1", LORA_OTEL_BEAT_S="0.2"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        phase1 = readline(proc.stdout)  # the job is past its 6 s of lines
        assert phase1.startswith(b"PHASE1 "), phase1
        marks = int(phase1.split()[1])
        size = fcntl.fcntl(proc.stderr.fileno(), fcntl.F_GETPIPE_SZ)
        before = read_available(proc.stderr.fileno())
        assert size * 0.9 < len(before) <= size, (len(before), size)  # the pipe was full
        shown = assert_whole_lines(before)
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b"DONE\n"
        after = assert_whole_lines(proc.stderr.read())
    finally:
        stop(proc)
    j = top_journal(tmp_path)
    msgs = [line.msg for line in j.lines]
    assert sum(m.startswith("mark: record ") for m in msgs) == marks
    assert any(re.match(r"still in slow stage after 1(\.\d+)? s", m) for m in msgs), msgs[-5:]
    assert any(re.match(r"still in slow stage after 3(\.\d+)? s", m) for m in msgs), msgs[-5:]  # the pipe was full then
    notice = re.match(LINE_RE, after[0]).group(3)  # type: ignore[union-attr]
    dropped = re.fullmatch(r"(\d+) lines not shown here: stderr had no room \(the journal has every line\)", notice)
    assert dropped, after[:2]
    assert re.match(LINE_RE, after[1]).group(3) == "mark: after the drain"  # type: ignore[union-attr]
    said_before = msgs.index("mark: after the drain")
    shown_marks = sum(" mark: record " in line for line in shown)
    assert marks - shown_marks <= int(dropped.group(1)) <= said_before - len(shown)  # each one not shown counted


@pytest.mark.slow
def test_a_terminal_stopped_with_ctrl_s_blocks_nothing(tmp_path: Path) -> None:
    """stderr is a terminal whose output was stopped with Ctrl-S (the user scrolls back in it): a
    job that writes nothing to stderr itself runs to its end; lora_otel's lines are in the journal."""
    (tmp_path / "job.py").write_text(
        "import lora_otel\nfor i in range(50):\n    lora_otel.mark('line %d' % i)\nprint('DONE', flush=True)\n"
    )
    master, slave = pty.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[0] |= termios.IXON
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        os.write(master, b"\x13")  # Ctrl-S: the terminal stops output (once the line discipline has read it)
        wait_for(lambda: not writes_now(slave), timeout=30, what="the terminal to stop")
        proc = subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=job_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0 and out == b"DONE\n"
        finally:
            stop(proc)
        os.write(master, b"\x11")  # Ctrl-Q
    finally:
        os.close(slave)
        os.close(master)
    msgs = [line.msg for line in top_journal(tmp_path).lines]
    assert [m for m in msgs if m.startswith("mark: ")] == ["mark: line %d" % i for i in range(50)]


SOCKET_JOB = textwrap.dedent("""
    import lora_otel
    for i in range(1000):  # 1 MB of lines
        lora_otel.mark("line %d %s" % (i, "x" * 1000))
    print("DONE", flush=True)
""")


@pytest.mark.slow
def test_a_socket_stderr_nobody_reads_blocks_nothing(tmp_path: Path) -> None:
    """stderr is a stream socket (a systemd service's, into the journal) whose reader is busy: a job
    that writes nothing to stderr itself runs to its end while lora_otel's lines overflow the
    socket's buffer; what was sent is whole lines, and the journal has every line."""
    (tmp_path / "job.py").write_text(SOCKET_JOB)
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=job_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=theirs.fileno(),
            start_new_session=True,
        )
        theirs.close()
        try:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0 and out == b"DONE\n"
        finally:
            stop(proc)
        sent = read_available(ours.fileno())
    finally:
        ours.close()
    shown = assert_whole_lines(sent)
    assert len(sent) < 1_000_000 and len(shown) < 1000  # the buffer was full: lines were dropped
    msgs = [line.msg for line in top_journal(tmp_path).lines]
    assert sum(m.startswith("mark: line ") for m in msgs) == 1000


def writes_now(tty: int) -> bool:
    """Whether the terminal ``tty`` takes a byte now (through a non-blocking description of its own)."""
    fd = os.open("/proc/self/fd/%d" % tty, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        os.write(fd, b".")
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


READER_GONE_JOB = textwrap.dedent("""
    import signal, sys, lora_otel
    if %r:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as CLI tools do, to end quietly under `| head`
    sys.stdin.read()  # the launcher has closed its end of our stderr by now
    lora_otel.mark("nobody reads this")
    print("JOB ran", flush=True)
    sys.exit(%d)
""")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "sigpipe_default"), [(0, False), (3, False), (0, True)], ids=["exit-0", "exit-3", "SIGPIPE-default"]
)
def test_a_stderr_reader_gone_keeps_the_exit_status(tmp_path: Path, code: int, sigpipe_default: bool) -> None:
    """The launcher closes its end of the job's stderr pipe early (a log panel closed, ``| head``):
    the job's exit status is its own (0 stays 0, 3 stays 3, never the interpreter's 120 for an
    ``EPIPE`` left in ``sys.stderr``'s buffer; a program that set ``SIGPIPE`` back to its default is
    not killed by a line of lora_otel's), and its stdout is untouched."""
    (tmp_path / "job.py").write_text(READER_GONE_JOB % (sigpipe_default, code))
    proc = subprocess.Popen(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=job_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    proc.stderr.close()
    out, _ = proc.communicate(b"", timeout=60)
    assert (proc.returncode, out) == (code, b"JOB ran\n")


NOTEBOOK_CELL = "import lora_otel; lora_otel.mark('hello from a cell'); print('CELL ran')"


@pytest.mark.slow
def test_lines_stay_out_of_a_notebook_cell(tmp_path: Path) -> None:
    """A real ipykernel, driven by jupyter_client, started with ``LORA_OTEL=1``: a cell that makes
    lora_otel say a line shows only the cell's own output (ipykernel's ``sys.stderr`` is the cell's
    stream: lora_otel never writes there); the journal has the line."""
    pytest.importorskip("ipykernel")
    manager_module = pytest.importorskip("jupyter_client.manager")
    manager = manager_module.KernelManager(kernel_name="python3")
    with open(tmp_path / "kernel.err", "wb") as err:
        manager.start_kernel(env=job_env(tmp_path), cwd=str(tmp_path), stderr=err)
    client = manager.client()
    try:
        client.start_channels()
        client.wait_for_ready(timeout=90)
        msg_id = client.execute(NOTEBOOK_CELL)
        streams = []
        while True:
            msg = client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                streams.append((msg["content"]["name"], msg["content"]["text"]))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert streams == [("stdout", "CELL ran\n")], streams
    assert "mark: hello from a cell" in [line.msg for line in top_journal(tmp_path).lines]


# --- locks, fork and signals -----------------------------------------------------------------

SIGNAL_JOB = textwrap.dedent("""
    import os, signal, lora_otel
    def handler(signum, frame):
        print("HANDLER", os.system('echo "$TRACEPARENT" > handler.tp'), flush=True)
    signal.signal(signal.SIGALRM, handler)
    with lora_otel.stage("stage with a shell"):
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # lands while the shell below runs
        print("MAIN", os.system('echo "$TRACEPARENT" > main.tp; sleep 1'), flush=True)
    print("AFTER", os.environ["TRACEPARENT"], flush=True)
""")


@pytest.mark.slow
def test_os_system_in_a_signal_handler_while_os_system_runs_in_a_stage(tmp_path: Path) -> None:
    """A signal handler that calls ``os.system`` lands while the main thread is in ``os.system``
    inside a stage: both shells run (no deadlock on a lock the interrupted call holds), both are
    given the stage as their parent, and ``os.environ`` names the root span again after the stage."""
    (tmp_path / "job.py").write_text(SIGNAL_JOB)
    proc = subprocess.Popen(
        [PYTHON, "job.py"], cwd=tmp_path, env=job_env(tmp_path), stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 0, out
    lines = out.decode().splitlines()
    assert sorted(lines[:2]) == ["HANDLER 0", "MAIN 0"] and lines[2].startswith("AFTER "), lines
    j = top_journal(tmp_path)
    stage = next(s for s in j.spans if s.name == "stage with a shell")
    for name in ("handler.tp", "main.tp"):
        assert (tmp_path / name).read_text().split("-")[2] == stage.span_id, name
    assert lines[2].split()[1].split("-")[2] == j.root.span_id  # type: ignore[union-attr]


THREADS_JOB = textwrap.dedent("""
    import os, threading, lora_otel
    lora_otel.progress(step=0)  # training has started
    # Each shell waits (10 s at most) until all four run at once.
    CMD = ('touch started.%d; n=0; while [ "$(ls | grep -c ^started)" -lt 4 ]; do sleep 0.05; n=$((n+1)); '
           '[ $n -gt 200 ] && exit 1; done; echo "$TRACEPARENT" > tp.%d')
    status = {}
    threads = [threading.Thread(target=lambda i=i: status.__setitem__(i, os.system(CMD % (i, i)))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sorted(status.values()), os.environ["TRACEPARENT"], flush=True)
""")


@pytest.mark.slow
def test_threads_running_os_system_during_training_run_at_once(tmp_path: Path) -> None:
    """Four threads call ``os.system`` at once while training runs: the four shells run
    concurrently (each waits until all four have started; a lock held for the whole call would
    serialise them), each names the ``training`` span as its parent, and ``os.environ`` names the
    root span again afterwards."""
    (tmp_path / "job.py").write_text(THREADS_JOB)
    proc = subprocess.Popen(
        [PYTHON, "job.py"], cwd=tmp_path, env=job_env(tmp_path), stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        stop(proc)
    assert proc.returncode == 0, out
    statuses, after = out.decode().rsplit(" ", 1)
    assert statuses == "[0, 0, 0, 0]", out
    j = top_journal(tmp_path)
    training = next(s for s in j.spans if s.name == "training")
    assert {(tmp_path / ("tp.%d" % i)).read_text().split("-")[2] for i in range(4)} == {training.span_id}
    assert after.split("-")[2] == j.root.span_id  # type: ignore[union-attr]


FORK_JOB = textwrap.dedent("""
    import os, sys, time, lora_otel
    with lora_otel.stage("stage narrated into a full pipe"):
        print("READY", flush=True)
        sys.stdin.readline()  # the launcher has filled our stderr pipe
        time.sleep(3)  # the beat narrates this stage meanwhile, into the full pipe
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        deadline = time.monotonic() + 20
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                print("CHILD STUCK", flush=True)
                break
            time.sleep(0.05)
        else:
            print("CHILD EXITED", flush=True)
""")


def fill_pipe(write_end: int) -> None:
    """Fill the pipe ``write_end`` to the brim, through a non-blocking description of the test's
    own (``O_NONBLOCK`` on ``write_end`` itself would be the job's stderr's too)."""
    fd = os.open("/proc/self/fd/%d" % write_end, os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                os.write(fd, b"x" * 4095 + b"\n")
            except BlockingIOError:
                break
        while True:
            try:
                os.write(fd, b"\n")
            except BlockingIOError:
                return
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_forked_child_exits_while_the_beat_narrates_into_a_full_pipe(tmp_path: Path) -> None:
    """The beat narrates a slow stage into a stderr pipe that is full (its reader busy); the main
    thread forks a worker that exits at once: the worker exits (no lock of the beat's is inherited
    held), and so does the job."""
    (tmp_path / "job.py").write_text(FORK_JOB)
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=job_env(tmp_path, LORA_OTEL_NARRATE_S="0.2", LORA_OTEL_BEAT_S="0.1"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=write_end,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert readline(proc.stdout) == b"READY\n"
            read_available(read_end)  # the start-up lines
            fill_pipe(write_end)
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            assert proc.wait(timeout=60) == 0
            assert proc.stdout.read() == b"CHILD EXITED\n"
        finally:
            stop(proc)
    finally:
        os.close(read_end)
        os.close(write_end)
    msgs = [line.msg for line in top_journal(tmp_path).lines]
    assert any(m.startswith("still in stage narrated into a full pipe after ") for m in msgs), msgs


HELD_AT_FORK_JOB = textwrap.dedent("""
    import os, threading, time, lora_otel
    from lora_otel._boot import core, hooks, narrate
    locks = [v for m in (core, hooks, narrate) for v in vars(m).values() if type(v).__name__ in ("lock", "RLock")]
    held, forked = threading.Event(), threading.Event()
    def holder():  # a thread caught inside lora_otel's bookkeeping at the moment of the fork
        for lock in locks:
            lock.acquire()
        held.set()
        forked.wait()
        for lock in locks:
            lock.release()
    threading.Thread(target=holder).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        os.closerange(3, 65536)  # daemonising code: the journal is reopened by its path
        with lora_otel.stage("in the child"):
            os.system("true")
        os._exit(0)
    forked.set()
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            print(len(locks), "locks; CHILD STUCK", flush=True)
            break
        time.sleep(0.05)
    else:
        print(len(locks), "locks; CHILD EXITED", flush=True)
""")


@pytest.mark.slow
def test_a_child_forked_while_a_thread_holds_lora_otels_locks_exits(tmp_path: Path) -> None:
    """Every lock of ``core``, ``hooks`` and ``narrate`` is held by another thread at the moment
    of ``fork`` (held here on purpose, as a thread inside lora_otel's bookkeeping holds one for a
    moment): the child reopens its journal, runs ``os.system`` inside a stage and exits (each lock
    is new in the child), and its stage is in its journal."""
    (tmp_path / "job.py").write_text(HELD_AT_FORK_JOB)
    proc = subprocess.Popen(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=job_env(tmp_path),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 0 and out.endswith(b" locks; CHILD EXITED\n"), out
    assert int(out.split()[0]) >= 3
    child = [read_journal(p) for p in journals(tmp_path / "journals")]
    child = [j for j in child if j.root is not None and j.root.parent_id is not None]
    assert len(child) == 1 and any(s.name == "in the child" and not s.is_open for s in child[0].spans)


# --- fail_open and the switch for the project's own tests -----------------------------------

LAZY_VERSION_PKG = textwrap.dedent("""
    import os, signal, sys, time
    def __getattr__(name):
        if name == "__version__":  # computed lazily (setuptools-scm style), slowly
            os.kill(os.getpid(), signal.%s)  # the user presses Ctrl-C (or the scheduler stops the job) now
            time.sleep(5)
            return "1.0"
        raise AttributeError(name)
""")
INTERRUPTED_JOB = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    try:
        import lazyver
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        sys.exit(130)
    print("went on as if nothing had happened", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize(("signame", "code", "out"), [("SIGINT", 130, b"INTERRUPTED\n"), ("SIGTERM", 143, b"")])
def test_ctrl_c_or_sys_exit_during_lora_otels_bookkeeping_is_the_programs(
    tmp_path: Path, signame: str, code: int, out: bytes
) -> None:
    """A Ctrl-C, or a SIGTERM handler's ``sys.exit(143)``, lands while lora_otel's import hook reads
    a package's ``__version__`` (a lazy one that takes its time): the ``KeyboardInterrupt`` or
    ``SystemExit`` reaches the program (it is not swallowed as an internal error), and the import
    span is ended all the same."""
    (tmp_path / "lazyver.py").write_text(LAZY_VERSION_PKG % signame)
    (tmp_path / "job.py").write_text(INTERRUPTED_JOB)
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=job_env(tmp_path),
        capture_output=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout) == (code, out), r.stderr.decode(errors="replace")[-2000:]
    assert b"internal error" not in r.stderr
    span = next(s for s in top_journal(tmp_path).spans if s.name == "import lazyver")
    assert not span.is_open


BAD_VERSION_PKG = textwrap.dedent("""
    VALUE = 1
    def __getattr__(name):
        if name == "__version__":
            raise RuntimeError("version unknown: not installed from a release")
        raise AttributeError(name)
""")
USER_TEST = textwrap.dedent("""
    def test_value():
        import badver
        assert badver.VALUE == 1
""")


@pytest.mark.slow
def test_a_users_pytest_run_passes_as_without_lora_otel(tmp_path: Path) -> None:
    """A user's own test suite, run with ``python -m pytest`` and ``LORA_OTEL=1`` (pytest sets
    ``PYTEST_CURRENT_TEST``; the project's own switch is not set), imports a package whose module
    ``__getattr__`` raises for ``__version__``: it passes exactly as without lora_otel (the internal
    error is one line, not a test failure)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "badver.py").write_text(BAD_VERSION_PKG)
    (project / "test_user.py").write_text(USER_TEST)
    results = {}
    for traced in (False, True):
        env = job_env(tmp_path)
        if not traced:
            del env["LORA_OTEL"]
        assert "LORA_OTEL_STRICT_INTERNAL" not in env
        r = subprocess.run(
            [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        results[traced] = (r.returncode, r.stdout.strip().splitlines()[-1].split(" in ")[0])
    assert results[True] == results[False] == (0, "1 passed"), results


def test_the_projects_own_suite_sets_the_strict_switch() -> None:
    """This suite runs with ``LORA_OTEL_STRICT_INTERNAL=1`` (tests/conftest.py), so an internal error
    in code run in-process fails the test; ``fail_open`` still lets ``KeyboardInterrupt`` through."""
    from lora_otel._boot import core

    assert os.environ.get("LORA_OTEL_STRICT_INTERNAL") == "1" and core.strict()
    with pytest.raises(ZeroDivisionError), core.fail_open("test"):
        1 / 0  # noqa: B018
    with pytest.raises(KeyboardInterrupt), core.fail_open("test"):
        raise KeyboardInterrupt
