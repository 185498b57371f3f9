"""Size of the Perfetto / chrome://tracing file and the time to write it, for the example job and a 10,000-span journal.

    python bench/perfetto_cost.py [--runs 5] [--example-journal PATH] [--spans 10000]

Two journals:

- the example LoRA run: ``examples/train_lora.py --steps 40`` traced (``LORA_OTEL=1``) in a
  temporary directory — about 40 s on a 2-core machine — unless ``--example-journal`` names a
  journal of one already;
- a synthetic journal of ``--spans`` spans written with ``tests/conftest.py``'s `JournalBuilder`:
  60 imports (half of them shorter than the 5 ms threshold, left out of the file), a ``load model``
  stage, then ``training`` with one ``step N`` span of 10 ms per optimizer step, a mark every 100
  steps and a beat per second carrying ``loss`` and ``lr``.

For each: the trace events built (`lora_otel.export.perfetto.trace_events`, ``verdicts=False``:
no /proc sampling), the JSON written to a file (`dumps`), the file's size and its gzip size; times
are medians of ``--runs`` (build and write, wall clock). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from lora_otel.export.perfetto import dumps, trace_events  # noqa: E402
from lora_otel.journal.reader import Journal, read_journal  # noqa: E402


def example_journal(directory: str) -> Path:
    """Run the example LoRA job traced; its journal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(directory, "journals"), PYTHONPATH=str(REPO))
    log = os.path.join(directory, "run.log")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_lora.py"), "--steps", "40", "--log", log],
        env=env,
        cwd=directory,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return Path(log + ".otel.jsonl")


def synthetic_journal(path: Path, spans: int) -> Path:
    """A journal of ``spans`` spans (module docstring), written with tests/conftest.py's JournalBuilder."""
    from conftest import JournalBuilder

    builder = JournalBuilder(path)
    root = builder.process(0.0, attrs={"service.name": "train.py", "process.pid": 4242})
    t = 0.01
    for i in range(60):
        duration = 0.001 if i % 2 else 0.05
        builder.span(f"import mod{i}", t, duration, attrs={"lora_otel.module": f"mod{i}"})
        t += duration + 0.001
    builder.span("load model", t, 2.0)
    t += 2.0
    training = builder.start("training", t)
    steps = spans - 63  # process, the imports, load model, training
    next_beat = int(t) + 1
    for step in range(1, steps + 1):
        builder.span(f"step {step}", t, 0.01, parent=training, attrs={"lora_otel.step": step})
        t += 0.0101
        if step % 100 == 0:
            builder.event(training, t, "checkpoint", {"step": step})
        if t >= next_beat:
            builder.record("beat", t, steps=step, last_step_ts=builder.ns(t), metrics={"loss": 1.0 / step, "lr": 1e-4})
            next_beat += 1
    builder.end(training, t)
    builder.end(root, t + 0.1)
    builder.exit(t + 0.1)
    return path


def measure(journal: Journal, runs: int, out: Path) -> dict:
    now = time.time_ns()
    build, write = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        doc = trace_events([journal], now, verdicts=False)
        t1 = time.perf_counter()
        out.write_text(dumps(doc), encoding="utf-8")
        t2 = time.perf_counter()
        build.append(t1 - t0)
        write.append(t2 - t1)
    data = out.read_bytes()
    return {
        "spans": len(journal.spans),
        "events": len(doc["traceEvents"]),
        "bytes": len(data),
        "gzip": len(gzip.compress(data)),
        "build": statistics.median(build),
        "write": statistics.median(write),
        "journal_bytes": os.path.getsize(journal.path),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--spans", type=int, default=10000)
    ap.add_argument("--example-journal", help="a journal of examples/train_lora.py --steps 40 (else run it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        print("perfetto_cost: the example job ...", file=sys.stderr, flush=True)
        example = Path(args.example_journal) if args.example_journal else example_journal(d)
        print("perfetto_cost: the synthetic journal ...", file=sys.stderr, flush=True)
        synthetic = synthetic_journal(Path(d) / "synthetic.otel.jsonl", args.spans)
        rows = []
        for label, path in (
            ("example LoRA run (`examples/train_lora.py --steps 40`)", example),
            (f"synthetic {args.spans:,}-span journal", synthetic),
        ):
            t0 = time.perf_counter()
            journal = read_journal(path)
            read_s = time.perf_counter() - t0
            r = measure(journal, args.runs, Path(d) / "out.json")
            rows.append((label, r, read_s))
    print(f"median of {args.runs} runs; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print()
    print("| journal | journal size | spans | trace events | Perfetto JSON | gzipped | read journal | build | write |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r, read_s in rows:
        print(
            f"| {label} | {r['journal_bytes'] / 1024:,.0f} KiB | {r['spans']:,} | {r['events']:,} "
            f"| {r['bytes'] / 1024:,.0f} KiB | {r['gzip'] / 1024:,.0f} KiB | {read_s * 1000:,.0f} ms "
            f"| {r['build'] * 1000:,.0f} ms | {r['write'] * 1000:,.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
