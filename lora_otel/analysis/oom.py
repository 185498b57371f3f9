"""Whether the OOM killer struck a process's memory cgroup while it was watched (`OomWatch`).

A module of its own, apart from `lora_otel.analysis.evidence`: the sidecar watches every job for an
OOM kill from its start, and gathers evidence only at a stall (docs/performance.md, "Memory a traced
job adds").
"""

from __future__ import annotations

from typing import Optional

from lora_otel._boot.seam import memory_cgroup, oom_kill_count


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
