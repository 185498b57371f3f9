"""How children ended, as their parents saw it: the ``child exit`` events.

A traced process journals each child it reaps (``os.wait*``, hence ``subprocess`` and
multiprocessing) as a ``child exit`` event on its root span (`lora_otel._boot.hooks.CHILD_EXIT`):
the child's pid, its exit code or the signal that killed it, whether it dumped core. So the end of
a child that could not say it (SIGKILL, the OOM killer, a segfault in C) is known, and when: the
parent reaped it at most moments after it died.

Whether the OOM killer sent a SIGKILL is read from the memory cgroup's ``oom_kill`` counter,
compared around the death: the parent journals the count when it reaps a SIGKILLed child
(``child.oom_kills``), against the count it journaled at promotion (``lora_otel.cgroup.oom_kills``)
or at its previous such reap; the watchdog compares it too, while it follows the child
(`lora_otel.analysis.oom.OomWatch`, the ``oom`` evidence of a ``died`` record). The count is
the cgroup's: another process's OOM kill in the same cgroup meanwhile counts too.

Pure functions of journals; standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from lora_otel.journal.reader import Journal

CHILD_EXIT = "child exit"
"""The root span event a process writes for each child it reaps (`lora_otel._boot.hooks.CHILD_EXIT`)."""
OOM_BASELINE_ATTR = "lora_otel.cgroup.oom_kills"
"""Root span attribute: the memory cgroup's ``oom_kill`` count when the process became a job."""


@dataclass(frozen=True)
class ChildEnd:
    """How one child ended, from its parent's ``child exit`` event.

    ``at_ns``: when the parent reaped it (the child was dead by then). ``exit_code``: it exited
    (None: killed). ``signal``: the signal that killed it, by name (``SIGKILL``). ``oom_killed``:
    True when the memory cgroup's OOM-kill count rose around its SIGKILL, False when it did not die
    of a SIGKILL, None when that is not known."""

    pid: int
    parent_pid: Optional[int]
    at_ns: int
    exit_code: Optional[int]
    signal: Optional[str]
    core_dumped: bool
    oom_killed: Optional[bool]


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _died_of_oom(journal: Journal) -> bool:
    """Whether the watchdog's ``died`` record for this journal says the OOM killer struck."""
    return any(record.get("kind") == "died" and (record.get("evidence") or {}).get("oom") for record in journal.stalls)


def child_ends(journals: Iterable[Journal]) -> dict[int, ChildEnd]:
    """Every child the given journals' processes reaped, by the child's pid (the latest reap of a
    pid, should the kernel have reused it: check `ChildEnd.at_ns` against the child's start, as
    `end_of` does). The children's own journals, when among ``journals``, add the watchdog's view
    of an OOM kill."""
    journals = list(journals)
    oom_by_pid = {journal.pid: journal for journal in journals if journal.pid is not None and _died_of_oom(journal)}
    ends: dict[int, ChildEnd] = {}
    for journal in journals:
        root = journal.root
        if root is None:
            continue
        baseline = _int(root.attrs.get(OOM_BASELINE_ATTR))
        for ts, name, attrs in root.events:
            if name != CHILD_EXIT:
                continue
            pid = _int(attrs.get("child.pid"))
            if pid is None or pid <= 0:
                continue
            code = _int(attrs.get("child.exit_code"))
            signal = attrs.get("child.signal")
            signal = signal if isinstance(signal, str) and signal else None
            oom: Optional[bool] = None if signal == "SIGKILL" else False
            if signal == "SIGKILL":
                kills = _int(attrs.get("child.oom_kills"))
                if kills is not None and baseline is not None and kills > baseline:
                    oom = True
                if kills is not None:
                    baseline = kills  # each kill is told once
                child = oom_by_pid.get(pid)
                if child is not None and child.root is not None and child.root.start_ns <= ts:
                    oom = True
            previous = ends.get(pid)
            if previous is None or previous.at_ns <= ts:
                ends[pid] = ChildEnd(pid, journal.pid, ts, code, signal, attrs.get("child.core_dumped") is True, oom)
    return ends


def end_of(journal: Journal, ends: dict[int, ChildEnd]) -> Optional[ChildEnd]:
    """The end of the process of ``journal`` its parent journaled, if any (a reap of its pid after
    it started: not an earlier process with the same pid)."""
    if journal.pid is None:
        return None
    end = ends.get(journal.pid)
    if end is None:
        return None
    start = journal.root.start_ns if journal.root is not None else (journal.spans[0].start_ns if journal.spans else 0)
    return end if end.at_ns >= start else None


def describe_end(end: ChildEnd) -> str:
    """``killed by SIGKILL``, ``killed by the OOM killer (SIGKILL)``, ``killed by SIGSEGV (core
    dumped)``, ``exited with code 3``."""
    if end.signal is not None:
        text = "killed by the OOM killer (%s)" % end.signal if end.oom_killed else "killed by %s" % end.signal
        return text + " (core dumped)" if end.core_dumped else text
    if end.exit_code is not None:
        return "exited with code %d" % end.exit_code
    return "ended"
