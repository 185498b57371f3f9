"""The job narrates a slow stage in its own lines, from the beat thread (docs/narration.md).

At each beat the *subject* is worked out, by the same rules as ``lora_otel.analysis.stall``:

- the deepest open stage (the most recently started open span with no open child), except
  ``process``; for ``training`` — and for a stage with no limit of its own inside ``training``
  (``epoch 3``, ``step 40``) — the time since the last optimizer step;
- with no stage open but ``process`` (and not in training): the quiet time since the last stage
  ended (``between``).

When the subject has run long — first after 10 s, then at 30 s, 60 s, 2 min, then every 5 min,
never more often (``LORA_OTEL_NARRATE_S`` scales the whole cadence: its value is the first step;
0 turns these lines off) — one line: ``still in import toolkit.job after 30 s — main thread at
run.py:3 in <module> → toolkit/job.py:2 in <module> → time.sleep``. At its limit
(``LORA_OTEL_STALL_AFTER``, `lora_otel._boot.limits`), one ``STALLED: import toolkit.job open for
120 s (limit 120 s) — main thread at …`` line. When a narrated stage ends: ``import toolkit.job
took 95 s``.

The lines are level ``warn`` (``STALLED``: ``error``): they reach the terminal also from a
process whose info lines are kept quiet (a worker, a helper), since a stage running long is
something to report. The quiet time between stages and an ``arguments`` span still open (a
script that has not parsed arguments, or never uses argparse) are narrated only where they can
mean a stuck job: in the job's own process (not a quiet one), once it has imported torch, while
it is not a distributed launcher waiting for its ranks (`waits_for_ranks`: torchrun's agent,
``accelerate launch``; the ranks speak for themselves) and runs no web UI (gradio, uvicorn,
streamlit wait for their users). A process waiting on workers it started — a ``multiprocessing``
or ``multiprocess`` pool, a ``ProcessPoolExecutor``, DataLoader workers, a subprocess — is part of
the job and narrated like any job: its workers are quiet, the wait is its own.

Standard library only; runs in the beat thread, never in the program's own threads.
"""

from __future__ import annotations

import os
import sys
from _thread import allocate_lock

from lora_otel._boot import core
from lora_otel._boot import limits as _lim
from lora_otel._boot.words import duration, stall_what, stalled_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Mapping
    from typing import Optional, Union

    from lora_otel._boot.where import Frame

    EpisodeKey = Union[str, tuple[str, int], tuple[str, str, int]]
    """A stage's span id; ``("between", since)``; ``("training", span id, since)``."""
    Subject = tuple[str, EpisodeKey, str, int, Optional[float]]
    """``(kind, key, name, since_ns, limit_s or None)``: what the job is in now."""

CADENCE_S = (10.0, 30.0, 60.0, 120.0)
"""When a stage is narrated, in seconds since it began; then every `REPEAT_S`."""
REPEAT_S = 300.0
NARRATE_ENV = "LORA_OTEL_NARRATE_S"
STEP_SAMPLES = 300
_UI_MODULES = ("gradio", "uvicorn", "streamlit")

_configured = False
_scale = 1.0
_lines_on = True
_limits: dict[str, float] = dict(_lim.DEFAULT_LIMITS_S)
_episodes: dict[EpisodeKey, _Episode] = {}  # key -> _Episode
_samples: list[tuple[int, int]] = []  # (beat ts, steps) of the last STEP_SAMPLES beats


class _Episode:
    """One subject followed from the beat: a stage, a gap between optimizer steps, a quiet time."""

    __slots__ = ("key", "kind", "limit", "name", "next_i", "said", "since_ns", "stalled", "steps")

    def __init__(self, kind: str, key: EpisodeKey, name: str, since_ns: int) -> None:
        self.kind, self.key, self.name, self.since_ns = kind, key, name, since_ns
        self.next_i = 0
        self.stalled = False
        self.said = False
        self.steps = core.steps
        self.limit: float | None = None


def threshold_s(i: int) -> float:
    """The ``i``-th narration point (0-based), in seconds: 10, 30, 60, 120, 420, 720, … × scale."""
    base = CADENCE_S[i] if i < len(CADENCE_S) else CADENCE_S[-1] + REPEAT_S * (i - len(CADENCE_S) + 1)
    return base * _scale


def _say_bad(msg: str) -> None:
    (core.info_line if core.quiet else core.error_line)(msg)


