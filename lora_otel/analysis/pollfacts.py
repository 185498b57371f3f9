"""Gathering for a poll loop: the sleeping frame's locals, and the state of what the loop polls.

`facts` is called by `lora_otel.analysis.evidence.python_stacks` with the stacks already read. When
the main thread sleeps in a loop (`lora_otel.analysis.polling.find_loop` over the source files on
disk), it reads the frames' locals — ``py-spy dump -ll --nonblocking`` (nothing paused), and the
``local`` lines the beat thread's dump adds after a frame (simple values and ``self``'s simple
attributes, which py-spy cannot show) — names the object polled (`polling.read_loop`) and looks at it
from outside:

- a path: exists or not, type, size, last change, owner; which live processes have it open
  (``/proc/*/fd`` links and ``fdinfo``, at most `filelocks.SCAN_S`, and whether that look missed
  some); the pid written in it (a soft lock's) and whether that process lives; for a path that is
  not there, whether its folder is. Only as the job's user, in its mount namespace, and never on a
  FUSE or network mount (`filelocks.checkable`: ``unchecked`` says why not);
- a pid: alive (state, command line), a zombie (and its parent), or gone;
- a port (or a URL's host and port): on this machine, whether a socket listens on it in the
  process's network namespace (``/proc/<pid>/net/tcp{,6}``) and whose it is; a child of the process
  started with that port on its command line that does not listen;
- a flag: only its value.

Everything lands in ``lora_otel.evidence.poll.*`` (`polling.KEY`). Best effort: nothing raises,
nothing is signalled.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

from lora_otel.analysis import filelocks, polling
from lora_otel.analysis.polling import KEY, PollFrame

_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
_LOCAL = re.compile(r"^\s{4}local ([\w.]+) = (.*)$")
_SPY_THREAD = re.compile(r"^Thread (?:0x)?[0-9a-fA-F]+ ")
_SPY_FRAME = re.compile(r"^ {4}(\S.*?) \((.*):(\d+)\)\s*$")
_SPY_LOCAL = re.compile(r"^ {12}([\w.]+): (.*)$")
VALUE_MAX = 500
"""Characters of a local's value kept."""


def _literal(text: str) -> polling.Value:
    """A local's value as py-spy or the beat wrote it (``"x"``/``'x'``, ``12``, ``0.5``, ``True``);
    None for anything else (an object's ``<X at 0x…>``)."""
    text = text.strip()
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return text[1:-1][:VALUE_MAX]  # py-spy's string: quoted as is
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)):
        return value[:VALUE_MAX] if isinstance(value, str) else value
    return None


def main_frames(stacks: str) -> list[PollFrame]:
    """The main thread's Python frames of a faulthandler-format dump, innermost first, with the
    ``local`` lines the beat wrote after a frame (none in faulthandler's own dump)."""
    threads: list[tuple[str, list[PollFrame]]] = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append((line, []))
        elif threads and (m := _FRAME.match(line)):
            threads[-1][1].append(PollFrame(m.group(1), int(m.group(2)), m.group(3).strip(), {}))
        elif threads and threads[-1][1] and (m := _LOCAL.match(line)):
            frame = threads[-1][1][-1]
            value = _literal(m.group(2))
            if value is not None:
                threads[-1][1][-1] = frame._replace(locals={**frame.locals, m.group(1): value})
    main = next((frames for _, frames in threads if frames and frames[-1].func == "<module>"), None)
    if main is None:
        main = next((frames for head, frames in threads if head.startswith("Current thread")), None)
    return main or []


