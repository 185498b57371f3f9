"""Read a journal (docs/journal.md) into spans, tolerating whatever a crash or a disk left behind.

The reader never raises on bad content: a truncated last line, a corrupt line, an unknown record
kind, undecodable bytes, a duplicate span or an ``end`` for a span that never started are each
skipped and described in ``Journal.problems`` as one line naming the line number. Only a journal
that cannot be opened at all raises `JournalError`.

Standard library only: the exporting side may run in the same broken environment it diagnoses.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lora_otel._boot.seam import JOURNAL_SUFFIX

FORMAT_VERSION = 1
"""The journal format version this reader understands."""

STEP_SAMPLES = 300
EVENTS_DROPPED = "lora_otel.events.dropped"
"""Span attribute: how many events a `JournalTail` with ``max_events`` left out of the middle."""
KINDS = ("start", "end", "event", "attrs", "beat", "line", "exit", "exec", "stall")

_REQUIRED: dict[str, tuple[str, ...]] = {
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

ProcessState = Literal["exited", "running", "gone", "exec'd"]
SpanStatus = Literal["ok", "error", "unset"]


class JournalError(Exception):
    """The journal cannot be read at all (missing, a directory, no permission). One-line message."""


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
    record is the watchdog's, not the process's: it does not count).
    ``stalls``: the ``stall`` records the watchdog or sidecar appended, as dicts, in file order.
    ``log_id``/``log_path``: the ``--log`` file the process opened at start (identity, absolute
    path), from the ``process`` start record, or None.
    ``stderr_id``/``stderr_path``: what descriptor 2 was when the process started (``[st_dev,
    st_ino]``; its path when it was a regular file), from the ``process`` start record, or None.
    ``main_frames`` is where the main thread was at the last beat (its ``main``: ``[file, line,
    function]`` lists, outermost first, a C function called last as ``["", 0, "time.sleep"]``), or
    None when that beat had none; ``main_frames_ts`` is that beat's time. `where_text` says it.
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
    main_frames: Optional[list[list[Any]]] = None
    main_frames_ts: Optional[int] = None
    problems: list[str] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    """The ``stall`` records, in order, each as written (``ts`` an int, ``kind`` one of `STALL_KINDS`)."""
    stderr_id: Optional[tuple[int, int]] = None
    stderr_path: Optional[str] = None
    log_id: Optional[tuple[int, int]] = None
    log_path: Optional[str] = None

    @property
    def trace_id(self) -> Optional[str]:
        return self.root.trace_id if self.root is not None else None

    def span(self, span_id: str) -> Optional[Span]:
        """The span with this id, or None."""
        for span in self.spans:
            if span.span_id == span_id:
                return span
        return None


class _BadRecord(Exception):
    """A record that is valid JSON but not a valid journal record; the message says why."""


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read the journal at ``path``.

    Args:
        path: a journal file (``*.otel.jsonl``).

    Returns:
        The journal; every line that could not be used is described in ``problems``.

    Raises:
        JournalError: the file cannot be read (missing, a directory, no permission).
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _read_error(path, e) from None
    builder = _JournalBuilder(path)
    raw_lines = data.split(b"\n")
    # A journal ends with a newline; whatever follows the last one is a partly written record.
    tail = raw_lines.pop()
    for number, raw in enumerate(raw_lines, start=1):
        builder.feed_line(number, raw)
    if tail:
        builder.feed_line(len(raw_lines) + 1, tail, is_unterminated_tail=True)
    return builder.finish()


class JournalTail:
    """Read a growing journal incrementally: each `read` parses only the bytes added since the last.

    ``max_events``: keep at most this many events per span in memory (the first half and the
    latest half; the count left out is the span attribute ``lora_otel.events.dropped``), as the
    OpenTelemetry SDK's span limits do (128 by default).

    For followers (the sidecar, ``watch``) that poll a long job's journal every fraction of a second;
    `read_journal` would re-parse the whole file each time. The journal returned is the same object
    each time, updated in place; a partly written last line is kept back until its newline arrives.

    The file stays open between reads, and it is that file that is followed, not the name: renamed
    by a log rotation (``mv run.log.otel.jsonl run.log.otel.jsonl.1``), it is still the file the
    writer appends to. Only when the open file has no name left (deleted, or another file moved
    onto its name) does a file now at ``path`` replace it, read from the top. If it is cut short in
    place (copytruncate), reading goes on from its new start, keeping the spans already read, and
    ``problems`` says so. `close` releases the file.
    """

    CHUNK = 1 << 20

    def __init__(self, path: str | os.PathLike[str], max_events: Optional[int] = None) -> None:
        self.path = os.fspath(path)
        self.max_events = max_events
        self._file: Optional[Any] = None
        self._restart()

    def _restart(self) -> None:
        self._builder = _JournalBuilder(self.path)
        self._builder.max_events = self.max_events
        self._offset = 0
        self._pending = b""
        self._number = 0

    def _current_file(self) -> Any:
        """The open file to read; opened at the first read, replaced only once it has no name left."""
        f = self._file
        if f is None:
            f = self._file = open(self.path, "rb")
        elif os.fstat(f.fileno()).st_nlink == 0:
            try:
                new = open(self.path, "rb")
            except FileNotFoundError:
                return f  # deleted: what the writer still appends to it
            f.close()
            f = self._file = new
            self._restart()  # another file now has the name: read it from the top
        return f

    def read(self) -> Journal:
        """The journal as it stands now. Raises `JournalError` like `read_journal`."""
        try:
            f = self._current_file()
            st = os.fstat(f.fileno())
            if st.st_size < self._offset:
                # Cut short under the writer (logrotate's copytruncate, ``: > file``): the writer
                # appends at the new end, so read from the top again, keeping what was read
                # (open spans still end, nothing read is exported twice).
                self._builder.journal.problems.append(
                    f"the file was cut short while being followed ({self._offset} bytes read, "
                    f"{st.st_size} now): records written before the cut are gone from it"
                )
                self._offset, self._pending = 0, b""
            f.seek(self._offset)
            while True:
                data = f.read(self.CHUNK)
                if not data:
                    break
                self._offset += len(data)
                self._feed(data)
        except OSError as e:
            raise _read_error(self.path, e) from None
        return self._builder.finish()

    def close(self) -> None:
        """Release the open file (a later `read` opens ``path`` again, from where it was)."""
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the file may be half torn down
            pass

    def take_ended(self) -> list[Span]:
        """The spans whose end record was read since the last call, in file order."""
        ended, self._builder.ended = self._builder.ended, []
        return ended

    def forget(self, span_ids: set[str]) -> None:
        """Drop these (ended, already handled) spans from memory, so a follower of a long job stays small.

        A later record naming a forgotten span is reported in ``problems`` like any unknown span.
        """
        if not span_ids:
            return
        for span_id in span_ids:
            self._builder._spans.pop(span_id, None)
        journal = self._builder.journal
        journal.spans = [span for span in journal.spans if span.span_id not in span_ids]

    def _feed(self, data: bytes) -> None:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        for raw in lines:
            self._number += 1
            self._builder.feed_line(self._number, raw)


def _read_error(path: str, e: OSError) -> JournalError:
    """The one-line `JournalError` for a journal that cannot be read."""
    if isinstance(e, FileNotFoundError):
        return JournalError(f"{path}: no such file")
    if isinstance(e, IsADirectoryError):
        return JournalError(f"{path}: is a directory, not a journal file")
    if isinstance(e, PermissionError):
        return JournalError(f"{path}: permission denied")
    return JournalError(f"{path}: cannot read: {e.strerror or e}")


def process_state(journal: Journal) -> ProcessState:
    """Whether the journal's process has ``"exited"``, is ``"running"``, is ``"gone"`` or has
    ``"exec'd"`` (become another program: it is no longer the one the journal traces).

    ``exited``: the journal has an ``exit`` record. ``exec'd``: an ``exec`` record, or the process
    still runs but its image changed (`image_changed`: an exec done outside Python). ``running``:
    ``/proc/<pid>/stat`` exists and its start time equals the journal's ``start_ticks`` (so a
    re-used pid does not count); when ``start_ticks`` is null (no ``/proc``), any process with that
    pid counts. ``gone`` otherwise.
    """
    if journal.exit is not None:
        return "exited"
    if journal.exec is not None:
        return "exec'd"
    pid = journal.pid
    if pid is None or pid <= 0:
        return "gone"
    if journal.start_ticks is None:
        return "running" if _pid_exists(pid) else "gone"
    ticks = _read_start_ticks(pid)
    if ticks is None or ticks != journal.start_ticks:
        return "gone"
    return "exec'd" if image_changed(journal) else "running"


def image_changed(journal: Journal) -> bool:
    """Whether the journal's (running) process now runs another program than the one it recorded.

    Compares ``/proc/<pid>/exe`` (device, inode) and the fingerprint of ``/proc/<pid>/auxv`` (set
    at each exec, never changed after) with the ``image`` of the process start record. Only where
    auxv cannot be compared, the fingerprint of ``/proc/<pid>/cmdline`` (a program may rewrite its
    command line, as ``setproctitle`` does, without any exec). A fact missing on either side proves
    nothing: False.
    """
    recorded = journal.image
    if not recorded or journal.pid is None:
        return False
    from lora_otel._boot.seam import image_identity

    now = image_identity(journal.pid)
    if "exe" in recorded and "exe" in now and list(recorded["exe"]) != now["exe"]:
        return True
    if "auxv" in recorded and "auxv" in now:
        return bool(recorded["auxv"] != now["auxv"])
    return "cmdline" in recorded and "cmdline" in now and recorded["cmdline"] != now["cmdline"]


def exec_phrase(journal: Journal) -> str:
    """``exec'd into /bin/sleep``: what the process became (the exec record's path; for an exec
    done outside Python, what ``/proc/<pid>/exe`` names while it runs)."""
    exec_ = journal.exec
    target = exec_.get("path") if exec_ is not None else None
    if not target and journal.pid:
        try:
            target = os.readlink(f"/proc/{journal.pid}/exe")
        except OSError:
            target = None
    return f"exec'd into {target}" if target else "exec'd into another program"


def start_ticks_from_stat(stat: str) -> Optional[int]:
    """Field 22 (start time in clock ticks) of a ``/proc/<pid>/stat`` line, or None if malformed.

    Field 2 is ``(comm)``, which may itself contain spaces and parentheses, so the fields are
    counted from after the *last* ``)``.
    """
    _, paren, rest = stat.rpartition(")")
    fields = rest.split()
    # rest starts at field 3 (state); field 22 is the 20th from there.
    if not paren or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def format_duration(ns: int) -> str:
    """A short human duration: ``14 ms``, ``2.31 s``, ``12.3 s``, ``312 s``. Negative counts as 0."""
    seconds = max(ns, 0) / 1e9
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    ms = seconds * 1000
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms:.2g} ms"


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it exists, it is just not ours
    except (OSError, OverflowError):
        return False
    return True


def _read_start_ticks(pid: int) -> Optional[int]:
    """The process's start time in ticks; None when it is gone or a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    state = stat.rpartition(")")[2].split()[:1]
    if state and state[0] in ("Z", "X", "x"):
        return None
    return start_ticks_from_stat(stat)


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


