"""A job blocked writing to its stdout or stderr, a pipe that nobody reads.

The classic case: a launcher starts the job with ``stdout=subprocess.PIPE`` and reads the pipe only
after the job has ended (``Popen.wait()`` first: the deadlock the subprocess documentation warns
of). Once the job has printed a pipe's worth (64 kB on Linux), its next ``print`` blocks in the
kernel, with the GIL released, until somebody reads — which never happens. The job looks frozen,
but the truth is outside it: which process holds the read end, and what that process does instead.

`full_pipe` reads the evidence `evidence.pipe_facts` gathers (``lora_otel.evidence.pipe.*``): which
of descriptors 1 and 2 is a pipe, how full it is, the threads of the job waiting to write to a
pipe, and the processes holding each pipe's read end with their state and wait channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from lora_otel.analysis.evidence import PIPE_READ_WCHAN, PREFIX

FULL_FRACTION = 0.5
"""A pipe holding at least this share of its capacity may be the one the job waits to write to (a
writer blocks when what it writes does not fit: a pipe of 65536 bytes can block one at 64000)."""
MAX_READERS = 4

_STREAM = {1: "stdout", 2: "stderr"}

# What a reader that is not reading waits for instead, by its main thread's kernel wait channel.
_WAITS = (
    ("do_wait", "waits for a child process to exit"),
    ("kernel_wait4", "waits for a child process to exit"),
    ("hrtimer_nanosleep", "sleeps"),
    ("do_nanosleep", "sleeps"),
    ("futex", "waits on a lock or condition (futex)"),
    ("ep_poll", "polls other descriptors (epoll)"),
    ("do_select", "polls descriptors (select)"),
    ("do_sys_poll", "polls descriptors (poll)"),
    ("do_poll", "polls descriptors (poll)"),
    ("__do_sys_pause", "waits for a signal (pause)"),
)


def _blocked_writer(evidence: Mapping[str, Any], frozen: bool) -> Optional[str]:
    """How the job is seen writing: its main thread (or, when it no longer beats, any thread)
    waiting in a pipe write; None when none is."""
    threads = [str(t) for t in evidence.get(PREFIX + "pipe.writing_threads") or ()]
    if evidence.get(PREFIX + "pipe.main_thread_writing") is True:
        wchan = next((t.split(" ", 1)[1] for t in threads if " " in t), "anon_pipe_write")
        return "the main thread waits in %s" % wchan
    if frozen and threads:
        tid, _, wchan = threads[0].partition(" ")
        return "thread %s waits in %s" % (tid, wchan or "a pipe write")
    return None


def _full(evidence: Mapping[str, Any], fd: int) -> Optional[bool]:
    """Whether the pipe on ``fd`` is (nearly) full; None when its fill could not be read."""
    queued = evidence.get(PREFIX + "pipe.fd%d.queued_bytes" % fd)
    capacity = evidence.get(PREFIX + "pipe.fd%d.capacity_bytes" % fd)
    if not isinstance(queued, int):
        return None
    if not isinstance(capacity, int) or capacity <= 0:
        return queued > 0
    return queued >= capacity * FULL_FRACTION


def stderr_blocked(evidence: Mapping[str, Any]) -> bool:
    """Whether the job's own lines (on its stderr) may not get through: its stderr is a pipe that is
    full, or whose fill could not be read. A full stdout with stderr elsewhere does not stop them."""
    return isinstance(evidence.get(PREFIX + "pipe.fd2.inode"), int) and _full(evidence, 2) is not False


def _fill(evidence: Mapping[str, Any], fd: int) -> str:
    queued = evidence.get(PREFIX + "pipe.fd%d.queued_bytes" % fd)
    capacity = evidence.get(PREFIX + "pipe.fd%d.capacity_bytes" % fd)
    if isinstance(queued, int) and isinstance(capacity, int):
        return " holding %d of its %d bytes" % (queued, capacity)
    if isinstance(queued, int):
        return " holding %d bytes" % queued
    return ""


def describe_reader(reader: Mapping[str, Any], writer_pid: Optional[int] = None) -> str:
    """``pid 4711 (python launcher.py), not reading it: it waits for a child process to exit
    (wait channel do_wait)``."""
    cmd = str(reader.get("cmdline") or "").strip()
    if len(cmd) > 80:
        cmd = cmd[:79] + "\u2026"
    who = "pid %s%s" % (reader.get("pid"), " (%s)" % cmd if cmd else "")
    if writer_pid is not None and reader.get("pid") == writer_pid:
        who += ", the job itself"
    wchan = str(reader.get("wchan") or "-")
    state = str(reader.get("state") or "")
    if reader.get("reading") is True:
        return "%s, which has a thread waiting in a pipe read (of another pipe: this one has data)" % who
    if state == "T":
        return "%s, which is stopped (SIGSTOP or a debugger)" % who
    if state == "Z":
        return "%s, which has ended but not been reaped (a zombie)" % who
    if state == "R":
        return "%s, which is running: busy elsewhere, or reading slower than the job writes" % who
    if wchan.startswith(PIPE_READ_WCHAN):
        return "%s, which waits in a pipe read" % who
    doing = next((text for prefix, text in _WAITS if wchan.startswith(prefix)), "waits in the kernel")
    text = "%s, which is not reading it: it %s (wait channel %s)" % (who, doing, wchan)
    if wchan.startswith(("do_wait", "kernel_wait4")):
        text += ", to read the pipe only after the job ends (the stdout=PIPE deadlock)"
    return text


def _chosen(evidence: Mapping[str, Any]) -> list[int]:
    """The descriptors (1, 2) the job may be blocked on: the (nearly) full pipes, else those whose
    fill could not be read."""
    fds = [fd for fd in _STREAM if isinstance(evidence.get(PREFIX + "pipe.fd%d.inode" % fd), int)]
    full = [fd for fd in fds if _full(evidence, fd)]
    return full or [fd for fd in fds if _full(evidence, fd) is None]


def full_pipe(
    evidence: Mapping[str, Any], where: str = "", frozen: bool = False, pid: Optional[int] = None
) -> Optional[str]:
    """``Blocked writing to its stdout, a pipe nobody reads: …`` when the job waits to write to a
    pipe and its stdout or stderr is a (nearly) full pipe; which process holds the read end and
    what it does instead of reading. None otherwise.

    ``where``: the main thread's innermost Python frame; ``frozen``: the job no longer beats (then
    a thread other than the main one blocked in a pipe write counts too); ``pid``: the job's."""
    writer = _blocked_writer(evidence, frozen)
    if writer is None:
        return None
    chosen = _chosen(evidence)
    if not chosen:
        return None
    inodes = {fd: evidence[PREFIX + "pipe.fd%d.inode" % fd] for fd in chosen}
    same = len(chosen) == 2 and inodes[1] == inodes[2]
    fd = chosen[0]
    streams = "stdout and stderr (one pipe)" if same else " and ".join(_STREAM[f] for f in chosen)
    head = "Blocked writing to its %s, a pipe nobody reads: %s; pipe:[%d]%s" % (
        streams,
        writer,
        inodes[fd],
        _fill(evidence, fd),
    )
    readers = [r for r in evidence.get(PREFIX + "pipe.fd%d.readers" % fd) or () if isinstance(r, Mapping)]
    if not readers:
        tail = "; no process this user can see holds its read end (another user's, or in another PID namespace)"
    else:
        told = [describe_reader(r, pid) for r in readers[:MAX_READERS]]
        if len(readers) > MAX_READERS:
            told.append("and %d more" % (len(readers) - MAX_READERS))
        tail = "; its read end is held by %s" % "; ".join(told)
    return "%s%s%s." % (head, tail, "; last Python frame: %s" % where if where else "")


