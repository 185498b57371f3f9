"""Stall detection: is a journal's deepest open span past its limit, or has the process frozen?

A pure function of a journal, the time and the process's liveness, so the supervisor, the sidecar
and ``lora-otel watch``/``inspect`` can share it. Two kinds:

- ``alive``: the process still beats, but a stage has been open longer than its limit —
  ``arguments`` 60 s, each ``import`` 120 s, ``cuda init``/``cuda probe`` 120 s, and for
  ``training`` the time since the last optimizer step, max(120 s, 20 × the median step time), or
  exactly N when ``training=N`` is given (`limits.training_limit`);
  user stages have no limit unless one is configured, and one inside ``training`` (an ``epoch N``
  span) leaves the step-gap rule of ``training`` in force.
- ``between``: no stage is open other than ``process`` (and no ``training``), and none has been
  for 120 s since the last stage ended (``between=`` changes it): the program's own code between
  stages, e.g. a download frozen at 0 B/s after ``import torch``.
- ``frozen``: the process exists but its once-per-second beat has stopped for 10 s (the GIL held in
  C code, SIGSTOP, uninterruptible I/O) — whatever stage it is in. ``LORA_OTEL_FROZEN_AFTER``
  changes the 10 s. A beat is a record when something changed, else a touch of the journal's
  modification time: frozen means neither a record nor the modification time moved
  (`Journal.last_life_ns`). A process with no beat by design (``config.beat_off``: a resource
  limit the beat thread would have cut into) is never called frozen.

Limits are configured by ``--stall-after``/``LORA_OTEL_STALL_AFTER``: a number of seconds for
every stage (``300``), or per stage (``import=300,cuda init=60,training=900,default=600``); a
stage is matched by its full name first (``import bitsandbytes=900``), then by kind (``import``).

One set of limits: the job records the raw texts of ``LORA_OTEL_STALL_AFTER`` and
``LORA_OTEL_FROZEN_AFTER`` in its ``process`` start record (``config.stall_after``,
``config.frozen_after``); `detect` called without limits applies those (`journal_limits`), so
``inspect``, ``watch`` and the sidecar agree with the job. A journal from before that record falls
back to this process's environment; a command-line ``--stall-after`` wins over both.

Learned limits (``learned``: `lora_otel.analysis.learned`): a stage that earlier runs say takes at
most L s is called stalled at max(30 s, 5 × L) when that is shorter than its limit (or it has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from lora_otel._boot.seam import duration
from lora_otel._boot.seam import limits as _limits  # one definition, shared with the job itself
from lora_otel.journal.reader import Journal, Span
from lora_otel.journal.tree import deepest_open_span, last_stage_end

DEFAULT_LIMITS_S: dict[str, float] = _limits.DEFAULT_LIMITS_S
FROZEN_AFTER_S = _limits.FROZEN_AFTER_S
TRAINING_STEP_FACTOR = _limits.TRAINING_STEP_FACTOR


def frozen_after_from_env(environ: Optional[Mapping[str, str]] = None) -> float:
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
    kind: str  # "alive", "frozen" or "between"
    span: Span  # the stalled stage; for "between" the root ``process`` span
    open_for_s: (
        float  # how long the stage has been open (training: since the last step; between: since the last stage ended)
    )
    limit_s: float
    reason: str  # one English sentence
    learned: Any = None  # the `learned.Learned` whose limit applied, or None
    after: Optional[str] = None  # "between": the stage that ended last (None: none has)
    since_ns: Optional[int] = None  # "between": when it ended (or the process started)
    limit_why: str = ""  # why the limit is not the one given: "20x the median step of 2 s" ("": it is)
    silent_s: Optional[float] = None  # "frozen": seconds since its last beat

    @property
    def stage(self) -> str:
        """The stage's name; "between stages" when none is open."""
        return (
            "between stages"
            if self.kind == "between" or (self.span.parent_id is None and self.span.name == "process")
            else self.span.name
        )

    @property
    def status_message(self) -> str:
        if self.kind == "between":
            return "stalled: no stage open for %s%s" % (
                duration(self.open_for_s),
                " since %s ended" % self.after if self.after else "",
            )
        return "stalled: %s open for %s" % (self.span.name, duration(self.open_for_s))


