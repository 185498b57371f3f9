"""The local watchdog: stalls, evidence and diagnoses for a job with no collector.

The sidecar (`lora_otel.export.sidecar`) runs this for every job (``LORA_OTEL=1``) when no OTLP
endpoint is configured. It never imports the OpenTelemetry SDK. For each journal of the job it:

- detects stalls with `stall.detect` under the limits the job recorded (and the limits it learned
  from earlier runs, `lora_otel.analysis.learned`), gathers the evidence (`evidence.gather`: the
  verified stack request, /proc, NVML) and diagnoses it (`diagnose.explain`);
- appends one ``stall`` record to the job's journal (the same record the live follower appends,
  so ``inspect``, ``watch``, ``replay`` and a later export see the same stall);
- speaks for the job when it cannot: a ``STALLED: …`` line for a frozen process or a stall only a
  learned limit calls, a ``… is slow`` line (``import torch: 30 s so far, usually 2.4 s over the
  last 5 runs``), and how a process that vanished without an exit record died — to the job's
  ``--log`` file and its stderr (`JobLines`), never holding either open between writes.

Standard library plus the analysis modules; nothing here waits on the network.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

from lora_otel.analysis.ends import ChildEnd, child_ends, describe_end, end_of
from lora_otel.analysis.learned import Learned, learn
from lora_otel.analysis.oom import OomWatch
from lora_otel.analysis.stall import Stall, detect, journal_limits
from lora_otel.journal.reader import Journal, JournalTail, process_state

if TYPE_CHECKING:
    from lora_otel.analysis.diagnose import Diagnosis
    from lora_otel.analysis.evidence import StackAsker, StackRequest

# Gathering evidence and diagnosing (`lora_otel.analysis.evidence`, `.diagnose` and what they load)
# are imported at a job's first stall, not before: most jobs never stall, and the sidecar's resident
# size is charged to the job's memory cgroup for its whole life (docs/performance.md, "Memory a
# traced job adds").

EVIDENCE_TEXT_MAX = 200  # a value longer than this stays out of the stall record's summary


def owned_file_reason(path: str) -> str:
    """Why the watchdog will not read or append to ``path`` ("" when it will): it must be reached
    without a symlink at its last component (``O_NOFOLLOW``) and be a regular file owned by this
    user (the job's: the sidecar runs as the job's user) that nobody else can write. A journal or
    registry that another local user planted in a shared directory is never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        return "%s is a symlink" % path if e.errno == 40 else "%s: %s" % (path, e.strerror or e)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file" % path
    if st.st_uid != os.geteuid():
        return "%s belongs to uid %d, not to the job's user (uid %d)" % (path, st.st_uid, os.geteuid())
    if st.st_mode & 0o022:
        return "%s is writable by other users (mode %o)" % (path, st.st_mode & 0o777)
    return ""


# --- the stall record ----------------------------------------------------------------------------


def evidence_summary(evidence: dict[str, Any]) -> dict[str, Any]:
    """The evidence, flat and short: scalar facts without the ``lora_otel.evidence.`` prefix; stacks
    and other long texts stay out (the stacks file has them)."""
    from lora_otel.analysis.evidence import PREFIX

    out: dict[str, Any] = {}
    for key, value in evidence.items():
        name = key[len(PREFIX) :] if key.startswith(PREFIX) else key
        if name.endswith("python.stacks") or name.startswith("rank."):
            continue
        if isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= EVIDENCE_TEXT_MAX):
            out[name] = value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            text = ", ".join(value[:4])
            out[name] = text if len(text) <= EVIDENCE_TEXT_MAX else text[: EVIDENCE_TEXT_MAX - 1] + "\u2026"
    return out


def stall_record(
    stall: Stall,
    diagnosis: str,
    evidence: dict[str, Any],
    by: str,
    now_ns: int,
    ages: Optional[list[list[int]]] = None,
    advice: str = "",
) -> dict[str, Any]:
    """The journal's ``stall`` record for ``stall`` (see docs/journal.md); ``ages``: where the
    diagnosis's growing durations are (`lora_otel.analysis.ages`); ``advice``: what to do
    (`Diagnosis.advice`), kept only when there is one."""
    no_stage = stall.kind == "between" or (stall.span.parent_id is None and stall.span.name == "process")
    evidence = evidence_summary(evidence)
    if stall.kind == "between" and stall.after:
        evidence["last_stage"] = stall.after
    learned = stall.learned
    record = {
        "v": 1,
        "k": "stall",
        "ts": now_ns,
        "span_id": None if no_stage else stall.span.span_id,
        "stage": stall.stage,
        "kind": stall.kind,
        "limit_s": round(float(stall.limit_s), 3),
        "open_s": round(float(stall.open_for_s), 3),
        "learned": learned.to_json() if isinstance(learned, Learned) else None,
        "evidence": evidence,
        "diagnosis": diagnosis,
        "by": by,
    }
    if stall.limit_why:
        record["limit_why"] = stall.limit_why
    if ages:
        record["ages"] = ages
    if advice:
        record["advice"] = advice
    return record


