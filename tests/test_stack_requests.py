"""The stack request goes to one thread that runs the handler, never to the whole process.

Real jobs have helper threads that block every signal (pyarrow's jemalloc thread, loaded by every
datasets job) or take signals with ``sigwait``; a signal sent to the process could stay pending for
them or be taken by them as the program's own. Sent with ``tgkill`` to a thread that runs
faulthandler's handler (the main thread first), it reaches nobody else: the stacks are had, and the
program's ``sigwait`` gets nothing (`lora_otel.analysis.evidence.handler_thread`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

from procs import PYTHON, clean_env, journals

from lora_otel.analysis.evidence import handler_thread
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
"""


def test_helper_threads_that_block_or_take_the_signal_do_not_stop_the_request(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j", LORA_OTEL_STALL_AFTER="load model=2"),
    )
    assert r.returncode == 0 and r.stdout == "got None stall seen True\n", (r.stdout, r.stderr[-3000:])
    [path] = journals(tmp_path / "j")
    [record] = read_journal(path).stalls
    assert record["diagnosis"].startswith(
        "Waiting for a lock: the main thread waits in model_lock.acquire at job.py:18 in <module>"
    ), record["diagnosis"]
    [stacks] = (tmp_path / "j").glob("*.stacks.txt")
    text = stacks.read_text()
    assert "in jemalloc_like" in text and "in sigwaiter" in text and 'job.py", line 18 in <module>' in text, text


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
