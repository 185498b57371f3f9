"""A wait for a lock shared between processes (``multiprocessing.Lock``, ``RLock``, ``Semaphore``),
and whether the process that held it can still release it.

Such a lock is a semaphore of the operating system that the processes share: a process killed
while holding it (SIGKILL, the OOM killer) never releases it, and the system does not free it at
its holder's death, so every later ``acquire`` waits forever.

Read from the evidence:

- the main thread waits in ``multiprocessing``'s ``synchronize`` (``with lock:`` →
  ``SemLock.__enter__``, ``lock.acquire()`` → ``SemLock.acquire``);
- the process's children (`lora_otel.analysis.pools.workers_of`: its ``child exit`` events, their
  journals, ``/proc``): one killed by a signal, its last beat sample (inside ``synchronize`` or in
  a ``with`` block of the program) when it has one, and whether any other child still runs — a live
  one could hold the lock and release it yet.

Pure: frames come parsed, innermost first; the source through a callable (none in recorded evidence).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from lora_otel.analysis import pools
from lora_otel.journal.reader import Journal
from lora_otel.journal.tree import iso_time

_SYNC = ("multiprocessing/synchronize.py", "multiprocess/synchronize.py")
_TAKES = ("__enter__", "acquire")
_WITH = re.compile(r"^\s*(?:async\s+)?with\s+([\w.]+)\s*(?:\(\s*\))?\s*(?::|as\b)")
_ACQUIRE = re.compile(r"([\w.]+)\.acquire\s*\(")


@dataclass(frozen=True)
class Found:
    sentence: str
    advice: str


def _in(path: str, fragment: str) -> bool:
    path = path.replace("\\", "/")
    return path.startswith(fragment) or ("/" + fragment) in path


def _short(file: str, line: Any, func: str) -> str:
    return "%s:%s in %s" % (file.replace("\\", "/").rsplit("/", 1)[-1], line, func)


def semlock_wait(frames: Sequence[Any]) -> Optional[int]:
    """The index of the frame that takes a multiprocessing lock (``synchronize.py`` ``__enter__`` /
    ``acquire``) when it is the innermost Python frame of the thread, else None."""
    python = [i for i, fr in enumerate(frames) if fr.python and not _in(fr.file, "lora_otel/_boot/")]
    if not python:
        return None
    first = frames[python[0]]
    if any(_in(first.file, s) for s in _SYNC) and first.func in _TAKES:
        return python[0]
    return None


def _in_lock(frames: Iterable[Any]) -> bool:
    """A beat sample (``[file, line, function]``, any order) inside multiprocessing's synchronize."""
    return any(
        isinstance(fr, (list, tuple)) and len(fr) >= 3 and any(_in(str(fr[0] or ""), s) for s in _SYNC) for fr in frames
    )


def lock_wait(
    frames: Sequence[Any],
    journal: Optional[Journal],
    peers: Iterable[Journal],
    evidence_children: Iterable[Any],
    source: Callable[[Any], str] = lambda frame: "",
    held: Sequence[str] = (),
    other_threads: Sequence[str] = (),
) -> Optional[Found]:
    """What a main thread waiting for a multiprocessing lock waits on and, when a child of the
    process was killed and none is left alive to release the lock, why it never comes.

    ``held``: the ``with`` blocks the main thread is inside (its source); one on the same name
    means it holds that lock itself. ``other_threads``: the process's other threads the stacks show
    at work (not idle helpers): one of them may hold it, so no dead holder is concluded."""
    at = semlock_wait(frames)
    if at is None:
        return None
    caller = next(
        (fr for fr in frames[at + 1 :] if fr.python and not any(_in(fr.file, s) for s in _SYNC)),
        None,
    )
    text = source(caller) if caller is not None else ""
    match = _WITH.match(text) or _ACQUIRE.search(text)
    name = " (%s)" % match.group(1) if match else ""
    where = " at %s" % _short(caller.file, caller.line, caller.func) if caller is not None else ""
    head = "The main thread waits for a multiprocessing lock%s%s — a semaphore shared between processes" % (
        name,
        where,
    )
    lock = match.group(1) if match else ""
    if lock and lock in held:
        return Found(
            "%s, inside a `with %s:` block of its own: it holds that lock already, and a multiprocessing.Lock "
            "taken twice by one holder waits forever (an RLock does not)." % (head, lock),
            "Do not take %s again while holding it (or make it a multiprocessing.RLock)." % lock,
        )
    if journal is None:
        return Found(head + ".", "")
    workers = [w for w in pools.workers_of(journal, peers, evidence_children) if not w.role]
    killed = [w for w in workers if w.end is not None and "killed" in w.end]
    alive = [w for w in workers if w.end is None and not w.ended_well and (w.journal is not None or w.row)]
    alive = [w for w in alive if pools._alive(w)]
    if not killed:
        return Found(head + ".", "")
    parts = []
    for w in killed[:3]:
        when = " at %s" % iso_time(w.ended_ns) if w.ended_ns else ""
        inside = (
            " (its last sample shows it inside the lock's code)"
            if w.journal is not None and _in_lock(w.journal.main_frames or ())
            else ""
        )
        parts.append("pid %d was %s%s%s" % (w.pid, w.end, when, inside))
    its = "its child " if len(killed) == 1 else "its children "
    if alive or other_threads:
        live = ", ".join(["pid %d" % w.pid for w in alive[:3]] + ["%s of this process" % t for t in other_threads[:3]])
        many = len(alive) + len(other_threads) > 1
        return Found(
            "%s; %s%s; %s still run%s and may hold it." % (head, its, "; ".join(parts), live, "" if many else "s"),
            "",
        )
    sentence = (
        "%s; %s%s, and no other child of it is alive to release it: a process killed while holding a "
        "multiprocessing lock never releases it (the system does not free the semaphore when its holder "
        "dies), so this wait never ends." % (head, its, "; ".join(parts))
    )
    advice = (
        "Restart the job: the lock cannot be freed now. Find why pid %d was killed (the OOM killer, a "
        "timeout) so workers do not die holding the lock; or take it with a timeout "
        "(lock.acquire(timeout=...)) so a lost holder becomes an error." % killed[0].pid
    )
    return Found(sentence, advice)
