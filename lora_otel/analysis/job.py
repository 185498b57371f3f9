"""Jobs: the journals that share one trace id, seen together (``lora-otel inspect DIR``, ``watch DIR``).

A launcher and the ranks or workers it starts share one trace through ``TRACEPARENT``, so in a
directory of journals a *job* is the journals with the same trace id. Within a job, processes are
ordered by ``rank`` (the root span attribute set under torchrun/accelerate, Slurm or Open MPI): the
processes without one (a launcher) first by start time, then each rank followed by its own
children (a child without a rank of its own takes its parent's). Without ranks, by start time.

Each process gets an *outcome*, by the same rules as ``lora-otel watch``'s exit status:
``finished`` (an exit record, normal, code 0; or it exec'd another program; or its parent reaped it
with code 0), ``stopped`` (gone
without an exit record, after another process of the job journaled stopping it: a
``multiprocessing.Pool`` shutting down terminates its workers), ``failed`` (an exit record with an exception or a
non-zero code), ``killed`` (no exit record and the process is gone, or ``lora-otel run`` recorded a
death by a signal), ``stalled`` (running, and `stall.detect` finds a stage past its limit or the
beat stopped) or ``running``.

A job's *callout* names the one process to look at, first match wins:

1. the one *stuck*: a stalled running process, or a failed/killed one that was already past a
   stall limit when its journal ends; of several, the one stuck longest (it is usually the cause,
   the others wait for it in a collective);
2. the one that went wrong first: of the failed/killed processes, the first to end — by its exit
   record, or its traced parent's reap of it (``child exit``, `lora_otel.analysis.ends`), or, gone
   without either, its last sign of life (a launcher last: its failure follows its children's). A
   process that failed of its own error within `UNSURE_NS` after one gone without a word may have
   been first and goes before it; those of the same outcome within 5 s ended "together". The later
   failures are named after it, as consequences where they read as one (`consequence_of_first`);
3. the slowest: of running processes that train, one at least 3 steps (and 10 %) behind the others;
4. none (every process finished normally, or they all advance together).

The job's outcome is its callout's (``running`` for the slowest), else ``running`` while any
process runs, else ``finished``. This module is the model and its phrases; how ``inspect`` and
``watch`` lay jobs out is `lora_otel.cli.jobs`. Standard library only. One module (a little over 600 lines): the outcome
rules, the callout and the phrases read the same `Proc` fields, in the order the rules above give.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from lora_otel.analysis.ends import ChildEnd, child_ends, describe_end, end_of
from lora_otel.analysis.stall import FROZEN_AFTER_S, Stall, detect
from lora_otel.journal.reader import (
    Journal,
    JournalError,
    ProcessState,
    format_duration,
    listed_journals,
    process_state,
    read_journal,
)
from lora_otel.journal.tree import View, _display, deepest_open_span

if TYPE_CHECKING:
    from lora_otel.analysis.verdict import Verdict

OUTCOME_STATUS = {"finished": 0, "stopped": 0, "running": 0, "failed": 1, "killed": 3, "stalled": 3}
"""A job's outcome → the exit status of ``lora-otel inspect --summary`` (the worst job's counts)."""

TOGETHER_NS = 5_000_000_000
"""Processes that ended this close to each other ended together (a job killed as a whole): none is "first"."""
SLOWEST_MIN_STEPS = 3
SLOWEST_MIN_FRACTION = 0.10
"""A running rank is called the slowest when at least this many steps, and this fraction of the
leader's steps, behind every other training process."""


def _int_attr(attrs: dict[str, Any], key: str) -> Optional[int]:
    value = attrs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(eq=False)
