"""``lora-otel inspect``: where a process is or was stuck, and its span tree, from its journal.

The first line of the text output is one sentence about the *deepest open span* (the most recently
started open span with no open child), or about how the process ended:

- ``stuck in import bitsandbytes for 312 s (process gone)``: open for last evidence − start when
  the process is gone, now − start while it runs (``no beat for N s`` when it froze);
- ``still in training for 20 s (process running, 1200 steps, last step 400 ms ago)`` while steps
  advance; ``died in training after 3600 s (process gone, …)`` when they did until the end;
- ``ended with spans open: process (process gone)`` when it died between stages;
- ``finished normally in 12.3 s (exit code 0)``, ``failed: <message> (exit code 1)``,
  ``failed with exit code 3``, ``ended with spans open: a, b (exit code 1)``;
- ``empty journal: no records``.

Then come the journal line, the span tree, and the journal's problems as ``note:`` lines. With
``LORA_OTEL_BASELINE`` naming a baseline file (`lora_otel.export.baseline`), the drift from it that
bears on the stuck stage comes right after the first line, then the rest of the drift in brief.
``--json`` prints the schema documented in docs/journal.md.

A directory is shown job by job (journals grouped by trace id, ranks in order, the process to look at
called out; `lora_otel.export.job`); ``--summary`` gives one line per job and exits by outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from lora_otel.export import verdict as verdict_mod

from lora_otel.export.reader import (
    Journal,
    JournalError,
    ProcessState,
    Span,
    exec_phrase,
    format_duration,
    process_state,
    read_journal,
    where_text,
)

STEP_STALE_S = 60
"""Steps count as advancing while the last one is at most this many seconds old (at the end of the
journal, for a process that is gone): ``still in training`` / ``died in training``, not ``stuck``."""

STUCK_AFTER_S = 10
"""Without a stall limit to go by, an open stage counts as stuck only after this long (a job 265 ms
into training is not stuck)."""

KEY_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "import": ("lora_otel.package.version",),
    "cuda init": ("lora_otel.cuda.available", "lora_otel.cuda.absent_reason", "lora_otel.cuda.device_count",
                  "lora_otel.cuda.device_names", "lora_otel.cuda.version", "lora_otel.nvidia.driver_version"),
    "cuda probe": ("lora_otel.cuda.available", "lora_otel.cuda.absent_reason"),
    "training": ("lora_otel.training.steps",),
}
"""Attributes shown on a span's tree line, by span kind (``import`` stands for every ``import X``)."""


def run_inspect(args: argparse.Namespace) -> int:
    """Print the journal ``args.journal`` as text, or as JSON when ``args.json``.

    A directory is shown job by job (`run_inspect_dir`); so is a single journal with ``--summary``.

    Returns:
        0, or 2 when the journal cannot be read (one line on stderr); ``--summary``: the outcome
        (`run_inspect_dir`).
    """
    resolved = resolve_path(args.journal)
    if resolved != args.journal:
        print(f"lora-otel inspect: reading {resolved}", file=sys.stderr)
        args.journal = resolved
    if os.path.isdir(args.journal) or getattr(args, "summary", False):
        return run_inspect_dir(args)
    try:
        journal = read_journal(args.journal)
    except JournalError as e:
        print(f"lora-otel inspect: {e}", file=sys.stderr)
        return 2
    if not_a_journal(journal):
        print(f"lora-otel inspect: {args.journal}: not a journal ({journal.problems[0]})", file=sys.stderr)
        return 2
    from lora_otel.export import baseline
    from lora_otel.export.stall import StallConfigError, detect, frozen_after_from_env, parse_limits

    stall_after = getattr(args, "stall_after", None)
    given = "--stall-after" if stall_after is not None else "LORA_OTEL_STALL_AFTER"
    try:
        parse_limits(stall_after if stall_after is not None else os.environ.get(given))
        frozen_after_from_env()
    except StallConfigError as e:
        print(f"lora-otel inspect: {given}: {e}", file=sys.stderr)
        return 2
    # One set of limits: the journal's recorded ones (`stall.journal_limits`) unless --stall-after.
    from lora_otel.export import verdict as verdict_mod
    from lora_otel.export.stall import journal_limits

    limits, frozen_after = journal_limits(journal, parse_limits(stall_after) if stall_after is not None else None)
    now_ns = time.time_ns()
    state = process_state(journal)
    stall = detect(journal, now_ns, state == "running", limits, frozen_after)
    verdict = verdict_mod.current(journal, stall, now_ns, same_trace(journal), frozen_after)
    drift = baseline.inspect_report(journal, now_ns)  # None unless LORA_OTEL_BASELINE is set
    if drift is not None and drift["error"]:
        print(f"lora-otel inspect: {drift['error']}; shown without it", file=sys.stderr)
    stalled = stall is not None or verdict is not None if state == "running" else (verdict is not None or None)
    view = View(journal, state, now_ns, verdict=verdict, stalled=stalled)
    if args.json:
        doc = view.to_json()
        if drift is not None:
            doc["baseline"] = baseline.report_json(drift)
        text = json.dumps(doc, indent=2) + "\n"  # ensure_ascii keeps lone surrogates as \udcXX
    else:
        text = "\n".join(view.text_lines()) + "\n"
        if drift is not None:  # the drift that bears on the stuck stage, right after the first line
            first, _, rest = text.partition("\n")
            text = "\n".join([first, *(_display(line) for line in baseline.report_lines(drift)), rest])
    _write(text)
    return 0


