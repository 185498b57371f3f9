"""Which thread of a process waits for which: a waits-for graph read from its Python stacks, and a
cycle in it told as a deadlock.

Each edge is read from one thread's own frames, only where they show what it waits for:

- a thread in ``Thread.join`` (``threading.py`` ``join`` / ``_wait_for_tstate_lock``, not the
  interpreter's exit join) waits for the thread it joins: named when the evidence allows — the one
  other thread of the program the stacks show (with several, which one is not in the stacks: no
  edge);
- a thread in importlib's module lock (``<frozen importlib._bootstrap>`` ``acquire``, reached from
  ``_lock_unlock_module`` or ``_find_and_load``) waits for the thread that is importing a module:
  the threads whose stacks hold ``<module>`` frames run by importlib hold those modules' locks until
  their imports end. The module is named by the waiter's source line (``import foomodule``) when it
  can be read; otherwise the only other importing thread is the holder;
- a thread waiting on a pool's results (in ``multiprocessing``/``multiprocess``' pool, manager,
  queue or pipe, or in ``concurrent.futures``) waits for the pool's own threads in this process:
  the handler thread that hands its tasks to the workers, the executor's worker threads;
- a thread of the program in ``Event.wait()``, ``Queue.get()`` or ``Condition.wait()`` waits for the
  one other thread of the program the stacks show, the only one that could set or fill it (with
  several: no edge).

A cycle (`deadlock`) is a deadlock: no thread in it can go on. A cycle through a module's import
lock is the classic import-time deadlock (work that starts and waits for threads or pools run in
a module's top level, whose threads import that module): the advice is to move that work out of
the import. Pure: the frames come parsed (`lora_otel.analysis.diagnose`), the source through a
callable (none in recorded evidence).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol


class FrameLike(Protocol):
    @property
    def file(self) -> str: ...
    @property
    def line(self) -> str: ...
    @property
    def func(self) -> str: ...
    @property
    def python(self) -> bool: ...


Thread = tuple[str, Sequence[FrameLike]]
"""A thread's header line and its frames, innermost first."""

_BOOTSTRAP = ("importlib._bootstrap", "importlib/_bootstrap")
_OURS = "lora_otel/_boot/"
_MACHINERY = ("threading.py", "queue.py", "selectors.py", "multiprocessing/", "multiprocess/", "concurrent/futures/")
"""The modules a thread waits with: a thread's own line is outside them."""
_POOL_WAIT = ("multiprocessing/", "multiprocess/", "concurrent/futures/")
_POOL_THREADS = (
    # (path fragment, function, what the thread is)
    ("pool.py", "_handle_tasks", "the pool's task handler thread, which hands its tasks to the worker processes"),
    ("pool.py", "_handle_results", "the pool's result handler thread"),
    ("concurrent/futures/thread.py", "_worker", "a worker thread of its ThreadPoolExecutor"),
    ("concurrent/futures/process.py", "run", "its ProcessPoolExecutor's manager thread"),
)
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+))")
_IMPORT_CALL = re.compile(r"(?:__import__|import_module)\(\s*['\"]([\w.]+)['\"]")


@dataclass(frozen=True)
class Edge:
    """``waiter`` waits for ``target`` (indexes into the threads): ``kind`` ``join``, ``import``,
    ``pool`` or ``signal``; ``module`` the module whose import it waits for (``import``, "" when not
    named), or what it waits in (``signal``: ``Event.wait()``)."""

    waiter: int
    target: int
    kind: str
    module: str = ""


@dataclass(frozen=True)
class Deadlock:
    sentence: str
    advice: str


def _in(path: str, fragment: str) -> bool:
    path = path.replace("\\", "/")
    return path.startswith(fragment) or ("/" + fragment) in path


def _bootstrap(frame: FrameLike) -> bool:
    return any(b in frame.file for b in _BOOTSTRAP)


def _ours(frame: FrameLike) -> bool:
    return _OURS in frame.file.replace("\\", "/")


def _short(frame: FrameLike) -> str:
    return "%s:%s in %s" % (frame.file.replace("\\", "/").rsplit("/", 1)[-1], frame.line, frame.func)


def _module_name(path: str) -> str:
    """``foomodule`` for ``/src/foomodule.py``; ``pkg`` for ``/src/pkg/__init__.py``."""
    parts = path.replace("\\", "/").rsplit("/", 2)
    stem = parts[-1].rsplit(".", 1)[0]
    return parts[-2] if stem == "__init__" and len(parts) > 1 else stem