class Proc:
    """One process of a job: its journal, its state at ``view.now_ns`` and its outcome."""

    journal: Journal
    state: ProcessState
    view: View
    outcome: str
    stall: Optional[Stall] = None
    """Running: the stall `detect` finds now. Failed or killed: the stall it was in when its journal ends."""
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    parent: Optional[Proc] = None
    children: list[Proc] = field(default_factory=list)
    effective_rank: Optional[int] = None
    depth: int = 0
    stopped_by: Optional[str] = None
    """Outcome ``stopped``: the signal its parent journaled sending (``SIGTERM``)."""
    end: Optional[ChildEnd] = None
    """Gone without an exit record: how it ended, as its parent's ``child exit`` event says."""
    consequence: Optional[str] = None
    """Failed or killed after the job's first failure, as a consequence of it: why that is thought
    (``lost peer``, ``SIGTERM``, ``a launcher``); set by the callout."""

    @property
    def start_ns(self) -> int:
        journal = self.journal
        return journal.root.start_ns if journal.root is not None else journal.spans[0].start_ns

    @property
    def end_ns(self) -> int:
        """When it ended (exit record; else its parent's reap of it; else the last evidence of
        life), or now while it runs."""
        if self.journal.exit is not None:
            exit_ts: int = self.journal.exit["ts"]  # the reader checked it is an int
            return exit_ts
        if self.journal.exec is not None:
            exec_ts: int = self.journal.exec["ts"]
            return exec_ts
        if self.end is not None and self.state != "running":
            return self.end.at_ns
        return self.view.reference_ns

    @property
    def order_ns(self) -> int:
        """When it ended, for the order of failures: `end_ns`, except for a process killed without an
        exit record whose parent reaped it later — a parent waiting on a sibling first reaps it
        late — which died after it was last seen alive and before that reap: at most one beat
        after its last sign of life (a live process touches its journal every beat)."""
        journal = self.journal
        if self.end is None or journal.exit is not None or journal.exec is not None or self.state == "running":
            return self.end_ns
        life = journal.last_life_ns
        config = journal.config if isinstance(journal.config, dict) else {}
        beat_s = config.get("beat_s")
        beat_ns = int(beat_s * 1e9) if isinstance(beat_s, (int, float)) and 0 < beat_s < 60 else 1_000_000_000
        return min(self.end.at_ns, life + beat_ns) if life else self.end.at_ns

    @property
    def end_known(self) -> bool:
        """Whether `end_ns` is when it ended (an exit record, or its parent reaped it), not only
        when it was last seen alive (a process gone without a word died some time after that)."""
        return self.journal.exit is not None or self.journal.exec is not None or self.end is not None

    @property
    def trace_id(self) -> str:
        journal = self.journal
        return journal.root.trace_id if journal.root is not None else journal.spans[0].trace_id

    @property
    def name(self) -> str:
        root = self.journal.root
        value = root.attrs.get("service.name") if root is not None else None
        return value if isinstance(value, str) and value else os.path.basename(self.journal.path)

    @property
    def role(self) -> str:
        """``rank`` (has a rank of its own), ``rank child`` (a rank's child, or a child with its
        parent's rank), ``launcher`` (no rank, started a program that is no worker of it), ``child``
        or ``process`` (a job whose only children are its workers is a process, not a launcher)."""
        own_rank_differs = self.parent is None or self.parent.effective_rank != self.rank
        if self.rank is not None and own_rank_differs:
            return "rank"
        if self.effective_rank is not None:
            return "rank child"
        if any(not child.is_worker for child in self.children):
            return "launcher"
        return "child" if self.parent is not None else "process"

    @property
    def is_worker(self) -> bool:
        """A worker of its parent (root config ``worker``: a forked or spawned pool or DataLoader
        worker, a resource tracker): its parent is a job with helpers, not a launcher."""
        config = self.journal.config if isinstance(self.journal.config, dict) else {}
        return config.get("quiet") is True and config.get("worker") is True

    @property
    def launches_ranks(self) -> bool:
        """Whether it started ranks of their own (a distributed launcher: torchrun's agent,
        ``accelerate launch``). Its quiet time is waiting for them, who speak for themselves; a
        process whose children are its workers (a pool, a subprocess) can be stuck like any
        (`lora_otel._boot.narrate.waits_for_ranks`, the same rule read from ``/proc``)."""
        return any(child.role == "rank" for child in self.children)

    @property
    def label(self) -> str:
        """``rank 1``, ``rank 1 child``, ``launcher``, ``worker`` (a child that is its parent's
        worker), ``child`` or ``process``."""
        role = self.role
        if role.startswith("rank"):
            return f"rank {self.effective_rank}" + (" child" if role == "rank child" else "")
        return "worker" if role == "child" and self.is_worker else role

    @property
    def who(self) -> str:
        """``rank 1 (pid 4243)``; ``pid 4243`` for a lone process; the file name without a pid."""
        pid = (
            f"pid {self.journal.pid}" if self.journal.pid is not None else _display(os.path.basename(self.journal.path))
        )
        return pid if self.role == "process" else f"{self.label} ({pid})"

    @property
    def tag(self) -> str:
        """How a job line names it: ``rank 1``, ``launcher``, or ``pid 4243``."""
        if self.role == "process":
            return f"pid {self.journal.pid}" if self.journal.pid is not None else "process"
        return self.label

    @property
    def stuck_since_ns(self) -> int:
        """Since when it has been stuck (only meaningful with a stall)."""
        assert self.stall is not None
        return self.view.reference_ns - round(self.stall.open_for_s * 1e9)


@dataclass
class Callout:
    """The process of a job to look at, and why: ``kind`` is stuck, failed, killed or slowest."""

    kind: str
    proc: Proc
    text: str


