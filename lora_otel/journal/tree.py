"""The span-tree model every view of a journal shares: `View` (a journal as seen at a moment by a
process in a given state: its first sentence, its tree lines, its JSON), the deepest open span, the
tree order, the time and text formats. `lora-otel inspect` and `watch` render it; the job model
(`lora_otel.analysis.job`) and the stall rules use its pieces.

The lead sentence of a stall (`View.verdict`) comes from the analysis layer; this module knows it
only by the `Lead` protocol, so the journal layer imports nothing above it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from lora_otel.journal.reader import Journal, ProcessState, Span, exec_phrase, format_duration, where_text


class Lead(Protocol):
    """What a view needs of a stall's verdict (`lora_otel.analysis.verdict.Verdict`)."""

    def line(self) -> str: ...

    def advice_line(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...

    def stacks_lines(self, journal: Journal) -> list[str]: ...


STEP_STALE_S = 60
"""Steps count as advancing while the last one is at most this many seconds old (at the end of the
journal, for a process that is gone): ``still in training`` / ``died in training``, not ``stuck``."""

STUCK_AFTER_S = 10
"""Without a stall limit to go by, an open stage counts as stuck only after this long (a job 265 ms
into training is not stuck)."""

SAMPLE_STALE_BEATS = 3
"""A main-thread sample older than this many beats is shown with its age (``sampled 40 s ago``): the
beat that would have renewed it has not run (a process holding the GIL, stopped, or gone)."""

KEY_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "import": ("lora_otel.package.version",),
    "cuda init": (
        "lora_otel.cuda.available",
        "lora_otel.cuda.absent_reason",
        "lora_otel.cuda.device_count",
        "lora_otel.cuda.device_names",
        "lora_otel.cuda.version",
        "lora_otel.nvidia.driver_version",
    ),
    "cuda probe": ("lora_otel.cuda.available", "lora_otel.cuda.absent_reason"),
    "training": ("lora_otel.training.steps",),
}
"""Attributes shown on a span's tree line, by span kind (``import`` stands for every ``import X``)."""


MAX_NOTES = 5
"""A journal's problems listed one by one; beyond that, counted with the first line numbers."""


def problem_notes(problems: list[str]) -> list[str]:
    """``note:`` lines: the first `MAX_NOTES` problems, then a count with the first line numbers."""
    import re

    notes = [f"note: {_display(problem)}" for problem in problems[:MAX_NOTES]]
    if len(problems) > MAX_NOTES:
        numbers = [m.group(1) for problem in problems if (m := re.match(r"line (\d+):", problem))]
        notes.append(
            f"note: {len(problems)} lines could not be read in all"
            + (f" (lines {', '.join(numbers[:10])}{', ...' if len(numbers) > 10 else ''})" if numbers else "")
        )
    return notes


