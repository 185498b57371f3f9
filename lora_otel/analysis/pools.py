"""Worker pools are part of the job: a process waiting on the workers it started, and which worker holds the work.

A process whose main thread waits on child processes it started — a ``multiprocessing`` or
``multiprocess`` pool (``Pool.map``; datasets' ``map(num_proc=…)``), a ``concurrent.futures``
``ProcessPoolExecutor``, ``multiprocessing.Process.join``, ``torch.multiprocessing.spawn``, a
``subprocess`` it waits for — is stuck where that wait is: in the worker that holds the task. Its
workers are quiet processes (they idle between tasks by design, and are never called stalled
themselves), so the parent's stall names the worker (`pool_wait`):

- where the main thread waits (`waiting_in`): the pool module's frames, from its stacks (the
  stack request's dump) or its journal's last beat sample, and the program's line that called it;
- each worker, from its own journal (root ``process.parent_pid`` is the waiting process): its
  beat sample says where its main thread is and since when (``Journal.main_frames_since``); a
  worker whose innermost frames are all the pool's own (``connection.py`` ``recv_bytes``,
  ``queues.py`` ``get``) waits for work, one with the program's frames holds a task;
- a worker that ended while the parent waits: how, from the parent's ``child exit`` events (the
  parent reaped it; `lora_otel.analysis.ends` when present), else from what the watchdog knows
  (gone without an exit record, the OOM killer's count in its ``died`` record). A
  ``multiprocessing.Pool`` replaces a worker lost mid-task but never re-runs nor fails its task:
  the parent waits for its result forever.
- a child with no journal (not Python, or not traced): from ``/proc`` (the evidence's
  ``process.children``: state, wait channel, CPU).

Which children are a distributed launcher's ranks (they speak for themselves, and the launcher
waiting for them is not stuck) is one rule, `lora_otel._boot.narrate.waits_for_ranks`; this module
diagnoses only the processes that rule lets stall. Standard library only; no /proc reads of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from lora_otel.analysis import ages, childwaits, native, poolmembers
from lora_otel.journal.reader import Journal, process_state, where_text
from lora_otel.journal.tree import iso_time

PoolFrame = tuple[str, str, str]
"""``(file, line, function)`` of one Python frame; a called C function has file ``""``."""

_POOLS = (
    # (path fragment, what it is, whether a worker lost mid-task leaves the wait hanging forever)
    ("multiprocessing/pool.py", "multiprocessing.Pool", True),
    ("multiprocess/pool.py", "multiprocess.Pool", True),
    ("concurrent/futures/", "concurrent.futures executor", False),
    ("torch/multiprocessing/spawn.py", "torch.multiprocessing.spawn", False),
    ("multiprocessing/process.py", "multiprocessing.Process", False),
    ("multiprocess/process.py", "multiprocess.Process", False),
    ("multiprocessing/popen_", "multiprocessing.Process", False),
    ("multiprocess/popen_", "multiprocess.Process", False),
    ("subprocess.py", "subprocess", False),
    # a queue or pipe its workers feed (a hand-made worker pool): named only when workers are seen
    ("multiprocessing/queues.py", "multiprocessing.Queue", False),
    ("multiprocess/queues.py", "multiprocess.Queue", False),
    ("multiprocessing/connection.py", "multiprocessing pipe", False),
    ("multiprocess/connection.py", "multiprocess pipe", False),
)
_FED_BY_WORKERS = ("multiprocessing.Queue", "multiprocess.Queue", "multiprocessing pipe", "multiprocess pipe")
_SUBPROCESS_WAITS = ("wait", "_wait", "_try_wait", "communicate", "_communicate", "run", "call", "check_call")
_WAIT_MODULES = (
    "threading.py",
    "selectors.py",
    "queue.py",
    "multiprocessing/",
    "multiprocess/",
    "concurrent/futures/",
    "subprocess.py",
    "torch/multiprocessing/",
)
"""Where a thread that waits on its workers is: the pools' own modules and what they wait with."""
_CALLS = {"result_iterator": "map", "_chain_from_iterable_of_lists": "map"}
"""Pool functions named by the call the program made (an executor's ``map`` iterates these)."""
_WORKER_IDLE_MODULES = ("multiprocessing/", "multiprocess/", "concurrent/futures/", "threading.py", "queue.py")
"""A worker whose Python frames are all in these waits for work (reads the task queue)."""
_IDLE_WCHAN = ("poll", "select", "pipe_read", "futex", "ep_poll", "unix_stream", "wait_woken")
CHILD_EXIT = "child exit"
"""The root span event of a process that reaped a child (issue 21's contract: ``child.pid``,
``child.exit_code`` or ``child.signal``, ``child.core_dumped``)."""
MAX_WORKERS_NAMED = 3
ADVICE = "lora_otel.diagnosis.advice"
"""The attribute `pool_wait` passes the advice in (`lora_otel.analysis.native`: a worker's pool lost in its fork)."""


