"""The stall every view leads with, and its one-sentence diagnosis.

``inspect`` and ``watch`` show, for a process that is stalled, one line before anything else:
``STALLED: <what> — <diagnosis>``. It comes from the journal's last ``stall`` record (written by the
watchdog or the sidecar, docs/journal.md), or, for a live process that has none yet, is computed now
by the same code the sidecar uses (`stall.detect`, `diagnose.explain`) from what can be read
without signalling the process: ``/proc`` (two samples, about a second apart), its stacks file as
the last stack request left it, and the journals of its job.

The stacks file (``<journal stem>.stacks.txt``) is shown under it, the thread the diagnosis is about
first, secrets redacted (`lora_otel._boot.redact.redact_text`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from lora_otel._boot.seam import duration, learned_why, stall_what, stalled_line
from lora_otel.analysis import evidence as ev
from lora_otel.analysis import recording, waitfacts
from lora_otel.analysis.ages import aged
from lora_otel.analysis.diagnose import advice_line, explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import FROZEN_AFTER_S, Stall
from lora_otel.journal.reader import Journal, Span, process_state

STACK_LINES = 12
"""Lines of the stacks file a view shows (the relevant thread first)."""


def seconds(value: Optional[float]) -> str:
    """``12 s``, ``2.31 s``, ``312 s``: every view's way of writing a limit or a time in seconds."""
    return duration(value)


def what_phrase(stage: Optional[str], kind: str, open_s: Optional[float], limit_s: Optional[float]) -> str:
    """``import x open for 131 s (limit 120 s)``, ``training: no optimizer step for 19 s (limit 3 s)``,
    ``frozen in cuda init: no beat for 12 s (limit 10 s)``, ``no stage open for 130 s (limit 120 s)``,
    ``died in load model after 45 s``: the stall, in the same words in every view (`seam.stall_what`)."""
    return stall_what(None if stage == "between stages" else stage, kind, open_s, limit_s)


@dataclass
class Verdict:
    """A stall and its diagnosis, as a view shows it."""

    stage: Optional[str]
    kind: str
    open_s: Optional[float]
    limit_s: Optional[float]
    diagnosis: str
    by: str  # "watchdog", "sidecar" (a stall record) or "inspect"/"watch" (computed now)
    learned: Optional[dict[str, Any]] = None
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""  # what to do (`Diagnosis.advice`, a stall record's ``advice``); "" when none
    limit_why: str = ""  # why the limit is not the one given (`Stall.limit_why`, a record's ``limit_why``)

    @property
    def what(self) -> str:
        return what_phrase(self.stage, self.kind, self.open_s, self.limit_s)

    def line(self) -> str:
        """``STALLED: import x open for 131 s (limit 120 s) — Waiting on the network (…).``, the
        watchdog's own line for it (`seam.stalled_line`)."""
        why = self.limit_why
        if isinstance(self.learned, dict) and self.learned.get("from"):
            usual = self.learned.get("usual_s")
            usual_s = float(usual) if isinstance(usual, (int, float)) and not isinstance(usual, bool) else None
            why = learned_why(str(self.learned["from"]), usual_s)
        stage = None if self.stage == "between stages" else self.stage
        last = self.evidence.get("last_stage") if isinstance(self.evidence, dict) else None
        since = f"{last} ended" if self.kind == "between" and isinstance(last, str) and last else ""
        what = stall_what(stage, self.kind, self.open_s, self.limit_s, since=since, limit_why=why)
        return stalled_line(what, self.diagnosis)

    def advice_line(self) -> str:
        """``what to do: <advice>``, the line under `line`; "" when the evidence supports no step."""
        return advice_line(self.advice)

    def stacks_lines(self, journal: Journal) -> list[str]:
        """The stacks to show under the tree (`stacks_lines`), relevant thread first."""
        return stacks_lines(journal, self)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "kind": self.kind,
            "open_s": None if self.open_s is None else round(self.open_s, 3),
            "limit_s": self.limit_s,
            "diagnosis": self.diagnosis,
            "by": self.by,
            "learned": self.learned,
            "line": self.line(),
            "advice": self.advice or None,
        }