def configure(env: Mapping[str, str] | None = None) -> None:
    """Read ``LORA_OTEL_STALL_AFTER``, ``LORA_OTEL_FROZEN_AFTER`` and ``LORA_OTEL_NARRATE_S``; a bad
    value: one line naming the variable and the default used instead (the job goes on)."""
    global _configured, _scale, _lines_on, _limits
    env = os.environ if env is None else env
    _configured = True
    raw = env.get(_lim.STALL_AFTER_ENV)
    try:
        _limits = _lim.parse_limits(raw)
    except _lim.LimitError as e:
        _limits = dict(_lim.DEFAULT_LIMITS_S)
        _say_bad(
            "%s=%r: %s; using the default limits (%s)"
            % (_lim.STALL_AFTER_ENV, raw, e, ", ".join("%s %g s" % kv for kv in _limits.items()))
        )
    raw = env.get(_lim.FROZEN_AFTER_ENV)
    try:
        _lim.parse_frozen_after(raw)
    except _lim.LimitError as e:
        _say_bad("%s; using the default, %g s" % (e, _lim.FROZEN_AFTER_S))
    raw = (env.get(NARRATE_ENV) or "").strip()
    if raw:
        try:
            value = float(raw)
            if not 0 <= value < float("inf"):
                raise ValueError
        except ValueError:
            _say_bad(
                "%s=%r is not a number of seconds (0 or more); using the default, %g s"
                % (NARRATE_ENV, raw, CADENCE_S[0])
            )
        else:
            _lines_on = value > 0
            _scale = value / CADENCE_S[0] if value > 0 else 1.0


def _secs(seconds: float) -> str:
    return duration(seconds)


def _median_step_s() -> float | None:
    per_step = []
    for (t0, s0), (t1, s1) in zip(_samples, _samples[1:]):
        if s1 > s0 and t1 > t0:
            per_step.append((t1 - t0) / 1e9 / (s1 - s0))
    if not per_step:
        return None
    per_step.sort()
    n = len(per_step)
    return per_step[n // 2] if n % 2 else (per_step[n // 2 - 1] + per_step[n // 2]) / 2


def _subject(now_ns: int) -> Subject | None:
    """``(kind, key, name, since_ns, limit_s or None)`` of what the job is in now, or None."""
    items = list(core.open_spans.items())
    if not items:
        return None
    by_id = dict(items)
    parents = {info[1] for _, info in items}
    sid, info = next(((s, i) for s, i in reversed(items) if s not in parents), items[-1])
    name = info[0]
    if sid == core.root_id:
        ended = core.last_ended
        since = ended[2] if ended is not None else info[3]
        after = ended[1] if ended is not None else ""
        return "between", ("between", since), after, since, _limits.get("between")
    limit = _lim.limit_for(name, _limits) if isinstance(name, str) else None
    training: tuple[str, tuple[str, str | None, int, int]] | None = None
    if name == "training":
        training = (sid, info)
    elif limit is None:
        seen = set()
        up = info[1]
        while up in by_id and up not in seen:  # a stage with no limit inside training: the step gap rules
            seen.add(up)
            if by_id[up][0] == "training":
                training = (up, by_id[up])
                break
            up = by_id[up][1]
    if training is not None:
        tsid, tinfo = training
        limit = _lim.training_limit(_limits, _median_step_s())[0]
        last = core.last_step_ns
        since = last if last and last > tinfo[3] else tinfo[3]
        return "training", ("training", tsid, since), "training", since, limit
    return "stage", sid, name, info[3], limit


RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "ACCELERATE_USE_CPU",
)
"""The variables a launcher sets for each process of the job it starts: a rank's (torchrun,
accelerate, deepspeed, Slurm, Open MPI: the ones the preamble reads for ``rank``/``local_rank``),
and ``ACCELERATE_USE_CPU``, which ``accelerate launch`` sets for the one process it starts without
torchrun."""
MAX_LOOKED_AT = 64
"""Descendants looked at, at most, by `waits_for_ranks` (three generations down)."""


def _rank_vars(pid: object) -> dict[bytes, bytes] | None:
    """The launcher variables of process ``pid``'s environment as it was started
    (``/proc/<pid>/environ``), or None when that cannot be read."""
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    names = tuple(name.encode() + b"=" for name in RANK_VARIABLES)
    out = {}
    for entry in raw.split(b"\0"):
        if entry.startswith(names):
            name, _, value = entry.partition(b"=")
            out[name] = value
    return out


def _children(pid: object) -> list[bytes]:
    kids: list[bytes] = []
    for tid in os.listdir("/proc/%s/task" % pid):
        try:
            with open("/proc/%s/task/%s/children" % (pid, tid), "rb") as f:
                kids += f.read().split()
        except OSError:
            continue
        if len(kids) >= MAX_LOOKED_AT:
            break
    return kids