@dataclass
class Job:
    """The processes of one trace, ordered (module docstring), with the callout and outcome."""

    trace_id: str
    procs: list[Proc]
    callout: Optional[Callout]
    outcome: str
    phrase: str
    """One line on how the job is or ended, e.g. ``stalled at import bitsandbytes for 312 s (rank 1)``."""

    @property
    def start_ns(self) -> int:
        return min(proc.start_ns for proc in self.procs)

    @property
    def top(self) -> Proc:
        """The first process without a parent in the job (the launcher, or rank 0)."""
        return next((proc for proc in self.procs if proc.parent is None), self.procs[0])

    @property
    def name(self) -> str:
        return self.top.name

    @property
    def status(self) -> int:
        return OUTCOME_STATUS[self.outcome]

    @property
    def world_size(self) -> Optional[int]:
        sizes = {proc.world_size for proc in self.procs if proc.world_size is not None}
        return sizes.pop() if len(sizes) == 1 else None

    def missing_ranks(self) -> list[int]:
        """Ranks below the world size with no journal here (they may be on another node, or never started)."""
        size = self.world_size
        if size is None or size > 4096:
            return []
        present = {proc.rank for proc in self.procs if proc.rank is not None}
        return [rank for rank in range(size) if rank not in present]


@dataclass
class Unreadable:
    """A file in the directory that gave no process: unreadable, empty, or not a journal."""

    path: str
    reason: str


# --- building ------------------------------------------------------------------------------------


def outcome_of(journal: Journal, state: ProcessState, running_stall: Optional[Stall]) -> str:
    """finished / failed / killed / stalled / running (module docstring); the rules of watch's exit status."""
    if state == "running":
        return "stalled" if running_stall is not None else "running"
    if state == "exec'd":
        return "finished"  # the traced program ended by becoming another: not a failure
    exit_ = journal.exit
    if exit_ is None or exit_["how"] == "signal":
        return "killed"
    return "failed" if exit_["how"] == "exception" or exit_["code"] not in (0, None) else "finished"


def make_proc(
    journal: Journal,
    state: ProcessState,
    now_ns: int,
    limits: Optional[dict[str, float]] = None,
    frozen_after_s: Optional[float] = FROZEN_AFTER_S,
    stall: Optional[Stall] = None,
    stall_known: bool = False,
) -> Proc:
    """A process from its journal. ``stall``/``stall_known``: the stall a follower already detected."""
    view = View(journal, state, now_ns)
    if state == "running" and not stall_known:
        stall = detect(journal, now_ns, True, limits, frozen_after_s)
    elif state != "running":
        stall = None
    if stall is None and state == "running":
        stall = stall_from_record(journal, now_ns)
    outcome = outcome_of(journal, state, stall)
    if outcome in ("failed", "killed"):  # was it already stuck when the journal ends?
        stall = detect(
            dataclasses.replace(journal, exit=None), view.reference_ns, True, limits, frozen_after_s
        ) or stall_from_record(journal, view.reference_ns)
    view.stalled = stall is not None
    root = journal.root
    attrs = root.attrs if root is not None else {}
    return Proc(
        journal,
        state,
        view,
        outcome,
        stall,
        rank=_int_attr(attrs, "rank"),
        local_rank=_int_attr(attrs, "local_rank"),
        world_size=_int_attr(attrs, "world_size"),
    )


def stall_from_record(journal: Journal, now_ns: int) -> Optional[Stall]:
    """The journal's last ``stall`` record (watchdog or sidecar) as a `Stall`, while it still holds."""
    from lora_otel.analysis.verdict import from_record

    found = from_record(journal)
    if found is None or journal.root is None or found.kind == "died":
        return None
    record = journal.stalls[-1]
    span = journal.span(record["span_id"]) if isinstance(record.get("span_id"), str) else None
    span = span or journal.root
    since = record["ts"] - round((found.open_s or 0) * 1e9)
    return Stall(
        "frozen" if found.kind == "frozen" else "alive",
        span,
        max(now_ns - since, 0) / 1e9,
        found.limit_s or 0.0,
        found.diagnosis,
    )


def attach_verdicts(
    jobs: Iterable[Job], now_ns: int, frozen_after_s: Optional[float] = FROZEN_AFTER_S, by: str = "inspect"
) -> None:
    """Give each job's focus process its verdict (`lora_otel.analysis.verdict`): the stall record,
    or the diagnosis computed now for a live stalled process, its job's other journals as peers.
    ``frozen_after_s`` None: each journal's recorded one."""
    from lora_otel.analysis.verdict import current

    for job in jobs:
        proc = focus(job)
        if proc is None or (proc.stall is None and not proc.journal.stalls):
            continue
        peers = [other.journal for other in job.procs if other is not proc]
        verdict = current(
            proc.journal, proc.stall if proc.state == "running" else None, now_ns, peers, frozen_after_s, by
        )
        if verdict is not None and verdict.kind == "died" and proc.end is not None:
            verdict = reaped_verdict(verdict, proc)
        proc.view.verdict = verdict


