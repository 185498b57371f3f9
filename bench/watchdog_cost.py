"""What the local watchdog (the sidecar with no OTLP endpoint) costs a job, with a same-run baseline.

    python bench/watchdog_cost.py [--runs 20] [--seconds 20]

Three figures, each beside its baseline measured in the same run:

- start: ``spawn.start`` timed inside a process (what starting the sidecar adds to the job's
  preamble: the spawn, until the sidecar's pid is read back), the preamble's own duration
  (``lora_otel.preamble.duration_us``, which includes starting the sidecar) and the wall time of
  ``python -c pass`` with ``LORA_OTEL=1`` (the sidecar starts, through an intermediate process, in the preamble)
  against the same with ``LORA_OTEL_LIVE=0`` (no sidecar); ``--runs`` alternating pairs, medians. Goal: ≤ 3 ms added.
- resident memory of the sidecar following an idle job (``time.sleep`` in a stage; the job only
  writes its once-per-second beat): VmRSS from ``/proc/<pid>/status`` at the end of the window.
  Goal: ≤ 30 MB. Baseline: a bare ``python -c "import time; time.sleep(5)"``.
- CPU of that sidecar (utime+stime over ``--seconds`` s, after a 2 s warm-up), % of one core.
  Goal: < 0.5 %.

It also checks that the sidecar imported no ``opentelemetry`` module (``-X importtime`` of the
sidecar command itself, following the idle job's finished journal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
HZ = os.sysconf("SC_CLK_TCK")


STARTER = """\
import json, os, sys, time
from lora_otel._boot import spawn
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
out = []
for i in range(n):
    path = os.path.join(d, "j%d.otel.jsonl" % i)
    with open(path, "w") as f:
        f.write(json.dumps({"v": 1, "k": "start", "ts": time.time_ns(), "trace_id": "1" * 32, "span_id": "2" * 16,
                            "parent_id": None, "name": "process", "pid": os.getpid(), "config": {}}) + "\\n")
    os.chmod(path, 0o600)
    t0 = time.perf_counter()
    pid, why = spawn.start(path, os.getpid(), dict(os.environ))
    out.append((time.perf_counter() - t0) * 1000)
    assert pid, why
    time.sleep(0.5)  # that sidecar's own start-up is done before the next fork is timed
