"""Learned limits: how long each start-up stage usually takes, from earlier runs of the same program.

Journals of earlier runs in the same directory (same ``service.name``, another trace, ended, up to
the latest `RUNS`) say how long each stage took (`baseline.journal_phases`, the same phases a
baseline file keeps); a baseline named by ``LORA_OTEL_BASELINE`` adds its medians for stages no
earlier run here has. From them:

- *slow*: a stage open for ``max(3 × usual, 10 s)`` is said to be slow
  (``import torch: 30 s so far, usually 2.4 s over the last 5 runs``);
- *stalled*: at ``max(30 s, 5 × the longest earlier run)``, when that is shorter than the stage's
  limit or it has none (`stall.detect`). The 30 s floor keeps a cold disk cache, which can make a
  stage 10× slower once, from paging anyone.

Pure functions of journals; nothing here prints.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any, Optional

from lora_otel._boot.seam import duration
from lora_otel.analysis.baseline import STARTUP, journal_phases
from lora_otel.analysis.stall import median as median_of
from lora_otel.journal.reader import Journal, JournalError, read_journal

RUNS = 5
SLOW_FACTOR = 3.0
SLOW_FLOOR_S = 10.0
STALL_FACTOR = 5.0
STALL_FLOOR_S = 30.0
MAX_CANDIDATES = 200  # journals looked at (by their first line) in one directory
SUFFIX = ".otel.jsonl"


@dataclass(frozen=True)
class Learned:
    """What earlier runs say about one stage."""

    stage: str
    usual_s: float  # the median
    longest_s: float
    runs: int
    source: str  # "5 earlier runs", "baseline run.baseline.json"

    @property
    def slow_s(self) -> float:
        """Open this long, the stage is slow."""
        return max(SLOW_FACTOR * self.usual_s, SLOW_FLOOR_S)

    @property
    def limit_s(self) -> float:
        """Open this long, the stage is stalled (when shorter than its own limit)."""
        return max(STALL_FLOOR_S, STALL_FACTOR * self.longest_s)

    def describe(self) -> str:
        return "usually %s over %s" % (seconds_text(self.usual_s), self.over())

    def over(self) -> str:
        return "the last %d runs" % self.runs if self.source.endswith("earlier runs") else self.source

    def to_json(self) -> dict[str, Any]:
        return {"from": self.source, "usual_s": round(self.usual_s, 3), "longest_s": round(self.longest_s, 3)}


def seconds_text(s: float) -> str:
    return duration(s)


def _first_record(path: str) -> Optional[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)
    line = data.split(b"\n", 1)[0]
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("name") == "process" else None


def earlier_journals(journal: Journal, runs: int = RUNS) -> list[Journal]:
    """Up to ``runs`` journals of earlier runs of the same program beside ``journal``, newest first:
    same ``service.name``, another trace, started before it, exit status 0; only regular files of
    this user's that nobody else can write (another user's planted journal teaches nothing)."""
    root = journal.root
    if root is None:
        return []
    service = root.attrs.get("service.name")
    directory = os.path.dirname(os.path.abspath(journal.path))
    try:
        names = [n for n in os.listdir(directory) if n.endswith(SUFFIX)]
    except OSError:
        return []
    paths = []
    for name in names:
        path = os.path.join(directory, name)
        if os.path.abspath(path) == os.path.abspath(journal.path):
            continue
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            paths.append((st.st_mtime, path))  # only this user's own journals teach (a shared directory)
    out: list[Journal] = []
    for _, path in sorted(paths, reverse=True)[:MAX_CANDIDATES]:
        first = _first_record(path)
        if first is None or first.get("trace_id") == root.trace_id:
            continue
        attrs = first.get("attrs")
        if not isinstance(attrs, dict):
            attrs = {}
        ts = first.get("ts")
        if attrs.get("service.name") != service or not isinstance(ts, int) or ts >= root.start_ns:
            continue
        try:
            earlier = read_journal(path)
        except JournalError:
            continue
        if earlier.exit is None or earlier.exit.get("code") not in (0, None):
            continue
        out.append(earlier)
        if len(out) >= runs:
            break
    return out


def learn(journal: Journal, environ: Optional[dict[str, str]] = None) -> dict[str, Learned]:
    """Stage name → `Learned`, from earlier runs beside ``journal`` and ``LORA_OTEL_BASELINE``."""
    seen: dict[str, list[float]] = {}
    earlier = earlier_journals(journal)
    for other in earlier:
        for name, (seconds, _) in journal_phases(other).items():
            if name != STARTUP:
                seen.setdefault(name, []).append(seconds)
    out = {
        name: Learned(name, median_of(values), max(values), len(values), "%d earlier runs" % len(values))
        for name, values in seen.items()
    }
    env = os.environ if environ is None else environ
    if env.get("LORA_OTEL_BASELINE"):
        from lora_otel.analysis.baseline import configured

        try:
            base = configured(journal, env)
        except Exception:  # noqa: BLE001 - a bad baseline file teaches nothing; the diagnosis says why elsewhere
            base = None
        if base is not None:
            label = "baseline %s" % os.path.basename(env["LORA_OTEL_BASELINE"])
            for name, median in base.phases.items():
                if name != STARTUP and name not in out and isinstance(median, (int, float)):
                    out[name] = Learned(name, float(median), float(median), 1, label)
    return out
