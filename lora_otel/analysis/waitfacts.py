"""What a stalled process's threads wait on in the kernel, read from outside: the system call each
is in, the descriptor or path it names, what that is, and what is at its other end — followed from
process to process (the chain of waits). `lora_otel.analysis.waits` reads these facts.

Nothing here signals or stops a process: it reads ``/proc`` only (``/proc/<pid>/task/<tid>/syscall``,
``fd``, ``fdinfo``, ``mountinfo``, ``/proc/net/{tcp,tcp6}``, the kernel's ``sock_diag`` for Unix
sockets' peers, and ``/proc/<pid>/mem`` for the path an ``open`` names — read access the kernel
grants as it grants py-spy's, refused otherwise). Every fact that cannot be read is left out with
the reason under an ``error`` key; nothing raises. No file on the paths read is ``stat``-ed (a file
on a mount that does not answer would block the reader too): its mount is found from ``fdinfo``'s
``mnt_id``, or the path's longest mount point.

The facts (``lora_otel.evidence.wait.threads``): one dict per thread in a descriptor, path or
child wait (the main thread first), each a *wait*::

    {"pid", "tid", "main", "cmdline", "state", "wchan", "syscall", "op": "read"|"write"|"open"|"child"|"poll",
     "fd", "path", "what": {descriptor facts}, "other": [waits of the processes at its other end],
     "role": "writer"|"reader"|"peer"|"child", "loop": True (a process already described above)}
"""

from __future__ import annotations

import os
import platform
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from lora_otel._boot.seam import redact
from lora_otel.analysis.waits import FIFO_OPEN_WCHAN, KEY, NETWORK_FS

MAX_DEPTH = 3
"""Processes followed along a chain of waits, beyond the stalled one."""
MAX_THREADS = 64
MAX_OTHERS = 4
"""Processes at one descriptor's other end described (more are counted)."""
SCAN_S = 2.0
"""At most this long looking through /proc/*/fd for the holders of one set of descriptors."""

# System calls by number, per architecture: the name, what it does to its descriptor (or child), and
# which argument is the descriptor ("fd"), the path pointer ("path"), or the child's pid ("pid").
_CALLS_X86_64 = {
    0: ("read", "read", "fd0"),
    1: ("write", "write", "fd0"),
    2: ("open", "open", "path0"),
    7: ("poll", "poll", "pollfds"),
    17: ("pread64", "read", "fd0"),
    18: ("pwrite64", "write", "fd0"),
    19: ("readv", "read", "fd0"),
    20: ("writev", "write", "fd0"),
    23: ("select", "poll", "select"),
    40: ("sendfile", "write", "fd0"),
    44: ("sendto", "write", "fd0"),
    45: ("recvfrom", "read", "fd0"),
    46: ("sendmsg", "write", "fd0"),
    47: ("recvmsg", "read", "fd0"),
    61: ("wait4", "child", "pid0"),
    232: ("epoll_wait", "poll", "epoll"),
    247: ("waitid", "child", "waitid"),
    257: ("openat", "open", "path1"),
    270: ("pselect6", "poll", "select"),
    271: ("ppoll", "poll", "pollfds"),
    275: ("splice", "read", "fd0"),
    281: ("epoll_pwait", "poll", "epoll"),
    295: ("preadv", "read", "fd0"),
    296: ("pwritev", "write", "fd0"),
    299: ("recvmmsg", "read", "fd0"),
    307: ("sendmmsg", "write", "fd0"),
    327: ("preadv2", "read", "fd0"),
    328: ("pwritev2", "write", "fd0"),
    437: ("openat2", "open", "path1"),
    441: ("epoll_pwait2", "poll", "epoll"),
}
_CALLS_GENERIC = {  # aarch64, riscv64 (the generic table)
    22: ("epoll_pwait", "poll", "epoll"),
    56: ("openat", "open", "path1"),
    63: ("read", "read", "fd0"),
    64: ("write", "write", "fd0"),
    65: ("readv", "read", "fd0"),
    66: ("writev", "write", "fd0"),
    67: ("pread64", "read", "fd0"),
    68: ("pwrite64", "write", "fd0"),
    69: ("preadv", "read", "fd0"),
    70: ("pwritev", "write", "fd0"),
    71: ("sendfile", "write", "fd0"),
    72: ("pselect6", "poll", "select"),
    73: ("ppoll", "poll", "pollfds"),
    76: ("splice", "read", "fd0"),
    95: ("waitid", "child", "waitid"),
    206: ("sendto", "write", "fd0"),
    207: ("recvfrom", "read", "fd0"),
    211: ("sendmsg", "write", "fd0"),
    212: ("recvmsg", "read", "fd0"),
    243: ("recvmmsg", "read", "fd0"),
    260: ("wait4", "child", "pid0"),
    269: ("sendmmsg", "write", "fd0"),
    286: ("preadv2", "read", "fd0"),
    287: ("pwritev2", "write", "fd0"),
    437: ("openat2", "open", "path1"),
    441: ("epoll_pwait2", "poll", "epoll"),
}
_MACHINE = platform.machine()
CALLS: dict[int, tuple[str, str, str]] = (
    _CALLS_X86_64
    if _MACHINE in ("x86_64", "amd64")
    else _CALLS_GENERIC
    if _MACHINE in ("aarch64", "arm64", "riscv64")
    else {}
)
AT_FDCWD = -100


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _signed(value: int) -> int:
    """A 32-bit C ``int`` argument (a descriptor, a pid), as ``/proc/<pid>/syscall`` shows its register."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _wchan(pid: int, tid: Optional[int] = None) -> str:
    try:
        w = _read("/proc/%d/task/%d/wchan" % (pid, tid) if tid else "/proc/%d/wchan" % pid).strip()
    except OSError:
        return ""
    return "" if w == "0" else w


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` fields from the state (field 3) on."""
    raw = _read("/proc/%d/stat" % pid)
    return raw[raw.rindex(")") + 2 :].split()