def run_inspect_dir(args: argparse.Namespace) -> int:
    """``lora-otel inspect DIR``: every journal in the directory, grouped into jobs (by trace id).

    Text: per job a heading, its processes in rank order, the process to look at called out, and
    its tree (every tree with ``--all``). ``--summary``: one line per job. ``--json``: the directory
    document of docs/journal.md (spans only with ``--all``).

    Returns:
        2 (one line on stderr) when the directory holds no journal, a journal cannot be read, or
        ``--stall-after`` is bad. Else 0; with ``--summary``, the outcome: 0 every job finished
        normally or runs, 1 some job failed, 3 some job was killed or is stalled (wins over 1).
    """
    from lora_otel.export import baseline
    from lora_otel.export import job as jobs_mod
    from lora_otel.export.stall import StallConfigError, frozen_after_from_env, parse_limits

    def usage(message: object) -> int:
        print(f"lora-otel inspect: {message}", file=sys.stderr)
        return 2

    path = args.journal
    stall_after = getattr(args, "stall_after", None)
    given = "--stall-after" if stall_after is not None else "LORA_OTEL_STALL_AFTER"
    try:
        limits = parse_limits(stall_after if stall_after is not None else os.environ.get(given))
    except StallConfigError as e:
        return usage(f"{given}: {e}")
    try:
        frozen_after_from_env()
    except StallConfigError as e:
        return usage(e)
    # One set of limits: each journal's recorded ones (`stall.journal_limits`) unless --stall-after.
    limits_given = limits if stall_after is not None else None
    limits, frozen_after = limits_given, None
    now_ns = time.time_ns()
    if os.path.isdir(path):
        if not jobs_mod.journal_paths(path):
            return usage(f"{path}: no journals (*.otel.jsonl) in this directory")
        jobs, unreadable = jobs_mod.read_dir(path, now_ns, limits, frozen_after)
    else:
        try:
            journal = read_journal(path)
        except JournalError as e:
            return usage(e)
        reason = jobs_mod.unreadable_reason(journal)
        if reason is not None:
            jobs, unreadable = [], [jobs_mod.Unreadable(path, reason)]
        else:
            proc = jobs_mod.make_proc(journal, process_state(journal), now_ns, limits, frozen_after)
            jobs, unreadable = jobs_mod.group_jobs([proc]), []
    show_all = getattr(args, "all", False)
    summary = getattr(args, "summary", False)
    if not summary:
        jobs_mod.attach_verdicts(jobs, now_ns, frozen_after)
    drift = {} if summary else _drift_by_proc(jobs, now_ns)  # LORA_OTEL_BASELINE: the focus processes' drift
    if args.json:
        doc = jobs_mod.render_json(path, jobs, unreadable, with_spans=show_all)
        for job, job_doc in zip(jobs, doc["jobs"]):
            first = jobs_mod.focus(job)
            if first is not None and id(first) in drift:
                job_doc["baseline"] = baseline.report_json(drift[id(first)])
        text = jobs_mod.dumps(doc)
    elif summary:
        text = jobs_mod.render_summary(jobs, unreadable)
    else:
        text = jobs_mod.render_text(jobs, unreadable, show_all=show_all,
                                    notes={key: baseline.report_lines(report) for key, report in drift.items()})
    _write(text)
    return jobs_mod.exit_status(jobs) if summary else 0