def reaped_verdict(verdict: Verdict, proc: Proc) -> Verdict:
    """A ``died`` record written before (or without) its parent's ``child exit`` event, told again
    with it: the signal, and its time up to the reap."""
    from lora_otel.journal.tree import deepest_open_span

    assert proc.end is not None
    span = deepest_open_span(proc.journal)
    start = span.start_ns if span is not None else proc.start_ns
    where = "" if span is None or span is proc.journal.root else f" in {span.name}"
    open_s = max(proc.end.at_ns - start, 0) / 1e9
    end = proc.end
    if end.signal == "SIGKILL" and not end.oom_killed and verdict.evidence.get("oom"):
        end = dataclasses.replace(end, oom_killed=True)
    diagnosis = (
        f"The process was {describe_end(end)}{where} after {format_duration(round(open_s * 1e9))} "
        f"(its parent, pid {end.parent_pid}, reaped it)."
    )
    return dataclasses.replace(verdict, open_s=open_s, diagnosis=diagnosis)


def group_jobs(procs: Iterable[Proc]) -> list[Job]:
    """Group processes by trace id into jobs, each ordered and called out; jobs by start time."""
    by_trace: dict[str, list[Proc]] = {}
    for proc in procs:
        by_trace.setdefault(proc.trace_id, []).append(proc)
    jobs = [_make_job(trace_id, members) for trace_id, members in by_trace.items()]
    jobs.sort(key=lambda job: (job.start_ns, job.trace_id))
    return jobs


def _make_job(trace_id: str, procs: list[Proc]) -> Job:
    _link(procs)
    _mark_ended(procs)
    _mark_stopped(procs)
    procs.sort(key=_order_key)
    callout = _callout(procs)
    if callout is not None:
        outcome = "running" if callout.kind == "slowest" else callout.proc.outcome
    elif any(proc.outcome in ("running", "stalled") for proc in procs):
        outcome = "running"
    else:
        outcome = "finished"
    job = Job(trace_id, procs, callout, outcome, "")
    job.phrase = _phrase(job)
    return job


def _mark_ended(procs: list[Proc]) -> None:
    """A process gone without an exit record that its parent reaped (a ``child exit`` event of
    another process of the job) ended as that event says: killed by its signal; ``finished`` when
    it exited with code 0 (``os._exit(0)``), ``failed`` with another code."""
    ends = child_ends(proc.journal for proc in procs)
    if not ends:
        return
    for proc in procs:
        if proc.state == "running" or proc.journal.exit is not None or proc.journal.exec is not None:
            continue
        end = end_of(proc.journal, ends)
        if end is None or end.parent_pid == proc.journal.pid:
            continue
        proc.end = end
        proc.view.ended = (end.at_ns, describe_end(end))
        if proc.outcome == "killed" and end.signal is None and end.exit_code is not None:
            proc.outcome = "finished" if end.exit_code == 0 else "failed"


CONSEQUENCE_PATTERNS = (
    ("lost peer", "a lost peer"),
    ("connectionreset", "a connection reset"),
    ("connection reset", "a connection reset"),
    ("connectionabort", "a connection lost"),
    ("connection closed", "a connection lost"),
    ("connection refused", "a connection lost"),
    ("brokenpipe", "a broken pipe"),
    ("broken pipe", "a broken pipe"),
    ("remote process exited", "a lost peer"),
    ("has exited", "a lost peer"),
    ("childfailederror", "a child's failure"),
    ("processexitedexception", "a child's failure"),
    ("brokenprocesspool", "a child's failure"),
    ("eoferror", "a connection lost"),
    ("peer", "a lost peer"),
)
"""Words of an error that follows another process's death (lowercased): a rank whose peer died
loses its connection; a launcher reports its child's failure."""
SHUTDOWN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
"""Signals a launcher sends the rest of a job when one process of it failed."""


def consequence_of_first(proc: Proc) -> Optional[str]:
    """Why ``proc``'s end looks like a consequence of another process's failure, or None: it is a
    launcher (its failure reports its children's), it was stopped by a shutdown signal, or its
    error speaks of a lost peer or connection."""
    if proc.children:
        return "a launcher reporting its children" if proc.role == "launcher" else "reporting its workers' end"
    signal = proc.end.signal if proc.end is not None else None
    exit_ = proc.journal.exit
    if signal is None and exit_ is not None and exit_["how"] == "signal":
        code = exit_["code"]
        signal = (
            {128 + 15: "SIGTERM", 128 + 2: "SIGINT", 128 + 1: "SIGHUP"}.get(code) if isinstance(code, int) else None
        )
    if signal in SHUTDOWN_SIGNALS:
        return f"stopped with {signal}"
    message = exit_.get("message") if exit_ is not None else None
    text = (message if isinstance(message, str) else "").lower()
    for word, why in CONSEQUENCE_PATTERNS:
        if word in text:
            return why
    return None