def cmdline(pid: int, job: Optional[int] = None) -> str:
    """The process's command line, secret-named options' values removed (`redact_argv`); "" when
    it cannot be read. With ``job``: for a process that is not part of that job (not the job, one of
    its descendants, or the launcher that started it), its program and script only (`program_name`):
    another program's arguments are not the job's to record (a password ``redact_argv`` does not
    know would reach the journal, the job's log and an OTLP backend)."""
    try:
        argv = _read("/proc/%d/cmdline" % pid).rstrip("\0").split("\0")
    except OSError:
        return ""
    if job is not None and not related(pid, job):
        return program_name(argv)
    return " ".join(redact.redact_argv(argv)).strip()[:200]


INTERPRETERS = ("python", "pypy", "node", "bash", "sh", "dash", "zsh", "perl", "ruby", "php", "Rscript", "java")


def program_name(argv: Sequence[str]) -> str:
    """``hold.py`` for ``python hold.py -p X``, ``python -m pkg.mod`` for ``python -m pkg.mod --x``,
    ``redis-cli`` for ``/usr/bin/redis-cli -a X``: the program's basename, and for an interpreter
    its script's basename (or ``-m`` module, or ``-c``); never an argument."""
    prog = (argv[0] if argv else "").rsplit("/", 1)[-1][:60]
    base = prog.rstrip("0123456789.")
    if not prog or not base.startswith(INTERPRETERS):
        return prog
    for i, arg in enumerate(argv[1:8], 1):
        if arg in ("-m", "-c") and i + 1 < len(argv):
            return "%s %s" % (prog, arg if arg == "-c" else "-m " + argv[i + 1].rsplit("/", 1)[-1][:60])
        if arg and not arg.startswith("-"):
            return "%s %s" % (prog, arg.rsplit("/", 1)[-1][:60])
    return prog


def related(pid: int, job: int) -> bool:
    """Whether ``pid`` is part of ``job``: the job itself, one of its descendants, or its parent (the
    launcher that started it)."""
    if pid == job:
        return True
    parents = _ancestors(job, 1)
    return pid in parents or job in _ancestors(pid, 32)


