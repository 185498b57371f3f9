"""The journal's records (docs/journal.md): their kinds and fields, the checks each record passes,
and the `Journal` model they build.

This is the reading side's statement of the contract between the two halves: `FORMAT_VERSION`,
`KINDS`, `REQUIRED_FIELDS`, `STALL_KINDS`. (The writer, `lora_otel._boot.core`, runs inside the
training process and imports nothing of the reading side; docs/journal.md is what both follow.)
`JournalBuilder` turns lines into a `Journal` tolerantly: a line that is not a valid record is
skipped and described in ``Journal.problems``, never raised. Views import the model (`Journal`,
`Span`, `Line`) from `lora_otel.journal.reader`, which reads the files and re-exports it.

Standard library only: the exporting side may run in the same broken environment it diagnoses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Optional

if TYPE_CHECKING:  # the standard library's own TypeGuard is Python 3.10's; only the checker needs it
    from typing_extensions import TypeGuard

FORMAT_VERSION = 1
"""The journal format version this reader understands."""

STEP_SAMPLES = 300
"""A `Journal` keeps the (beat ts, steps) of this many last beats: enough to estimate the step time."""
EVENTS_DROPPED = "lora_otel.events.dropped"
"""Span attribute: how many events a `JournalTail` with ``max_events`` left out of the middle."""
KINDS = ("start", "end", "event", "attrs", "beat", "line", "exit", "exec", "stall")
"""The record kinds (``k``); `REQUIRED_FIELDS` names what each must carry besides ``v``, ``k`` and ``ts``."""

REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "start": ("trace_id", "span_id", "name"),
    "end": ("span_id",),
    "event": ("span_id", "name"),
    "attrs": ("span_id", "attrs"),
    "beat": ("steps",),
    "line": ("msg",),
    "exit": (),
    "exec": (),
    "stall": ("kind",),
}
STALL_KINDS = ("alive", "frozen", "between", "died")
"""The ``kind`` of a ``stall`` record (written by the watchdog or the sidecar, docs/journal.md)."""
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_MAX_TS = 2**63 - 1  # OTLP timestamps are 64-bit; this is the year 2262
_NOT_UTF8 = "not valid UTF-8 (undecodable bytes replaced)"

SpanStatus = Literal["ok", "error", "unset"]


@dataclass
class Span:
    """One span as the journal tells it. ``end_ns`` is None while the span is open.

    ``status`` is ``"unset"`` while open, else ``"ok"`` or ``"error"`` (with ``message``).
    ``events`` holds ``(ts_ns, name, attrs)`` tuples in journal order.
    """

    name: str
    span_id: str
    parent_id: Optional[str]
    trace_id: str
    start_ns: int
    end_ns: Optional[int] = None
    status: SpanStatus = "unset"
    message: Optional[str] = None
    attrs: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)

    @property
    def is_open(self) -> bool:
        return self.end_ns is None


@dataclass
class Line:
    """A human line the process printed (``line`` record)."""

    ts: int
    level: str
    msg: str


@dataclass
class Journal:
    """Everything a journal says, plus the problems found while reading it.

    ``spans`` are ordered by start time; ``root`` is the ``process`` span (None when the journal
    lacks one). ``pid``, ``start_ticks``, ``config`` and ``sampled`` come from the ``process``
    start record, and ``image`` (what identifies the program it ran: `preamble.image_identity`).
    ``exit`` is the ``exit`` record as ``{"ts", "code", "how", "message"}``, or None. ``exec`` is the
    last ``exec`` record as ``{"ts", "path", "argv", "via"}`` while no later one says it failed:
    the process became another program; None otherwise.
    ``last_evidence_ns`` is the ``ts`` of the last readable record the process wrote (a ``stall``
    record is the watchdog's, not the process's: it does not count). ``touched_ns`` is the file's
    modification time when it was read (None when it was not read from a file): the beat touches
    the journal where it writes no record (docs/journal.md), so `last_life_ns`, the latest of the
    two and the last beat, is the process's last sign of life.
    ``stalls``: the ``stall`` records the watchdog or sidecar appended, as dicts, in file order.
    ``log_id``/``log_path``: the ``--log`` file the process opened at start (identity, absolute
    path), from the ``process`` start record, or None (also once a root ``attrs`` record says
    ``lora_otel.log.copied`` false).
    ``stderr_id``/``stderr_path``: what descriptor 2 was when the process started (``[st_dev,
    st_ino]``; its path when it was a regular file), from the ``process`` start record, or None.
    ``main_frames`` is where the main thread was at the last beat (its ``main``: ``[file, line,
    function]`` lists, outermost first, a C function called last as ``["", 0, "time.sleep"]``), or
    None when that beat had none; ``main_frames_ts`` is that beat's time, ``main_frames_since``
    the time of the first beat of the run of beats that had these same frames (a beat that changes
    nothing writes no record, so it is when the main thread got there, to a beat). `where_text`
    says it.
    """

    path: str
    spans: list[Span] = field(default_factory=list)
    root: Optional[Span] = None
    pid: Optional[int] = None
    start_ticks: Optional[int] = None
    config: dict[str, Any] = field(default_factory=dict)
    sampled: bool = True
    beats: int = 0
    last_beat_ns: Optional[int] = None
    steps: int = 0
    last_step_ns: Optional[int] = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # (beat ts, steps) of the last STEP_SAMPLES beats: enough to estimate the step time.
    step_samples: list[tuple[int, int]] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    exit: Optional[dict[str, Any]] = None
    exec: Optional[dict[str, Any]] = None
    image: dict[str, Any] = field(default_factory=dict)
    last_evidence_ns: Optional[int] = None
    touched_ns: Optional[int] = None
    main_frames: Optional[list[list[Any]]] = None
    main_frames_ts: Optional[int] = None
    main_frames_since: Optional[int] = None
    problems: list[str] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    """The ``stall`` records, in order, each as written (``ts`` an int, ``kind`` one of `STALL_KINDS`)."""
    stderr_id: Optional[tuple[int, int]] = None
    stderr_path: Optional[str] = None
    log_id: Optional[tuple[int, int]] = None
    log_path: Optional[str] = None
    log_pending: bool = False
    """The first record named ``log_path`` but the file was not open yet (``log_pending``): its
    identity comes in a root ``attrs`` record (``lora_otel.log.id``) once the process opens it;
    until then the watchdog may create it, new, to say a death or a stall (`watchdog.LineWriter`)."""

    @property
    def trace_id(self) -> Optional[str]:
        return self.root.trace_id if self.root is not None else None

    @property
    def last_life_ns(self) -> Optional[int]:
        """The process's last sign of life: its last beat, its last record, or the journal's
        modification time (which a beat that writes no record moves), whichever is latest; None
        when there is none.

        The modification time counts up to `touch_window_s` past the last record — a beat that
        changes nothing is still a record that often — so a journal copied or touched later does
        not seem to live on. (A writer other than the process leaves the modification time as it
        was: `lora_otel.export.watchdog.append_record`.)"""
        last = max(self.last_beat_ns or 0, self.last_evidence_ns or 0)
        if self.touched_ns and last:
            return max(last, min(self.touched_ns, last + int(self.touch_window_s * 1e9)))
        return last or None

    @property
    def touch_window_s(self) -> float:
        """How long the journal's modification time may run ahead of its last record: twice the
        longest time between two beat records (``config.beat_s`` × ``config.beat_record_every``);
        0 for a journal from before beats touched the file (every beat was a record)."""
        config = self.config if isinstance(self.config, dict) else {}
        beat, every = config.get("beat_s"), config.get("beat_record_every")
        if not isinstance(beat, (int, float)) or not isinstance(every, int) or beat <= 0 or every <= 0:
            return 0.0
        return 2.0 * float(beat) * every

    def span(self, span_id: str) -> Optional[Span]:
        """The span with this id, or None."""
        for span in self.spans:
            if span.span_id == span_id:
                return span
        return None


class _BadRecordError(Exception):
    """A record that is valid JSON but not a valid journal record; the message says why."""


def _decode(raw: bytes) -> tuple[str, bool]:
    """A line as text, and whether undecodable bytes had to be replaced."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it does not fit one (``1e400`` would be infinity,
    which no JSON output can carry on)."""
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:24]} is out of range")
    return value


class JournalBuilder:
    """Turns records into a `Journal`, one line at a time (`reader.read_journal` feeds it a whole
    file, `reader.JournalTail` what a followed file has grown by)."""

    def __init__(self, path: str) -> None:
        self.journal = Journal(path=path)
        self._spans: dict[str, Span] = {}
        self._warned_versions: set[int] = set()
        self.ended: list[Span] = []  # spans whose end record was read, in file order (for JournalTail)
        self.spans_added = False

    # --- lines -----------------------------------------------------------------------------

    def feed_line(self, number: int, raw: bytes, *, is_unterminated_tail: bool = False) -> None:
        """Read one line. The unterminated tail is a record only if it parses; else it was cut short."""
        text, replaced = _decode(raw)
        if replaced and not is_unterminated_tail:
            self._problem(number, _NOT_UTF8)
        if not text.strip():
            if not is_unterminated_tail:
                self._problem(number, "empty line")
            return
        try:
            record = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        except json.JSONDecodeError as e:
            if is_unterminated_tail:
                self._problem(number, "truncated (incomplete last record)")
            else:
                self._problem(number, f"not JSON: {e.msg} (column {e.colno})")
            return
        except (ValueError, RecursionError) as e:
            self._problem(number, f"not JSON: {e if isinstance(e, ValueError) else 'nested too deeply'}")
            return
        if replaced and is_unterminated_tail:  # a whole record after all, just without its newline
            self._problem(number, _NOT_UTF8)
        try:
            self._feed_record(number, record)
        except _BadRecordError as e:
            self._problem(number, str(e))

    def finish(self) -> Journal:
        """The journal as read so far; may be called again after more lines (JournalTail)."""
        journal = self.journal
        if self.spans_added:
            journal.spans.sort(key=lambda span: span.start_ns)  # stable: file order breaks ties
            self.spans_added = False
        missing = "no 'process' span: the journal's first record is missing"
        if journal.spans and journal.root is None and missing not in journal.problems:
            journal.problems.append(missing)
        return journal

    def _problem(self, number: int, text: str) -> None:
        self.journal.problems.append(f"line {number}: {text}")

    # --- records ---------------------------------------------------------------------------

    def _feed_record(self, number: int, record: Any) -> None:
        if not isinstance(record, dict):
            raise _BadRecordError(f"not a record (a JSON {type(record).__name__}, not an object)")
        for key in ("v", "k", "ts"):
            if key not in record:
                raise _BadRecordError(f"record has no {key!r}")
        version = _int(record, "v")
        if version < 1:
            raise _BadRecordError(f"unknown format version {version}")
        if version > FORMAT_VERSION and version not in self._warned_versions:
            self._warned_versions.add(version)
            self._problem(
                number, f"format version {version} is newer than this reader ({FORMAT_VERSION}); reading what it can"
            )
        kind = record["k"]
        if kind not in KINDS:
            raise _BadRecordError(f"unknown record kind {_short(kind)}")
        for key in REQUIRED_FIELDS[kind]:
            if key not in record:
                raise _BadRecordError(f"{kind!r} record has no {key!r}")
        ts = _int(record, "ts")
        if not 0 <= ts <= _MAX_TS:
            raise _BadRecordError(f"'ts' out of range: {ts}")
        getattr(self, f"_on_{kind}")(number, ts, record)
        if kind != "stall":  # the watchdog's record, not the process's evidence
            self.journal.last_evidence_ns = ts

    def _on_start(self, number: int, ts: int, record: dict[str, Any]) -> None:
        span_id = _span_id(record, "span_id")
        parent_id = record.get("parent_id")
        if parent_id is not None:
            parent_id = _span_id(record, "parent_id")
            if parent_id == span_id:
                raise _BadRecordError(f"span {span_id} names itself as its parent")
        name = _str(record, "name")
        trace_id = _str(record, "trace_id")
        if not _TRACE_ID.fullmatch(trace_id) or trace_id == "0" * 32:
            raise _BadRecordError(f"'trace_id' is not 32 lowercase hex digits: {_short(trace_id)}")
        if span_id in self._spans:
            first = self._spans[span_id]
            raise _BadRecordError(
                f"duplicate start of span {span_id} ({_short(name)}); the first ({_short(first.name)}) is kept"
            )
        span = Span(
            name=name,
            span_id=span_id,
            parent_id=parent_id,
            trace_id=trace_id,
            start_ns=ts,
            attrs=self._attrs(number, record),
        )
        self._spans[span_id] = span
        self.journal.spans.append(span)
        self.spans_added = True
        if name == "process" and self.journal.root is None:
            self._take_process_facts(number, span, record)

    def _take_process_facts(self, number: int, span: Span, record: dict[str, Any]) -> None:
        journal = self.journal
        journal.root = span
        pid, ticks, config, sampled = (record.get(key) for key in ("pid", "start_ticks", "config", "sampled"))
        if _is_int(pid) and pid > 0:
            journal.pid = pid
        else:
            self._problem(number, f"process start has no valid 'pid': {_short(pid)}")
        if _is_int(ticks):
            journal.start_ticks = ticks
        elif ticks is not None:
            self._problem(number, f"process start has an invalid 'start_ticks': {_short(ticks)}")
        if isinstance(config, dict):
            journal.config = config
        elif config is not None:
            self._problem(number, f"process start has an invalid 'config': {_short(config)}")
        if isinstance(sampled, bool):
            journal.sampled = sampled
        stderr, stderr_path = record.get("stderr"), record.get("stderr_path")
        if isinstance(stderr, list) and len(stderr) == 2 and all(_is_int(v) for v in stderr):
            journal.stderr_id = (stderr[0], stderr[1])
        if isinstance(stderr_path, str) and stderr_path.startswith("/"):
            journal.stderr_path = stderr_path
        log, log_path = record.get("log"), record.get("log_path")
        if (
            isinstance(log, list)
            and len(log) == 2
            and all(_is_int(x) for x in log)
            and isinstance(log_path, str)
            and log_path.startswith("/")
        ):
            journal.log_id, journal.log_path = (log[0], log[1]), log_path
        elif record.get("log_pending") is True and isinstance(log_path, str) and log_path.startswith("/"):
            journal.log_path, journal.log_pending = log_path, True
        image = record.get("image")
        if isinstance(image, dict):
            journal.image = {
                key: value
                for key, value in image.items()
                if (key == "exe" and isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value))
                or (key != "exe" and _is_int(value))
            }

    def _on_end(self, number: int, ts: int, record: dict[str, Any]) -> None:
        span = self._known_span(record, "end")
        if not span.is_open:
            raise _BadRecordError(f"second end of span {span.span_id} ({_short(span.name)}); the first is kept")
        status = record.get("status")
        message = record.get("message")
        span.end_ns = max(ts, span.start_ns)
        span.message = message if isinstance(message, str) else None
        if status in ("ok", "error"):
            span.status = status
        else:
            span.status = "error"
            span.message = span.message or f"unknown end status {_short(status)}"
            self._problem(number, f"end of span {span.span_id} has unknown status {_short(status)}; read as error")
        span.attrs.update(self._attrs(number, record))
        self.ended.append(span)

    max_events: Optional[int] = None
    """Set by JournalTail: per span keep the first half and the latest half of this many events."""

    def _on_event(self, number: int, ts: int, record: dict[str, Any]) -> None:
        span = self._known_span(record, "event")
        span.events.append((ts, _str(record, "name"), self._attrs(number, record)))
        if self.max_events is not None and len(span.events) > self.max_events:
            del span.events[self.max_events // 2]
            span.attrs[EVENTS_DROPPED] = span.attrs.get(EVENTS_DROPPED, 0) + 1

    def _on_attrs(self, number: int, ts: int, record: dict[str, Any]) -> None:
        span = self._known_span(record, "attrs")
        attrs = self._attrs(number, record)
        span.attrs.update(attrs)
        if span is self.journal.root and attrs.get("lora_otel.log.copied") is False:
            # The process stopped copying lines to its --log (the program showed it is no path):
            # the watchdog must not write there either. Only ever taken away, never given.
            self.journal.log_id = self.journal.log_path = None
            self.journal.log_pending = False
        log_id = attrs.get("lora_otel.log.id")
        if (
            span is self.journal.root
            and self.journal.log_pending
            and isinstance(log_id, list)
            and len(log_id) == 2
            and all(_is_int(x) for x in log_id)
        ):
            # The file at the path of the first record, opened since: only its identity is taken
            # from this record (the path never is).
            self.journal.log_id, self.journal.log_pending = (log_id[0], log_id[1]), False

    def _on_beat(self, number: int, ts: int, record: dict[str, Any]) -> None:
        journal = self.journal
        steps = _int(record, "steps")
        if not 0 <= steps <= _MAX_TS:
            raise _BadRecordError(f"'steps' out of range: {_short(steps)}")
        last_step = record.get("last_step_ts")
        if last_step is not None and not _is_int(last_step):
            raise _BadRecordError(f"'last_step_ts' is not an integer: {_short(last_step)}")
        if last_step is not None and not 0 <= last_step <= _MAX_TS:
            raise _BadRecordError(f"'last_step_ts' out of range: {_short(last_step)}")
        journal.beats += 1
        journal.last_beat_ns = ts
        journal.steps = steps
        journal.last_step_ns = last_step
        journal.step_samples.append((ts, steps))
        if len(journal.step_samples) > STEP_SAMPLES:
            del journal.step_samples[0]
        metrics = record.get("metrics")
        if isinstance(metrics, dict):
            journal.metrics = metrics
        frames = _frames(record.get("main"))
        if frames is None or frames != journal.main_frames:
            journal.main_frames_since = ts if frames is not None else None
        journal.main_frames = frames
        journal.main_frames_ts = ts if frames is not None else None

    def _on_line(self, number: int, ts: int, record: dict[str, Any]) -> None:
        level = record.get("level")
        self.journal.lines.append(Line(ts, level if isinstance(level, str) else "info", _str(record, "msg")))

    def _on_exit(self, number: int, ts: int, record: dict[str, Any]) -> None:
        if self.journal.exit is not None and "corrects" not in record:
            raise _BadRecordError("second exit record; the first is kept")
        code, how, message = record.get("code"), record.get("how"), record.get("message")
        self.journal.exit = {
            "ts": ts,
            "code": code if _is_int(code) else None,
            "how": how if isinstance(how, str) else "normal",
            "message": message if isinstance(message, str) else None,
        }
        root = self.journal.root
        if "corrects" in record and root is not None and not root.is_open and _is_int(code):
            # `lora-otel run` saw another exit status than the process recorded: the root span too.
            root.status = "error" if code else "ok"
            root.message = self.journal.exit["message"]
            root.attrs["process.exit.code"] = code

    def _on_exec(self, number: int, ts: int, record: dict[str, Any]) -> None:
        if "error" in record:  # the attempt failed: the process goes on as it was
            self.journal.exec = None
            return
        path, argv, via = record.get("path"), record.get("argv"), record.get("via")
        self.journal.exec = {
            "ts": ts,
            "path": path if isinstance(path, str) else None,
            "argv": [a for a in argv if isinstance(a, str)] if isinstance(argv, list) else None,
            "via": via if isinstance(via, str) else None,
        }

    def _on_stall(self, number: int, ts: int, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind not in STALL_KINDS:
            raise _BadRecordError(f"'stall' record of unknown kind {_short(kind)}")
        span_id = record.get("span_id")
        if span_id is not None:
            _span_id(record, "span_id")
        stall = {key: value for key, value in record.items() if key not in ("v", "k")}
        for key in ("limit_s", "open_s"):
            if not isinstance(stall.get(key), (int, float)) or isinstance(stall.get(key), bool):
                stall[key] = None
        for key in ("stage", "diagnosis", "by", "advice"):
            if not isinstance(stall.get(key), str):
                stall[key] = None
        for key in ("evidence", "learned"):
            if not isinstance(stall.get(key), dict):
                stall[key] = None
        self.journal.stalls.append(stall)

    # --- fields ----------------------------------------------------------------------------

    def _known_span(self, record: dict[str, Any], kind: str) -> Span:
        span_id = _span_id(record, "span_id")
        span = self._spans.get(span_id)
        if span is None:
            raise _BadRecordError(f"{kind} for unknown span {span_id}")
        return span

    def _attrs(self, number: int, record: dict[str, Any]) -> dict[str, Any]:
        attrs = record.get("attrs")
        if attrs is None:
            return {}
        if not isinstance(attrs, dict):
            self._problem(number, f"'attrs' is not an object: {_short(attrs)}; ignored")
            return {}
        return attrs


def _frames(value: Any) -> Optional[list[list[Any]]]:
    """A beat's ``main``: a list of ``[file, line, function]``, or None when absent or malformed."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for frame in value[:16]:
        if not (
            isinstance(frame, list)
            and len(frame) == 3
            and isinstance(frame[0], str)
            and _is_int(frame[1])
            and isinstance(frame[2], str)
        ):
            return None
        out.append(list(frame))
    return out


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(record: dict[str, Any], key: str) -> int:
    value = record.get(key)
    if not _is_int(value):
        raise _BadRecordError(f"{key!r} is not an integer: {_short(value)}")
    return value


def _str(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise _BadRecordError(f"{key!r} is not a string: {_short(value)}")
    return value


def _span_id(record: dict[str, Any], key: str) -> str:
    value = _str(record, key)
    if not _SPAN_ID.fullmatch(value) or value == "0" * 16:
        raise _BadRecordError(f"{key!r} is not 16 lowercase hex digits: {_short(value)}")
    return value


def _short(value: Any, limit: int = 40) -> str:
    """``repr`` of a value from the journal, cut to ``limit`` characters for a problem line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
