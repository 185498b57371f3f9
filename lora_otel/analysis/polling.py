"""What a poll loop polls, read from its source and its frame's locals; and the sentence about it.

A program that waits by sleeping in a loop (``while os.path.exists(lock): time.sleep(1)``; a
``for`` of retries around ``socket.create_connection``; ``while os.kill(pid, 0) is None``) is not
stuck on a lock, the network or the GPU: it waits for the *object it polls* to change. That object
is named by the loop's own source and the values of its frame's locals:

- `find_loop`: the ``while``/``for`` around the sleeping line, in the frame that calls ``sleep``
  or, when that frame has no loop (a ``backoff()`` helper), in its callers;
- `read_loop`: the calls in that loop that look at something outside the process — a path
  (``os.path.exists``/``isfile``/``isdir``/``os.stat``/``open``/``Path(...).exists()``), a pid
  (``os.kill(pid, 0)``, ``psutil.pid_exists``, ``/proc/<pid>``), a port (``socket.create_connection``,
  ``connect``/``connect_ex``), a URL (``urlopen``, ``requests.get`` …), a flag (``event.is_set()``,
  ``while not self.done``) — and which way the loop waits (for the path to go away or to appear);
  the expression is evaluated over the frame's locals only for names, attributes of ``self`` the
  dump gave, constants, ``os.path.join``, ``Path``/``/``, ``str``, ``+`` and f-strings: nothing of
  the program is called; names used in the loop whose values look like a path, a URL, a pid or a
  port are the fallback.

The state of the object (exists, since when, who has it open; alive or gone; something listening)
is gathered from outside by `lora_otel.analysis.pollfacts` into ``lora_otel.evidence.poll.*``
attributes; `sentence` and `advice` say them (the ``poll loop`` rule of
`lora_otel.analysis.diagnose`). Pure: no /proc, no process, no file but the source lines the
caller passes in.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple, Optional, Union

KEY = "lora_otel.evidence.poll."
"""The prefix of the poll loop's evidence attributes."""

LOOP_LINES_MAX = 40
"""Lines of a loop's source read (header, and its body up to this many lines)."""
LOOK_UP_MAX = 60
"""Lines above the sleeping line looked through for the loop's header."""
CALLERS_MAX = 3
"""Frames, from the one that calls sleep outwards, looked at for a loop around the sleep."""

Value = Union[str, int, float, bool, None]
Locals = Mapping[str, Value]
"""A frame's locals of simple types by name; ``self.x`` for an attribute of ``self`` the dump read."""


class PollFrame(NamedTuple):
    """One Python frame, innermost first, with the locals the dump gave (may be empty)."""

    file: str
    line: int
    func: str
    locals: Locals


class Loop(NamedTuple):
    """The loop around a sleep: where its header is, its source (dedented), and the frame it is in."""

    frame: PollFrame
    first_line: int
    source: str


class Target(NamedTuple):
    """What a poll loop polls."""

    kind: str  # path, pid, port, url, flag
    expr: str  # its expression in the source: self.lock_file_path
    call: str  # the call that looks at it: os.path.exists
    value: Value  # its value from the locals; None when not known
    waits_for: str  # "gone" (a path to go away, a pid to exit), "there" (to appear, to answer), ""
    host: str = ""  # a port's or URL's host
    source: str = ""  # the call as written: os.kill(pid, 0)


# --- the loop ------------------------------------------------------------------------------------

_LOOP_HEAD = re.compile(r"^(\s*)(?:async\s+)?(while|for)\b")
_DEF_HEAD = re.compile(r"^(\s*)(?:async\s+)?(def|class)\b")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


_TIMED_WAIT = re.compile(r"\.wait\(\s*(?!\))")


def pauses(line: str) -> str:
    """``sleep`` when the source line calls a sleep, ``wait`` when it calls a ``.wait(...)`` with an
    argument (``event.wait(1)``, a timed wait that a poll loop paces itself with; threading's own
    ``self._cond.wait(timeout)``), "" otherwise."""
    if "sleep" in line:
        return "sleep"
    return "wait" if _TIMED_WAIT.search(line) else ""


