"""What a child that its parent waits for (joins) waits on itself: the end of a chain of waits.

A parent joining a child (``Process.join``, ``Popen.wait``, a pool's worker) is stuck as long as the
child is; `lora_otel.analysis.pools` names the child that "has not ended", and this module says why
it has not, from the evidence only:

- any thread of the child blocked on a descriptor (`lora_otel.analysis.waitfacts` followed the
  parent's ``wait4`` into the child and its threads: ``wait.threads[…].other``), and who holds that
  descriptor's other end. When the parent holds it, each waits for the other; when the child's main
  thread is joining a ``multiprocessing`` queue's feeder thread (``queues.py`` ``_finalize_join``)
  the thread is that feeder: the queue's data must be read before the child can end;
- its main thread acquiring a lock in the program's code (its native frames show the C lock
  acquire under a program frame) in a child forked while other threads of the parent ran
  (``process.fork.parent_threads``): a lock one of them held at the fork is never released there.

Pure: reads the recorded evidence and the child's journal root attributes; standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

KEY = "lora_otel.evidence.wait."
_LOCK_ACQUIRE = ("lock_PyThread_acquire_lock", "rlock_acquire", "_thread_RLock_acquire")
_STDLIB_WAITS = ("threading.py", "multiprocessing/", "queue.py", "concurrent/futures/")
_FEEDER_JOIN = ("multiprocessing/queues.py", "multiprocess/queues.py")

QUEUE_ADVICE = (
    "Read the queue (Queue.get()) before joining the process that put to it: a process that put data on "
    "a multiprocessing Queue ends only once that data is read (or call cancel_join_thread() in it, "
    "losing that data)."
)
PIPE_ADVICE = (
    "Read the pipe's end in the parent before it waits for the child to exit (or read it from another "
    "thread): the child cannot finish writing, and so cannot end, while nobody reads."
)
PIPE_WRITE_ADVICE = (
    "Write what the child reads (or close the parent's write end, so that it reads end-of-file) before "
    "the parent waits for the child to exit: the child waits for data only the parent can send."
)
FORK_LOCK_ADVICE = (
    "Start the child with the spawn start method (multiprocessing.get_context('spawn')), or take no lock "
    "in a thread while the process forks (os.register_at_fork to take it around the fork)."
)


@dataclass(frozen=True)
class ChildWait:
    """The phrase for the child's part of the sentence, and the advice it supports ("" for none)."""

    phrase: str
    advice: str


def _entry(evidence_threads: Any, parent: Optional[int], child: int) -> Optional[Mapping[str, Any]]:
    """The child's wait as the parent's chain of waits recorded it (its role ``child``)."""
    for wait in evidence_threads or ():
        if not isinstance(wait, Mapping) or wait.get("op") != "child":
            continue
        if parent is not None and wait.get("pid") != parent:
            continue
        for other in wait.get("other") or ():
            if isinstance(other, Mapping) and other.get("pid") == child and other.get("role") == "child":
                return other
    return None


def _joins_feeder(row: Optional[Mapping[str, Any]], journal_frames: Sequence[Any]) -> bool:
    """Whether the child's main thread (its journal's beat, or as read from outside) is joining a
    ``multiprocessing`` queue's feeder thread (``queues.py`` ``_finalize_join``: a process's exit
    waits until what it put on a queue is written to the queue's pipe)."""
    frames = list(journal_frames) + list((row or {}).get("frames") or ())
    return any(
        isinstance(f, (list, tuple))
        and len(f) == 3
        and f[2] == "_finalize_join"
        and any(q in str(f[0]).replace("\\", "/") for q in _FEEDER_JOIN)
        for f in frames
    )


def _thing(what: Mapping[str, Any], op: str) -> str:
    kind = str(what.get("kind") or "")
    target = str(what.get("target") or "")
    noun = {"pipe": "a pipe", "fifo": "the FIFO %s" % target, "socket": "a socket"}.get(kind, target or "a descriptor")
    if kind == "pipe" and target:
        noun += " (%s" % target
        if op == "write" and isinstance(what.get("queued_bytes"), int):
            noun += ", %d bytes in it not yet read" % what["queued_bytes"]
        noun += ")"
    return noun