def parse_limits(text: Optional[str]) -> dict[str, float]:
    """``"300"`` or ``"import=300,cuda init=60"`` → limits merged over the defaults (`lora_otel._boot.limits`)."""
    try:
        return _limits.parse_limits(text)
    except _limits.LimitError as e:
        raise StallConfigError(str(e)) from None


def journal_limits(
    journal: Journal,
    limits: Optional[dict[str, float]] = None,
    frozen_after_s: Optional[float] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> tuple[dict[str, float], float]:
    """The limits ``journal``'s process ran with: ``limits``/``frozen_after_s`` when given (a command
    line's), else the raw texts its start record holds (``config.stall_after``/``frozen_after``;
    null there means the defaults), else — a journal from before those were recorded — this
    process's ``LORA_OTEL_STALL_AFTER``/``LORA_OTEL_FROZEN_AFTER``. A bad text means the default."""
    import os

    env = os.environ if environ is None else environ
    config = journal.config if isinstance(journal.config, dict) else {}
    if limits is None:
        text = config["stall_after"] if "stall_after" in config else env.get("LORA_OTEL_STALL_AFTER")
        try:
            limits = parse_limits(text if isinstance(text, str) else None)
        except StallConfigError:
            limits = parse_limits(None)
    if frozen_after_s is None:
        text = config["frozen_after"] if "frozen_after" in config else env.get("LORA_OTEL_FROZEN_AFTER")
        try:
            frozen_after_s = frozen_after_from_env({"LORA_OTEL_FROZEN_AFTER": text if isinstance(text, str) else ""})
        except StallConfigError:
            frozen_after_s = FROZEN_AFTER_S
    return limits, frozen_after_s


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
    return median(per_step) if per_step else None


def median(values: list[float]) -> float:
    """``statistics.median``, without importing `statistics` (it loads `decimal`, `fractions` and
    `random`: about 1 MB in the sidecar, which follows every job; docs/performance.md)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def detect(
    journal: Journal,
    now_ns: int,
    alive: bool,
    limits: Optional[dict[str, float]] = None,
    frozen_after_s: Optional[float] = None,
    learned: Optional[Mapping[str, Any]] = None,
) -> Optional[Stall]:
    """The stall in ``journal`` at ``now_ns``, or None. ``alive``: the process still exists.

    ``limits``/``frozen_after_s`` None: the ones the journal recorded (`journal_limits`).
    ``learned``: stage name → `learned.Learned` (what earlier runs say about that stage)."""
    if not alive or journal.exit is not None:
        return None
    limits, frozen_after_s = journal_limits(journal, limits, frozen_after_s)
    span = deepest_open_span(journal)
    if span is None:
        return None
    last_beat = journal.last_beat_ns or (journal.root.start_ns if journal.root else span.start_ns)
    # The file's modification time is the beat that wrote no record. One a little after ``now_ns``
    # is a beat that touched the file after the reader took its time: alive now. One far after it
    # belongs to another clock than the records' (a journal written for a replayed timeline): not a
    # sign of life.
    life = journal.last_life_ns or 0
    if life > now_ns:
        life = now_ns if life - now_ns < frozen_after_s * 1e9 else journal.last_evidence_ns or 0
    silent_s = (now_ns - max(last_beat, life)) / 1e9
    config = journal.config if isinstance(journal.config, dict) else {}
    if silent_s >= frozen_after_s and not config.get("beat_off"):  # (no beat by design: resource limits)
        return Stall(
            "frozen",
            span,
            (now_ns - span.start_ns) / 1e9,
            frozen_after_s,
            "the process exists but has not beaten for %s (frozen: GIL held in native code, "
            "stopped, or in uninterruptible I/O)" % duration(silent_s),
            silent_s=silent_s,
        )
    if (span is journal.root or span.name == "arguments") and not idle_may_be_stuck(journal):
        return None
    if span is journal.root:
        return _between(journal, span, now_ns, limits)
    rule = learned.get(span.name) if learned else None
    learned_limit = rule.limit_s if rule is not None else None
    if span.name != "training" and limit_for(span, limits) is None and learned_limit is None:
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
        step_limit, why = _limits.training_limit(limits, median_step_s(journal))
        since = journal.last_step_ns if journal.last_step_ns and journal.last_step_ns > span.start_ns else span.start_ns
        gap = (now_ns - since) / 1e9
        if gap >= step_limit:
            return Stall(
                "alive",
                span,
                gap,
                step_limit,
                "no optimizer step for %s (limit %s%s)"
                % (duration(gap), duration(step_limit), ", " + why if why else ""),
                limit_why=why,
            )
        return None
    limit = limit_for(span, limits)
    used = None
    if learned_limit is not None and (limit is None or learned_limit < limit):
        limit, used = learned_limit, rule
    open_for = (now_ns - span.start_ns) / 1e9
    if limit is not None and open_for >= limit:
        return Stall(
            "alive",
            span,
            open_for,
            limit,
            "%s open for %s, limit %s%s"
            % (
                span.name,
                duration(open_for),
                duration(limit),
                " (learned: %s)" % used.describe() if used is not None else "",
            ),
            learned=used,
        )
    return None


_UI_IMPORTS = ("import gradio", "import uvicorn", "import streamlit")


def idle_may_be_stuck(journal: Journal) -> bool:
    """Whether quiet time with no stage open (or ``arguments`` still open) may mean this process is
    stuck — the job's own narration's rule (`lora_otel._boot.narrate`), so every view agrees: a
    training job's own process or a quiet child that is no worker of its parent (config ``worker``:
    a forked or spawned pool or DataLoader worker idles between tasks by design), that has imported
    torch, runs no web UI (gradio, uvicorn, streamlit wait for their users), is no notebook kernel,
    REPL or Jupyter server (``lora_otel.interactive`` on the root span) and is not a distributed
    launcher waiting for its
    ranks now (`lora_otel._boot.narrate.waits_for_ranks`: a child with a rank variable of its own).
    A process waiting on its workers — a multiprocessing pool, a ProcessPoolExecutor, a subprocess —
    can be stuck like any job. A service, pip, a helper script or a DataLoader worker idles by design."""
    config = journal.config if isinstance(journal.config, dict) else {}
    if config.get("quiet") is True and config.get("worker") is not False:  # a worker (older journals: any quiet child)
        return False
    root_attrs = journal.root.attrs if journal.root is not None else {}
    if root_attrs.get("lora_otel.interactive"):  # a kernel, a REPL, a Jupyter server: waits for a person
        return False
    names = {span.name for span in journal.spans}
    if (
        "import torch" not in names
        and "training" not in names
        and root_attrs.get("lora_otel.torch.imported") is not True
    ):
        return False
    if any(name in names for name in _UI_IMPORTS):
        return False
    from lora_otel._boot.seam import waits_for_ranks  # the job's own rule, read from outside

    return not (journal.pid and waits_for_ranks(journal.pid))


def _between(journal: Journal, root: Span, now_ns: int, limits: dict[str, float]) -> Optional[Stall]:
    """No stage open but ``process``: stalled once ``between`` seconds have passed since the last one ended."""
    limit = limits.get("between", DEFAULT_LIMITS_S["between"])
    after, since = last_stage_end(journal)
    quiet_s = (now_ns - since) / 1e9
    if quiet_s < limit:
        return None
    return Stall(
        "between",
        root,
        quiet_s,
        limit,
        "no stage open for %s%s, limit %s"
        % (duration(quiet_s), " since %s ended" % after if after else "", duration(limit)),
        after=after,
        since_ns=since,
    )
