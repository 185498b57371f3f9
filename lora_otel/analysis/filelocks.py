"""File locks a stalled process waits for: which file, who holds it, or that nobody does (stale).

Three ways a program waits on a lock file, and how each is told from outside the process:

- **in the kernel**: ``fcntl.flock``/``fcntl.lockf`` without ``LOCK_NB`` block in the kernel, and
  ``/proc/locks`` lists the waiter (``->``) beside the holder, with both pids and the file's
  device:inode; the waiter has the file open, so its ``/proc/<pid>/fd`` names it;
- **polled**: the ``filelock`` package (Hugging Face's caches are guarded by it) tries a
  non-blocking ``flock`` every few milliseconds and sleeps between tries, with the file closed;
  its soft lock (`SoftFileLock`) and a program's own ``while os.path.exists("x.lock")`` loop only
  look for a file existing. The path is read from the waiting frames' locals (``py-spy dump
  --locals``, when py-spy is installed and may read the process), or from a descriptor the process
  has open on a file another process holds a lock on;
- then, for the path: the holder from ``/proc/locks`` (pid and command line); for a lock file
  nobody holds a kernel lock on, the pid written in it (filelock's soft lock writes its pid first)
  and whether that process is alive, and which live processes have the file open. No holder alive:
  the lock is stale.

`facts` gathers these as ``lora_otel.evidence.file_lock.*`` attributes (`lora_otel.analysis.evidence.gather`
calls it); `sentence` says them (the ``file lock`` rule of `lora_otel.analysis.diagnose`). Nothing
here signals the process or raises.
"""

from __future__ import annotations

import linecache
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

KEY = "lora_otel.evidence.file_lock."
"""The prefix of this module's evidence attributes (``lora_otel.evidence.`` as every evidence key)."""

CMDLINE_MAX = 160
"""Characters of a holder's command line kept (secrets redacted)."""
SCAN_PROCESSES_MAX = 4096
"""Processes looked at for one that has a lock file open."""


class KernelLock(NamedTuple):
    """One line of ``/proc/locks``."""

    number: int
    kind: str  # FLOCK, POSIX, OFDLCK, LEASE, DELEG
    access: str  # READ, WRITE
    pid: int  # -1 when the kernel does not say (an open file description lock)
    device: tuple[int, int]  # major, minor
    inode: int
    waiting: bool  # a blocked request ("->"), not a held lock


def parse_locks(text: str) -> list[KernelLock]:
    """The lines of ``/proc/locks`` (``1: FLOCK  ADVISORY  WRITE 1234 fe:00:104857 0 EOF``, a blocked
    request as ``1: -> FLOCK ...``); lines that do not parse are skipped."""
    out = []
    for line in text.splitlines():
        cols = line.split()
        try:
            number = int(cols[0].rstrip(":"))
            waiting = cols[1] == "->"
            kind, _, access, pid, where = cols[2 if waiting else 1 : 7 if waiting else 6]
            major, minor, inode = where.split(":")
            out.append(
                KernelLock(number, kind, access, int(pid), (int(major, 16), int(minor, 16)), int(inode), waiting)
            )
        except (IndexError, ValueError):
            continue
    return out


def _read(path: str, limit: int = 1 << 20) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(limit)


