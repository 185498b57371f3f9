"""How jobs look: the layouts ``lora-otel inspect DIR`` and ``watch DIR`` print (`render_text`,
`render_summary`, the ``--json`` document), built from the job model of `lora_otel.analysis.job`.

The model says what happened (outcomes, the callout, the phrases); this module only lays it out:
aligned process lines, the job's heading, the trees to show, and text safe for any terminal.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any, Optional

from lora_otel.analysis.job import Job, Proc, Unreadable, exit_status, focus, stopped_phrase
from lora_otel.journal.tree import _display, iso_time


def write(text: str) -> None:
    """Write to stdout whatever its encoding; unencodable characters become escapes."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))


def process_line(proc: Proc, label_width: int, pid_width: int, steps_width: int) -> str:
    """``rank 1  pid 4243  running  0 steps  stuck in import bitsandbytes for 312 s (process running)``."""
    journal = proc.journal
    pid = str(journal.pid) if journal.pid is not None else "?"
    how = stopped_phrase(proc) if proc.outcome == "stopped" else proc.view.stuck()
    line = (
        f"{proc.label:<{label_width}}  pid {pid:<{pid_width}}  {proc.state:<7}  "
        f"{journal.steps:>{steps_width}} steps  {_display(how)}"
    )
    if journal.problems:
        line += f"  [{len(journal.problems)} journal problem{'s' if len(journal.problems) != 1 else ''}]"
    return line


def process_lines(job: Job) -> list[str]:
    """One aligned line per process, in order; then the ranks of the world size with no journal here."""
    label_width = max(len(proc.label) for proc in job.procs)
    pid_width = max(len(str(proc.journal.pid)) for proc in job.procs)
    steps_width = max(len(str(proc.journal.steps)) for proc in job.procs)
    lines = [process_line(proc, label_width, pid_width, steps_width) for proc in job.procs]
    missing = job.missing_ranks()
    if missing and len(missing) < (job.world_size or 0):
        lines.append(
            f"no journal here for rank{'s' if len(missing) > 1 else ''} {_ranges(missing)} "
            f"of world size {job.world_size}"
        )
    return lines


def job_heading(job: Job) -> str:
    """``job 4bf92f35…  train  3 processes  stalled at import bitsandbytes for 312 s (rank 1)``."""
    count = len(job.procs)
    return (
        f"job {job.trace_id}  {_display(job.name)}  {count} process{'es' if count != 1 else ''}  {_display(job.phrase)}"
    )


def _indent(lines: Iterable[str], by: str = "    ") -> list[str]:
    return [by + line for line in lines]


def render_text(
    jobs: list[Job], unreadable: list[Unreadable], show_all: bool = False, notes: Optional[dict[int, list[str]]] = None
) -> str:
    """``lora-otel inspect DIR``: per job its heading, its processes, the callout and its process's
    tree. ``notes``: lines to print right after a process's callout (by ``id`` of the `Proc`; the
    baseline drift of the focus process)."""
    out: list[str] = []
    for job in jobs:
        if out:
            out.append("")
        out.append(job_heading(job))
        out.extend(_indent(process_lines(job), "  "))
        callout = job.callout
        if callout is not None and len(job.procs) > 1:  # a lone process's heading says it already
            out.append(_display(callout.text))
        first = focus(job)
        if first is not None and first.view.verdict is not None:
            out.append(_display(first.view.verdict.line()))
            if first.view.verdict.advice_line():
                out.append(_display(first.view.verdict.advice_line()))
        if notes and first is not None:
            out.extend(_display(line) for line in notes.get(id(first), []))
        shown = job.procs if show_all else [callout.proc] if callout is not None else []
        for proc in shown:
            lines = proc.view.text_lines()
            if show_all:
                out.append(f"  {proc.who}: {_display(lines[0])}")
            if proc.view.verdict is not None:  # said above, under the job's lines (with its advice)
                del lines[1 : 3 if proc.view.verdict.advice_line() else 2]
            out.extend(_indent(lines[1:]))
        hidden = len(job.procs) - len(shown)
        if hidden and len(job.procs) > 1:
            out.append(f"  ({others_trees(hidden, bool(shown))}: --all)")
    for bad in unreadable:
        if out:
            out.append("")
        out.append(f"not read: {_display(bad.path)}: {_display(bad.reason)}")
    return "\n".join(out) + "\n"


def others_trees(hidden: int, one_shown: bool) -> str:
    """``the other process's tree``, ``the other 7 processes' trees``, ``the processes' trees``."""
    if not one_shown:
        return "the processes' trees"
    return "the other process's tree" if hidden == 1 else f"the other {hidden} processes' trees"


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2, 5``."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in numbers[1:]:
        if n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def render_summary(jobs: list[Job], unreadable: list[Unreadable]) -> str:
    """``lora-otel inspect DIR --summary``: one line per job by start time, then one per unreadable file."""
    names = [_display(job.name) for job in jobs]
    width = min(max((len(name) for name in names), default=0), 24)
    lines = [f"{job.trace_id[:8]}  {name:<{width}}  {_display(job.phrase)}" for job, name in zip(jobs, names)]
    lines += [
        f"{'?' * 8}  {_display(os.path.basename(bad.path))}  not read: {_display(bad.reason)}" for bad in unreadable
    ]
    return "\n".join(lines) + "\n"


def _stall_json(proc: Proc) -> Optional[dict[str, Any]]:
    stall = proc.stall
    if stall is None:
        return None
    return {
        "kind": stall.kind,
        "span": stall.span.name,
        "span_id": stall.span.span_id,
        "open_for_s": round(stall.open_for_s, 3),
        "limit_s": stall.limit_s,
        "reason": stall.reason,
    }


def process_json(proc: Proc, with_spans: bool) -> dict[str, Any]:
    """inspect FILE's ``--json`` object (``spans`` only when asked), plus rank, role and outcome."""
    doc = proc.view.to_json()
    if not with_spans:
        del doc["spans"]
    doc.update(
        {
            "rank": proc.rank,
            "local_rank": proc.local_rank,
            "world_size": proc.world_size,
            "role": proc.role,
            "label": proc.label,
            "parent_pid": proc.parent.journal.pid if proc.parent is not None else None,
            "start": iso_time(proc.start_ns),
            "outcome": proc.outcome,
            "stall": _stall_json(proc),
        }
    )
    return doc


def render_json(
    directory: str, jobs: list[Job], unreadable: list[Unreadable], with_spans: bool = False
) -> dict[str, Any]:
    """The ``--json`` document for a directory (docs/journal.md)."""
    return {
        "directory": directory,
        "jobs": [
            {
                "trace_id": job.trace_id,
                "name": job.name,
                "start": iso_time(job.start_ns),
                "outcome": job.outcome,
                "summary": job.phrase,
                "status": job.status,
                "world_size": job.world_size,
                "missing_ranks": job.missing_ranks(),
                "callout": None
                if job.callout is None
                else {
                    "kind": job.callout.kind,
                    "journal": job.callout.proc.journal.path,
                    "pid": job.callout.proc.journal.pid,
                    "rank": job.callout.proc.effective_rank,
                    "text": job.callout.text,
                },
                "processes": [process_json(proc, with_spans) for proc in job.procs],
            }
            for job in jobs
        ],
        "unreadable": [{"journal": bad.path, "reason": bad.reason} for bad in unreadable],
        "exit_status": exit_status(jobs),
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"