def waits_for_ranks(pid: object = "self") -> bool:
    """Whether process ``pid`` (this one by default) is a launcher waiting for the job it started:
    a process below it now (a child, or a child's child: ``llamafactory-cli`` → torchrun's agent →
    the ranks), ``/proc/<pid>/task/*/children``) whose environment sets a launcher variable
    (`RANK_VARIABLES`: ``RANK``, ``LOCAL_RANK``, … ``ACCELERATE_USE_CPU``) to a value its own does
    not have.

    This is the one rule for "a process with a live child": the ranks speak for themselves (their
    own lines, beat and stalls), so the launcher's quiet time is not a stall (torchrun's agent,
    ``accelerate launch``). Any other child — a forked or spawned ``multiprocessing``/``multiprocess``
    pool worker or ``ProcessPoolExecutor`` worker, a DataLoader worker (they inherit their parent's
    rank), a ``subprocess`` it waits for — is part of the job: a process waiting on it can be stuck,
    and is narrated and called stalled like any job. False when nothing can be read (no /proc).
    The watchdog's views use it too (`lora_otel.analysis.stall.idle_may_be_stuck`)."""
    try:
        level = _children(pid)
        if not level:
            return False
        own = _rank_vars(pid)
        if own is None:
            return False
        looked = 0
        for _ in range(3):
            below: list[bytes] = []
            for kid in level:
                looked += 1
                if looked > MAX_LOOKED_AT:
                    return False
                name = kid.decode()
                theirs = _rank_vars(name)
                if theirs and any(own.get(var) != value for var, value in theirs.items()):
                    return True
                try:
                    below += _children(name)
                except OSError:
                    continue
            level = below
    except (OSError, UnicodeDecodeError):
        return False
    return False


_SERVER_MODULES = ("jupyter_server", "notebook.notebookapp")
_interactive_said = False


def interactive() -> str:
    """What makes this process wait for a person at a prompt ("" when nothing does): an IPython
    shell or a Jupyter kernel (its shell instance exists), the interpreter's own REPL (``python``,
    ``python -i`` once the script is done: ``sys.ps1`` is set), a Jupyter server. Its quiet time
    is idle by design, not a stall. Attribute reads only: nothing of the program's is called."""
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is not None:
        shell = getattr(getattr(shell_module, "InteractiveShell", None), "_instance", None)
        if shell is not None:
            return "jupyter kernel" if "ipykernel" in sys.modules else "ipython"
    if hasattr(sys, "ps1"):
        return "python repl"
    if any(m in sys.modules for m in _SERVER_MODULES):
        return "jupyter server"
    return ""


def note_interactive() -> None:
    """Once, from the beat, when the process has become interactive: say so on the root span
    (``lora_otel.interactive``), so the watchdog and every view read its quiet time as idle too."""
    global _interactive_said
    if not _interactive_said:
        kind = interactive()
        if kind:
            _interactive_said = True
            core.span_attrs(core.root_id, {"lora_otel.interactive": kind})


def _idle_ok() -> bool:
    """Whether a quiet time (or ``arguments`` still open) may mean this job is stuck (docstring)."""
    return (
        not (core.quiet and core.worker)
        and not _interactive_said
        and "torch" in sys.modules
        and not any(m in sys.modules for m in _UI_MODULES)
        and not waits_for_ranks()
    )


def _where(frames: list[Frame] | None) -> str:
    from lora_otel._boot.where import text

    where = text(frames) if frames else ""
    return " — main thread at %s" % where if where else ""


def _still(ep: _Episode, open_s: float, frames: list[Frame] | None) -> str:
    if ep.kind == "training":
        return "no optimizer step for %s in training (%s)%s" % (
            _secs(open_s),
            "last was step %d" % core.steps if core.steps else "none yet",
            _where(frames),
        )
    if ep.kind == "between":
        return "no stage open for %s since %s%s" % (
            _secs(open_s),
            "%s ended" % ep.name if ep.name else "start",
            _where(frames),
        )
    return "still in %s after %s%s" % (ep.name, _secs(open_s), _where(frames))


def _stalled(ep: _Episode, open_s: float, limit: float, frames: list[Frame] | None) -> str:
    # In the views' words (`words.stall_what`); the time and its limit rounded alike (monotonic):
    # never "12 s (limit 12.5516 s)", which reads as below its limit.
    if ep.kind == "training":
        why = _lim.training_limit(_limits, _median_step_s())[1]
        what = stall_what("training", "alive", open_s, limit, limit_why=why)
    elif ep.kind == "between":
        what = stall_what(None, "between", open_s, limit, since="%s ended" % ep.name if ep.name else "start")
    else:
        what = stall_what(ep.name, "alive", open_s, limit)
    return stalled_line(what, None) + _where(frames)


