"""The runs in a directory of journals: which files belong together, which run is the newest, and
the retention rule that keeps a directory from growing without bound.

A *run* is a top-level journal (``<stem>.otel.jsonl``) with the files made from its stem
(`lora_otel._boot.paths.stem`): ``<stem>.stacks.txt``, ``<stem>.sidecar.log``, ``<stem>.children``
(or their unique variants, ``<stem>.stacks.<8 hex>.txt`` …) and its forked children's journals
``<stem>.<pid>.otel.jsonl`` with their own stacks files. Nothing else in the directory is a run's:
a file whose name does not follow from a journal's stem (the ``--log`` file itself, a user's notes,
a stacks file whose journal is gone), a symlink, a file of another user is never counted nor removed.

Retention (`prune`), applied by the sidecar when a job starts (so a process that ends at once pays
nothing): keep the newest ``LORA_OTEL_KEEP`` runs (default 100) and at most ``LORA_OTEL_KEEP_MB``
megabytes (default 500; the newest run is kept whatever its size); ``0`` turns a limit off. A run
is removed only when none of its processes still runs and none of its files changed in the last
minute (a sidecar may still be writing its last lines). A process runs while it holds the lock a
job takes on its journal for its whole life (`lora_otel._boot.core.lock_journal`): retention
removes a run only while it holds an exclusive lock on each of its journals, which no process of
it can then hold, whatever its pid namespace or host (a job in a container sharing the
directory, frozen, its pid naming another process here). A journal whose lock cannot be asked
for (a file system without locks) is kept. A process that is not a job yet (its first second)
holds no lock: it is judged by its pid with the journal's start time, as
`lora_otel.journal.reader.process_state` judges it, as is every journal written before the lock.

Short failed runs (a process that never became a job and died of an uncaught exception or a
signal) are bounded without any sidecar: their journals are named ``<UTC>-[<random>-]short-<pid>``
at exit and each such exit keeps the newest ``SHORT_RUNS_KEPT`` of them
(`lora_otel._boot.preamble._bound_short_runs`); here they are runs like any other.

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from lora_otel._boot.seam import JOURNAL_SUFFIX, files, paths

KEEP_RUNS = 100
"""Runs kept per directory unless ``LORA_OTEL_KEEP`` says otherwise (0: no limit)."""
KEEP_MB = 500
"""Megabytes kept per directory unless ``LORA_OTEL_KEEP_MB`` says otherwise (0: no limit)."""
QUIET_S = 60.0
"""A run whose files changed less than this long ago is not removed (its sidecar may be ending)."""

_SIBLING = re.compile(
    r"(?:otel\.jsonl|stacks(?:\.[0-9a-f]{8})?\.txt|sidecar(?:\.[0-9a-f]{8})?\.log|(?:[0-9a-f]{8}\.)?children)"
)
_FORKED = re.compile(r"(.+)\.(\d+)")


@dataclass
class Run:
    """One run: its top journal, every file of it (paths), and what retention needs to know."""

    journal: str
    files: list[str] = field(default_factory=list)
    start_ns: int = 0
    size: int = 0
    changed_ns: int = 0
    running: bool = False
    foreign: list[str] = field(default_factory=list)
    """Its journals whose pid means another process here (written in another pid namespace or on
    another host): judged by their lock and their records (`_ended`), never by that pid."""
    ids: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    """(st_dev, st_ino) of each file as counted: a file is removed only while it is still that one."""


def default_dir(environ: Optional[Mapping[str, str]] = None) -> str:
    """Where journals go when no ``--log`` names a place: ``$LORA_OTEL_DIR`` (relative: to the
    working directory), else the per-user state directory (`lora_otel._boot.paths.state_dir`), else
    ``$TMPDIR/lora-otel-<uid>``."""
    env = os.environ if environ is None else environ
    d = env.get("LORA_OTEL_DIR") or paths.state_dir(env) or paths.fallback_dir(env)
    return os.path.abspath(d)


def _head(path: str) -> dict[str, object]:
    """The journal's first record (the process start), or {} when it cannot be read."""
    try:
        fd = files.open_regular(path, os.O_RDONLY | files.O_NOFOLLOW)
        with open(fd, "rb") as f:
            line = f.readline(1 << 16)
        rec = json.loads(line)
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _running(head: Mapping[str, object]) -> bool:
    """Whether the process a journal's first record names still runs (its pid, with the same start
    time, so a re-used pid does not count)."""
    from lora_otel.journal.reader import pid_runs

    pid, ticks = head.get("pid"), head.get("start_ticks")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    return pid_runs(pid, ticks if isinstance(ticks, int) and not isinstance(ticks, bool) else None)


