"""What lora_otel costs per optimizer step: the hooks alone, and a real training loop side by side.

    python bench/step_cost.py [--steps 20000] [--runs 7]

Two measurements, both in fresh processes:

1. **Hooks alone.** In a traced process (``LORA_OTEL=1``), the two functions torch calls around
   every ``optimizer.step()`` — lora_otel's global step pre- and post-hook — timed directly,
   ``--steps`` times, against the same loop calling two empty functions. This is the per-step cost
   with nothing else in the way; the goal is ≤ 2 µs.
2. **A real loop.** ``--steps`` SGD steps on a tiny ``nn.Linear`` (forward, backward, step) in a
   process without lora_otel and in one with it, interleaved ``--runs`` times; median per-step time
   of each and the difference. An optimizer step on a real model is thousands of times longer,
   so this only shows that the hooks disappear in the noise of the cheapest possible step.

Also with ``LORA_OTEL_STEP_SPANS=100`` (one ``step K`` span per 100 steps): the cost per step,
spread.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

PY = sys.executable

HOOKS = r"""
import sys, time, torch
from lora_otel._boot import torch_hooks
n = int(sys.argv[1])
opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
pre, post = torch_hooks.on_step_pre, torch_hooks.on_step_post
pre(opt, (), {}); post(opt, (), {})  # opens `training` once, as the first real step does
def e1(*a): pass
def e2(*a): pass
best = {}
for name, (a, b) in (("empty", (e1, e2)), ("lora_otel", (pre, post))) * 3:
    t = time.perf_counter_ns()
    for _ in range(n):
        a(opt, (), {})
        b(opt, (), {})
    best[name] = min(best.get(name, 1e30), (time.perf_counter_ns() - t) / n)
print("HOOKS", best["empty"], best["lora_otel"])
"""

LOOP = r"""
import sys, time, torch
torch.manual_seed(0)
n = int(sys.argv[1])
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
for _ in range(200):
    opt.zero_grad(); model(x).sum().backward(); opt.step()
t = time.perf_counter_ns()
for _ in range(n):
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    opt.step()
print("LOOP", (time.perf_counter_ns() - t) / n)
"""


def run(code: str, steps: int, traced: bool, workdir: str, **extra: str) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(workdir, "journals"))
    env.update(extra)
    r = subprocess.run([PY, "-c", code, str(steps)], env=env, capture_output=True, text=True, check=True)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith(("HOOKS", "LOOP"))][-1]
    return [float(x) for x in line.split()[1:]]


def measure(steps: int = 20000, runs: int = 7) -> dict:
    """Both measurements; ns per step: the hooks alone (best of 3 in one process) and loop medians."""
    work = tempfile.mkdtemp(prefix="lora-otel-step-")
    try:
        empty, hooked = run(HOOKS, steps * 10, True, work)
        _, hooked_spans = run(HOOKS, steps * 10, True, work, LORA_OTEL_STEP_SPANS="100")
        bare, traced, spans = [], [], []
        for _ in range(runs):
            bare += run(LOOP, steps, False, work)
            traced += run(LOOP, steps, True, work)
            spans += run(LOOP, steps, True, work, LORA_OTEL_STEP_SPANS="100")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "steps": steps,
        "runs": runs,
        "empty": empty,
        "hooked": hooked,
        "hooked_spans": hooked_spans,
        "bare": statistics.median(bare),
        "traced": statistics.median(traced),
        "spans": statistics.median(spans),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    r = measure(args.steps, args.runs)
    empty, hooked, hooked_spans = r["empty"], r["hooked"], r["hooked_spans"]
    b, t, s = r["bare"], r["traced"], r["spans"]
    print(
        "lora_otel step-cost benchmark — %s, Python %s, torch %s"
        % (os.uname().machine, sys.version.split()[0], __import__("torch").__version__)
    )
    print()
    print("| what | ns per step | vs baseline | added ns |")
    print("|---|---:|---:|---:|")
    print("| two empty functions (baseline of the hook call) | %.0f | 1.00x | +0 |" % empty)
    print("| lora_otel's step pre+post hooks | %.0f | %.2fx | %+.0f |" % (hooked, hooked / empty, hooked - empty))
    print(
        "| same, LORA_OTEL_STEP_SPANS=100 | %.0f | %.2fx | %+.0f |"
        % (hooked_spans, hooked_spans / empty, hooked_spans - empty)
    )
    print("| SGD step on nn.Linear(8, 8), no lora_otel (median of %d) | %.0f | 1.00x | +0 |" % (args.runs, b))
    print("| same loop, LORA_OTEL=1 | %.0f | %.3fx | %+.0f |" % (t, t / b, t - b))
    print("| same loop, LORA_OTEL=1 + LORA_OTEL_STEP_SPANS=100 | %.0f | %.3fx | %+.0f |" % (s, s / b, s - b))
    print()
    print("| figure | value | goal |")
    print("|---|---:|---|")
    print("| progress accounting per optimizer step (hooks alone) | %.2f µs | ≤ 2 µs |" % ((hooked - empty) / 1000))


if __name__ == "__main__":
    main()