def from_record(journal: Journal, now_ns: Optional[int] = None) -> Optional[Verdict]:
    """The journal's last ``stall`` record, while it still holds: its span still open (or the process
    died in it), and no exit record after it.

    ``now_ns``: the time the view is read; the stall's ``open_s`` is then brought up to it (the
    record's ``open_s`` is as of the record: ``5.34 s`` in a record read 18 s later is a stall of
    23 s), up to the process's last sign of life when it is no longer running. None: as recorded."""
    if not journal.stalls:
        return None
    record = journal.stalls[-1]
    if journal.exit is not None and journal.exit["ts"] >= record.get("ts", 0) and record.get("kind") != "died":
        return None
    ts = record.get("ts")
    if record.get("kind") == "frozen" and isinstance(ts, int) and (journal.last_life_ns or 0) > ts:
        return None  # it beat again after the record: no longer frozen (a stall now is detected anew)
    span_id = record.get("span_id")
    span = journal.span(span_id) if isinstance(span_id, str) else None
    if span is not None and not span.is_open and record.get("kind") != "died":
        return None  # the stage ended after all
    open_s = _open_now(journal, record, now_ns)
    diagnosis = str(record.get("diagnosis") or "")
    recorded = _sane_s(record.get("open_s"))
    if open_s is not None and recorded is not None:
        # the diagnosis's own durations ("waits for its Pool for 5.25 s") grow as the headline's does
        diagnosis = aged(diagnosis, record.get("ages"), round((open_s - recorded) * 1e9))
    advice = record.get("advice") if isinstance(record.get("advice"), str) else ""
    if record.get("kind") == "died":
        diagnosis += _stalled_before(journal)
        before = _record_before(journal)
        advice = advice or (str(before.get("advice") or "") if before is not None else "")
    return Verdict(
        record.get("stage") or (span.name if span is not None else None),
        str(record.get("kind")),
        open_s,
        _sane_s(record.get("limit_s")),
        diagnosis,
        record.get("by") or "watchdog",
        record.get("learned"),
        record.get("evidence") or {},
        advice or "",
        record["limit_why"] if isinstance(record.get("limit_why"), str) else "",
    )


def _record_before(journal: Journal) -> Optional[dict[str, Any]]:
    """The stall recorded last before the death record, when it still held then (its stage still
    open); None when there is none."""
    for record in reversed(journal.stalls[:-1]):
        if record.get("kind") == "died" or not record.get("diagnosis"):
            continue
        span_id = record.get("span_id")
        span = journal.span(span_id) if isinstance(span_id, str) else None
        return None if span is not None and not span.is_open else record
    return None


def _stalled_before(journal: Journal) -> str:
    """`` Before, it was stalled: <what> — <diagnosis>``: the stall recorded last before the death
    record, when it still held then (its stage still open), so that a killed job's views keep the
    why found while it hung (and its advice: `from_record`); "" when there is none."""
    record = _record_before(journal)
    if record is None:
        return ""
    open_s, limit_s = _sane_s(record.get("open_s")), _sane_s(record.get("limit_s"))
    what = what_phrase(record.get("stage") or None, str(record.get("kind")), open_s, limit_s)
    return " Before, it was stalled: %s — %s" % (what, record["diagnosis"])


MAX_S = 1e10
"""Seconds beyond which a record's ``open_s`` or ``limit_s`` (a journal edited by hand) is not believed."""


def _sane_s(value: Any) -> Optional[float]:
    """``value`` as seconds when it is a finite number of at most `MAX_S`; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if value == value and abs(value) <= MAX_S else None


def _open_now(journal: Journal, record: dict[str, Any], now_ns: Optional[int]) -> Optional[float]:
    """The record's ``open_s``, as of ``now_ns`` (see `from_record`), never more than the
    process's own age (a record dated before the process started is not believed that far)."""
    found = _open_raw(journal, record, now_ns)
    start = journal.root.start_ns if journal.root is not None else None
    if found is not None and now_ns is not None and isinstance(start, int):
        found = min(found, max(now_ns - start, 0) / 1e9)
    return found


def _open_raw(journal: Journal, record: dict[str, Any], now_ns: Optional[int]) -> Optional[float]:
    open_s, ts = _sane_s(record.get("open_s")), record.get("ts")
    if now_ns is None or record.get("kind") == "died" or open_s is None or not isinstance(ts, int):
        return open_s
    running = process_state(journal) == "running"
    if running and record.get("kind") == "frozen" and journal.last_life_ns:
        return max(now_ns - journal.last_life_ns, 0) / 1e9  # "no beat for …", as `current` says it
    end = now_ns if running else min(now_ns, max(ts, journal.last_life_ns or 0))
    return float(open_s) + max(end - ts, 0) / 1e9


