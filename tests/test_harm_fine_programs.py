"""Right about programs that are fine (issue 20): a test under freezegun or time-machine, a
notebook kernel sitting idle, a program under resource limits, a forking program on 3.12+, a
program that counts on its descriptor numbers. Each is a real traced program; what is asserted is
what its user sees (its output, its exit status, the journal's records, the files beside it)."""

from __future__ import annotations

import queue
import re
import subprocess
import time
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals, wait_for

pytestmark = pytest.mark.slow

YEAR = time.gmtime().tm_year


def run_job(tmp_path: Path, script: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(script)
    return subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def journal_text(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in journals(tmp_path / "lora-otel"))


def stacks_text(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (tmp_path / "lora-otel").glob("*.stacks.txt"))


# --- clocks the program patches ----------------------------------------------------------------

FROZEN = """\
import sys, time
lib, when = sys.argv[1:] if len(sys.argv) > 1 else (%r, %r)
import lora_otel
with lora_otel.stage("tests"):  # a job, in a stage
    if lib == "freezegun":
        import freezegun
        clock = freezegun.freeze_time(when)
    else:
        import time_machine
        clock = time_machine.travel(when, tick=False)
    with clock:
        time.sleep(8)  # neither library patches sleep: 8 real seconds at one frozen instant
print("done", flush=True)
"""


@pytest.mark.parametrize(
    ("lib", "when"),
    [("freezegun", "2020-01-01"), ("freezegun", "2040-01-01"), ("time_machine", "2020-01-01")],
)
def test_a_test_under_a_frozen_clock_is_not_frozen(tmp_path: Path, lib: str, when: str) -> None:
    """A user's test freezes time (freezegun's ``freeze_time``, time-machine's ``travel``) and waits
    8 real seconds, 4x the frozen limit: the job beats on the real clock, so it is not declared
    frozen, not signalled, its stacks not dumped; its lines and records carry the real time."""
    r = run_job(tmp_path, FROZEN % (lib, when), LORA_OTEL_FROZEN_AFTER="2", LORA_OTEL_NARRATE_S="1")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert "STALLED" not in r.stderr and "no beat" not in r.stderr, r.stderr
    text = journal_text(tmp_path)
    assert '"k":"stall"' not in text, text
    assert not stacks_text(tmp_path).strip()
    for line in r.stderr.splitlines():
        m = re.match(LINE_RE, line)
        if m:
            assert m.group(2).startswith(str(YEAR)), line
    stamps = [int(t) for t in re.findall(r'"ts":(\d+)', text)]
    assert stamps and all(time.gmtime(t / 1e9).tm_year == YEAR for t in stamps), sorted(set(stamps))[:5]


def test_a_mocked_sleep_does_not_make_the_beat_spin(tmp_path: Path) -> None:
    """A test replaces ``time.sleep`` with a mock (``unittest.mock.patch``) and waits 3 s for an
    event: the beat still sleeps a real second between beats (before, it called the mock
    thousands of times, spinning a core); the program's mock is called only by the program."""
    script = """\
import threading
from unittest import mock
import lora_otel
with lora_otel.stage("tests"), mock.patch("time.sleep") as sleep:
    threading.Event().wait(3)
print("sleep called %d times" % sleep.call_count, flush=True)
"""
    r = run_job(tmp_path, script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "sleep called 0 times\n", r.stderr


@pytest.mark.parametrize("value", ["1e-9", "1e308"])
def test_a_hostile_beat_interval_neither_spins_nor_ends_the_beat(tmp_path: Path, value: str) -> None:
    """A parent exported ``LORA_OTEL_BEAT_S=1e-9`` or ``1e308``: the job's beat runs at the default
    second (one line says the value was not used): no traceback on the program's stderr, beats in
    the journal, and the process's CPU time stays small. Before, 1e-9 spun the beat (a third of a
    core on a 3 s sleep) and 1e308 ended the beat thread with an ``OverflowError`` traceback."""
    script = """\
import os, threading, lora_otel
with lora_otel.stage("wait"):
    threading.Event().wait(2.5)
t = os.times()
print("cpu %.2f" % (t.user + t.system), flush=True)
"""
    r = run_job(tmp_path, script, LORA_OTEL_BEAT_S=value, LORA_OTEL_DIR=str(tmp_path / "j"))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("LORA_OTEL_BEAT_S") == 1, r.stderr
    assert float(r.stdout.split()[1]) < 0.6, r.stdout
    [path] = journals(tmp_path / "j")
    assert path.read_text().count('"k":"beat"') >= 1


# --- interactive kernels and REPLs ---------------------------------------------------------------


IDLE_NARRATION = ("STALLED", "still in arguments", "no stage open for")


def idle_narration(text: str) -> list[str]:
    """The lines narrating a wait with no stage open (or ``arguments`` never closed), or a stall."""
    return [line for line in text.splitlines() if any(words in line for words in IDLE_NARRATION)]


@pytest.mark.torch
def test_an_idle_notebook_kernel_that_imported_torch_is_not_stalled(tmp_path: Path) -> None:
    """A real ipykernel, driven by jupyter_client as Jupyter does, started with ``LORA_OTEL=1`` and
    a 3 s limit on the quiet time between stages: a cell imports torch, then the kernel waits for
    its user 12 s (4x the limit). No STALLED line, no narration in the notebook's output (nor in
    the kernel's own stderr), no stall record: a kernel waits for its user by design."""
    pytest.importorskip("ipykernel")
    manager_module = pytest.importorskip("jupyter_client.manager")
    manager = manager_module.KernelManager(kernel_name="python3")
    env = clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="between=3", LORA_OTEL_NARRATE_S="1")
    with open(tmp_path / "kernel.err", "wb") as err:
        manager.start_kernel(env=env, cwd=str(tmp_path), stderr=err, stdout=err)
    client = manager.client()
    streams: list[str] = []

    def run_cell(code: str) -> None:
        msg_id = client.execute(code)
        while True:
            msg = client.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "stream":
                streams.append(msg["content"]["text"])
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return

    try:
        client.start_channels()
        client.wait_for_ready(timeout=120)
        run_cell("import torch; print('torch imported')")
        deadline = time.monotonic() + 12  # the user is away: whatever the kernel says meanwhile
        while time.monotonic() < deadline:
            try:
                msg = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:  # nothing said
                continue
            if msg["msg_type"] == "stream":
                streams.append(msg["content"]["text"])
        run_cell("print('back')")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert streams == ["torch imported\n", "back\n"], streams
    kernel_err = (tmp_path / "kernel.err").read_text(errors="replace")
    assert not idle_narration(kernel_err), kernel_err
    text = journal_text(tmp_path)
    assert "import torch" in text
    assert '"k":"stall"' not in text and "STALLED" not in text, text


@pytest.mark.torch
@pytest.mark.parametrize("how", ["python -i", "REPL"])
def test_an_idle_repl_that_imported_torch_is_not_stalled(tmp_path: Path, how: str) -> None:
    """``python -i script.py`` and a bare ``python`` REPL (on a terminal) that imported torch and wait
    for their user 4x the quiet-time limit: no STALLED line, no narration of the wait, no stall record."""
    import os
    import pty
    import select
    import signal

    (tmp_path / "script.py").write_text("import torch\nprint('torch imported', flush=True)\n")
    argv = [PYTHON, "-i", "script.py"] if how == "python -i" else [PYTHON]
    env = clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="between=3", LORA_OTEL_NARRATE_S="1", TERM="dumb")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    seen = bytearray()

    def read_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    seen.extend(os.read(master, 65536))
                except OSError:
                    return

    try:
        if how == "REPL":
            os.write(master, b"import torch; print('torch', 'imported')\n")
        end = time.monotonic() + 120
        while b"torch imported" not in seen and time.monotonic() < end:
            read_for(0.2)
        assert b"torch imported" in seen, seen.decode(errors="replace")
        read_for(12)
        os.write(master, b"print('bye'); raise SystemExit\n")
        proc.wait(timeout=60)
        read_for(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    out = seen.decode(errors="replace")
    # (On a loaded machine a beat can fall between the end of ``import torch`` and the prompt, and
    # say the script's own last moment: "still in arguments after 2.1 s — main thread at
    # script.py:2". That is the script running, not the wait; a line about the wait names no line
    # of the script or of the typed command.)
    waiting = [line for line in idle_narration(out.partition("torch imported")[2]) if " at script.py:" not in line]
    assert not [line for line in waiting if " at <stdin>:" not in line], out
    text = journal_text(tmp_path)
    assert '"k":"stall"' not in text, text


# --- resource limits -----------------------------------------------------------------------------

LARGEST = """\
import _thread, os, time
time.sleep(1.5)  # a beat would have run by now
lo, hi = 0, 1 << 32
while hi - lo > (1 << 20):  # the largest bytearray this process can still allocate
    mid = (lo + hi) // 2
    try:
        b = bytearray(mid)
        del b
        lo = mid
    except MemoryError:
        hi = mid
with open("/proc/self/status") as f:
    threads = [line.split()[1] for line in f if line.startswith("Threads:")][0]
print(lo >> 20, threads, _thread.stack_size(), flush=True)
"""


def run_limited(tmp_path: Path, script: str, limits: dict, traced: bool) -> subprocess.CompletedProcess:
    import resource

    def set_limits() -> None:
        for name, value in limits.items():
            if callable(value):  # counted in the child just before its exec: the user's other tasks come and go
                value = value()
            resource.setrlimit(getattr(resource, name), (value, value))

    (tmp_path / "job.py").write_text(script)
    env = clean_env(LORA_OTEL="1") if traced else clean_env()
    return subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, preexec_fn=set_limits
    )