def _file_id(st: os.stat_result) -> tuple[tuple[int, int], int]:
    return (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino


SCAN_S = 2.0
"""Seconds one look for the processes that have a file open may take (as `waitfacts.fd_index`)."""


class Openers(NamedTuple):
    """The live processes with a file open, and why the look may have missed some ("" when it looked
    at every process): another user's descriptors that cannot be read, the process cap, the deadline."""

    pids: list[int]
    incomplete: str


def _mount_device(pid: int, mnt_id: int, devices: dict[int, tuple[int, int]]) -> Optional[tuple[int, int]]:
    """The device (major, minor) of mount ``mnt_id`` (unique on the machine while it is mounted), from
    ``devices`` (filled from this process's or ``pid``'s ``mountinfo``, for one look only: an id is
    reused after an unmount); None when neither lists it."""
    if mnt_id not in devices:
        for source in ("/proc/self/mountinfo", "/proc/%d/mountinfo" % pid):
            try:
                rows = _read(source, 4 << 20).splitlines()
            except OSError:
                continue
            for row in rows:
                cols = row.split(" ", 3)
                try:
                    major, minor = cols[2].split(":")
                    devices[int(cols[0])] = (int(major), int(minor))
                except (IndexError, ValueError):
                    continue
            if mnt_id in devices:
                break
    return devices.get(mnt_id)


def open_files(pid: int, deadline: Optional[float] = None) -> dict[tuple[tuple[int, int], int], str]:
    """The files ``pid`` has open, by ((major, minor), inode), with their paths (`open_files_of`)."""
    return open_files_of(pid, deadline)[0]


def open_files_of(
    pid: int, deadline: Optional[float] = None, devices: Optional[dict[int, tuple[int, int]]] = None
) -> tuple[dict[tuple[tuple[int, int], int], str], Optional[OSError]]:
    """The files ``pid`` has open, by ((major, minor), inode), with their paths, and the error that
    kept its descriptors from being read (None when they were: a process gone meanwhile reads as
    none). Each descriptor's link and ``fdinfo`` (``mnt_id``, ``ino``) are read, never ``stat``: a
    stat of a file on a FUSE or NFS mount that does not answer waits as long as the mount. A file
    whose device is not known is kept under ((-1, -1), -fd-1), which no real file matches.
    ``devices``: the mount ids' devices known so far in this look."""
    out: dict[tuple[tuple[int, int], int], str] = {}
    devices = {} if devices is None else devices
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except FileNotFoundError:
        return out, None
    except OSError as e:
        return out, e
    for fd in fds:
        if deadline is not None and time.monotonic() > deadline:
            return out, TimeoutError("the time for the look ran out")
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
            if not target.startswith("/"):
                continue  # pipe:[…], socket:[…], anon_inode:…
            info: dict[str, int] = {}
            for line in _read("/proc/%d/fdinfo/%s" % (pid, fd), 4096).splitlines():
                key, _, value = line.partition(":")
                if key in ("mnt_id", "ino") and value.strip().isdigit():
                    info[key] = int(value.strip())
        except OSError:
            continue
        device = _mount_device(pid, info["mnt_id"], devices) if "mnt_id" in info else None
        if device is not None and "ino" in info:
            out.setdefault((device, info["ino"]), target)
        elif fd.isdigit():
            out[(-1, -1), -int(fd) - 1] = target
    return out, None


def process_uid(pid: int) -> Optional[int]:
    """The effective uid ``pid`` runs as (``/proc/<pid>/status``), None when it cannot be read."""
    try:
        for line in _read("/proc/%d/status" % pid, 8192).splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    except (OSError, IndexError, ValueError):
        return None
    return None


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return "uid %d" % uid


SYMLINKS_MAX = 40


def checkable(pid: int, path: str) -> tuple[str, str]:
    """(``path`` as ``pid`` sees it, absolute, symlinks resolved, "") when this process may look at
    it for ``pid``: it runs as ``pid``'s user (a look as root at a path a job's locals name would
    judge, and could advise removing, a file that is not the job's), in ``pid``'s mount namespace and
    root (else the same name is another file), and no part of it lies on a FUSE or network mount
    (`waits.NETWORK_FS`: a stat there waits as long as the server does not answer; only ``lstat``
    of parts on other mounts is done here). ("", why not) otherwise."""
    uid = process_uid(pid)
    if uid is None:
        return "", "the process cannot be looked at (gone, or another user's), so its files are not either"
    if uid != os.geteuid():
        return "", "not looked at: this look runs as %s, not as the job's user %s" % (_user(os.geteuid()), _user(uid))
    try:
        same = os.readlink("/proc/self/ns/mnt") == os.readlink("/proc/%d/ns/mnt" % pid)
        same = same and os.readlink("/proc/%d/root" % pid) == "/"
    except OSError:
        same = False
    if not same:
        return "", "not looked at: the process sees other files (another mount namespace or root: a container)"
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.readlink("/proc/%d/cwd" % pid), path)
        except OSError:
            return "", "a relative path, and the process's working directory cannot be read"
    from lora_otel.analysis import waitfacts
    from lora_otel.analysis.waits import NETWORK_FS

    try:
        rows = waitfacts.mounts(pid)
    except OSError as e:
        return "", "its mounts cannot be read: %s" % (e.strerror or e)
    parts = [p for p in path.split("/") if p]
    done, hops = "/", 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done.rstrip("/")) or "/"
            continue
        here = os.path.join(done, part)
        mount = waitfacts.mount_of(rows, here)
        if mount is not None and mount["fstype"].startswith(NETWORK_FS):
            return (
                "",
                "it is on a %s mount at %s, which is not looked at: a look there waits as long as its server "
                "does not answer" % (mount["fstype"], mount["point"]),
            )
        try:
            st = os.lstat(here)
        except OSError:
            return os.path.join(here, *parts), ""  # not there: the rest is not looked at
        if (st.st_mode & 0o170000) == 0o120000:
            hops += 1
            if hops > SYMLINKS_MAX:
                return "", "too many symbolic links"
            try:
                link = os.readlink(here)
            except OSError as e:
                return "", "cannot read the link %s: %s" % (here, e.strerror or e)
            parts = [p for p in link.split("/") if p] + parts
            if link.startswith("/"):
                done = "/"
            continue
        done = here
    return done, ""


