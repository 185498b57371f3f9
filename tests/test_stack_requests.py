"""The stack request goes to one thread that runs the handler, never to the whole process.

Real jobs have helper threads that block every signal (pyarrow's jemalloc thread, loaded by every
datasets job) or take signals with ``sigwait``; a signal sent to the process could stay pending for
them or be taken by them as the program's own. Sent with ``tgkill`` to a thread that runs
faulthandler's handler (the main thread first), it reaches nobody else: the stacks are had, and the
program's ``sigwait`` gets nothing (`lora_otel.analysis.evidence.handler_thread`). That is the
fallback: where py-spy may attach, the stacks are read from outside and no signal is sent at all.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals

from lora_otel.analysis.evidence import FROM_BEAT, FROM_OUTSIDE, StackRequest, ask_beat, handler_thread, py_spy_path
from lora_otel.journal.reader import read_journal

STACK_SIGNAL = 44

JOB = """\
import glob, signal, threading, time, lora_otel
got = []
def sigwaiter():  # takes signal 44 (and SIGUSR2) synchronously, as a service's own
    signal.pthread_sigmask(signal.SIG_BLOCK, {44, signal.SIGUSR2})
    while True:
        s = signal.sigtimedwait({44, signal.SIGUSR2}, 0.25)
        if s: got.append(s.si_signo)
def jemalloc_like():  # pyarrow's background thread: every signal blocked
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
    while True: time.sleep(0.1)
threading.Thread(target=sigwaiter, daemon=True).start()
threading.Thread(target=jemalloc_like, daemon=True).start()
model_lock = threading.Lock()
model_lock.acquire()
seen, deadline = None, time.monotonic() + 90
with lora_otel.stage("load model"):  # stuck on a lock until the stall record is written, and 2 s more
    while time.monotonic() < deadline and (seen is None or time.monotonic() < seen + 2):
        model_lock.acquire(timeout=0.25)
        if seen is None and any(b'"stall"' in open(p, 'rb').read() for p in glob.glob('j/*.otel.jsonl')):
            seen = time.monotonic()
print("got", got or None, "stall seen", seen is not None, flush=True)
print("main ident 0x%016x" % threading.get_ident(), flush=True)
"""


def run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    return subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j", LORA_OTEL_STALL_AFTER="load model=2", **extra),
    )


@pytest.mark.slow
def test_helper_threads_that_block_or_take_the_signal_do_not_stop_the_request(tmp_path: Path) -> None:
    """py-spy off (``LORA_OTEL_PY_SPY=0``): a process that still beats is asked through its beat
    thread, which writes the dump holding the GIL — no signal at all, so neither the sigwait thread
    nor a thread that blocks every signal can stand in the way. (Before, the signal went to one
    thread with tgkill, and its handler, walking the frames without the GIL while the beat ran,
    once crashed this job with SIGSEGV.) No ask file is left."""
    r = run(tmp_path, LORA_OTEL_PY_SPY="0")
    assert r.returncode == 0 and r.stdout.startswith("got None stall seen True\n"), (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    [record] = read_journal(path).stalls
    assert record["diagnosis"].startswith(
        "Waiting for a lock: the main thread waits in model_lock.acquire at job.py:18 in <module>"
    ), record["diagnosis"]
    assert record["evidence"]["python.stacks.from"] == FROM_BEAT, record["evidence"]
    [stacks] = (tmp_path / "j").glob("*.stacks.txt")
    text = stacks.read_text()
    assert "in jemalloc_like" in text and "in sigwaiter" in text and 'job.py", line 18 in <module>' in text, text
    ident = r.stdout.split("main ident ", 1)[1].split()[0]
    assert text.startswith("Current thread %s (most recent call first):\n" % ident), text  # the main thread first
    assert "_beat_loop" not in text, text  # the beat writes it and leaves itself out
    assert list((tmp_path / "j").glob("*.ask")) == []


OWN_HANDLER_LATER = """import glob, signal, threading, time, lora_otel
calls = []
model_lock = threading.Lock()
model_lock.acquire()
seen, deadline = None, time.monotonic() + 90
with lora_otel.stage("load model"):  # a job now: lora_otel's handler and stacks file are in place
    signal.signal(44, lambda s, f: calls.append(s))  # then the program takes the signal for itself
    while time.monotonic() < deadline and (seen is None or time.monotonic() < seen + 2):
        model_lock.acquire(timeout=0.25)
        if seen is None and any(b'"stall"' in open(p, 'rb').read() for p in glob.glob('j/*.otel.jsonl')):
            seen = time.monotonic()
