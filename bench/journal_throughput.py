"""How fast a traced process writes its journal, and how big one training job's journal is.

    python bench/journal_throughput.py [--stages 20000] [--runs 5] [--steps 40]

1. **Throughput.** A traced process (``LORA_OTEL=1``, journal in a temporary directory, no
   endpoint, so no sidecar) runs ``--stages`` empty ``with lora_otel.stage("x"):`` blocks as fast
   as it can (after 500 untimed ones), noting ``time.time_ns()`` before and after the loop. The
   journal's records whose ``ts`` falls inside that window (the stages' ``start`` and ``end``
   records, and any once-per-second ``beat``) are counted and their bytes summed: records/s and
   MB/s over the loop's wall time. The baseline, run right after it in a fresh process (rows
   interleaved ``--runs`` times, medians shown): the same number of ``os.write`` calls of a fixed
   line as long as the average record just measured, to a file opened ``O_WRONLY | O_APPEND |
   O_CREAT`` (as the journal is): the ceiling one write per record allows on this file system.
   The ``mark`` row does the same with ``lora_otel.mark("tick")`` (an ``event`` and a ``line``
   record each, and the line on stderr, a pipe the bench reads).
   The ``stage, no identity check`` row (interleaved too) runs the same stages with the journal
   writer as it was before the descriptor identity check (issue 12 item 2: one ``os.fstat`` per
   record, compared with the (device, inode) recorded at open): the check's cost per record and per
   stage, before and after, in one run.
2. **Per job.** ``examples/train_lora.py --steps N`` traced (``LORA_OTEL=1``, no endpoint), its
   journal(s) measured by ``scale.per_job`` (bench/scale.py part (a)): bytes, records (lines),
   spans in the journal, spans exported after translation (short successful imports are
   dropped), log lines and the spans' OTLP protobuf bytes.
"""

from __future__ import annotations

import argparse
import compileall
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from scale import per_job, print_per_job  # noqa: E402
from sidecar_cost import env_base  # noqa: E402

PY = sys.executable

# The journal writer before the identity check, compiled into lora_otel's core module (same global
# look-ups as the real one), for the "no identity check" row.
UNCHECKED_WRITE_LINE = r"""
def write_line(data):
    global _journal_failed, _journal_lost
    if _journal_fd < 0:
        return
    try:
        n = os.write(_journal_fd, data)
        if n != len(data):
            os.write(_journal_fd, b"\n")
            raise OSError(28, "short write (disk full?)")
    except Exception as e:
        _write_failed(e)
        return
    if _journal_failed:
        pass
"""

CHILD = r"""
import os, sys, time
kind, n = sys.argv[1], int(sys.argv[2])
if kind == "stage-unchecked":
    from lora_otel._boot import core
    exec(sys.argv[3], core.__dict__)
    kind = "stage"
if kind == "raw":
    line = b"x" * (int(sys.argv[3]) - 1) + b"\n"
    fd = os.open(sys.argv[4], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    for _ in range(500):
        os.write(fd, line)
    t0 = time.time_ns()
    for _ in range(n):
        os.write(fd, line)
    t1 = time.time_ns()
    os.close(fd)
else:
    import lora_otel
    with lora_otel.stage("outer"):
        if kind == "mark":
            for _ in range(500):
                lora_otel.mark("tick")
            t0 = time.time_ns()
            for _ in range(n):
                lora_otel.mark("tick")
            t1 = time.time_ns()
        else:
            for _ in range(500):
                with lora_otel.stage("x"):
                    pass
            t0 = time.time_ns()
            for _ in range(n):
                with lora_otel.stage("x"):
                    pass
            t1 = time.time_ns()
print("WINDOW", t0, t1, flush=True)
"""