def command_line(pid: int) -> Optional[str]:
    """``python holder.py --lock x`` of a live process (secrets redacted, shortened), or None when
    it is gone or unreadable."""
    try:
        raw = _read("/proc/%d/cmdline" % pid, 4096)
    except OSError:
        return None
    from lora_otel._boot.seam import redact

    # (by argument: ``redact_argv`` knows ``-p PW``, ``--user a:PW``, which free text cannot tell)
    text = " ".join(redact.redact_argv(raw.rstrip("\0").split("\0"))).strip() if raw.strip("\0") else ""
    if not text:
        try:
            text = redact.redact_text("[%s]" % _read("/proc/%d/comm" % pid, 64).strip())
        except OSError:
            return None
    return text if len(text) <= CMDLINE_MAX else text[: CMDLINE_MAX - 1] + "\u2026"


def _alive(pid: int) -> bool:
    try:
        state = _read("/proc/%d/stat" % pid, 4096).rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _who(pid: int) -> str:
    cmd = command_line(pid)
    return "pid %d (%s)" % (pid, cmd) if cmd else "pid %d" % pid


def _openers(
    file_id: tuple[tuple[int, int], int], exclude: int, path: str = "", deadline: Optional[float] = None
) -> Openers:
    """Live processes with the file open (its ((major, minor), inode), or a descriptor whose link
    is ``path``), and why the look is incomplete ("" when every process was looked at): another
    user's descriptors this user cannot read, more than `SCAN_PROCESSES_MAX` processes, or
    ``deadline`` (``time.monotonic()``; `SCAN_S` from now when None) passed."""
    found: list[int] = []
    end = deadline if deadline is not None else time.monotonic() + SCAN_S
    try:
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    except OSError as e:
        return Openers(found, "/proc cannot be listed: %s" % (e.strerror or e))
    unreadable = 0
    incomplete = ""
    devices: dict[int, tuple[int, int]] = {}
    if len(pids) > SCAN_PROCESSES_MAX:
        incomplete = "only %d of %d processes were looked at" % (SCAN_PROCESSES_MAX, len(pids))
        pids = [p for p in pids if p == exclude] + [p for p in pids if p != exclude][:SCAN_PROCESSES_MAX]
    for pid in pids:
        if time.monotonic() > end:
            incomplete = "the look at other processes ran out of time (%g s)" % SCAN_S
            break
        if pid == exclude:
            continue
        files, error = open_files_of(pid, end, devices)
        if isinstance(error, TimeoutError):
            incomplete = "the look at other processes ran out of time (%g s)" % SCAN_S
        elif error is not None and _alive(pid):
            unreadable += 1
        if (file_id in files or (path and path in files.values())) and _alive(pid):
            found.append(pid)
    if unreadable and not incomplete:
        incomplete = "%d process%s of other users cannot be looked at from here" % (
            unreadable,
            "" if unreadable == 1 else "es",
        )
    return Openers(found, incomplete)