@dataclass
class View:
    """A journal as seen at ``now_ns`` by a process whose state is ``state``."""

    journal: Journal
    state: ProcessState
    now_ns: int
    verdict: Optional[Lead] = None
    """The stall and its diagnosis to lead with (`lora_otel.analysis.verdict`)."""
    stalled: Optional[bool] = None
    """Whether a stall limit says it is stuck; None: not known (then "stuck" past `STUCK_AFTER_S`)."""
    alive_until_ns: Optional[int] = None
    """A process gone without an exit record was seen alive (frozen) until then by a follower."""
    ended: Optional[tuple[int, str]] = None
    """A process gone without an exit record: when its parent reaped it and how it ended, as the
    parent's ``child exit`` event says (``killed by SIGKILL``; `lora_otel.analysis.ends`)."""

    @property
    def reference_ns(self) -> int:
        """The time open spans are open *until*: now while running, else the last evidence of life
        (the last record, or a later stall record or follower that saw it still there)."""
        if self.state == "running":
            return self.now_ns
        if self.ended is not None and self.journal.exit is None and self.journal.exec is None:
            return self.ended[0]
        seen = [ts for ts in (self.journal.last_life_ns, self.alive_until_ns) if ts]
        if self.journal.exit is None and self.journal.exec is None:
            seen += [
                s["ts"]
                for s in self.journal.stalls
                if s.get("kind") in ("alive", "frozen", "between") and isinstance(s.get("ts"), int)
            ]
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
        if deepest is journal.root and self.ended is None:
            if self.state == "running":
                return f"{self._between()} ({self._process_clause()})"
            return f"ended with spans open: {_display(deepest.name)} (process {self.state})"
        open_ns = self.open_for_ns(deepest) or 0
        open_for = format_duration(open_ns)
        if self.ended is not None and self.state != "running":
            where = "" if deepest is journal.root else f" in {_display(deepest.name)}"
            return f"{_display(self.ended[1])}{where} after {open_for} (its parent reaped it)"
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
        if exit_["how"] == "unknown":  # (Python <= 3.11: a SystemExit the program raised itself)
            return f"ended in {self._lifetime()}, {_display(str(exit_['message'] or 'exit code unknown'))}"
        if exit_["how"] == "normal" and code in (0, None):
            return f"finished normally in {self._lifetime()} ({code_text})"
        message = self._failure_message(exit_)
        return f"failed: {_display(message)} ({code_text})" if message else f"failed with {code_text}"

    def _failure_message(self, exit_: dict[str, Any]) -> Optional[str]:
        """The exit message, unless it only repeats the code; else the last failed stage's."""
        message = exit_["message"]
        if message and message != f"exit code {exit_['code']}":
            return str(message)
        failed = [
            span
            for span in self.journal.spans
            if span.status == "error" and span.message and span is not self.journal.root
        ]
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
            silent_ns = self.now_ns - (journal.last_life_ns or journal.last_beat_ns)
            if silent_ns > 5 * 1_000_000_000:  # a beat (a record or a touch) every second; frozen: none
                parts.append(f"no beat for {format_duration(silent_ns)}")
        if journal.steps:
            parts.append(f"{journal.steps} steps")
            if journal.last_step_ns is not None:
                age = format_duration(self.reference_ns - journal.last_step_ns)
                parts.append(
                    f"last step {age} ago" if self.state == "running" else f"last step {age} before the journal ends"
                )
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
            advice = self.verdict.advice_line()
            if advice:
                lines.append(_display(advice))
        main = self.main_thread_line()
        if main:
            lines.append(main)
        lines.append(f"journal: {_display(journal.path)}" + self._identity())
        for depth, span in walk_tree(journal):
            lines.append("  " * depth + self._span_line(span))
        if journal.beats:
            lines.append(f"beats: {journal.beats}, steps: {journal.steps}")
        if self.verdict is not None:
            lines.extend(_display(line) for line in self.verdict.stacks_lines(journal))
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
            age = self.main_sample_age_ns()
            if age is not None and age >= SAMPLE_STALE_BEATS * self._beat_s() * 1e9:
                return f"main thread at {where} (sampled {format_duration(age)} ago)"
            return f"main thread at {where}"
        return f"main thread was at {where} (its last beat)"

    def main_sample_age_ns(self) -> Optional[int]:
        """How old the beat's sample of the main thread is, as of the view's time: since the beat
        record that holds it, or since a later beat that found it unchanged and only touched the
        journal (docs/journal.md); None without a sample."""
        journal = self.journal
        sampled = journal.main_frames_ts
        if sampled is None:
            return None
        if journal.touched_ns and journal.touched_ns > sampled:
            sampled = min(journal.touched_ns, sampled + int(journal.touch_window_s * 1e9))
        return max(self.now_ns - sampled, 0)

    def _beat_s(self) -> float:
        beat = self.journal.config.get("beat_s") if isinstance(self.journal.config, dict) else None
        return float(beat) if isinstance(beat, (int, float)) and not isinstance(beat, bool) and beat > 0 else 1.0

    def _main_thread_json(self) -> Optional[dict[str, Any]]:
        journal = self.journal
        if not self.main_thread_line() or journal.main_frames_ts is None:
            return None
        return {
            "where": where_text(journal.main_frames),
            "frames": journal.main_frames,
            "time": iso_time(journal.main_frames_ts),
        }

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
            "events": [{"name": name, "time": iso_time(ts), "attributes": attrs} for ts, name, attrs in span.events],
            "open_for_s": round(open_for / 1e9, 3) if open_for is not None else None,
        }


def last_stage_end(journal: Journal) -> tuple[Optional[str], int]:
    """The stage that ended last and when (``(None, the process's start)`` when none has).

    As the job itself counts (`lora_otel._boot.narrate`): an import shorter than the journal's
    ``import_threshold_ms`` is not a stage here, so a library's lazy ``import encodings.idna``
    inside a download does not reset the quiet time."""
    root = journal.root
    threshold = journal.config.get("import_threshold_ms", 5.0) if isinstance(journal.config, dict) else 5.0
    try:  # a journal's value may be anything (a hostile or broken one: 10**400, NaN)
        threshold_ns = min(float(threshold), 1e12) * 1e6 if not isinstance(threshold, bool) else 5e6
    except (TypeError, ValueError, OverflowError):
        threshold_ns = 5e6
    if not threshold_ns >= 0:
        threshold_ns = 5e6
    best: tuple[Optional[str], int] = (None, root.start_ns if root is not None else 0)
    for span in journal.spans:
        if span is root or span.end_ns is None or span.end_ns < best[1]:
            continue
        if span.name.startswith("import ") and span.end_ns - span.start_ns < threshold_ns:
            continue
        best = (span.name, span.end_ns)
    return best


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
    return [(key[len("lora_otel.") :] if key.startswith("lora_otel.") else key, span.attrs[key]) for key in keys]


def iso_time(ns: int) -> str:
    """``2026-11-30T22:13:48.123Z``: ISO-8601 UTC with milliseconds (`seam.iso_time`)."""
    from lora_otel._boot.seam import iso_time as written

    return written(ns)


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _display(text: str) -> str:
    """Text safe for one terminal line: control characters and lone surrogates become escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