def test_an_address_space_limit_costs_the_program_no_memory(tmp_path: Path) -> None:
    """Under ``ulimit -v`` (a real ``RLIMIT_AS`` set in the child), the largest allocation the
    program can make is what it is without lora_otel, but for the in-process half's own modules
    (a few MiB): no beat thread, whose stack and malloc arena (64 MiB reserved) would count; the
    journal says why there is no beat, and the watchdog does not call the process frozen."""
    limits = {"RLIMIT_AS": 512 << 20}
    bare = run_limited(tmp_path, LARGEST, limits, traced=False)
    traced = run_limited(tmp_path, LARGEST, limits, traced=True)
    assert bare.returncode == 0 and traced.returncode == 0, (bare.stderr, traced.stderr)
    bare_mib, traced_mib = int(bare.stdout.split()[0]), int(traced.stdout.split()[0])
    assert traced_mib >= bare_mib - 12, "largest allocation %d MiB traced, %d MiB bare" % (traced_mib, bare_mib)
    assert traced.stdout.split()[1:] == ["1", "0"], traced.stdout
    assert '"beat_off":"RLIMIT_AS is' in journal_text(tmp_path)


def tasks_of_user() -> int:
    """The tasks (threads) this user runs now, as ``RLIMIT_NPROC`` counts them."""
    import os

    count = 0
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/status" % name) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [str(os.getuid())]:
            count += int(fields["Threads"])
    return count