# --- where the wait is, from the stacks ---------------------------------------------------------

_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
_SPY_LOCAL = re.compile(r'^\s+(\w+): "(.*)"\s*$')


def _main_innermost_source(stacks: str) -> str:
    """The source line of the main thread's innermost Python frame in a faulthandler dump (the
    main thread: the one whose outermost frame is ``<module>``), "" when none is seen."""
    threads: list[list[tuple[str, str, str]]] = []
    for line in stacks.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append((m.group(1), m.group(2), m.group(3).strip()))
    for frames in threads:
        if frames and frames[-1][2] == "<module>":
            return linecache.getline(frames[0][0], int(frames[0][1]))
    return ""


def polls(stacks: str) -> bool:
    """Whether the process could be polling a lock file: a thread is inside ``filelock``, or the
    main thread's innermost Python frame is a ``sleep`` call (a ``while os.path.exists(...)`` loop)."""
    return "/filelock/" in stacks or "sleep(" in _main_innermost_source(stacks)


def py_spy_path() -> Optional[str]:
    """py-spy (the ``pyspy`` extra): the one installed beside this interpreter (a virtual
    environment's ``bin/``, which need not be on ``PATH``), else the first on ``PATH``; None when
    ``LORA_OTEL_PY_SPY=0`` (no process is read with ptrace: the stack request signal only)."""
    if not py_spy_allowed():
        return None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def py_spy_allowed() -> bool:
    """False when ``LORA_OTEL_PY_SPY`` is ``0``/``false``/``no``/``off``: py-spy is never run."""
    return os.environ.get("LORA_OTEL_PY_SPY", "").strip().lower() not in ("0", "false", "no", "off")


