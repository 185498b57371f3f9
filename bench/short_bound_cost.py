"""What bounding short failed runs' journals costs at their exit (issue 36, item 9).

    python bench/short_bound_cost.py [--runs 200] [--others 400]

A short process that fails (an uncaught exception) keeps its journal, marks it as a short run's
and keeps at most ``SHORT_RUNS_KEPT`` such journals of its user in the directory
(`lora_otel._boot.preamble._bound_short_runs`). Two figures, each over ``--runs`` real
``python -c 'raise ValueError'`` processes, in a ``LORA_OTEL_DIR`` that also holds ``--others``
files (a job directory's runs: journals and their siblings; another user's files look the same
to the listing). Byte code is written and used (one warm-up run each way), as in an installed
package:

- in-process: the time `_bound_short_runs` takes inside the exiting process (it is wrapped with
  ``perf_counter_ns`` by the ``-c`` code itself), at the bound (each exit marks, lists, removes
  the oldest);
- whole process: the wall time of the failing run, bound on vs off (``LORA_OTEL_KEEP=0``: the same
  exit, no mark, no listing), interleaved, medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CODE = """\
import os, time
from lora_otel._boot import preamble as p
bound = p._bound_short_runs
def timed():
    t = time.perf_counter_ns()
    bound()
    with open(os.environ["BENCH_OUT"], "a") as f:
        f.write("%d\\n" % (time.perf_counter_ns() - t))
p._bound_short_runs = timed
raise ValueError("short failure")
"""


def run(directory: str, out: str, keep: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORA_OTEL") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(LORA_OTEL="1", LORA_OTEL_DIR=directory, BENCH_OUT=out)
    if keep is not None:
        env["LORA_OTEL_KEEP"] = keep
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CODE], env=env, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t
    assert r.returncode == 1, r.returncode
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--others", type=int, default=400)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for name in ("on", "off"):
            d = dirs[name] = os.path.join(tmp, name)
            os.mkdir(d)
            for i in range(a.others):  # a job directory's runs (never touched by the bound)
                with open(os.path.join(d, "20260101T%06dZ-%d.otel.jsonl" % (i, 100000 + i)), "w") as f:
                    f.write("{}\n")
        out = {name: os.path.join(tmp, name + ".ns") for name in dirs}
        walls: dict[str, list[float]] = {"on": [], "off": []}
        for name in dirs:  # warm-up: byte code written, the page cache warm
            run(dirs[name], os.devnull, None if name == "on" else "0")
        for _ in range(a.runs):
            walls["on"].append(run(dirs["on"], out["on"], None))
            walls["off"].append(run(dirs["off"], out["off"], "0"))
        with open(out["on"]) as f:
            inside = sorted(int(line) / 1000 for line in f)
        with open(out["off"]) as f:
            inside_off = sorted(int(line) / 1000 for line in f)
        left = len([n for n in os.listdir(dirs["on"]) if "-short-" in n])
        left_off = len(os.listdir(dirs["off"])) - a.others
    print("runs: %d failing short runs each way, %d other files in the directory" % (a.runs, a.others))
    print(
        "in-process _bound_short_runs, bound on:  median %.0f us, p90 %.0f us, max %.0f us"
        % (statistics.median(inside), inside[int(len(inside) * 0.9)], inside[-1])
    )
    print("in-process _bound_short_runs, KEEP=0:    median %.1f us" % statistics.median(inside_off))
    on, off = statistics.median(walls["on"]) * 1e3, statistics.median(walls["off"]) * 1e3
    print("whole failing run, median: bound on %.1f ms, off %.1f ms, added %+.2f ms" % (on, off, on - off))
    print("journals left: bound on %d, off %d" % (left, left_off))


if __name__ == "__main__":
    main()
