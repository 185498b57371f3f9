"""Harmless everywhere, the wrapper: a job never outlives its ``lora-otel run`` (issue 12, item 11).

A launcher that SIGKILLs ``lora-otel run`` (a UI's stop button, a scheduler's escalation) would
have ended the training process itself without the wrapper; with it, the kernel's parent-death
signal ends it too, even when it ignores SIGTERM or holds the GIL in native code.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, wait_for

pytestmark = pytest.mark.slow

IGNORES_SIGTERM = """\
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open("ready.tmp", "w").write(str(os.getpid()))
os.rename("ready.tmp", "ready")
while True:
    time.sleep(1)
"""

HOLDS_THE_GIL = """\
import ctypes, os
open("ready.tmp", "w").write(str(os.getpid()))
os.rename("ready.tmp", "ready")
ctypes.PyDLL(None).pause()  # blocks in C with the GIL held: no Python code runs any more
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead; reaped by whoever adopted it, or not)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("program", [IGNORES_SIGTERM, HOLDS_THE_GIL], ids=["ignores-SIGTERM", "holds-the-GIL"])
def test_sigkill_of_the_wrapper_ends_the_job(tmp_path: Path, program: str) -> None:
    """SIGKILL to `lora-otel run` ends the training process within seconds (before: it kept
    running, orphaned, holding its GPU), and `inspect --summary` says it was killed with its
    wrapper."""
    (tmp_path / "train.py").write_text(program)
    wrapper = subprocess.Popen(
        [PYTHON, "-m", "lora_otel", "run", "--dir", "j", "--", PYTHON, "train.py"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    child = 0
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 60, "the training process to start")
        child = int((tmp_path / "ready").read_text())
        os.kill(wrapper.pid, signal.SIGKILL)
        wrapper.wait(10)
        wait_for(lambda: _gone(child), 10, "the training process to end with its wrapper")
    finally:
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)
        if wrapper.poll() is None:
            wrapper.kill()
    s = subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", str(tmp_path / "j"), "--summary"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert s.returncode == 3, s.stdout + s.stderr
    assert "killed with its lora-otel run (pid %d" % wrapper.pid in s.stdout, s.stdout


CHECKPOINTS_ON_SIGNAL = """\
import os, signal, sys, time
def checkpoint(signum, frame):
    time.sleep(0.5)  # writing a checkpoint takes a while
    open("ckpt-%d.done" % signum, "w").write("ok")
    sys.exit(0)
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM):
    signal.signal(s, checkpoint)
open("ready.tmp", "w").write(str(os.getpid()))
os.rename("ready.tmp", "ready")
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM], ids=lambda s: signal.Signals(s).name
)
def test_signals_sent_to_the_wrapper_reach_the_job(tmp_path: Path, sig: int) -> None:
    """Slurm's ``--signal=USR1@90``, Lightning's requeue, a user's ``kill -QUIT``: a signal sent to
    ``lora-otel run`` reaches the command, whose own handler runs to the end (its checkpoint is
    written) and decides the exit status, as without the wrapper. (Before: the wrapper died of the
    signal's default action and the kernel's parent-death signal SIGKILLed the job mid-checkpoint.)"""
    (tmp_path / "job.py").write_text(CHECKPOINTS_ON_SIGNAL)
    wrapper = subprocess.Popen(
        [PYTHON, "-m", "lora_otel", "run", "--", PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 60, "the job to start")
        wrapper.send_signal(sig)
        _, err = wrapper.communicate(timeout=60)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
    assert wrapper.returncode == 0, err
    assert (tmp_path / ("ckpt-%d.done" % sig)).read_text() == "ok"