FORKS = """\
import os, sys, time
time.sleep(1.5)  # a beat would have run by now
children = []
for i in range(2):
    try:
        pid = os.fork()
    except OSError as e:
        print("fork %d failed: %s" % (i, e), flush=True)
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    children.append(pid)
with open("/proc/self/status") as f:
    threads = [line.split()[1] for line in f if line.startswith("Threads:")][0]
for pid in children:
    os.waitpid(pid, 0)
print("forked %d, threads %s" % (len(children), threads), flush=True)
"""


def test_a_task_limit_near_leaves_the_program_its_tasks(tmp_path: Path) -> None:
    """Under ``ulimit -u`` (a real ``RLIMIT_NPROC`` set in the child) with only a few tasks left
    for this user, lora_otel starts no beat thread: the program's forks get the slots it would
    have had, and the journal says why. (The kernel does not apply the limit to root: run as root,
    the forks succeed either way, and what is asserted is that the thread is not taken.)"""
    # The program and two children fit; no room for a thread of ours. Counted in the child at its
    # exec (this user's other tasks, the suite's own processes included, come and go meanwhile).
    limits = {"RLIMIT_NPROC": lambda: tasks_of_user() + 5}
    r = run_limited(tmp_path, FORKS, limits, traced=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "forked 2, threads 1\n", r.stdout + r.stderr
    assert '"beat_off":"RLIMIT_NPROC is' in journal_text(tmp_path)


def test_the_beat_thread_has_a_small_stack_and_leaves_the_programs_setting(tmp_path: Path) -> None:
    """Without limits the beat runs, on a stack of its own size (256 KiB, not the 8 MiB default), and
    the program's ``threading.stack_size()`` is still 0 (the default) after lora_otel started it."""
    script = """\
import _thread, time
time.sleep(1.5)
with open("/proc/self/maps") as f:
    sizes = []
    for line in f:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        sizes.append(hi - lo)
print(_thread.stack_size(), sum(1 for s in sizes if s >= 8 << 20 and s <= (8 << 20) + 65536), flush=True)
"""
    bare = run_limited(tmp_path, script, {}, traced=False)
    traced = run_limited(tmp_path, script, {}, traced=True)
    assert bare.returncode == 0 and traced.returncode == 0, traced.stderr
    assert traced.stdout.split()[0] == "0", traced.stdout
    assert traced.stdout == bare.stdout, "8 MiB mappings (thread stacks): %s traced, %s bare" % (
        traced.stdout.split()[1],
        bare.stdout.split()[1],
    )


# --- fork on Python 3.12+ ------------------------------------------------------------------------

PYENV = Path("/root/.pyenv/versions")
FORK_JOB = """\
import os, sys, time
import lora_otel._boot.preamble as p; p.start("LORA_OTEL=1")  # what lora_otel_hook.pth does
time.sleep(1.5)  # the beat thread runs
pid = os.fork()  # from __main__: Python's default filters show a DeprecationWarning here
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(1.5)
with open("/proc/self/stat") as f:
    threads = f.read().rpartition(")")[2].split()[17]
print("forked; threads after %s" % threads, flush=True)
"""


def interpreters(*versions: str) -> list:
    found = [PYENV / v / "bin" / "python3" for v in versions]
    return [pytest.param(str(p), id=p.parent.parent.name) for p in found if p.exists()] or [
        pytest.param("", marks=pytest.mark.skip(reason="none of Python %s here" % ", ".join(versions)))
    ]


def run_fork_job(tmp_path: Path, python: str, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(FORK_JOB)
    env = clean_env(LORA_OTEL="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    return subprocess.run(
        [python, *flags, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("python", interpreters("3.12.1"))
def test_a_fork_on_python_3_12_does_not_warn_because_of_the_beat(tmp_path: Path, python: str) -> None:
    """Python 3.12+ warns ``This process is multi-threaded, use of fork() may lead to deadlocks``
    at an ``os.fork`` while other threads run. The beat thread is lora_otel's only one: it stops
    before the fork and starts again after it, so a program with no thread of its own sees no
    warning; its beat goes on after the fork (two threads again). Standard library only: the
    interpreter runs the worktree's in-process half from ``PYTHONPATH``."""
    r = run_fork_job(tmp_path, python)
    assert r.returncode == 0, r.stderr
    assert "DeprecationWarning" not in r.stderr, r.stderr
    assert r.stdout == "forked; threads after 2\n", r.stdout


@pytest.mark.parametrize("python", interpreters("3.13.0"))
def test_a_fork_on_python_3_13_0_warns_as_cpython_counts(tmp_path: Path, python: str) -> None:
    """3.13.0 to 3.13.9 and 3.14.0 count threads after the ``after_in_parent`` hooks (CPython
    gh-137109), when a beat stopped for the fork would have started again: the warning cannot be
    avoided there but by leaving the parent without beats, so the beat is left running. What a
    user sees: one DeprecationWarning in ``__main__`` (Python's default filters); with ``-W error``
    nothing (CPython drops the exception) and the fork succeeds."""
    shown = run_fork_job(tmp_path, python)
    assert shown.returncode == 0 and shown.stdout == "forked; threads after 2\n", shown.stderr
    assert shown.stderr.count("DeprecationWarning: This process") == 1, shown.stderr
    strict = run_fork_job(tmp_path, python, "-W", "error")
    assert strict.returncode == 0 and strict.stdout == "forked; threads after 2\n", strict.stderr
    assert "Warning" not in strict.stderr, strict.stderr


# --- descriptors ---------------------------------------------------------------------------------

DESCRIPTORS = """\
import os, sys, time
def first_free():
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd
at_start = first_free()
import lora_otel
with lora_otel.stage("load"):  # a job: the sidecar, the stacks file, the journal's descriptors
    time.sleep(1.5)
    after_beats = first_free()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    time.sleep(1.5)  # the child's own beat, journal and records
    os.write(w, b"%d" % first_free())  # 3: where r was
    os._exit(0)
os.close(w)
in_child = int(os.read(r, 100))
os.waitpid(pid, 0)
os.close(r)
os.closerange(3, 1 << 16)  # the daemon idiom: every descriptor but the standard ones
mine = [os.open("out%d" % i, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for i in range(6)]
with lora_otel.stage("after closerange"):
    lora_otel.mark("while the program's files hold low numbers")
    time.sleep(1.5)
for fd in mine:
    os.write(fd, b"mine\\n")
print(at_start, after_beats, in_child, mine[0], flush=True)
"""


def test_the_program_keeps_its_descriptor_numbers(tmp_path: Path) -> None:
    """lora_otel's own descriptors (journal, stacks file, log) sit high: the program's first free
    descriptor is 3 at start, after beats and promotion, and in a forked child; after it closes
    every descriptor from 3 up and opens its own files there, those files hold only its bytes and
    lora_otel's records still reach the journal."""
    r = run_job(tmp_path, DESCRIPTORS)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "3 3 3 3\n", r.stdout + r.stderr
    for i in range(6):
        assert (tmp_path / ("out%d" % i)).read_bytes() == b"mine\n"
    assert "while the program's files hold low numbers" in journal_text(tmp_path)


CLOSERANGE_THEN_OPENS = """\
import os, time
import lora_otel
from lora_otel._boot import core
with lora_otel.stage("load"):
    time.sleep(1.0)  # a job: the journal and the stacks file sit high, beats every 20 ms
journal_fd, journal = core._journal_fd, os.fstat(core._journal_fd)
os.closerange(3, 1 << 16)  # the daemon idiom, then its own files at once, counting on 3
t0 = time.monotonic()
numbers, reopened_meanwhile = set(), False
while time.monotonic() - t0 < 0.3:
    fd = os.open(os.devnull, os.O_RDONLY)
    numbers.add(fd)
    os.close(fd)
    for high in range(journal_fd, journal_fd + 8):  # (no descriptor taken) lora_otel reopened its journal
        try:
            reopened_meanwhile |= os.fstat(high).st_ino == journal.st_ino
        except OSError:
            pass
print(sorted(numbers), reopened_meanwhile, flush=True)
with lora_otel.stage("after"):
    lora_otel.mark("after the program's own opens")
"""


def test_lora_otel_reopens_nothing_while_the_program_opens_its_files_after_closerange(tmp_path: Path) -> None:
    """Reopening the journal takes the lowest free number for a moment. A beat that found the journal
    closed reopened it at once, in the very moments a program that had just closed every descriptor
    opens its own files counting on 3 (run 4 of .ci/run: the program's first file got 4, on 3.9,
    whose closerange is a loop of 65,000 ``close`` calls the beat ran beside). The beat now leaves
    a closed descriptor of ours alone for a second: the program's opens all get 3, lora_otel opens
    nothing in that time (the check that does not depend on the race being won: before, with beats
    every 20 ms, the journal was always back within the 0.3 s), and its records still reach the journal."""
    r = run_job(tmp_path, CLOSERANGE_THEN_OPENS, LORA_OTEL_BEAT_S="0.02")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[3] False\n", r.stdout + r.stderr
    assert "after the program's own opens" in journal_text(tmp_path)
    assert "the journal's descriptor" in r.stderr and "reopened" in r.stderr, r.stderr


SIGWAIT = """\
import os, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken below, as the docs say to
print("ready", flush=True)
while not os.path.exists("go"):  # busy with other work when the signal comes: it stays pending
    time.sleep(0.01)
info = signal.sigwaitinfo({signal.SIGTERM})
print("took signal %d from pid %d" % (info.si_signo, info.si_pid), flush=True)
"""


def test_a_program_that_takes_sigterm_with_sigwaitinfo_gets_it(tmp_path: Path) -> None:
    """A service blocks SIGTERM in its main thread and takes it with ``sigwaitinfo`` once it is done
    with what it was doing when the signal came (meanwhile the signal is pending). lora_otel's beat
    thread, started before the program could block anything, blocks the asynchronous signals
    itself: the kernel does not deliver SIGTERM to it (where its default action would end the whole
    process, exit status -15), and the program takes it."""
    import os
    import signal

    (tmp_path / "job.py").write_text(SIGWAIT)
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        proc = subprocess.Popen([PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), stdout=f)
    try:
        wait_for(lambda: "ready" in out.read_text(), 60, "the program to be ready")
        os.kill(proc.pid, signal.SIGTERM)
        (tmp_path / "go").touch()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (proc.returncode, out.read_text())
    assert "took signal 15 from pid %d" % os.getpid() in out.read_text()


# --- tools that open a code object's file ----------------------------------------------------


def test_trace_count_runs_as_without_lora_otel(tmp_path: Path) -> None:
    """``python -m trace --count`` opens the file of every code object it counted: the import hook's
    frames name a real file (before: ``hooks.py (importlib._bootstrap)``, no such file, and the
    run ended in FileNotFoundError with exit status 1: hostile trial)."""
    (tmp_path / "prog.py").write_text("import json\nprint('hi')\n")

    def run(**env: str) -> subprocess.CompletedProcess:
        cmd = [PYTHON, "-m", "trace", "--count", "-C", str(tmp_path / "cover"), "prog.py"]
        return subprocess.run(cmd, cwd=tmp_path, env=clean_env(**env), capture_output=True, text=True, timeout=120)

    plain, traced = run(), run(LORA_OTEL="1")
    assert plain.returncode == 0 and plain.stdout == "hi\n", plain.stderr
    assert (traced.returncode, traced.stdout) == (0, "hi\n"), traced.stderr
    assert "Error" not in traced.stderr, traced.stderr


# --- finalizers at shutdown --------------------------------------------------------------------

FINALIZED = """\
import os, sys
class Writer:
    def __del__(self, write=os.write):
        write(1, b"closed the writer\\n")  # a writer's last flush, run as the interpreter shuts down
writer = Writer()
print("ran", flush=True)
"""


@pytest.mark.parametrize("ending", ["", "raise SystemExit(3)\n", "sys.exit(0)\n"])
def test_module_objects_are_finalized_at_shutdown(tmp_path: Path, ending: str) -> None:
    """An object held by the ``__main__`` module is finalized as the interpreter shuts down, as it is
    without lora_otel: on 3.9-3.11 the frame kept to judge the exit held the module's globals past
    the exit handler, so its ``__del__`` never ran (a hostile trial). The exit code is still read."""
    plain = subprocess.run(
        [PYTHON, "-c", FINALIZED + ending], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    traced = run_job(tmp_path, FINALIZED + ending, LORA_OTEL_KEEP_SHORT="1")
    assert plain.stdout == "ran\nclosed the writer\n", plain.stderr
    assert (traced.returncode, traced.stdout) == (plain.returncode, plain.stdout), traced.stderr
    [journal] = journals(tmp_path / "lora-otel")
    assert '"k":"exit","ts":' in journal.read_text().replace(" ", "") and (
        '"code":%d' % plain.returncode in journal.read_text().replace(" ", "")
    ), journal.read_text()[-500:]