def syscall(pid: int, tid: int) -> dict[str, Any]:
    """``{"nr", "args"}`` of the system call the thread is blocked in (``/proc/<pid>/task/<tid>/syscall``),
    ``{"running": True}`` for a running thread, ``{}`` when it is in none, ``{"error"}`` when unreadable."""
    try:
        fields = _read("/proc/%d/task/%d/syscall" % (pid, tid)).split()
    except OSError as e:
        return {"error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    if not fields:
        return {}
    if fields[0] == "running":
        return {"running": True}
    try:
        nr = int(fields[0])
        args = [int(a, 16) for a in fields[1:7]]
    except ValueError:
        return {"error": "unreadable: %r" % " ".join(fields)[:80]}
    return {} if nr < 0 else {"nr": nr, "args": args}


def _mem_string(pid: int, address: int, limit: int = 4096) -> str:
    """The NUL-terminated string at ``address`` in the process's memory (``/proc/<pid>/mem``: read
    access as ptrace grants it; the process is not stopped). Raises OSError when refused."""
    return _mem_bytes(pid, address, limit).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


MEM_MAX = 4096
"""Bytes read from a process's memory at once (a path, a ``pollfd`` array, ``fd_set`` bitmaps)."""


def _mem_bytes(pid: int, address: int, size: int) -> bytes:
    """At most `MEM_MAX` bytes at ``address`` of the process's memory. A read of ``/proc/<pid>/mem``
    faults the page in as the process would: an anonymous page, or one under userfaultfd, answers at
    once (EIO), but a page of a file mapped from a FUSE or network mount can block the reader as long
    as that server does not answer. Such addresses are not read (OSError), judged from
    ``/proc/<pid>/maps`` (the mapping's device) and ``mountinfo`` (that device's file system type)."""
    size = max(0, min(size, MEM_MAX))
    if _on_remote_mapping(pid, address, size):
        raise OSError(0, "the memory is a file mapped from a FUSE or network mount: not read (it could block)")
    fd = os.open("/proc/%d/mem" % pid, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, address)
    finally:
        os.close(fd)


def _on_remote_mapping(pid: int, address: int, size: int) -> bool:
    """Whether ``[address, address + size)`` touches a mapping of a file on a FUSE or network mount."""
    devices: set[str] = set()
    for line in _read("/proc/%d/maps" % pid).splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[4] == "0":  # (anonymous: inode 0)
            continue
        start, _, end = fields[0].partition("-")
        if int(start, 16) < address + max(size, 1) and address < int(end, 16):
            major, _, minor = fields[3].partition(":")
            devices.add("%d:%d" % (int(major, 16), int(minor, 16)))
    if not devices:
        return False
    for line in _read("/proc/%d/mountinfo" % pid).splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) > 2 and r and f[2] in devices and r[0].startswith(NETWORK_FS):
            return True
    return False


# --- mounts -------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(pid: int) -> list[dict[str, Any]]:
    """The process's mounts (``/proc/<pid>/mountinfo``): ``{"id", "point", "fstype", "source"}``."""
    rows = []
    for line in _read("/proc/%d/mountinfo" % pid).splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 2:
            continue
        rows.append({"id": int(f[0]), "point": _unescape(f[4]), "fstype": r[0], "source": _unescape(r[1])})
    return rows


def mount_of(rows: Sequence[dict[str, Any]], path: str = "", mnt_id: Optional[int] = None) -> Optional[dict[str, Any]]:
    """The mount with id ``mnt_id``, else the one whose mount point is the longest prefix of ``path``."""
    if mnt_id is not None:
        found = [r for r in rows if r["id"] == mnt_id]
        if found:
            return found[-1]
    best: Optional[dict[str, Any]] = None
    for r in rows:
        point = r["point"].rstrip("/") or "/"
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (
            best is None or len(point) >= len(best["point"])
        ):
            best = r
    return best


def _mount_facts(row: Optional[dict[str, Any]]) -> dict[str, Any]:
    if row is None:
        return {}
    return {"mount": row["point"], "fstype": row["fstype"], "source": redact.redact_text(row["source"])[:200]}


# --- descriptors ----------------------------------------------------------------------------------


