"""What lora_otel costs code that raises exceptions, per Python (3.12+ watch ``SystemExit`` with
``sys.monitoring``: one callback per frame an exception unwinds).

    python bench/exception_cost.py [--python PATH ...] [--runs 5]

Three loops, each timed inside a fresh process without lora_otel and with ``LORA_OTEL=1``
(interleaved ``--runs`` times; the median of each):

- ``keyerror``: 1,000,000 ``try: d[i] except KeyError: pass`` (one frame, raised and caught);
- ``iterator``: 200,000 loops over a Python iterator whose ``__next__`` raises StopIteration after
  3 items;
- ``deep``: 20,000 exceptions raised 20 frames deep and caught at the top.

The interpreters default to this one; ``--python`` names others (a venv's python, which must have
lora_otel's start hook: ``.ci/matrix.py``'s venvs do). Prints a markdown table: per Python and
loop, seconds without and with, the ratio, and the cost per exception (µs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

LOOPS = r"""
import sys, time
def keyerror():
    d = {}
    for i in range(1000000):
        try:
            d[i]
        except KeyError:
            pass
class It:
    def __init__(self):
        self.i = 0
    def __iter__(self):
        return self
    def __next__(self):
        self.i += 1
        if self.i > 3:
            raise StopIteration
        return self.i
def iterator():
    for _ in range(200000):
        for _ in It():
            pass
def down(k):
    if k == 0:
        raise ValueError("x")
    down(k - 1)
def deep():
    for _ in range(20000):
        try:
            down(20)
        except ValueError:
            pass
fn = globals()[sys.argv[1]]
t = time.perf_counter()
fn()
print(time.perf_counter() - t)
"""
COUNTS = {"keyerror": 1_000_000, "iterator": 200_000, "deep": 20_000 * 21}
"""Exception-frame events per loop (``deep``: each exception unwinds 21 frames)."""


def one(python: str, loop: str, traced: bool, script: str, tmp: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(tmp, "j"))
    r = subprocess.run([python, script, loop], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit("%s %s failed: %s" % (python, loop, r.stderr[-2000:]))
    return float(r.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", help="an interpreter to measure (repeatable; default: this one)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each, interleaved (default 5)")
    args = ap.parse_args()
    print("| Python | loop | without | LORA_OTEL=1 | ratio | added per exception frame |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "loops.py")
        with open(script, "w") as f:
            f.write(LOOPS)
        for python in args.python or [sys.executable]:
            version = subprocess.run(
                [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            for loop in COUNTS:
                bare, traced = [], []
                for _ in range(args.runs):
                    bare.append(one(python, loop, False, script, tmp))
                    traced.append(one(python, loop, True, script, tmp))
                b, t = statistics.median(bare), statistics.median(traced)
                print(
                    "| %s | %s | %.3f s | %.3f s | %.2f | %+.2f µs |"
                    % (version, loop, b, t, t / b, (t - b) / COUNTS[loop] * 1e6),
                    flush=True,
                )


if __name__ == "__main__":
    main()