TERMINATED_CHILD = "terminated child"
"""The root span event of a process about to stop a child with ``terminate()``/``kill()`` (hooks.py)."""


def _mark_stopped(procs: list[Proc]) -> None:
    """A process killed without an exit record, whose pid another process of the job journaled
    stopping while it ran (``multiprocessing.Pool`` terminates its workers when it shuts down),
    was ``stopped`` by its parent: what the program asked for, not a failure."""
    stops: dict[int, list[tuple[int, str]]] = {}
    for proc in procs:
        root = proc.journal.root
        for ts, name, attrs in root.events if root is not None else ():
            pid = _int_attr(attrs, "process.pid")
            if name == TERMINATED_CHILD and pid is not None:
                signal_name = attrs.get("lora_otel.signal")
                stops.setdefault(pid, []).append((ts, signal_name if isinstance(signal_name, str) else "a signal"))
    for proc in procs:
        exit_ = proc.journal.exit
        if proc.outcome != "killed" or proc.journal.pid not in stops:
            continue
        if exit_ is not None and exit_["code"] not in (128 + 15, 128 + 9):
            continue  # `lora-otel run` saw another death than SIGTERM/SIGKILL
        for ts, signal_name in stops[proc.journal.pid]:
            if proc.start_ns <= ts:
                proc.outcome = "stopped"
                proc.stopped_by = signal_name
                break


def _link(procs: list[Proc]) -> None:
    """Find each process's parent process (the one whose span its root names as parent), its
    depth, and its effective rank. Span ids that two journals share are ignored."""
    wanted = {
        proc.journal.root.parent_id for proc in procs if proc.journal.root is not None and proc.journal.root.parent_id
    }
    owner: dict[str, Optional[Proc]] = {}
    for proc in procs:
        proc.parent, proc.children, proc.depth = None, [], 0
        for span in proc.journal.spans:
            if span.span_id in wanted:
                known = owner.get(span.span_id, proc)
                owner[span.span_id] = proc if known is proc else None
    for proc in procs:
        root = proc.journal.root
        parent = owner.get(root.parent_id) if root is not None and root.parent_id else None
        if parent is not None and parent is not proc:
            proc.parent = parent
    for proc in procs:  # break parent cycles (only a corrupt set of journals has them)
        seen = {id(proc)}
        ancestor = proc.parent
        while ancestor is not None:
            if id(ancestor) in seen:
                proc.parent = None
                break
            seen.add(id(ancestor))
            ancestor = ancestor.parent
    for proc in procs:
        if proc.parent is not None:
            proc.parent.children.append(proc)
        depth, rank, ancestor = 0, proc.rank, proc.parent
        while ancestor is not None:
            depth += 1
            if rank is None:
                rank = ancestor.rank
            ancestor = ancestor.parent
        proc.depth, proc.effective_rank = depth, rank


def _order_key(proc: Proc) -> tuple[int, int, int, int, str]:
    if proc.effective_rank is None:
        return (0, 0, 0, proc.start_ns, proc.journal.path)
    return (1, proc.effective_rank, proc.depth, proc.start_ns, proc.journal.path)


def _callout(procs: list[Proc]) -> Optional[Callout]:
    order = {id(proc): index for index, proc in enumerate(procs)}
    # an "alive" stall of the root span is a launcher waiting for its children; quiet time with no
    # stage open ("between") is a stall unless the process is a launcher waiting for its ranks (a
    # process waiting on its pool's workers or a subprocess is stuck like any)
    stuck = [
        proc
        for proc in procs
        if proc.stall is not None
        and (
            proc.stall.kind == "frozen"
            or proc.stall.span is not proc.journal.root
            or (proc.stall.kind == "between" and not proc.launches_ranks)
        )
    ]
    bad = [proc for proc in procs if proc.outcome in ("failed", "killed")]
    # A stall written while its peers' evidence was not in yet is judged again here: a process
    # waiting in a collective waits for its peers; a peer stuck elsewhere, or one that failed or
    # died, is the one to blame.
    waiting = [proc for proc in stuck if waits_for_peers(proc)]
    blamed = [proc for proc in stuck if proc not in waiting]
    if waiting and not blamed and any(proc not in waiting for proc in bad):
        culprits = [proc for proc in bad if proc not in waiting]
        proc, together = _first_failure(culprits, order)
        if proc.outcome == "failed":
            text = f"{proc.who} failed first{_failure(proc)}"
        else:
            text = f"{proc.who} died first: {_killed_phrase(proc)}"
        return Callout(proc.outcome, proc, text + _waiting_for(waiting))
    if stuck:
        candidates = blamed or stuck
        proc = min(candidates, key=lambda p: (p.stuck_since_ns, p.journal.steps, order[id(p)]))
        text = f"{proc.who} is the one stuck: {_stuck_phrase(proc)}"
        if proc.outcome != "stalled":
            text += f", then {_end_phrase(proc)}"
        if blamed and waiting:
            text += _waiting_for(waiting)
        return Callout("stuck", proc, text)
    if bad:
        proc, together = _first_failure(bad, order)
        who = proc.who if not together else f"{proc.who} and {together} other{'s' if together > 1 else ''}"
        first = "" if len(bad) == 1 else " together" if together else " first"
        if proc.outcome == "failed":
            text = f"{who} failed{first}{_failure(proc)}"
        else:
            text = f"{who} died{first}: {_killed_phrase(proc)}"
        text += _after_first(proc, bad, together)
        return Callout(proc.outcome, proc, text)
    training = [
        proc
        for proc in procs
        if proc.outcome == "running"
        and (proc.journal.steps > 0 or any(span.name == "training" for span in proc.journal.spans))
    ]
    if len(training) >= 2:
        slow = min(training, key=lambda p: (p.journal.steps, order[id(p)]))
        others = sorted(p.journal.steps for p in training if p is not slow)
        lead = others[-1]
        behind = others[0] - slow.journal.steps
        if behind >= SLOWEST_MIN_STEPS and behind >= SLOWEST_MIN_FRACTION * lead:
            at = str(lead) if others[0] == lead else f"{others[0]}-{lead}"
            word = "the other is" if len(others) == 1 else "the others are"
            return Callout("slowest", slow, f"slowest: {slow.who} at step {slow.journal.steps} while {word} at {at}")
    return None