def importing(frames: Sequence[FrameLike]) -> list[tuple[str, FrameLike]]:
    """The modules this thread is importing, innermost first, with each one's ``<module>`` frame:
    a ``<module>`` frame that importlib runs (its caller is importlib's bootstrap). The thread holds
    each one's module lock until that import ends."""
    out = []
    for i, frame in enumerate(frames):
        if frame.func == "<module>" and i + 1 < len(frames) and _bootstrap(frames[i + 1]):
            out.append((_module_name(frame.file), frame))
    return out


def _program(frame: FrameLike) -> bool:
    path = frame.file.replace("\\", "/")
    if not frame.python or path.startswith("<") or _OURS in path:
        return False
    return not any(s in path for s in ("site-packages/", "dist-packages/")) and not re.search(
        r"/lib/python3[.\d]*/", path
    )


def own_line(frames: Sequence[FrameLike]) -> Optional[FrameLike]:
    """Where a thread waits, in its own words: the innermost frame of the program's own code; with
    none (a library's thread), the innermost frame outside the modules it waits with."""
    program = next((fr for fr in frames if _program(fr)), None)
    if program is not None:
        return program
    return next(
        (
            fr
            for fr in frames
            if fr.python
            and not _bootstrap(fr)
            and not _ours(fr)
            and not fr.file.startswith("<")
            and not any(_in(fr.file, m) for m in _MACHINERY)
        ),
        None,
    )


def is_main(frames: Sequence[FrameLike], head: str) -> bool:
    return bool(frames) and (frames[-1].func == "<module>" or '"MainThread"' in head)


def thread_name(frames: Sequence[FrameLike], head: str) -> str:
    if is_main(frames, head):
        return "the main thread"
    for fragment, func, what in _POOL_THREADS[:2]:  # a pool's handler threads run no code of the program
        if any(_in(fr.file, fragment) and fr.func == func for fr in frames):
            return what.split(",")[0]
    outer = [f for f in frames if f.python and not any(_in(f.file, m) for m in _MACHINERY)]
    return "thread %s()" % outer[-1].func if outer else "a thread"


def _joins(frames: Sequence[FrameLike]) -> bool:
    """In ``Thread.join`` called by code outside ``threading.py`` (not the interpreter's exit join)."""
    inner = 0
    while inner < len(frames) and frames[inner].python and _in(frames[inner].file, "threading.py"):
        inner += 1
    return (
        0 < inner < len(frames)
        and any(fr.func == "join" for fr in frames[:inner])
        and not any(fr.func == "_shutdown" for fr in frames[:inner])
    )


def _pool_joins(frames: Sequence[FrameLike]) -> bool:
    """The join is a pool's or executor's own: its caller is in their modules, not the program."""
    caller = next((fr for fr in frames if fr.python and not _in(fr.file, "threading.py") and not _ours(fr)), None)
    return caller is not None and any(_in(caller.file, m) for m in _POOL_WAIT)


def _import_wait(frames: Sequence[FrameLike]) -> bool:
    """In importlib's module lock: the innermost frames importlib's, ``acquire`` first."""
    i = 0
    while i < len(frames) and _ours(frames[i]):
        i += 1
    return (
        i < len(frames)
        and _bootstrap(frames[i])
        and frames[i].func.endswith("acquire")
        and any(
            _bootstrap(fr) and fr.func in ("_lock_unlock_module", "_find_and_load", "__enter__") for fr in frames[i:]
        )
    )


def _imported_by_source(frames: Sequence[FrameLike], source: Callable[[Any], str]) -> str:
    caller = next((fr for fr in frames if fr.python and not _bootstrap(fr) and not _ours(fr)), None)
    if caller is None:
        return ""
    text = source(caller)
    m = _IMPORT.match(text) or _IMPORT_CALL.search(text)
    return next((g for g in (m.groups() if m else ()) if g), "")


def _pool_waits(frames: Sequence[FrameLike]) -> bool:
    """Waits on a pool's results: its innermost frames, past threading's and queue's, are a pool's."""
    rest = [fr for fr in frames if not (_in(fr.file, "threading.py") or _in(fr.file, "queue.py") or _ours(fr))]
    return (
        bool(rest)
        and any(_in(rest[0].file, m) for m in _POOL_WAIT)
        and not any(_in(fr.file, "pool.py") and fr.func.startswith("_handle_") for fr in frames)
    )


