"""What the ``child exit`` hook costs: a wait that reaps nothing, and a reap that journals a child.

    python bench/wait_cost.py [--calls 200000] [--children 300]

Both in fresh processes, plain and ``LORA_OTEL=1`` (interleaved, best of 3 in each):

1. **A poll that finds no child ready**: ``os.waitpid(pid, os.WNOHANG)`` on a live child, as
   ``subprocess.Popen.poll`` and ``wait(timeout=...)`` loops and multiprocessing call it, ``--calls``
   times; ns per call. The hook adds one Python call and one test.
2. **A reap**: fork a child that exits at once, then ``os.waitpid(pid, 0)`` (the hook journals one
   ``child exit`` event), ``--children`` times; µs per fork + reap, the added cost is the event.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

PY = sys.executable

POLL = r"""
import os, sys, time
n = int(sys.argv[1])
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(0)
best = 1e30
for _ in range(3):
    t = time.perf_counter_ns()
    for _ in range(n):
        os.waitpid(pid, os.WNOHANG)
    best = min(best, (time.perf_counter_ns() - t) / n)
os.write(w, b"x")
os.waitpid(pid, 0)
print("RESULT", best)
"""

REAP = r"""
import os, sys, time
n = int(sys.argv[1])
best = 1e30
for _ in range(3):
    t = time.perf_counter_ns()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    best = min(best, (time.perf_counter_ns() - t) / n)
print("RESULT", best)
"""


def run(code: str, count: int, traced: bool, workdir: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(workdir, "journals"), LORA_OTEL_LIVE="0")
    r = subprocess.run([PY, "-c", code, str(count)], env=env, capture_output=True, text=True, check=True)
    return float([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1].split()[1])


def measure(calls: int = 200000, children: int = 300) -> dict[str, float]:
    """ns per no-child-ready poll and per fork + reap, plain and traced (best of interleaved runs)."""
    work = tempfile.mkdtemp(prefix="lora-otel-wait-")
    out = {"poll_plain": 1e30, "poll_traced": 1e30, "reap_plain": 1e30, "reap_traced": 1e30}
    try:
        for _ in range(3):
            out["poll_plain"] = min(out["poll_plain"], run(POLL, calls, False, work))
            out["poll_traced"] = min(out["poll_traced"], run(POLL, calls, True, work))
            out["reap_plain"] = min(out["reap_plain"], run(REAP, children, False, work))
            out["reap_traced"] = min(out["reap_traced"], run(REAP, children, True, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--children", type=int, default=300)
    args = ap.parse_args()
    r = measure(args.calls, args.children)
    print("lora_otel wait-hook benchmark — %s, Python %s" % (os.uname().machine, sys.version.split()[0]))
    print()
    print("| what | plain | LORA_OTEL=1 | added |")
    print("|---|---:|---:|---:|")
    print(
        "| os.waitpid(pid, WNOHANG), no child ready (ns per call) | %.0f | %.0f | %+.0f |"
        % (r["poll_plain"], r["poll_traced"], r["poll_traced"] - r["poll_plain"])
    )
    print(
        "| fork + os.waitpid(pid, 0), one child exit event (µs) | %.1f | %.1f | %+.1f |"
        % (r["reap_plain"] / 1000, r["reap_traced"] / 1000, (r["reap_traced"] - r["reap_plain"]) / 1000)
    )


if __name__ == "__main__":
    main()