def locals_paths(pid: int, py_spy: Optional[str] = None) -> tuple[list[str], Optional[str]]:
    """Lock-file paths named by the Python locals of the process's threads (``py-spy dump -ll``):
    a string whose name has ``lock`` in it or whose value ends in ``.lock``, relative ones taken
    from the process's working directory, only those that exist. Returns (paths, why none)."""
    spy = py_spy or py_spy_path()
    if not spy:
        return [], (
            "py-spy is off (LORA_OTEL_PY_SPY=0)"
            if not py_spy_allowed()
            else "py-spy was not found on PATH or beside this interpreter (it reads the waiting frames' locals)"
        )
    try:
        # -ll: whole values (one -l cuts a string at 128 characters; a hub cache's lock path is longer)
        # --nonblocking: read without pausing the process (a pause interrupts a sigtimedwait, an
        # epoll_wait: evidence.STOP_INTERRUPTS); a poll loop's locals stay put between its tries.
        r = subprocess.run(
            [spy, "dump", "-ll", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], "py-spy: %s" % e
    if r.returncode != 0:
        return [], "py-spy: %s" % ((r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        cwd = ""
    found: list[str] = []
    for line in r.stdout.splitlines():
        m = _SPY_LOCAL.match(line)
        if m is None:
            continue
        name, value = m.groups()
        if not value or not ("lock" in name.lower() or value.endswith(".lock")):
            continue
        path = value if os.path.isabs(value) or not cwd else os.path.join(cwd, value)
        if path in found or not checkable(pid, path)[0]:  # (never a stat on a FUSE or network mount)
            continue
        if os.path.isfile(path):
            found.append(path)
    return found, None if found else "the waiting frames' locals name no lock file that exists"


# --- the evidence -------------------------------------------------------------------------------


def facts(pid: int, stacks: str = "", use_py_spy: bool = True) -> dict[str, Any]:
    """The file lock ``pid`` waits for, as ``lora_otel.evidence.file_lock.*`` attributes ({} when it
    waits for none that can be seen): ``path``, ``how`` (``flock``, ``fcntl``, ``filelock``,
    ``polled``), ``found_by``, ``holders`` (``pid N (command line)``), ``holder_pid``,
    ``recorded_pid`` and ``recorded_alive`` (the pid written in the file), ``open_by``, ``stale``;
    ``error`` when the path could not be read.

    ``stacks``: the process's Python stacks (faulthandler's dump), which tell a polling wait;
    ``use_py_spy``: read the locals with py-spy for one (it attaches with ptrace: the watchdog does,
    inspect does not)."""
    try:
        locks = parse_locks(_read("/proc/locks"))
    except OSError as e:
        if "/filelock/" not in stacks:
            return {}
        return {KEY + "how": "filelock", KEY + "error": "cannot read /proc/locks: %s" % e}
    mine = open_files(pid)
    how, found_by, file_id, path = "", "", None, ""
    wait = next((lock for lock in locks if lock.waiting and lock.pid == pid), None)
    if wait is not None:  # blocked in the kernel: flock / fcntl / lockf without LOCK_NB
        file_id = (wait.device, wait.inode)
        how, found_by = ("flock" if wait.kind == "FLOCK" else "fcntl"), "kernel wait"
        path = mine.get(file_id, "")
        holders = [lock.pid for lock in locks if not lock.waiting and lock.number == wait.number]
    else:
        held = [
            lock
            for lock in locks
            if not lock.waiting and (lock.device, lock.inode) in mine and lock.pid != pid and lock.pid > 0
        ]
        if held and stacks and polls(stacks):  # polling a file it has open, which another holds
            file_id = (held[0].device, held[0].inode)
            path, found_by = mine[file_id], "open descriptor"
        elif stacks and polls(stacks):
            paths, why = locals_paths(pid) if use_py_spy else ([], "not read (inspect does not attach to the process)")
            if not paths and "/filelock/" not in stacks:
                return {}  # a sleep naming no lock file is not a lock wait
            if not paths:
                unknown: dict[str, Any] = {
                    KEY + "how": _polling_how(stacks),
                    KEY + "error": "which file is not known: %s" % why,
                }
                candidates = held_lock_files(locks, pid)
                if candidates:
                    unknown[KEY + "candidates"] = candidates
                return unknown
            path, found_by = paths[0], "py-spy locals"
            try:
                file_id = _file_id(os.stat(checkable(pid, path)[0] or path))
            except OSError as e:
                return {KEY + "how": _polling_how(stacks), KEY + "path": path, KEY + "error": str(e)}
        else:
            return {}
        how = _polling_how(stacks)
        holders = [lock.pid for lock in locks if not lock.waiting and (lock.device, lock.inode) == file_id]
    out: dict[str, Any] = {KEY + "how": how, KEY + "found_by": found_by}
    if path:
        out[KEY + "path"] = path
    else:
        out[KEY + "file"] = "%02x:%02x:%d" % (file_id[0][0], file_id[0][1], file_id[1])
    if pid in holders:  # another descriptor of this very process holds it (flock locks per open file)
        out[KEY + "holders"] = ["this process itself (pid %d, through another descriptor)" % pid]
        out[KEY + "holder_pid"] = pid
        return out
    live = [p for p in dict.fromkeys(holders) if p > 0 and _alive(p)]
    if live:
        out[KEY + "holders"] = [_who(p) for p in live[:4]]
        out[KEY + "holder_pid"] = live[0]
        return out
    # Nobody holds a kernel lock on it (or the pid the kernel gives is gone): who else could?
    deadline = time.monotonic() + SCAN_S
    looked, unchecked = checkable(pid, path) if path else ("", "")
    if unchecked:
        out[KEY + "unchecked"] = unchecked
    recorded, host = _recorded_owner(looked) if looked else (None, None)
    if recorded is not None:
        out[KEY + "recorded_pid"] = recorded
        if host and host != this_host():
            out[KEY + "recorded_host"] = host  # another machine's pid (a shared file system): not ours to judge
        else:
            out[KEY + "recorded_alive"] = recorded != pid and _alive(recorded)
            if out[KEY + "recorded_alive"]:
                out[KEY + "holders"] = [_who(recorded)]
                out[KEY + "holder_pid"] = recorded
                return out
    openers = _openers(file_id, pid, path, deadline)
    if openers.pids:
        out[KEY + "open_by"] = [_who(p) for p in openers.pids[:4]]
        out[KEY + "holder_pid"] = openers.pids[0]
        if holders:  # a kernel lock whose pid is gone is held through a descriptor it passed on
            out[KEY + "holders"] = out[KEY + "open_by"]
    elif openers.incomplete:
        out[KEY + "open_by_error"] = openers.incomplete  # one not looked at can have it open: not stale
    elif KEY + "recorded_host" not in out:
        out[KEY + "stale"] = True
    if looked:
        try:
            out[KEY + "owner_uid"] = os.stat(looked).st_uid
        except OSError:
            pass
    job_uid = process_uid(pid)
    if job_uid is not None:
        out[KEY + "job_uid"] = job_uid
    return out


CANDIDATES_MAX = 3
"""Lock files held by other processes named when the one waited for is not known."""


def held_lock_files(locks: list[KernelLock], pid: int) -> list[str]:
    """``/x/model.lock by pid 4711 (python prefetch.py)``: the lock files (``*.lock``, or in a
    ``.locks`` folder) other live processes hold kernel locks on now, as far as their fds can be read
    (the candidates for the one a polling process waits for, when its locals cannot be read); those
    under the process's working directory first, then those in a cache (``.cache``, ``.locks``)."""
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid).rstrip("/") + "/"
    except OSError:
        cwd = "\0"
    found: list[tuple[int, str]] = []
    seen: set[tuple[tuple[int, int], int]] = set()
    deadline = time.monotonic() + SCAN_S
    for lock in locks[:256]:
        if time.monotonic() > deadline:
            break
        file_id = (lock.device, lock.inode)
        if lock.waiting or lock.pid <= 0 or lock.pid == pid or file_id in seen or not _alive(lock.pid):
            continue
        seen.add(file_id)
        path = open_files(lock.pid, deadline).get(file_id, "")
        if path.endswith(".lock") or "/.locks/" in path:
            rank = 0 if path.startswith(cwd) else 1 if ("/.cache/" in path or "/.locks/" in path) else 2
            found.append((rank, "%s by %s" % (path, _who(lock.pid))))
    return [text for _, text in sorted(found, key=lambda pair: pair[0])[:CANDIDATES_MAX]]


def this_host() -> str:
    """This machine's name as filelock writes it into a soft lock: the host name, with
    ``?pidns-<inode>`` after it when this process's PID namespace is not the initial one (a
    container's pids mean nothing outside it)."""
    name = os.uname().nodename
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return name
    return name if namespace == 0xEFFFFFFC else "%s?pidns-%x" % (name, namespace)


def _polling_how(stacks: str) -> str:
    return "filelock" if "/filelock/" in stacks else "polled"


def _recorded_owner(path: str) -> tuple[Optional[int], Optional[str]]:
    """The pid a lock file starts with and the host on its next line (filelock's soft lock writes
    ``pid\\nhost\\n…``), or None for what it does not say."""
    from lora_otel._boot.seam import files

    try:
        with open(files.open_regular(path), "rb") as f:  # (a lock file may be a FIFO: never wait on it)
            lines = f.read(512).decode("utf-8", "replace").splitlines()
    except OSError:
        return None, None
    first = lines[0].strip() if lines else ""
    if not first.isdigit() or not 0 < int(first) < 1 << 31:
        return None, None
    host = lines[1].strip() if len(lines) > 1 and lines[1].strip() else None
    return int(first), host


# --- the sentence -------------------------------------------------------------------------------

_HOW = {
    "flock": "fcntl.flock, blocked in the kernel",
    "fcntl": "fcntl.lockf/fcntl, blocked in the kernel",
    "filelock": "filelock polls it",
    "polled": "polled until it goes away",
}


def sentence(evidence: Mapping[str, Any], where: str = "") -> Optional[str]:
    """``Waiting for a file lock on /x/y.lock (filelock polls it, at job.py:5 in <module>), held by
    pid 4711 (python holder.py).`` — or that no holder is alive (stale); None without the evidence."""
    how = evidence.get(KEY + "how")
    if not isinstance(how, str) or not how:
        return None
    path = evidence.get(KEY + "path") or evidence.get(KEY + "file")
    at = ", at %s" % where if where else ""
    if not path:
        error = evidence.get(KEY + "error") or "which file is not known"
        candidates = evidence.get(KEY + "candidates")
        if candidates:
            error += "; lock files held now by other processes: %s" % "; ".join(str(c) for c in candidates)
        return "Waiting for a file lock (%s%s); %s." % (_HOW.get(how, how), at, error)
    head = "Waiting for a file lock on %s (%s%s)" % (path, _HOW.get(how, how), at)
    holders = evidence.get(KEY + "holders")
    recorded = evidence.get(KEY + "recorded_pid")
    if holders:
        told = ", ".join(str(h) for h in holders)
        if recorded is not None and evidence.get(KEY + "recorded_alive"):
            return "%s, held by %s (the pid written in the file)." % (head, told)
        return "%s, held by %s." % (head, told)
    openers = evidence.get(KEY + "open_by")
    if openers:
        return "%s, held open by %s (no lock on it in the kernel)." % (head, ", ".join(str(o) for o in openers))
    if evidence.get(KEY + "stale"):
        gone = "pid %s written in it is gone and no" % recorded if recorded is not None else "no live"
        return "%s; the lock is stale: %s process has it open." % (head, gone)
    incomplete = evidence.get(KEY + "open_by_error")
    if incomplete:
        gone = "pid %s written in it is gone and " % recorded if recorded is not None else ""
        return "%s; %sno process this user can see has it open (%s)." % (head, gone, incomplete)
    host = evidence.get(KEY + "recorded_host")
    if recorded is not None and host:
        return "%s; it was written by pid %s on %s, which cannot be looked at from here." % (head, recorded, host)
    return "%s; cannot tell who holds it." % head


def advice(evidence: Mapping[str, Any], pid: Optional[int] = None) -> str:
    """What to do about the lock `sentence` told, from the same evidence ("" when it supports no
    step): a live holder (another process) — wait for it or stop it, as the lock is freed when it
    ends; a lock file nobody holds, nor has open, whose writer is gone — remove it (safe: no process
    uses it). ``pid``: the waiting process's (a holder that is the process itself is no step here)."""
    path = evidence.get(KEY + "path")
    holder = evidence.get(KEY + "holder_pid")
    holders = [str(h) for h in evidence.get(KEY + "holders") or evidence.get(KEY + "open_by") or ()]
    if isinstance(holder, int) and holder != pid and holders:
        named = holders[0]
        kernel = bool(evidence.get(KEY + "holders")) and not evidence.get(KEY + "recorded_alive")
        return "Wait for %s to finish with %s, or stop it if it should not be running%s." % (
            named,
            shlex.quote(path) if path else "the lock",
            ": the kernel frees its lock when it ends" if kernel else "",
        )
    owner_uid, job_uid = evidence.get(KEY + "owner_uid"), evidence.get(KEY + "job_uid")
    if path and evidence.get(KEY + "stale") and owner_uid is not None and owner_uid != job_uid:
        return (
            "Ask the owner of %s (another user than the job's) whether a run of theirs uses it; the job "
            "goes on when it is removed." % shlex.quote(path)
        )
    if path and evidence.get(KEY + "open_by_error"):
        return "See who has %s open (as root: fuser -v %s); if nobody does, removing it lets the job go on." % (
            shlex.quote(path),
            shlex.quote(path),
        )
    if path and evidence.get(KEY + "stale") and isinstance(owner_uid, int):
        recorded = evidence.get(KEY + "recorded_pid")
        return "Remove %s: no process holds it or has it open%s, so nothing else is using it." % (
            shlex.quote(path),
            " and pid %s written in it is gone" % recorded if recorded is not None else "",
        )
    return ""