def _pool_thread(frames: Sequence[FrameLike]) -> bool:
    return any(_in(fr.file, fragment) and fr.func == func for fragment, func, _ in _POOL_THREADS for fr in frames)


def edges(threads: Sequence[Thread], source: Callable[[Any], str] = lambda fr: "") -> list[Edge]:
    """The waits-for edges the stacks show (see the module's text); a wait whose other end the
    evidence does not name gives no edge."""
    out: list[Edge] = []
    holders = {i: importing(frames) for i, (_, frames) in enumerate(threads)}
    for i, (_, frames) in enumerate(threads):
        if not frames:
            continue
        if _import_wait(frames):
            module = _imported_by_source(frames, source)
            others = [j for j, mods in holders.items() if j != i and mods]
            if module:
                # the lock of any package on its dotted path may be the one waited for
                others = [j for j in others if any(m in module.split(".") for m, _ in holders[j])]
            if len(others) == 1:
                j = others[0]
                if not module and len(holders[j]) == 1:
                    module = holders[j][0][0]
                out.append(Edge(i, j, "import", module))
        elif _joins(frames) and _pool_joins(frames):
            # a pool's or executor's own join (shutdown(wait=True), Pool.join): its threads
            out += [Edge(i, j, "pool") for j, (_, fr) in enumerate(threads) if j != i and _pool_thread(fr)]
        elif _joins(frames):
            others = [
                j for j, (head, fr) in enumerate(threads) if j != i and fr and not _pool_thread(fr) and not _helper(fr)
            ]
            if len(others) == 1:
                out.append(Edge(i, others[0], "join"))
        elif _pool_waits(frames):
            for j, (_, fr) in enumerate(threads):
                if j != i and _pool_thread(fr):
                    out.append(Edge(i, j, "pool"))
        elif what := _signal_wait(frames):
            others = [
                j for j, (head, fr) in enumerate(threads) if j != i and fr and not _pool_thread(fr) and not _helper(fr)
            ]
            if len(others) == 1:
                out.append(Edge(i, others[0], "signal", what))
    return out


def _signal_wait(frames: Sequence[FrameLike]) -> str:
    """``Event.wait()``, ``Queue.get()``, ``Condition.wait()``: a wait of the program's own code for
    another thread to set, fill or notify something; "" otherwise."""
    inner = [fr for fr in frames if fr.python and not _ours(fr)]
    if not inner or inner[0].func != "wait" or not _in(inner[0].file, "threading.py"):
        return ""
    rest = [fr for fr in inner if not _in(fr.file, "threading.py")]
    if not rest:
        return ""
    if _in(rest[0].file, "queue.py"):
        return "Queue.%s()" % rest[0].func if len(rest) > 1 and _program(rest[1]) else ""
    if not _program(rest[0]):
        return ""
    waits = [fr.func for fr in inner if _in(fr.file, "threading.py")]
    return "Event.wait()" if len(waits) > 1 and waits[1] == "wait" else "Condition.wait()"


_HELPERS = ("tqdm/_monitor.py", "torch/utils/data/_utils/pin_memory.py")


def _helper(frames: Sequence[FrameLike]) -> bool:
    return any(_in(fr.file, h) for fr in frames for h in _HELPERS)


def _cycle(edges_: Sequence[Edge], start_first: int) -> list[Edge]:
    """A cycle of edges, begun at thread ``start_first`` when it is on one; [] when none."""
    out: dict[int, list[Edge]] = {}
    for e in edges_:
        out.setdefault(e.waiter, []).append(e)
    for start in [start_first, *sorted(out)]:
        path = _path(out, start, start, set())
        if path:
            return path
    return []


def _path(out: dict[int, list[Edge]], node: int, goal: int, seen: set[int]) -> list[Edge]:
    """Edges from ``node`` back to ``goal`` (depth first), [] when none."""
    for e in out.get(node, []):
        if e.target == goal:
            return [e]
        if e.target not in seen:
            seen.add(e.target)
            rest = _path(out, e.target, goal, seen)
            if rest:
                return [e, *rest]
    return []


