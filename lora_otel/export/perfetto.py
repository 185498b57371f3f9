"""Journals as a Trace Event JSON document: the file Perfetto UI (ui.perfetto.dev) and ``chrome://tracing`` open.

`trace_events` turns the journals of a job (a launcher, its ranks, their workers) into the JSON
object form of the Trace Event Format (``{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}``):

- one *process* per journal: ``process_name`` metadata says its role in the job (``launcher``,
  ``rank 1``, ``rank 1 child``, ``child``) and program, ``process_sort_index`` puts the launcher
  first and the ranks in order (the order of ``lora-otel inspect DIR``), ``process_labels`` its
  outcome (``stalled``, ``killed``, ...);
- *threads*: the journal records no thread per span, so spans go on the ``main thread`` track
  (tid = pid, as Linux numbers a main thread) while they nest there; a span that overlaps another
  without nesting in it goes on a track of its own (``overlapping spans``), so that both viewers
  keep every span (they drop or mangle slices that overlap on one track). Such a span may have run
  on another thread, or on the main thread beside a span of lora_otel's own that crosses it (the
  ``training`` span ``lora_otel.progress`` opens inside a user's stage): the track is named for
  what is known, not for a thread;
- every span as a *complete* event (``"ph": "X"``, ``ts``/``dur`` in whole microseconds since the
  Unix epoch), its attributes in ``args``; a span still open runs to now (process running) or to
  the process's end (exit record, else when it was last seen alive: its last record or a later
  ``stall`` record) and is flagged: name suffix ``[open]``,
  ``cat`` ``open``; a stalled one (a ``stall`` record of the watchdog or sidecar, or the stall rule
  applied now) ``[STALLED]``, ``cat`` ``stalled``, with the stall's kind and its one-sentence
  diagnosis in ``args``; an error span ``cat`` ``error``. ``cname`` gives chrome://tracing's
  colours (Perfetto colours by name);
- span events and marks, ``stall`` records, warn/error lines and the process's end as *instant*
  events (``"ph": "i"``);
- beats as *counters* (``"ph": "C"``): ``steps`` and ``steps/s`` (of a process that made a
  step) and each metric given to ``lora_otel.progress``.

Every text goes through the same redaction as every other output (`lora_otel._boot.seam`:
``redact_text``, which also scrubs the values already redacted in this process; a secret-named
attribute loses its value whole). Successful imports shorter than the journal's
``import_threshold_ms`` are left out, as in the OTLP export. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from lora_otel._boot.seam import redact, redact_text, stalled_line
from lora_otel._version import __version__
from lora_otel.analysis.job import Job, Proc, attach_verdicts, group_jobs, make_proc
from lora_otel.analysis.verdict import what_phrase
from lora_otel.journal.reader import Journal, Span, process_state
from lora_otel.journal.tree import iso_time

MAIN_THREAD = "main thread"
OTHER_THREAD = "overlapping spans"
OVERLAP = "spans that overlap the main track's without nesting: the journal records no thread per span"
OPEN_SUFFIX = " [open]"
STALLED_SUFFIX = " [STALLED]"
MAX_BEATS = 5000
"""Beats per process drawn as counters; a longer job's beats are thinned evenly (the last kept)."""
MAX_LINE = 300
"""Characters of a warn/error line kept in an instant event's name."""
DEFAULT_IMPORT_THRESHOLD_MS = 5
_SYNTHETIC_PID = 1 << 30
"""Pids given to journals without a usable or unique one (two hosts' ranks may share a pid)."""
_SYNTHETIC_TID = 1 << 31
"""Thread ids of the ``overlapping spans`` tracks: unique in the file, apart from any real tid."""
_INT64 = range(-(2**63), 2**63)


@dataclass
class Beat:
    """One ``beat`` record: when, the step count, the metrics it carried."""

    ts: int
    steps: int
    metrics: dict[str, float] = field(default_factory=dict)