COLLECTIVE_WAIT = "Waiting inside a collective"
"""How the diagnosis of a process waiting in a torch.distributed collective begins (diagnose.py's
``collective`` rule): it waits for its peers."""


def waits_for_peers(proc: Proc) -> bool:
    """Whether ``proc``'s stall is a wait for its peers: its stall record says it waits inside a
    collective (the record is frozen when written; the peers' later evidence decides the blame)."""
    if proc.stall is None:
        return False
    diagnosis = proc.stall.reason if isinstance(proc.stall.reason, str) else ""
    records = [record for record in proc.journal.stalls if record.get("kind") != "died"]
    if records and isinstance(records[-1].get("diagnosis"), str):
        diagnosis = records[-1]["diagnosis"]
    return diagnosis.startswith(COLLECTIVE_WAIT)


def _waiting_for(waiting: list[Proc]) -> str:
    """``; rank 0 (pid 4242) waits for it in a collective (in all_reduce for 300 s)``."""
    parts = [f"{proc.who} waits for it in a collective ({_stuck_phrase(proc)})" for proc in waiting[:MAX_AFTER]]
    if len(waiting) > MAX_AFTER:
        parts.append(f"{len(waiting) - MAX_AFTER} more wait for it")
    return "; " + "; ".join(parts)


def _first_failure(bad: list[Proc], order: dict[int, int]) -> tuple[Proc, int]:
    """The process of ``bad`` (failed or killed) that went wrong first, and how many others of
    the same outcome ended together with it (within `TOGETHER_NS`: a job killed as a whole).

    Each is ordered by when it ended (`Proc.order_ns`): its exit record, or for one killed that its
    parent reaped, a beat after it was last seen alive (the reap may come much later); one gone
    without either by when it was last seen alive (it died after that, by up to `UNSURE_NS`), so a process
    that failed (an exit record) within that time after it may have been first, unless its error
    reads as a consequence (`consequence_of_first`). Launchers come last: their failure follows
    their children's."""
    bad.sort(key=lambda p: (bool(p.children), p.order_ns, order[id(p)]))
    proc = bad[0]
    if not proc.end_known and proc.outcome == "killed":
        proc = next(
            (
                p
                for p in bad
                if not p.children
                and p.outcome == "failed"
                and p.order_ns - bad[0].order_ns < UNSURE_NS
                and consequence_of_first(p) is None
            ),
            proc,
        )
    window = [p for p in bad if not p.children and abs(p.end_ns - proc.end_ns) < TOGETHER_NS]
    together = sum(1 for p in window if p is not proc and p.outcome == proc.outcome and _same_end(p, proc))
    for p in bad:
        p.consequence = None if p is proc else consequence_of_first(p)
    return proc, together


def _same_end(one: Proc, other: Proc) -> bool:
    """Whether two processes of the same outcome ended the same way (two SIGKILLs; not a SIGKILL and
    a SIGTERM, nor a death and a consequence)."""
    if consequence_of_first(one) is not None:
        return False
    signals = {p.end.signal if p.end is not None else None for p in (one, other)}
    return len(signals) == 1 or None in signals


UNSURE_NS = 1_500_000_000
"""A process gone without a word (no exit record, no reap by a traced parent) died this long after
it was last seen alive, at most, as far as the order of failures goes (the beat is every second)."""
MAX_AFTER = 3
"""The callout names at most this many of the failures that followed the first."""


