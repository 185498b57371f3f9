"""Which processes and threads are the workers of the pool a thread waits on (`lora_otel.analysis.pools`).

A process that waits on a pool has other children than its workers, and a thread pool has none:

- ``multiprocessing``'s helper processes — its resource tracker (``resource_tracker.main``, started
  by the first semaphore or shared memory), a ``Manager``'s server (``managers.Server.serve_forever``),
  the fork server — are children of the waiting process but run no task (`helper_role`);
- a worker started with the spawn start method first runs the program's main module again
  (``runpy``, ``multiprocessing.spawn``) before it takes a task: it is starting (`starting`);
- a forked worker's stack read from outside begins with its parent's frames, copied at the fork:
  the frames outside ``multiprocessing``'s ``BaseProcess._bootstrap`` are the parent's, not the
  worker's (`own_frames`);
- a ``concurrent.futures.ThreadPoolExecutor``'s workers are threads of the waiting process itself
  (``thread.py`` ``_worker``): read from its stacks (`thread_workers`), never from its children.

Standard library only; pure functions of recorded frames (``(file, line, function)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

_MP = ("multiprocessing/", "multiprocess/")
_HELPERS = (
    # (module, functions: any of them in the frames, or "" for any; what the process is)
    ("resource_tracker.py", (), "multiprocessing's resource tracker"),
    ("semaphore_tracker.py", (), "multiprocessing's semaphore tracker"),
    ("forkserver.py", ("main", "read_signed", "_serve_one"), "multiprocessing's fork server"),
    (
        "managers.py",
        ("serve_forever", "_run_server", "accepter", "handle_request", "serve_client"),
        "a Manager's server process",
    ),
)
_HELPER_CMDLINES = (
    ("resource_tracker", "multiprocessing's resource tracker"),
    ("semaphore_tracker", "multiprocessing's semaphore tracker"),
    ("forkserver", "multiprocessing's fork server"),
)
_BOOTSTRAP = "_bootstrap"
_RUNPY = ("<frozen runpy>", "runpy.py")
_THREAD_WORKER = ("concurrent/futures/thread.py", "_worker")
_WORK_ITEM = ("concurrent/futures/thread.py", "run")
_FUTURE_WAITS = ("result", "wait", "as_completed", "_result_or_cancel", "result_iterator")
_LIBRARY_WAITS = ("threading.py", "queue.py", "selectors.py", "concurrent/futures/_base.py")


def _in(path: str, fragment: str) -> bool:
    path = str(path).replace("\\", "/")
    return path.startswith(fragment) or ("/" + fragment) in path


def _rows(frames: Iterable[Any]) -> list[tuple[str, str, str]]:
    out = []
    for f in frames or ():
        if isinstance(f, (list, tuple)) and len(f) >= 3:
            out.append((str(f[0] or ""), str(f[1]), str(f[2])))
    return out


def helper_role(frames: Iterable[Any], cmdline: str = "") -> str:
    """What a child is when it is one of ``multiprocessing``'s helpers rather than a pool's worker
    (``"multiprocessing's resource tracker"``), from its frames (any order) or command line; ""."""
    for file, _, func in _rows(frames):
        for module, funcs, what in _HELPERS:
            if any(_in(file, mp + module) for mp in _MP) and (not funcs or func in funcs):
                return what
    for fragment, what in _HELPER_CMDLINES:
        if fragment in cmdline and ("multiprocess" in cmdline):
            return what
    return ""


def own_frames(frames: Sequence[Any]) -> list[Any]:
    """A child's frames (outermost first) without its parent's, copied at the fork: those outside
    ``multiprocessing``'s process ``_bootstrap``; all of them when it is not seen."""
    cut = -1
    for i, f in enumerate(frames):
        if (
            isinstance(f, (list, tuple))
            and len(f) >= 3
            and f[2] == _BOOTSTRAP
            and any(_in(str(f[0]), mp + "process.py") for mp in _MP)
        ):
            cut = i
    return list(frames[cut + 1 :]) if cut >= 0 else list(frames)


def starting(frames: Iterable[Any]) -> bool:
    """Whether a spawned child still runs its bootstrap: the program's main module run again
    (``runpy``) or ``multiprocessing.spawn``'s own frames, before the pool's worker loop."""
    rows = _rows(frames)
    if any(
        _in(file, mp + "pool.py") or _in(file, "concurrent/futures/process.py") for file, _, _ in rows for mp in _MP
    ):
        return False
    return any(
        file in _RUNPY or file.endswith("/runpy.py") or _in(file, "multiprocessing/spawn.py") for file, _, _ in rows
    )