def trace_events(journals: list[Journal], now_ns: int, *, verdicts: bool = True) -> dict[str, Any]:
    """The Trace Event JSON document (a dict; `dumps` writes it) for these journals at ``now_ns``.

    Args:
        journals: the journals of a job (or of several: each job's processes are sorted together).
            A journal without a span is left out.
        now_ns: the time open spans of a running process run to (Unix ns).
        verdicts: work out the diagnosis of a live stalled process that has no ``stall`` record yet,
            as ``lora-otel inspect`` does (reads ``/proc`` for about a second); False: the stall
            rule's own sentence.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    procs = [make_proc(j, process_state(j), now_ns, None, None) for j in journals if j.spans]
    jobs = group_jobs(procs)
    if verdicts:
        attach_verdicts(jobs, now_ns)
    writer = _Writer()
    sort_index = 0
    for job in jobs:
        for proc in job.procs:
            writer.process(proc, sort_index)
            sort_index += 1
    return {
        "traceEvents": writer.sorted_events(),
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": f"lora_otel {__version__}",
            "generated": iso_time(now_ns),
            "jobs": [_job_data(job) for job in jobs],
            "short imports left out": writer.dropped_imports,
        },
    }


def dumps(doc: dict[str, Any]) -> str:
    """The document as compact JSON text (UTF-8 as is, no ASCII escapes)."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def beat_history(journal: Journal, limit: int = MAX_BEATS) -> list[Beat]:
    """Every readable ``beat`` record of the journal's file, in order, thinned evenly to ``limit``.

    The reader keeps only the last few beats (`lora_otel.journal.reader.STEP_SAMPLES`); this reads
    the file again for the whole history. A file that cannot be read any more gives the reader's
    samples. Metrics keep only their int and float values.
    """
    from lora_otel._boot.seam import files

    beats: list[Beat] = []
    try:
        with open(files.open_regular(journal.path), "rb") as f:  # (never a FIFO put there since)
            for raw in f:
                if b'"beat"' not in raw:
                    continue
                beat = _beat(raw)
                if beat is not None:
                    beats.append(beat)
    except OSError:
        beats = [Beat(ts, steps) for ts, steps in journal.step_samples]
    if len(beats) > limit > 1:
        step = (len(beats) - 1) / (limit - 1)
        beats = [beats[round(i * step)] for i in range(limit)]
    return beats


def _beat(raw: bytes) -> Optional[Beat]:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("k") != "beat":
        return None
    ts, steps, metrics = record.get("ts"), record.get("steps"), record.get("metrics")
    if not (isinstance(ts, int) and isinstance(steps, int) and _is_int(ts) and _is_int(steps)):
        return None
    if ts < 0 or steps < 0:
        return None
    numbers: dict[str, float] = {}
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf"):
                numbers[str(key)] = value  # (NaN fails the comparison too)
    return Beat(ts, steps, numbers)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _job_data(job: Job) -> dict[str, Any]:
    return {
        "trace_id": job.trace_id,
        "name": _clean(job.name),
        "outcome": job.outcome,
        "summary": _clean(job.phrase),
        "callout": _clean(job.callout.text) if job.callout is not None else None,
    }


# --- text and values -----------------------------------------------------------------------------


def _clean(text: str) -> str:
    """Text as every output shows it: valid Unicode (lone surrogates as ``\\udcXX``), secrets redacted."""
    return redact_text(text.encode("utf-8", "backslashreplace").decode("utf-8"))


def _value(value: Any) -> Any:
    """A journal value as JSON both viewers read: texts cleaned, integers beyond 64 bits as text."""
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return value if value in _INT64 else str(value)
    if isinstance(value, list):
        return [_value(item) for item in value]
    if isinstance(value, dict):
        return _args(value)
    return _clean(str(value))


