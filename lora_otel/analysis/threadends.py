"""Threads of the program that ended by an uncaught exception, as the process journaled them
(``thread exception`` events on its root span, `lora_otel._boot.preamble._watch_thread_errors`),
and what that means for a main thread left waiting on a queue, an event or a condition: the thread
that would have put an item or set it is gone.

Pure functions of the journal; standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from lora_otel.journal.reader import Journal
from lora_otel.journal.tree import iso_time

THREAD_EXCEPTION = "thread exception"
"""The root span event (`lora_otel._boot.preamble.THREAD_EXCEPTION`)."""
MAX_MESSAGE = 120


@dataclass(frozen=True)
class ThreadError:
    at_ns: int
    name: str
    type: str
    message: str
    where: str  # ``loader.py:40 in prefetch``, "" when not known

    def text(self) -> str:
        """``thread prefetch ended at 2026-…Z by an uncaught OSError ("corrupt shard") raised at loader.py:40 in
        prefetch``."""
        said = self.message if len(self.message) <= MAX_MESSAGE else self.message[: MAX_MESSAGE - 1] + "…"
        return "thread %s ended at %s by an uncaught %s%s%s" % (
            self.name or "(unnamed)",
            iso_time(self.at_ns),
            self.type,
            ' ("%s")' % said if said else "",
            " raised at %s" % self.where if self.where else "",
        )


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def thread_errors(journal: Optional[Journal]) -> list[ThreadError]:
    """The threads of ``journal``'s process that ended by an uncaught exception, oldest first."""
    root = journal.root if journal is not None else None
    if root is None:
        return []
    out = []
    for ts, name, attrs in root.events:
        if name != THREAD_EXCEPTION or not isinstance(attrs, dict):
            continue
        path, line, func = _str(attrs.get("code.filepath")), attrs.get("code.lineno"), _str(attrs.get("code.function"))
        where = (
            "%s:%s in %s" % (path.replace("\\", "/").rsplit("/", 1)[-1], line, func)
            if path and isinstance(line, int)
            else ""
        )
        out.append(
            ThreadError(
                ts,
                _str(attrs.get("thread.name")),
                _str(attrs.get("exception.type")) or "exception",
                _str(attrs.get("exception.message")),
                where,
            )
        )
    return sorted(out, key=lambda e: e.at_ns)


def told(event_wait: str, errors: list[ThreadError]) -> tuple[str, str]:
    """The main thread's wait for an event (``Waiting for an event: … no thread the stacks show is
    doing so.``) with the threads that ended by an exception: the sentence and the advice."""
    head = event_wait.rstrip().rstrip(".")
    ended = "; ".join(e.text() for e in errors[-3:])
    sentence = "%s; %s, so %s will not put or set anything more." % (
        head,
        ended,
        "it" if len(errors) == 1 else "they",
    )
    last = errors[-1]
    advice = (
        "Fix the %s that thread %s raised%s; and make that thread pass its failure on — put a sentinel or the "
        "exception on the queue (or set the event) in an except or finally block — so the main thread stops "
        "instead of waiting, or wait with a timeout (get(timeout=...), wait(timeout=...))."
        % (last.type, last.name or "(unnamed)", " at %s" % last.where if last.where else "")
    )
    return sentence, advice