def current(
    journal: Journal,
    stall: Optional[Stall],
    now_ns: int,
    peers: Iterable[Journal] = (),
    frozen_after_s: Optional[float] = FROZEN_AFTER_S,
    by: str = "inspect",
) -> Optional[Verdict]:
    """The stall to lead with: the journal's stall record, else (``stall`` detected now in a live
    process) the diagnosis computed now, as the sidecar computes it but without signalling.
    ``frozen_after_s`` None: the one the journal recorded (`stall.journal_limits`)."""
    found = from_record(journal, now_ns)
    if found is not None or stall is None or journal.pid is None or process_state(journal) != "running":
        return found
    if frozen_after_s is None:
        from lora_otel.analysis.stall import journal_limits

        frozen_after_s = journal_limits(journal)[1]
    evidence = quiet_evidence(journal, stall.span, sample_s())
    peers = [peer for peer in peers if peer is not journal]
    peer_stacks = {peer.path: text for peer in peers if (text := last_dump(peer))}
    diagnosis = explain(stall, evidence, journal, peers, peer_stacks, now_ns, frozen_after_s)
    if os.environ.get(recording.ENV):
        recording.record(stall, evidence, journal, diagnosis, peers, peer_stacks, now_ns, frozen_after_s, by)
    kind = stall.kind
    if kind == "frozen":
        last = journal.last_life_ns or 0
        open_s = (now_ns - last) / 1e9 if last else stall.open_for_s
    else:
        open_s = stall.open_for_s
    if kind == "between" and stall.after:
        evidence["last_stage"] = stall.after  # as the watchdog's record has it
    learned = getattr(stall.learned, "to_json", None)
    return Verdict(
        stall.span.name if stall.span is not journal.root else None,
        kind,
        open_s,
        stall.limit_s,
        diagnosis.sentence,
        by,
        learned() if callable(learned) else None,
        evidence,
        diagnosis.advice,
        stall.limit_why,
    )


# --- evidence without signalling ----------------------------------------------------------------


def sample_s() -> float:
    """How long inspect/watch sample a live stalled process's /proc facts (CPU, bytes read, memory):
    ``LORA_OTEL_INSPECT_SAMPLE_S`` (seconds, default 0.5; 0: one look, no rates)."""
    try:
        value = float(os.environ.get("LORA_OTEL_INSPECT_SAMPLE_S", "0.5"))
    except ValueError:
        return 0.5
    return min(max(value, 0.0), 10.0) if value == value else 0.5


def quiet_evidence(journal: Journal, span: Optional[Span] = None, sample_s: float = 0.5) -> dict[str, Any]:
    """What `evidence.gather` would give, read without sending the process anything: /proc facts
    (sampled over ``sample_s``), its TCP connections and bytes read meanwhile, memory pressure, its
    children (DataLoader workers), its stdout/stderr pipes and who holds their read ends, what its
    threads wait on and the chain of waits behind (`waitfacts`), and the last dump in its stacks
    file when it is newer than ``span``'s start."""
    pid = journal.pid
    if pid is None:
        return {}
    before = ev.read_chars(pid)
    started = time.monotonic()
    out = ev.process_facts(pid, sample_s=sample_s / 2)
    out.update(ev.network_facts(pid))
    out.update(ev.memory_facts(pid, sample_s=sample_s / 2))
    after, elapsed = ev.read_chars(pid), time.monotonic() - started
    if before is not None and after is not None and elapsed > 0:
        out[PREFIX + "io.read_bytes_per_s"] = round((after - before) / elapsed, 1)
        out[PREFIX + "io.sampled_s"] = round(elapsed, 2)
    out.update(ev.children_facts(pid, _journals_by_pid(journal)))
    out.update(ev.pipe_facts(pid))
    out.update(waitfacts.wait_facts(pid))  # what its threads wait on, and the other end (reads /proc only)
    text = last_dump(journal, since_ns=span.start_ns if span is not None else None)
    if text:
        out[PREFIX + "python.stacks"] = text
        out[PREFIX + "python.stacks.from"] = "the stacks file (last request)"
    out.update(ev.file_lock_facts(pid, out, use_py_spy=False))
    out.update(ev.hub_facts(pid, out))
    out.update(ev.poll_facts(pid, out, use_py_spy=False))
    return out


def _journals_by_pid(journal: Journal) -> dict[int, Journal]:
    """The journals next to ``journal`` (its DataLoader workers write theirs there), by pid."""
    from lora_otel.journal.reader import sibling_journals

    return {
        other.pid: other
        for other in sibling_journals(journal)
        if other.pid is not None and process_state(other) == "running"
    }


# --- the stacks file ------------------------------------------------------------------------------

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")