def _after_first(first: Proc, bad: list[Proc], together: int) -> str:
    """``; then, as consequences: child (pid 12) failed: RuntimeError: lost peer B (a lost peer), ...``:
    the other failures, after the first, each with why it is taken for a consequence."""
    if together:
        return ""
    later = [p for p in bad if p is not first]
    if not later:
        return ""
    parts = []
    for p in later[:MAX_AFTER]:
        what = f"failed{_failure(p)}" if p.outcome == "failed" else f"died: {_end_phrase(p)}"
        parts.append(f"{p.who} {what}" + (f" ({p.consequence})" if p.consequence else ""))
    if len(later) > MAX_AFTER:
        parts.append(f"{len(later) - MAX_AFTER} more")
    consequences = all(p.consequence for p in later)
    return ("; then, as consequences: " if consequences else "; then: ") + "; ".join(parts)


# --- phrases -------------------------------------------------------------------------------------


def _stuck_phrase(proc: Proc) -> str:
    """``in import bitsandbytes for 312 s``, ``in training, no optimizer step for 300 s (at step 40)``,
    ``frozen in cuda init for 60 s (no beat for 30 s)``."""
    stall = proc.stall
    assert stall is not None
    span, open_for = _display(stall.span.name), format_duration(round(stall.open_for_s * 1e9))
    if stall.kind == "frozen":
        journal = proc.journal
        last = journal.last_life_ns or proc.start_ns
        return f"frozen in {span} for {open_for} (no beat for {format_duration(proc.view.now_ns - last)})"
    if stall.span.name == "training":
        return f"in training, no optimizer step for {open_for} (at step {proc.journal.steps})"
    if stall.kind == "between":
        after = f" since {_display(stall.after)} ended" if stall.after else ""
        return f"with no stage open for {open_for}{after}"
    return f"in {span} for {open_for}"


def _end_phrase(proc: Proc) -> str:
    """``killed (no exit record)``, ``killed by SIGKILL``, ``failed with exit code 1``."""
    exit_ = proc.journal.exit
    if proc.outcome == "killed":
        if exit_ is not None and exit_["message"]:
            return _display(exit_["message"])
        if proc.end is not None:
            return describe_end(proc.end)
        supervisor = _gone_supervisor(proc)
        if supervisor is not None:
            return f"killed with its lora-otel run (pid {supervisor}, gone without recording the end)"
        return "killed (no exit record)"
    code = exit_["code"] if exit_ is not None else None
    return f"failed with exit code {code}" if code is not None else "failed"


def stopped_phrase(proc: Proc) -> str:
    """``stopped by its parent with SIGTERM (multiprocessing terminate(), as a Pool shutting down) after 2.1 s``."""
    return (
        f"stopped by its parent with {proc.stopped_by} (multiprocessing terminate(), as a Pool shutting "
        f"down) after {format_duration(proc.end_ns - proc.start_ns)}"
    )


def _gone_supervisor(proc: Proc) -> Optional[int]:
    """The pid of the ``lora-otel run`` that started this process, when that is gone too: it
    records the end of its child unless it dies first, and the kernel SIGKILLs the child when it
    dies (``PR_SET_PDEATHSIG``)."""
    root = proc.journal.root
    pid = _int_attr(root.attrs, "lora_otel.supervisor.pid") if root is not None else None
    if pid is None or pid == 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except OSError:
        return None
    return None


def _failure(proc: Proc) -> str:
    """What follows ``failed``: ``: OSError: EIO (exit code 1)`` or `` with exit code 3``, from
    inspect's first line."""
    sentence = proc.view.stuck()
    if sentence.startswith(("failed: ", "failed with ")):
        return sentence[len("failed") :]
    return ": " + sentence


def _killed_phrase(proc: Proc) -> str:
    """``killed (no exit record) in training at step 1234``, ``killed by SIGKILL in import x after 3 s``."""
    text = _end_phrase(proc)
    deepest = deepest_open_span(proc.journal)
    if deepest is not None and deepest is not proc.journal.root:
        text += f" in {_display(deepest.name)}"
        if proc.journal.steps:
            return text + f" at step {proc.journal.steps}"
        return text + f" after {format_duration(max(proc.order_ns - deepest.start_ns, 0))}{_reaped_later(proc)}"
    return text + f" after {format_duration(proc.order_ns - proc.start_ns)}{_reaped_later(proc)}"


def _reaped_later(proc: Proc) -> str:
    """`` (reaped by its parent 1.6 s later)`` when the death was placed a beat after the last sign
    of life (`Proc.order_ns`), well before the parent's reap."""
    late = proc.end_ns - proc.order_ns
    return f" (reaped by its parent {format_duration(late)} later)" if late >= 500_000_000 else ""


