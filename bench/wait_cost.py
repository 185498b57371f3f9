"""What the ``child exit`` hook costs: a wait that reaps nothing, and a reap that journals a child.

    python bench/wait_cost.py [--calls 200000] [--children 300]

In fresh ``LORA_OTEL=1`` processes, the interpreter's own ``os.waitpid`` (``__wrapped__``) and the
hooked one side by side in the same process (best of 3 each, best over 3 processes), so that the
fork hooks of a traced process are in both and only the wait hook differs:

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
hooked = os.waitpid
plain = getattr(hooked, "__wrapped__", hooked)  # the interpreter's own (LORA_OTEL=1 wraps it)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(0)
best = {}
for name, call in (("plain", plain), ("hooked", hooked)) * 3:
    t = time.perf_counter_ns()
    for _ in range(n):
        call(pid, os.WNOHANG)
    best[name] = min(best.get(name, 1e30), (time.perf_counter_ns() - t) / n)
os.write(w, b"x")
os.waitpid(pid, 0)
print("RESULT", best["plain"], best["hooked"])
"""

REAP = r"""
import os, sys, time
n = int(sys.argv[1])
hooked = os.waitpid
plain = getattr(hooked, "__wrapped__", hooked)
best = {}
for name, call in (("plain", plain), ("hooked", hooked)) * 3:
    t = time.perf_counter_ns()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        call(pid, 0)
    best[name] = min(best.get(name, 1e30), (time.perf_counter_ns() - t) / n)
print("RESULT", best["plain"], best["hooked"])
"""


def run(code: str, count: int, workdir: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(workdir, "journals"), LORA_OTEL_LIVE="0")
    r = subprocess.run([PY, "-c", code, str(count)], env=env, capture_output=True, text=True, check=True)
    return [float(x) for x in [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1].split()[1:]]


def measure(calls: int = 200000, children: int = 300) -> dict[str, float]:
    """ns per no-child-ready poll and per fork + reap, the interpreter's own call and the hooked one
    in the same traced process (best of 3 there, best over ``runs`` processes)."""
    work = tempfile.mkdtemp(prefix="lora-otel-wait-")
    out = {"poll_plain": 1e30, "poll_hooked": 1e30, "reap_plain": 1e30, "reap_hooked": 1e30}
    try:
        for _ in range(3):
            plain, hooked = run(POLL, calls, work)
            out["poll_plain"], out["poll_hooked"] = min(out["poll_plain"], plain), min(out["poll_hooked"], hooked)
            plain, hooked = run(REAP, children, work)
            out["reap_plain"], out["reap_hooked"] = min(out["reap_plain"], plain), min(out["reap_hooked"], hooked)
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
    print("| what | interpreter's call | hooked | added |")
    print("|---|---:|---:|---:|")
    print(
        "| os.waitpid(pid, WNOHANG), no child ready (ns per call) | %.0f | %.0f | %+.0f |"
        % (r["poll_plain"], r["poll_hooked"], r["poll_hooked"] - r["poll_plain"])
    )
    print(
        "| fork + os.waitpid(pid, 0), one child exit event (µs) | %.1f | %.1f | %+.1f |"
        % (r["reap_plain"] / 1000, r["reap_hooked"] / 1000, (r["reap_hooked"] - r["reap_plain"]) / 1000)
    )


if __name__ == "__main__":
    main()