print("handler calls", len(calls), "stall seen", seen is not None, flush=True)
"""


@pytest.mark.slow
def test_a_program_that_took_the_signal_is_still_asked_through_its_beat(tmp_path: Path) -> None:
    """The program installs its own handler on the stack signal after lora_otel's: the signal is
    never sent (its handler runs 0 times), yet the stacks are had — the beat thread writes them when
    asked through the file — and the diagnosis names the program's line. Before: ``not requested:
    the program installed its own handler for signal 44``, and no stacks."""
    (tmp_path / "job.py").write_text(OWN_HANDLER_LATER, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j", LORA_OTEL_STALL_AFTER="load model=3", LORA_OTEL_PY_SPY="0"),
    )
    assert r.returncode == 0 and r.stdout == "handler calls 0 stall seen True\n", (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    journal = read_journal(path)
    assert "lora_otel.stacks.off" in journal.root.attrs  # the beat saw the program's handler
    [record] = journal.stalls
    assert record["evidence"]["python.stacks.from"] == FROM_BEAT, record["evidence"]
    assert "python.stacks.error" not in record["evidence"], record["evidence"]
    assert record["diagnosis"].startswith(
        "Waiting for a lock: the main thread waits in model_lock.acquire at job.py:9 in <module>"
    ), record["diagnosis"]


@pytest.mark.slow
def test_a_beat_that_does_not_answer_leaves_no_ask_file(tmp_path: Path) -> None:
    """A process whose beat cannot run (frozen) never answers: after a beat and a second of waiting
    the watchdog removes its ask file and gets nothing (then the signal is the fallback); the stacks
    file is never created by the asking."""
    stacks, ask = tmp_path / "run.stacks.txt", tmp_path / "run.stacks.ask"
    stacks.write_text("")
    request = StackRequest(44, str(stacks), ask=str(ask), beat_s=0.1)
    assert ask_beat(request) == ""
    assert not ask.exists() and stacks.read_text() == ""
    missing = StackRequest(44, str(tmp_path / "gone.stacks.txt"), ask=str(tmp_path / "gone.stacks.ask"))
    assert ask_beat(missing) == "" and list(tmp_path.glob("gone*")) == []


@pytest.mark.slow
@pytest.mark.skipif(py_spy_path() is None, reason="py-spy is not installed (the [pyspy] extra)")
def test_py_spy_reads_the_stacks_and_no_signal_is_sent(tmp_path: Path) -> None:
    """Where py-spy may attach, it reads the stacks from outside: the stall record's evidence says
    so, the stacks file holds its dump (inspect and the report read it there) — the main thread
    named by its thread id — and no faulthandler dump, whose headers carry the thread's
    ``threading.get_ident()``: the program received no signal. The sigwait thread got nothing."""
    r = run(tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("got None stall seen True\n"), (r.stdout, r.stderr[-3000:])
    ident = r.stdout.split("main ident ", 1)[1].split()[0]
    [path] = journals(tmp_path / "j")
    journal = read_journal(path)
    [record] = journal.stalls
    assert record["diagnosis"].startswith(
        "Waiting for a lock: the main thread waits in model_lock.acquire at job.py:18 in <module>"
    ), record["diagnosis"]
    assert record["evidence"]["python.stacks.from"] == FROM_OUTSIDE, record["evidence"]
    [stacks] = (tmp_path / "j").glob("*.stacks.txt")
    text = stacks.read_text()
    assert "Current thread 0x%016x (most recent call first):" % journal.pid in text, text
    assert 'job.py", line 18 in <module>' in text and "in jemalloc_like" in text and "in sigwaiter" in text, text
    assert ident not in text, text


@pytest.mark.slow
def test_a_thread_entering_sigwait_is_not_taken_for_a_handler(tmp_path: Path) -> None:
    """A thread that takes signal 44 with ``sigtimedwait`` in a loop enters and leaves the wait all
    the time; entering, it has 44 lifted from its mask a moment before it sleeps. Read in that
    moment it looked like a thread free to run the handler (the matrix on 3.9, once, under load);
    now it is read again until it sleeps or blocks: 300 looks, never a thread to send to."""
    code = textwrap.dedent(
        """\
        import signal, threading, time
        signal.pthread_sigmask(signal.SIG_BLOCK, {44})
        def taker():
            while True:
                signal.sigtimedwait({44}, 0.0002)
        threading.Thread(target=taker, daemon=True).start()
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert proc.stdout.readline() == "ready\n"
        found = [handler_thread(proc.pid, STACK_SIGNAL) for _ in range(300)]
        assert [tid for tid, _ in found if tid is not None] == []
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