def run_child(args: list, env: dict, cwd: str) -> tuple:
    r = subprocess.run(
        [PY, "-c", CHILD] + [str(a) for a in args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=600,
    )
    lines = [ln for ln in r.stdout.decode(errors="replace").splitlines() if ln.startswith("WINDOW ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(
            "%s: exit code %s; stderr: %s" % (args[0], r.returncode, r.stderr.decode(errors="replace")[-800:])
        )
    t0, t1 = (int(x) for x in lines[-1].split()[1:])
    return t0, t1


def traced_run(kind: str, n: int, work: str) -> dict:
    """One traced process writing ``n`` stages (or marks); records and bytes inside its loop's window."""
    d = tempfile.mkdtemp(prefix=kind + "-", dir=work)
    env = dict(env_base(), LORA_OTEL="1", LORA_OTEL_DIR=d, LORA_OTEL_STALL_AFTER="100000")
    t0, t1 = run_child([kind, n] + ([UNCHECKED_WRITE_LINE] if kind == "stage-unchecked" else []), env, d)
    paths = glob.glob(os.path.join(d, "*.otel.jsonl"))
    if len(paths) != 1:
        raise RuntimeError("expected one journal in %s, found %d" % (d, len(paths)))
    records = nbytes = 0
    kinds: dict = {}
    total = 0
    with open(paths[0], "rb") as f:
        for raw in f:
            total += 1
            rec = json.loads(raw)
            if t0 <= rec["ts"] <= t1:
                records += 1
                nbytes += len(raw)
                kinds[rec["k"]] = kinds.get(rec["k"], 0) + 1
    shutil.rmtree(d, ignore_errors=True)
    secs = (t1 - t0) / 1e9
    return {
        "records": records,
        "bytes": nbytes,
        "secs": secs,
        "rate": records / secs,
        "mbs": nbytes / secs / 1e6,
        "per_record": nbytes / max(records, 1),
        "kinds": kinds,
        "journal_records": total,
        "n": n,
    }


def raw_run(n: int, size: int, work: str) -> dict:
    d = tempfile.mkdtemp(prefix="raw-", dir=work)
    t0, t1 = run_child(["raw", n, size, os.path.join(d, "raw.jsonl")], env_base(), d)
    shutil.rmtree(d, ignore_errors=True)
    secs = (t1 - t0) / 1e9
    return {"records": n, "bytes": n * size, "secs": secs, "rate": n / secs, "mbs": n * size / secs / 1e6}


def measure_throughput(stages: int = 20000, runs: int = 5, marks: bool = True, unchecked: bool = False) -> dict:
    """Stage (and mark) rows interleaved with their raw-write baselines; medians over ``runs``.
    ``unchecked`` adds the stage row without the descriptor identity check."""
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)
    work = tempfile.mkdtemp(prefix="lora-otel-journal-")
    kinds = ["stage"] + (["stage-unchecked"] if unchecked else []) + (["mark"] if marks else [])
    samples: dict = {k: [] for k in kinds}
    raw: dict = {k: [] for k in kinds}
    try:
        traced_run("stage", 1000, work)  # warm the page cache (not counted)
        t_start = time.monotonic()
        for i in range(runs):
            for k in kinds:
                r = traced_run(k, stages, work)
                samples[k].append(r)
                raw[k].append(raw_run(r["records"], max(round(r["per_record"]), 2), work))
            print(
                "journal_throughput: run %d of %d done (%.0f s)" % (i + 1, runs, time.monotonic() - t_start),
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict = {"stages": stages, "runs": runs, "kinds": kinds, "samples": samples, "raw": raw}
    for k in kinds:
        out[k] = {
            "rate": statistics.median(r["rate"] for r in samples[k]),
            "us_per_record": statistics.median(r["secs"] * 1e6 / max(r["records"], 1) for r in samples[k]),
            "us_per_stage": statistics.median(r["secs"] * 1e6 / r["n"] for r in samples[k]),
            "mbs": statistics.median(r["mbs"] for r in samples[k]),
            "per_record": statistics.median(r["per_record"] for r in samples[k]),
            "raw_rate": statistics.median(r["rate"] for r in raw[k]),
            "raw_mbs": statistics.median(r["mbs"] for r in raw[k]),
            "kinds": samples[k][-1]["kinds"],
        }
    return out


def measure_job(steps: int = 40) -> dict:
    """``scale.per_job``: one traced ``train_lora.py --steps N`` and its journal(s)."""
    work = tempfile.mkdtemp(prefix="lora-otel-job-")
    try:
        return per_job(argparse.Namespace(steps=steps), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=20000, help="stages (or marks) per process (default 20000)")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per row, interleaved (default 5)")
    ap.add_argument("--steps", type=int, default=40, help="train_lora.py --steps for the per-job figures (default 40)")
    ap.add_argument("--no-marks", action="store_true", help="leave out the lora_otel.mark row")
    ap.add_argument("--skip-job", action="store_true", help="leave out the per-job figures")
    ap.add_argument("--no-check-row", action="store_true", help="leave out the stage row without the identity check")
    args = ap.parse_args()
    t = measure_throughput(args.stages, args.runs, not args.no_marks, not args.no_check_row)
    print(
        "lora_otel journal throughput — %s, Python %s, %d CPUs, %s; %d stages per process, %d processes per "
        "row (interleaved, median); journal on %s"
        % (
            os.uname().machine,
            sys.version.split()[0],
            os.cpu_count(),
            time.strftime("%Y-%m-%d"),
            args.stages,
            args.runs,
            tempfile.gettempdir(),
        )
    )
    print()
    print("| what | records/s | MB/s | bytes per record | vs raw os.write | records in the window |")
    print("|---|---:|---:|---:|---:|---|")
    names = {
        "stage": "empty lora_otel.stage blocks",
        "mark": 'lora_otel.mark("tick")',
        "stage-unchecked": "empty lora_otel.stage blocks, no identity check (the writer before)",
    }
    for k in t["kinds"]:
        m = t[k]
        print(
            "| %s, LORA_OTEL=1 | %.0f | %.2f | %.0f | %.2fx | %s |"
            % (
                names[k],
                m["rate"],
                m["mbs"],
                m["per_record"],
                m["rate"] / m["raw_rate"],
                ", ".join("%s %d" % kv for kv in sorted(m["kinds"].items())),
            )
        )
        print(
            "| raw os.write of a %d-byte line, O_APPEND (baseline) | %.0f | %.2f | %.0f | 1.00x | |"
            % (round(m["per_record"]), m["raw_rate"], m["raw_mbs"], m["per_record"])
        )
    if "stage-unchecked" in t:
        a, b = t["stage-unchecked"], t["stage"]
        print()
        print("| descriptor identity check (os.fstat per record) | without | with | ratio | added |")
        print("|---|---:|---:|---:|---:|")
        print(
            "| µs per journal record | %.2f | %.2f | %.2fx | %+.2f µs |"
            % (
                a["us_per_record"],
                b["us_per_record"],
                b["us_per_record"] / a["us_per_record"],
                b["us_per_record"] - a["us_per_record"],
            )
        )
        print(
            "| µs per stage (a start and an end record) | %.2f | %.2f | %.2fx | %+.2f µs |"
            % (
                a["us_per_stage"],
                b["us_per_stage"],
                b["us_per_stage"] / a["us_per_stage"],
                b["us_per_stage"] - a["us_per_stage"],
            )
        )
    if not args.skip_job:
        print("running train_lora.py --steps %d ..." % args.steps, file=sys.stderr, flush=True)
        a = measure_job(args.steps)
        print()
        print_per_job(a, "one job: examples/train_lora.py --steps %d, LORA_OTEL=1" % args.steps)


if __name__ == "__main__":
    main()
