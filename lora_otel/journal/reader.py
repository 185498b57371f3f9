"""Read journals (docs/journal.md): a whole file (`read_journal`), a growing one (`JournalTail`),
the journals of a directory, and whether the process a journal traces still runs (`process_state`).

The reader never raises on bad content: a truncated last line, a corrupt line, an unknown record
kind, undecodable bytes, a duplicate span or an ``end`` for a span that never started are each
skipped and described in ``Journal.problems`` as one line naming the line number. Only a journal
that cannot be opened at all raises `JournalError`.

The records themselves — their kinds, their checks, the `Journal`/`Span`/`Line` model they build —
are `lora_otel.journal.records`'s; the model is re-exported here, where every view imports it.

Standard library only: the exporting side may run in the same broken environment it diagnoses.
"""

from __future__ import annotations

import glob
import os
import stat
from typing import Any, Literal, Optional

from lora_otel._boot.seam import JOURNAL_SUFFIX, duration
from lora_otel.journal.records import (
    EVENTS_DROPPED,
    FORMAT_VERSION,
    KINDS,
    STALL_KINDS,
    STEP_SAMPLES,
    Journal,
    JournalBuilder,
    Line,
    Span,
    SpanStatus,
)

__all__ = [
    "EVENTS_DROPPED",
    "FORMAT_VERSION",
    "KINDS",
    "STALL_KINDS",
    "STEP_SAMPLES",
    "Journal",
    "JournalError",
    "JournalTail",
    "Line",
    "ProcessState",
    "Span",
    "SpanStatus",
    "exec_phrase",
    "format_duration",
    "image_changed",
    "journal_paths",
    "left_out_line",
    "listed_journals",
    "pid_runs",
    "process_state",
    "read_journal",
    "sibling_journals",
    "start_ticks_from_stat",
    "where_text",
]

ProcessState = Literal["exited", "running", "gone", "exec'd"]

MAX_LINE = 64 << 20
"""The longest line read (64 MiB): lora_otel writes none near that long. A file with a longer one is
not a journal (a sparse file of zeros, 100 GB that cost its maker no disk, planted under a journal's
name in a shared directory): what follows that line's start is not read, nor kept in memory."""
OVERLONG = "a line longer than %d MiB: not a journal's; the rest of the file is not read" % (MAX_LINE >> 20)


class JournalError(Exception):
    """The journal cannot be read at all (missing, a directory, no permission). One-line message."""


def read_journal(path: str | os.PathLike[str], owner: Optional[int] = None) -> Journal:
    """Read the journal at ``path``.

    Args:
        path: a journal file (``*.otel.jsonl``).
        owner: for a name found by listing a directory (`listed_journals`): read it only when it is
            a regular file of this uid, never through a symlink (``O_NOFOLLOW``; the check is made
            on the opened file, so a name swapped since the listing is refused too).

    Returns:
        The journal; every line that could not be used is described in ``problems``.

    Raises:
        JournalError: the file cannot be read (missing, a directory, no permission).
    """
    path = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO named like a journal must not block the open; then only a regular
        # file is read (a FIFO, /dev/zero or a device would hang or fill memory).
        nofollow = getattr(os, "O_NOFOLLOW", 0) if owner is not None else 0
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | nofollow)
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise JournalError(f"{path}: not a regular file")
            if owner is not None and st.st_uid != owner:
                raise JournalError(f"{path}: not a file of uid {owner}'s")
            data, overlong = _read_bounded(f)
    except OSError as e:
        raise _read_error(path, e) from None
    builder = JournalBuilder(path)
    builder.journal.touched_ns = st.st_mtime_ns
    if overlong:
        builder.journal.problems.append(OVERLONG)
    raw_lines = data.split(b"\n")
    # A journal ends with a newline; whatever follows the last one is a partly written record.
    tail = raw_lines.pop()
    for number, raw in enumerate(raw_lines, start=1):
        builder.feed_line(number, raw)
    if tail:
        builder.feed_line(len(raw_lines) + 1, tail, is_unterminated_tail=True)
    return builder.finish()


