"""Following a journal live: export each span once, stalls as incomplete, the rest as "(continued)".

The rule that shapes this module (DESIGN.md principle 5): **no span ID reaches a backend twice.**

- A span that ends normally goes out once, when its end record appears.
- When :func:`~lora_otel.analysis.stall.detect` declares a stall, the open spans from the root to the
  stalled one go out once as *incomplete*: status ERROR "stalled: <stage> open for N s",
  ``lora_otel.incomplete=true``, ``lora_otel.stall.kind`` = ``alive``/``frozen``, ending now; the
  stalled span carries the evidence and the diagnosis as an event, and a WARN log record
  "stall detected" says the same in one sentence. A process waiting inside a torch.distributed
  collective is diagnosed with its peers (``Follower(peers=...)``, the sidecar's other journals):
  the sentence names the ranks that never arrived, also as ``lora_otel.collective.*`` attributes.
  With ``LORA_OTEL_BASELINE`` naming a baseline file, the drift from it that bears on the stalled
  stage leads the sentence and is in ``lora_otel.baseline.drift`` (`diagnose.with_baseline`).
- If such a span later ends, the rest of its time goes out as a new child span
  ``<name> (continued)``, from the incomplete export's end to the real end.
- When the process is gone (:meth:`Follower.finalize`), every span never exported goes out once as
  incomplete, with how the process ended.
- The human lines the process printed go out as OTLP log records, tied to the trace.

Nothing here waits on the network: what is to be sent goes into an `Outbox`, a bounded queue that
its own thread drains, retrying with backoff while the backend is unreachable. A batch leaves the
queue only when the backend accepted it, so nothing is lost across an outage the queue can hold;
when the queue overflows the oldest items are dropped and counted.

A `Follower` is polled from one thread.

One module past 600 lines on purpose: the `Outbox`, the `LogSink` and the `Follower` are the one
rule above (each span ID once, nothing lost that the queue can hold) and are read together.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Status, StatusCode

from lora_otel._version import __version__
from lora_otel.analysis.diagnose import world_peers
from lora_otel.analysis.evidence import PREFIX, StackAsker, StackRequest, gather
from lora_otel.analysis.stall import Stall, detect
from lora_otel.export import otlp
from lora_otel.export.watchdog import cause_pid, configured_baseline, diagnose_stall
from lora_otel.export.watchdog import peer_stacks as default_peer_stacks
from lora_otel.journal.reader import Journal, JournalTail, Span, format_duration, process_state


def _amend(
    rs: ReadableSpan, *, status: Status, attrs: dict[str, Any], events: list[Event], end_ns: int
) -> ReadableSpan:
    merged = dict(rs.attributes or {})
    merged.update(otlp.otel_attributes(attrs))  # stage names and exit messages are journal text: valid for OTLP
    if status.description:
        status = Status(status.status_code, otlp.clean_text(status.description))
    return ReadableSpan(
        name=rs.name,
        context=rs.context,
        parent=rs.parent,
        resource=rs.resource,
        attributes=merged,
        events=list(rs.events) + events,
        kind=rs.kind,
        status=status,
        start_time=rs.start_time,
        end_time=end_ns,
        instrumentation_scope=rs.instrumentation_scope,
        links=rs.links,
    )


MAX_EVENTS = 128  # per span, as the OpenTelemetry SDK's default span limits
DEFAULT_QUEUE_SIZE = 20000
OUTBOX_ITEMS = 2048
BATCH = 512
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
_STATUS_HINTS = {
    401: "check the credentials in OTEL_EXPORTER_OTLP_HEADERS",
    403: "check the credentials in OTEL_EXPORTER_OTLP_HEADERS",
    404: "no OTLP receiver at that path; check OTEL_EXPORTER_OTLP_ENDPOINT",
}
PEER_STACKS_ATTACHED = 4  # ranks whose stacks go into the stall event, 4000 characters each


def _queue_size() -> int:
    try:
        return max(1, int(os.environ.get("LORA_OTEL_QUEUE_SIZE", DEFAULT_QUEUE_SIZE)))
    except ValueError:
        return DEFAULT_QUEUE_SIZE


class Outbox:
    """A bounded queue in front of an exporter, drained by its own thread, retried with backoff.

    ``put`` never blocks. Items leave the queue only once ``exporter.export`` reported success
    (an SDK exporter returns a result whose ``name`` is ``SUCCESS``); a failed batch stays at the
    front and is tried again after 0.5, 1, 2, 4, 8, 8, ... s. Beyond ``max_items`` the oldest
    items are dropped and counted in ``dropped``.

    A batch the backend refuses as such (HTTP 400 or 413, per the OTLP specification not to be
    retried) is split in halves until the refused items are alone; each of those is dropped and
    counted in ``rejected`` (the journal keeps it), and the rest goes through.
    """

    def __init__(
        self,
        exporter: Any,
        what: str = "spans",
        max_items: Optional[int] = None,
        backoff_s: Sequence[float] = BACKOFF_S,
    ) -> None:
        self.exporter = exporter
        self.what = what
        self.max_items = max_items or _queue_size()
        self.backoff_s = tuple(backoff_s)
        self.sent = 0
        self.dropped = 0
        self.rejected = 0
        self.failures = 0
        self._limit = BATCH
        self.last_error: Optional[str] = None
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="lora-otel-outbox-" + what, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Items not yet accepted by the backend (queued or in flight)."""
        with self._cond:
            return len(self._items)

    def put(self, items: Sequence[Any]) -> None:
        if not items:
            return
        with self._cond:
            self._items.extend(items)
            while len(self._items) > self.max_items:
                # Drop the oldest item that is not in flight (an in-flight batch is at the front).
                del self._items[self._in_flight if self._in_flight < len(self._items) else 0]
                self.dropped += 1
            self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Try to send everything left for up to ``timeout`` s; True when nothing is left unsent."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._items and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(deadline - time.monotonic(), 0)))
            self.unsent = len(self._items)
            self._stop = True
            self._cond.notify_all()
        self._thread.join(max(deadline - time.monotonic(), 0) + 0.2)
        try:
            self.exporter.shutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass
        return self.unsent == 0

    on_change: Optional[Callable[[str], None]] = None
    """Called from the outbox's thread with one line when an outage starts or ends."""
    _in_flight = 0
    _stop = False
    unsent = 0

    @property
    def failing(self) -> bool:
        """The last export attempt failed (an outage is going on)."""
        return self.attempt > 0

    attempt = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                batch = [self._items[i] for i in range(min(self._limit, len(self._items)))]
                self._in_flight = len(batch)
            ok, refused = self._export(batch)
            with self._cond:
                self._in_flight = 0
                if refused:
                    if len(batch) > 1:
                        self._limit = max(1, len(batch) // 2)  # find the refused items: try halves
                        continue
                    self._items.popleft()
                    self.rejected += 1
                    if self.rejected == 1 and self.on_change is not None:
                        self.on_change(
                            "the backend refused one of the %s (%s); dropped it, the journal keeps it "
                            "(lora-otel replay); the rest goes on" % (self.what, self.last_error)
                        )
                    self._cond.notify_all()
                    continue
                if ok:
                    self._limit = min(BATCH, self._limit * 2)
                    for _ in batch:  # the batch is still at the front: put() never drops in-flight items
                        self._items.popleft()
                    self.sent += len(batch)
                    if self.attempt and self.on_change is not None:
                        self.on_change(
                            "the backend accepts the %s again after %d failed attempts" % (self.what, self.attempt)
                        )
                    self.attempt = 0
                    self._cond.notify_all()
                    continue
                self.failures += 1
                if self.attempt == 0 and self.on_change is not None:
                    self.on_change(
                        "the backend is not accepting the %s (%s); queueing (%d waiting) and retrying"
                        % (self.what, self.last_error, len(self._items))
                    )
                wait = self.backoff_s[min(self.attempt, len(self.backoff_s) - 1)]
                self.attempt += 1
                end = time.monotonic() + wait
                while not self._stop and time.monotonic() < end:
                    self._cond.wait(end - time.monotonic())

    def _export(self, batch: list[Any]) -> tuple[bool, bool]:
        """``(accepted, refused)``: refused when the backend answered that it will not take the data."""
        try:
            result, code = otlp.export_with_status(self.exporter, batch)
        except Exception as e:  # noqa: BLE001 - an exporter bug is a failed attempt, not a dead thread
            self.last_error = "%s: %s" % (type(e).__name__, e)
            return False, False
        if getattr(result, "name", "") == "SUCCESS":
            return True, False
        if code is None:
            self.last_error = "the backend did not accept the %s (%s)" % (self.what, result)
        else:
            hint = _STATUS_HINTS.get(code)
            self.last_error = "HTTP %d%s" % (code, "; " + hint if hint else "")
        return False, code in otlp.REFUSED_STATUS


class _QueueingLogExporter:
    """A log record exporter for the SDK's SimpleLogRecordProcessor that only puts into an Outbox."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def export(self, batch: Sequence[Any]) -> Any:
        from opentelemetry.sdk._logs.export import LogExportResult

        self.outbox.put(list(batch))
        return LogExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class LogSink:
    """OTLP log records for one journal: its human lines, stalls and the end of the process."""

    SEVERITY: ClassVar[dict[str, str]] = {"info": "INFO", "warn": "WARN", "error": "ERROR"}

    def __init__(self, outbox: Outbox, resource: Any) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

        self.provider = LoggerProvider(resource=resource)
        # a LogRecordExporter by its methods: the SDK's logs module is imported only with a log exporter
        self.provider.add_log_record_processor(SimpleLogRecordProcessor(_QueueingLogExporter(outbox)))  # type: ignore[arg-type]
        self.logger = self.provider.get_logger("lora_otel", __version__)

    def emit(
        self,
        ts_ns: int,
        level: str,
        body: str,
        trace_id: Optional[str],
        span_id: Optional[str],
        attrs: Optional[dict[str, Any]] = None,
    ) -> None:
        from opentelemetry import trace
        from opentelemetry._logs import LogRecord, SeverityNumber

        severity = self.SEVERITY.get(level, "INFO")
        context = None
        if trace_id and span_id:
            sc = trace.SpanContext(
                int(trace_id, 16),
                int(span_id, 16),
                is_remote=False,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(sc))
        self.logger.emit(
            LogRecord(
                timestamp=ts_ns,
                observed_timestamp=time.time_ns(),
                context=context,
                severity_text=severity,
                severity_number=getattr(SeverityNumber, severity),
                body=otlp.clean_text(body),
                attributes=otlp.otel_attributes(attrs or {}),
            )
        )


def outboxes(exporter: Any, log_exporter: Any = None) -> tuple[Outbox, Optional[Outbox]]:
    """``(spans_out, logs_out)`` for these exporters (``logs_out`` None without a log exporter)."""
    size = min(_queue_size(), OUTBOX_ITEMS)  # few in flight as ReadableSpans; the rest wait as journal spans
    return (
        Outbox(exporter, "spans", max_items=size),
        Outbox(log_exporter, "log records", max_items=size) if log_exporter is not None else None,
    )


class _NotRemote:
    """``parent_id in known`` for a journal: every parent is in it except the root's (TRACEPARENT's)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def __contains__(self, parent_id: object) -> bool:
        root = self.journal.root
        return root is None or parent_id != root.parent_id

    def add(self, _span_id: str) -> None:
        pass


