"""Where the main thread is: its innermost frames, sampled by the beat, and one way to say it.

`sample` reads the main thread's frame from ``sys._current_frames()`` (from the beat thread) and
walks ``f_back``: at most `MAX_FRAMES` entries ``[file, line, function]``, outermost first. Frames
of lora_otel itself are left out (a hook of ours around ``os.waitpid`` shows as its caller's call),
and those of the import machinery (``<frozen importlib._bootstrap>``) unless innermost: a program
stuck in ``import toolkit.job`` reads ``run.py:3 in <module> → toolkit/job.py:2 in <module>``, not
five importlib frames. Paths lose the prefix of the standard library, of
``site-packages``/``dist-packages`` and of the working directory at start.

When the main thread sits in a C function (``time.sleep``, ``socket.recv_into``, ``lock.acquire``)
its innermost Python frame is the caller. If that frame is at a call instruction at two beats in
a row (stuck there, not passing by), the called name is read from the bytecode — the loads that
the call's source position starts with (``time.sleep``, ``self._sock.recv_into``) on 3.11+; on
3.9 and 3.10, which have no source positions, the loads found by the stack effects of the
instructions before the call (`_callee_by_stack`) — and added as a last entry
``["", 0, "time.sleep"]`` (no file, line 0). The result is
cached per code object and instruction, so a thread stuck there costs a dict look-up per beat.

Standard library only; never raises (the caller catches). Cost: docs/performance.md.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: no typing import
    from collections.abc import Callable, Iterable
    from types import CodeType, FrameType
    from typing import Any, Union

    Frame = list[Union[str, int]]
    """One entry of a sample: ``[file, line, function]`` (``["", 0, callee]`` for a called C function)."""

MAX_FRAMES = 4
_WALK_LIMIT = 64  # frames looked at, at most (a deep recursion of skipped frames costs no more)
_WINDOW = 48  # code units before a call searched for the loads that name its callee

_boot_dir = os.path.dirname(os.path.abspath(__file__))
_lora_otel_dir = os.path.dirname(_boot_dir) + os.sep
_stdlib_dir = os.path.dirname(os.__file__) + os.sep
_cwd = ""
_short: dict[str, str] = {}  # co_filename -> shortened path
_callees: dict[tuple[CodeType, int], str] = {}  # (code, lasti) -> "time.sleep" or ""
_last_spot: tuple[CodeType | None, int] = (None, -1)  # (code, lasti) of the innermost frame at the last sample


def set_cwd(path: str) -> None:
    """The working directory at start: paths under it are shown relative to it."""
    global _cwd
    _cwd = path.rstrip(os.sep) + os.sep if path else ""


def _shorten(filename: str) -> str:
    short = _short.get(filename)
    if short is not None:
        return short
    short = filename
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        i = filename.rfind(marker)
        if i >= 0:
            short = filename[i + len(marker) :]
            break
    else:
        if filename.startswith(_stdlib_dir):
            short = filename[len(_stdlib_dir) :]
        elif _cwd and filename.startswith(_cwd):
            short = filename[len(_cwd) :]
    if len(_short) > 4096:
        _short.clear()
    _short[filename] = short
    return short


def _skipped(filename: str) -> bool:
    return filename.startswith(("<frozen importlib", _lora_otel_dir))


def other_interpreters() -> bool:
    """Whether the program may run interpreters of its own: it loaded ``_interpreters`` (3.13's
    ``concurrent.interpreters``) or ``_xxsubinterpreters``, the only ways to one with its own GIL.
    ``sys._current_frames`` reads the frames of every interpreter's threads, and of one running under
    its own GIL that read races its thread: 3.13 freed memory twice ("double free or corruption")
    when a beat sampled the main thread while it ran an isolated subinterpreter. Asking the module
    which interpreters exist races too: 3.12 crashed (SIGSEGV, CPython's `test_sys`
    `test_subinterp_intern_statically_allocated`) when the beat called ``list_all()`` while the main
    thread created one. So a loaded module is enough: such a program's beats sample no frames.
    Nothing is imported or called."""
    return any(name in sys.modules for name in ("_interpreters", "_xxsubinterpreters"))


def sample(main_ident: int, _frames: Callable[[], dict[int, FrameType]] = sys._current_frames) -> list[Frame] | None:
    """The main thread's innermost frames, outermost first (module docstring); None when it has none,
    or while the program runs other interpreters (`other_interpreters`)."""
    global _last_spot
    if other_interpreters():
        return None
    frame = _frames().get(main_ident)
    if frame is None:
        return None
    # A hook of ours around a blocking call (os.waitpid, a lock) is not where the program is: its
    # caller is, and the callee read there names the call it made.
    inner: FrameType | None = frame
    while inner is not None and inner.f_code.co_filename.startswith(_lora_otel_dir):
        inner = inner.f_back
    if inner is not None:
        frame = inner
    del inner
    out: list[Frame] = []
    innermost: FrameType | None = frame
    spot = (frame.f_code, frame.f_lasti)
    callee: str | None = ""
    if spot == _last_spot:
        callee = _callees.get(spot)
        if callee is None:
            callee = _callee(*spot)
            if len(_callees) > 512:
                _callees.clear()
            _callees[spot] = callee
    _last_spot = spot
    room = MAX_FRAMES - 1 if callee else MAX_FRAMES
    n = 0
    while frame is not None and len(out) < room and n < _WALK_LIMIT:
        code = frame.f_code
        filename = code.co_filename
        if frame is innermost or not _skipped(filename):
            out.append([_shorten(filename), frame.f_lineno or 0, code.co_name])
        frame = frame.f_back
        n += 1
    del frame, innermost
    out.reverse()
    if callee:
        out.append(["", 0, callee])
    return out


_CALLS = frozenset(("CALL", "PRECALL", "CALL_KW", "CALL_FUNCTION_EX"))
_opcodes: tuple[list[str], int, int] | None = None  # (opname list, EXTENDED_ARG, CACHE)


def _callee(code: CodeType, lasti: int) -> str:
    """The dotted name a call instruction at ``lasti`` calls (``time.sleep``), or ""."""
    global _opcodes
    if lasti < 0:
        return ""
    if sys.version_info < (3, 11):
        return _callee_by_stack(code, lasti)
    try:
        if _opcodes is None:
            from lora_otel._boot.stdlib import module

            opcode = module("opcode")
            _opcodes = (opcode.opname, opcode.opmap.get("EXTENDED_ARG", -1), opcode.opmap.get("CACHE", 0))
        opname, ext_op, cache_op = _opcodes
        co = code.co_code
        if lasti + 1 >= len(co) or opname[co[lasti]] not in _CALLS:
            return ""
        unit = lasti // 2
        base = max(0, unit - _WINDOW)
        positions = code.co_positions()
        for _ in range(base):
            next(positions)
        pos = [next(positions) for _ in range(unit - base + 1)]
        line, end_line, col, end_col = pos[-1]
        if line is None or col is None:
            return ""
        call_end = (end_line, end_col)
        parts = []  # (end, name or None) of the loads that start where the call's expression starts
        for u in range(base, unit):
            p = pos[u - base]
            op = co[2 * u]
            if p[0] != line or p[2] != col or op in (cache_op, ext_op) or (p[1], p[3]) >= call_end:
                continue
            arg = co[2 * u + 1]
            if u > 0 and co[2 * u - 2] == ext_op:
                arg |= co[2 * u - 1] << 8
            name = _load_name(opname[op], arg, code)
            if name is not None or opname[op] in _CALLS:  # a call inside the callee (``a.b().c``) breaks the chain
                parts.append(((p[1], p[3]), name))
        if not parts:
            return ""
        parts.sort(key=lambda item: item[0])
        names = []
        for _end, name in parts:  # the longest run of plain loads that ends the callee
            if name is None:
                names = []
            else:
                names.append(name)
        return ".".join(names) if names else ""
    except Exception:  # noqa: BLE001 - a hint only: bytecode of another version, a short code object
        return ""


_OLD_BASES = frozenset(("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF", "LOAD_CLASSDEREF"))
_OLD_ATTRS = frozenset(("LOAD_ATTR", "LOAD_METHOD"))
_OLD_CALLS = frozenset(("CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX"))


def _callee_by_stack(code: CodeType, lasti: int) -> str:
    """`_callee` on 3.9 and 3.10: the call at ``lasti`` takes N stack slots (its callee and
    arguments); walking back, the instruction where the net stack effects reach N is the callee's
    first load, and a run of plain loads from there (``time`` then ``.sleep``) names it, if what
    follows the run up to the call only pushes the arguments (``a.b().c()`` names nothing). Any
    jump among the arguments names nothing either."""
    try:
        from lora_otel._boot.stdlib import module

        dis = module("dis")
        ins = []
        for i in dis.get_instructions(code):
            if i.offset > lasti:
                break
            ins.append(i)
        if not ins or ins[-1].offset != lasti or ins[-1].opname not in _OLD_CALLS:
            return ""
        call = ins[-1]
        slots = 1 - dis.stack_effect(call.opcode, call.arg)  # callee (2 after LOAD_METHOD) + arguments
        held = 0
        j = len(ins) - 1
        while held < slots:
            j -= 1
            if j < 0 or len(ins) - j > _WINDOW:
                return ""
            i = ins[j]
            if i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
                return ""
            if i.opname == "EXTENDED_ARG":
                continue
            held += dis.stack_effect(i.opcode, i.arg if i.opcode >= dis.HAVE_ARGUMENT else None)
            if held < slots and i.is_jump_target:
                return ""
        if held != slots or ins[j].opname not in _OLD_BASES:
            return ""
        names = [str(ins[j].argval)]
        k = j + 1
        while k < len(ins) - 1 and ins[k].opname in _OLD_ATTRS:
            names.append(str(ins[k].argval))
            k += 1
        depth = 0  # what follows the callee up to the call must only push its arguments
        for i in ins[k:-1]:
            if i.opname == "EXTENDED_ARG":
                continue
            depth += dis.stack_effect(i.opcode, i.arg if i.opcode >= dis.HAVE_ARGUMENT else None)
            if depth < 0:
                return ""
        return ".".join(names)
    except Exception:  # noqa: BLE001 - a hint only, as in _callee
        return ""


def _load_name(name: str, arg: int, code: CodeType) -> str | None:
    if name in ("LOAD_ATTR", "LOAD_METHOD"):
        return code.co_names[arg >> 1 if sys.version_info >= (3, 12) and name == "LOAD_ATTR" else arg]
    if name == "LOAD_GLOBAL":
        return code.co_names[arg >> 1]
    if name == "LOAD_NAME":
        return code.co_names[arg]
    if name in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF", "LOAD_CLOSURE"):
        names = code.co_varnames + code.co_cellvars + code.co_freevars
        return names[arg] if arg < len(names) else None
    return None


def text(frames: Iterable[Any] | None) -> str:
    """``toolkit/job.py:2 in <module> → time.sleep``: frames (outermost first) as one line."""
    parts = []
    for frame in frames or ():
        try:
            filename, line, func = frame
        except (TypeError, ValueError):
            continue
        if not filename:
            parts.append(str(func))
        else:
            parts.append("%s:%s in %s" % (filename, line, func))
    return " → ".join(parts)