def _args(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes as ``args``: keys and values cleaned; a secret-named key's value redacted whole."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        name = _clean(str(key))
        out[name] = redact.REDACTED if value is not None and redact.is_secret_name(str(key)) else _value(value)
    return out


def _us(ns: int) -> int:
    """Unix ns as whole microseconds (floored: an end never moves before a start it followed)."""
    return ns // 1000


# --- one process ---------------------------------------------------------------------------------


@dataclass
class _Slice:
    span: Span
    start_us: int
    end_us: int
    tid: int = 0


@dataclass
class _StallMark:
    kind: str
    diagnosis: str
    args: dict[str, Any]


class _Writer:
    """Collects the events of every process; keeps pids and the ``overlapping spans`` tids unique."""

    def __init__(self) -> None:
        self.meta: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.pids: set[int] = set()
        self.next_pid = _SYNTHETIC_PID
        self.next_tid = _SYNTHETIC_TID
        self.dropped_imports = 0

    def sorted_events(self) -> list[dict[str, Any]]:
        """Metadata first, then by time (longer slices before those they contain)."""
        self.events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        return self.meta + self.events

    def _pid(self, journal: Journal) -> int:
        pid = journal.pid
        if pid is None or not 0 < pid < _SYNTHETIC_PID or pid in self.pids:
            while self.next_pid in self.pids:
                self.next_pid += 1
            pid = self.next_pid
        self.pids.add(pid)
        return pid

    def process(self, proc: Proc, sort_index: int) -> None:
        journal = proc.journal
        pid = self._pid(journal)
        main = pid
        label = f"{proc.label}: {proc.name}"
        labels = [proc.outcome]
        if journal.pid is not None and journal.pid != pid:
            labels.append(f"pid {journal.pid}")
        self.meta += [
            _meta("process_name", pid, main, {"name": _clean(label)}),
            _meta("process_sort_index", pid, main, {"sort_index": sort_index}),
            _meta("process_labels", pid, main, {"labels": _clean(", ".join(labels))}),
            _meta("thread_name", pid, main, {"name": MAIN_THREAD}),
            _meta("thread_sort_index", pid, main, {"sort_index": 0}),
        ]
        end_ns = proc.end_ns
        slices = self._layout(proc, end_ns)
        lanes = sorted({s.tid for s in slices} - {0})
        tids = {0: main}
        for number, lane in enumerate(lanes, start=1):
            tid = self.next_tid
            self.next_tid += 1
            tids[lane] = tid
            self.meta += [
                _meta("thread_name", pid, tid, {"name": f"{OTHER_THREAD} {number} ({OVERLAP})"}),
                _meta("thread_sort_index", pid, tid, {"sort_index": number}),
            ]
        stalls = _stall_marks(proc)
        for piece in slices:
            self.events.append(self._complete(proc, piece, pid, tids[piece.tid], stalls.get(piece.span.span_id)))
            for ts, name, attrs in piece.span.events:
                args = _args(attrs)
                args["lora_otel.span"] = _clean(piece.span.name)
                self.events.append(
                    {"name": _clean(name), "cat": "event", "ph": "i", "s": "t", "ts": _us(ts), "pid": pid}
                    | {"tid": tids[piece.tid], "args": args}
                )
        self._stall_instants(proc, pid, main)
        self._lines(journal, pid, main)
        self._end(proc, pid, main, end_ns)
        self._counters(journal, pid, main)

    # --- spans ---------------------------------------------------------------------------------

    def _layout(self, proc: Proc, end_ns: int) -> list[_Slice]:
        """Each kept span with its times and lane: the first lane (its parent's first) where it
        nests in what is open there; a new lane when none."""
        journal = proc.journal
        threshold = journal.config.get("import_threshold_ms", DEFAULT_IMPORT_THRESHOLD_MS)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            threshold = DEFAULT_IMPORT_THRESHOLD_MS
        slices: list[_Slice] = []
        for span in journal.spans:
            if (
                span.name.startswith("import ")
                and span.end_ns is not None
                and span.status == "ok"
                and span.end_ns - span.start_ns < threshold * 1_000_000
            ):
                self.dropped_imports += 1
                continue
            stop = span.end_ns if span.end_ns is not None else max(end_ns, span.start_ns)
            slices.append(_Slice(span, _us(span.start_ns), _us(stop)))
        slices.sort(key=lambda s: (s.start_us, -s.end_us))
        lanes: list[list[int]] = []  # per lane, the end times of the slices open there, innermost last
        lane_of: dict[str, int] = {}
        for piece in slices:
            parent_lane = lane_of.get(piece.span.parent_id or "")
            order = ([parent_lane] if parent_lane is not None else []) + list(range(len(lanes)))
            for lane in order:
                stack = lanes[lane]
                while stack and stack[-1] <= piece.start_us:
                    stack.pop()  # ended before this one starts (what the viewers do too)
                if not stack or stack[-1] >= piece.end_us:
                    break
            else:
                lanes.append([])
                lane = len(lanes) - 1
            lanes[lane].append(piece.end_us)
            piece.tid = lane
            lane_of[piece.span.span_id] = lane
        return slices

    def _complete(self, proc: Proc, piece: _Slice, pid: int, tid: int, stall: Optional[_StallMark]) -> dict[str, Any]:
        span = piece.span
        name, cat, cname = _clean(span.name), "span", None
        args = _args(span.attrs)
        args["lora_otel.span_id"] = span.span_id
        if span.parent_id is not None:
            args["lora_otel.parent_id"] = span.parent_id
        args["lora_otel.status"] = "open" if span.is_open else span.status
        if span.message:
            args["lora_otel.message"] = _clean(span.message)
        if span.status == "error":
            cat, cname = "error", "bad"
        if span.is_open:
            name, cat, cname = name + OPEN_SUFFIX, "open", "yellow"
            args["lora_otel.open"] = True
            args["lora_otel.open_until"] = _open_until(proc)
            args["lora_otel.open_s"] = round((piece.end_us - piece.start_us) / 1e6, 3)
        if stall is not None:
            args.update(stall.args)
            if span.is_open and stall.kind != "died":
                name = _clean(span.name) + STALLED_SUFFIX
                cat, cname = "stalled", "terrible"
        event: dict[str, Any] = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": piece.start_us,
            "dur": piece.end_us - piece.start_us,
            "pid": pid,
            "tid": tid,
            "args": args,
        }
        if cname is not None:
            event["cname"] = cname
        return event

    # --- instants and counters -----------------------------------------------------------------

    def _stall_instants(self, proc: Proc, pid: int, tid: int) -> None:
        for record in proc.journal.stalls:
            ts = record.get("ts")
            if not isinstance(ts, int):
                continue
            kind = str(record.get("kind"))
            what = what_phrase(record.get("stage"), kind, record.get("open_s"), record.get("limit_s"))
            args: dict[str, Any] = {
                "lora_otel.stall.kind": kind,
                "lora_otel.stall.diagnosis": _clean(record.get("diagnosis") or ""),
                "lora_otel.stall.by": _clean(str(record.get("by") or "")),
            }
            if isinstance(record.get("evidence"), dict):
                args["lora_otel.stall.evidence"] = _args(record["evidence"])
            title = f"died: {what}" if kind == "died" else stalled_line(what, None)
            self.events.append(_instant(_clean(title), "stall", ts, pid, tid, args, scope="p"))
        stall = proc.stall
        if stall is not None and not proc.journal.stalls:
            diagnosis, by = _diagnosis(proc)
            what = what_phrase(
                stall.stage if stall.stage != "between stages" else None, stall.kind, stall.open_for_s, stall.limit_s
            )
            args = {"lora_otel.stall.kind": stall.kind, "lora_otel.stall.diagnosis": _clean(diagnosis)}
            args["lora_otel.stall.by"] = by
            self.events.append(
                _instant(_clean(stalled_line(what, None)), "stall", proc.end_ns, pid, tid, args, scope="p")
            )

    def _lines(self, journal: Journal, pid: int, tid: int) -> None:
        for line in journal.lines:
            if line.level not in ("warn", "error"):
                continue
            text = _clean(line.msg)
            name = text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"
            self.events.append(_instant(name, "line", line.ts, pid, tid, {"level": line.level, "msg": text}))

    def _end(self, proc: Proc, pid: int, tid: int, end_ns: int) -> None:
        journal = proc.journal
        exit_ = journal.exit
        if exit_ is not None:
            code = exit_["code"]
            message = exit_["message"]
            name = f"exit: {message}" if message and exit_["how"] != "normal" else f"exit (code {code})"
            args = {"code": code, "how": _clean(str(exit_["how"])), "message": _clean(message) if message else None}
            self.events.append(_instant(_clean(name), "process", exit_["ts"], pid, tid, args, scope="p"))
        elif journal.exec is not None:
            path = journal.exec.get("path") or "another program"
            name = _clean(f"exec'd into {path}")
            self.events.append(_instant(name, "process", journal.exec["ts"], pid, tid, {}, scope="p"))
        elif proc.state == "gone":
            args = {"outcome": proc.outcome, "last record": iso_time(end_ns)}
            self.events.append(_instant("gone (no exit record)", "process", end_ns, pid, tid, args, scope="p"))

    def _counters(self, journal: Journal, pid: int, tid: int) -> None:
        if not journal.beats:
            return
        last: dict[str, float] = {}
        previous: Optional[Beat] = None
        beats = beat_history(journal)
        trains = any(beat.steps for beat in beats)  # a launcher's or a worker's steps stay 0: no line
        for index, beat in enumerate(beats):
            series: dict[str, float] = {"steps": beat.steps} if trains else {}
            if trains and previous is not None and beat.ts > previous.ts:
                series["steps/s"] = round((beat.steps - previous.steps) * 1e9 / (beat.ts - previous.ts), 3)
            series.update(beat.metrics)
            final = index == len(beats) - 1
            for key, value in series.items():
                if last.get(key) == value and not final:
                    continue  # a flat line needs only its ends
                last[key] = value
                self.events.append(
                    {"name": _clean(key), "cat": "beat", "ph": "C", "ts": _us(beat.ts), "pid": pid, "tid": tid}
                    | {"args": {"value": value}}
                )
            previous = beat


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _instant(
    name: str, cat: str, ts: int, pid: int, tid: int, args: dict[str, Any], scope: str = "t"
) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "i", "s": scope, "ts": _us(ts), "pid": pid, "tid": tid, "args": args}


