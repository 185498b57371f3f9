"""`lora-otel run` passes a signal to its job only when the job did not get it already: a signal
sent to the whole process group (Ctrl-C, GNU ``timeout``, ``kill -- -PGID``) reaches the job
from the kernel, so the supervisor must not send it a second one; a signal sent to the
supervisor alone is forwarded, once.

The job saves its checkpoint when interrupted, which takes a while: a second interrupt during
the save loses it. Where the signal goes to the whole group, the supervisor is stopped
(SIGSTOP) until the job has taken its copy, so that a second one from the supervisor cannot
merge with the first in the job's pending signals: the job would see it, every time."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import termios
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, wait_for

pytestmark = pytest.mark.slow

JOB = """\
import signal, sys, time
got = []
def on_signal(signo, frame):
    got.append(signo)
signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)
print("ready", flush=True)
while not got:
    time.sleep(0.01)
print("saving checkpoint after signal %d" % got[0], flush=True)
deadline = time.monotonic() + 3  # saving takes a while: an interrupt meanwhile loses it
while time.monotonic() < deadline and len(got) == 1:
    time.sleep(0.01)
if len(got) > 1:
    print("interrupted again by signal %d: checkpoint lost" % got[1], flush=True)
    sys.exit(1)
print("checkpoint saved", flush=True)
"""

SUPERVISOR = [PYTHON, "-m", "lora_otel", "run", "--", PYTHON, "job.py"]


def start(tmp_path: Path, argv: list[str]) -> tuple[subprocess.Popen, Path]:
    """``argv`` in a session (and process group) of its own, its output in a file; once the job is ready."""
    (tmp_path / "job.py").write_text(JOB)
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            argv, cwd=tmp_path, env=clean_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    wait_for(lambda: "ready" in out.read_text(), 60, "the job to be ready")
    return proc, out


def finished(proc: subprocess.Popen, out: Path) -> str:
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out.read_text()


def assert_saved_once(rc: int, text: str) -> None:
    assert text.count("saving checkpoint") == 1, text
    assert "checkpoint lost" not in text, text
    assert "checkpoint saved" in text, text
    assert rc == 0, text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_group_reaches_the_job_once(tmp_path: Path, sig: int) -> None:
    """``kill -- -PGID``: the kernel gives the job the signal; the supervisor does not add one."""
    proc, out = start(tmp_path, SUPERVISOR)
    os.kill(proc.pid, signal.SIGSTOP)
    os.killpg(proc.pid, sig)
    wait_for(lambda: "saving checkpoint" in out.read_text(), 60, "the job to take the signal")
    os.kill(proc.pid, signal.SIGCONT)
    text = finished(proc, out)
    assert_saved_once(proc.returncode, text)


def test_a_signal_to_the_supervisor_alone_is_forwarded_once(tmp_path: Path) -> None:
    """SIGINT to the supervisor's pid only (a launcher's ``kill -INT``): the job gets it, once."""
    proc, out = start(tmp_path, SUPERVISOR)
    os.kill(proc.pid, signal.SIGINT)
    text = finished(proc, out)
    assert_saved_once(proc.returncode, text)


def test_gnu_timeout_interrupts_the_job_once(tmp_path: Path) -> None:
    """GNU ``timeout`` sends the signal to its child (the supervisor), then to its whole group (the
    job included), then SIGCONT to both: the job still sees one. ``timeout`` passes on a signal it
    receives the same way it sends its own when the time is up."""
    proc, out = start(tmp_path, ["timeout", "-s", "INT", "600", *SUPERVISOR])
    os.kill(proc.pid, signal.SIGINT)
    text = finished(proc, out)
    assert_saved_once(proc.returncode, text)


def test_ctrl_c_on_a_terminal_reaches_the_job_once(tmp_path: Path) -> None:
    """A real Ctrl-C: the supervisor runs on a pseudo-terminal as its foreground process group,
    and ``^C`` typed on it makes the terminal driver send SIGINT to the whole group."""
    (tmp_path / "job.py").write_text(JOB)
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        SUPERVISOR,
        cwd=tmp_path,
        env=clean_env(),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=controlling_terminal,
    )
    os.close(slave)
    seen = bytearray()

    def read_until(text: bytes) -> bool:
        while select.select([master], [], [], 0.05)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal is gone
                break
            if not chunk:
                break
            seen.extend(chunk)
        return text in seen

    try:
        wait_for(lambda: read_until(b"ready"), 60, "the job to be ready")
        os.kill(proc.pid, signal.SIGSTOP)
        os.write(master, b"\x03")  # Ctrl-C
        wait_for(lambda: read_until(b"saving checkpoint"), 60, "the job to take the signal")
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=60)
        read_until(b"checkpoint saved")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    assert_saved_once(proc.returncode, seen.decode(errors="replace"))
