"""Following a journal live: export each span once, stalls as incomplete, the rest as "(continued)".

The rule that shapes this module (DESIGN.md principle 5): **no span ID reaches a backend twice.**

- A span that ends normally goes out once, when its end record appears.
- When :func:`~lora_otel.export.stall.detect` declares a stall, the open spans from the root to the
  stalled one go out once as *incomplete*: status ERROR "stalled: <stage> open for N s",
  ``lora_otel.incomplete=true``, ``lora_otel.stall.kind`` = ``alive``/``frozen``, ending now; the
  stalled span carries the evidence and the diagnosis as an event.
- If such a span later ends, the rest of its time goes out as a new child span
  ``<name> (continued)``, from the incomplete export's end to the real end.
- When the process is gone (:meth:`Follower.finalize`), every span never exported goes out once as
  incomplete, with how the process ended.

Not thread-safe: one follower per journal, polled from one thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Callable, Optional

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status, StatusCode

from lora_otel.export import otlp
from lora_otel.export.diagnose import diagnose
from lora_otel.export.evidence import gather
from lora_otel.export.reader import Journal, Span, process_state, read_journal
from lora_otel.export.stall import FROZEN_AFTER_S, Stall, detect, parse_limits


def _amend(rs: ReadableSpan, *, status: Status, attrs: dict[str, Any], events: list, end_ns: int) -> ReadableSpan:
    merged = dict(rs.attributes or {})
    merged.update(attrs)
    return ReadableSpan(name=rs.name, context=rs.context, parent=rs.parent, resource=rs.resource,
                        attributes=merged, events=list(rs.events) + events, kind=rs.kind, status=status,
                        start_time=rs.start_time, end_time=end_ns, instrumentation_scope=rs.instrumentation_scope)


class Follower:
    """Export one journal's spans as they happen, under the one-export-per-span-ID rule."""

    def __init__(self, path: str, exporter: SpanExporter, limits: Optional[dict[str, float]] = None,
                 frozen_after_s: float = FROZEN_AFTER_S,
                 evidence: Callable[[int, Optional[str]], dict[str, Any]] = gather) -> None:
        self.path = path
        self.exporter = exporter
        self.limits = limits or parse_limits(os.environ.get("LORA_OTEL_STALL_AFTER"))
        self.frozen_after_s = frozen_after_s
        self.evidence = evidence
        self.exported: set[str] = set()
        self.incomplete_end: dict[str, int] = {}  # span id -> the end its incomplete export used
        self.continued: set[str] = set()
        self.stalls: list[Stall] = []
        self.failed_exports = 0

    def poll(self, now_ns: Optional[int] = None) -> list[ReadableSpan]:
        """Read the journal, export what is new; returns what was sent (or tried)."""
        journal = read_journal(self.path)
        now = now_ns or time.time_ns()
        tr, dropped = self._translator(journal)
        out = self._ended(journal, tr, dropped)
        alive = process_state(journal) == "running"
        stalled_now = {s.span.span_id for s in self.stalls}
        stall = detect(journal, now, alive, self.limits, self.frozen_after_s)
        if stall is not None and stall.span.span_id not in stalled_now and stall.span.span_id not in self.exported:
            out += self._stall(journal, tr, stall, now)
        self._send(out)
        return out

    def finalize(self, how: str) -> list[ReadableSpan]:
        """The process is gone: export every span never exported, once, as incomplete. ``how``: e.g. "killed by SIGKILL"."""
        journal = read_journal(self.path)
        tr, dropped = self._translator(journal)
        out = self._ended(journal, tr, dropped)
        for span in journal.spans:
            if span.end_ns is None and span.span_id not in self.exported:
                end = max(journal.last_evidence_ns or span.start_ns, span.start_ns)
                rs = _amend(tr.readable(span), status=Status(StatusCode.ERROR, "process ended (%s) with %s open"
                                                             % (how, otlp.clean_text(span.name))),
                            attrs={otlp.INCOMPLETE_ATTRIBUTE: True, "lora_otel.process.end": how},
                            events=[], end_ns=end)
                out.append(rs)
                self.exported.add(span.span_id)
        self._send(out)
        return out

    # --- internals -------------------------------------------------------------------------------

    def _translator(self, journal: Journal):
        dropped = {s.span_id: s for s in journal.spans if otlp._is_short_import(s, journal)}
        return otlp._Translator(journal, dropped), dropped

    def _ended(self, journal: Journal, tr, dropped: dict) -> list[ReadableSpan]:
        out = []
        for span in journal.spans:
            if span.end_ns is None or span.span_id in dropped:
                continue
            sid = span.span_id
            if sid in self.incomplete_end:
                if sid not in self.continued:
                    out.append(self._continued(tr, span, self.incomplete_end[sid]))
                    self.continued.add(sid)
            elif sid not in self.exported:
                out.append(tr.readable(span))
                self.exported.add(sid)
        return out

    def _continued(self, tr, span: Span, since_ns: int) -> ReadableSpan:
        rest = replace(span, name=span.name + " (continued)", span_id=os.urandom(8).hex(), parent_id=span.span_id,
                       start_ns=min(since_ns, span.end_ns or since_ns), events=[e for e in span.events if e[0] >= since_ns],
                       attrs={"lora_otel.continues": span.span_id})
        tr.known.add(span.span_id)
        return tr.readable(rest)

    def _stall(self, journal: Journal, tr, stall: Stall, now: int) -> list[ReadableSpan]:
        self.stalls.append(stall)
        chain = []
        span: Optional[Span] = stall.span
        while span is not None:
            chain.append(span)
            span = journal.span(span.parent_id) if span.parent_id else None
        stacks = journal.root.attrs.get("lora_otel.stacks.path") if journal.root else None
        evidence = self.evidence(journal.pid, stacks) if journal.pid else {}
        sentence = diagnose(stall, evidence)
        out = []
        for span in reversed(chain):  # root to leaf
            if span.span_id in self.exported or span.end_ns is not None:
                continue
            events = []
            if span is stall.span:
                ev = {k: (v if isinstance(v, (str, int, float, bool)) else str(v)) for k, v in evidence.items()}
                ev["lora_otel.diagnosis"] = sentence
                events.append(Event("stall detected", otlp.otel_attributes(ev), now))
            rs = _amend(tr.readable(span), status=Status(StatusCode.ERROR, stall.status_message),
                        attrs={otlp.INCOMPLETE_ATTRIBUTE: True, "lora_otel.stall.kind": stall.kind,
                               "lora_otel.stall.stage": stall.span.name, "lora_otel.diagnosis": sentence},
                        events=events, end_ns=now)
            out.append(rs)
            self.exported.add(span.span_id)
            self.incomplete_end[span.span_id] = now
        return out

    def _send(self, spans: list[ReadableSpan]) -> None:
        if spans and self.exporter.export(spans) is not SpanExportResult.SUCCESS:
            self.failed_exports += 1