@dataclass(frozen=True)
class PoolWait:
    """A thread waiting on worker processes: ``what`` (``multiprocessing.Pool``), ``call`` (the pool
    function the program called, ``map``), ``called_at`` (``job.py:9 in <module>``, or "")."""

    what: str
    call: str
    called_at: str
    forever_on_loss: bool


def _in(path: str, fragment: str) -> bool:
    path = path.replace("\\", "/")
    return path.startswith(fragment) or ("/" + fragment) in path


def _short(frame: PoolFrame) -> str:
    file, line, func = frame
    return "%s:%s in %s" % (file.replace("\\", "/").rsplit("/", 1)[-1], line, func)


def _pool_of(frame: PoolFrame) -> Optional[tuple[str, bool]]:
    file, _, func = frame
    for fragment, what, forever in _POOLS:
        if _in(file, fragment):
            if what == "subprocess" and func not in _SUBPROCESS_WAITS:
                return None
            return what, forever
    return None


def waiting_in(frames: Sequence[PoolFrame]) -> Optional[PoolWait]:
    """The pool a thread waits on, from its frames (innermost first), or None.

    It waits on one when, from its innermost frame outwards, only the pools' modules and what they
    wait with (`_WAIT_MODULES`: ``threading.py``, ``selectors.py``, ``multiprocessing/`` …) and C
    functions come before the program's own code, and one of them is a pool's (`_POOLS`). The call
    named is the outermost pool frame; ``called_at`` the program's frame that called it."""
    found: Optional[tuple[str, bool]] = None
    call = ""
    for frame in frames:
        file = frame[0]
        if not file or _in(file, "lora_otel/_boot/") or file == "<string>":
            # a C function the innermost frame calls (waiter.acquire, os.waitpid), our hook around
            # it, or a method multiprocess(ing) generated for a manager's proxy (`<string>:2 in get`)
            continue
        if not any(_in(file, module) for module in _WAIT_MODULES):
            if found is None:
                return None
            return PoolWait(found[0], call, _short(frame), found[1])
        pool = _pool_of(frame)
        if pool is not None and (found is None or pool[0] == found[0] or found[0] == "multiprocessing.Process"):
            name = _CALLS.get(frame[2], frame[2])
            if found is None or pool[0] != found[0] or not name.startswith("_"):
                call = name  # the outermost public function (Pool.map, not its _map_async)
            found = pool
    return PoolWait(found[0], call, "", found[1]) if found is not None else None


def beat_frames(journal: Journal) -> list[PoolFrame]:
    """The journal's last beat sample of its main thread, innermost first."""
    out: list[PoolFrame] = []
    for entry in reversed(journal.main_frames or ()):
        if isinstance(entry, (list, tuple)) and len(entry) >= 3:
            out.append((str(entry[0] or ""), str(entry[1]), str(entry[2])))
    return out


def _busy(frames: Sequence[PoolFrame]) -> bool:
    """A worker holds work when its main thread runs outside the pool's own modules."""
    python = [f for f in frames if f[0]]
    return bool(python) and any(not any(_in(f[0], m) for m in _WORKER_IDLE_MODULES) for f in python)


