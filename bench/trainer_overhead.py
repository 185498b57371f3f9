"""What ``LORA_OTEL=1`` costs a real trainer's run: TRL's SFTTrainer + peft LoRA (the job of
tests/trainers/sft_job.py: tiny random Llama, 8 optimizer steps, CPU), wall time of the whole
process as a launcher sees it, bare vs traced, interleaved in one invocation (issue 22's figures).

    python bench/trainer_overhead.py [--runs 5] [--steps 8]

Prints a table: median and min wall seconds of each, the ratio and the difference. Nothing is
downloaded (``HF_HUB_OFFLINE=1``); each run writes into a fresh temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "trainers" / "sft_job.py"


def one(traced: bool, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", HOME=tmp)
        if traced:
            env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(tmp, "j"))
        t0 = time.perf_counter()
        r = subprocess.run(
            [sys.executable, str(JOB), "--out", os.path.join(tmp, "o"), "--steps", str(steps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.perf_counter() - t0
        if r.returncode != 0 or "TRAINED %d" % steps not in r.stdout:
            raise SystemExit("the job failed (%s): %s" % ("traced" if traced else "bare", r.stderr[-2000:]))
        return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each, interleaved (default 5)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    args = parser.parse_args()
    one(False, args.steps)  # warm the page cache (torch, transformers) before anything is timed
    bare: list[float] = []
    traced: list[float] = []
    for _ in range(args.runs):
        bare.append(one(False, args.steps))
        traced.append(one(True, args.steps))
    mb, mt = statistics.median(bare), statistics.median(traced)
    print(
        "| TRL SFTTrainer + peft LoRA, %d steps, %d runs each | bare | LORA_OTEL=1 | ratio | added |"
        % (args.steps, args.runs)
    )
    print("|---|---|---|---|---|")
    print("| wall, median | %.2f s | %.2f s | %.3f | %+.2f s |" % (mb, mt, mt / mb, mt - mb))
    print(
        "| wall, min | %.2f s | %.2f s | %.3f | %+.2f s |"
        % (min(bare), min(traced), min(traced) / min(bare), min(traced) - min(bare))
    )


if __name__ == "__main__":
    main()
