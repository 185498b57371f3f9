"""How long the sidecar's intermediate process lives: the window in which it is the job's child.

    python bench/intermediate_life.py [--starts 200]

`lora_otel._boot.spawn.start` starts the sidecar through a tiny intermediate (``/bin/sh``, or this
Python with ``-I -S`` where there is no shell), ``posix_spawn``-ed in a new session; it starts the
sidecar in the background, writes its pid on a pipe and exits, and the job reaps it. While it
lives it is the job's child: a program's own ``os.wait()``/``os.waitpid(-1, …)`` in another
thread can reap it, and its end sends the job one ``SIGCHLD``. Measured here, per start: from the
call of ``posix_spawn`` to the return of the job's ``waitpid`` (the intermediate exists, then is a
zombie, for at most that long), and the part of it spent in ``waitpid`` (the promoting thread
waiting for it). The sidecar is ``/bin/true`` (the intermediate's work is the same whatever it
starts; forty sidecars importing lora_otel would only load the machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lora_otel._boot import spawn


def measure(starts: int, directory: str, shell: bool) -> tuple[list[float], list[float]]:
    """``(lifetimes, waits)`` in ms over ``starts`` real starts."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LORA_OTEL_SIDECAR_PYTHON": "/bin/true"}
    saved = spawn.SHELL
    spawn.SHELL = saved if shell else "/nonexistent/sh"
    lifetimes: list[float] = []
    waits: list[float] = []
    t: dict[str, float] = {}

    def posix_spawn(*args: Any, **kwargs: Any) -> int:
        t["call"] = time.perf_counter()
        return os.posix_spawn(*args, **kwargs)

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        t["wait"] = time.perf_counter()
        try:
            return os.waitpid(pid, options)
        finally:
            t["reaped"] = time.perf_counter()

    try:
        for i in range(starts):
            t.clear()
            journal = os.path.join(directory, "%s-%d.otel.jsonl" % ("sh" if shell else "py", i))
            pid, why = spawn.start(journal, os.getpid(), env=env, posix_spawn=posix_spawn, waitpid=waitpid)
            if not pid:
                raise SystemExit("the sidecar did not start: %s" % why)
            lifetimes.append((t["reaped"] - t["call"]) * 1000)
            waits.append((t["reaped"] - t["wait"]) * 1000)
    finally:
        spawn.SHELL = saved
    return lifetimes, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lora-otel-intermediate-") as directory:
        for shell in (True, False):
            if shell and not os.access(spawn.SHELL, os.X_OK):
                continue
            lifetimes, waits = measure(args.starts if shell else max(args.starts // 10, 5), directory, shell)
            cut = sorted(lifetimes)
            what = "/bin/sh (%s)" % os.path.realpath(spawn.SHELL) if shell else "no shell (python -I -S)"
            print(
                "intermediate %s, %d starts: alive %.2f ms median, p90 %.2f ms, max %.2f ms; "
                "the job's waitpid %.2f ms median"
                % (
                    what,
                    len(lifetimes),
                    statistics.median(lifetimes),
                    cut[int(0.9 * (len(cut) - 1))],
                    cut[-1],
                    statistics.median(waits),
                )
            )
    print("load average %.2f on %d CPUs" % (os.getloadavg()[0], os.cpu_count() or 0))


if __name__ == "__main__":
    main()
