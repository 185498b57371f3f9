"""Evidence about a stalled process, gathered from outside it: what a person would check by hand.

Each function returns a flat dict of attributes (``lora_otel.evidence.*``) for a span event, and
never raises: a fact that cannot be read (not Linux, permissions, the process gone) is left out
with the reason under ``lora_otel.evidence.<what>.error``.

- ``process_facts(pid)``: state and wait channel, CPU time and CPU % over a short sample, RSS,
  threads, I/O bytes (``/proc/<pid>/{stat,status,wchan,io}``);
- ``network_facts(pid)``: bytes received/sent by the process's network namespace
  (``/proc/<pid>/net/dev``), so two samples tell whether a download is moving;
- ``python_stacks(pid, stacks_path)``: SIGUSR1 → the preamble's ``faulthandler`` dump (works on a
  frozen process), and ``py-spy dump --native`` when py-spy is installed and permitted;
- ``gpu_facts(pid)``: GPU utilisation and the process's GPU memory through NVML (``nvidia-ml-py``)
  when available.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Any, Optional

from lora_otel._boot.cgroup import memory_cgroup, oom_kill_count

PREFIX = "lora_otel.evidence."


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _stat_fields(pid: int) -> list[str]:
    raw = _read("/proc/%d/stat" % pid)
    return raw[raw.rindex(")") + 2:].split()  # fields from 3 (state) on


def process_facts(pid: int, sample_s: float = 0.2) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        hz = os.sysconf("SC_CLK_TCK")
        f0 = _stat_fields(pid)
        t0 = time.monotonic()
        time.sleep(sample_s)
        f1 = _stat_fields(pid)
        dt = time.monotonic() - t0
        cpu0 = (int(f0[11]) + int(f0[12])) / hz  # utime + stime
        cpu1 = (int(f1[11]) + int(f1[12])) / hz
        states = {"R": "running", "S": "sleeping", "D": "uninterruptible (disk) sleep", "T": "stopped",
                  "t": "stopped by tracer", "Z": "zombie", "I": "idle"}
        out[PREFIX + "process.state"] = "%s (%s)" % (f1[0], states.get(f1[0], "?"))
        out[PREFIX + "process.cpu_seconds"] = round(cpu1, 2)
        out[PREFIX + "process.cpu_percent"] = round(100.0 * (cpu1 - cpu0) / dt, 1) if dt > 0 else 0.0
        out[PREFIX + "process.threads"] = int(f1[17])
        out[PREFIX + "process.rss_bytes"] = int(f1[21]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError) as e:
        out[PREFIX + "process.error"] = str(e)
        return out
    try:
        wchan = _read("/proc/%d/wchan" % pid).strip()
        out[PREFIX + "process.wait_channel"] = wchan if wchan and wchan != "0" else "(none: on CPU or not shown)"
    except OSError as e:
        out[PREFIX + "process.wait_channel.error"] = str(e)
    try:
        io = dict(line.split(": ", 1) for line in _read("/proc/%d/io" % pid).splitlines() if ": " in line)
        out[PREFIX + "io.read_bytes"] = int(io.get("rchar", 0))
        out[PREFIX + "io.write_bytes"] = int(io.get("wchar", 0))
    except (OSError, ValueError) as e:
        out[PREFIX + "io.error"] = str(e)
    return out


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


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
               "0B": "CLOSING"}


def _addr(hexaddr: str) -> str:
    ip, _, port = hexaddr.partition(":")
    if len(ip) == 8:
        host = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        host = "[ipv6]"
    return "%s:%d" % (host, int(port, 16))


def tcp_connections(pid: int) -> list:
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


def python_stacks(pid: int, stacks_path: Optional[str], wait_s: float = 1.5, py_spy: bool = True) -> dict[str, Any]:
    """Ask the process for its stacks (SIGUSR1) and read what its faulthandler wrote; py-spy too
    (unless ``py_spy`` is False).

    A stopped process (SIGSTOP, a debugger) cannot answer until it continues, so it is not waited
    for: the signal stays pending and the dump lands in the stacks file when it resumes.
    """
    out: dict[str, Any] = {}
    try:
        state = _stat_fields(pid)[0]
    except (OSError, IndexError):
        state = ""
    if stacks_path and state in ("T", "t"):
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
        out[PREFIX + "python.stacks.error"] = ("the process is stopped; its stacks will be written to %s "
                                              "when it continues" % stacks_path)
        stacks_path = None
    if stacks_path:
        try:
            before = os.path.getsize(stacks_path) if os.path.exists(stacks_path) else 0
            os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + wait_s
            text = ""
            while time.monotonic() < deadline:
                if os.path.exists(stacks_path) and os.path.getsize(stacks_path) > before:
                    time.sleep(0.05)  # let the dump finish
                    with open(stacks_path, "rb") as f:
                        f.seek(before)
                        text = f.read().decode("utf-8", "replace")
                    break
                time.sleep(0.02)
            if text:
                out[PREFIX + "python.stacks"] = text[-16000:]
            else:
                out[PREFIX + "python.stacks.error"] = "no dump within %.0f s (stopped process, or SIGUSR1 taken)" % wait_s
        except OSError as e:
            out[PREFIX + "python.stacks.error"] = str(e)
    spy = shutil.which("py-spy") if py_spy else None
    if spy:
        try:
            r = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                               timeout=10)
            if r.returncode == 0:
                out[PREFIX + "py_spy.dump"] = r.stdout[-16000:]
            else:
                out[PREFIX + "py_spy.error"] = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            out[PREFIX + "py_spy.error"] = str(e)
    return out


def gpu_facts(pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        import pynvml  # nvidia-ml-py, optional
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


def gather(pid: int, stacks_path: Optional[str]) -> dict[str, Any]:
    """Everything above, in one dict."""
    out: dict[str, Any] = {}
    out.update(process_facts(pid))
    out.update(network_facts(pid))
    out.update(python_stacks(pid, stacks_path))
    out.update(gpu_facts(pid))
    return out


class OomWatch:
    """Tells afterwards whether the OOM killer struck the memory cgroup a process was seen in.

    Call `see` while the process lives (it may be moved between cgroups) and `struck` after it is
    gone: True when the ``oom_kill`` count of a cgroup it was seen in rose meanwhile. Every cgroup
    seen keeps the count it had when first seen: a read of ``/proc/<pid>/cgroup`` made while the
    process is being killed may name another cgroup, whose count must not replace the first. The
    count is per cgroup, so an OOM kill of another process in the same cgroup counts too; callers
    say "in its memory cgroup".
    """

    def __init__(self, cgroup: Optional[str] = None, before: Optional[int] = None) -> None:
        self.before: dict[str, int] = {}  # cgroup -> its oom_kill count when first seen
        if cgroup is not None and before is not None:
            self.before[cgroup] = before

    def see(self, pid: int) -> None:
        cgroup = memory_cgroup(pid)
        if cgroup is not None and cgroup not in self.before:
            count = oom_kill_count(cgroup)
            if count is not None:
                self.before[cgroup] = count

    def struck(self) -> Optional[str]:
        """A phrase like ``"the OOM killer (oom_kill 0 → 1 in its memory cgroup)"``, or None."""
        told = None
        for cgroup, before in self.before.items():
            after = oom_kill_count(cgroup)
            if after is not None and after > before:
                self.before[cgroup] = after  # each kill is told once
                told = told or "the OOM killer (oom_kill %d \u2192 %d in its memory cgroup)" % (before, after)
        return told