def append_record(journal_path: str, record: dict[str, Any]) -> str:
    """Append ``record`` to the journal (``O_APPEND``, one ``os.write``), only when the journal is
    the job user's regular file nobody else can write; "" when written, else why not.

    The file's modification time is left as it was: it is the job's sign of life (a beat that
    writes no record touches it, docs/journal.md), which the watchdog's own record must not fake."""
    why = owned_file_reason(journal_path)
    if why:
        return why
    data = (json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode(
        "utf-8", "backslashreplace"
    )
    try:
        fd = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        return "%s: %s" % (journal_path, e.strerror or e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return "%s is not the job user's regular file" % journal_path
        os.write(fd, data)
        try:
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            pass  # the record is written; the time is only a little later than the job's
    except OSError as e:
        return "%s: %s" % (journal_path, e.strerror or e)
    finally:
        os.close(fd)
    return ""


# --- lines for the job ---------------------------------------------------------------------------


def _iso_ms(ns: int) -> str:
    from lora_otel._boot.seam import iso_time

    return iso_time(ns)


def format_line(pid: int, msg: str, now_ns: Optional[int] = None) -> str:
    """``[lora-otel][<pid>][<time>] msg``: the job's own line format, with its pid; ``msg`` on one
    line, its control characters escaped as the job's own lines have them (`seam.printable`)."""
    from lora_otel._boot.seam import printable, redact_text

    msg = printable(redact_text(" ".join(str(msg).splitlines())))
    return "[lora-otel][%d][%s] %s\n" % (pid, _iso_ms(time.time_ns() if now_ns is None else now_ns), msg)


def log_path(journal: Journal) -> Optional[str]:
    """The job's ``--log`` file (absolute) as the process recorded it in its first record, or None.

    Not the root span's ``lora_otel.log.path`` attribute: a later ``attrs`` record can say anything
    (a process that dropped root still holds its journal's descriptor), and the watchdog may run as
    the user the job started as."""
    return journal.log_path if journal.log_id is not None else None


def _write_checked(
    path: str, data: bytes, *, follow: bool, ident: Optional[tuple[int, int]] = None
) -> Optional[tuple[int, int]]:
    """Open ``path`` for appending, check it, write once, close. ``follow``: ``path`` is a
    /proc/<pid>/fd link (followed on purpose; ``ident`` must match), else ``O_NOFOLLOW`` and only
    a regular file of this user's. Returns the file's ``(st_dev, st_ino)`` when written."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        got = (st.st_dev, st.st_ino)
        if ident is not None and got != tuple(ident):
            return None
        if not follow and (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()):
            return None
        os.write(fd, _own_line(path, st, data))
        return got
    except OSError:
        return None
    finally:
        os.close(fd)


def _own_line(path: str, st: os.stat_result, data: bytes) -> bytes:
    """``data`` with a newline first when the regular file at ``path`` ends mid-line (a progress
    bar's unfinished ``\r`` line): our line is never glued onto it."""
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return data
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return data
    try:
        same = os.fstat(fd)
        if (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):
            return data
        return data if os.pread(fd, 1, st.st_size - 1) == b"\n" else b"\n" + data
    except OSError:
        return data
    finally:
        os.close(fd)


_PIDFD_GETFD = 438  # the syscall's number on x86_64 and arm64 alike (the generic table)


def _positioned_file(pid: int, fd: int) -> bool:
    """Whether the process's ``fd`` is a regular file opened without ``O_APPEND``."""
    try:
        if not stat.S_ISREG(os.stat("/proc/%d/fd/%d" % (pid, fd)).st_mode):
            return False
        with open("/proc/%d/fdinfo/%d" % (pid, fd), "rb") as f:
            for line in f:
                if line.startswith(b"flags:"):
                    return not int(line.split()[1], 8) & os.O_APPEND
    except (OSError, ValueError, IndexError):
        return False
    return False


def _write_shared(pid: int, fd: int, data: bytes, ident: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """Write ``data`` through the process's own open file (``pidfd_getfd``, Linux 5.6, where ptrace
    is allowed), at the position it shares with the process; None (nothing written) where that
    cannot be had: the line then goes to the ``--log`` file only, never over the job's output."""
    import ctypes

    pidfd = dup = -1
    try:
        pidfd = os.pidfd_open(pid)
        libc = ctypes.CDLL(None, use_errno=True)
        dup = int(libc.syscall(_PIDFD_GETFD, pidfd, fd, 0))
        if dup < 0:
            return None
        st = os.fstat(dup)
        got = (st.st_dev, st.st_ino)
        if ident is not None and got != tuple(ident):
            return None
        os.write(dup, data)
        return got
    except (OSError, AttributeError, ValueError):
        return None
    finally:
        for one in (dup, pidfd):
            if one >= 0:
                os.close(one)


StderrHint = tuple[Optional[tuple[int, int]], Optional[str]]
"""``((st_dev, st_ino), path or None)``: what the job's stderr was, when its journal does not say."""


class JobLines:
    """Lines written for a job that cannot write them itself: to its ``--log`` file (by path) and
    its stderr (``/proc/<pid>/fd/2`` while it lives and is still the stderr the journal recorded,
    else by path when it was a regular file). Each write opens, writes once and closes: a launcher
    reading the job's pipe sees end-of-file the moment the job exits.

    ``stderr_hint``: ``((st_dev, st_ino), path or None)`` the sidecar was told at start, for a
    journal that does not record its stderr itself."""

    def __init__(self, stderr_hint: Optional[StderrHint] = None) -> None:
        self.stderr_hint = stderr_hint

    def _stderr(self, journal: Journal) -> StderrHint:
        if journal.stderr_id is not None:
            return journal.stderr_id, journal.stderr_path
        if self.stderr_hint is not None:
            return self.stderr_hint
        return None, None

    def say(self, journal: Journal, msg: str, alive: bool) -> list[str]:
        """Write one line; returns where it went (for the sidecar's log)."""
        if journal.pid is None:
            return []
        data = format_line(journal.pid, msg).encode("utf-8", "backslashreplace")
        went: list[str] = []
        written: set[tuple[int, int]] = set()
        ident, path = self._stderr(journal)
        if ident:
            got = None
            if alive and _positioned_file(journal.pid, 2):
                # A regular file the job writes at its own position (``2> file``, not ``2>>``): a line
                # appended by another open would be written over by the job's next write. Through the
                # job's own descriptor (pidfd_getfd) the position is shared, as if the job wrote it.
                got = _write_shared(journal.pid, 2, data, ident)
            elif alive:
                got = _write_checked("/proc/%d/fd/2" % journal.pid, data, follow=True, ident=ident)
            if got is None and path:
                got = _write_checked(path, data, follow=False, ident=ident)
            if got is not None:
                written.add(got)
                went.append("stderr")
        log = log_path(journal)
        if log:
            try:
                st = os.stat(log, follow_symlinks=False)
                same = (st.st_dev, st.st_ino) in written
            except OSError:
                same = True  # gone: nothing to append to
            if not same and _write_checked(log, data, follow=False, ident=journal.log_id) is not None:
                went.append(log)
        elif journal.log_pending and journal.log_path:
            if _create_log(journal, data):
                went.append(journal.log_path)
            else:
                # The job made the file a moment ago and its record of it is not read yet: the file
                # the job holds open at that path is its log (never one that someone else put there).
                ident = _held_by(journal.pid, journal.log_path)
                if ident is not None and _write_checked(journal.log_path, data, follow=False, ident=ident):
                    journal.log_id, journal.log_pending = ident, False
                    went.append(journal.log_path)
        return went


def _held_by(pid: int, path: str) -> Optional[tuple[int, int]]:
    """``(st_dev, st_ino)`` of the regular file at ``path`` when process ``pid`` holds it open."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return None
        for name in os.listdir("/proc/%d/fd" % pid):
            try:
                held = os.stat("/proc/%d/fd/%s" % (pid, name))
            except OSError:
                continue
            if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino):
                return st.st_dev, st.st_ino
    except OSError:
        return None
    return None


def _create_log(journal: Journal, data: bytes) -> bool:
    """The job's ``--log`` file, which it had not opened yet (``log_pending``): created new here —
    never an existing file, never through a symlink — with the job's lines so far (from its
    journal) and ``data``; from now on written like a log the job opened (`Journal.log_id`)."""
    path = journal.log_path or ""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        journal.log_id, journal.log_pending = (st.st_dev, st.st_ino), False
        pid = journal.pid or 0
        quiet = isinstance(journal.config, dict) and journal.config.get("quiet") is True
        lines = [ln for ln in journal.lines if not quiet or ln.level in ("warn", "error")]  # (a child's: its bad news)
        held = b"".join(format_line(pid, ln.msg, ln.ts).encode("utf-8", "backslashreplace") for ln in lines)
        os.write(fd, held + data)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def seconds(s: float) -> str:
    from lora_otel._boot.seam import duration

    return duration(s)


def stalled_line(stall: Stall, diagnosis: str) -> str:
    """``STALLED: import x open for 12.3 s (limit 10 s) — <diagnosis>``, ``STALLED: frozen in import x:
    no beat for 10.4 s (limit 10 s) — …``: the views' line (`seam.stalled_line`)."""
    from lora_otel._boot.seam import learned_why, stall_what
    from lora_otel._boot.seam import stalled_line as line

    open_s = stall.open_for_s
    if stall.kind == "frozen":
        open_s = stall.silent_s if stall.silent_s is not None else stall.limit_s
    why = stall.limit_why
    if isinstance(stall.learned, Learned):
        why = learned_why(stall.learned.source, stall.learned.usual_s)
    stage = None if stall.kind == "between" or stall.stage == "between stages" else stall.stage
    since = "%s ended" % stall.after if stall.kind == "between" and stall.after else ""
    return line(stall_what(stage, stall.kind, open_s, stall.limit_s, since=since, limit_why=why), diagnosis)


def death_line(journal: Journal, oom: Optional[str], now_ns: int, end: Optional[ChildEnd] = None) -> str:
    """``process 1234 was killed by the OOM killer in load model after 45 s``; ``end``: how its
    parent saw it end (``was killed by SIGKILL (its parent reaped it) in ...``), when it reaped it."""
    from lora_otel.journal.tree import deepest_open_span

    span = deepest_open_span(journal)
    if end is not None:
        if oom and end.signal == "SIGKILL" and not end.oom_killed:
            end = dataclasses.replace(end, oom_killed=True)
        how = "was %s (its parent reaped it)" % describe_end(end)
        now_ns = min(now_ns, end.at_ns)
    else:
        how = "was killed by the OOM killer" if oom else "was killed (by a signal: SIGKILL, SIGTERM, ...; or os._exit)"
    if span is None or span is journal.root:
        root = journal.root
        after = (now_ns - root.start_ns) / 1e9 if root is not None else 0.0
        where = "with no stage open, %s after it started" % seconds(after)
    else:
        where = "in %s after %s" % (span.name, seconds((now_ns - span.start_ns) / 1e9))
    return "process %s %s %s" % (journal.pid, how, where)


def why_line(stall: Stall, diagnosis: str) -> str:
    """``why import x is stalled: <diagnosis>``: the line after the job's own STALLED line."""
    return "why %s is stalled: %s" % ("the job" if stall.kind == "between" else stall.stage, diagnosis)


def record_advice(record: dict[str, Any]) -> str:
    """The ``what to do: …`` line for a stall record (`advice_line`), "" when it has no advice."""
    from lora_otel.analysis.diagnose import advice_line

    advice = record.get("advice")
    return advice_line(advice) if isinstance(advice, str) else ""


CAUSE_PID = "lora_otel.diagnosis.in_pid"
"""The diagnosis attribute naming another process as the cause (a pool's worker holding the task)."""


def speaks_for_job(stall: Stall, cause_pid: Optional[int] = None, evidence: Optional[dict[str, Any]] = None) -> bool:
    """Whether the watchdog writes the STALLED line: the job cannot (frozen), does not know the
    limit (learned), or cannot know why (it is blocked writing to a full pipe and its stderr is one,
    so its own lines may not get through either: `pipes.full_pipe`, `pipes.stderr_blocked`). Other
    stalls the job says itself (its own beat), and the watchdog follows them with the cause
    (`why_line`) and what to do — a cause in another process (``cause_pid``: the worker of its pool
    that holds the task) too: one STALLED line in the panel, in one shape, then why."""
    del cause_pid  # (named by the why line)
    if stall.kind == "frozen" or isinstance(stall.learned, Learned):
        return True
    from lora_otel.analysis.pipes import full_pipe, stderr_blocked

    return bool(evidence) and full_pipe(evidence or {}) is not None and stderr_blocked(evidence or {})


def death_record(
    journal: Journal, oom: Optional[str], now_ns: int, by: str, end: Optional[ChildEnd] = None
) -> dict[str, Any]:
    from lora_otel.journal.tree import deepest_open_span

    span = deepest_open_span(journal)
    no_stage = span is None or span is journal.root
    evidence: dict[str, Any] = {"oom": oom} if oom else {}
    if end is not None:
        evidence.update({"signal": end.signal, "exit_code": end.exit_code, "reaped_by": end.parent_pid})
        evidence = {key: value for key, value in evidence.items() if value is not None}
        now_ns = min(now_ns, end.at_ns)
    start = journal.root.start_ns if no_stage and journal.root is not None else (span.start_ns if span else now_ns)
    return {
        "v": 1,
        "k": "stall",
        "ts": now_ns,
        "span_id": None if no_stage else span.span_id,  # type: ignore[union-attr]  # no_stage: span is None
        "stage": "between stages" if no_stage else span.name,  # type: ignore[union-attr]  # the same
        "kind": "died",
        "limit_s": None,
        "open_s": round((now_ns - start) / 1e9, 3),
        "learned": None,
        "evidence": evidence,
        "diagnosis": death_line(journal, oom, now_ns, end).replace("process %s " % journal.pid, "The process ", 1)
        + ".",
        "by": by,
    }


# --- following ------------------------------------------------------------------------------------


class Diagnosed(NamedTuple):
    """A stall's diagnosis, and what it drew on beside the stalled journal."""

    found: Diagnosis
    peers: list[Journal]  # the job's other journals
    others: dict[str, str]  # the other ranks' Python stacks, by journal path (a collective only)


def diagnose_stall(
    journal: Journal,
    stall: Stall,
    evidence: dict[str, Any],
    now: int,
    followed: Optional[Callable[[], Iterable[Journal]]] = None,
    limits: Any = None,
    frozen_after_s: Optional[float] = None,
    baseline: Any = None,
    stacks_of: Optional[Callable[[Journal, Sequence[Journal]], dict[str, str]]] = None,
) -> Diagnosed:
    """The one diagnosis of a stall, for the local watchdog and the live export alike: the journals
    this sidecar follows (``followed``) and the job's journals beside the stalled one (the other
    ranks' sidecars follow those) as its peers; the other ranks' stacks (``stacks_of``, default
    `peer_stacks`) when it waits in a collective; the frozen limit the journal recorded
    (``limits``/``frozen_after_s``: the follower's own, `journal_limits`); the drift from
    ``baseline`` (`configured_baseline`'s answer; None: none configured). A peer that cannot be
    read leaves ``peers.error`` in ``evidence``; the diagnosis goes on."""
    from lora_otel.analysis import recording
    from lora_otel.analysis.diagnose import collective_in, explain, stacks_text, with_baseline
    from lora_otel.analysis.evidence import PREFIX

    peers: list[Journal] = []
    others: dict[str, str] = {}
    try:
        peers = [peer for peer in (followed() if followed is not None else []) if peer is not journal]
        known = {os.path.abspath(peer.path) for peer in peers} | {os.path.abspath(journal.path)}
        peers += [peer for peer in job_journals(journal) if os.path.abspath(peer.path) not in known]
        if collective_in(stacks_text(evidence)) is not None:
            others = (stacks_of or peer_stacks)(journal, peers)
    except Exception as e:  # noqa: BLE001 - the diagnosis goes on without them
        evidence[PREFIX + "peers.error"] = "%s: %s" % (type(e).__name__, e)
    _, frozen_after = journal_limits(journal, limits, frozen_after_s)
    found = explain(stall, evidence, journal, peers, others, frozen_after_s=frozen_after)
    if os.environ.get(recording.ENV):
        recording.record(stall, evidence, journal, found, peers, others, now, frozen_after, "the sidecar's diagnosis")
    return Diagnosed(with_baseline(found, stall, journal, baseline, now), peers, others)


def configured_baseline(journal: Journal) -> Any:
    """The baseline ``LORA_OTEL_BASELINE`` names (a relative path is the traced process's): a
    `Baseline`, None when unset, the `BaselineError` when it cannot be used. Never raises."""
    from lora_otel.analysis.baseline import BaselineError, configured

    try:
        return configured(journal)
    except Exception as e:  # noqa: BLE001 - BaselineError, one line; the diagnosis goes on
        return e if isinstance(e, BaselineError) else BaselineError("%s: %s" % (type(e).__name__, e))


PEER_STACKS_S = 3.0
"""At most this long asking the other ranks for their stacks, at one stall."""
MAX_PEER_STACKS = 32


def peer_stacks(journal: Journal, peers: Sequence[Journal]) -> dict[str, str]:
    """The Python stacks of the other ranks of ``journal``'s world that still run, by journal path.

    Each is read from outside by py-spy (``--nonblocking``: nothing paused, no signal) where it can,
    else asked as the stalled process is (the stack request signal to its faulthandler, whose file
    its journal names, after the same checks: `evidence.stack_request`), for at most
    `PEER_STACKS_S` seconds in all and `MAX_PEER_STACKS` ranks.
    """
    from lora_otel.analysis.diagnose import world_peers
    from lora_otel.analysis.evidence import PREFIX, append_dump, python_stacks, stack_request, stacks_from_outside

    out: dict[str, str] = {}
    deadline = time.monotonic() + PEER_STACKS_S
    for _, peer in sorted(world_peers(journal, peers).items())[:MAX_PEER_STACKS]:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if not peer.pid or process_state(peer) != "running":
            continue
        request = stack_request(peer)
        text = stacks_from_outside(peer.pid, timeout_s=max(left, 0.5))
        if text and request is not None and not request.refusal:
            append_dump(request, text)
        elif not text and request is not None and not request.refusal:
            asked = python_stacks(peer.pid, request, wait_s=min(1.0, left), py_spy=False)
            text = str(asked.get(PREFIX + "python.stacks") or "")
        if text:
            out[peer.path] = text
    return out


PARENT_REAP_WAIT_S = 3.0
"""How long the watchdog waits for a live traced parent to reap a child that died without a word,
before it tells the death without the parent's ``child exit`` event. A launcher that waits on its
children one after the other reaps a killed one only when the ones before it end (1.5 s and more
in bench/real_causes.py's "child killed before a sibling errors"); 1 s told "killed (by a signal:
SIGKILL, SIGTERM, ...)" there while the parent's event, 1.5 s on, said SIGKILL."""


WHY_WAIT_S = 10.0
"""How long a why line waits for the job's own STALLED line, at least: three beats where the
journal's ``config.beat_s`` makes that longer, at most `WHY_WAIT_MAX_S`. The job's beat says
STALLED when the limit passes; the watchdog, polling on its own clock, may find the stall and its
cause first (in the full suite on a loaded machine the why line once came before the STALLED
line, the beat thread held up between its beat record and its line). A job that does not say it
in that time gets the whole STALLED line from the watchdog instead."""
WHY_WAIT_MAX_S = 60.0


class Watch:
    """The local watchdog for one journal. `poll` often; `ended` once its process is gone.

    ``limits``/``frozen_after_s``: a command line's (None: what the journal recorded).
    ``say``: one line for the sidecar's log."""

    def __init__(
        self,
        path: str,
        limits: Optional[dict[str, float]] = None,
        frozen_after_s: Optional[float] = None,
        lines: Optional[JobLines] = None,
        by: str = "watchdog",
        evidence: Optional[Callable[[int, Optional[StackRequest]], dict[str, Any]]] = None,
        peers: Optional[Callable[[], Sequence[Journal]]] = None,
        say: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        """``evidence``: gathers a stalled process's evidence (default `evidence.gather`)."""
        self.path = path
        self.tail = JournalTail(path)
        self.limits, self.frozen_after_s = limits, frozen_after_s
        self.lines = lines or JobLines()
        self.by = by
        self.evidence = evidence
        self.peers = peers
        self.say = say
        self.journal: Optional[Journal] = None
        self.learned: Optional[dict[str, Learned]] = None
        self.records: list[dict[str, Any]] = []
        self.stalled: set[tuple[str, int | str | None]] = set()  # (kind, span id or the quiet period's start)
        self.slow_told: set[str] = set()
        self._asker: Optional[StackAsker] = None  # made at the first stall (`_ask`)
        self.oom = OomWatch()
        self._baseline_read, self._baseline = False, None  # `configured_baseline`, read at the first stall
        # waiting for the job's STALLED line (`_say_why`): deadline, since, why line, whole STALLED line,
        # the what-to-do line after either ("" when none)
        self._why: list[tuple[float, int, str, str, str]] = []
        self._stalled_said: list[int] = []  # times of the job's own STALLED lines seen (`note_lines`)

    def read(self) -> Journal:
        self.journal = self.tail.read()
        if self.learned is None and self.journal.root is not None:
            try:
                self.learned = learn(self.journal)
            except Exception as e:  # noqa: BLE001 - no learned limits, the defaults hold
                self.learned = {}
                self.say("learned limits off for %s: %s: %s" % (self.path, type(e).__name__, e))
        return self.journal

    def poll(self, now_ns: Optional[int] = None) -> Optional[dict[str, Any]]:
        """Read what the journal gained; say a slow stage; on a new stall, append its record (returned)."""
        journal = self.read()
        now = time.time_ns() if now_ns is None else now_ns
        alive = process_state(journal) == "running"
        if self._why:
            self._say_why(journal, alive)
        if not alive or journal.root is None:
            return None
        if journal.pid:
            self.oom.see(journal.pid)
        self._slow(journal, now)
        stall = detect(journal, now, alive, self.limits, self.frozen_after_s, self.learned)
        if stall is None:
            return None
        key = (stall.kind, stall.since_ns if stall.kind == "between" else stall.span.span_id)
        if key in self.stalled:
            return None
        self.stalled.add(key)
        record = self.report(journal, stall, now)
        self._say_why(self.read(), alive)  # the job's STALLED line may be in already
        return record

    def _slow(self, journal: Journal, now: int) -> None:
        if not self.learned:
            return
        from lora_otel.journal.tree import deepest_open_span

        span = deepest_open_span(journal)
        if span is None or span is journal.root or span.span_id in self.slow_told:
            return
        rule = self.learned.get(span.name)
        open_s = (now - span.start_ns) / 1e9
        if rule is None or open_s < rule.slow_s:
            return
        self.slow_told.add(span.span_id)
        self.lines.say(journal, "%s: %s so far, %s" % (span.name, seconds(open_s), rule.describe()), alive=True)

    def _ask(self, journal: Journal, native: bool = False) -> dict[str, Any]:
        """The stalled process's evidence, through one `evidence.StackAsker` for this journal (a
        stack request that got no dump: this process is asked no more)."""
        if self._asker is None:
            from lora_otel.analysis.evidence import StackAsker, gather

            self._asker = StackAsker(self.evidence if self.evidence is not None else gather)
        return self._asker(journal, native=native)

    def report(self, journal: Journal, stall: Stall, now: int) -> dict[str, Any]:
        """Gather, diagnose (`diagnose_stall`, as the live export does), append the record, speak
        for the job where it cannot."""
        evidence = self._ask(journal, native=stall.kind == "frozen")
        if not self._baseline_read:
            self._baseline_read, self._baseline = True, configured_baseline(journal)
        found = diagnose_stall(
            journal, stall, evidence, now, self.peers, self.limits, self.frozen_after_s, self._baseline
        ).found
        return self.write(
            journal, stall, found.sentence, evidence, now, cause_pid(found.attrs, journal), found.ages, found.advice
        )

    def write(
        self,
        journal: Journal,
        stall: Stall,
        sentence: str,
        evidence: dict[str, Any],
        now: int,
        cause: Optional[int] = None,
        ages: Optional[list[list[int]]] = None,
        advice: str = "",
    ) -> dict[str, Any]:
        """The stall record, and the STALLED line where the job cannot write it (``cause``: the pid
        of another process the diagnosis names, `cause_pid`; ``ages``: `Diagnosis.ages`; ``advice``:
        `Diagnosis.advice`, said as its own ``what to do:`` line after the why line)."""
        record = stall_record(stall, sentence, evidence, self.by, now, ages, advice)
        since = now - int(stall.open_for_s * 1e9)
        beat = (journal.config if isinstance(journal.config, dict) else {}).get("beat_s")
        beats = 3 * beat if isinstance(beat, (int, float)) and not isinstance(beat, bool) else 0
        wait_s = min(max(WHY_WAIT_S, beats), WHY_WAIT_MAX_S)
        return write_stall(
            self.path,
            journal,
            stall,
            record,
            self.lines,
            self.say,
            self.records,
            cause,
            evidence,
            why_later=lambda line: self._why.append(
                (
                    time.monotonic() + wait_s,
                    since,
                    line,
                    stalled_line(stall, record["diagnosis"]),
                    record_advice(record),
                )
            ),
        )

    def _say_why(self, journal: Journal, alive: bool) -> None:
        """Write the why lines whose STALLED line the job has said (its ``line`` record): after it,
        never before; for a job that did not say it in `WHY_WAIT_S`, the whole STALLED line."""
        self.note_lines(journal)
        keep = []
        for deadline, since, why, whole, then in self._why:
            said = any(ts >= since - 1_000_000_000 for ts in self._stalled_said)
            if not alive:
                continue  # gone: `ended` tells what happened
            if said or time.monotonic() >= deadline:
                self.lines.say(journal, why if said else whole, alive=True)
                if then:
                    self.lines.say(journal, then, alive=True)
            else:
                keep.append((deadline, since, why, whole, then))
        self._why = keep

    def note_lines(self, journal: Journal) -> None:
        """Remember when the job said its own STALLED lines, among the lines read so far (the live
        export sends and forgets them: `say_why_later` runs after)."""
        said = {line.ts for line in journal.lines if line.level == "error" and line.msg.startswith("STALLED: ")}
        self._stalled_said = sorted(said.union(self._stalled_said))[-16:]  # the latest: a why waits for a new one

    def say_why_later(self, journal: Journal, alive: bool) -> None:
        """The why lines (and what to do) still waiting for the job's own STALLED line (`_say_why`):
        for the live export, which reads the journal itself and calls this on each poll."""
        if self._why:
            self._say_why(journal, alive)
        else:
            self.note_lines(journal)

    def ended(self, oom: Optional[str] = None, now_ns: Optional[int] = None) -> Optional[str]:
        """The process is gone: when it left no exit record (nor exec'd), say how it died (a
        ``died`` stall record and the line for its --log and stderr). Returns the line, or None."""
        journal = self.read()
        return report_death(
            self.path,
            journal,
            oom if oom is not None else self.oom.struck(),
            time.time_ns() if now_ns is None else now_ns,
            self.by,
            self.lines,
            self.say,
            self.parent_end(journal),
            self.first_failure,
        )

    def first_failure(self, journal: Journal, now_ns: int) -> Optional[str]:
        """When another process of the job failed first (its callout, `lora_otel.analysis.job`),
        that callout without the failures after it (``child (pid 12) died first: killed by
        SIGKILL in load after 1 s``); None when this one was first or alone. The job's journals:
        those this sidecar follows and those beside this one with its trace id."""
        try:
            from lora_otel.analysis.job import group_jobs, make_proc

            followed = [peer for peer in self.peers() if peer is not journal] if self.peers is not None else []
            known = {os.path.abspath(peer.path) for peer in followed}
            beside = [peer for peer in job_journals(journal) if os.path.abspath(peer.path) not in known]
            members = [journal, *followed, *beside]
            if len(members) < 2:
                return None
            procs = [make_proc(member, process_state(member), now_ns) for member in members if member.spans]
            for job in group_jobs(procs):
                callout = job.callout
                if not any(proc.journal is journal for proc in job.procs) or callout is None:
                    continue
                if callout.proc.journal is journal or callout.kind not in ("failed", "killed"):
                    return None
                return callout.text.split("; then", 1)[0]
            return None
        except Exception as e:  # noqa: BLE001 - the death is told without it
            self.say("the job's first failure not read: %s: %s" % (type(e).__name__, e))
            return None

    def parent_end(self, journal: Journal, wait_s: float = PARENT_REAP_WAIT_S) -> Optional[ChildEnd]:
        """How the process ended as its parent journaled it (a ``child exit`` event): a peer this
        sidecar follows, or the parent's journal beside this one (a child started before its
        parent became a job has a sidecar of its own). A parent still alive gets ``wait_s`` to reap
        it (a dead child stays a zombie until then). None when no traced parent says."""
        try:
            deadline = time.monotonic() + wait_s
            while True:
                peers = [peer for peer in self.peers() if peer is not journal] if self.peers is not None else []
                parent = parent_journal(journal)
                end = end_of(journal, child_ends(peers + ([parent] if parent is not None else [])))
                if end is not None or parent is None or time.monotonic() >= deadline:
                    return end
                if process_state(parent) != "running":
                    return None
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - the death is told without it
            self.say("child exit events not read: %s: %s" % (type(e).__name__, e))
            return None

    def close(self) -> None:
        self.tail.close()


def write_stall(
    path: str,
    journal: Journal,
    stall: Stall,
    record: dict[str, Any],
    lines: JobLines,
    say: Callable[[str], None],
    records: Optional[list[dict[str, Any]]] = None,
    cause: Optional[int] = None,
    evidence: Optional[dict[str, Any]] = None,
    why_later: Optional[Callable[[str], None]] = None,
) -> dict[str, Any]:
    """Append ``record`` to the journal at ``path``; write the STALLED line where the job cannot
    (`speaks_for_job`; ``cause``: the pid of another process the diagnosis names; ``evidence``: what
    was gathered for the stall). ``why_later``: takes the why line, to write it once the job's own
    STALLED line is there (`Watch`); without it the line is written now."""
    why = append_record(path, record)
    if why:
        say("stall record not written: %s" % why)
    if records is not None:
        records.append(record)
    then = record_advice(record)  # what to do: its own line, right after the why (or STALLED) line
    if speaks_for_job(stall, cause, evidence):
        lines.say(journal, stalled_line(stall, record["diagnosis"]), alive=True)
        if then:
            lines.say(journal, then, alive=True)
    elif not str(record["diagnosis"]).startswith("Cannot tell"):
        # The job says STALLED with where its main thread is; why is known only here.
        line = why_line(stall, record["diagnosis"])
        if why_later is not None:
            why_later(line)  # (`Watch` says the what-to-do line after it)
        else:
            lines.say(journal, line, alive=True)
            if then:
                lines.say(journal, then, alive=True)
    say("%s stall in %s: %s" % (stall.kind, stall.stage, record["diagnosis"]))
    if then:
        say(then)
    return record


def cause_pid(attrs: dict[str, Any], journal: Journal) -> Optional[int]:
    """The pid of another process the diagnosis names as the cause (`CAUSE_PID`), or None."""
    pid = attrs.get(CAUSE_PID)
    if isinstance(pid, int) and not isinstance(pid, bool) and pid != journal.pid:
        return pid
    return None


PARENT_SCAN_MAX = 256
"""At most this many journals beside a child's are opened to find its parent's (named after a
``--log`` file, a parent's journal does not say its pid in its name)."""


def _mine(path: str) -> bool:
    """Whether ``path`` is a regular file of this user's (one ``lstat``): what another user left
    in a shared directory is left out before `PARENT_SCAN_MAX` counts, so 256 files named to sort
    first cannot hide the job's own journals."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def job_journals(journal: Journal) -> list[Journal]:
    """The journals beside ``journal`` of the same trace (its job), that the watchdog may read
    (`owned_file_reason`); at most `PARENT_SCAN_MAX` files are looked at, by their first record."""
    import json

    from lora_otel._boot.seam import files
    from lora_otel.journal.reader import JournalError, journal_paths, read_journal

    root = journal.root
    if root is None:
        return []
    own = os.path.abspath(journal.path)
    try:
        paths = [os.path.abspath(path) for path in journal_paths(os.path.dirname(own))]
    except OSError:
        return []
    out = []
    for path in [path for path in paths if path != own and _mine(path)][:PARENT_SCAN_MAX]:
        if owned_file_reason(path):
            continue
        try:
            with open(files.open_regular(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                first = json.loads(f.readline(65536) or b"{}")
            if isinstance(first, dict) and first.get("trace_id") == root.trace_id:
                out.append(read_journal(path))
        except (OSError, ValueError, JournalError):
            continue
    return out


def parent_journal(journal: Journal) -> Optional[Journal]:
    """The journal of the process's parent (``process.parent_pid``) beside its own, when it is one
    the watchdog may read (`owned_file_reason`) and started before it; else None. Journals named
    ``<time>-<ppid>.otel.jsonl`` are tried first, then the others by their first record's pid."""
    import json

    from lora_otel._boot.seam import files
    from lora_otel.journal.reader import JournalError, journal_paths, read_journal

    root = journal.root
    ppid = root.attrs.get("process.parent_pid") if root is not None else None
    if root is None or not isinstance(ppid, int) or isinstance(ppid, bool) or ppid <= 1:
        return None
    own = os.path.abspath(journal.path)
    suffix = "-%d.otel.jsonl" % ppid
    try:
        paths = [os.path.abspath(path) for path in journal_paths(os.path.dirname(own))]
    except OSError:
        return None
    paths = [path for path in paths if path != own and _mine(path)]
    paths.sort(key=lambda path: (not path.endswith(suffix), path))
    for path in paths[:PARENT_SCAN_MAX]:
        if owned_file_reason(path):
            continue
        if not path.endswith(suffix):
            try:
                with open(files.open_regular(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                    first = json.loads(f.readline(65536) or b"{}")
            except (OSError, ValueError):
                continue
            if not isinstance(first, dict) or first.get("pid") != ppid:
                continue
        try:
            parent = read_journal(path)
        except JournalError:
            continue
        if parent.pid == ppid and parent.root is not None and parent.root.start_ns <= root.start_ns:
            return parent
    return None


def report_death(
    path: str,
    journal: Journal,
    oom: Optional[str],
    now_ns: int,
    by: str,
    lines: JobLines,
    say: Callable[[str], None],
    end: Optional[ChildEnd] = None,
    first_failure: Optional[Callable[[Journal, int], Optional[str]]] = None,
) -> Optional[str]:
    """For a process gone without an exit record (nor an exec): the ``died`` record and its line."""
    if journal.exit is not None or journal.exec is not None or journal.root is None:
        return None
    if process_state(journal) == "exec'd":
        return None
    text = death_line(journal, oom, now_ns, end)
    why = append_record(path, death_record(journal, oom, now_ns, by, end))
    if why:
        say("stall record not written: %s" % why)
    if first_failure is not None and not why:  # judged with the death just recorded: when it died
        try:
            from lora_otel.journal.reader import read_journal

            journal = read_journal(path)
        except Exception:  # noqa: BLE001 - judged on the journal as it was read before
            pass
    first = first_failure(journal, now_ns) if first_failure is not None else None
    if first:
        text += "; before it, %s" % first  # the job's first failure: this death may be its consequence
    lines.say(journal, text, alive=False)
    return text