def find_loop(frames: Sequence[PollFrame], getline: Callable[[str, int], str]) -> Optional[Loop]:
    """The loop around the sleep: in the innermost frame whose line calls ``sleep`` (or a timed
    ``.wait``: `pauses`; of the first `CALLERS_MAX`), else in one of its callers; None when no
    frame sleeps in a loop."""
    loops = find_loops(frames, getline)
    return loops[0] if loops else None


def find_loops(frames: Sequence[PollFrame], getline: Callable[[str, int], str]) -> list[Loop]:
    """Every loop around the sleep, innermost first (a library's ``queue.get`` loop, then the
    program's own loop around that call): the first that polls something is the one."""
    start = next(
        (i for i, fr in enumerate(frames[:CALLERS_MAX]) if pauses(getline(fr.file, fr.line))),
        None,
    )
    if start is None:
        return []
    found = (_loop_at(frame, getline) for frame in frames[start : start + CALLERS_MAX])
    return [loop for loop in found if loop is not None]


def _loop_at(frame: PollFrame, getline: Callable[[str, int], str]) -> Optional[Loop]:
    here = getline(frame.file, frame.line)
    if not here.strip():
        return None
    level = _indent(here)
    head = None
    for number in range(frame.line, max(0, frame.line - LOOK_UP_MAX), -1):
        text = getline(frame.file, number)
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if number == frame.line and _LOOP_HEAD.match(text):  # the sleep in the loop's own header
            head = number
            break
        if _indent(text) < level:
            if _DEF_HEAD.match(text):
                return None
            if _LOOP_HEAD.match(text):
                head = number
                break
            level = _indent(text)
    if head is None:
        return None
    head_level = _indent(getline(frame.file, head))
    lines = [getline(frame.file, head)]
    for number in range(head + 1, head + LOOP_LINES_MAX):
        text = getline(frame.file, number)
        if not text:
            break
        if text.strip() and _indent(text) <= head_level and not text.lstrip().startswith("#"):
            break
        lines.append(text)
    return Loop(frame, head, textwrap.dedent("".join(lines)))


def _parse(source: str) -> Optional[ast.AST]:
    """The loop's source parsed; a header continued on lines it did not keep is cut back to
    what parses."""
    lines = source.splitlines(keepends=True)
    for end in range(len(lines), 0, -1):
        try:
            return ast.parse("".join(lines[:end]))
        except SyntaxError:
            continue
    return None


# --- the expressions -----------------------------------------------------------------------------


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return "%s.%s" % (inner, node.attr) if inner else ""
    return ""


