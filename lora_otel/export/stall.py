"""Stall detection: is a journal's deepest open span past its limit, or has the process frozen?

A pure function of a journal, the time and the process's liveness, so the supervisor, the sidecar
and ``lora-otel watch``/``inspect`` can share it. Two kinds:

- ``alive``: the process still beats, but a stage has been open longer than its limit —
  ``arguments`` 60 s, each ``import`` 120 s, ``cuda init``/``cuda probe`` 120 s, and for
  ``training`` the time since the last optimizer step, max(120 s, 20 × the median step time);
  user stages have no limit unless one is configured, and one inside ``training`` (an ``epoch N``
  span) leaves the step-gap rule of ``training`` in force.
- ``frozen``: the process exists but its once-per-second beat has stopped for 10 s (the GIL held in
  C code, SIGSTOP, uninterruptible I/O) — whatever stage it is in. ``LORA_OTEL_FROZEN_AFTER``
  changes the 10 s.

Limits are configured by ``--stall-after``/``LORA_OTEL_STALL_AFTER``: a number of seconds for
every stage (``300``), or per stage (``import=300,cuda init=60,training=900,default=600``); a
stage is matched by its full name first (``import bitsandbytes=900``), then by kind (``import``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

from lora_otel._boot import limits as _limits  # one definition, shared with the job itself
from lora_otel.export.inspect import deepest_open_span
from lora_otel.export.reader import Journal, Span

DEFAULT_LIMITS_S: dict[str, float] = _limits.DEFAULT_LIMITS_S
FROZEN_AFTER_S = _limits.FROZEN_AFTER_S
TRAINING_STEP_FACTOR = _limits.TRAINING_STEP_FACTOR


def frozen_after_from_env(environ=None) -> float:
    """``LORA_OTEL_FROZEN_AFTER`` (seconds without a beat before a live process counts as frozen), default 10."""
    import os

    try:
        return _limits.parse_frozen_after((os.environ if environ is None else environ).get(_limits.FROZEN_AFTER_ENV))
    except _limits.LimitError as e:
        raise StallConfigError(str(e)) from None


class StallConfigError(ValueError):
    """A bad ``--stall-after``/``LORA_OTEL_STALL_AFTER`` value; the message is one line."""


@dataclass(frozen=True)
class Stall:
    kind: str  # "alive" or "frozen"
    span: Span
    open_for_s: float  # how long the stage has been open (training: since the last step)
    limit_s: float
    reason: str  # one English sentence

    @property
    def status_message(self) -> str:
        return "stalled: %s open for %d s" % (self.span.name, self.open_for_s)


def parse_limits(text: Optional[str]) -> dict[str, float]:
    """``"300"`` or ``"import=300,cuda init=60"`` → limits merged over the defaults (`lora_otel._boot.limits`)."""
    try:
        return _limits.parse_limits(text)
    except _limits.LimitError as e:
        raise StallConfigError(str(e)) from None


def limit_for(span: Span, limits: dict[str, float]) -> Optional[float]:
    if span.name in limits:
        return limits[span.name]
    kind = "import" if span.name.startswith("import ") else span.name
    if kind in limits:
        return limits[kind]
    return limits.get("default")


def median_step_s(journal: Journal) -> Optional[float]:
    """Median seconds per optimizer step, from consecutive beats where steps advanced."""
    per_step = []
    samples = journal.step_samples
    for (t0, s0), (t1, s1) in zip(samples, samples[1:]):
        if s1 > s0 and t1 > t0:
            per_step.append((t1 - t0) / 1e9 / (s1 - s0))
    return statistics.median(per_step) if per_step else None


def detect(journal: Journal, now_ns: int, alive: bool, limits: Optional[dict[str, float]] = None,
           frozen_after_s: float = FROZEN_AFTER_S) -> Optional[Stall]:
    """The stall in ``journal`` at ``now_ns``, or None. ``alive``: the process still exists."""
    if not alive or journal.exit is not None:
        return None
    limits = limits or DEFAULT_LIMITS_S
    span = deepest_open_span(journal)
    if span is None:
        return None
    last_beat = journal.last_beat_ns or (journal.root.start_ns if journal.root else span.start_ns)
    silent_s = (now_ns - max(last_beat, journal.last_evidence_ns or 0)) / 1e9
    if silent_s >= frozen_after_s:
        return Stall("frozen", span, (now_ns - span.start_ns) / 1e9, frozen_after_s,
                     "the process exists but has not beaten for %d s (frozen: GIL held in native code, "
                     "stopped, or in uninterruptible I/O)" % silent_s)
    if span.name != "training" and limit_for(span, limits) is None:
        # A stage with no limit of its own inside `training` (an `epoch N` span from a trainer
        # integration, a user's stage): the step-gap rule of the enclosing training span holds.
        ancestor: Optional[Span] = span
        seen: set[str] = set()  # a corrupt journal's parents may form a cycle
        while ancestor is not None and ancestor.name != "training" and ancestor.span_id not in seen:
            seen.add(ancestor.span_id)
            ancestor = journal.span(ancestor.parent_id) if ancestor.parent_id else None
        if ancestor is not None and ancestor.name == "training" and ancestor.is_open:
            span = ancestor
    if span.name == "training":
        floor = limit_for(span, limits) or DEFAULT_LIMITS_S["training"]
        med = median_step_s(journal)
        limit = max(floor, TRAINING_STEP_FACTOR * med) if med else floor
        since = journal.last_step_ns if journal.last_step_ns and journal.last_step_ns > span.start_ns else span.start_ns
        gap = (now_ns - since) / 1e9
        if gap >= limit:
            return Stall("alive", span, gap, limit, "no optimizer step for %d s (limit %d s%s)" % (
                gap, limit, ", 20x the median step of %.2f s" % med if med and limit > floor else ""))
        return None
    limit = limit_for(span, limits)
    open_for = (now_ns - span.start_ns) / 1e9
    if limit is not None and open_for >= limit:
        return Stall("alive", span, open_for, limit, "%s open for %d s, limit %d s" % (span.name, open_for, limit))
    return None