@dataclass
class Worker:
    """One child of the waiting process: its pid, journal (None: not traced), /proc row, end."""

    pid: int
    journal: Optional[Journal] = None
    row: Optional[Mapping[str, Any]] = None
    end: Optional[str] = None  # how it ended abnormally ("killed by SIGKILL"), None while it runs or ended well
    ended_ns: Optional[int] = None
    ended_well: bool = False
    role: str = ""  # one of multiprocessing's helpers (its resource tracker, a Manager's server): not a worker


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _child_exits(journal: Journal) -> dict[int, tuple[int, Optional[str]]]:
    """``pid -> (ts, how it ended abnormally or None)`` from the ``child exit`` events of the
    parent's root span (`lora_otel.analysis.ends` when present, for the OOM killer's word)."""
    out: dict[int, tuple[int, Optional[str]]] = {}
    root = journal.root
    if root is None:
        return out
    for ts, name, attrs in root.events:
        pid = _int(attrs.get("child.pid"))
        if name != CHILD_EXIT or pid is None:
            continue
        signal_name, code = attrs.get("child.signal"), _int(attrs.get("child.exit_code"))
        how = (
            "killed by %s" % signal_name
            if isinstance(signal_name, str) and signal_name
            else ("exited with code %d" % code if code not in (None, 0) else None)
        )
        out[pid] = (ts, how)
    try:  # issue 21's `ends` (another branch): its wording, the OOM killer named
        ends = importlib.import_module("lora_otel.analysis.ends")
        for pid, end in ends.child_ends([journal]).items():
            if pid in out and getattr(end, "parent_pid", journal.pid) in (None, journal.pid):
                phrase = ends.describe_end(end)
                out[pid] = (out[pid][0], phrase if out[pid][1] is not None else None)
    except Exception:  # noqa: BLE001 - not there (or older): the events' own words above
        pass
    return out


def _watchdog_end(journal: Journal) -> tuple[Optional[str], Optional[int]]:
    """How a worker's journal says it ended: its exit record, or gone without one (what the
    watchdog knows: its ``died`` record's OOM evidence). ``(None, None)`` while it runs or ended well."""
    state = process_state(journal)
    exit_ = journal.exit
    if state == "running" or state == "exec'd":
        return None, None
    if exit_ is not None:
        code = exit_.get("code")
        ts = exit_.get("ts")
        if exit_.get("how") == "signal" or exit_.get("how") == "exception" or code not in (0, None):
            return (exit_.get("message") or "exited with code %s" % code), ts if isinstance(ts, int) else None
        return None, None
    died = [r for r in journal.stalls if r.get("kind") == "died"]
    oom = died[-1].get("evidence", {}).get("oom") if died else None
    how = (
        "killed by the OOM killer (SIGKILL)"
        if oom
        else "killed without an exit record (a signal such as SIGKILL, the OOM killer's way, or os._exit)"
    )
    return how, journal.last_life_ns


def workers_of(journal: Journal, peers: Iterable[Journal], evidence_children: Iterable[Any]) -> list[Worker]:
    """The children of ``journal``'s process: its live children in the evidence (``/proc``), the
    journals whose root names it as parent, and the ones its ``child exit`` events name."""
    me = journal.pid
    by_pid: dict[int, Worker] = {}
    for row in evidence_children:
        if isinstance(row, Mapping) and _int(row.get("pid")) is not None:
            by_pid[row["pid"]] = Worker(row["pid"], row=row)
    for peer in peers:
        root = peer.root
        if peer is journal or root is None or peer.pid is None or me is None:
            continue
        if _int(root.attrs.get("process.parent_pid")) != me:
            continue
        if peer.root is not None and journal.root is not None and peer.root.trace_id != journal.root.trace_id:
            continue
        worker = by_pid.setdefault(peer.pid, Worker(peer.pid))
        worker.journal = peer
    for pid, (ts, how) in _child_exits(journal).items():
        worker = by_pid.setdefault(pid, Worker(pid))
        worker.end, worker.ended_ns, worker.ended_well = how, ts, how is None
    for worker in by_pid.values():
        if worker.end is None and not worker.ended_well and worker.journal is not None:
            worker.end, worker.ended_ns = _watchdog_end(worker.journal)
            exit_ = worker.journal.exit
            if worker.end is None and exit_ is not None:  # its exit record: it ended, and well
                worker.ended_well = True
                worker.ended_ns = exit_.get("ts") if isinstance(exit_.get("ts"), int) else None
        frames = list(worker.journal.main_frames or ()) if worker.journal is not None else []
        cmdline = str(worker.row.get("cmdline") or "") if worker.row else ""
        if not cmdline and worker.journal is not None and worker.journal.root is not None:
            args = worker.journal.root.attrs.get("process.command_args")
            cmdline = " ".join(str(a) for a in args) if isinstance(args, list) else ""
        worker.role = poolmembers.helper_role(frames + _outside_frames(worker), cmdline)
    return sorted(by_pid.values(), key=lambda w: w.pid)