class _JournalBuilder:
    """Turns records into a `Journal`, one line at a time."""

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
        except _BadRecord as e:
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
            raise _BadRecord(f"not a record (a JSON {type(record).__name__}, not an object)")
        for key in ("v", "k", "ts"):
            if key not in record:
                raise _BadRecord(f"record has no {key!r}")
        version = _int(record, "v")
        if version < 1:
            raise _BadRecord(f"unknown format version {version}")
        if version > FORMAT_VERSION and version not in self._warned_versions:
            self._warned_versions.add(version)
            self._problem(
                number, f"format version {version} is newer than this reader ({FORMAT_VERSION}); reading what it can"
            )
        kind = record["k"]
        if kind not in KINDS:
            raise _BadRecord(f"unknown record kind {_short(kind)}")
        for key in _REQUIRED[kind]:
            if key not in record:
                raise _BadRecord(f"{kind!r} record has no {key!r}")
        ts = _int(record, "ts")
        if not 0 <= ts <= _MAX_TS:
            raise _BadRecord(f"'ts' out of range: {ts}")
        getattr(self, f"_on_{kind}")(number, ts, record)
        if kind != "stall":  # the watchdog's record, not the process's evidence
            self.journal.last_evidence_ns = ts

    def _on_start(self, number: int, ts: int, record: dict[str, Any]) -> None:
        span_id = _span_id(record, "span_id")
        parent_id = record.get("parent_id")
        if parent_id is not None:
            parent_id = _span_id(record, "parent_id")
            if parent_id == span_id:
                raise _BadRecord(f"span {span_id} names itself as its parent")
        name = _str(record, "name")
        trace_id = _str(record, "trace_id")
        if not _TRACE_ID.fullmatch(trace_id) or trace_id == "0" * 32:
            raise _BadRecord(f"'trace_id' is not 32 lowercase hex digits: {_short(trace_id)}")
        if span_id in self._spans:
            first = self._spans[span_id]
            raise _BadRecord(
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
            raise _BadRecord(f"second end of span {span.span_id} ({_short(span.name)}); the first is kept")
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
        span.attrs.update(self._attrs(number, record))

    def _on_beat(self, number: int, ts: int, record: dict[str, Any]) -> None:
        journal = self.journal
        steps = _int(record, "steps")
        if not 0 <= steps <= _MAX_TS:
            raise _BadRecord(f"'steps' out of range: {_short(steps)}")
        last_step = record.get("last_step_ts")
        if last_step is not None and not _is_int(last_step):
            raise _BadRecord(f"'last_step_ts' is not an integer: {_short(last_step)}")
        if last_step is not None and not 0 <= last_step <= _MAX_TS:
            raise _BadRecord(f"'last_step_ts' out of range: {_short(last_step)}")
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
        journal.main_frames = _frames(record.get("main"))
        journal.main_frames_ts = ts if journal.main_frames is not None else None

    def _on_line(self, number: int, ts: int, record: dict[str, Any]) -> None:
        level = record.get("level")
        self.journal.lines.append(Line(ts, level if isinstance(level, str) else "info", _str(record, "msg")))

    def _on_exit(self, number: int, ts: int, record: dict[str, Any]) -> None:
        if self.journal.exit is not None and "corrects" not in record:
            raise _BadRecord("second exit record; the first is kept")
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
            raise _BadRecord(f"'stall' record of unknown kind {_short(kind)}")
        span_id = record.get("span_id")
        if span_id is not None:
            _span_id(record, "span_id")
        stall = {key: value for key, value in record.items() if key not in ("v", "k")}
        for key in ("limit_s", "open_s"):
            if not isinstance(stall.get(key), (int, float)) or isinstance(stall.get(key), bool):
                stall[key] = None
        for key in ("stage", "diagnosis", "by"):
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
            raise _BadRecord(f"{kind} for unknown span {span_id}")
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


def where_text(frames: Optional[list[list[Any]]]) -> str:
    """``toolkit/job.py:2 in <module> → time.sleep``: where the main thread is, innermost last
    (a C function it calls, by name). Every view says it this way; "" for no frames."""
    from lora_otel._boot.seam import frames_text as text

    return text(frames)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(record: dict[str, Any], key: str) -> int:
    value = record.get(key)
    if not _is_int(value):
        raise _BadRecord(f"{key!r} is not an integer: {_short(value)}")
    return value


def _str(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise _BadRecord(f"{key!r} is not a string: {_short(value)}")
    return value


def _span_id(record: dict[str, Any], key: str) -> str:
    value = _str(record, key)
    if not _SPAN_ID.fullmatch(value) or value == "0" * 16:
        raise _BadRecord(f"{key!r} is not 16 lowercase hex digits: {_short(value)}")
    return value


def _short(value: Any, limit: int = 40) -> str:
    """``repr`` of a value from the journal, cut to ``limit`` characters for a problem line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def journal_paths(directory: str) -> list[str]:
    """The ``*.otel.jsonl`` files directly in ``directory`` (not recursive), sorted."""
    pattern = os.path.join(glob.escape(directory), "*" + JOURNAL_SUFFIX)
    return sorted(path for path in glob.glob(pattern) if os.path.isfile(path))


def sibling_journals(journal: Journal) -> list[Journal]:
    """The readable journals beside ``journal`` (its directory), itself left out."""
    own = os.path.abspath(journal.path)
    out = []
    for path in journal_paths(os.path.dirname(own)):
        if os.path.abspath(path) == own:
            continue
        try:
            out.append(read_journal(path))
        except JournalError:
            continue
    return out