def spy_locals(pid: int, spy: Optional[str]) -> tuple[list[list[tuple[str, int, str, dict[str, Any]]]], str]:
    """Each thread's frames (file, line, function, simple locals), innermost first, as ``py-spy dump
    -ll --nonblocking`` reads them; ([], why) when it cannot."""
    if not spy:
        return [], "py-spy is not installed or is off"
    try:
        r = subprocess.run(
            [spy, "dump", "-ll", "--nonblocking", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], "py-spy: %s" % e
    if r.returncode != 0:
        return [], "py-spy: %s" % ((r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
    threads: list[list[tuple[str, int, str, dict[str, Any]]]] = []
    for line in r.stdout.splitlines():
        if _SPY_THREAD.match(line):
            threads.append([])
        elif threads and (m := _SPY_FRAME.match(line)):
            threads[-1].append((m.group(2), int(m.group(3)), m.group(1).rsplit(".", 1)[-1], {}))
        elif threads and threads[-1] and (m := _SPY_LOCAL.match(line)):
            value = _literal(m.group(2))
            if value is not None:
                threads[-1][-1][3][m.group(1)] = value
    return threads, ""


def _with_locals(frames: list[PollFrame], threads: list[list[tuple[str, int, str, dict[str, Any]]]]) -> list[PollFrame]:
    """``frames`` with py-spy's locals of the same frames added (matched on file, line, function)."""
    for spied in threads:
        keys = [(f, line, func) for f, line, func, _ in spied]
        mine = [(fr.file, fr.line, fr.func) for fr in frames]
        if not mine or mine[0] not in keys:
            continue
        at = keys.index(mine[0])
        out = []
        for i, fr in enumerate(frames):
            j = at + i
            extra = spied[j][3] if j < len(spied) and keys[j] == (fr.file, fr.line, fr.func) else {}
            out.append(fr._replace(locals={**extra, **fr.locals}))
        return out
    return frames


def _getline(file: str, line: int) -> str:
    try:
        if not os.path.isfile(file):  # (a stacks file may name anything: never open a FIFO)
            return ""
    except (OSError, ValueError):
        return ""
    return linecache.getline(file, line)


def facts(pid: int, stacks: str, use_py_spy: bool = True, ask: Optional[Callable[[], str]] = None) -> dict[str, Any]:
    """The poll loop the main thread of ``pid`` sleeps in, and the state of what it polls, as
    ``poll.*`` attributes; {} when it sleeps in no loop (or is in no sleep).

    The locals: those in ``stacks`` (the beat's dump has them), py-spy's (``use_py_spy``), and when
    the object is still not named, a new dump of the beat's (``ask``: `evidence.ask_beat`), whose
    locals include ``self``'s simple attributes."""
    frames = main_frames(stacks)
    if not frames or polling.find_loop(frames, _getline) is None:
        return {}
    why = ""
    if use_py_spy:
        threads, why = spy_locals(pid, filelocks.py_spy_path())
        frames = _with_locals(frames, threads)
    elif not any(fr.locals for fr in frames):
        why = "not read (inspect does not attach to the process)"
    target, loop = _target(frames)
    if (target is None or target.value is None) and ask is not None:
        fresh = main_frames(ask())
        if fresh and polling.find_loop(fresh, _getline) is not None:
            if use_py_spy:
                fresh = _with_locals(fresh, threads)
            again, again_loop = _target(fresh)
            if again is not None and (target is None or again.value is not None):
                target, loop, why = again, again_loop, ""
    if target is None or loop is None:
        return {}
    paces = (polling.pauses(_getline(fr.file, fr.line)) for fr in frames[: polling.CALLERS_MAX])
    out: dict[str, Any] = {
        KEY + "paced_by": next((p for p in paces if p), ""),  # sleep, or a timed wait
        KEY + "kind": target.kind,
        KEY + "expr": target.expr[:200],
        KEY + "where": "%s:%d in %s" % (os.path.basename(loop.frame.file), loop.frame.line, loop.frame.func),
    }
    if target.call:
        out[KEY + "call"] = target.call
    if target.source:
        out[KEY + "source"] = target.source
    if target.waits_for:
        out[KEY + "waits_for"] = target.waits_for
    every = polling.sleep_seconds(loop)
    if every is not None:
        out[KEY + "every_s"] = every
    value = target.value
    if value is None:
        if target.expr.startswith("self.") and not any(k.startswith("self.") for k in loop.frame.locals):
            out[KEY + "value_error"] = (
                "%s is an attribute, which py-spy does not read, and the process's beat did not give it" % target.expr
            )
        elif not loop.frame.locals:
            out[KEY + "value_error"] = "the frame's locals could not be read (%s)" % (why or "no dump gave them")
        else:
            out[KEY + "value_error"] = "%s is not a simple value in the frame's locals" % target.expr
        return out
    from lora_otel._boot.seam import redact_text

    out[KEY + "value"] = redact_text(value) if isinstance(value, str) else value
    try:
        if target.kind == "path" and isinstance(value, str):
            out.update(path_state(pid, value))
        elif target.kind == "pid" and isinstance(value, int):
            out.update(pid_state(value))
            if out.get(KEY + "pid_parent") == pid:
                out[KEY + "pid_parent_is_poller"] = True
        elif target.kind == "port" and isinstance(value, int):
            out.update(port_state(pid, target.host, value))
        elif target.kind == "url" and target.host:
            host, _, port = target.host.rpartition(":")
            out.update(port_state(pid, host, int(port)))
        if target.kind != "pid":
            out.update(frame_pid(loop, value))
    except Exception as e:  # noqa: BLE001 - evidence is best effort; what is known stands
        out[KEY + "error"] = "%s: %s" % (type(e).__name__, e)
    return out


_PID_NAME = re.compile(r"(^|[._])(pid|\w+_pid)$")


def frame_pid(loop: polling.Loop, polled: polling.Value) -> dict[str, Any]:
    """A process the loop's frame names (a local ``pid``, ``server_pid``, ``proc.pid``) beside the
    object it polls — the one expected to make the file or open the port: ``frame_pid``,
    ``frame_pid_name`` and its state (``frame_pid_state``, ``frame_pid_cmd``)."""
    for name, value in loop.frame.locals.items():
        if _PID_NAME.search(name) and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            if value == polled:
                continue
            state = pid_state(value)
            return {
                KEY + "frame_pid": value,
                KEY + "frame_pid_name": name,
                KEY + "frame_pid_state": state[KEY + "pid_state"],
                **({KEY + "frame_pid_cmd": state[KEY + "pid_cmd"]} if KEY + "pid_cmd" in state else {}),
            }
    return {}


def _target(frames: list[PollFrame]) -> tuple[Optional[polling.Target], Optional[polling.Loop]]:
    """What the first loop around the sleep that polls something polls, and that loop."""
    loops = polling.find_loops(frames, _getline)
    for loop in loops:
        targets = polling.read_loop(loop)
        if targets:
            return targets[0], loop
    return None, (loops[0] if loops else None)


# --- the state of what is polled -----------------------------------------------------------------


def path_state(pid: int, path: str, deadline: Optional[float] = None) -> dict[str, Any]:
    """A path's state: ``exists``, ``type``, ``size``, ``mtime``, ``owner`` (``owner_uid`` beside
    ``job_uid``), ``open_by`` (``open_by_error``: why that look may have missed a process), the pid
    written in it (``recorded_pid``, ``recorded_alive``, ``recorded_cmd``); ``folder_exists`` when it
    is not there. A relative path is the process's working directory's. Only what
    `filelocks.checkable` allows is looked at (``unchecked``: why not): as the job's user, in its
    mount namespace, nothing on a FUSE or network mount; the look for openers ends at ``deadline``."""
    end = deadline if deadline is not None else time.monotonic() + filelocks.SCAN_S
    resolved, why = filelocks.checkable(pid, path)
    if not resolved:
        return {KEY + "unchecked": why}
    path = resolved
    out: dict[str, Any] = {}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        out[KEY + "exists"] = False
        out[KEY + "folder_exists"] = os.path.isdir(os.path.dirname(path.rstrip("/")) or "/")
        return out
    except OSError as e:
        out[KEY + "error"] = "cannot look at it: %s" % (e.strerror or e)
        return out
    import stat as st_mode

    out[KEY + "exists"] = True
    out[KEY + "type"] = (
        "file"
        if st_mode.S_ISREG(st.st_mode)
        else "dir"
        if st_mode.S_ISDIR(st.st_mode)
        else "fifo"
        if st_mode.S_ISFIFO(st.st_mode)
        else "other"
    )
    out[KEY + "size"] = st.st_size
    out[KEY + "mtime"] = round(st.st_mtime, 3)
    try:
        import pwd

        out[KEY + "owner"] = pwd.getpwuid(st.st_uid).pw_name
    except (KeyError, ImportError):
        out[KEY + "owner"] = str(st.st_uid)
    out[KEY + "owner_uid"] = st.st_uid
    job_uid = filelocks.process_uid(pid)
    if job_uid is not None:
        out[KEY + "job_uid"] = job_uid
    shared = shared_fs(pid, path)
    if shared:
        out[KEY + "shared_fs"] = shared
    if out[KEY + "type"] != "file":
        return out
    openers = filelocks._openers(((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino), pid, path, end)
    if openers.pids:
        out[KEY + "open_by"] = [filelocks._who(p) for p in openers.pids[:4]]
    if openers.incomplete:
        out[KEY + "open_by_error"] = openers.incomplete
    recorded, host = filelocks._recorded_owner(path)
    if recorded is not None and (not host or host == filelocks.this_host()):
        out[KEY + "recorded_pid"] = recorded
        alive = recorded != pid and filelocks._alive(recorded)
        out[KEY + "recorded_alive"] = alive
        if alive:
            out[KEY + "recorded_cmd"] = filelocks.command_line(recorded) or ""
    return out


SHARED_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "afs")
"""File systems other machines may have mounted too (and ``fuse.*``: s3fs, gcsfuse, sshfs …)."""


def shared_fs(pid: int, path: str) -> str:
    """``nfs4 at /mnt/shared``: the file system ``path`` is on, in ``pid``'s mount namespace, when
    other machines may share it (a process there can hold a file no ``/proc`` here shows); ""
    otherwise."""
    try:
        with open("/proc/%d/mountinfo" % pid, encoding="utf-8", errors="replace") as f:
            rows = f.read(1 << 20).splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    for row in rows:
        left, _, right = row.partition(" - ")
        cols, rest = left.split(), right.split()
        if len(cols) < 5 or not rest:
            continue
        point = cols[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, rest[0]
    if kind in SHARED_FS or kind.startswith("fuse."):
        return "%s at %s" % (kind, best)
    return ""


def pid_state(pid: int) -> dict[str, Any]:
    """``pid_state``: ``gone``, ``zombie`` (with ``pid_parent``), or the state word (``sleeping``);
    ``pid_cmd``: its command line."""
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8", errors="replace") as f:
            fields = f.read(4096).rpartition(")")[2].split()
    except OSError:
        return {KEY + "pid_state": "gone"}
    words = {"R": "running", "S": "sleeping", "D": "in disk I/O", "T": "stopped", "t": "stopped by a debugger"}
    state = fields[0] if fields else "?"
    out: dict[str, Any] = {KEY + "pid_state": "zombie" if state == "Z" else words.get(state, state)}
    if state == "Z" and len(fields) > 1:
        out[KEY + "pid_parent"] = int(fields[1])
    cmd = filelocks.command_line(pid)
    if cmd:
        out[KEY + "pid_cmd"] = cmd
    return out


_LOCAL_HOSTS = ("", "localhost", "0.0.0.0", "::", "::1", "ip6-localhost")


def _is_local(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in _LOCAL_HOSTS or host.startswith("127."):
        return True
    names = {os.uname().nodename.lower(), os.uname().nodename.split(".")[0].lower()}
    return host in names


def listeners(pid: int, port: int) -> list[int]:
    """The socket inodes listening on TCP ``port`` in ``pid``'s network namespace."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name), encoding="ascii", errors="replace") as f:
                rows = f.read(1 << 22).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.append(int(cols[9]))
    return found


def _socket_owner(inodes: list[int], limit: int = 4096) -> Optional[int]:
    wanted = {"socket:[%d]" % i for i in inodes}
    try:
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:limit]
    except OSError:
        return None
    for p in pids:
        try:
            fds = os.listdir("/proc/%d/fd" % p)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (p, fd)) in wanted:
                    return p
            except OSError:
                continue
    return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid), encoding="ascii") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def port_state(pid: int, host: str, port: int) -> dict[str, Any]:
    """``address``; on this machine, ``listening`` and ``listener`` (pid and command), or the child
    started with that port (``should_listen``); ``remote`` for another machine's address."""
    shown = "%s:%d" % (host or "localhost", port)
    out: dict[str, Any] = {KEY + "address": shown, KEY + "port": port}
    if not _is_local(host):
        out[KEY + "remote"] = True
        return out
    inodes = listeners(pid, port)
    out[KEY + "listening"] = bool(inodes)
    if inodes:
        owner = _socket_owner(inodes)
        if owner is not None:
            out[KEY + "listener"] = filelocks._who(owner)
        return out
    ended = []
    for child in _children(pid)[:64]:
        if pid_state(child).get(KEY + "pid_state") == "zombie":
            ended.append(filelocks._who(child))
            continue
        cmd = filelocks.command_line(child) or ""
        if KEY + "should_listen" not in out and re.search(r"(^|[\s=:])%d($|\s)" % port, cmd):
            out[KEY + "should_listen"] = filelocks._who(child)
    if ended:
        out[KEY + "ended_children"] = ended[:3]
    return out


def gathered(evidence: Mapping[str, Any]) -> bool:
    """Whether ``evidence`` has a poll loop's facts."""
    return bool(evidence.get(KEY + "kind"))