def evaluate(node: ast.AST, local: Locals) -> Value:
    """The value of a small expression over ``local`` (names, ``self.x``, constants, ``os.path.join``,
    ``Path``/``/``, ``str``/``int``/``os.fspath``, ``+``, f-strings); None for anything else. Nothing is called."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        return local.get(name) if name else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            part = evaluate(value.value if isinstance(value, ast.FormattedValue) else value, local)
            if part is None or (isinstance(value, ast.FormattedValue) and value.format_spec is not None):
                return None
            parts.append(str(part))
        return "".join(parts)
    if isinstance(node, ast.BinOp):
        left, right = evaluate(node.left, local), evaluate(node.right, local)
        if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(node.op, ast.Div) and isinstance(left, str) and isinstance(right, str) and _is_pathish(node.left):
            return os.path.join(left, right)
        if isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(left, str):
            items = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
            values = [evaluate(item, local) for item in items]
            if any(v is None for v in values) or re.search(r"%[^sdi%]", left):
                return None  # (only %s and %d: nothing of the program's __format__ runs)
            try:
                return left % tuple(values)
            except (TypeError, ValueError):
                return None
        return None
    if isinstance(node, ast.Call) and not node.keywords:
        parts = _dotted(node.func).rsplit(".", 2)
        short = ".".join(parts[-2:]) if len(parts) > 1 else parts[0]
        args = [evaluate(a, local) for a in node.args]
        if any(a is None for a in args):
            return None
        if short in ("path.join", "join") and args and all(isinstance(a, str) for a in args):
            return os.path.join(*[str(a) for a in args])
        if parts[-1] in ("Path", "PurePath", "PosixPath", "fspath", "str", "abspath", "expanduser") and len(args) == 1:
            arg = args[0]
            if parts[-1] == "expanduser" and isinstance(arg, str) and arg.startswith("~"):
                return None  # (whose home: the process's, not ours)
            return str(arg) if parts[-1] != "str" or not isinstance(arg, bool) else None
        if parts[-1] == "int" and len(args) == 1 and isinstance(args[0], (str, int)):
            try:
                return int(args[0])
            except ValueError:
                return None
    return None


def _is_pathish(node: ast.AST) -> bool:
    """``Path(x)``, ``self.root``...: the left side of a ``/`` that is a path join, not a division."""
    if isinstance(node, ast.Call):
        return _dotted(node.func).rsplit(".", 1)[-1] in ("Path", "PurePath", "PosixPath")
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, ast.Div) and _is_pathish(node.left)
    return isinstance(node, (ast.Name, ast.Attribute))


_PATH_CALLS = {
    "exists", "isfile", "isdir", "lexists", "islink", "getsize", "getmtime", "stat", "lstat", "access",
    "open", "listdir", "scandir", "glob", "iglob",
}  # fmt: skip
_PATH_METHODS = {"exists", "is_file", "is_dir", "stat", "read_text", "read_bytes", "open", "iterdir", "glob"}
_PID_CALLS = {"kill", "pid_exists", "waitpid"}
_CONNECT_CALLS = {"create_connection", "connect", "connect_ex"}
_URL_CALLS = {"urlopen", "get", "head", "post", "request", "Request"}
_FLAG_METHODS = {"is_set", "isSet"}
_FLAG_NAME = re.compile(r"(?i)(done|ready|stop|running|finished|flag|event|started|complete|alive|busy)")


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - an odd node: said without its source
        return "?"


def _polarity(call: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> str:
    """ "gone" when the loop goes on while the call is true (``while os.path.exists(p)``, ``if not
    exists(p): break``), "there" when it goes on while it is false; "" when not told."""
    negated = False
    node = call
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
            negated = not negated
        elif isinstance(parent, ast.Compare) and len(parent.ops) == 1:
            other = parent.comparators[0] if parent.left is node else parent.left
            if not isinstance(other, ast.Constant) or not isinstance(
                parent.ops[0], (ast.Eq, ast.Is, ast.NotEq, ast.IsNot)
            ):
                return ""
            # exists(p) == False / is False: negated; os.kill(pid, 0) is None: not negated
            eq = isinstance(parent.ops[0], (ast.Eq, ast.Is))
            falsy = other.value is False or (other.value == 0 and not isinstance(other.value, bool))
            negated = negated != (eq == falsy) if other.value is not None else negated != (not eq)
        elif isinstance(parent, ast.While) and node is parent.test:
            return "gone" if not negated else "there"
        elif isinstance(parent, ast.If) and node is parent.test:
            leaves = any(isinstance(s, (ast.Break, ast.Return)) for s in parent.body)
            if leaves:
                return "there" if not negated else "gone"
            return ""
        elif not isinstance(parent, (ast.BoolOp, ast.Expr)):
            return ""
        node = parent
    return ""


def read_loop(loop: Loop) -> list[Target]:
    """The objects the loop looks at, most telling first (`Target`); [] when none is seen."""
    tree = _parse(loop.source)
    if tree is None:
        return []
    local = loop.frame.locals
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    top = tree.body[0] if isinstance(tree, ast.Module) and tree.body else tree
    tests = _deciding_tests(top)
    found: list[Target] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.While) and not isinstance(node.test, ast.Call):
            test = node.test.operand if isinstance(node.test, ast.UnaryOp) else node.test
            if isinstance(test, (ast.Name, ast.Attribute)):
                value = evaluate(test, local)
                if isinstance(value, bool) or (value is None and _FLAG_NAME.search(_dotted(test).rsplit(".", 1)[-1])):
                    waits = "there" if isinstance(node.test, ast.UnaryOp) else "gone"
                    found.append(Target("flag", _text(test), "", value, waits))
        if not isinstance(node, ast.Call):
            continue
        if not _deciding(node, parents, tests):
            continue  # a call whose outcome does not end the loop: work done in it, not a look
        target = _call_target(node, local, parents)
        if target is not None:
            found.append(target._replace(source=_text(node)[:120]) if target.call else target)
    if not found:
        found = _named_values(tests, local)
    order = {"pid": 0, "port": 1, "url": 2, "path": 3, "flag": 4}
    found.sort(key=lambda t: (t.value is None, order.get(t.kind, 9)))
    return found


def _leaves(node: ast.AST) -> bool:
    """A ``break`` or ``return`` in ``node``: its branch ends the loop."""
    return any(isinstance(n, (ast.Break, ast.Return)) for n in ast.walk(node))


def _deciding_tests(loop: ast.AST) -> list[ast.AST]:
    """The tests that end the loop: a ``while``'s own, and those of the ``if``s that ``break`` or
    ``return``."""
    tests: list[ast.AST] = [loop.test] if isinstance(loop, ast.While) else []
    for node in ast.walk(loop):
        if isinstance(node, ast.If) and (any(_leaves(s) for s in node.body) or any(_leaves(s) for s in node.orelse)):
            tests.append(node.test)
    return tests


def _deciding(call: ast.AST, parents: Mapping[ast.AST, ast.AST], tests: list[ast.AST]) -> bool:
    """Whether the call's outcome decides whether the loop ends: it is in a test that ends it (or
    assigns a name such a test reads), or in a ``try``/``with`` that ends it unless the call raises
    (``try: create_connection(...); return``, ``try: os.kill(pid, 0) except ProcessLookupError: break``)."""
    ids = {id(t) for t in tests}
    read = {n.id for t in tests for n in ast.walk(t) if isinstance(n, ast.Name)}
    node = call
    while node in parents:
        parent = parents[node]
        if id(node) in ids:
            return True
        if isinstance(parent, ast.Try) and any(node is b for b in parent.body) and _leaves(parent):
            return True
        if isinstance(parent, ast.withitem) and _leaves(parents.get(parent, parent)):
            return True
        if isinstance(parent, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id in read for t in parent.targets for n in ast.walk(t)
        ):
            return True
        node = parent
    return False


def _call_target(node: ast.Call, local: Locals, parents: Mapping[ast.AST, ast.AST]) -> Optional[Target]:
    name = _dotted(node.func)
    last = name.rsplit(".", 1)[-1] if name else getattr(node.func, "attr", "")
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    call = name or _text(node.func)
    if last in _PID_CALLS and node.args and ("os." in name or "psutil" in name or name == last):
        if last == "kill" and not (len(node.args) == 2 and evaluate(node.args[1], local) == 0):
            return None  # a kill that sends a signal is not a look
        value = evaluate(node.args[0], local)
        return Target("pid", _text(node.args[0]), call, value, _polarity(node, parents) or "gone")
    if last in _CONNECT_CALLS and node.args:
        address = node.args[0]
        if isinstance(address, ast.Tuple) and len(address.elts) == 2:
            host, port = (evaluate(e, local) for e in address.elts)
            expr = "%s, %s" % (_text(address.elts[0]), _text(address.elts[1]))
            known: Value = port if isinstance(port, int) and not isinstance(port, bool) else None
            return Target("port", expr, call, known, "there", str(host) if isinstance(host, str) else "")
        value = evaluate(address, local)
        return Target("port", _text(address), call, None, "there", str(value) if isinstance(value, str) else "")
    if (
        last in _URL_CALLS
        and node.args
        and ("urlopen" in name or name.split(".", 1)[0] in ("requests", "httpx", "session", "urllib", "self"))
    ):
        value = evaluate(node.args[-1] if last == "request" else node.args[0], local)
        if isinstance(value, str) and not value.startswith(("http://", "https://")):
            return None
        return Target("url", _text(node.args[0]), call, value, "there", _url_host(value) if value else "")
    if last in _FLAG_METHODS and receiver is not None:
        waits = _polarity(node, parents)
        return Target("flag", _text(receiver), call, None, "there" if waits in ("there", "") else "gone")
    path_node: Optional[ast.AST] = None
    if last in _PATH_CALLS and node.args and (name.startswith(("os.", "glob.", "path.")) or name == last):
        path_node = node.args[0]
    elif last in _PATH_METHODS and receiver is not None and not name.startswith("os."):
        path_node = receiver
        if isinstance(receiver, ast.Call) and _dotted(receiver.func).rsplit(".", 1)[-1] in ("Path", "PurePath"):
            path_node = receiver.args[0] if receiver.args else receiver
    if path_node is None:
        return None
    value = evaluate(path_node, local)
    if value is not None and not isinstance(value, str):
        return None
    expr = _text(path_node)
    if isinstance(value, str) and (m := re.match(r"^/proc/(\d+)(?:/|$)", value)):
        return Target("pid", expr, call, int(m.group(1)), _polarity(node, parents) or "gone")
    if value is None and re.search(r"['\"]/proc/['\"]?", expr):
        return Target("pid", expr, call, None, _polarity(node, parents) or "gone")
    waits = _polarity(node, parents) if last in ("exists", "isfile", "isdir", "lexists", "is_file", "is_dir") else ""
    if not waits and last in ("open", "stat", "lstat", "getsize", "read_text", "read_bytes"):
        waits = "there" if _in_try(node, parents) else ""
    return Target("path", expr, call, value, waits)


def _in_try(node: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            return True
    return False


def _named_values(tests: list[ast.AST], local: Locals) -> list[Target]:
    """The fallback: names the loop's ending tests use whose values look like what is polled (an
    absolute path, a URL; an int named ``pid`` or ``port``): ``while not ready(path)``."""
    found: list[Target] = []
    seen: set[str] = set()
    for node in (n for t in tests for n in ast.walk(t)):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        name = _dotted(node)
        if not name or name in seen or name not in local:
            continue
        seen.add(name)
        value, short = local[name], name.rsplit(".", 1)[-1].lower()
        if isinstance(value, str) and value.startswith(("http://", "https://")):
            found.append(Target("url", name, "", value, "", _url_host(value)))
        elif isinstance(value, str) and value.startswith("/") and "\n" not in value and len(value) > 1:
            found.append(Target("path", name, "", value, ""))
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            if short == "pid" or short.endswith("_pid"):
                found.append(Target("pid", name, "", value, ""))
            elif short == "port" or short.endswith("_port"):
                found.append(Target("port", name, "", value, "there"))
    return found


def _url_host(url: Value) -> str:
    """``host:port`` of a URL (the scheme's port when none is written)."""
    if not isinstance(url, str):
        return ""
    m = re.match(r"^(https?)://(?:[^@/]*@)?(\[[^\]]*\]|[^:/?#]*)(?::(\d+))?", url)
    if not m:
        return ""
    return "%s:%s" % (m.group(2), m.group(3) or ("443" if m.group(1) == "https" else "80"))


def sleep_seconds(loop: Loop) -> Optional[float]:
    """The seconds the loop's ``sleep(...)`` (or timed ``.wait(...)``) waits, when its argument is known."""
    tree = _parse(loop.source)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in ("sleep", "wait") and node.args:
            value = evaluate(node.args[0], loop.frame.locals)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                return float(value)
    return None


# --- the sentence --------------------------------------------------------------------------------


def _get(evidence: Mapping[str, Any], key: str) -> Any:
    return evidence.get(KEY + key)


def _list(evidence: Mapping[str, Any], key: str) -> list[str]:
    """A list fact, as gathered or as a stall record keeps it (joined with ", ")."""
    value = evidence.get(KEY + key)
    if isinstance(value, str):
        return [value] if value else []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _clock(epoch_s: Any) -> str:
    """``2026-12-07T11:58:40.000Z`` (UTC, as every lora-otel line), "" when not known."""
    if not isinstance(epoch_s, (int, float)) or isinstance(epoch_s, bool):
        return ""
    from lora_otel.journal.tree import iso_time

    return iso_time(int(epoch_s * 1e9))


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return ""
    if n == 0:
        return "empty"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d bytes" % n


def _where(evidence: Mapping[str, Any]) -> str:
    call, expr, source = _get(evidence, "call"), _get(evidence, "expr"), _get(evidence, "source")
    parts = []
    if source:
        parts.append(str(source))
    elif call:
        parts.append("%s(%s)" % (call, expr) if expr else str(call))
    elif expr:
        parts.append(str(expr))
    if _get(evidence, "where"):
        parts.append("at %s" % _get(evidence, "where"))
    every = _get(evidence, "every_s")
    if isinstance(every, (int, float)):
        parts.append("every %g s" % every)
    return " ".join(parts[:2]) + (", " + parts[2] if len(parts) > 2 else "")


def _who(evidence: Mapping[str, Any]) -> str:
    thread = _get(evidence, "thread")
    return "The %s" % thread if isinstance(thread, str) and thread else "The main thread"


def _frame_pid(evidence: Mapping[str, Any]) -> tuple[str, str]:
    """("; pid 4711 (server_pid in the loop's frame) has ended", its advice) for a process the loop's
    frame names beside what it polls; ("", "") when none."""
    pid, name, state = _get(evidence, "frame_pid"), _get(evidence, "frame_pid_name"), _get(evidence, "frame_pid_state")
    if not isinstance(pid, int) or not state:
        return "", ""
    cmd = _get(evidence, "frame_pid_cmd")
    who = "pid %d (%s in the loop's frame%s)" % (pid, name, ", %s" % cmd if cmd else "")
    if state in ("gone", "zombie"):
        return (
            "; %s has ended%s" % (who, " (its exit status not yet collected)" if state == "zombie" else ""),
            "Find out why pid %d (%s) ended — its output or log — and start it again: the loop waits for "
            "what it was to make." % (pid, name),
        )
    return "; %s is alive (%s)" % (who, state), ""


def lock_like(path: str) -> bool:
    """A file whose name says it is a lock, a baton or a pid file."""
    name = os.path.basename(path.rstrip("/")).lower()
    return bool(re.search(r"(^|[._-])(lock|lck|baton|pid|busy|running|inprogress|in_progress)($|[._-])", name)) or (
        name in ("lock", ".lock")
    )


def sentence(evidence: Mapping[str, Any], now_ns: Optional[int] = None) -> Optional[tuple[str, str]]:
    """(sentence, advice) for the poll loop in ``evidence``; None when it has none. The advice is
    "" when the evidence supports no step."""
    kind = _get(evidence, "kind")
    if not isinstance(kind, str) or not kind:
        return None
    who, where = _who(evidence), _where(evidence)
    value = _get(evidence, "value")
    waits = _get(evidence, "waits_for") or ""
    if kind == "path":
        return _path_sentence(evidence, who, where, value, waits, now_ns)
    if kind == "pid":
        return _pid_sentence(evidence, who, where, value, waits)
    if kind in ("port", "url"):
        return _port_sentence(evidence, who, where, value, kind)
    if kind == "flag":
        state = "" if value is None else " (it is %s now)" % value
        return (
            "%s polls %s in a sleep loop (%s)%s: it waits for another thread or process to change it."
            % (who, _get(evidence, "expr"), where, state),
            "",
        )
    return None


def _path_sentence(
    evidence: Mapping[str, Any], who: str, where: str, path: Any, waits: str, now_ns: Optional[int]
) -> tuple[str, str]:
    if not isinstance(path, str) or not path:
        why = _get(evidence, "value_error") or "its value is not in the locals the dump could read"
        return (
            "%s polls a path in a sleep loop (%s); which path is not known: %s." % (who, where, why),
            "",
        )
    goal = {"gone": " to disappear", "there": " to appear"}.get(waits, "")
    head = "%s polls for %s%s (%s)" % (who, path, goal, where)
    exists = _get(evidence, "exists")
    unchecked = _get(evidence, "unchecked")
    if exists is None and unchecked:
        return "%s; its state is not known: %s." % (head, unchecked), ""
    if exists is None:
        error = _get(evidence, "error") or "its state could not be read"
        return "%s; %s." % (head, error), ""
    if not exists:
        folder = _get(evidence, "folder_exists")
        parent = os.path.dirname(path.rstrip("/")) or "/"
        if folder is False:
            return (
                "%s; it does not exist, nor does its folder %s." % (head, parent),
                "Check the path %s: its folder %s does not exist (a typo, another machine's path, "
                "or a mount that is not there)." % (shlex.quote(path), shlex.quote(parent))
                if waits == "there"
                else "",
            )
        also, step = _frame_pid(evidence)
        return "%s; it does not exist (its folder %s does)%s." % (head, parent, also), step if waits == "there" else ""
    facts = []
    since = _clock(_get(evidence, "mtime"))
    if since:
        facts.append("last changed at %s" % since)
    size = _size(_get(evidence, "size"))
    if size and _get(evidence, "type") in (None, "file"):
        facts.append(size)
    owner = _get(evidence, "owner")
    if owner:
        facts.append("owner %s" % owner)
    kind = _get(evidence, "type")
    what = "a folder" if kind == "dir" else "a FIFO" if kind == "fifo" else "the file"
    state = "%s exists%s" % (what, " (%s)" % ", ".join(facts) if facts else "")
    if kind not in (None, "file"):  # (who has a folder or a FIFO open is not looked at)
        return "%s; %s." % (head, state), ""
    openers = _list(evidence, "open_by")
    recorded, alive = _get(evidence, "recorded_pid"), _get(evidence, "recorded_alive")
    if openers:
        who_opens = ", ".join(str(o) for o in openers)
        first = re.match(r"pid (\d+)", openers[0])
        return (
            "%s; %s and is held open by %s." % (head, state, who_opens),
            "See what pid %s, which has it open, is doing (py-spy dump --pid %s): the loop goes on only when "
            "%s is removed." % (first.group(1), first.group(1), shlex.quote(path))
            if waits == "gone" and first
            else "",
        )
    if alive:
        return (
            "%s; %s; the pid written in it, %s, is alive: %s."
            % (head, state, recorded, _get(evidence, "recorded_cmd") or "a live process"),
            "",
        )
    incomplete = _get(evidence, "open_by_error")
    if incomplete:
        # Not every process could be looked at: one that was not can have it open. No removal.
        return (
            "%s; %s and no process this user can see has it open (%s)." % (head, state, incomplete),
            "See who has %s open (as root: fuser -v %s); if nobody does, it is a leftover and removing it lets "
            "the job go on." % (shlex.quote(path), shlex.quote(path))
            if waits == "gone" and (lock_like(path) or recorded is not None)
            else "",
        )
    nobody = "no process has it open"
    if recorded is not None:
        nobody = "the pid written in it, %s, is gone, and no process has it open" % recorded
    shared = _get(evidence, "shared_fs")
    if shared:
        mount = str(shared).split(" at ", 1)[-1]
        return (
            "%s; %s and %s on this machine, but it is on a file system other machines may share (%s), "
            "where a process there can be using it." % (head, state, nobody, shared),
            "If no job on another machine that mounts %s is using %s (building, downloading), remove it and "
            "the job goes on." % (shlex.quote(mount), shlex.quote(path))
            if waits == "gone" and (lock_like(path) or recorded is not None)
            else "",
        )
    owner_uid, job_uid = _get(evidence, "owner_uid"), _get(evidence, "job_uid")
    if waits == "gone" and (lock_like(path) or recorded is not None) and owner_uid is not None and owner_uid != job_uid:
        return (
            "%s; %s and %s, but it belongs to another user than the job's: that user's run may be using it."
            % (head, state, nobody),
            "Ask its owner %s whether a run of theirs uses %s; the job goes on when it is removed."
            % (_get(evidence, "owner") or owner_uid, shlex.quote(path)),
        )
    if waits == "gone" and (lock_like(path) or recorded is not None) and owner_uid is None:
        return "%s; %s and %s." % (head, state, nobody), ""  # whose it is is not known: no removal
    if waits == "gone" and (lock_like(path) or recorded is not None):
        return (
            "%s; %s and %s: a leftover from a run that ended without removing it." % (head, state, nobody),
            "Remove %s (no process has it open, so no run is using it) and the job goes on." % shlex.quote(path),
        )
    if waits == "gone":
        return (
            "%s; %s and %s: the loop goes on only when something removes it." % (head, state, nobody),
            "",
        )
    return "%s; %s and %s." % (head, state, nobody), ""


def _pid_sentence(evidence: Mapping[str, Any], who: str, where: str, pid: Any, waits: str) -> tuple[str, str]:
    if not isinstance(pid, int):
        return "%s polls a process in a sleep loop (%s); which pid is not known." % (who, where), ""
    head = "%s polls pid %d%s (%s)" % (who, pid, " to exit" if waits == "gone" else "", where)
    state = _get(evidence, "pid_state") or ""
    cmd = _get(evidence, "pid_cmd") or ""
    if state == "gone":
        return "%s; pid %d is gone (no such process)." % (head, pid), ""
    if state == "zombie":
        parent = _get(evidence, "pid_parent")
        by = (
            "this process (its parent)"
            if _get(evidence, "pid_parent_is_poller")
            else "its parent, pid %s," % parent
            if parent
            else "its parent"
        )
        return (
            "%s; pid %d%s has ended, but %s has not collected its exit status (reaped it), so it stays a "
            "zombie, which os.kill(pid, 0) and /proc/<pid> still find." % (head, pid, " (%s)" % cmd if cmd else "", by),
            "Reap the child (Popen.poll()/wait() or os.waitpid(%d, os.WNOHANG) in its parent) and test for "
            "its exit that way: os.kill(pid, 0) succeeds on a zombie." % pid,
        )
    if state:
        told = "pid %d is alive%s (%s)" % (pid, ": %s" % cmd if cmd else "", state)
        return (
            "%s; %s." % (head, told),
            "The job goes on when pid %d%s exits: see what it is doing (py-spy dump --pid %d, or "
            "lora-otel inspect if it is traced)." % (pid, " (%s)" % cmd if cmd else "", pid)
            if waits == "gone"
            else "",
        )
    return "%s; its state could not be read." % head, ""


def _port_sentence(evidence: Mapping[str, Any], who: str, where: str, value: Any, kind: str) -> tuple[str, str]:
    address = _get(evidence, "address") or ""
    if kind == "url" and isinstance(value, str):
        head = "%s polls %s in a sleep loop (%s)" % (who, value, where)
    elif address:
        head = "%s polls %s for a connection (%s)" % (who, address, where)
    else:
        return "%s polls a network address in a sleep loop (%s); which one is not known." % (who, where), ""
    listening = _get(evidence, "listening")
    port = _get(evidence, "port")
    if listening is None:
        remote = _get(evidence, "remote")
        if remote:
            return "%s; %s is another machine's address: it is not looked at from here." % (head, address), ""
        return "%s." % head, ""
    if listening:
        by = _get(evidence, "listener") or ""
        return (
            "%s; something listens on port %s%s: the loop waits for an answer it accepts."
            % (head, port, " (%s)" % by if by else ""),
            "",
        )
    should = _get(evidence, "should_listen") or ""
    told = "%s; nothing listens on port %s on this machine" % (head, port)
    also, step = _frame_pid(evidence)
    ended = _list(evidence, "ended_children")
    if also:
        return "%s%s." % (told, also), step
    if ended and not should:
        return (
            "%s; its child %s has ended (its exit status not yet collected)."
            % (told, ", ".join(str(e) for e in ended)),
            "Find out why its child %s ended (its output or log): nothing else here listens on port %s."
            % (ended[0], port),
        )
    if should:
        return (
            "%s; %s was started with that port and does not listen on it." % (told, should),
            "See why %s does not listen on port %s (its output, or lora-otel inspect if it is traced)."
            % (should, port),
        )
    return (
        "%s." % told,
        "Start the server the job expects on port %s (nothing listens there), or point the job at the "
        "address where it runs." % port,
    )