def _ended(ep: _Episode, now_ns: int, subject: Subject | None) -> str | None:
    """The line for a narrated episode that is over, or None while it goes on."""
    if ep.kind == "stage":
        if ep.key in core.open_spans:
            return None
        end = core.ended_at.get(ep.key, now_ns) if isinstance(ep.key, str) else now_ns
        return "%s took %s" % (ep.name, _secs((end - ep.since_ns) / 1e9))
    if ep.kind == "training":
        tsid = ep.key[1]
        if core.steps > ep.steps and core.last_step_ns:
            return "optimizer step %d came %s after the one before" % (
                ep.steps + 1,
                _secs((core.last_step_ns - ep.since_ns) / 1e9),
            )
        if tsid not in core.open_spans:
            return "training ended %s after its last optimizer step" % _secs((now_ns - ep.since_ns) / 1e9)
        return None
    if subject is not None and subject[1] == ep.key:
        return None
    then = ", until %s started" % subject[2] if subject is not None and subject[0] == "stage" else ""
    return "no stage was open for %s after %s%s" % (
        _secs((now_ns - ep.since_ns) / 1e9),
        "%s ended" % ep.name if ep.name else "start",
        then,
    )


_lock = allocate_lock()
"""Taken by the beat's `tick` and by `at_exit` (the exiting thread) around their bookkeeping of
`_episodes`: pure Python, never held across a call into the OS or the program, nor while a line is
written. `at_exit` waits for it a bounded time. Renewed in a forked child (`reset`)."""
_EXIT_WAIT_S = 1.0


def at_exit(now_ns: int) -> None:
    """At exit, before the spans still open are ended: the "took" lines of narrated stages that
    ended since the last beat (a job often exits right after its slow stage)."""
    lock = _lock
    if not lock.acquire(True, _EXIT_WAIT_S):  # the beat holds it a moment; a signal handler's exit
        return  # inside this very call would wait for itself
    try:
        lines = _ended_lines(now_ns, _subject(now_ns))
    finally:
        lock.release()
    _say(lines)


def _say(lines: list[tuple[str, str]]) -> None:
    for level, line in lines:
        (core.error_line if level == "error" else core.warn_line)(line)


def _ended_lines(now_ns: int, subject: Subject | None) -> list[tuple[str, str]]:
    """Forget the episodes whose stage is over; the "took N s" lines of those that were narrated."""
    lines = []
    for key, ep in list(_episodes.items()):
        line = _ended(ep, now_ns, subject)
        if line is not None:
            _episodes.pop(key, None)
            if ep.said and _lines_on:
                lines.append(("warn", line))
    return lines


def tick(now_ns: int, frames: list[Frame] | None) -> None:
    """One beat's narration (called by the beat thread after the beat record)."""
    if not _configured:
        configure()  # (may say a line: before the lock)
    with _lock:
        lines, due = _tick(now_ns)
    if due is not None and (due.kind == "between" or due.name == "arguments") and not _idle_ok():
        due = None  # (reads /proc: not under the lock)
    if due is not None:
        with _lock:
            lines.append(_say_due(due, now_ns, frames))
    _say(lines)


def _tick(now_ns: int) -> tuple[list[tuple[str, str]], _Episode | None]:
    """The beat's bookkeeping: the lines of episodes that ended, and the episode now followed when
    a line about it is due (else None)."""
    _samples.append((now_ns, core.steps))
    if len(_samples) > STEP_SAMPLES:
        del _samples[0]
    subject = _subject(now_ns)
    lines = _ended_lines(now_ns, subject)
    if subject is None:
        return lines, None
    kind, key, name, since_ns, limit = subject
    ep = _episodes.get(key)
    if ep is None:
        ep = _episodes[key] = _Episode(kind, key, name, since_ns)
    ep.limit = limit
    open_s = (now_ns - since_ns) / 1e9
    stall_due = limit is not None and not ep.stalled and open_s >= limit
    line_due = _lines_on and open_s >= threshold_s(ep.next_i)
    return lines, ep if stall_due or line_due else None


def _say_due(ep: _Episode, now_ns: int, frames: list[Frame] | None) -> tuple[str, str]:
    """The line due about ``ep`` (`_tick` found one due), its cadence moved on."""
    open_s = (now_ns - ep.since_ns) / 1e9
    while threshold_s(ep.next_i) <= open_s:
        ep.next_i += 1
    ep.said = True
    limit = ep.limit
    if limit is not None and not ep.stalled and open_s >= limit:
        ep.stalled = True
        return "error", _stalled(ep, open_s, limit, frames)
    return "warn", _still(ep, open_s, frames)


def reset() -> None:
    """Forget every episode, with a new `_lock` (a forked child starts with its own stages; the
    beat thread that may have held the lock at the fork does not exist there)."""
    global _lock
    _lock = allocate_lock()
    _episodes.clear()
    del _samples[:]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset)
