"""A frozen process is said to hold the GIL only when its native stacks show it (`analysis.gil`).

No beat means no Python code has run in lora_otel's beat thread for a while: the GIL held in
native code, or every thread blocked with the GIL released. py-spy (the ``pyspy`` extra), reading
the process from outside, tells which: a thread marked ``+gil``, or a thread waiting in CPython's
``take_gil``. Without it the sentence says what is known and that the GIL is unknown.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, wait_for

from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX, py_spy_path
from lora_otel.analysis.gil import gil_held, has_native_stacks
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import read_journal
from lora_otel.journal.records import Span


def frozen() -> Stall:
    return Stall("frozen", Span("import frozenmod", "a" * 16, None, "b" * 32, 1), 30.0, 10.0, "")


BLOCKED = {PREFIX + "process.state": "S (sleeping)", PREFIX + "process.wait_channel": "futex_do_wait"}

# py-spy 0.4 --native of ctypes.PyDLL(None).pause() in the main thread, lora_otel's beat thread
# waiting to take the GIL (pthread_cond_timedwait right under the interpreter).
PAUSE_DUMP = """\
Process 28637: python job.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 28637 (idle)
    pause (libc.so.6)
    ffi_call (libffi.so.8.1.2)
    _ctypes_callproc (callproc.c:1262)
    PyCFuncPtr_call (_ctypes.c:4201)
    hold (frozenmod.py:4)
    <module> (job.py:1)
Thread 28638 (idle)
    0x7f6a3dea3f16 (libc.so.6)
    pthread_cond_timedwait (libc.so.6)
    os_stat (libpython3.11.so.1.0)
    _path_stat (<frozen importlib._bootstrap_external>:147)
    _beat_loop (lora_otel/_boot/preamble.py:1311)
    thread_run (libpython3.11.so.1.0)
"""

# A thread pool of an extension waiting on its own condition: not the GIL.
EXTENSION_WAIT_DUMP = """\
Thread 100 (idle): "MainThread"
    read (libc.so.6)
    <module> (job.py:3)
Thread 101 (idle)
    pthread_cond_wait (libc.so.6)
    0x7f00000010 (libgomp.so.1)
    start_thread (libc.so.6)
"""


class TestWithoutNativeStacks:
    def test_no_gil_claim_without_py_spy(self) -> None:
        """No py-spy dump: what is known (blocked in the kernel, the wait channel; the stall itself
        says no beat), and that the GIL is unknown — never "Holding the GIL"."""
        sentence = explain(frozen(), dict(BLOCKED)).sentence
        assert "Holding the GIL" not in sentence
        assert sentence.startswith("Blocked in the kernel (wait channel futex_do_wait)"), sentence
        assert "whether it holds the GIL is unknown without native stacks" in sentence, sentence

    def test_py_spy_refused(self) -> None:
        """py-spy there but refused (ptrace): its error is named."""
        evidence = {**BLOCKED, PREFIX + "py_spy.error": "Permission denied (os error 13)"}
        sentence = explain(frozen(), evidence).sentence
        assert "unknown without native stacks (py-spy: Permission denied (os error 13))" in sentence, sentence

    def test_busy_without_native_stacks(self) -> None:
        evidence = {**BLOCKED, PREFIX + "process.cpu_percent": 99.0}
        sentence = explain(frozen(), evidence).sentence
        assert sentence.startswith("Busy on the CPU (99 %)"), sentence
        assert "Holding the GIL" not in sentence

    def test_native_stacks_that_do_not_tell(self) -> None:
        """py-spy's native stacks with no thread marked +gil nor taking the GIL: said so."""
        evidence = {**BLOCKED, PREFIX + "py_spy.dump": EXTENSION_WAIT_DUMP}
        assert has_native_stacks(EXTENSION_WAIT_DUMP) and gil_held(EXTENSION_WAIT_DUMP) is None
        sentence = explain(frozen(), evidence).sentence
        assert "Holding the GIL" not in sentence
        assert "py-spy's native stacks do not show which thread holds the GIL" in sentence, sentence


class TestWithNativeStacks:
    def test_a_thread_marked_gil(self) -> None:
        dump = 'Thread 4711 (active+gil): "MainThread"\n    <module> (job.py:3)\n'
        evidence = {**BLOCKED, PREFIX + "process.cpu_percent": 99.0, PREFIX + "py_spy.dump": dump}
        sentence = explain(frozen(), evidence).sentence
        assert sentence.startswith("Holding the GIL in native code and busy on the CPU (99 %)"), sentence
        assert "(py-spy shows thread 4711 (MainThread) holding it)" in sentence

    def test_a_thread_waiting_to_take_it(self) -> None:
        evidence = {**BLOCKED, PREFIX + "process.wait_channel": "__do_sys_pause", PREFIX + "py_spy.dump": PAUSE_DUMP}
        sentence = explain(frozen(), evidence).sentence
        assert sentence.startswith("Holding the GIL in native code while blocked (wait channel __do_sys_pause)")
        assert "py-spy's native stacks show thread 28638 waiting to take it" in sentence, sentence


# --- real processes, read by the watchdog --------------------------------------------------------

needs_py_spy = pytest.mark.skipif(py_spy_path() is None, reason="py-spy (the pyspy extra) is not installed")