@pytest.mark.slow
def test_no_thread_to_run_the_handler(tmp_path: Path) -> None:
    """Every thread blocks the signal, or waits in sigwait: no request, and why."""
    code = textwrap.dedent(
        """\
        import signal, sys, threading, time
        signal.pthread_sigmask(signal.SIG_BLOCK, {44})
        threading.Thread(target=lambda: signal.sigwait({44}), daemon=True).start()
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert proc.stdout.readline() == "ready\n"
        tid, why = handler_thread(proc.pid, STACK_SIGNAL)
        assert tid is None and ("blocks signal 44" in why or "waits for signals (sigwait)" in why), why
        tid, why = handler_thread(proc.pid, signal.SIGUSR2)  # one nobody blocks: the main thread runs it
        assert (tid, why) == (proc.pid, "")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


SPY_DUMP = """\
Process 4711: python job.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4711 (idle): "MainThread"
    clock_nanosleep (/usr/lib/x86_64-linux-gnu/libc.so.6)
    time_sleep (/usr/lib/libpython3.11.so.1.0)
    Loader.wait (/work/job.py:6)
    <module> (/work/job.py:9)
Thread 4713 (idle): "worker"
    f (/work/job.py:3)
    Thread.run (/usr/lib/python3.11/threading.py:982)
Thread 4714 (idle): "native only"
    epoll_wait (/usr/lib/x86_64-linux-gnu/libc.so.6)
"""


def test_py_spy_dump_in_faulthandler_format() -> None:
    """What every reader of ``python.stacks`` parses: faulthandler's headers and frame lines, the
    main thread as the current one, native frames and threads with no Python frame left out."""
    from lora_otel.analysis.diagnose import _threads
    from lora_otel.analysis.evidence import as_faulthandler

    text = as_faulthandler(SPY_DUMP)
    assert text.splitlines() == [
        "Current thread 0x%016x (most recent call first):" % 4711,
        '  File "/work/job.py", line 6 in wait',
        '  File "/work/job.py", line 9 in <module>',
        "Thread 0x%016x (most recent call first):" % 4713,
        '  File "/work/job.py", line 3 in f',
        '  File "/usr/lib/python3.11/threading.py", line 982 in run',
    ], text
    [(head, frames), _] = _threads(text)
    assert head.startswith("Current thread") and (frames[0].file, frames[0].line, frames[0].func) == (
        "/work/job.py",
        "6",
        "wait",
    )
    assert as_faulthandler("Error: Permission denied (os error 13)\n") == ""


def test_a_dump_read_from_outside_lands_only_in_the_recorded_file(tmp_path: Path) -> None:
    """`append_dump` appends to the stacks file the journal recorded, and to nothing else: a file
    put in its place (same name, another inode), a symlink, or a missing file get nothing."""
    from lora_otel.analysis.evidence import StackRequest, append_dump

    stacks = tmp_path / "run.stacks.txt"
    stacks.write_text("")
    st = stacks.stat()
    request = StackRequest(STACK_SIGNAL, str(stacks), None, None, (st.st_dev, st.st_ino))
    append_dump(request, 'Current thread 0x1 (most recent call first):\n  File "a.py", line 1 in <module>')
    assert stacks.read_text().startswith("Current thread 0x1 (most recent call first):\n"), stacks.read_text()
    stacks.unlink()
    append_dump(request, "x")  # gone: not created
    assert not stacks.exists()
    user = tmp_path / "user.txt"
    user.write_text("mine\n")
    stacks.symlink_to(user)
    append_dump(request, "x")  # a symlink in its place: not followed
    stacks.unlink()
    stacks.write_text("other\n")  # another file by that name
    append_dump(request, "x")
    assert user.read_text() == "mine\n" and stacks.read_text() == "other\n"


SAMPLED_JOB = """\
import glob, signal, threading, time, lora_otel
signal.signal(44, lambda s, f: None)  # the program's own handler on the stack signal: no request
done = threading.Event()
def load_weights():
    while not done.wait(0.2):  # a wait the stacks would show; here only the beat's sample can
        if any(b'"stall"' in open(p, 'rb').read() for p in glob.glob('j/*.otel.jsonl')):
            done.set()
with lora_otel.stage("load model"):
    time.sleep(1.5)  # a beat or two with the handler in place first
    load_weights()
print("stall seen", flush=True)
"""


@pytest.mark.slow
def test_no_stacks_the_diagnosis_reads_the_beats_sample(tmp_path: Path) -> None:
    """Stacks cannot be had (the program took the stack signal; py-spy off): the diagnosis reads the
    beat's last sample of the main thread instead of saying "Cannot tell from the evidence", and
    says how old the sample is and why there are no stacks (issue 22 item 2)."""
    (tmp_path / "job.py").write_text(SAMPLED_JOB, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(
            LORA_OTEL="1",
            LORA_OTEL_DIR="j",
            LORA_OTEL_STALL_AFTER="load model=3",
            LORA_OTEL_PY_SPY="0",
            LORA_OTEL_BEAT_S="0.2",
        ),
    )
    assert r.returncode == 0 and r.stdout == "stall seen\n", (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    [record] = read_journal(path).stalls
    diagnosis = record["diagnosis"]
    # Before: "Cannot tell from the evidence." (no stacks, so no frame at all).
    # (and not "Waiting for a lock … waiter.acquire at threading.py": an Event's wait holds no lock)
    assert diagnosis.startswith(
        "Waiting for an event: the main thread waits in Event.wait() at job.py:5 in load_weights for another thread"
    ), diagnosis
    assert re.search(
        r"\(Read from the beat's last sample of the main thread \([\d.]+ m?s old\): no stack dump to read ", diagnosis
    ), diagnosis
    assert "(not requested: the program handles signal 44 itself).)" in diagnosis, diagnosis


RACER = """\
import glob, os, signal, threading, time, lora_otel
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
bad, done = [], threading.Event()
def helper():  # a little CPU work, then a short sigtimedwait: in and out of it all the time
    while not done.is_set():
        t = time.monotonic()
        while time.monotonic() - t < 0.01:
            pass
        r = signal.sigtimedwait([signal.SIGUSR1], 0.01)
        if r is not None:
            bad.append(r.si_signo)
threading.Thread(target=helper, daemon=True).start()
seen, deadline = None, time.monotonic() + 90
with lora_otel.stage("load model"):
    while time.monotonic() < deadline and (seen is None or time.monotonic() < seen + 2):
        time.sleep(0.1)
        if seen is None and any(b'"stall"' in open(p, 'rb').read() for p in glob.glob('j/*.otel.jsonl')):
            seen = time.monotonic()
done.set()
print("spurious", bad or None, "stall seen", seen is not None, flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(py_spy_path() is None, reason="py-spy is not installed (the [pyspy] extra)")
def test_a_running_process_is_never_paused_for_its_stacks(tmp_path: Path) -> None:
    """A stall of a live process (not frozen) is read ``--nonblocking``: nothing paused. A thread in
    and out of ``sigtimedwait`` many times a second could be paused inside it between the look at
    its wait channel and the pause, and return a signal nobody sent (a hostile trial saw it in 1 run
    of 3). The record says why no native frames were read."""
    from lora_otel.analysis.evidence import NOT_PAUSED

    (tmp_path / "job.py").write_text(RACER, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j", LORA_OTEL_STALL_AFTER="load model=2"),
    )
    assert r.returncode == 0 and r.stdout == "spurious None stall seen True\n", (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    [record] = read_journal(path).stalls
    assert record["evidence"]["py_spy.native_error"] == NOT_PAUSED, record["evidence"]
    assert record["evidence"]["python.stacks.from"] == FROM_OUTSIDE, record["evidence"]