def _drift_by_proc(jobs: list, now_ns: int) -> dict[int, dict[str, Any]]:
    """With ``LORA_OTEL_BASELINE`` set: each job's focus process's drift report, by ``id`` of its
    `Proc` (a baseline that cannot be used: one line on stderr, and no reports)."""
    from lora_otel.export import baseline
    from lora_otel.export import job as jobs_mod

    reports: dict[int, dict[str, Any]] = {}
    for job in jobs:
        first = jobs_mod.focus(job)
        if first is None:
            continue
        report = baseline.inspect_report(first.journal, now_ns)
        if report is None:
            return {}
        if report["error"]:
            print(f"lora-otel inspect: {report['error']}; shown without it", file=sys.stderr)
            return {}
        reports[id(first)] = report
    return reports


def resolve_path(path: str) -> str:
    """``runs/demo.log`` (a ``--log`` file, not a journal) → the journal of its newest run:
    ``runs/demo.log.otel.jsonl`` or a re-run's ``runs/demo.log.<UTC>-<pid>-<hex>.otel.jsonl``,
    whichever started last. Anything else is returned as it is."""
    from lora_otel._boot.paths import JOURNAL_SUFFIX

    if path.endswith(JOURNAL_SUFFIX) or os.path.isdir(path):
        return path
    runs = [p for p in [path + JOURNAL_SUFFIX] if os.path.isfile(p)]
    import glob
    import re

    rerun = re.compile(re.escape(os.path.basename(path)) + r"\.\d{8}T\d{6}Z-\d+(?:-[0-9a-f]+)?" + re.escape(JOURNAL_SUFFIX))
    runs += [p for p in glob.glob(glob.escape(path) + ".*" + JOURNAL_SUFFIX)
             if rerun.fullmatch(os.path.basename(p)) and os.path.isfile(p)]
    if not runs:
        return path
    return max(runs, key=lambda p: (_first_ts(p), p))


def _first_ts(path: str) -> int:
    try:
        with open(path, "rb") as f:
            ts = json.loads(f.readline() or b"{}").get("ts")
        return ts if isinstance(ts, int) else 0
    except (OSError, ValueError, AttributeError):
        return 0


def not_a_journal(journal: Journal) -> bool:
    """Nothing in the file was a journal record (a plain log, a binary file)."""
    return journal.last_evidence_ns is None and not journal.stalls and bool(journal.problems)


def same_trace(journal: Journal) -> list[Journal]:
    """The journals next to ``journal`` of the same trace (its job's other ranks and processes)."""
    from lora_otel.export.job import sibling_journals

    if journal.trace_id is None:
        return []
    return [other for other in sibling_journals(journal) if other.trace_id == journal.trace_id]


MAX_NOTES = 5
"""A journal's problems listed one by one; beyond that, counted with the first line numbers."""


def problem_notes(problems: list[str]) -> list[str]:
    """``note:`` lines: the first `MAX_NOTES` problems, then a count with the first line numbers."""
    import re

    notes = [f"note: {_display(problem)}" for problem in problems[:MAX_NOTES]]
    if len(problems) > MAX_NOTES:
        numbers = [m.group(1) for problem in problems if (m := re.match(r"line (\d+):", problem))]
        notes.append(f"note: {len(problems)} lines could not be read in all"
                     + (f" (lines {', '.join(numbers[:10])}{', ...' if len(numbers) > 10 else ''})" if numbers else ""))
    return notes


def render_text(journal: Journal, now_ns: Optional[int] = None) -> str:
    """The text report (first line, journal line, span tree, notes), ending with a newline."""
    return "\n".join(_view(journal, now_ns).text_lines()) + "\n"


def render_json(journal: Journal, now_ns: Optional[int] = None) -> dict[str, Any]:
    """The ``--json`` document (docs/journal.md) as a dict."""
    return _view(journal, now_ns).to_json()