def _where(worker: Worker, now_ns: int) -> str:
    """``its main thread has been at job.py:5 in task → time.sleep for 24 s (its last beat)``."""
    journal = worker.journal
    if journal is None or not journal.main_frames:
        outside = _outside_frames(worker)
        if not outside:
            return ""
        return "its main thread is at %s (read by py-spy)" % where_text(_program_part(outside))
    since = journal.main_frames_since or journal.main_frames_ts
    frames = _program_part(list(journal.main_frames))
    text = "its main thread %s at %s" % ("has been" if worker.end is None else "was", where_text(frames))
    if since is not None and worker.end is None:
        text += " for %s" % ages.growing(now_ns - since)
    return text + (" (its journal's beat)" if worker.end is None else " at its last beat")


def _program_part(frames: list[Any]) -> list[Any]:
    """The frames without the pool's own loop around the task (outermost first): the program's
    frames say where."""
    frames = list(frames)
    while len(frames) > 1 and frames[0] and any(_in(str(frames[0][0]), m) for m in _WORKER_IDLE_MODULES):
        if not str(frames[1][0] if frames[1] else ""):
            break  # keep the Python frame that calls the C function
        frames.pop(0)
    return frames


def _outside_frames(worker: Worker) -> list[Any]:
    """The worker's main-thread frames as the watchdog read them from outside (``frames`` of its
    ``process.children`` row: `evidence.children_facts`), outermost first; [] when not read."""
    frames = worker.row.get("frames") if worker.row else None
    # a forked child's stack begins with its parent's frames, copied at the fork: not where it is
    return (
        poolmembers.own_frames([f for f in frames if isinstance(f, list) and len(f) == 3])
        if isinstance(frames, list)
        else []
    )


def idle_frames_only(frames: Sequence[Any]) -> bool:
    """Whether a main-thread sample (``[file, line, function]``, outermost first) holds frames and
    all of them are a pool's or a queue's own (`_WORKER_IDLE_MODULES`): the beat keeps the innermost
    few frames, so such a sample hides where the program called the wait."""
    files = [str(f[0]) for f in frames if isinstance(f, (list, tuple)) and f and f[0]]  # ("": a native frame)
    return bool(files) and all(any(_in(file, m) for m in _WORKER_IDLE_MODULES) for file in files)


def _program_frame(worker: Worker) -> str:
    """``job.py:14 in worker``: the innermost frame of the worker's own code at its last beat (or as
    read from outside), or ""."""
    journal_frames = worker.journal.main_frames if worker.journal is not None else None
    # the beat keeps the innermost few frames: all the pool's own in a deep wait, when py-spy saw more
    for frames in (journal_frames or [], _outside_frames(worker)):
        for frame in reversed(frames):
            file = str(frame[0]) if frame else ""
            if file and not any(_in(file, m) for m in _WORKER_IDLE_MODULES):
                return _short((file, str(frame[1]), str(frame[2])))
    return ""


def _proc_row(row: Optional[Mapping[str, Any]]) -> str:
    if not row:
        return ""
    how = {"R": "running", "D": "in disk I/O", "S": "sleeping", "T": "stopped"}.get(
        str(row.get("state")), str(row.get("state"))
    )
    wchan = row.get("wchan")
    return "%s%s, %s %% CPU" % (
        how,
        " in %s" % wchan if wchan not in (None, "-", "") else "",
        row.get("cpu_percent", "?"),
    )


def _cmd(row: Optional[Mapping[str, Any]]) -> str:
    cmd = str(row.get("cmdline") or "") if row else ""
    return " (%s)" % (cmd if len(cmd) <= 60 else cmd[:59] + "\u2026") if cmd else ""


