"""Whether a frozen process holds the GIL, as far as its native stacks tell — never guessed.

A process whose beat stopped may hold the GIL in native code (``ctypes.PyDLL(None).pause()``, a
C loop) or may have released it and be blocked with every other thread too (a full pipe its beat
also writes to, a lock the beat needs). Only a reading of the interpreter from outside tells the
two apart: py-spy (``pip install lora-otel[pyspy]``; ptrace) marks the thread it sees holding the
GIL ``(active+gil)``, and its ``--native`` frames show a thread waiting to take the GIL (CPython's
``take_gil``: ``pthread_cond_timedwait`` called from the interpreter itself — a native frame of
libpython, or a Python frame, which py-spy shows in place of the evaluation loop — since CPython's
own locks wait on semaphores, and an extension's own wait shows the extension's frame).
"""

from __future__ import annotations

import re
from typing import Optional

# A py-spy thread header: Thread 4711 (active+gil): "MainThread"
_HEADER = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?::\s*"([^"]*)")?')
# Native frames of CPython taking the GIL (names kept where a build has their symbols).
_TAKING = ("take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", "PyEval_AcquireLock", "PyGILState_Ensure")
_COND_WAIT = ("pthread_cond_timedwait", "pthread_cond_wait", "pthread_cond_clockwait")
_FRAME = re.compile(r"^\s+(\S+) \((.*)\)\s*$")
_NATIVE_SOURCE = re.compile(r"\.(?:c|cc|cpp|cxx|h|hpp|rs):\d+$")


def _is_python(where: str) -> bool:
    """A Python frame's place (``train.py:12``, ``<frozen importlib._bootstrap>:241``), which py-spy
    shows in place of the interpreter's own evaluation frames; a native one is ``(libc.so.6)`` or
    ``(callproc.c:943)``."""
    return re.search(r":\d+$", where) is not None and _NATIVE_SOURCE.search(where) is None


def _threads(dump: str) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """(id, status, name, [(function, where)] innermost first) of each thread in a py-spy dump."""
    out: list[tuple[str, str, str, list[tuple[str, str]]]] = []
    for line in dump.splitlines():
        m = _HEADER.match(line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3) or "", []))
            continue
        f = _FRAME.match(line)
        if f and out:
            out[-1][3].append((f.group(1), f.group(2)))
    return out


def _name(tid: str, name: str) -> str:
    return "thread %s%s" % (tid, " (%s)" % name if name else "")


def _in_interpreter(where: str) -> bool:
    """A native frame of the interpreter itself: ``(libpython3.11.so.1.0)``, ``(python3.12)``, or a
    source file of CPython's (``ceval_gil.c:…``)."""
    return not _is_python(where) and ("python" in where.lower() or where.startswith(("ceval", "pystate")))


def _waits_for_gil(frames: list[tuple[str, str]]) -> bool:
    for i, (func, _) in enumerate(frames):
        if func.startswith(_TAKING):
            return True
        if func.startswith(_COND_WAIT):
            caller = frames[i + 1] if i + 1 < len(frames) else None
            return caller is not None and (_in_interpreter(caller[1]) or _is_python(caller[1]))
    return False


def gil_held(py_spy_dump: str) -> Optional[str]:
    """What shows that the process holds the GIL, as a phrase (``py-spy shows thread 4711
    (MainThread) holding it``, ``py-spy's native stacks show thread 4713 waiting to take it``), or None when the dump
    does not show it (no dump, or nothing in it tells)."""
    threads = _threads(py_spy_dump)
    for tid, status, name, _ in threads:
        if "+gil" in status:
            return "py-spy shows %s holding it" % _name(tid, name)
    waiting = [_name(tid, name) for tid, _, name, frames in threads if _waits_for_gil(frames)]
    if waiting:
        return "py-spy's native stacks show %s waiting to take it" % " and ".join(waiting[:2])
    return None


def has_native_stacks(py_spy_dump: str) -> bool:
    """Whether the dump has native frames (py-spy ``--native`` worked), not only Python ones."""
    return any(not _is_python(where) for _, _, _, frames in _threads(py_spy_dump) for _, where in frames)