def stacks_path(journal: Journal) -> Optional[str]:
    """The journal's stacks file, if there is one the journal's process could have written: the
    name the journal records (root attribute ``lora_otel.stacks.path``) taken beside the journal
    (a moved run is found where it is now), named after it (``<stem>.stacks[.<random>].txt``), a
    regular file reached without a symlink, owned by the journal's owner, with one name (or the
    very file the journal recorded, ``lora_otel.stacks.file``). A crafted journal naming another
    file (``/etc/shadow``, a FIFO, another user's file) gets None: ``inspect`` or ``report`` run by
    root never read it."""
    opened = _open_stacks(journal)
    if opened is None:
        return None
    os.close(opened[1])
    return opened[0]


def _open_stacks(journal: Journal) -> Optional[tuple[str, int]]:
    """``(path, descriptor)`` of the journal's stacks file as `stacks_path` accepts it, opened for
    reading (no symlink followed, never blocking on a FIFO) and checked on the open descriptor."""
    import stat

    attrs = journal.root.attrs if journal.root is not None else {}
    recorded = attrs.get("lora_otel.stacks.path")
    if not isinstance(recorded, str) or not recorded:
        return None
    from lora_otel._boot.seam import paths

    name = os.path.basename(recorded)
    stem = paths.stem(os.path.basename(journal.path))
    if not (name.startswith(stem + ".stacks.") and name.endswith(".txt")):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(journal.path)), name)
    ident = attrs.get("lora_otel.stacks.file")
    try:
        owner = os.stat(journal.path).st_uid
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            stat.S_ISREG(st.st_mode)
            and st.st_uid == owner
            and (st.st_nlink == 1 or (isinstance(ident, list) and ident == [st.st_dev, st.st_ino]))
        ):
            return path, fd
    except OSError:
        pass
    os.close(fd)
    return None


def last_dump(journal: Journal, since_ns: Optional[int] = None, limit: int = 256 * 1024) -> str:
    """The last stack dump in the journal's stacks file (`stacks_path`; '' when none, or when the
    file was last written before ``since_ns``)."""
    opened = _open_stacks(journal)
    if opened is None:
        return ""
    try:
        with open(opened[1], "rb") as f:
            st = os.fstat(f.fileno())
            if since_ns is not None and st.st_mtime_ns < since_ns:
                return ""
            f.seek(max(st.st_size - limit, 0))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = text.splitlines()
    start, seen = 0, set[str]()
    # A dump names each thread once, and one of them the current thread: a thread seen again, or a
    # second current thread (py-spy's dump names threads by native id, the beat's by Python's), starts the next one.
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m:
            current = m.group(1) == "Current thread"
            if m.group(2) in seen or (current and "current" in seen):
                start, seen = i, set()
            seen.add(m.group(2))
            if current:
                seen.add("current")
    return "\n".join(lines[start:]).strip("\n")


def stacks_lines(journal: Journal, verdict: Optional[Verdict], max_lines: int = STACK_LINES) -> list[str]:
    """``stacks (from run.stacks.txt, the last request):`` and the last dump, the relevant thread
    first (the one the diagnosis names, else the main thread), secrets redacted; [] when none."""
    from lora_otel._boot.seam import redact_text

    text = str(verdict.evidence.get(PREFIX + "python.stacks") or "") if verdict is not None else ""
    text = text or last_dump(journal)
    path = stacks_path(journal)
    if not text or path is None:
        return []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if _HEADER.match(line):
            blocks.append([line])
        elif (
            blocks and line.strip() and not line.startswith("    local ")
        ):  # (the beat's locals: for the poll loop rule)
            blocks[-1].append(line)
    blocks = [b for b in blocks if not any("lora_otel/_boot/" in line for line in b[1:2])]  # the beat
    focus = _focus_words(verdict)
    blocks.sort(
        key=lambda b: (not any(w in line for w in focus for line in b[1:]) if focus else False, not _is_main(b))
    )
    shown: list[str] = []
    for block in blocks:
        label = "main thread" if _is_main(block) else "thread %s" % _HEADER.match(block[0]).group(2)  # type: ignore[union-attr]
        shown.append(f"  {label}:")
        shown.extend("    " + line.strip() for line in block[1:])
    cut = len(shown) - max_lines
    shown = shown[:max_lines] + ([f"  ... {cut} more lines in the file"] if cut > 0 else [])
    return [f"stacks (last dump in {path}):"] + [redact_text(line) for line in shown]


def _is_main(block: list[str]) -> bool:
    return bool(block) and "in <module>" in block[-1]


def _focus_words(verdict: Optional[Verdict]) -> list[str]:
    """Words of the diagnosis that name a place (``job.py:14``) — the thread with one of them goes first."""
    if verdict is None:
        return []
    return ['%s", line %s' % m.groups() for m in re.finditer(r"([\w.-]+\.py):(\d+)", verdict.diagnosis)][:1]