def advice(
    evidence: Mapping[str, Any], frozen: bool = False, pid: Optional[int] = None, parent_pid: Optional[int] = None
) -> str:
    """What to do about the pipe `full_pipe` told ("" when it told none, or the evidence names no
    process that could read it): who must read it — the process holding its read end, by pid and
    command, called the program that started the job when it is the job's parent — or, for a
    stopped reader, to resume it. ``parent_pid``: the job's parent (its root span's)."""
    if _blocked_writer(evidence, frozen) is None:
        return ""
    chosen = _chosen(evidence)
    if not chosen:
        return ""
    fd = chosen[0]
    readers = [r for r in evidence.get(PREFIX + "pipe.fd%d.readers" % fd) or () if isinstance(r, Mapping)]
    readers = [r for r in readers if r.get("pid") != pid]  # the job's own copy of its read end reads nothing
    if not readers:
        return ""
    reader = readers[0]
    cmd = str(reader.get("cmdline") or "").strip()
    if len(cmd) > 80:
        cmd = cmd[:79] + "\u2026"
    who = "pid %s%s" % (reader.get("pid"), " %s" % cmd if cmd else "")
    stream = " and ".join(_STREAM[f] for f in chosen)
    if str(reader.get("state") or "") == "T":
        return "Resume %s, which holds the read end of the job's %s and is stopped: kill -CONT %s." % (
            who,
            stream,
            reader.get("pid"),
        )
    if str(reader.get("state") or "") in ("R", "Z"):
        return ""  # busy or slow, or ended: no step the evidence supports
    holder = "started this job" if parent_pid is not None and reader.get("pid") == parent_pid else "holds its read end"
    return (
        "The program that %s (%s) must read the job's %s while the job runs (Popen.communicate(), or a "
        "thread reading the pipe), or start the job with %s to a file." % (holder, who, stream, stream)
    )