class Follower:
    """Export one journal's spans as they happen, under the one-export-per-span-ID rule.

    Costs stay flat over a long job: each poll handles only what the journal gained (spans that
    ended, new lines), and spans are forgotten once queued. Spans that ended but do not fit in the
    outbox wait in ``backlog``. While the backend is failing, at most ``LORA_OTEL_QUEUE_SIZE``
    (``capacity``) spans are held unsent, outbox and backlog together; beyond that the oldest in
    the backlog are dropped and counted in ``dropped``. While it accepts, nothing is dropped.
    """

    def __init__(
        self,
        path: str,
        exporter: Optional[SpanExporter] = None,
        limits: Optional[dict[str, float]] = None,
        frozen_after_s: Optional[float] = None,
        evidence: Callable[[int, Optional[StackRequest]], dict[str, Any]] = gather,
        log_exporter: Any = None,
        spans_out: Optional[Outbox] = None,
        logs_out: Optional[Outbox] = None,
        peers: Optional[Callable[[], Sequence[Journal]]] = None,
        peer_stacks: Optional[Callable[[Journal, Sequence[Journal]], dict[str, str]]] = None,
        watch: Any = None,
    ) -> None:
        """``exporter``/``log_exporter`` give this follower its own outboxes; or pass ``spans_out``
        (and ``logs_out``) to share them between the followers of one job (see `outboxes`).

        ``peers``: returns the journals of the job's other processes as they stand now (the sidecar's
        other followers'); with them a stall inside a collective names the ranks that never arrived.
        ``peer_stacks(journal, peers)``: their Python stacks by journal path (default `peer_stacks`).
        ``watch``: a `watchdog.Watch` of the same journal: its learned limits apply, it says slow
        stages, and each stall exported is also appended to the journal as a ``stall`` record
        (with the STALLED line where the job cannot write it), the same record local mode writes."""
        self.path = path
        self.tail = JournalTail(path, max_events=MAX_EVENTS)
        self.capacity = _queue_size()
        self.owns_outboxes = spans_out is None
        if spans_out is None:
            spans_out, logs_out = outboxes(exporter, log_exporter)
        self.spans_out = spans_out
        self.logs_out = logs_out
        self._logs: Optional[LogSink] = None
        self._resource: Optional[Resource] = None
        self._tr: Optional[otlp._Translator] = None
        self.limits = limits  # None: the limits the journal recorded (`stall.journal_limits`)
        self.frozen_after_s = frozen_after_s
        self.watch = watch
        self.evidence = evidence
        self.peers = peers
        self.peer_stacks = peer_stacks or default_peer_stacks
        self.exported: set[str] = set()  # open spans sent as incomplete (stalls); forgotten once they end
        self.incomplete_end: dict[str, int] = {}  # span id -> the end its incomplete export used
        self.dropped_imports: dict[str, Span] = {}  # short imports: never exported, their children move up
        self.backlog: collections.OrderedDict[str, Span] = collections.OrderedDict()
        self.dropped = 0  # spans and lines dropped because even the backlog was full
        self.stalls: list[Stall] = []
        self.journal: Optional[Journal] = None
        self._forget: set[str] = set()
        self._baseline: Any = None  # LORA_OTEL_BASELINE: a Baseline, the BaselineError it gave, or None
        self._baseline_read = False
        self._learned = False
        self._ask = StackAsker(evidence)  # a stack request that got no dump: this process is asked no more

    def poll(self, now_ns: Optional[int] = None) -> list[ReadableSpan]:
        """Read what the journal gained, queue what is new for export; returns the spans queued."""
        journal = self._read()
        now = now_ns or time.time_ns()
        tr = self._translator(journal)
        out = self._take_backlog(tr, self.spans_out.max_items - self.spans_out.pending)
        alive = process_state(journal) == "running"
        stalled_now = {s.span.span_id for s in self.stalls}
        learned = None
        if self.watch is not None and alive and journal.root is not None:
            self.watch.journal = journal
            if self.watch.learned is None:
                self.watch.read()
            learned = self.watch.learned
            self.watch._slow(journal, now)
        stall = detect(journal, now, alive, self.limits, self.frozen_after_s, learned)
        if stall is not None and stall.span.span_id not in stalled_now and stall.span.span_id not in self.exported:
            out += self._stall(journal, tr, stall, now)
        self._send(out)
        if self.watch is not None:  # the why and what-to-do lines, after the job's own STALLED line
            self.watch.say_why_later(journal, alive)
        self._send_lines(journal, tr)
        self.tail.forget(self._forget)
        self._forget = set()
        return out

    def finalize(self, how: str, failed: bool = True) -> list[ReadableSpan]:
        """The process is gone: export every span never exported, once, as incomplete. ``how``: e.g.
        "killed by SIGKILL". ``failed=False``: it ended as it meant to (it exec'd another program):
        the spans go out with status OK and the log record is INFO."""
        journal = self._read()
        tr = self._translator(journal)
        out = self._take_backlog(tr, self.spans_out.max_items - self.spans_out.pending)
        still_open = [span.name for span in journal.spans if span.end_ns is None]
        for span in journal.spans:
            if span.end_ns is not None:
                continue
            status = (
                Status(StatusCode.ERROR, "process ended (%s) with %s open" % (how, otlp.clean_text(span.name)))
                if failed
                else Status(StatusCode.OK)
            )
            attrs = {otlp.INCOMPLETE_ATTRIBUTE: True, "lora_otel.process.end": how}
            if span.span_id in self.incomplete_end:
                # Sent as a stall, still open at the end: how it ended arrives as its "(continued)"
                # child, from the stall's export to the last sign of life (its id is never sent twice).
                since = self.incomplete_end.pop(span.span_id)
                end = max(journal.last_life_ns or since, since)
                out.append(_amend(self._continued(tr, span, since), status=status, attrs=attrs, events=[], end_ns=end))
            elif span.span_id not in self.exported:
                end = max(journal.last_life_ns or span.start_ns, span.start_ns)
                out.append(_amend(tr.readable(span), status=status, attrs=attrs, events=[], end_ns=end))
                self.exported.add(span.span_id)
        self._send(out)
        self._send_lines(journal, tr)
        if still_open and journal.root is not None:
            self._log(
                tr,
                journal.last_life_ns or time.time_ns(),
                "error" if failed else "info",
                "process ended (%s) with %d span(s) open: %s" % (how, len(still_open), ", ".join(still_open)),
                journal.root.span_id,
                {"lora_otel.process.end": how},
            )
        return out

    def drain(self, deadline: float) -> None:
        """Move the backlog and the lines into the outboxes as they make room, until ``deadline``
        (``time.monotonic()``); what is still waiting then is counted in ``dropped``."""
        journal = self.journal  # None: nothing read, so no backlog either
        while journal is not None and (self.backlog or journal.lines) and time.monotonic() < deadline:
            tr = self._translator(journal)
            self._trim()
            self._send(self._take_backlog(tr, self.spans_out.max_items - self.spans_out.pending))
            self._send_lines(journal, tr)
            if self.backlog or journal.lines:
                time.sleep(0.05)
        self.dropped += len(self.backlog)  # the time is up: what never reached the outbox
        self.backlog.clear()

    def close(self, timeout: float = 10.0) -> bool:
        """Send the backlog and what is queued, for up to ``timeout`` s; True when everything went out.

        Closes the outboxes only when this follower owns them."""
        deadline = time.monotonic() + timeout
        self.drain(deadline)
        if self._logs is not None:
            try:
                self._logs.provider.shutdown()
            except Exception:  # noqa: BLE001
                pass
        self.tail.close()
        if not self.owns_outboxes:
            return True
        ok = self.spans_out.close(max(deadline - time.monotonic(), 0.1))
        if self.logs_out is not None:
            ok = self.logs_out.close(max(deadline - time.monotonic(), 0.1)) and ok
        return ok

    # --- internals -------------------------------------------------------------------------------

    def _read(self) -> Journal:
        """Read the journal's new records; spans that ended join the backlog (short imports excepted)."""
        journal = self.journal = self.tail.read()
        if not self._learned and journal.pid and process_state(journal) == "running":
            self._learned = True  # what the process redacted is scrubbed from everything sent (clean_text)
            otlp.learn_secrets(journal.pid)
        for span in self.tail.take_ended():
            sid = span.span_id
            if otlp._is_short_import(span, journal):
                self.dropped_imports[sid] = span
                self._forget.add(sid)
            else:
                self.backlog[sid] = span
        self._trim()
        return journal

    def _trim(self) -> None:
        """While the backend fails, hold at most ``capacity`` unsent spans: drop the oldest waiting."""
        while self.backlog and self.spans_out.failing and len(self.backlog) + self.spans_out.pending > self.capacity:
            sid, _ = self.backlog.popitem(last=False)
            self._forget.add(sid)
            self.dropped += 1

    def _translator(self, journal: Journal) -> otlp._Translator:
        if self._tr is None or self._tr.journal is not journal:
            if self._resource is None and journal.root is not None:
                # Built once: Resource.create runs the resource detectors. The process span's resource
                # attributes are all written before the sidecar starts following.
                self._resource = otlp.make_resource(journal)
            tr = otlp._Translator(journal, self.dropped_imports, self._resource)
            tr.known = _NotRemote(journal)
            if journal.root is None:
                return tr  # not yet: the trace flags come from the process span
            self._tr = tr
        return self._tr

    def _take_backlog(self, tr: otlp._Translator, room: int) -> list[ReadableSpan]:
        out: list[ReadableSpan] = []
        while self.backlog and room > 0:
            sid, span = self.backlog.popitem(last=False)
            if sid in self.incomplete_end:  # sent as a stall earlier: the rest of it
                out.append(self._continued(tr, span, self.incomplete_end.pop(sid)))
                self.exported.discard(sid)
            elif sid not in self.exported:
                out.append(tr.readable(span))
            self._forget.add(sid)
            room -= 1
        return out

    def _continued(self, tr: otlp._Translator, span: Span, since_ns: int) -> ReadableSpan:
        rest = replace(
            span,
            name=span.name + " (continued)",
            span_id=os.urandom(8).hex(),
            parent_id=span.span_id,
            start_ns=min(since_ns, span.end_ns or since_ns),
            events=[e for e in span.events if e[0] >= since_ns],
            attrs={"lora_otel.continues": span.span_id},
        )
        return tr.readable(rest)

    def _stall(self, journal: Journal, tr: otlp._Translator, stall: Stall, now: int) -> list[ReadableSpan]:
        self.stalls.append(stall)
        chain: list[Span] = []
        span: Optional[Span] = stall.span
        while span is not None and all(span is not link for link in chain):  # a corrupt journal's parents may cycle
            chain.append(span)
            span = journal.span(span.parent_id) if span.parent_id else None
        evidence = self._ask(journal, native=stall.kind == "frozen")
        found, peers, others = diagnose_stall(
            journal,
            stall,
            evidence,
            now,
            self.peers,
            self.limits,
            self.frozen_after_s,
            self._baseline_for(journal),
            self.peer_stacks,
        )
        sentence = found.sentence
        if self.watch is not None:
            try:
                self.watch.write(
                    journal, stall, sentence, evidence, now, cause_pid(found.attrs, journal), found.ages, found.advice
                )
            except Exception as e:  # noqa: BLE001 - the export goes on
                evidence[PREFIX + "record.error"] = "%s: %s" % (type(e).__name__, e)
        ranks = world_peers(journal, peers)
        for rank in (found.attrs.get("lora_otel.collective.missing_ranks") or [])[:PEER_STACKS_ATTACHED]:
            text = others.get(ranks[rank].path) if rank in ranks else None
            if text:
                evidence[PREFIX + "rank.%d.python.stacks" % rank] = text[-4000:]
        duration_s = (now - stall.span.start_ns) / 1e9
        self._log(
            tr,
            now,
            "warn",
            "stall detected: %s open for %s (%s): %s"
            % (stall.stage, format_duration(now - stall.span.start_ns), stall.kind, sentence),
            stall.span.span_id,
            {
                "lora_otel.stall.stage": stall.stage,
                "lora_otel.stall.duration_s": round(duration_s, 3),
                "lora_otel.stall.kind": stall.kind,
                "lora_otel.diagnosis": sentence,
                "lora_otel.stall.message": stall.status_message,
                **found.attrs,
            },
        )
        out = []
        for span in reversed(chain):  # root to leaf
            if span.span_id in self.exported or span.end_ns is not None:
                continue
            events = []
            if span is stall.span:
                ev = {k: (v if isinstance(v, (str, int, float, bool)) else str(v)) for k, v in evidence.items()}
                ev["lora_otel.diagnosis"] = sentence
                ev.update(found.attrs)
                events.append(Event("stall detected", otlp.otel_attributes(ev), now))
            attrs = {
                otlp.INCOMPLETE_ATTRIBUTE: True,
                "lora_otel.stall.kind": stall.kind,
                "lora_otel.stall.stage": stall.stage,
                "lora_otel.diagnosis": sentence,
            }
            if span is stall.span:
                attrs.update(found.attrs)
            rs = _amend(
                tr.readable(span),
                status=Status(StatusCode.ERROR, stall.status_message),
                attrs=attrs,
                events=events,
                end_ns=now,
            )
            out.append(rs)
            self.exported.add(span.span_id)
            self.incomplete_end[span.span_id] = now
        return out

    def _baseline_for(self, journal: Journal) -> Any:
        """`configured_baseline`, read at the first stall."""
        if not self._baseline_read:
            self._baseline_read, self._baseline = True, configured_baseline(journal)
        return self._baseline

    def _send(self, spans: list[ReadableSpan]) -> None:
        self.spans_out.put(spans)

    def _send_lines(self, journal: Journal, tr: otlp._Translator) -> None:
        """Human lines → log records, as many as the log outbox has room for; sent lines are forgotten."""
        lines = journal.lines
        if self.logs_out is None:
            lines.clear()
            return
        room = self.logs_out.max_items - self.logs_out.pending
        root = journal.root.span_id if journal.root is not None else None
        for line in lines[: max(room, 0)]:
            self._log(tr, line.ts, line.level, line.msg, root)
        del lines[: max(room, 0)]
        if self.logs_out.failing and len(lines) > self.capacity:
            self.dropped += len(lines) - self.capacity
            del lines[: len(lines) - self.capacity]

    def _log(
        self,
        tr: otlp._Translator,
        ts: int,
        level: str,
        body: str,
        span_id: Optional[str],
        attrs: Optional[dict[str, Any]] = None,
    ) -> None:
        if self.logs_out is None:
            return
        if self._logs is None:
            self._logs = LogSink(self.logs_out, tr.resource)
        trace_id = self.journal.trace_id if self.journal is not None else None
        self._logs.emit(ts, level, body, trace_id, span_id, attrs)