def deadlock(threads: Sequence[Thread], source: Callable[[Any], str] = lambda fr: "") -> Optional[Deadlock]:
    """A cycle of waits between the threads (`edges`), told with each thread's own line, and what
    breaks it when the cycle runs through a module's import; None when the stacks show no cycle."""
    found = edges(threads, source)
    main = next((i for i, (head, frames) in enumerate(threads) if is_main(frames, head)), 0)
    # A wait on an Event or a Queue names its other end only by elimination (the one other thread
    # the stacks show; a native thread would not be seen), and a timed one may be a poll: such an
    # edge counts only in a cycle that an import's lock closes.
    cycle = _cycle([e for e in found if e.kind != "signal"], main)
    if not cycle:
        cycle = _cycle(found, main)
        if not any(e.kind == "import" for e in cycle):
            return None
    names = {i: thread_name(frames, head) for i, (head, frames) in enumerate(threads)}
    parts = []
    for e in cycle:
        frames = threads[e.waiter][1]
        who = names[e.waiter]
        mods = importing(frames)
        if mods:
            who += ", importing %s," % mods[0][0]
        mine = own_line(frames)
        where = " at %s" % _short(mine) if mine is not None else ""
        target = names[e.target]
        if e.kind == "join":
            parts.append("%s waits%s for %s to end (Thread.join)" % (who, where, target))
        elif e.kind == "signal":
            parts.append(
                "%s waits%s in %s for %s, the only other thread that could set or fill what it waits on"
                % (who, where, e.module, target)
            )
        elif e.kind == "import":
            what = "the import of %s" % e.module if e.module else "a module's import"
            parts.append(
                "%s waits%s for %s, which %s is running (importlib's lock on that module is released only "
                "when that import ends)" % (who, where, what, target)
            )
        else:
            role = next(
                (
                    what
                    for frag, func, what in _POOL_THREADS
                    for fr in threads[e.target][1]
                    if _in(fr.file, frag) and fr.func == func
                ),
                target,
            )
            role = role if role.startswith(target) else "%s, %s" % (target, role)
            parts.append("%s waits%s for its pool's results, which depend on %s" % (who, where, role))
    rest = "neither can go on" if len({e.waiter for e in cycle}) == 2 else "none of them can go on"
    sentence = "Deadlock between threads: %s; %s." % ("; ".join(parts), rest)
    return Deadlock(sentence, _advice(threads, cycle))


def _advice(threads: Sequence[Thread], cycle: Sequence[Edge]) -> str:
    """For a cycle through a module's import lock: the line of the top level being imported where
    the thread holding the lock waits (its innermost ``<module>`` frame run by importlib: the module
    whose top level starts and waits for the work; an outer module's lock may be the one held), and
    to move that work out of the import."""
    for e in cycle:
        if e.kind != "import":
            continue
        mods = importing(threads[e.target][1])
        if not mods:
            return ""
        name, frame = mods[0]
        return (
            "Do not start threads or pools and wait for them while a module is being imported: move the work "
            "at %s (the top level of %s, run by its import) into a function the program calls after the import, "
            'or under `if __name__ == "__main__":`.' % (_short(frame).rsplit(" in ", 1)[0], name)
        )
    return ""


def join_wait(threads: Sequence[Thread]) -> Optional[str]:
    """``The main thread waits at job.py:6 in <module> for thread baz() to end (Thread.join); thread
    baz() is at job.py:3 in baz → time.sleep.``: the main thread's join of the one thread it can
    join, and where that thread is; None when the main thread is not in such a join."""
    found = edges(threads)
    main = next((i for i, (head, frames) in enumerate(threads) if is_main(frames, head)), None)
    edge = next((e for e in found if e.waiter == main and e.kind == "join"), None)
    if edge is None:
        return None
    frames = threads[edge.waiter][1]
    target = threads[edge.target][1]
    mine, theirs = own_line(frames), own_line(target)
    name = thread_name(target, threads[edge.target][0])
    where = " at %s" % _short(mine) if mine is not None else ""
    at = _short(theirs) if theirs is not None else _short(target[0])
    inner = next((fr for fr in target if fr.python), None)
    if inner is not None and theirs is not None and inner is not theirs:
        at += " (in %s)" % _short(inner)
    return "The main thread waits%s for %s to end (Thread.join); %s is at %s." % (where, name, name, at)