def _view(journal: Journal, now_ns: Optional[int]) -> View:
    return View(journal, process_state(journal), time.time_ns() if now_ns is None else now_ns)


@dataclass
class View:
    """A journal as seen at ``now_ns`` by a process whose state is ``state``."""

    journal: Journal
    state: ProcessState
    now_ns: int
    verdict: Optional[verdict_mod.Verdict] = None
    """The stall and its diagnosis to lead with (`lora_otel.export.verdict`)."""
    stalled: Optional[bool] = None
    """Whether a stall limit says it is stuck; None: not known (then "stuck" past `STUCK_AFTER_S`)."""
    alive_until_ns: Optional[int] = None
    """A process gone without an exit record was seen alive (frozen) until then by a follower."""

    @property
    def reference_ns(self) -> int:
        """The time open spans are open *until*: now while running, else the last evidence of life
        (the last record, or a later stall record or follower that saw it still there)."""
        if self.state == "running":
            return self.now_ns
        seen = [ts for ts in (self.journal.last_evidence_ns, self.alive_until_ns) if ts]
        if self.journal.exit is None and self.journal.exec is None:
            seen += [s["ts"] for s in self.journal.stalls
                     if s.get("kind") in ("alive", "frozen", "between") and isinstance(s.get("ts"), int)]
        return max(seen, default=0)

    def open_for_ns(self, span: Span) -> Optional[int]:
        return max(self.reference_ns - span.start_ns, 0) if span.is_open else None

    # --- the first line --------------------------------------------------------------------

    def stuck(self) -> str:
        """One sentence: where the process is or was stuck, or how it ended."""
        journal = self.journal
        if not journal.spans:
            return "empty journal: no spans" if journal.last_evidence_ns is not None else "empty journal: no records"
        if journal.exit is not None:
            return self._ended(journal.exit, [span for span in journal.spans if span.is_open])
        if self.state == "exec'd":
            return f"{exec_phrase(journal)} after {self._lifetime()} (the traced program was replaced by it)"
        deepest = deepest_open_span(journal)
        if deepest is None:
            return f"ended without an exit record after {self._lifetime()} (process {self.state})"
        if deepest is journal.root:
            if self.state == "running":
                return f"{self._between()} ({self._process_clause()})"
            return f"ended with spans open: {_display(deepest.name)} (process {self.state})"
        open_ns = self.open_for_ns(deepest) or 0
        open_for = format_duration(open_ns)
        if self._is_stuck(open_ns):
            return f"stuck in {_display(deepest.name)} for {open_for} ({self._process_clause()})"
        if self.state == "running":
            return f"still in {_display(deepest.name)} for {open_for} ({self._process_clause()})"
        return f"died in {_display(deepest.name)} after {open_for} ({self._process_clause()})"

    def _is_stuck(self, open_ns: int) -> bool:
        """Stuck: a stall limit says so; without one, no step for `STEP_STALE_S` and open past
        `STUCK_AFTER_S` (a process gone in a stage it never finished counts as stuck in it)."""
        if self.verdict is not None:
            return True
        if self.stalled is not None:
            return self.stalled
        if self._steps_advancing():
            return False
        return self.state != "running" or open_ns >= STUCK_AFTER_S * 1_000_000_000

    def _between(self) -> str:
        """``no stage open for 25 s since import torch ended``: a running process between stages."""
        from lora_otel.export.stall import last_stage_end  # the same rule as the stall and the job's lines

        name, since = last_stage_end(self.journal)
        text = f"no stage open for {format_duration(self.reference_ns - since)}"
        return text + (f" since {_display(name)} ended" if name is not None else " since it started")

    def _ended(self, exit_: dict[str, Any], open_spans: list[Span]) -> str:
        code = exit_["code"]
        code_text = f"exit code {code}" if code is not None else "no exit code"
        if open_spans:
            names = ", ".join(_display(span.name) for span in open_spans)
            if exit_["how"] == "signal" and exit_["message"]:  # written by `lora-otel run`
                deepest = deepest_open_span(self.journal)
                where = ""
                if deepest is not None and deepest is not self.journal.root:
                    stuck = format_duration(max(exit_["ts"] - deepest.start_ns, 0))
                    where = f" while in {_display(deepest.name)} for {stuck}"
                return f"{_display(exit_['message'])}{where}, spans open: {names} (exit status {code})"
            return f"ended with spans open: {names} ({code_text})"
        if exit_["how"] == "normal" and code in (0, None):
            return f"finished normally in {self._lifetime()} ({code_text})"
        message = self._failure_message(exit_)
        return f"failed: {_display(message)} ({code_text})" if message else f"failed with {code_text}"

    def _failure_message(self, exit_: dict[str, Any]) -> Optional[str]:
        """The exit message, unless it only repeats the code; else the last failed stage's."""
        message = exit_["message"]
        if message and message != f"exit code {exit_['code']}":
            return str(message)
        failed = [span for span in self.journal.spans
                  if span.status == "error" and span.message and span is not self.journal.root]
        return f"{failed[-1].name}: {failed[-1].message}" if failed else None

    def _lifetime(self) -> str:
        root = self.journal.root or self.journal.spans[0]
        exit_ = self.journal.exit or self.journal.exec
        end = exit_["ts"] if exit_ is not None else (root.end_ns or self.reference_ns)
        return format_duration(end - root.start_ns)

    def _process_clause(self) -> str:
        """``process running, 1200 steps, last step 400 ms ago``."""
        parts = [f"process {self.state}"]
        journal = self.journal
        if self.state == "running" and journal.last_beat_ns is not None:
            silent_ns = self.now_ns - journal.last_beat_ns
            if silent_ns > 5 * 1_000_000_000:  # beats come every second; a frozen process stops them
                parts.append(f"no beat for {format_duration(silent_ns)}")
        if journal.steps:
            parts.append(f"{journal.steps} steps")
            if journal.last_step_ns is not None:
                age = format_duration(self.reference_ns - journal.last_step_ns)
                parts.append(f"last step {age} ago" if self.state == "running"
                             else f"last step {age} before the journal ends")
        return ", ".join(parts)

    def _steps_advancing(self) -> bool:
        """Whether optimizer steps were still coming, now or when the journal ends."""
        last_step = self.journal.last_step_ns
        return last_step is not None and self.reference_ns - last_step <= STEP_STALE_S * 1_000_000_000

    # --- the tree --------------------------------------------------------------------------

    def text_lines(self) -> list[str]:
        journal = self.journal
        lines = [self.stuck()]
        if self.verdict is not None:
            lines.append(_display(self.verdict.line()))
        main = self.main_thread_line()
        if main:
            lines.append(main)
        lines.append(f"journal: {_display(journal.path)}" + self._identity())
        for depth, span in walk_tree(journal):
            lines.append("  " * depth + self._span_line(span))
        if journal.beats:
            lines.append(f"beats: {journal.beats}, steps: {journal.steps}")
        if self.verdict is not None:
            from lora_otel.export import verdict as verdict_mod

            lines.extend(_display(line) for line in verdict_mod.stacks_lines(journal, self.verdict))
        lines.extend(problem_notes(journal.problems))
        return lines

    def main_thread_line(self) -> str:
        """``main thread at run.py:3 in <module> → time.sleep`` (its last beat) while the process
        runs; ``main thread was at …`` for one gone without an exit record; "" otherwise."""
        journal = self.journal
        if journal.exit is not None or self.state not in ("running", "gone") or not journal.main_frames:
            return ""
        where = _display(where_text(journal.main_frames))
        if self.state == "running":
            return f"main thread at {where}"
        return f"main thread was at {where} (its last beat)"

    def _main_thread_json(self) -> Optional[dict[str, Any]]:
        journal = self.journal
        if not self.main_thread_line() or journal.main_frames_ts is None:
            return None
        return {"where": where_text(journal.main_frames), "frames": journal.main_frames,
                "time": iso_time(journal.main_frames_ts)}

    def _identity(self) -> str:
        journal = self.journal
        parts = [f"pid {journal.pid}"] if journal.pid is not None else []
        if journal.root is not None:
            parts.append(f"trace {journal.root.trace_id}, started {iso_time(journal.root.start_ns)}")
        return f" ({', '.join(parts)})" if parts else ""

    def _span_line(self, span: Span) -> str:
        open_for = self.open_for_ns(span)
        if open_for is not None:
            mark = f"OPEN for {format_duration(open_for)}"
        else:
            mark = format_duration((span.end_ns or span.start_ns) - span.start_ns)
            if span.status == "error":
                mark += "  ERROR" + (f": {span.message}" if span.message else "")
            else:
                mark += "  ok"
        extras = "  ".join(f"{key}={_scalar(value)}" for key, value in key_attributes(span))
        return "  ".join(part for part in (_display(span.name), _display(mark), _display(extras)) if part)

    # --- JSON ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        journal = self.journal
        return {
            "journal": journal.path,
            "trace_id": journal.trace_id,
            "pid": journal.pid,
            "process_state": self.state,
            "stuck": self.stuck(),
            "main_thread": self._main_thread_json(),
            "exit": journal.exit and {**journal.exit, "ts": iso_time(journal.exit["ts"])},
            "steps": journal.steps,
            "stall": self.verdict.to_json() if self.verdict is not None else None,
            "problems": list(journal.problems),
            "stalls": list(journal.stalls),  # the watchdog's stall records, in order (docs/journal.md)
            "spans": [self._span_json(span) for span in journal.spans],
        }

    def _span_json(self, span: Span) -> dict[str, Any]:
        open_for = self.open_for_ns(span)
        return {
            "name": span.name,
            "span_id": span.span_id,
            "parent_id": span.parent_id,
            "start": iso_time(span.start_ns),
            "end": iso_time(span.end_ns) if span.end_ns is not None else None,
            "status": "open" if span.is_open else span.status,
            "message": span.message,
            "attributes": span.attrs,
            "events": [{"name": name, "time": iso_time(ts), "attributes": attrs}
                       for ts, name, attrs in span.events],
            "open_for_s": round(open_for / 1e9, 3) if open_for is not None else None,
        }


