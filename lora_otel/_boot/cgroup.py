"""The memory cgroup of a process and its OOM-kill count (cgroup v2 and v1).

Standard library only, and not even `typing` (9 ms to import): the preamble uses it.
"""

from __future__ import annotations

import os


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def memory_cgroup(pid: int | str = "self") -> str | None:
    """The directory of the memory cgroup ``pid`` (default: this process) is in (cgroup v2 or v1), or None."""
    try:
        text = _read("/proc/%s/cgroup" % pid)
    except OSError:
        return None
    v2 = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            candidate = "/sys/fs/cgroup/memory" + path
            if os.path.isdir(candidate):
                return candidate
        if hierarchy == "0" and controllers == "":
            v2 = "/sys/fs/cgroup" + path
    if v2 and os.path.exists(os.path.join(v2, "memory.events")):
        return v2
    return None


def oom_kill_count(cgroup: str | None) -> int | None:
    """How many processes the OOM killer has killed in this memory cgroup so far, or None."""
    if not cgroup:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = _read(os.path.join(cgroup, name))
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