def frozen_line(tmp_path: Path, script: str) -> str:
    (tmp_path / "job.py").write_text(script, encoding="utf-8")
    with open(tmp_path / "log.txt", "wb") as out:
        proc = subprocess.Popen(
            [PYTHON, "job.py", "--log", "run.log"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_FROZEN_AFTER="2"),
            start_new_session=True,
        )
    try:
        line = wait_for(
            lambda: (
                [x for x in (tmp_path / "run.log").read_text().splitlines() if "STALLED:" in x]
                if (tmp_path / "run.log").exists()
                else []
            ),
            timeout=60,
            what="the STALLED line in run.log",
        )[0]
        [record] = read_journal(tmp_path / "run.log.otel.jsonl").stalls
        assert record["kind"] == "frozen" and record["diagnosis"] in line
        return line
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.slow
@needs_py_spy
def test_a_busy_c_loop_holding_the_gil(tmp_path: Path) -> None:
    """``sum(range(...))`` runs in C and never lets the GIL go: py-spy shows the main thread
    ``active+gil``, and the line says so."""
    line = frozen_line(tmp_path, "import ctypes  # a job from here\nsum(range(10**14))\n")
    assert re.search(r"STALLED: frozen( in [\w ]+)?: no beat for [\d.]+ s \(limit 2 s\) — ", line), line
    assert "Holding the GIL in native code" in line, line
    assert "py-spy shows thread %s" % line.split("][", 2)[1] in line and "holding it" in line, line


@pytest.mark.slow
@needs_py_spy
def test_pause_holding_the_gil(tmp_path: Path) -> None:
    """``ctypes.PyDLL(None).pause()`` holds the GIL while blocked: py-spy's native stacks show the
    beat thread waiting to take it."""
    # (in a loop: the stack request's signal ends one pause(), as any handled signal does)
    line = frozen_line(tmp_path, "import ctypes\nwhile True:\n    ctypes.PyDLL(None).pause()\n")
    assert "Holding the GIL in native code while blocked (wait channel " in line and "pause" in line, line
    assert "waiting to take it" in line, line


# --- Yama ptrace_scope 1: the job names its sidecar as its tracer --------------------------------


def run_allow(scope_file: Path) -> list[str]:
    code = (
        "import os, sys\n"
        "from lora_otel._boot import spawn\n"
        "print(spawn.allow_tracing_by(os.getppid(), sys.argv[1]))\n"
        "print('ctypes' in sys.modules)\n"
    )
    r = subprocess.run(
        [PYTHON, "-c", code, str(scope_file)], capture_output=True, text=True, timeout=60, env=clean_env()
    )
    assert r.returncode == 0 and not r.stderr, r.stderr
    return r.stdout.split()


@pytest.mark.slow
def test_ptracer_is_named_only_under_scope_1(tmp_path: Path) -> None:
    """Scope 0 (or no Yama): nothing is done, not even ``import ctypes``. Scope 1: ``prctl(PR_SET_PTRACER)``
    is called, true where the kernel has Yama (false where it has not: EINVAL), and never raises."""
    scope = tmp_path / "ptrace_scope"
    scope.write_text("0\n")
    assert run_allow(scope) == ["False", "False"]
    assert run_allow(tmp_path / "missing") == ["False", "False"]
    scope.write_text("1\n")
    has_yama = os.path.exists("/proc/sys/kernel/yama/ptrace_scope")
    assert run_allow(scope) == [str(has_yama), "True"]


# --- a pause for native stacks is never taken where it would disturb the program -----------------

SIGWAIT_LOOP = (
    "import signal, sys, time\n"
    "sigs = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, sigs)\n"
    "print('ready', flush=True)\n"
    "got = []\n"
    "for line in iter(sys.stdin.readline, ''):\n"  # one wait per line the test sends, then a report
    "    s = signal.sigtimedwait(sigs, 1.0)\n"
    "    got.append(s and s.si_signo)\n"
    "print('got', [g for g in got if g], flush=True)\n"
)


@pytest.mark.slow
@needs_py_spy
def test_py_spy_does_not_pause_a_sigtimedwait(tmp_path: Path) -> None:
    """A thread in ``sigtimedwait`` (a service's shutdown loop): pausing the process for native stacks
    makes the call return a signal nobody sent (seen in CI). The dump is taken ``--nonblocking``: the
    Python frames are read, the program gets nothing, and the evidence says why native stacks are absent."""
    from lora_otel.analysis.evidence import py_spy_dump, stop_would_interrupt

    proc = subprocess.Popen(
        [PYTHON, "-c", SIGWAIT_LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean_env()
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        out = {}
        for _ in range(3):
            proc.stdin.write("wait\n")
            proc.stdin.flush()
            why = wait_for(lambda: stop_would_interrupt(proc.pid), timeout=60, what="the sigtimedwait wait channel")
            assert why.startswith("thread %d waits in do_sigtimedwait" % proc.pid), why
            out = py_spy_dump(proc.pid)
        proc.stdin.close()
        assert proc.stdout.readline() == "got []\n"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        if not proc.stdin.closed:
            proc.stdin.close()
    assert "sigtimedwait" in out[PREFIX + "py_spy.dump"], out
    assert "which pausing the process would interrupt" in out[PREFIX + "py_spy.native_error"], out