def deepest_open_span(journal: Journal) -> Optional[Span]:
    """The most recently started open span that has no open child, or None if none is open."""
    open_spans = [span for span in journal.spans if span.is_open]
    open_parents = {span.parent_id for span in open_spans}
    leaves = [span for span in open_spans if span.span_id not in open_parents]
    return max(leaves, key=lambda span: span.start_ns, default=None)


def walk_tree(journal: Journal) -> list[tuple[int, Span]]:
    """``(depth, span)`` in tree order: children under their parent, siblings in start order.

    Spans whose parent is not in the journal are top-level; so are spans caught in a parent cycle
    (which a sane journal never has), so that every span appears exactly once.
    """
    ids = {span.span_id for span in journal.spans}
    children: dict[Optional[str], list[Span]] = {}
    for span in journal.spans:
        children.setdefault(span.parent_id if span.parent_id in ids else None, []).append(span)
    order: list[tuple[int, Span]] = []
    seen: set[str] = set()
    pending = [span for span in journal.spans if span.parent_id not in ids]
    pending += [span for span in journal.spans if span.parent_id in ids]  # only reached if in a cycle
    for top in pending:
        if top.span_id in seen:
            continue
        stack = [(0, top)]
        while stack:
            depth, span = stack.pop()
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            order.append((depth, span))
            stack.extend((depth + 1, child) for child in reversed(children.get(span.span_id, [])))
    return order


def key_attributes(span: Span) -> list[tuple[str, Any]]:
    """The few attributes worth a place on the span's tree line, ``lora_otel.`` left off."""
    kind = "import" if span.name.startswith("import ") else span.name
    keys = [key for key in KEY_ATTRIBUTES.get(kind, ()) if key in span.attrs]
    return [(key[len("lora_otel."):] if key.startswith("lora_otel.") else key, span.attrs[key]) for key in keys]


def iso_time(ns: int) -> str:
    """``2026-11-30T22:13:48.123Z``: ISO-8601 UTC with milliseconds."""
    seconds, rest = divmod(ns, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{rest // 1_000_000:03d}Z"


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _display(text: str) -> str:
    """Text safe for one terminal line: control characters and lone surrogates become escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _write(text: str) -> None:
    """Write to stdout whatever its encoding; unencodable characters become escapes."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