def pool_wait(
    main_frames: Sequence[PoolFrame],
    journal: Optional[Journal],
    peers: Iterable[Journal],
    evidence_children: Iterable[Any],
    open_for_s: float,
    now_ns: int,
    threads: Optional[Sequence[tuple[str, Sequence[PoolFrame]]]] = None,
    wait_threads: Any = None,
) -> Optional[tuple[str, dict[str, Any]]]:
    """The sentence (and attributes) for a main thread waiting on its workers, or None when it does
    not wait on any (module docstring). ``main_frames``: the main thread's frames, innermost first
    (its stacks, else its journal's beat sample); ``evidence_children``: the evidence's
    ``process.children`` rows; ``open_for_s``: how long the stall has lasted; ``threads``: the
    waiting process's other threads from its stacks (header, Python frames innermost first), None
    when its stacks were not read: a ``ThreadPoolExecutor``'s workers are among them
    (`lora_otel.analysis.poolmembers`), a ``ProcessPoolExecutor`` runs its manager thread there;
    ``wait_threads``: the evidence's ``wait.threads`` (a child's own wait, `lora_otel.analysis.childwaits`)."""
    wait = waiting_in(main_frames)
    if wait is None and journal is not None:
        wait = waiting_in(beat_frames(journal))
    if wait is None or journal is None:
        return None
    children = workers_of(journal, peers, evidence_children)
    # multiprocessing's helpers (its resource tracker, a Manager's server, the fork server) are
    # children that run no task: never a worker
    # a child known only from its parent's exit record, which exited 0, shows nothing of a worker
    # (a short command the program or a library ran): only its journal or /proc row would
    workers = [w for w in children if not w.role and not (w.ended_well and w.journal is None and w.row is None)]
    if wait.what in _FED_BY_WORKERS and not workers:
        return None  # a queue fed by threads, or by processes it did not start: not its pool
    thread_pool: Optional[list[poolmembers.ThreadWorker]] = None
    if wait.what == "concurrent.futures executor":
        if poolmembers.process_pool_thread(threads or ()) or any(
            w.journal is not None and any(_in(f[0], "concurrent/futures/process.py") for f in beat_frames(w.journal))
            for w in workers
        ):
            wait = dataclasses.replace(wait, what="ProcessPoolExecutor")  # its threads or workers' frames say which
        elif threads is not None:
            # the stacks were read and show no process pool's manager thread: its children are not
            # this executor's workers; a thread pool's workers are its threads
            thread_pool = poolmembers.thread_workers(threads)
            workers = []
            if thread_pool:
                wait = dataclasses.replace(wait, what="ThreadPoolExecutor")
    call = "%s, " % wait.call if wait.call and wait.call not in ("wait", "get") and wait.call[0] != "_" else ""
    head = "The main thread waits for its %s (%scalled at %s) for %s" % (
        wait.what,
        call,
        wait.called_at or "?",
        ages.growing(open_for_s * 1e9),
    )
    if not wait.called_at:
        head = "The main thread waits for its %s%s for %s" % (
            wait.what,
            " (%s)" % call.rstrip(", ") if call else "",
            ages.growing(open_for_s * 1e9),
        )
    attrs: dict[str, Any] = {"lora_otel.pool.kind": wait.what}
    if thread_pool is not None:
        if not thread_pool:
            return (
                head + "; no worker thread of a ThreadPoolExecutor nor a process pool's manager thread is in its "
                "stacks (cannot tell what should complete the future it waits for).",
                attrs,
            )
        attrs["lora_otel.pool.worker.threads"] = len(thread_pool)
        tparts, advice = poolmembers.thread_pool_parts(thread_pool, MAX_WORKERS_NAMED)
        if advice:
            attrs[ADVICE] = advice
        return head + "; " + "; ".join(tparts) + ".", attrs
    subprocess = wait.what == "subprocess" or wait.what.endswith(".Process") or "spawn" in wait.what
    since = journal.root.start_ns if journal.root is not None else 0
    died = [w for w in workers if w.end is not None and (w.ended_ns or now_ns) >= since]
    lost = [
        w for w in died if subprocess or w.journal is None or _busy(beat_frames(w.journal)) or not w.journal.main_frames
    ]
    running = [w for w in workers if w.end is None and not w.ended_well and _alive(w)]
    # a spawned worker still running the program's main module again has taken no task yet
    starting = [w for w in running if not subprocess and poolmembers.starting(_frames_of(w))]
    busy = [
        w
        for w in running
        if w not in starting
        and (
            subprocess
            or (w.journal is not None and _busy(beat_frames(w.journal)))
            or (
                w.journal is None
                and w.row is not None
                and (w.row.get("state") in ("R", "D") or not str(w.row.get("wchan", "")).startswith(_IDLE_WCHAN))
            )
            or native.in_library(w.row)  # its main thread waits in a known library: not in the pool's wait for work
        )
    ]
    parts: list[str] = []
    if lost:
        worker = lost[0]
        attrs["lora_otel.diagnosis.in_pid"] = worker.pid
        attrs["lora_otel.pool.worker.pid"] = worker.pid
        attrs["lora_otel.pool.worker.end"] = worker.end
        when = " at %s" % iso_time(worker.ended_ns) if worker.ended_ns else ""
        text = "%s pid %d%s %s%s" % (
            "child" if subprocess else "worker",
            worker.pid,
            _cmd(worker.row),
            worker.end,
            when,
        )
        where = _where(worker, now_ns)
        if where and not subprocess:
            text += " while running a task (%s)" % where
        elif where:
            text += " (%s)" % where
        if wait.forever_on_loss:
            text += (
                "; %s never re-runs nor fails a task lost with its worker: the main thread will wait for it forever"
                % (wait.what)
            )
        parts.append(text)
    shown = [w for w in busy if w not in lost][: MAX_WORKERS_NAMED - len(parts)] if not lost or busy else []
    for worker in shown:
        attrs.setdefault("lora_otel.diagnosis.in_pid", worker.pid)
        attrs.setdefault("lora_otel.pool.worker.pid", worker.pid)
        where = _where(worker, now_ns)
        state = _proc_row(worker.row)
        text = "%s pid %d%s %s" % (
            "child" if subprocess else "worker",
            worker.pid,
            _cmd(worker.row) if worker.journal is None else "",
            "it waits for has not ended" if subprocess else "holds a task",
        )
        details = [d for d in (where, state if not where else "") if d]
        found = native.worker_native(worker.row, worker.journal)
        if found is not None:  # which native library it waits in, and a pool lost in its fork
            details.append(found.phrase)
            for key, value in found.attrs.items():
                attrs.setdefault(key, value)
            if found.advice and ADVICE not in attrs:
                attrs[ADVICE] = found.advice
        elif subprocess:  # the child's own wait: a descriptor and its other end, or a lock
            own = childwaits.child_wait(
                wait_threads,
                journal.pid,
                worker.pid,
                worker.row,
                worker.journal.main_frames or () if worker.journal is not None else (),
                native.fork_of(worker.journal) if worker.journal is not None else None,
            )
            if own is not None:
                details.append(own.phrase)
                if own.advice and ADVICE not in attrs:
                    attrs[ADVICE] = own.advice
        parts.append(text + (": " + "; ".join(details) if details else ""))
    for worker in starting[: max(0, MAX_WORKERS_NAMED - len(parts))]:
        where = _where(worker, now_ns)
        parts.append(
            "worker pid %d is still starting: a spawned worker runs the program's main module again before it "
            "takes a task%s" % (worker.pid, " (%s)" % where if where else "")
        )
    idle = [w for w in running if w not in busy and w not in starting]
    if not parts:
        if not workers:
            return head + "; none of its worker processes is seen (not in /proc, no journal names it).", attrs
        fed = wait.what in _FED_BY_WORKERS
        parts.append(
            "no worker shows a task: %s"
            % ", ".join(
                "pid %d %s"
                % (
                    w.pid,
                    ("waits for work" + (" at %s" % _program_frame(w) if fed and _program_frame(w) else ""))
                    if w in idle
                    else (w.end or _ended_well(w)),
                )
                for w in workers[:4]
            )
        )
        if not running and any(w.ended_well for w in workers) and not subprocess:
            parts.append(
                "no worker of the pool is running to take the tasks it waits for, and none replaced %s"
                % ("it" if len(workers) == 1 else "them")
            )
            if wait.what == "ProcessPoolExecutor":
                attrs[ADVICE] = (
                    "A ProcessPoolExecutor worker that exits normally while tasks wait was retired by "
                    "max_tasks_per_child, and the executor may not start its replacement (CPython gh-115634): "
                    "leave max_tasks_per_child unset, or use a Python release with that fix."
                )
        if fed and idle:
            parts.append(
                "each side waits for the other: the main thread for what its workers send, they for work "
                "nobody sends them"
            )
    elif idle and not subprocess:
        parts.append(
            "%d other worker%s wait%s for work"
            % (len(idle), "" if len(idle) == 1 else "s", "s" if len(idle) == 1 else "")
        )
    return head + "; " + "; ".join(parts) + ".", attrs


def _frames_of(worker: Worker) -> list[Any]:
    """The worker's main-thread frames, outermost first: its journal's last beat, else as read from outside."""
    frames = list(worker.journal.main_frames or ()) if worker.journal is not None else []
    return frames or _outside_frames(worker)


def _ended_well(worker: Worker) -> str:
    """``exited normally (exit code 0) at 12:00:03.120Z`` for a worker whose exit record or parent says so."""
    exit_ = worker.journal.exit if worker.journal is not None else None
    code = exit_.get("code") if exit_ else None
    if not worker.ended_well:
        return "ended"
    return "exited normally%s%s" % (
        " (exit code %s)" % code if code is not None else "",
        " at %s" % iso_time(worker.ended_ns) if worker.ended_ns else "",
    )


def _alive(worker: Worker) -> bool:
    if worker.journal is not None:
        return process_state(worker.journal) == "running"
    return worker.row is not None and str(worker.row.get("state")) not in ("Z", "X")