print(json.dumps(out))
"""


def env(**extra: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_")) and k != "TRACEPARENT"}
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(extra)
    return e


def wall(cmd: list, e: dict, cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=e, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t0) * 1000


def rss_kb(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def cpu_s(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lora-otel-watchdog-bench-")
    on, off = [], []
    for i in range(args.runs):
        for label, out in (("on", on), ("off", off)) if i % 2 == 0 else (("off", off), ("on", on)):
            extra = {"LORA_OTEL": "1", "LORA_OTEL_DIR": os.path.join(work, "start-" + label)}
            if label == "off":
                extra["LORA_OTEL_LIVE"] = "0"
            out.append(wall([PY, "-c", "pass"], env(**extra), work))
    time.sleep(2)  # the sidecars of the last runs exit
    pre = {"on": [], "off": []}  # the preamble's own duration (root attribute), a steadier figure than wall time
    for label in pre:
        d = os.path.join(work, "start-" + label)
        for name in os.listdir(d):
            if name.endswith(".otel.jsonl"):
                with open(os.path.join(d, name)) as f:
                    for line in f:
                        rec = json.loads(line)
                        us = (
                            rec.get("attrs", {}).get("lora_otel.preamble.duration_us")
                            if rec.get("k") == "attrs"
                            else None
                        )
                        if us is not None:
                            pre[label].append(us / 1000)

    job = os.path.join(work, "idle.py")
    Path(job).write_text(
        "import lora_otel, time\nwith lora_otel.stage('idle'):\n    time.sleep(%f)\n" % (args.seconds + 4)
    )
    jdir = os.path.join(work, "idle")
    proc = subprocess.Popen(
        [PY, job],
        env=env(LORA_OTEL="1", LORA_OTEL_DIR=jdir),
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bare = subprocess.Popen([PY, "-c", "import time; time.sleep(%f)" % (args.seconds + 4)], env=env(), cwd=work)
    side = None
    deadline = time.monotonic() + 10
    while side is None and time.monotonic() < deadline:
        for name in os.listdir(jdir) if os.path.isdir(jdir) else []:
            if name.endswith(".otel.jsonl"):
                with open(os.path.join(jdir, name)) as f:
                    for line in f:
                        rec = json.loads(line)
                        if rec.get("k") == "attrs" and "lora_otel.sidecar.pid" in rec.get("attrs", {}):
                            side = rec["attrs"]["lora_otel.sidecar.pid"]
        time.sleep(0.05)
    assert side, "no sidecar started"
    time.sleep(2)
    c0, t0 = cpu_s(side), time.monotonic()
    time.sleep(args.seconds)
    c1, t1 = cpu_s(side), time.monotonic()
    side_rss, bare_rss = rss_kb(side) / 1024, rss_kb(bare.pid) / 1024
    proc.wait()
    bare.wait()
    exited = time.monotonic()
    while alive(side) and time.monotonic() - exited < 10:  # a zombie counts as gone: reaping is init's
        time.sleep(0.01)
    exit_after = time.monotonic() - exited
    starter = os.path.join(work, "starter.py")
    Path(starter).write_text(STARTER)
    r = subprocess.run(
        [PY, starter, os.path.join(work, "spawn"), str(args.runs)],
        env=env(),
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    spawn_ms = json.loads(r.stdout.strip().splitlines()[-1])
    journal = next(os.path.join(jdir, n) for n in os.listdir(jdir) if n.endswith(".otel.jsonl"))
    r = subprocess.run(
        [PY, "-X", "importtime", "-m", "lora_otel.export.sidecar", "--journal", journal, "--pid", "1"],
        env=env(LORA_OTEL_SIDECAR="1"),
        cwd=work,
        capture_output=True,
        text=True,
    )
    otel = [line for line in r.stderr.splitlines() if "opentelemetry" in line]
    modules = sum(1 for line in r.stderr.splitlines() if line.startswith("import time:")) - 1

    added = statistics.median(on) - statistics.median(off)
    cpu = 100 * (c1 - c0) / (t1 - t0)
    print("| figure | local watchdog | baseline (same run) | difference | goal |")
    print("|---|---|---|---|---|")
    print(
        "| `python -c pass` with LORA_OTEL=1, median of %d | %.1f ms (sidecar on) | %.1f ms (LORA_OTEL_LIVE=0) | "
        "%+.1f ms | ≤ 3 ms |" % (args.runs, statistics.median(on), statistics.median(off), added)
    )
    print(
        "| the preamble (root attribute `lora_otel.preamble.duration_us`), median | %.2f ms (sidecar on) | "
        "%.2f ms (LORA_OTEL_LIVE=0) | %+.2f ms | ≤ 3 ms |"
        % (
            statistics.median(pre["on"]),
            statistics.median(pre["off"]),
            statistics.median(pre["on"]) - statistics.median(pre["off"]),
        )
    )
    print(
        "| `spawn.start` in the job (spawn, until the sidecar's pid is known), median of %d | %.2f ms | "
        "0 (LORA_OTEL_LIVE=0: not called) | %+.2f ms | ≤ 3 ms |"
        % (len(spawn_ms), statistics.median(spawn_ms), statistics.median(spawn_ms))
    )
    print(
        "| sidecar resident memory, idle job | %.1f MB | %.1f MB (bare `python` sleeping) | %+.1f MB | ≤ 30 MB |"
        % (side_rss, bare_rss, side_rss - bare_rss)
    )
    print("| sidecar CPU over %.0f s, idle job | %.2f %% of a core | — | — | < 0.5 %% |" % (t1 - t0, cpu))
    print("| sidecar exit after the job's exit | %.2f s | — | — | promptly |" % exit_after)
    print(
        "| sidecar modules imported (local mode) | %d, %d from opentelemetry | — | — | 0 from opentelemetry |"
        % (modules, len(otel))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