def descriptor_wait(
    evidence_threads: Any, parent: Optional[int], child: int, child_frames: Sequence[Any] = (), row: Any = None
) -> Optional[ChildWait]:
    """The child's thread blocked on a descriptor and the other end, None when the evidence shows none."""
    entry = _entry(evidence_threads, parent, child)
    if entry is None or entry.get("op") not in ("read", "write"):
        return None
    op = str(entry["op"])
    what = entry.get("what") or {}
    feeder = entry.get("main") is False and op == "write" and _joins_feeder(row, child_frames)
    if entry.get("main") is True:
        who = "its main thread"
    elif feeder:
        who = "its multiprocessing Queue's feeder thread (thread %s; its main thread waits for it to finish)" % (
            entry.get("tid")
        )
    else:
        who = "its thread %s" % entry.get("tid")
    phrase = "%s waits to %s %s" % (who, "write to" if op == "write" else "read", _thing(what, op))
    end = "read end" if op == "write" else "write end"
    holders = [o for o in entry.get("other") or () if isinstance(o, Mapping) and "pid" in o]
    others = [o for o in holders if o.get("pid") != child]
    if parent is not None and any(o.get("pid") == parent for o in others):
        phrase += (
            ", whose %s this process holds%s and does not %s while it waits for the child: each waits for the other"
            % (
                end,
                " (the child holds it too)" if any(o.get("pid") == child for o in holders) else "",
                "read" if op == "write" else "write",
            )
        )
        return ChildWait(phrase, QUEUE_ADVICE if feeder else PIPE_ADVICE if op == "write" else PIPE_WRITE_ADVICE)
    if others:
        o = others[0]
        phrase += ", whose %s is held by pid %s (state %s, wait channel %s)" % (
            end,
            o.get("pid"),
            o.get("state") or "?",
            o.get("wchan") or "-",
        )
    elif entry.get("other") is not None and what.get("kind") in ("pipe", "fifo"):
        phrase += "; no process but the child itself holds its %s" % end
    return ChildWait(phrase, "")


def _lock_frame(row: Optional[Mapping[str, Any]]) -> str:
    """``job.py:18 in load``: the program's frame right over a C lock acquire in the child's main
    thread's native stack (innermost first), or ""."""
    native = (row or {}).get("native") or ()
    seen_acquire = False
    for entry in native:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            continue
        name, where = str(entry[0]), str(entry[1])
        if name in _LOCK_ACQUIRE:
            seen_acquire = True
            continue
        if ".py:" in where:
            if not seen_acquire or any(s in where.replace("\\", "/") for s in _STDLIB_WAITS):
                return ""
            return "%s in %s" % (where.replace("\\", "/").rsplit("/", 1)[-1], name.rsplit(".", 1)[-1])
    return ""


def lock_wait(row: Optional[Mapping[str, Any]], fork_threads: Optional[int]) -> Optional[ChildWait]:
    """The child's main thread acquiring a lock in the program's code; with a fork while other threads
    of the parent ran (``fork_threads`` > 0), that a lock held at the fork is never released."""
    where = _lock_frame(row)
    if not where:
        return None
    phrase = "its main thread waits to acquire a lock at %s" % where
    if fork_threads is not None and fork_threads > 0:
        phrase += (
            "; it was forked while %d other thread%s of the parent ran: a lock one of them held at the fork "
            "stays held for ever in the child, where that thread does not exist"
            % (fork_threads, "" if fork_threads == 1 else "s")
        )
        return ChildWait(phrase, FORK_LOCK_ADVICE)
    return ChildWait(phrase, "")


def child_wait(
    evidence_threads: Any,
    parent: Optional[int],
    child: int,
    row: Optional[Mapping[str, Any]],
    child_frames: Sequence[Any],
    fork_threads: Optional[int],
) -> Optional[ChildWait]:
    """What the child waits on (a descriptor and its other end, else a lock), None when the evidence shows neither."""
    return descriptor_wait(evidence_threads, parent, child, child_frames, row) or lock_wait(row, fork_threads)