@dataclass(frozen=True)
class ThreadWorker:
    """One ``ThreadPoolExecutor`` worker thread: ``name`` (py-spy's, or ""), ``task`` (the task's
    function as ``wait_on_future (job.py:7)``, or "" while it waits for work), ``at`` (its innermost
    frame outside the waiting modules), ``waits_future`` (its task waits for a future's result)."""

    name: str
    task: str
    at: str
    waits_future: bool


def _short(frame: tuple[str, str, str]) -> str:
    return "%s:%s" % (frame[0].replace("\\", "/").rsplit("/", 1)[-1], frame[1])


_NAME = re.compile(r'"([^"]+)"')


def thread_workers(threads: Iterable[tuple[str, Sequence[Any]]]) -> list[ThreadWorker]:
    """The ``ThreadPoolExecutor`` worker threads among ``threads`` (header, Python frames innermost
    first), with the task each runs."""
    out = []
    for head, raw in threads:
        frames = _rows(raw)
        if not any(_in(file, _THREAD_WORKER[0]) and func == _THREAD_WORKER[1] for file, _, func in frames):
            continue
        name = _NAME.search(head)
        item = next(
            (i for i, (file, _, func) in enumerate(frames) if _in(file, _WORK_ITEM[0]) and func == _WORK_ITEM[1]), None
        )
        if item is None or item == 0:
            out.append(ThreadWorker(name.group(1) if name else "", "", "", False))
            continue
        task = frames[item - 1]
        inner = [f for f in frames[:item] if f[0] and not any(_in(f[0], m) for m in ("threading.py",))]
        waits = bool(inner) and _in(inner[0][0], "concurrent/futures/_base.py") and inner[0][2] in _FUTURE_WAITS
        at = next((f for f in frames[:item] if f[0] and not any(_in(f[0], m) for m in _LIBRARY_WAITS)), task)
        out.append(
            ThreadWorker(
                name.group(1) if name else "", "%s (%s)" % (task[2], _short(task)), _short(at) + " in " + at[2], waits
            )
        )
    return out


def process_pool_thread(threads: Iterable[tuple[str, Sequence[Any]]]) -> bool:
    """Whether the process runs a ``ProcessPoolExecutor``'s manager thread (``process.py``)."""
    return any(_in(file, "concurrent/futures/process.py") for _, raw in threads for file, _, _ in _rows(raw))


THREAD_POOL_ADVICE = (
    "Do not wait inside a pool's task for another task of the same pool: call the inner function directly, "
    "submit it to a separate executor, or give the pool more workers (max_workers) than tasks that wait at once."
)


def thread_pool_parts(workers: Sequence[ThreadWorker], max_named: int) -> tuple[list[str], str]:
    """What the worker threads of a ``ThreadPoolExecutor`` do, as sentence parts, and the advice
    the evidence supports ("" when none)."""
    if not workers:
        return ["none of its worker threads is in the stacks (cannot tell where its task is)"], ""
    only = len(workers) == 1
    running = [w for w in workers if w.task]
    parts = []
    for w in running[:max_named]:
        who = "its only worker thread" if only else ("worker thread %s" % w.name if w.name else "a worker thread")
        text = "%s runs %s" % (who, w.task)
        if w.waits_future:
            text += ", which itself waits for a future's result"
        elif w.at and not w.task.endswith("(%s)" % w.at.split(" in ")[0]):
            text += ", now at %s" % w.at
        parts.append(text)
    idle = len(workers) - len(running)
    if running and idle:
        parts.append(
            "%d other worker thread%s wait%s for work" % (idle, "" if idle == 1 else "s", "s" if idle == 1 else "")
        )
    if not running:
        parts.append(
            "%s for work: no task of this pool is running"
            % ("its only worker thread waits" if only else "its %d worker threads wait" % idle)
        )
    if running and not idle and all(w.waits_future for w in running):
        parts.append(
            "%s waiting, the pool has no free worker: a task queued behind %s in the same pool never runs"
            % ("with it" if only else "with all of them", "it" if only else "them")
        )
        return parts, THREAD_POOL_ADVICE
    return parts, ""
