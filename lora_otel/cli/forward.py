"""Which signals ``lora-otel run`` passes to its command: only those the command did not get already.

A signal sent to a whole process group (Ctrl-C on a terminal, GNU ``timeout``, ``kill -- -PGID``,
a scheduler ending a job's group) reaches the supervisor *and* the command, which is in its group:
forwarding it as well would make the command see it twice (a job that saves a checkpoint on
``KeyboardInterrupt`` is interrupted again in the middle of the save). A signal sent to the
supervisor alone must still reach the command, once.

The supervisor cannot tell the two apart from its own signal: ``kill(pid)`` and ``kill(-pgid)``
leave the same ``siginfo``. A *witness* can: a tiny process of the supervisor's group that takes
every forwarded signal with ``sigwaitinfo`` and reports each one (number, sender's pid, ``si_code``)
on a pipe. The supervisor takes its own signals the same way (blocked, ``sigtimedwait``), and a
signal the witness also took from the same sender was a group's: not forwarded. One the witness did
not see within `GRACE_S` was the supervisor's alone: forwarded. A command that left the group
(``setsid``, ``setpgid``) gets every signal forwarded, as before.

The witness is ``python -I -c`` (no site, so no preamble), started with the signals already
blocked (the mask survives ``exec``), so a signal sent at any time after it exists is seen; it
exits when the supervisor does (its parent pid changes, or the pipe has no reader).
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable

GRACE_S = 0.25
"""How long the supervisor waits for the witness's report before it takes a signal for its own alone."""
KEEP_S = 30.0
"""How long a report of a group's signal that the supervisor has not matched yet is kept."""
REPEAT_S = 1.0
"""A matched report also covers the same signal from the same sender this soon after (GNU
``timeout`` sends to its child and then to its group: the supervisor may get both)."""

_REPORT = struct.Struct("=iiid")  # signal, sender's pid, si_code, CLOCK_MONOTONIC when taken

WITNESS = """\
import os, signal, struct, time
sigs = [%s]
parent = os.getppid()
pack = struct.Struct("=iiid").pack
while os.getppid() == parent:
    info = signal.sigtimedwait(sigs, 1.0)
    if info is not None:
        os.write(1, pack(info.si_signo, info.si_pid, info.si_code, time.monotonic()))
"""


class Witness:
    """A process of this process's group that sees the signals sent to the group (module docstring)."""

    def __init__(self, sigs: Iterable[int]) -> None:
        self.sigs = sorted(int(s) for s in sigs)
        self.proc: subprocess.Popen[bytes] | None = None
        self.reports: list[tuple[int, int, int, float]] = []  # not matched yet
        self.matched: list[tuple[int, int, int, float]] = []  # (signal, pid, code, when matched)
        self._buf = b""

    def start(self) -> bool:
        """Start the witness; call with the signals blocked in this thread (the witness inherits the
        mask, so none is lost before it waits). False when it cannot be started."""
        code = WITNESS % ", ".join(str(s) for s in self.sigs)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", code],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={k: v for k, v in os.environ.items() if not k.startswith("LORA_OTEL")},
                close_fds=True,
            )
        except OSError:
            self.proc = None
            return False
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _read(self, timeout: float) -> bool:
        """Read what the witness reported, waiting up to ``timeout`` for something; whether any came."""
        if self.proc is None or self.proc.stdout is None:
            return False
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return False
        try:
            data = os.read(fd, 4096)
        except OSError:
            return False
        if not data:
            return False
        self._buf += data
        n = len(self._buf) // _REPORT.size * _REPORT.size
        for rec in _REPORT.iter_unpack(self._buf[:n]):
            self.reports.append(rec)
        self._buf = self._buf[n:]
        return True

    def group_sent(self, info: signal.struct_siginfo) -> bool:
        """Whether the signal ``info`` that this process took was sent to its whole group (the
        witness took it too, from the same sender), waiting up to `GRACE_S` for the witness."""
        key = (info.si_signo, info.si_pid, info.si_code)
        deadline = time.monotonic() + GRACE_S
        while True:
            now = time.monotonic()
            self.reports = [r for r in self.reports if now - r[3] < KEEP_S]
            self.matched = [m for m in self.matched if now - m[3] < REPEAT_S]
            for r in self.reports:
                if r[:3] == key:
                    self.reports.remove(r)
                    self.matched.append((*key, now))
                    return True
            if any(m[:3] == key for m in self.matched):
                return True
            left = deadline - now
            if left <= 0 or not self.alive:
                return False
            self._read(left)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def can_witness() -> bool:
    """Whether this platform has what the witness needs (``sigtimedwait``, ``pthread_sigmask``)."""
    return hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")


def supervise(child: subprocess.Popen[bytes], witness: Witness | None, sigs: Iterable[int]) -> int:
    """Wait for ``child``, this thread holding ``sigs`` blocked (the caller blocked them), passing
    each signal on unless ``child`` got it already from the group (`Witness.group_sent`); the exit
    status. The signals are left blocked: the caller drains and restores (`drain`)."""
    waited = [*sigs, signal.SIGCHLD]
    ours = os.getpgrp()
    while True:
        rc = child.poll()
        if rc is not None:
            return rc
        info = signal.sigtimedwait(waited, 1.0)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if witness is not None and witness.alive and _pgid(child.pid) == ours and witness.group_sent(info):
            continue  # the command has it from the kernel already
        try:
            child.send_signal(info.si_signo)
        except OSError:
            pass


def drain(sigs: Iterable[int]) -> None:
    """Take the signals still pending here (the command is gone: they were for it), so restoring the
    mask does not end this process with one the command already had."""
    waited = list(sigs)
    while signal.sigtimedwait(waited, 0) is not None:
        pass


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1