def _open_until(proc: Proc) -> str:
    """What an open span's end stands for."""
    journal = proc.journal
    if proc.state == "running":
        return "now (the process is running)"
    if journal.exit is not None:
        return "the exit record (the process ended with it open)"
    if journal.exec is not None:
        return "the exec record (the process became another program)"
    return "when it was last seen alive (its last record, or a later stall record; the process is gone)"


def _diagnosis(proc: Proc) -> tuple[str, str]:
    """The one-sentence diagnosis of the process's stall and who made it: the verdict every view
    leads with (`lora_otel.analysis.job.attach_verdicts`), else the stall rule's own sentence."""
    verdict = proc.view.verdict.to_json() if proc.view.verdict is not None else {}
    reason = proc.stall.reason if proc.stall is not None else ""
    return str(verdict.get("diagnosis") or reason), str(verdict.get("by") or "report")


def _stall_marks(proc: Proc) -> dict[str, _StallMark]:
    """span id → the stall to flag it with: its last ``stall`` record of a stall (a ``died`` record
    adds its diagnosis), else the stall the rule finds now (running) or when the journal ends."""
    marks: dict[str, _StallMark] = {}
    for record in proc.journal.stalls:
        span_id = record.get("span_id")
        if not isinstance(span_id, str):
            continue
        kind = str(record.get("kind"))
        diagnosis = _clean(record.get("diagnosis") or "")
        if kind == "died":
            mark = marks.get(span_id)
            if mark is None:
                mark = marks[span_id] = _StallMark("died", diagnosis, {"lora_otel.stall.kind": "died"})
            mark.args["lora_otel.death.diagnosis"] = diagnosis
            continue
        args: dict[str, Any] = {
            "lora_otel.stall.kind": kind,
            "lora_otel.stall.diagnosis": diagnosis,
            "lora_otel.stall.limit_s": record.get("limit_s"),
            "lora_otel.stall.open_s": record.get("open_s"),
            "lora_otel.stall.by": _clean(str(record.get("by") or "")),
        }
        if isinstance(record.get("learned"), dict):
            args["lora_otel.stall.learned"] = _args(record["learned"])
        previous = marks.get(span_id)
        if previous is not None and "lora_otel.death.diagnosis" in previous.args:
            args["lora_otel.death.diagnosis"] = previous.args["lora_otel.death.diagnosis"]
        marks[span_id] = _StallMark(kind, diagnosis, args)
    stall = proc.stall
    if stall is not None and stall.kind != "between":
        current = marks.get(stall.span.span_id)
        if current is None or current.kind == "died":
            diagnosis, by = _diagnosis(proc)
            args = {
                "lora_otel.stall.kind": stall.kind,
                "lora_otel.stall.diagnosis": _clean(diagnosis),
                "lora_otel.stall.limit_s": stall.limit_s,
                "lora_otel.stall.open_s": round(stall.open_for_s, 3),
                "lora_otel.stall.by": by,
            }
            if current is not None:
                args["lora_otel.death.diagnosis"] = current.args.get("lora_otel.death.diagnosis")
            marks[stall.span.span_id] = _StallMark(stall.kind, _clean(diagnosis), args)
    return marks