def _here(head: Mapping[str, object]) -> bool:
    """Whether the journal's ``pid`` means a process of this pid namespace on this host: its first
    record names this namespace (``pidns``) and this host (``host.name``), or does not say (a
    journal written before they were recorded, or without ``/proc``)."""
    ns = head.get("pidns")
    if isinstance(ns, int) and not isinstance(ns, bool) and ns != paths.pid_namespace():
        return False
    attrs = head.get("attrs")
    host = attrs.get("host.name") if isinstance(attrs, dict) else None
    return not isinstance(host, str) or host == os.uname().nodename


def _ended(path: str) -> bool:
    """Whether a journal written elsewhere (`Run.foreign`) says its process is over, which its pid
    cannot tell here: an ``exit`` or ``exec`` record, or a promotion (a job holds the lock on its
    journal for its whole life: asked while retention holds that lock, it is gone). A process
    killed before it became a job cannot be told from one frozen there: its journal is kept."""
    from lora_otel.journal.reader import read_journal

    try:
        j = read_journal(path)
    except Exception:  # noqa: BLE001 - unreadable: nothing proves its process over
        return False
    promoted = j.root is not None and "lora_otel.promoted" in j.root.attrs
    return j.exit is not None or j.exec is not None or promoted


def runs_in(directory: str) -> list[Run]:
    """The runs in ``directory`` (not recursive), oldest first; only regular files of this user's.

    A journal ``<stem>.<pid>.otel.jsonl`` beside ``<stem>.otel.jsonl`` is a forked child of that run,
    not a run of its own. A file belongs to the journal with the longest stem its name starts with.
    """
    me = os.geteuid()
    owned: dict[str, os.stat_result] = {}
    # One entry at a time, only this user's kept: 100,000 files another user left in a shared
    # directory, listed whole, took the sidecar from 16 to 110 MB (and a job in a tight memory
    # cgroup with it).
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_uid == me:
                    owned[entry.name] = st
    except OSError:
        return []
    stems = {name[: -len(JOURNAL_SUFFIX)] for name in owned if name.endswith(JOURNAL_SUFFIX)}

    def top(stem: str) -> str:
        m = _FORKED.fullmatch(stem)
        while m and m.group(1) in stems:
            stem = m.group(1)
            m = _FORKED.fullmatch(stem)
        return stem

    runs: dict[str, Run] = {}
    for name, st in owned.items():
        stem = _stem_of(name, stems)
        if stem is None:
            continue
        head_stem = top(stem)
        run = runs.get(head_stem)
        if run is None:
            run = runs[head_stem] = Run(os.path.join(directory, head_stem + JOURNAL_SUFFIX))
        path = os.path.join(directory, name)
        run.files.append(path)
        run.ids[path] = (st.st_dev, st.st_ino)
        run.size += st.st_size
        run.changed_ns = max(run.changed_ns, st.st_mtime_ns)
        if name.endswith(JOURNAL_SUFFIX):
            head = _head(path)
            if _here(head):
                run.running = run.running or _running(head)
            else:
                run.foreign.append(path)
            ts = head.get("ts")
            if name == head_stem + JOURNAL_SUFFIX:
                run.start_ns = ts if isinstance(ts, int) and not isinstance(ts, bool) else st.st_mtime_ns
    for run in runs.values():
        run.files.sort()
        run.start_ns = run.start_ns or run.changed_ns
    return sorted(runs.values(), key=lambda r: (r.start_ns, r.journal))


def _stem_of(name: str, stems: set[str]) -> Optional[str]:
    """The longest journal stem ``name`` is a file of (``<stem>.<sibling suffix>``), or None."""
    i = len(name)
    while True:
        i = name.rfind(".", 0, i)
        if i <= 0:
            return None
        if name[:i] in stems and _SIBLING.fullmatch(name[i + 1 :]):
            return name[:i]


