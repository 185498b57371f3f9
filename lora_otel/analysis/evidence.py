"""Evidence about a stalled process, gathered from outside it: what a person would check by hand.

Each function returns a flat dict of attributes (``lora_otel.evidence.*``) for a span event, and
never raises: a fact that cannot be read (not Linux, permissions, the process gone) is left out
with the reason under ``lora_otel.evidence.<what>.error``.

- ``process_facts(pid)``: state and wait channel, CPU time and CPU % over a short sample, RSS,
  threads, I/O bytes (``/proc/<pid>/{stat,status,wchan,io}``);
- ``network_facts(pid)``: bytes received/sent by the process's network namespace
  (``/proc/<pid>/net/dev``), so two samples tell whether a download is moving;
- ``python_stacks(pid, request)``: ``py-spy dump --native`` when py-spy is installed and may
  attach — its Python frames are then the stacks (``python.stacks``, in faulthandler's format,
  appended to the stacks file) and no signal reaches the program; otherwise a file that asks the
  process's beat thread to write the dump (`ask_beat`: Python holding the GIL, nothing signalled);
  and where the beat cannot answer (a frozen process), the stack request
  signal → the preamble's ``faulthandler`` dump (works on a frozen process), sent only when
  `stack_request` verified that the process is still the traced image with lora_otel's handler on
  that signal. ``LORA_OTEL_PY_SPY=0`` in the watchdog's environment keeps py-spy off every process;
- ``file_lock_facts(pid, found)``: the lock file the process waits for and its holder
  (`lora_otel.analysis.filelocks`: ``/proc/locks``, its fds, py-spy's view of its locals);
- ``pipe_facts(pid)``: whether its stdout/stderr is a pipe, how full it is, which processes hold
  its read end and what they wait in, and which of its threads wait to write to a pipe;
- ``waitfacts.wait_facts(pid)``: the descriptor, path or child each thread waits on in a system
  call, what it is and what is at its other end, along the chain of waits (`lora_otel.analysis.waits`);
- ``gpu_facts(pid)``: GPU utilisation and the process's GPU memory through NVML (``nvidia-ml-py``)
  when available.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from lora_otel._boot.seam import memory_cgroup, redact
from lora_otel.analysis import filelocks, waitfacts
from lora_otel.analysis.filelocks import py_spy_path
from lora_otel.analysis.pools import idle_frames_only
from lora_otel.journal.reader import Journal, exec_phrase, image_changed, process_state

PREFIX = "lora_otel.evidence."


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _stat_fields(pid: int) -> list[str]:
    raw = _read("/proc/%d/stat" % pid)
    return raw[raw.rindex(")") + 2 :].split()  # fields from 3 (state) on


def process_facts(pid: int, sample_s: float = 0.2) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        hz = os.sysconf("SC_CLK_TCK")
        f0 = _stat_fields(pid)
        t0 = time.monotonic()
        best, best_state, off_cpu, last, error = _wait_channels(pid, t0 + sample_s)
        f1 = _stat_fields(pid)
        dt = time.monotonic() - t0
        cpu0 = (int(f0[11]) + int(f0[12])) / hz  # utime + stime
        cpu1 = (int(f1[11]) + int(f1[12])) / hz
        cpu_percent = round(100.0 * (cpu1 - cpu0) / dt, 1) if dt > 0 else 0.0
        # The wait is the channel read most often when the thread was off the CPU in half the reads
        # or used under half a CPU (a poll loop on a loaded machine: runnable, not running, between
        # its sleeps); a process that stopped or ended during the sample is so now: the last read's.
        if f1[0] in _GONE_OR_STOPPED:
            waits = (last[0] if last[1] == f1[0] else _wchan("/proc/%d/wchan" % pid), f1[0], error)
        elif last[1] in _GONE_OR_STOPPED:
            waits = (last[0], last[1], error)
        elif best and (off_cpu >= 0.5 or cpu_percent < 50):
            waits = (best, best_state, error)
        else:
            waits = ("", "", error)
        states = {
            "R": "running",
            "S": "sleeping",
            "D": "uninterruptible (disk) sleep",
            "T": "stopped",
            "t": "stopped by tracer",
            "Z": "zombie",
            "I": "idle",
        }
        state = waits[1] or f1[0]
        out[PREFIX + "process.state"] = "%s (%s)" % (state, states.get(state, "?"))
        out[PREFIX + "process.cpu_seconds"] = round(cpu1, 2)
        out[PREFIX + "process.cpu_percent"] = cpu_percent
        out[PREFIX + "process.threads"] = int(f1[17])
        out[PREFIX + "process.rss_bytes"] = int(f1[21]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError) as e:
        out[PREFIX + "process.error"] = str(e)
        return out
    wchan, _, error = waits
    if error:
        out[PREFIX + "process.wait_channel.error"] = error
    else:
        out[PREFIX + "process.wait_channel"] = wchan or "(none: on CPU or not shown)"
    try:
        io = dict(line.split(": ", 1) for line in _read("/proc/%d/io" % pid).splitlines() if ": " in line)
        out[PREFIX + "io.read_bytes"] = int(io.get("rchar", 0))
        out[PREFIX + "io.write_bytes"] = int(io.get("wchar", 0))
    except (OSError, ValueError) as e:
        out[PREFIX + "io.error"] = str(e)
    return out


_WAIT_READ_EVERY_S = 0.01


def _wait_channels(pid: int, until: float) -> tuple[str, str, float, tuple[str, str], str]:
    """The main thread's kernel wait channel over the sample until ``until`` (monotonic), read every
    10 ms: ``(channel read most often, the state letter read with it, the share of reads that found
    the thread off the CPU, (channel, state letter) of the last read, error)``. One read is not
    enough: a loop that polls with short sleeps (``while not done(): time.sleep(0.1)``) is caught
    awake between two sleeps now and then — on a loaded machine often, runnable and waiting for a
    CPU — and its wait is the sleep, not "on CPU" (`process_facts` decides)."""
    seen: dict[str, int] = {}
    state: dict[str, str] = {}
    reads = 0
    last = ("", "")
    while True:
        try:
            wchan = _read("/proc/%d/wchan" % pid).strip()
            letter = _stat_fields(pid)[0]
        except (OSError, IndexError) as e:
            if not reads:  # (unreadable: the CPU sample still takes its time)
                time.sleep(max(0.0, until - time.monotonic()))
                return "", "", 0.0, last, str(e)
            break
        reads += 1
        wchan = "" if wchan == "0" else wchan
        last = (wchan, letter)
        if wchan:
            seen[wchan] = seen.get(wchan, 0) + 1
            state.setdefault(wchan, letter)
        if time.monotonic() >= until:
            break
        time.sleep(min(_WAIT_READ_EVERY_S, max(0.0, until - time.monotonic())))
    if not seen:
        return "", "", 0.0, last, ""
    best = max(seen, key=lambda w: seen[w])
    return best, state[best], sum(seen.values()) / reads, last, ""


_GONE_OR_STOPPED = ("Z", "X", "x", "T", "t")
"""State letters of a process that ended (zombie, dead) or was stopped (a signal, a tracer)."""


def network_facts(pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        rx = tx = 0
        for line in _read("/proc/%d/net/dev" % pid).splitlines()[2:]:
            name, _, data = line.partition(":")
            if name.strip() == "lo":
                continue
            cols = data.split()
            rx += int(cols[0])
            tx += int(cols[8])
        out[PREFIX + "net.received_bytes"] = rx
        out[PREFIX + "net.sent_bytes"] = tx
    except (OSError, ValueError, IndexError) as e:
        out[PREFIX + "net.error"] = str(e)
        return out
    conns = tcp_connections(pid)
    if conns:
        out[PREFIX + "net.tcp_connections"] = conns[:20]
    return out


def memory_facts(pid: int, sample_s: float = 0.5) -> dict[str, Any]:
    """Memory pressure on the process, over ``sample_s``: RSS against its memory cgroup's limit
    (cgroup v2 ``memory.max``/``memory.high``, v1 ``memory.limit_in_bytes``), its major faults and
    the machine's swap-ins per second (``/proc/vmstat`` ``pswpin``), and the kernel's pressure
    figures (``/proc/pressure/memory``, and the cgroup's own ``memory.pressure`` on v2)."""
    out: dict[str, Any] = {}
    try:
        f0, swap0, t0 = _stat_fields(pid), _vmstat("pswpin"), time.monotonic()
        time.sleep(sample_s)
        f1, swap1, dt = _stat_fields(pid), _vmstat("pswpin"), time.monotonic() - t0
        out[PREFIX + "memory.major_faults_per_s"] = round((int(f1[9]) - int(f0[9])) / dt, 1)
        if swap0 is not None and swap1 is not None:
            out[PREFIX + "memory.swap_in_pages_per_s"] = round((swap1 - swap0) / dt, 1)
    except (OSError, ValueError, IndexError) as e:
        out[PREFIX + "memory.error"] = str(e)
        return out
    cgroup = memory_cgroup(pid)
    if cgroup is not None:
        for name in ("memory.max", "memory.high", "memory.limit_in_bytes"):
            try:
                value = _read(os.path.join(cgroup, name)).strip()
            except OSError:
                continue
            if value.isdigit() and int(value) < 1 << 60:
                out[PREFIX + "memory.limit_bytes"] = int(value)
                out[PREFIX + "memory.limit_from"] = os.path.join(cgroup, name)
                break
        for name in ("memory.current", "memory.usage_in_bytes"):
            try:
                out[PREFIX + "memory.cgroup_usage_bytes"] = int(_read(os.path.join(cgroup, name)).strip())
                break
            except (OSError, ValueError):
                continue
    for key, path in (
        ("memory.pressure", "/proc/pressure/memory"),
        ("memory.cgroup_pressure", os.path.join(cgroup or "/nonexistent", "memory.pressure")),
    ):
        try:
            for line in _read(path).splitlines():
                if line.startswith("some "):
                    fields = dict(part.split("=", 1) for part in line.split()[1:])
                    out[PREFIX + key + "_some_avg10"] = float(fields["avg10"])
        except (OSError, ValueError, KeyError):
            continue
    return out


def _vmstat(key: str) -> Optional[int]:
    try:
        for line in _read("/proc/vmstat").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def children_facts(
    pid: int, journals: Optional[dict[int, Journal]] = None, read_frames: bool = False
) -> dict[str, Any]:
    """The process's child processes (DataLoader workers among them): each as ``"pid state wchan
    cpu% [where its journal says it is]"`` under ``process.children``, from ``/proc`` (sampled 0.2 s)
    and ``journals`` (by pid) when one of them is its. ``read_frames``: a child whose journal does
    not say where it is gets its main thread's ``frames`` read from outside (py-spy, the watchdog
    only: `main_frames_from_outside`)."""
    try:
        kids: list[int] = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                kids += [int(k) for k in _read("/proc/%d/task/%s/children" % (pid, tid)).split()]
            except (OSError, ValueError):
                continue
    except OSError:
        return {}
    if not kids:
        return {}
    hz = os.sysconf("SC_CLK_TCK")
    first: dict[int, float] = {}
    for kid in kids:
        try:
            f = _stat_fields(kid)
            first[kid] = (int(f[11]) + int(f[12])) / hz
        except (OSError, ValueError, IndexError):
            continue
    time.sleep(0.2)
    rows = []
    unplaced: set[int] = set()
    for kid in kids[:32]:
        try:
            f = _stat_fields(kid)
            cpu = 100.0 * ((int(f[11]) + int(f[12])) / hz - first.get(kid, 0.0)) / 0.2
            wchan = _read("/proc/%d/wchan" % kid).strip() or "-"
            # another program's command line: secret-named options' values removed (`redact_argv`)
            cmd = " ".join(redact.redact_argv(_read("/proc/%d/cmdline" % kid).rstrip("\0").split("\0"))).strip()
        except (OSError, ValueError, IndexError):
            continue
        row = {
            "pid": kid,
            "state": f[0],
            "wchan": wchan if wchan != "0" else "-",
            "cpu_percent": round(cpu),
            "cmdline": cmd[:200],
        }
        other = (journals or {}).get(kid) or _open_journal_of(kid)
        if other is not None:
            row["journal"] = other.path
            row["where"] = _where(other)
            if idle_frames_only(getattr(other, "main_frames", None) or []):
                unplaced.add(kid)  # its beat kept only the queue's own frames: where it waits is deeper
        else:
            unplaced.add(kid)
        rows.append(row)
    if read_frames:  # a worker that never beats (a forked one blocked at once) says nothing itself
        for row in [r for r in rows if r["pid"] in unplaced or not r.get("where")][:MAX_CHILD_FRAMES]:
            kid_pid = row["pid"]
            if not isinstance(kid_pid, int):
                continue
            frames = main_frames_from_outside(kid_pid)
            if frames:
                row["frames"] = frames
        natives = 0
        for row in rows[:MAX_CHILD_SYSCALLS]:
            kid_pid = row["pid"]
            if not isinstance(kid_pid, int):
                continue
            if natives < MAX_CHILD_NATIVE and native_wait_likely(row, (journals or {}).get(kid_pid)):
                natives += 1
                row.update(native_facts(kid_pid))
            elif row.get("state") == "S" and str(row.get("wchan", "")).startswith("futex"):
                row.update(thread_syscalls(kid_pid))  # (nothing paused: which library its futex wait is in)
    return {PREFIX + "process.children": rows} if rows else {}


MAX_CHILD_NATIVE = 2
"""At most this many children read with ``py-spy dump --native`` at one stall (about a second each
on a process that loaded torch: its symbols)."""
MAX_CHILD_SYSCALLS = 8
"""At most this many children's threads' system calls read at one stall (a few milliseconds each)."""
MAX_NATIVE_FRAMES = 40
MAX_NATIVE_THREADS = 256


def native_wait_likely(row: dict[str, Any], journal: Optional[Journal] = None) -> bool:
    """Whether a child's ``process.children`` row looks like a worker waiting in native code, worth a
    look at its native frames: asleep on a futex (a lock or condition: a library's, or Python's
    own) with its main thread in the program's code, not in the pool's wait for its next task
    (its journal's beat sample or the frames read from outside)."""
    if row.get("state") != "S" or not str(row.get("wchan", "")).startswith("futex"):
        return False
    frames = row.get("frames")
    if isinstance(frames, list) and frames:
        return not idle_frames_only(frames)
    if journal is None:
        pid = row.get("pid")
        journal = _open_journal_of(pid) if isinstance(pid, int) else None
    sample = getattr(journal, "main_frames", None) if journal is not None else None
    return bool(sample) and not idle_frames_only(sample or [])


def thread_syscalls(pid: int) -> dict[str, Any]:
    """The shared objects of `native.LIBRARIES` process ``pid`` has mapped (``libraries``, from
    ``/proc/<pid>/maps``) and the object each of its threads' system call is made from (``syscalls``:
    ``[tid, object]``, the main thread first; the program counter of ``/proc/<pid>/task/<tid>/syscall``
    looked up in the maps: nothing paused, nothing signalled); {} when they cannot be read."""
    from lora_otel.analysis import native

    out: dict[str, Any] = {}
    try:
        maps = _read("/proc/%d/maps" % pid)
        tids = sorted(os.listdir("/proc/%d/task" % pid), key=lambda t: (t != str(pid), t))
    except OSError:
        return out
    out["libraries"] = native.known_objects(maps)
    ranges = native.executable_ranges(maps)
    calls = []
    for tid in tids[:MAX_NATIVE_THREADS]:
        try:
            calls.append([int(tid), native.syscall_object(_read("/proc/%d/task/%s/syscall" % (pid, tid)), ranges)])
        except (OSError, ValueError):
            continue
    out["syscalls"] = calls
    return out


def native_facts(pid: int) -> dict[str, Any]:
    """What tells which native library process ``pid``'s main thread waits in (`lora_otel.analysis.native`):
    the shared objects of `native.LIBRARIES` it has mapped (``libraries``, from ``/proc/<pid>/maps``),
    the object each of its threads' system call is made from (``syscalls``: ``[tid, object]``, the
    main thread first; ``/proc/<pid>/task/<tid>/syscall``'s program counter: nothing paused), and
    its main thread's frames read by ``py-spy dump --native`` (``native``: ``[symbol, place]``
    innermost first) — or why not (``native_error``): no py-spy, or a thread in a call that the
    pause would interrupt (`stop_would_interrupt`)."""
    from lora_otel.analysis import native

    out = thread_syscalls(pid)
    if not out:
        return out
    spy = py_spy_path()
    if spy is None:
        out["native_error"] = "py-spy is not installed"
        return out
    if _stopped(pid):
        out["native_error"] = "the process is stopped"
        return out
    disturbed = stop_would_interrupt(pid)
    if disturbed:
        out["native_error"] = "%s, which pausing the process would interrupt" % disturbed
        return out
    try:
        r = subprocess.run(
            [spy, "dump", "--native", "--full-filenames", "--pid", str(pid)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        out["native_error"] = str(e)
        return out
    if r.returncode != 0:
        lines = [line.strip() for line in r.stderr.splitlines() if line.strip()]
        out["native_error"] = (lines[-1] if lines else "exit %d" % r.returncode)[:200]
        return out
    frames = native.main_thread_frames(r.stdout)
    if frames:
        out["native"] = [list(f) for f in frames[:MAX_NATIVE_FRAMES]]
    return out


def _open_journal_of(pid: int) -> Optional[Journal]:
    """The journal process ``pid`` holds open (a traced DataLoader worker's, a pool worker's),
    found through ``/proc/<pid>/fd``; None when it holds none or it cannot be read."""
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.endswith(".otel.jsonl"):
            try:
                from lora_otel.journal.reader import read_journal

                found = read_journal(target)
            except Exception:  # noqa: BLE001 - unreadable or gone: no journal to tell where it is
                return None
            return found if found.pid == pid else None
    return None


MAX_CHILD_FRAMES = 4
"""At most this many children read with py-spy at one stall (each read takes a few tenths of a second)."""
_SPY_THREAD = re.compile(r'^Thread (?:0x[0-9a-fA-F]+|\d+) \([^)]*\)(?::\s*"([^"]*)")?')
_SPY_FRAME = re.compile(r"^\s+(\S+) \((.*):(\d+)\)\s*$")


def main_frames_from_outside(pid: int) -> Optional[list[list[Any]]]:
    """The main thread's Python frames of process ``pid`` as the beat would sample them (``[file,
    line, function]``, outermost first), read by ``py-spy dump --nonblocking`` (nothing paused, no
    signal); None without py-spy, or when it cannot read the process."""
    spy = py_spy_path()
    if spy is None or _stopped(pid):
        return None
    try:
        r = subprocess.run(
            [spy, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    frames: list[list[Any]] = []
    main = False
    for line in r.stdout.splitlines():
        head = _SPY_THREAD.match(line)
        if head:
            if main:
                break
            main = head.group(1) == "MainThread"
            continue
        frame = _SPY_FRAME.match(line) if main else None
        if frame:
            frames.append([frame.group(2), int(frame.group(3)), frame.group(1).rsplit(".", 1)[-1]])
    return frames[::-1] or None


def _where(journal: Journal) -> str:
    """Where a journal says its process is: the main thread's frames (the beat's ``main``), else
    the deepest open span."""
    frames = getattr(journal, "main_frames", None)
    if frames:
        try:
            from lora_otel.journal import reader

            return reader.where_text(frames)
        except Exception:  # noqa: BLE001 - the BEAT formatter may not be here yet
            pass
    from lora_otel.journal.tree import deepest_open_span

    span = deepest_open_span(journal)
    return "in %s" % span.name if span is not None and span is not journal.root else ""


_TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


def _addr(hexaddr: str) -> str:
    ip, _, port = hexaddr.partition(":")
    host = ".".join(str(int(ip[i : i + 2], 16)) for i in (6, 4, 2, 0)) if len(ip) == 8 else "[ipv6]"
    return "%s:%d" % (host, int(port, 16))


def tcp_connections(pid: int) -> list[str]:
    """The process's own TCP sockets as ``"local -> remote STATE"`` (from its fds and /proc/net/tcp*)."""
    try:
        inodes = set()
        fd_dir = "/proc/%d/fd" % pid
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        out = []
        for table in ("tcp", "tcp6"):
            try:
                rows = _read("/proc/%d/net/%s" % (pid, table)).splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if len(cols) > 9 and cols[9] in inodes:
                    out.append("%s -> %s %s" % (_addr(cols[1]), _addr(cols[2]), _TCP_STATES.get(cols[3], cols[3])))
        return out
    except OSError:
        return []


@dataclass(frozen=True)
class StackRequest:
    """How to ask a traced process for its Python stacks: send ``signal``, read ``path``.

    ``refusal``: why the signal must not be sent now (then only py-spy and /proc are used, and the
    evidence says why under ``lora_otel.evidence.python.stacks.error``); None when verified.
    """

    signal: int
    path: str
    refusal: Optional[str] = None
    tid: Optional[int] = None
    """The thread the signal is sent to (``tgkill``): one that runs the handler — it does not block
    the signal and waits in no ``sigwait`` — so that no other thread can take the request as the
    program's own signal; None: the whole process (``kill``)."""
    file: Optional[tuple[int, int]] = None
    """The stacks file's (device, inode) as the journal recorded it: a dump read from outside is
    appended to ``path`` only while it is still that file."""
    ask: Optional[str] = None
    """The file whose creation asks the process's beat thread for the dump (``lora_otel.stacks.ask``),
    when the process is still the traced one and its stacks file still its descriptor's — whatever
    the signal's own refusal: no signal is involved; None: only the signal can ask."""
    beat_s: float = 1.0
    """The process's beat interval (its journal's ``config.beat_s``): how often the beat looks."""


def stack_request(journal: Journal) -> Optional[StackRequest]:
    """The stack request for the journal's process, verified now; None when it has no stack handler.

    Before every request: the process runs with the journal's start time; it is the same image
    (no ``exec`` record; ``/proc/<pid>/exe`` and auxv as recorded); lora_otel still claims the
    signal (no ``lora_otel.stacks.off``); ``/proc/<pid>/status`` shows the signal caught; and the
    descriptor faulthandler writes to is still the stacks file (dev, ino), so that a dump can never
    land in a file of the program's. Any check failing gives a `StackRequest` with a ``refusal``.
    """
    attrs = journal.root.attrs if journal.root is not None else {}
    path, signum = attrs.get("lora_otel.stacks.path"), attrs.get("lora_otel.stacks.signal")
    if not isinstance(path, str) or not path:
        off = attrs.get("lora_otel.stacks.off")
        if isinstance(off, str) and isinstance(signum, int):
            return StackRequest(signum, "", "not requested: %s" % off)
        return None
    if not isinstance(signum, int) or isinstance(signum, bool):
        # Written by a lora_otel that registered SIGUSR1 without saying so: not verifiable.
        return StackRequest(0, path, "not requested: the journal does not say which signal its stack handler is on")
    refusal = _refusal(journal, attrs, signum)
    tid = None
    if refusal is None and journal.pid:
        tid, why = handler_thread(journal.pid, signum)
        if tid is None:
            refusal = "not requested: %s; the program would receive signal %d itself" % (why, signum)
    file_id = attrs.get("lora_otel.stacks.file")
    ident = (file_id[0], file_id[1]) if isinstance(file_id, list) and len(file_id) == 2 else None
    ask = attrs.get("lora_otel.stacks.ask")
    if not isinstance(ask, str) or not ask or _refusal(journal, attrs, signum, signal=False) is not None:
        ask = None
    beat_s = journal.config.get("beat_s") if isinstance(journal.config, dict) else None
    beat_s = float(beat_s) if isinstance(beat_s, (int, float)) and not isinstance(beat_s, bool) else 1.0
    return StackRequest(signum, path, refusal, tid, ident, ask, min(max(beat_s, 0.01), 10.0))


def _refusal(journal: Journal, attrs: dict[str, Any], signum: int, signal: bool = True) -> Optional[str]:
    """Why the request must not be made now, or None. ``signal=False``: only the checks that
    matter to a request through the beat (the process is the traced image, its descriptor still the
    stacks file), not those of the signal (lora_otel still handles it)."""
    pid = journal.pid
    state = process_state(journal)
    if state == "exec'd":
        return "not requested: the process %s" % exec_phrase(journal)
    if state != "running" or not pid:
        return "not requested: the process is gone"
    off = attrs.get("lora_otel.stacks.off")
    if isinstance(off, str) and signal:
        return "not requested: %s" % off
    if not journal.image:
        return "not requested: the journal does not identify the process's program image"
    if image_changed(journal):  # checked again: the state above may predate an exec
        return "not requested: the process %s" % exec_phrase(journal)
    caught = caught_signals(pid) if signal else -1
    if caught is None:
        return "not requested: cannot read /proc/%d/status to see which signals it catches" % pid
    if not caught & (1 << (signum - 1)):
        return "not requested: signal %d is not caught in the process any more (its handler was reset)" % signum
    fd, file_id = attrs.get("lora_otel.stacks.fd"), attrs.get("lora_otel.stacks.file")
    if not isinstance(fd, int) or not isinstance(file_id, list) or len(file_id) != 2:
        return "not requested: the journal does not identify the stacks file's descriptor"
    try:
        st = os.stat("/proc/%d/fd/%d" % (pid, fd))
    except OSError:
        return "not requested: descriptor %d of the process is closed (the stack dump would go nowhere)" % fd
    if [st.st_dev, st.st_ino] != list(file_id):
        return (
            "not requested: descriptor %d of the process is no longer the stacks file (a dump would "
            "land in another file)" % fd
        )
    return None


def handler_thread(pid: int, signum: int) -> tuple[Optional[int], str]:
    """(the thread to send ``signum`` to, "") or (None, why there is none).

    A handler only runs in a thread that does not block the signal. A signal sent to the whole
    process may go to any thread that does not block it — including one in ``signal.sigwait`` /
    ``sigtimedwait`` (whose mask is lifted for the waited set while it waits: ``do_sigtimedwait`` is
    its wait channel), and when every thread blocks it, it stays pending until the program takes it
    itself (``sigwait``, a ``signalfd``). Sent to one thread (``tgkill``) that does not block it and
    is in no sigwait, only that thread's handler can take it: a program whose helper threads block
    every signal (pyarrow's jemalloc thread, the beat itself) is still asked. The main thread is
    preferred. None when no thread qualifies, or ``tgkill`` is not known here and some thread blocks it."""
    bit = 1 << (signum - 1)
    try:
        tids = sorted(os.listdir("/proc/%d/task" % pid), key=lambda t: (t != str(pid), t))
    except OSError:
        return None, "cannot read the threads of process %d" % pid
    free: list[int] = []
    taker = ""
    deadline = time.monotonic() + REREAD_S  # (for reading running threads again: `_signal_state`)
    for tid in tids[:4096]:
        try:
            status, wchan = _signal_state(pid, tid, bit, deadline)
        except OSError:
            continue
        if "sigtimedwait" in wchan:
            taker = taker or "thread %s of the process waits for signals (sigwait)" % tid
            continue
        blocked = next((line for line in status.splitlines() if line.startswith("SigBlk:")), "")
        try:
            blocks = bool(int(blocked.split(":", 1)[1].strip(), 16) & bit) if blocked else True
        except ValueError:
            blocks = True
        if blocks:
            taker = taker or "thread %s of the process blocks signal %d (to take it with sigwait or a signalfd)" % (
                tid,
                signum,
            )
            continue
        if not status.startswith("Name:") or "\nState:\tZ" in status or "\nState:\tX" in status:
            continue
        free.append(int(tid))
    if not free:
        return None, taker or "no thread of the process runs a signal handler"
    if _TGKILL is None and taker:
        return None, taker + " (and signals cannot be sent to one thread here)"
    return free[0], ""


REREAD_S = 0.25
"""How long `handler_thread` reads threads that seem to run with the signal open again, for all the
threads of a process together (`_signal_state`). A thread that truly runs costs this much once per
stack request; 30 ms was too short on a loaded machine (the thread entering ``sigtimedwait`` waited
that long for a CPU)."""


def _signal_state(pid: int, tid: str, bit: int, deadline: float) -> tuple[str, str]:
    """A thread's status and wait channel, read in that order. A thread entering ``sigtimedwait``
    has the waited signals lifted from its mask a moment before it sleeps there: read then, it looks
    like a running thread that does not block the signal (seen on a loaded machine). So a thread that
    seems to be running with the signal open is read again, every 2 ms until ``deadline`` (`REREAD_S`
    for all the threads), until it sleeps somewhere, blocks the signal, or goes on running."""
    while True:
        status = _read("/proc/%d/task/%s/status" % (pid, tid))
        wchan = _read("/proc/%d/task/%s/wchan" % (pid, tid))
        if wchan.strip() not in ("", "0"):
            break
        blocked = next((line for line in status.splitlines() if line.startswith("SigBlk:")), "")
        try:
            if not blocked or int(blocked.split(":", 1)[1].strip(), 16) & bit:
                break
        except ValueError:
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.002)
    return status, wchan


_TGKILL = {"x86_64": 234, "aarch64": 131, "arm64": 131, "riscv64": 131, "ppc64le": 250, "ppc64": 250, "s390x": 241}.get(
    os.uname().machine
)
"""The ``tgkill`` system call's number on this machine (Python has no ``os.tgkill``), or None."""


def send_request(pid: int, request: StackRequest) -> None:
    """Send the request's signal: to its thread with ``tgkill`` where it has one, else to ``pid``.
    Raises OSError as ``os.kill`` does.

    It is sent at a moment when no other thread of the process is running (`_quiet_moment`, up to
    `QUIET_WAIT_S`): faulthandler's handler walks every thread's frames without the GIL, and a
    thread running Python meanwhile (the beat at its work) can change them under it — a dump that
    crashed the process with SIGSEGV was seen so (tests/test_stack_requests.py, the full suite)."""
    _quiet_moment(pid, request.tid)
    if request.tid is not None and _TGKILL is not None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_TGKILL, pid, request.tid, request.signal) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return
    os.kill(pid, request.signal)


QUIET_WAIT_S = 1.0
"""How long `send_request` waits for a moment when no other thread of the process runs."""


def _quiet_moment(pid: int, tid: Optional[int], wait_s: float = QUIET_WAIT_S) -> bool:
    """Wait until no thread of ``pid`` but ``tid`` is running (state ``R`` in its ``stat``), up to
    ``wait_s``; True when such a moment came. It narrows the race, it cannot close it: a thread
    may wake between this look and the signal."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError:
            return False
        busy = False
        for t in tids[:4096]:
            if tid is not None and t == str(tid):
                continue
            try:
                stat = _read("/proc/%d/task/%s/stat" % (pid, t))
            except OSError:
                continue
            if stat.rsplit(")", 1)[-1].split()[:1] == ["R"]:
                busy = True
                break
        if not busy:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def caught_signals(pid: int) -> Optional[int]:
    """The ``SigCgt`` mask of ``/proc/<pid>/status`` (bit ``n - 1`` for signal ``n``), or None."""
    try:
        for line in _read("/proc/%d/status" % pid).splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split(":", 1)[1].strip(), 16)
    except (OSError, ValueError):
        return None
    return None


FROM_OUTSIDE = "py-spy, read from outside (no signal sent)"
"""``python.stacks.from`` of stacks that py-spy read: the program received nothing."""
FROM_BEAT = "lora_otel's beat thread, asked through a file (no signal sent)"
"""``python.stacks.from`` of stacks that the process's beat thread wrote when asked (`ask_beat`)."""


def ask_beat(request: StackRequest, wait_s: Optional[float] = None) -> str:
    """Ask the process's beat thread for its Python stacks: create the request's ask file and wait
    (``wait_s``; default: one beat interval and a second) for the beat to write the dump to the
    stacks file and remove the ask file. The dump (what the file gained), or "" when the beat did
    not answer — a frozen process, whose beat cannot run — and then the ask file is removed here.

    The beat writes the dump holding the GIL, so no frame changes under it; the stack request
    signal, whose handler walks the frames without the GIL, is for a process whose beat cannot
    answer (`python_stacks`)."""
    if not request.ask or not request.path:
        return ""
    wait = request.beat_s + 1.0 if wait_s is None else wait_s
    try:
        before = os.path.getsize(request.path)
    except OSError:
        return ""
    try:
        os.close(os.open(request.ask, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass  # another watchdog's request, or one left behind: the beat answers both at once
    except OSError:
        return ""
    deadline = time.monotonic() + wait
    answered = False
    while time.monotonic() < deadline:
        if not os.path.lexists(request.ask):
            answered = True
            break
        time.sleep(0.02)
    if not answered:
        try:
            os.unlink(request.ask)
        except OSError:
            pass
        return ""
    from lora_otel._boot.seam import files

    try:
        with open(files.open_regular(request.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            if request.file is not None:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != request.file:
                    return ""
            f.seek(before)
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def python_stacks(
    pid: int,
    request: Optional[StackRequest],
    wait_s: float = 1.5,
    py_spy: bool = True,
    native: bool = False,
    pause: bool = False,
) -> dict[str, Any]:
    """The process's Python stacks: read from outside by py-spy where it can attach (``py_spy``
    True), else asked of its beat thread, else with the request's signal and read from what its
    faulthandler wrote.

    py-spy first: its dump (``py_spy.dump``, native frames too) gives the stacks in faulthandler's
    format (``python.stacks``, ``python.stacks.from`` = `FROM_OUTSIDE`; appended to the stacks
    file, where ``inspect`` and the report read the last dump) and no signal is sent. Without
    py-spy, or when it cannot read the process (ptrace refused): a process that is not frozen
    (``native`` False) is asked through its beat thread (`ask_beat`, `FROM_BEAT`), which writes the
    dump holding the GIL; the signal only when that gets no answer (a frozen process), and no signal when
    ``request`` is None (no handler) or carries a ``refusal`` (then the refusal is the
    ``python.stacks.error``). A stopped process (SIGSTOP, a debugger) cannot answer until it
    continues, so it is not waited for: the signal stays pending and the dump lands in the stacks
    file when it resumes.

    ``pause``: a process that is not frozen whose native frames are worth a pause all the same (its
    main thread waits in a known library's own call: `thread_syscalls`); it is otherwise read as
    any process that is not frozen.
    """
    out: dict[str, Any] = {}
    asked = request if request is not None and request.ask and not native else None
    if py_spy:
        out.update(py_spy_dump(pid, native or pause))
        text = as_faulthandler(str(out.get(PREFIX + "py_spy.dump") or ""))
        if text:
            out[PREFIX + "python.stacks"] = text[-16000:]
            out[PREFIX + "python.stacks.from"] = FROM_OUTSIDE
            if request is not None and not request.refusal:
                append_dump(request, text)
            request = None
    try:
        state = _stat_fields(pid)[0]
    except (OSError, IndexError):
        state = ""
    if request is not None and request.ask and not native and state not in ("T", "t", "Z", "X", ""):
        text = ask_beat(request)
        if text:
            out[PREFIX + "python.stacks"] = text[-16000:]
            out[PREFIX + "python.stacks.from"] = FROM_BEAT
            request = None
    if request is not None and request.refusal:
        out[PREFIX + "python.stacks.error"] = request.refusal
        request = None
    if request is not None and state in ("T", "t"):
        try:
            send_request(pid, request)
        except OSError:
            pass
        out[PREFIX + "python.stacks.error"] = (
            "the process is stopped; its stacks will be written to %s when it continues" % request.path
        )
        request = None
    if request is not None:
        stacks_path = request.path
        try:
            before = os.path.getsize(stacks_path) if os.path.exists(stacks_path) else 0
            send_request(pid, request)
            deadline = time.monotonic() + wait_s
            text = ""
            while time.monotonic() < deadline:
                if os.path.exists(stacks_path) and os.path.getsize(stacks_path) > before:
                    time.sleep(0.05)  # let the dump finish
                    from lora_otel._boot.seam import files

                    with open(files.open_regular(stacks_path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                        f.seek(before)
                        text = f.read().decode("utf-8", "replace")
                    break
                time.sleep(0.02)
            if text:
                out[PREFIX + "python.stacks"] = text[-16000:]
                out[PREFIX + "python.stacks.from"] = "the stack request signal %d (faulthandler)" % request.signal
            else:
                out[PREFIX + "python.stacks.error"] = NO_DUMP % (wait_s, request.signal)
        except OSError as e:
            out[PREFIX + "python.stacks.error"] = str(e)
    # -- file locks: told by the stacks, py-spy's included (analysis/filelocks.py) --
    out.update(file_lock_facts(pid, out))
    # -- a hub download of a model already cached (analysis/hubcache.py) --
    out.update(hub_facts(pid, out))
    # -- a poll loop: what it polls and that object's state (analysis/pollfacts.py) --
    beat = asked if out.get(PREFIX + "python.stacks.from") != FROM_BEAT else None
    out.update(poll_facts(pid, out, ask=(lambda: ask_beat(beat)) if beat is not None else None))
    return out


STOP_INTERRUPTS = (
    "do_sigtimedwait",
    "ep_poll",
    "do_epoll_wait",
    "do_semtimedop",
    "sk_wait_data",
    "inet_csk_accept",
    "inet_csk_wait_for_connect",
    "wait_woken",
    "sk_stream_wait_memory",
    "unix_stream_read_generic",
    "unix_stream_data_wait",
    "__skb_wait_for_more_packets",
    "read_events",
    "inotify_read",
)
"""Kernel wait channels of calls that a stop (ptrace's included) ends with ``EINTR`` instead of
restarting them (signal(7): ``sigtimedwait``, ``epoll_wait``, ``semop``, a socket with a timeout,
``io_getevents``): a thread in one is not paused for native stacks. (Measured: ``py-spy dump``
pausing a ``signal.sigtimedwait`` loop made it return a signal nobody sent.)"""


def stop_would_interrupt(pid: int) -> Optional[str]:
    """``thread 4712 waits in do_sigtimedwait``: a thread of ``pid`` that a ptrace stop would disturb
    (`STOP_INTERRUPTS`), or None."""
    try:
        tids = sorted(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return None
    for tid in tids[:512]:
        try:
            wchan = _read("/proc/%d/task/%s/wchan" % (pid, tid)).strip()
        except OSError:
            continue
        if wchan.split(".", 1)[0] in STOP_INTERRUPTS:  # do_sigtimedwait.isra.0: the compiler's suffix
            return "thread %s waits in %s" % (tid, wchan)
    return None


NOT_PAUSED = "not read: only a frozen process is paused for its native stacks (a pause can interrupt its system calls)"


def py_spy_dump(pid: int, native: bool = True) -> dict[str, Any]:
    """``py-spy dump`` of the process (``py_spy.dump``), or why not (``py_spy.error``: the first
    line of py-spy's complaint, such as a ptrace refusal); nothing when py-spy is not installed.

    ``native``: ``--native``, which pauses the process while it reads (ptrace) — asked only for a
    frozen process, whose GIL question needs native frames, and whose threads cannot run into a new
    system call meanwhile (they wait for the GIL); and even then, when a thread waits in a call a
    stop would interrupt (`stop_would_interrupt`), it is read ``--nonblocking``. Otherwise
    ``--nonblocking`` — Python frames only, nothing paused: a running thread can enter
    ``sigtimedwait`` between a look at its wait channel and the pause, and a pause there makes it
    return a signal nobody sent. ``py_spy.native_error`` says why native frames were not read."""
    spy = py_spy_path()
    if spy is None:
        return {}
    if _stopped(pid):  # ptrace on a job-control stop changes how it resumes: not touched
        return {PREFIX + "py_spy.error": "not read: the process is stopped (SIGSTOP, or a debugger holds it)"}
    disturbed = stop_would_interrupt(pid) if native else None
    mode = "--native" if native and not disturbed else "--nonblocking"
    try:
        r = subprocess.run(
            [spy, "dump", mode, "--full-filenames", "--pid", str(pid)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {PREFIX + "py_spy.error": str(e)}
    if r.returncode == 0:
        out = {PREFIX + "py_spy.dump": r.stdout[-16000:]}
        if disturbed:
            out[PREFIX + "py_spy.native_error"] = "not read: %s, which pausing the process would interrupt" % disturbed
        elif not native:
            out[PREFIX + "py_spy.native_error"] = NOT_PAUSED
        return out
    lines = [line.strip() for line in r.stderr.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("Error:")), lines[0] if lines else "exit %d" % r.returncode)
    return {PREFIX + "py_spy.error": said[len("Error:") :].strip() if said.startswith("Error:") else said}


_SPY_ANY_FRAME = re.compile(r"^\s+(\S+) \((.*)\)\s*$")


def as_faulthandler(dump: str) -> str:
    """The Python frames of a ``py-spy dump`` in faulthandler's format (what the stack request
    writes, and every reader of ``python.stacks`` parses): one ``Thread 0x… (most recent call
    first):`` block per thread — ``Current thread`` for the main one — with ``File "…", line N in
    f`` lines, innermost first; native frames left out. '' when the dump has no Python frame."""
    from lora_otel.analysis.gil import _is_python

    blocks: list[list[str]] = []
    for line in dump.splitlines():
        head = _SPY_THREAD.match(line)
        if head:
            try:
                ident = int(line.split()[1], 0)
            except (IndexError, ValueError):
                ident = 0
            kind = "Current thread" if head.group(1) == "MainThread" else "Thread"
            blocks.append(["%s 0x%016x (most recent call first):" % (kind, ident)])
            continue
        frame = _SPY_ANY_FRAME.match(line)
        if frame and blocks and _is_python(frame.group(2)):
            file, _, number = frame.group(2).rpartition(":")
            func = frame.group(1).rsplit(".", 1)[-1]  # py-spy's qualified name (Thread.run); faulthandler's is run
            blocks[-1].append('  File "%s", line %s in %s' % (file, number, func))
    blocks.sort(key=lambda b: not b[0].startswith("Current thread"))  # faulthandler's order: the current one first
    return "\n".join("\n".join(b) for b in blocks if len(b) > 1)


def stacks_from_outside(pid: int, timeout_s: float = 5.0) -> str:
    """The Python stacks of ``pid`` in faulthandler's format, read by ``py-spy dump --nonblocking``
    (nothing paused, no signal); '' without py-spy or when it cannot read the process."""
    spy = py_spy_path()
    if spy is None or _stopped(pid):
        return ""
    try:
        r = subprocess.run(
            [spy, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return as_faulthandler(r.stdout) if r.returncode == 0 else ""


def append_dump(request: StackRequest, text: str) -> None:
    """Append a dump read from outside to the request's stacks file, as a dump of the process's own
    would be, so that ``inspect`` and the report show it; only while the path is still the file the
    journal recorded (never created, never a symlink followed)."""
    if not request.path or request.file is None:
        return
    try:
        fd = os.open(  # (never blocks: O_NONBLOCK; the identity below says whether it is the stacks file)
            request.path,
            os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC,
        )
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == tuple(request.file):
            os.write(fd, (text.rstrip("\n") + "\n\n").encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)


def _stopped(pid: int) -> bool:
    """Whether the process is stopped now (state ``T``/``t``: SIGSTOP, a debugger)."""
    try:
        return _stat_fields(pid)[0] in ("T", "t")
    except (OSError, IndexError):
        return False


NO_DUMP = "no dump within %.0f s after signal %d (a handler of the program's own, set from C, may have it)"
"""The ``python.stacks.error`` of a request nothing answered; a follower asks that process no more."""


def refuse_after_silence(request: Optional[StackRequest]) -> Optional[StackRequest]:
    """``request`` refused, once an earlier one to the same process got no dump."""
    if request is None or request.refusal:
        return request
    return replace(
        request, refusal="not requested: an earlier request got no dump (the signal may be handled by the program in C)"
    )


class StackAsker:
    """Evidence for one followed process, asking for its stacks (`stack_request`, with its checks)
    until a request goes unanswered; after that, that process is asked no more. The sidecar's live
    follower and the local watchdog both gather through one of these."""

    def __init__(self, gather_fn: Any) -> None:
        self.gather = gather_fn  # (pid, request[, native]) -> evidence dict, `gather` by default
        self.unanswered = False
        try:
            import inspect

            self.takes_native = "native" in inspect.signature(gather_fn).parameters
        except (TypeError, ValueError):
            self.takes_native = False  # a function of the caller's that takes (pid, request) only

    def __call__(self, journal: Journal, native: bool = False) -> dict[str, Any]:
        """``native``: the stall is a frozen one (`gather`)."""
        request = stack_request(journal)
        if self.unanswered:
            request = refuse_after_silence(request)
        if not journal.pid:
            evidence: dict[str, Any] = {}
        else:
            native = native and self.takes_native
            evidence = self.gather(journal.pid, request, native=True) if native else self.gather(journal.pid, request)
        if str(evidence.get(PREFIX + "python.stacks.error", "")).startswith(NO_DUMP.split("%")[0]):
            self.unanswered = True
        return evidence


def gpu_facts(pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        import pynvml  # type: ignore[import-not-found, import-untyped, unused-ignore]  # nvidia-ml-py: optional, untyped
    except ImportError:
        out[PREFIX + "gpu.error"] = "nvidia-ml-py not installed"
        return out
    try:
        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out[PREFIX + "gpu.%d.utilization_percent" % i] = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            used = 0
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid == pid and p.usedGpuMemory:
                    used += int(p.usedGpuMemory)
            out[PREFIX + "gpu.%d.process_memory_bytes" % i] = used
    except Exception as e:  # noqa: BLE001 - NVML raises its own error types; evidence is best effort
        out[PREFIX + "gpu.error"] = "NVML: %s" % e
    return out


def read_chars(pid: int) -> Optional[int]:
    """All bytes the process has read so far (``rchar`` of ``/proc/<pid>/io``), or None."""
    try:
        for line in _read("/proc/%d/io" % pid).splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def gather(pid: int, request: Optional[StackRequest], native: bool = False) -> dict[str, Any]:
    """Everything above, in one dict (``request``: from `stack_request`, or None for no signal;
    ``native``: a frozen process, whose native stacks py-spy may pause it to read)."""
    out: dict[str, Any] = {}
    before, started = read_chars(pid), time.monotonic()
    out.update(process_facts(pid))
    out.update(network_facts(pid))
    after, elapsed = read_chars(pid), time.monotonic() - started
    if before is not None and after is not None and elapsed > 0:  # is a download moving? (diagnose)
        out[PREFIX + "io.read_bytes_per_s"] = round((after - before) / elapsed, 1)
        out[PREFIX + "io.sampled_s"] = round(elapsed, 2)
    out.update(gpu_facts(pid))
    out.update(memory_facts(pid))
    out.update(children_facts(pid, read_frames=True))
    # -- pipes: a stdout/stderr pipe nobody reads (analysis/pipes.py) --
    out.update(pipe_facts(pid))
    # -- what each thread waits on (a descriptor, a path, a child) and its other end (analysis/waits.py) --
    out.update(waitfacts.wait_facts(pid))
    # -- the library its main thread's system call is made from (analysis/native.py) --
    calls = thread_syscalls(pid)
    for key, value in calls.items():
        out[PREFIX + "native." + key] = value
    # The stacks last: py-spy takes its own time (a second on a torch process, more under memory
    # pressure, where it competes for the same cgroup), which must not shift the samples above;
    # the signal is sent only when py-spy could not read them. Native frames are read (a pause)
    # for a frozen process, and for one whose main thread waits in a known library's own call.
    pause = not native and _waits_in_library(pid, calls)
    out.update(python_stacks(pid, request, native=native, pause=pause))
    if not native and not pause and _runs_native(str(out.get(PREFIX + "py_spy.dump") or "")):
        # its main thread runs without the GIL, so not Python's code: which library it runs in
        native_dump = py_spy_dump(pid, True)
        if native_dump.get(PREFIX + "py_spy.dump"):
            out.pop(PREFIX + "py_spy.native_error", None)  # (the first read's: not paused)
            out.update(native_dump)
    return out


def _runs_native(dump: str) -> bool:
    """Whether py-spy's dump shows the main thread running (``active``) without the GIL: in native
    code that released it (a spin in OpenMP's or the CUDA driver's wait, a C loop)."""
    for line in dump.splitlines():
        head = _SPY_THREAD.match(line)
        if head and head.group(1) == "MainThread":
            status = line[line.find("(") + 1 : line.find(")")]
            return status == "active"
    return False


def _waits_in_library(pid: int, calls: dict[str, Any]) -> bool:
    from lora_otel.analysis import native

    rows = calls.get("syscalls") or []
    return bool(rows) and rows[0][0] == pid and native.library_of("", str(rows[0][1])) is not None


# --- pipes ------------------------------------------------------------------------------------------

PIPE_WRITE_WCHAN = ("anon_pipe_write", "pipe_write", "pipe_wait_writable")
"""Kernel wait channels of a task blocked writing to a full pipe (``anon_pipe_write`` since Linux
6.10; ``pipe_wait`` before 5.6 served reads and writes alike)."""
PIPE_READ_WCHAN = ("anon_pipe_read", "pipe_read", "pipe_wait_readable")
_STREAMS = ((1, "stdout"), (2, "stderr"))
PIPE_SCAN_S = 2.0
"""At most this long looking through /proc/*/fd for the processes that hold a pipe's read end."""


def _pipe_inode(pid: int, fd: int) -> Optional[int]:
    try:
        target = os.readlink("/proc/%d/fd/%d" % (pid, fd))
    except OSError:
        return None
    return int(target[6:-1]) if target.startswith("pipe:[") and target[6:-1].isdigit() else None


def _pipe_fill(pid: int, fd: int, inode: int) -> tuple[Optional[int], Optional[int]]:
    """(bytes queued, capacity) of the pipe on ``pid``'s ``fd``: ``FIONREAD`` and ``F_GETPIPE_SZ`` on a
    descriptor of our own (``/proc/<pid>/fd/<fd>`` opened non-blocking, never read from)."""
    import fcntl
    import struct
    import termios

    try:
        own = os.open("/proc/%d/fd/%d" % (pid, fd), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None, None
    try:
        if os.fstat(own).st_ino != inode:
            return None, None
        queued: Optional[int]
        try:
            queued = struct.unpack("i", fcntl.ioctl(own, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            queued = None
        try:
            capacity: Optional[int] = fcntl.fcntl(own, getattr(fcntl, "F_GETPIPE_SZ", 1032))
        except OSError:
            capacity = None
        return queued, capacity
    finally:
        os.close(own)


def _wchan(path: str) -> str:
    try:
        w = _read(path).strip()
    except OSError:
        return ""
    return "" if w == "0" else w


def _ancestors(pid: int, depth: int = 8) -> list[int]:
    out: list[int] = []
    while len(out) < depth:
        try:
            pid = int(_read("/proc/%d/stat" % pid).rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 0:
            break
        out.append(pid)
    return out


def pipe_readers(
    inodes: set[int], first: Sequence[int] = (), budget_s: float = PIPE_SCAN_S, job: Optional[int] = None
) -> dict[int, list[dict[str, Any]]]:
    """The processes (that this user can see) holding the read end of each pipe in ``inodes``, by
    inode: ``{"pid", "fd", "cmdline", "state", "wchan", "reading"}``, ``reading`` meaning that one of
    its threads waits in a pipe read. ``first``: pids to look at before the rest of /proc (the
    writer's parents, which usually are the reader). ``job``: a reader not part of it is named by
    its program only (`waitfacts.cmdline`)."""
    found: dict[int, list[dict[str, Any]]] = {inode: [] for inode in inodes}
    try:
        everyone = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    order = list(dict.fromkeys([*first, *everyone]))
    deadline = time.monotonic() + budget_s
    for pid in order:
        if time.monotonic() > deadline:
            break
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        held: list[tuple[int, int]] = []
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if not target.startswith("pipe:[") or not target[6:-1].isdigit() or int(target[6:-1]) not in inodes:
                continue
            try:
                flags = next(
                    int(line.split()[1], 8)
                    for line in _read("/proc/%d/fdinfo/%s" % (pid, fd)).splitlines()
                    if line.startswith("flags:")
                )
            except (OSError, ValueError, IndexError, StopIteration):
                continue
            if flags & os.O_ACCMODE == os.O_RDONLY:
                held.append((int(target[6:-1]), int(fd)))
        if not held:
            continue
        try:
            state = _stat_fields(pid)[0]
            # another program's command line: secret-named options' values removed (`redact_argv`);
            # of a process not part of the job, its program only
            cmd = waitfacts.cmdline(pid, job)
        except (OSError, IndexError):
            continue
        try:
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError:
            tids = []
        reading = any(_wchan("/proc/%d/task/%s/wchan" % (pid, t)).startswith(PIPE_READ_WCHAN) for t in tids[:64])
        for inode, fd_no in held:
            found[inode].append(
                {
                    "pid": pid,
                    "fd": fd_no,
                    "cmdline": cmd[:200],
                    "state": state,
                    "wchan": _wchan("/proc/%d/wchan" % pid) or "-",
                    "reading": reading,
                }
            )
    return found


def pipe_facts(pid: int) -> dict[str, Any]:
    """The process's stdout and stderr when they are pipes, and its threads blocked writing to one.

    ``pipe.fd<N>.inode``, ``.queued_bytes``, ``.capacity_bytes`` for descriptors 1 and 2;
    ``pipe.fd<N>.readers`` (`pipe_readers`) and ``pipe.fd<N>.reader_pids`` (``"4711, 4712"``);
    ``pipe.writing_threads``: ``"<tid> <wait channel>"`` of each thread waiting to write to a pipe, and
    ``pipe.main_thread_writing`` when the main thread is one of them. Nothing when neither
    descriptor is a pipe."""
    out: dict[str, Any] = {}
    inodes: dict[int, int] = {}
    for fd, _ in _STREAMS:
        inode = _pipe_inode(pid, fd)
        if inode is None:
            continue
        inodes[fd] = inode
        out[PREFIX + "pipe.fd%d.inode" % fd] = inode
        queued, capacity = _pipe_fill(pid, fd, inode)
        if queued is not None:
            out[PREFIX + "pipe.fd%d.queued_bytes" % fd] = queued
        if capacity is not None:
            out[PREFIX + "pipe.fd%d.capacity_bytes" % fd] = capacity
    if not inodes:
        return out
    writing = []
    try:
        tids = sorted(os.listdir("/proc/%d/task" % pid), key=lambda t: (t != str(pid), t))
    except OSError:
        tids = []
    for tid in tids[:256]:
        w = _wchan("/proc/%d/task/%s/wchan" % (pid, tid))
        if w.startswith(PIPE_WRITE_WCHAN) or w == "pipe_wait":
            writing.append("%s %s" % (tid, w))
            if tid == str(pid):
                out[PREFIX + "pipe.main_thread_writing"] = True
    if writing:
        out[PREFIX + "pipe.writing_threads"] = writing[:16]
    readers = pipe_readers(set(inodes.values()), _ancestors(pid), job=pid)
    for fd, inode in inodes.items():
        rows = readers.get(inode) or []
        out[PREFIX + "pipe.fd%d.readers" % fd] = rows[:8]
        out[PREFIX + "pipe.fd%d.reader_pids" % fd] = ", ".join(str(r["pid"]) for r in rows[:8])
    return out


# --- file locks (lora_otel.analysis.filelocks) --------------------------------------------------


def hub_facts(pid: int, found: dict[str, Any]) -> dict[str, Any]:
    """Whether the repo a hub download waits for is in the job's local cache (`hubcache.facts`:
    ``hub.*``), told by the stacks already in ``found``."""
    from lora_otel.analysis import hubcache

    stacks = "\n".join(str(found.get(PREFIX + key) or "") for key in ("python.stacks", "py_spy.dump"))
    return hubcache.facts(pid, stacks)


def file_lock_facts(pid: int, found: dict[str, Any], use_py_spy: bool = True) -> dict[str, Any]:
    """The file lock the process waits for, if any (`filelocks.facts`: ``file_lock.*``), told
    by the stacks already in ``found`` (faulthandler's dump, py-spy's)."""
    stacks = "\n".join(str(found.get(PREFIX + key) or "") for key in ("python.stacks", "py_spy.dump"))
    try:
        return filelocks.facts(pid, stacks, use_py_spy)
    except Exception as e:  # noqa: BLE001 - evidence is best effort; the other facts stand
        return {filelocks.KEY + "error": "%s: %s" % (type(e).__name__, e)}


# --- poll loops (lora_otel.analysis.pollfacts) ----------------------------------------------------


def poll_facts(
    pid: int, found: dict[str, Any], use_py_spy: bool = True, ask: Optional[Callable[[], str]] = None
) -> dict[str, Any]:
    """The poll loop the main thread sleeps in and the state of what it polls (`pollfacts.facts`:
    ``poll.*``), told by the stacks already in ``found``; {} when it sleeps in no loop, or when a
    file lock was found (that rule says it). ``ask``: asks the beat thread for a dump (with the
    frames' simple locals and ``self``'s attributes), when py-spy's locals do not name the object."""
    if found.get(filelocks.KEY + "path") or found.get(filelocks.KEY + "holders"):
        return {}
    from lora_otel.analysis import pollfacts, polling

    try:
        return pollfacts.facts(pid, str(found.get(PREFIX + "python.stacks") or ""), use_py_spy, ask)
    except Exception as e:  # noqa: BLE001 - evidence is best effort; the other facts stand
        return {polling.KEY + "error": "%s: %s" % (type(e).__name__, e)}