def _read_bounded(f: Any) -> tuple[bytes, bool]:
    """``(data, overlong)``: the whole file, or, where a line passes `MAX_LINE`, what precedes that
    line (overlong True), reading no further: memory and time bounded by what was really written."""
    parts: list[bytes] = []
    since = 0  # bytes since the last newline
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            return b"".join(parts), False
        nl = chunk.rfind(b"\n")
        since = since + len(chunk) if nl < 0 else len(chunk) - nl - 1
        parts.append(chunk)
        if since > MAX_LINE:
            data = b"".join(parts)
            return data[: data.rfind(b"\n") + 1], True


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

    def __init__(self, path: str | os.PathLike[str], max_events: Optional[int] = None, nofollow: bool = False) -> None:
        """``nofollow``: never open ``path`` through a symlink (a name found in a directory others
        can write to, which ``watch DIR`` follows)."""
        self.path = os.fspath(path)
        self.max_events = max_events
        self.nofollow = nofollow
        self._file: Optional[Any] = None
        self._restart()

    def _restart(self) -> None:
        self._builder = JournalBuilder(self.path)
        self._builder.max_events = self.max_events
        self._offset = 0
        self._pending = b""
        self._number = 0
        self._overlong = False

    def _current_file(self) -> Any:
        """The open file to read; opened at the first read, replaced only once it has no name left."""
        f = self._file
        from lora_otel._boot.seam import files

        flags = os.O_RDONLY | (files.O_NOFOLLOW if self.nofollow else 0)
        if f is None:  # (never a FIFO's open that waits for a writer; only a regular file)
            f = self._file = open(files.open_regular(self.path, flags), "rb")  # noqa: SIM115 - kept open between reads
        elif os.fstat(f.fileno()).st_nlink == 0:
            try:
                new = open(files.open_regular(self.path, flags), "rb")  # noqa: SIM115 - becomes self._file, kept open
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
            while not self._overlong:
                data = f.read(self.CHUNK)
                if not data:
                    break
                self._offset += len(data)
                self._feed(data)
            self._builder.journal.touched_ns = st.st_mtime_ns  # taken before the read: never too late
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
        if len(self._pending) > MAX_LINE:  # not a journal (`MAX_LINE`): read no further
            self._pending, self._overlong = b"", True
            self._builder.journal.problems.append(OVERLONG)


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
    """A short human duration: ``14 ms``, ``2.31 s``, ``12.3 s``, ``312 s`` (`seam.duration`, the one
    way every view and the job's own lines write one). Negative counts as 0."""
    return duration(max(ns, 0) / 1e9)


def pid_runs(pid: int, start_ticks: Optional[int]) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``start_ticks`` (a re-used pid
    does not count; a zombie does not run). Without ``start_ticks`` (no ``/proc``), any process
    with that pid counts."""
    if start_ticks is None:
        return _pid_exists(pid)
    return _read_start_ticks(pid) == start_ticks


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


def where_text(frames: Optional[list[list[Any]]]) -> str:
    """``toolkit/job.py:2 in <module> → time.sleep``: where the main thread is, innermost last
    (a C function it calls, by name). Every view says it this way; "" for no frames."""
    from lora_otel._boot.seam import frames_text as text

    return text(frames)


def journal_paths(directory: str) -> list[str]:
    """The ``*.otel.jsonl`` files directly in ``directory`` (not recursive), sorted."""
    pattern = os.path.join(glob.escape(directory), "*" + JOURNAL_SUFFIX)
    return sorted(path for path in glob.glob(pattern) if os.path.isfile(path))


def listed_journals(directory: str, owner: Optional[int] = None) -> tuple[list[str], int]:
    """``(paths, left_out)``: the ``*.otel.jsonl`` names directly in ``directory`` (not recursive)
    that are regular files of ``owner`` (default: this user), sorted, and how many other names of
    that form there are (another user's files, symlinks, FIFOs, directories), never opened.

    In a directory others can write to (a shared ``LORA_OTEL_DIR``, ``/tmp``) anyone can put a file
    under a journal's name: thousands of empty ones (each a "process gone", a line each), a symlink
    to a file only this user may read (root's ``inspect`` showed ``/etc/shadow``'s first line as
    "not JSON"), a FIFO. ``inspect DIR``, ``report DIR`` and ``watch DIR`` read only what this
    listing keeps, with ``read_journal(path, owner)``; a journal named on the command line is read
    whoever owns it. One `lstat` per name, streamed (`os.scandir`): 100,000 names cost no
    list of them all. Raises OSError when the directory cannot be listed."""
    owner = os.geteuid() if owner is None else owner
    kept: list[str] = []
    left_out = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.endswith(JOURNAL_SUFFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            if stat.S_ISREG(st.st_mode) and st.st_uid == owner:
                kept.append(entry.path)
            else:
                left_out += 1
    return sorted(kept), left_out


def left_out_line(left_out: int) -> str:
    """The one line for `listed_journals`'s ``left_out``: ``ignored 3 files named *.otel.jsonl that
    are not this user's (another user's, a symlink, a FIFO)``."""
    files = f"{left_out} file{'s' if left_out != 1 else ''} named *{JOURNAL_SUFFIX}"
    return (
        f"ignored {files} that {'are' if left_out != 1 else 'is'} not this user's (another user's, a symlink, a FIFO)"
    )


def sibling_journals(journal: Journal) -> list[Journal]:
    """The readable journals beside ``journal`` (its directory), itself left out: only regular files
    of the same owner as ``journal`` (`listed_journals`), so a file another user put beside it in a
    shared directory is never read as one of its job's."""
    own = os.path.abspath(journal.path)
    try:
        owner = os.stat(own).st_uid
        paths, _ = listed_journals(os.path.dirname(own), owner)
    except OSError:
        return []
    out = []
    for path in paths:
        if os.path.abspath(path) == own:
            continue
        try:
            out.append(read_journal(path, owner))
        except JournalError:
            continue
    return out