def _with_tag(text: str, job: Job, proc: Proc) -> str:
    """``... (exit code 1, rank 1)``: the process named when the job has several."""
    if len(job.procs) < 2:
        return text
    if text.endswith(")"):
        return f"{text[:-1]}, {proc.tag})"
    return f"{text} ({proc.tag})"


def _phrase(job: Job) -> str:
    callout, outcome = job.callout, job.outcome
    if callout is not None and callout.kind == "stuck":
        proc = callout.proc
        stuck = _stuck_phrase(proc)
        stuck = stuck[len("in ") :] if stuck.startswith("in ") else stuck
        if proc.outcome == "stalled":
            text = (
                f"stalled: {stuck}"
                if proc.stall and proc.stall.kind in ("frozen", "between")
                else f"stalled at {stuck}"
            )
        else:
            text = f"{_end_phrase(proc)} after stalling {'' if stuck.startswith('with ') else 'at '}{stuck}"
        return _with_tag(text, job, proc)
    if callout is not None and callout.kind == "failed":
        return _with_tag(f"failed{_failure(callout.proc)}", job, callout.proc)
    if callout is not None and callout.kind == "killed":
        return _with_tag(_killed_phrase(callout.proc), job, callout.proc)
    if outcome == "running":
        running = [proc for proc in job.procs if proc.outcome in ("running", "stalled")]
        lead = max(running, key=lambda proc: proc.journal.steps)  # the first of the leaders, in rank order
        text = "running: " + _running_phrase(lead)
        if callout is not None:  # slowest
            slow = callout.proc
            text += f" (slowest: {slow.tag} at step {slow.journal.steps})"
        return text
    end = max(proc.end_ns for proc in job.procs)
    top = job.procs[0] if job.procs else None  # (a helper's unknown code, multiprocessing's forkserver's, is its own)
    if top is not None and top.journal.exit is not None and top.journal.exit["how"] == "unknown":
        # (Python <= 3.11: a SystemExit the program raised itself; its code is not in the journal)
        return f"ended in {format_duration(end - job.start_ns)}, exit code unknown"
    return f"finished in {format_duration(end - job.start_ns)}"


def _running_phrase(proc: Proc) -> str:
    """``training step 40``, ``import torch for 3 s``, ``between stages``."""
    journal = proc.journal
    deepest = deepest_open_span(journal)
    if deepest is None or deepest is journal.root:
        return f"step {journal.steps}" if journal.steps else "between stages"
    if journal.steps or deepest.name == "training":
        return f"{_display(deepest.name)} step {journal.steps}"
    return f"{_display(deepest.name)} for {format_duration(proc.view.open_for_ns(deepest) or 0)}"


# --- reading a directory -------------------------------------------------------------------------


def unreadable_reason(journal: Journal) -> Optional[str]:
    """Why a journal gives no process (no span at all), or None when it has spans."""
    if journal.spans:
        return None
    if journal.last_evidence_ns is None:
        if journal.problems:
            return f"not a journal ({journal.problems[0]})"
        return "empty journal: no records"
    return "no spans (its first record is missing)"


def read_dir(
    directory: str,
    now_ns: int,
    limits: Optional[dict[str, float]] = None,
    frozen_after_s: Optional[float] = FROZEN_AFTER_S,
    paths: Optional[list[str]] = None,
) -> tuple[list[Job], list[Unreadable]]:
    """Every journal in ``directory`` read in full, grouped into jobs; the files that gave no process.
    Only this user's regular files are read (`listed_journals`); ``paths``: that listing, made
    already (``inspect DIR`` counts what it left out)."""
    procs: list[Proc] = []
    unreadable: list[Unreadable] = []
    owner = os.geteuid()
    for path in listed_journals(directory, owner)[0] if paths is None else paths:
        try:
            journal = read_journal(path, owner)
        except JournalError as e:
            unreadable.append(Unreadable(path, str(e)))
            continue
        reason = unreadable_reason(journal)
        if reason is not None:
            unreadable.append(Unreadable(path, reason))
            continue
        procs.append(make_proc(journal, process_state(journal), now_ns, limits, frozen_after_s))
    return group_jobs(procs), unreadable


def worst(statuses: Iterable[int]) -> int:
    """The exit status for several outcomes: 3 (killed or stalled) over 1 (failed) over 0."""
    seen = set(statuses)
    return 3 if 3 in seen else 1 if 1 in seen else 0


def exit_status(jobs: Iterable[Job]) -> int:
    """3 when any job was killed or is stalled, else 1 when any failed, else 0."""
    return worst(job.status for job in jobs)


def focus(job: Job) -> Optional[Proc]:
    """The process to look at first: the called-out one, or the job's only process."""
    if job.callout is not None:
        return job.callout.proc
    return job.procs[0] if len(job.procs) == 1 else None
