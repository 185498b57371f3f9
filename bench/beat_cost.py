"""What the beat's main-thread sample costs: a beat record with ``"main"`` vs the same beat without it.

    python bench/beat_cost.py [--beats 20000] [--runs 5] [--threads 0,8,32]

In a fresh process per run: the journal opened as the preamble opens it, the main thread parked
inside a C call (``threading.Event.wait`` → ``lock.acquire``) 30 Python frames deep — a training
loop's stack is about that deep, and a stuck job sits in a C call — and a second thread doing what
the beat thread does, ``--beats`` times in a row, alternating blocks of:

- baseline: ``core.beat()`` with no main thread to sample (the beat record as it was);
- with main: ``core.beat()`` sampling the main thread (``where.sample``: ``sys._current_frames()``,
  the ``f_back`` walk, path shortening, the cached name of the C function it sits in);

with 0, 8 and 32 extra idle Python threads (``sys._current_frames()`` looks at every thread). The
median per beat over the runs, and the added cost; the goal is ≤ 50 µs per beat. Also the one-time
cost of reading a C function's name from the bytecode (once per code object and instruction where
the main thread is seen twice in a row; cached after that).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, threading, time
from lora_otel._boot import core, where
beats, threads, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
core.open_journal(path)
core.pid, core.active = os.getpid(), True
main = threading.get_ident()
park, done, out = threading.Event(), threading.Event(), {}
idle = threading.Event()
for _ in range(threads):
    threading.Thread(target=idle.wait, daemon=True).start()

def block(sample, n):
    core.main_ident = main if sample else 0
    t0 = time.perf_counter_ns()
    for _ in range(n):
        core.beat()
    return (time.perf_counter_ns() - t0) / n / 1000

def measure():
    time.sleep(0.2)
    core.beat(); core.main_ident = main; core.beat(); core.beat()  # the C name, read once and cached
    base, with_main, n = [], [], max(beats // 10, 1)
    for _ in range(10):
        base.append(block(False, n)); with_main.append(block(True, n))
    out["base"], out["main"] = min(base), min(with_main)
    out["frames"] = where.sample(main)
    spot = where._last_spot
    where._callees.clear()
    t0 = time.perf_counter_ns()
    where._callee(*spot)
    out["callee_us"] = (time.perf_counter_ns() - t0) / 1000
    park.set()

def deep(k):
    if k:
        return deep(k - 1)
    park.wait()

t = threading.Thread(target=measure); t.start()
deep(28)
t.join()
print(json.dumps(out))
"""


def run_once(beats: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for k in [k for k in env if k.startswith("LORA_OTEL")]:
            del env[k]
        r = subprocess.run(
            [PY, "-c", CHILD, str(beats), str(threads), os.path.join(d, "j.otel.jsonl")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return json.loads(r.stdout.strip().splitlines()[-1])


def measure(beats: int = 20000, runs: int = 5, threads: tuple = (0, 8, 32)) -> dict:
    """``{threads: {"base", "main", "added", "callee_us"}}`` (µs per beat, medians over ``runs``), plus ``"frames"``."""
    out: dict = {}
    for n in threads:
        samples = [run_once(beats, n) for _ in range(runs)]
        base = statistics.median(s["base"] for s in samples)
        main = statistics.median(s["main"] for s in samples)
        out[n] = {
            "base": base,
            "main": main,
            "added": main - base,
            "callee_us": statistics.median(s["callee_us"] for s in samples),
        }
        out["frames"] = samples[-1]["frames"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--beats", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", default="0,8,32")
    a = ap.parse_args()
    r = measure(a.beats, a.runs, tuple(int(x) for x in a.threads.split(",")))
    print("main thread sampled: %s" % json.dumps(r.pop("frames")))
    print(
        '| extra threads | beat without "main" (baseline) | beat with "main" | added | goal ≤ 50 µs '
        "| C name, first read |"
    )
    print("|---:|---:|---:|---:|---|---:|")
    for n, v in r.items():
        print(
            "| %d | %.2f µs | %.2f µs | %+.2f µs | %s | %.1f µs |"
            % (n, v["base"], v["main"], v["added"], "yes" if v["added"] <= 50 else "NO", v["callee_us"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