def _fdinfo(pid: int, fd: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in _read("/proc/%d/fdinfo/%d" % (pid, fd)).splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        try:
            out[key] = int(value, 8) if key == "flags" else int(value)
        except ValueError:
            continue
    return out


def _queued(pid: int, fd: int) -> Optional[int]:
    """Bytes waiting in the pipe or FIFO on ``pid``'s ``fd`` (``FIONREAD`` on a non-blocking descriptor of
    our own, opened only because ``pid`` already holds it open: never read from)."""
    import fcntl
    import termios

    try:
        own = os.open("/proc/%d/fd/%d" % (pid, fd), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        return int(struct.unpack("i", fcntl.ioctl(own, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return None
    finally:
        os.close(own)


_TERMINAL = ("/dev/pts/", "/dev/tty", "/dev/console")


def describe_fd(pid: int, fd: int, rows: Optional[Sequence[dict[str, Any]]] = None) -> dict[str, Any]:
    """What ``pid``'s descriptor ``fd`` is: ``{"kind": "pipe"|"fifo"|"socket"|"terminal"|"file"|"null"|
    "device"|"other", "target", "access": "r"|"w"|"rw", "inode", "mount", "fstype", "source",
    "queued_bytes", "foreground", ...}``, or ``{"error"}``."""
    try:
        target = os.readlink("/proc/%d/fd/%d" % (pid, fd))
    except OSError as e:
        return {"error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    out: dict[str, Any] = {"target": target}
    info: dict[str, int] = {}
    try:
        info = _fdinfo(pid, fd)
    except OSError as e:
        out["fdinfo_error"] = "%s: %s" % (type(e).__name__, e.strerror or e)
    if "flags" in info:
        out["access"] = {os.O_RDONLY: "r", os.O_WRONLY: "w"}.get(info["flags"] & os.O_ACCMODE, "rw")
    if target.startswith(("pipe:[", "socket:[")) and target.endswith("]"):
        kind, _, rest = target.partition(":[")
        out["kind"] = kind
        out["inode"] = int(rest[:-1]) if rest[:-1].isdigit() else None
        if kind == "pipe":
            queued = _queued(pid, fd)
            if queued is not None:
                out["queued_bytes"] = queued
        return out
    if target.startswith("anon_inode:") or not target.startswith("/"):
        out["kind"] = "other"
        return out
    if target == "/dev/null":
        out["kind"] = "null"
        return out
    if target.startswith(_TERMINAL):
        out["kind"] = "terminal"
        try:
            fields = _stat(pid)
            pgrp, tpgid = int(fields[2]), int(fields[5])
            out["pgrp"], out["tpgid"] = pgrp, tpgid
            out["foreground"] = tpgid > 0 and pgrp == tpgid
        except (OSError, ValueError, IndexError) as e:
            out["terminal_error"] = "%s: %s" % (type(e).__name__, e)
        return out
    try:
        mount = mount_of(rows if rows is not None else mounts(pid), target, info.get("mnt_id"))
    except OSError as e:
        out["mount_error"] = "%s: %s" % (type(e).__name__, e.strerror or e)
        mount = None
    out.update(_mount_facts(mount))
    if mount is not None and mount["fstype"].startswith(NETWORK_FS):
        out["kind"] = "file"  # never stat a file on a mount that may not answer
        return out
    try:
        import stat as st

        mode = os.stat("/proc/%d/fd/%d" % (pid, fd)).st_mode
    except OSError as e:
        out["kind"] = "file"
        out["stat_error"] = "%s: %s" % (type(e).__name__, e.strerror or e)
        return out
    if st.S_ISFIFO(mode):
        out["kind"] = "fifo"
        queued = _queued(pid, fd)
        if queued is not None:
            out["queued_bytes"] = queued
    elif st.S_ISCHR(mode) or st.S_ISBLK(mode):
        out["kind"] = "device"
    else:
        out["kind"] = "file"
    return out


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def fd_index(first: Sequence[int] = (), budget_s: float = SCAN_S) -> dict[str, list[tuple[int, int, str]]]:
    """Every descriptor of the processes this user can see, by its link (``pipe:[34094]``,
    ``socket:[5512]``, a path): ``(pid, fd, access)``, ``access`` ``r``, ``w`` or ``rw`` (``fdinfo``
    flags). One pass over ``/proc/*/fd`` of at most ``budget_s``, ``first``: pids to look at first."""
    index: dict[str, list[tuple[int, int, str]]] = {}
    deadline = time.monotonic() + budget_s
    for pid in dict.fromkeys([*first, *_pids()]):
        if time.monotonic() > deadline:
            break
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for name in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, name))
            except OSError:
                continue
            if not target.startswith(("pipe:[", "socket:[", "/")):
                continue
            try:
                flags = _fdinfo(pid, int(name)).get("flags", os.O_RDWR)
            except (OSError, ValueError):
                flags = os.O_RDWR
            access = {os.O_RDONLY: "r", os.O_WRONLY: "w"}.get(flags & os.O_ACCMODE, "rw")
            index.setdefault(target, []).append((pid, int(name), access))
    return index


def holders(
    targets: Iterable[str], first: Sequence[int] = (), ctx: Optional[dict[str, Any]] = None
) -> dict[str, list[tuple[int, int, str]]]:
    """The processes holding a descriptor whose link is one of ``targets``, by target (`fd_index`,
    made once per ``ctx``: one gathering's pass over ``/proc``)."""
    ctx = ctx if ctx is not None else {}
    if "index" not in ctx:
        ctx["index"] = fd_index(first)
    return {t: list(ctx["index"].get(t, [])) for t in targets}


# --- sockets' other ends ----------------------------------------------------------------------------


def _hexaddr(hexaddr: str) -> tuple[str, int]:
    host, _, port = hexaddr.partition(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        addr = socket.inet_ntop(socket.AF_INET6, words)
        if addr.startswith("::ffff:") and "." in addr:
            addr = addr[7:]
    return addr, int(port, 16)


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def tcp_rows(pid: int) -> list[tuple[int, tuple[str, int], tuple[str, int], str]]:
    """(inode, local, remote, state) of every TCP socket in the process's network namespace."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            lines = _read("/proc/%d/net/%s" % (pid, name)).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or not f[9].isdigit():
                continue
            try:
                rows.append((int(f[9]), _hexaddr(f[1]), _hexaddr(f[2]), _TCP_STATES.get(f[3], f[3])))
            except ValueError:
                continue
    return rows


def unix_peers() -> dict[int, tuple[int, str]]:
    """Every Unix socket's peer (``inode -> (peer inode, bound name)``) in this network namespace,
    from the kernel's ``sock_diag`` (what ``ss -x`` shows); {} when it cannot be asked."""
    netlink_sock_diag, sock_diag_by_family = 4, 20
    udiag_show_name, udiag_show_peer = 0x01, 0x04
    unix_diag_name, unix_diag_peer = 0, 2
    request = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, udiag_show_name | udiag_show_peer, 0, 0)
    header = struct.pack("=IHHII", 16 + len(request), sock_diag_by_family, 0x301, 1, 0)
    out: dict[int, tuple[int, str]] = {}
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netlink_sock_diag)  # type: ignore[attr-defined,unused-ignore]
    try:
        s.settimeout(2.0)
        s.sendto(header + request, (0, 0))
        while True:
            data = s.recv(65536)
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if length < 16:
                    return out
                if kind in (2, 3):  # NLMSG_ERROR, NLMSG_DONE
                    return out
                body = data[off + 16 : off + length]
                if len(body) >= 16:
                    ino = struct.unpack_from("=I", body, 4)[0]
                    peer, name, pos = 0, "", 16
                    while pos + 4 <= len(body):
                        alen, atype = struct.unpack_from("=HH", body, pos)
                        if alen < 4:
                            break
                        value = body[pos + 4 : pos + alen]
                        if atype == unix_diag_peer and len(value) >= 4:
                            peer = struct.unpack_from("=I", value)[0]
                        elif atype == unix_diag_name:
                            raw = b"@" + value[1:] if value[:1] == b"\0" else value
                            name = raw.rstrip(b"\0").decode("utf-8", "replace")
                        pos += (alen + 3) & ~3
                    out[ino] = (peer, name)
                off += (length + 3) & ~3
    finally:
        s.close()


def socket_facts(pid: int, inode: int) -> dict[str, Any]:
    """The socket's addresses and the link of its other end on this host, if any: ``{"proto", "local",
    "remote", "tcp_state", "peer_target"}`` (``peer_target``: ``socket:[<inode>]`` of the peer)."""
    out: dict[str, Any] = {}
    for ino, local, remote, state in tcp_rows(pid):
        if ino != inode:
            continue
        out.update(proto="tcp", local="%s:%d" % local, remote="%s:%d" % remote, tcp_state=state)
        if state == "ESTABLISHED":
            peer = next((i for i, loc, rem, _ in tcp_rows(pid) if loc == remote and rem == local and i), None)
            if peer:
                out["peer_target"] = "socket:[%d]" % peer
        return out
    try:
        peers = unix_peers()
    except OSError as e:
        out["unix_error"] = "%s: %s" % (type(e).__name__, e.strerror or e)
        return out
    if inode in peers:
        peer, name = peers[inode]
        out["proto"] = "unix"
        if name:
            out["name"] = name
        if peer:
            out["peer_target"] = "socket:[%d]" % peer
            if not name and peers.get(peer, (0, ""))[1]:
                out["name"] = peers[peer][1]
    return out


# --- waits and their chains ---------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids[:MAX_THREADS]:
        try:
            out += [int(c) for c in _read("/proc/%d/task/%s/children" % (pid, tid)).split()]
        except (OSError, ValueError):
            continue
    return out


def _ancestors(pid: int, depth: int = 8) -> list[int]:
    out: list[int] = []
    while len(out) < depth:
        try:
            pid = int(_stat(pid)[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 0:
            break
        out.append(pid)
    return out


def thread_wait(pid: int, tid: int, rows: Optional[list[dict[str, Any]]] = None) -> Optional[dict[str, Any]]:
    """The thread's wait (see the module's docstring) without its other end; None when it is in no
    descriptor, path or child wait (or running)."""
    call = syscall(pid, tid)
    if "nr" not in call or call["nr"] not in CALLS:
        return {"pid": pid, "tid": tid, "syscall_error": call["error"]} if "error" in call else None
    name, op, arg = CALLS[call["nr"]]
    args = call["args"]
    wait: dict[str, Any] = {"pid": pid, "tid": tid, "main": tid == pid, "syscall": name, "op": op}
    wait["wchan"] = _wchan(pid, tid) or "-"
    if arg.startswith("fd"):
        fd = _signed(args[int(arg[2])])
        wait["fd"] = fd
        wait["what"] = describe_fd(pid, fd, rows)
    elif arg.startswith("path"):
        index = int(arg[4])
        dirfd = _signed(args[0]) if index == 1 else AT_FDCWD
        try:
            path = _mem_string(pid, args[index])
        except (OSError, ValueError, OverflowError) as e:
            wait["path_error"] = "%s: %s" % (type(e).__name__, getattr(e, "strerror", None) or e)
        else:
            if not path.startswith("/"):
                try:
                    base = os.readlink("/proc/%d/cwd" % pid if dirfd == AT_FDCWD else "/proc/%d/fd/%d" % (pid, dirfd))
                    path = os.path.join(base, path)
                except OSError:
                    pass
            wait["path"] = redact.redact_text(path)[:300]
            try:
                wait["what"] = _mount_facts(mount_of(rows if rows is not None else mounts(pid), path))
            except OSError as e:
                wait["what"] = {"mount_error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    elif arg == "pid0":
        wait["child"] = _signed(args[0])
    elif arg == "waitid":
        wait["child"] = _signed(args[1]) if args[0] == 1 else -1  # P_PID: that pid; P_ALL, P_PGID: any
    elif arg in ("pollfds", "select", "epoll"):
        try:
            polled = _polled(pid, arg, args)
        except (OSError, ValueError, OverflowError, struct.error) as e:
            wait["polled_error"] = "%s: %s" % (type(e).__name__, getattr(e, "strerror", None) or e)
        else:
            wait["polled"] = [
                {"fd": fd, "op": op, "what": describe_fd(pid, fd, rows)} for fd, op in polled[:MAX_POLLED]
            ]
            if len(polled) > MAX_POLLED:
                wait["polled_more"] = len(polled) - MAX_POLLED
    return wait


MAX_POLLED = 8
"""Descriptors of one poll described (more are counted)."""


def _polled(pid: int, how: str, args: list[int]) -> list[tuple[int, str]]:
    """The descriptors a thread in poll/select/epoll waits on, and for what (``read``/``write``):
    the ``pollfd`` array or the ``fd_set`` bitmaps in its memory (``/proc/<pid>/mem``), or the epoll
    descriptor's registered ones (its ``fdinfo``)."""
    out: list[tuple[int, str]] = []
    if how == "pollfds":
        nfds = min(args[1], 256)
        raw = _mem_bytes(pid, args[0], 8 * nfds)
        for i in range(len(raw) // 8):
            fd, events, _ = struct.unpack_from("=ihh", raw, 8 * i)
            if fd >= 0:
                out.append((fd, "write" if events & 4 and not events & 3 else "read"))
    elif how == "select":
        nfds = min(_signed(args[0]), 4096)
        for pointer, op in ((args[1], "read"), (args[2], "write")):
            if not pointer or nfds <= 0:
                continue
            raw = _mem_bytes(pid, pointer, (nfds + 7) // 8)
            out += [(fd, op) for fd in range(nfds) if raw[fd // 8] >> (fd % 8) & 1]
    else:
        for line in _read("/proc/%d/fdinfo/%d" % (pid, _signed(args[0]))).splitlines():
            fields = line.split()
            if fields[:1] == ["tfd:"] and len(fields) >= 4 and fields[2] == "events:":
                events = int(fields[3], 16)
                out.append((int(fields[1]), "write" if events & 4 and not events & 3 else "read"))
    return out


def _process_wait(pid: int, role: str, depth: int, seen: set[int], ctx: dict[str, Any]) -> dict[str, Any]:
    """``pid``'s wait as seen from the process before it on the chain (``role``: what it is to that
    one), its main thread's, then its other end, to ``depth`` more processes; ``seen``: the pids
    already described (a loop ends at the one met again)."""
    out: dict[str, Any] = {"pid": pid, "role": role, "cmdline": cmdline(pid, ctx.get("job"))}
    try:
        out["state"] = _stat(pid)[0]
    except (OSError, IndexError) as e:
        out["error"] = "%s: %s" % (type(e).__name__, getattr(e, "strerror", None) or e)
        return out
    out["wchan"] = _wchan(pid) or "-"
    if pid in seen:
        out["loop"] = True
        return out
    seen.add(pid)
    try:
        tids = sorted((int(t) for t in os.listdir("/proc/%d/task" % pid)), key=lambda t: (t != pid, t))
    except OSError:
        tids = [pid]
    waits = [w for w in (thread_wait(pid, t) for t in tids[:MAX_THREADS]) if w and "op" in w]
    # The main thread's wait; else (a main thread joining a thread that does the work) another's.
    wait = next((w for w in waits if w["main"]), None) or next((w for w in waits if w["op"] != "poll"), None)
    if wait is None:
        return out
    out.update({k: v for k, v in wait.items() if k not in ("pid",)})
    if depth > 0:
        others = other_end(wait, depth - 1, seen, ctx)
        if others is not None:
            out["other"] = others
    return out


def _observer(pid: int, ctx: dict[str, Any]) -> bool:
    """Whether ``pid`` is the process reading the evidence (the sidecar, ``inspect``) and no ancestor
    of the job: it holds what it reads only to read it, and is never at the other end of a wait. (A
    launcher that reads the evidence itself, as a test does, is the job's ancestor: kept.)"""
    if pid != os.getpid():
        return False
    job = ctx.get("job")
    return not (isinstance(job, int) and pid in _ancestors(job))


def other_end(
    wait: dict[str, Any], depth: int, seen: set[int], ctx: Optional[dict[str, Any]] = None
) -> Optional[list[dict[str, Any]]]:
    """The waits of the processes at the other end of ``wait``: the holders of a pipe's or FIFO's other
    end, a socket's local peer, the child waited for; None when it has no other end to look for. The
    process reading the evidence (the sidecar, ``inspect``) is never one of them: it holds what it
    reads only to read it."""
    pid, what = wait["pid"], wait.get("what") or {}
    ctx = ctx if ctx is not None else {}
    ctx.setdefault("job", pid)  # (the chain starts at the job: others are named by program only)
    if wait.get("op") == "poll":
        if not wait.get("polled"):
            return None
        found: list[dict[str, Any]] = []
        for entry in wait["polled"]:
            sub = {"pid": pid, "op": entry["op"], "fd": entry["fd"], "what": entry["what"]}
            entry["other"] = other_end(sub, depth, seen, ctx)
            found += [o for o in entry["other"] or () if o.get("pid") not in {f.get("pid") for f in found}]
        return found[:MAX_OTHERS]
    if wait.get("op") == "child":
        child = wait.get("child", -1)
        kids = _children(pid) if not isinstance(child, int) or child <= 0 else [child]
        return [_process_wait(k, "child", depth, seen, ctx) for k in kids[:MAX_OTHERS]]
    kind = what.get("kind")
    if str(what.get("fstype") or "").startswith("fuse"):
        # A FUSE file system's server is the program holding /dev/fuse open: named when it is the only one.
        served = list(dict.fromkeys(p for p, _, _ in holders(["/dev/fuse"], (), ctx).get("/dev/fuse", [])))
        if len(served) == 1:
            return [_process_wait(served[0], "server", depth, seen, ctx)]
        return None
    if wait.get("op") == "open" and wait.get("path") and str(wait.get("wchan")).startswith(FIFO_OPEN_WCHAN):
        held = holders([wait["path"]], _ancestors(pid), ctx).get(wait["path"], [])
        pids = list(dict.fromkeys(p for p, _, _ in held if p != pid and not _observer(p, ctx)))
        return [_process_wait(p, "holder", depth, seen, ctx) for p in pids[:MAX_OTHERS]]
    if kind in ("pipe", "fifo") and wait.get("op") in ("read", "write"):
        want = "w" if wait["op"] == "read" else "r"
        held = holders([what["target"]], _ancestors(pid), ctx).get(what["target"], [])
        ends = [
            (p, fd)
            for p, fd, access in held
            if want in access and not (p == pid and fd == wait.get("fd")) and not _observer(p, ctx)
        ]
        pids = sorted(dict.fromkeys(p for p, _ in ends), key=lambda p: p == pid)  # others first, then itself
        out = [_process_wait(p, "writer" if want == "w" else "reader", depth, seen, ctx) for p in pids[:MAX_OTHERS]]
        if len(pids) > MAX_OTHERS:
            out.append({"more": len(pids) - MAX_OTHERS})
        return out
    if kind == "socket" and isinstance(what.get("inode"), int):
        try:
            what.update(socket_facts(pid, what["inode"]))
        except OSError as e:
            what["socket_error"] = "%s: %s" % (type(e).__name__, e.strerror or e)
        peer = what.get("peer_target")
        if not peer:
            return None
        held = holders([peer], _ancestors(pid), ctx).get(peer, [])
        pids = list(dict.fromkeys(p for p, _, _ in held if not _observer(p, ctx)))
        return [_process_wait(p, "peer", depth, seen, ctx) for p in pids[:MAX_OTHERS]]
    return None


def wait_facts(pid: int, depth: int = MAX_DEPTH) -> dict[str, Any]:
    """``lora_otel.evidence.wait.threads``: the waits of the process's threads on a descriptor, a path
    or a child (the main thread first), each with its other end followed ``depth`` processes along
    the chain; ``wait.error`` when none could be read. Never raises."""
    try:
        return _wait_facts(pid, depth)
    except Exception as e:  # noqa: BLE001 - evidence is best effort; the other facts stand
        return {KEY + "error": "%s: %s" % (type(e).__name__, e)}


def _wait_facts(pid: int, depth: int) -> dict[str, Any]:
    if not CALLS:
        return {KEY + "error": "system call numbers not known for %s" % (_MACHINE or "this machine")}
    try:
        tids = sorted((int(t) for t in os.listdir("/proc/%d/task" % pid)), key=lambda t: (t != pid, t))
    except OSError as e:
        return {KEY + "error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    try:
        rows = mounts(pid)
    except OSError:
        rows = None
    found: list[dict[str, Any]] = []
    errors: list[str] = []
    for tid in tids[:MAX_THREADS]:
        wait = thread_wait(pid, tid, rows)
        if wait is None:
            continue
        if "syscall_error" in wait:
            errors.append(wait["syscall_error"])
            continue
        found.append(wait)
    out: dict[str, Any] = {}
    if not found and errors:
        out[KEY + "error"] = "cannot read the threads' system calls: %s" % errors[0]
        return out
    seen = {pid}
    ctx: dict[str, Any] = {"job": pid}
    for wait in found[:8]:
        wait["cmdline"] = cmdline(pid)
        try:
            wait["state"] = _stat(pid)[0]
        except (OSError, IndexError):
            pass
    # The other end and the chain behind it: for the main thread's wait (the one the rules read), else
    # the first thread's; the others' waits are recorded as they are (a chain each would cost seconds
    # on a process with many threads in polls).
    first = next((w for w in found if w["main"]), found[0] if found else None)
    if first is not None:
        others = other_end(first, depth - 1, set(seen), ctx)
        if others is not None:
            first["other"] = others
    if found:
        out[KEY + "threads"] = found[:8]
        out.update(summary(found[0]))
    return out


def summary(wait: dict[str, Any]) -> dict[str, Any]:
    """The first wait, flat, for the stall record (which keeps scalar facts only): ``wait.call``
    (``read fd 0 pipe:[34094]``), ``wait.chain_pids`` (``4711, 4712``: the processes along its chain)."""
    what = wait.get("what") or {}
    call = "%s %s" % (wait.get("syscall"), "fd %s" % wait["fd"] if "fd" in wait else wait.get("path") or "")
    if what.get("target"):
        call += " " + str(what["target"])
    if what.get("mount") and what.get("fstype"):
        call += " (%s %s)" % (what["fstype"], what["mount"])
    pids: list[str] = []
    here = wait
    while len(pids) < MAX_DEPTH + 1:
        others = [o for o in here.get("other") or () if isinstance(o, dict) and "pid" in o]
        if not others:
            break
        pids.append(str(others[0]["pid"]))
        if others[0].get("loop"):
            break
        here = others[0]
    out: dict[str, Any] = {KEY + "call": call.strip()[:300]}
    if pids:
        out[KEY + "chain_pids"] = ", ".join(pids)
    return out