def newest_run(directory: str) -> Optional[str]:
    """The top journal of the run that started last in ``directory``, or None when there is none."""
    runs = [r for r in runs_in(directory) if os.path.isfile(r.journal)]
    return runs[-1].journal if runs else None


def limits(environ: Optional[Mapping[str, str]] = None) -> tuple[int, int, list[str]]:
    """``(runs, bytes, problems)`` from ``LORA_OTEL_KEEP`` and ``LORA_OTEL_KEEP_MB`` (0: no limit);
    a bad value is a problem (one line) and the default is used."""
    env = os.environ if environ is None else environ
    problems = []
    out = []
    for name, default in (("LORA_OTEL_KEEP", KEEP_RUNS), ("LORA_OTEL_KEEP_MB", KEEP_MB)):
        raw = env.get(name, "").strip()
        value = default
        if raw:
            try:
                value = int(raw)
                if value < 0:
                    raise ValueError
            except ValueError:
                problems.append("%s=%r is not a whole number >= 0; using %d" % (name, raw, default))
                value = default
        out.append(value)
    return out[0], out[1] * 1_000_000, problems


def prune(
    directory: str,
    keep_runs: int = KEEP_RUNS,
    keep_bytes: int = KEEP_MB * 1_000_000,
    now_ns: Optional[int] = None,
    quiet_s: float = QUIET_S,
) -> list[Run]:
    """Remove the oldest finished runs of ``directory`` beyond ``keep_runs`` runs or ``keep_bytes``
    bytes (0: no such limit), newest kept first; returns the runs removed.

    Runs still running count towards the limits but are never removed, nor is a run whose files
    changed in the last ``quiet_s`` seconds, nor the newest run. Each file is unlinked only when it
    is still the regular file of this user's that was counted (device, inode).
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    runs = runs_in(directory)
    removed = []
    count = total = 0
    for i, run in enumerate(reversed(runs)):
        count += 1
        total += run.size
        over = (keep_runs and count > keep_runs) or (keep_bytes and total > keep_bytes)
        if not over or i == 0 or run.running or now_ns - run.changed_ns < quiet_s * 1e9:
            continue
        locks = _lock_all(run)
        if locks is None:
            continue  # a process of the run holds its journal (or it cannot be told)
        try:
            if _running_now(run) or not all(_ended(p) for p in run.foreign):
                continue
            for path in run.files:
                _unlink_if_same(path, run.ids[path])
        finally:
            for fd in locks:
                os.close(fd)
        count -= 1
        total -= run.size
        removed.append(run)
    removed.reverse()
    return removed


def _lock(path: str) -> int:
    """A descriptor of ``path`` holding an exclusive ``flock`` on it (no process of the run holds
    the journal: its owner's lock is gone with the owner); -1 when one holds it, or when that
    cannot be told (no lock on this file system); -2 when the file is gone. Asked only of a run
    about to be removed (old, quiet for a minute), held while its files are unlinked: a job
    taking its own lock meanwhile (`lora_otel._boot.core.lock_journal`) tries again."""
    import fcntl

    try:  # a FIFO, device or socket put there since the listing is never opened for good nor locked
        fd = files.open_regular(path, os.O_RDONLY | files.O_NOFOLLOW)
    except FileNotFoundError:
        return -2
    except OSError:  # a symlink, not a regular file (UnsafeFile), unreadable
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return -1
    return fd


def _lock_all(run: Run) -> Optional[list[int]]:
    """Exclusive locks on every journal of ``run`` (their descriptors, to close once its files are
    removed), or None when a process of the run holds one (see `_lock`)."""
    fds: list[int] = []
    for path in run.files:
        if path.endswith(JOURNAL_SUFFIX):
            fd = _lock(path)
            if fd == -1:
                for held in fds:
                    os.close(held)
                return None
            if fd >= 0:
                fds.append(fd)
    return fds


def _running_now(run: Run) -> bool:
    """Looked at again right before removing: a process of the run that started meanwhile."""
    heads = [_head(p) for p in run.files if p.endswith(JOURNAL_SUFFIX)]
    return any(_running(h) for h in heads if _here(h))


def _unlink_if_same(path: str, ident: tuple[int, int]) -> None:
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == ident:
            os.unlink(path)
    except OSError:
        pass
