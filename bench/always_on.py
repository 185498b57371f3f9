"""Always on: what ``LORA_OTEL=1`` costs where processes are short, and what a job keeps (issue 20).

    python bench/always_on.py [--pairs 100] [--pip-pairs 20] [--idle-s 125] [--no-job]

Prints one markdown table, every figure against a baseline measured in the same run:

- ``python -c pass`` and ``pip --version``, ``LORA_OTEL=1`` against unset, run in interleaved pairs
  (bare, traced, bare, traced, ...) from a clean working directory with ``HOME``,
  ``XDG_STATE_HOME`` and ``TMPDIR`` of their own: the median wall time of each, and their CPU time
  summed over all runs — the process *and everything it started*, a detached sidecar included:
  this script makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a double-forked
  sidecar is re-parented to it, and after each run it waits for every such descendant before the
  next run starts (so no sidecar's CPU or exit falls into another run). The whole machine's CPU
  (``/proc/stat``) over the same runs is shown too: on a machine others use it carries their load,
  the subreaper sum does not;
- files left: every file the traced ``python -c pass`` runs left anywhere under their working
  directory, ``HOME``, ``XDG_STATE_HOME`` and ``TMPDIR`` (the untraced runs leave none);
- ``os.fork()`` + ``os._exit(0)`` in a traced process against an untraced one: the added
  milliseconds per fork (median over interleaved processes of ``--forks`` forks each) and the files
  left per fork;
- an idle traced process (``time.sleep`` in its main thread): its journal's growth over
  ``--idle-s`` seconds (after its first 5 s), extrapolated to an hour; the same process untraced
  writes nothing;
- the job's own goals (skipped with ``--no-job``): the first evidence (root span record and the
  ``started`` line) in microseconds from the preamble's start, for a job (a stage) and for
  ``python -c pass``; and the seconds from a hang to the job's own line naming it
  (``bench/hang_to_line.py``'s cases, one run each).

Byte code is compiled first (``compileall``), as ``pip install`` does.
"""

from __future__ import annotations

import argparse
import compileall
import ctypes
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
PY = sys.executable
PR_SET_CHILD_SUBREAPER = 36
FORK_SCRIPT = """\
import os, sys, time
n = int(sys.argv[1])
def once():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
for _ in range(20):
    once()
t = time.perf_counter()
for _ in range(n):
    once()
print((time.perf_counter() - t) / n * 1000)
"""


def base_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LORA_OTEL", "OTEL_", "PYTEST_")) and k not in ("TRACEPARENT", "PYTHONDONTWRITEBYTECODE")
    }


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent (all CPUs, every state but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def reap_all() -> None:
    """Wait for every child, re-parented sidecars included (this process is their subreaper)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


_DEVNULL_012 = [
    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
]


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """``(wall ms of the command, CPU s of it and all it started, machine CPU s)`` for one run in
    the current directory, its stdio /dev/null."""
    cpu0, m0 = children_cpu_s(), machine_cpu_s()
    t = time.perf_counter()
    pid = os.posix_spawn(cmd[0], cmd, env, file_actions=_DEVNULL_012)
    os.waitpid(pid, 0)
    wall = (time.perf_counter() - t) * 1000
    reap_all()
    return wall, children_cpu_s() - cpu0, machine_cpu_s() - m0


def all_files(roots: list[str]) -> set[str]:
    found = set()
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            found.update(os.path.join(dirpath, f) for f in files)
    return found


def pairs(cmd: list[str], n: int, work: str) -> dict:
    """``n`` interleaved (bare, traced) runs of ``cmd`` from a clean directory; the figures."""
    cwd, home, state, tmp = (os.path.join(work, d) for d in ("cwd", "home", "state", "tmp"))
    for d in (cwd, home, state, tmp):
        os.makedirs(d, exist_ok=True)
    env = dict(base_env(), HOME=home, XDG_STATE_HOME=state, TMPDIR=tmp)
    kinds = {"bare": env, "traced": dict(env, LORA_OTEL="1")}
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
    old = os.getcwd()
    os.chdir(cwd)
    try:
        for e in kinds.values():  # warm the page cache
            run_once(cmd, e)
        before = all_files([cwd, home, state, tmp])
        for _ in range(n):
            for k, e in kinds.items():
                samples[k].append(run_once(cmd, e))
    finally:
        os.chdir(old)
    left = all_files([cwd, home, state, tmp]) - before
    out: dict = {"n": n, "left": sorted(left)}
    for k, rows in samples.items():
        out[k] = {
            "wall_ms": statistics.median(r[0] for r in rows),
            "cpu_s": sum(r[1] for r in rows),
            "machine_s": sum(r[2] for r in rows),
        }
    return out


def fork_cost(forks: int, procs: int, work: str) -> dict:
    """Per fork + _exit: untraced vs traced, ``procs`` interleaved processes of ``forks`` each."""
    script = os.path.join(work, "forks.py")
    with open(script, "w") as f:
        f.write(FORK_SCRIPT)
    jdir = os.path.join(work, "fork-journals")
    env = base_env()
    kinds = {"bare": env, "traced": dict(env, LORA_OTEL="1", LORA_OTEL_DIR=jdir)}
    ms: dict[str, list[float]] = {k: [] for k in kinds}
    files_before = len(all_files([jdir]))
    for _ in range(procs):
        for k, e in kinds.items():
            r = subprocess.run([PY, script, str(forks)], env=e, capture_output=True, text=True, cwd=work, check=True)
            ms[k].append(float(r.stdout.split()[-1]))
            reap_all()
    files = len(all_files([jdir])) - files_before
    per_process = 1  # each traced process leaves its own journal (not a fork's)
    return {
        "bare_ms": statistics.median(ms["bare"]),
        "traced_ms": statistics.median(ms["traced"]),
        "files_per_fork": max(files - per_process * procs, 0) / (procs * (forks + 20)),
        "forks": forks,
        "procs": procs,
    }


def idle_growth(seconds: float, work: str) -> dict:
    """Bytes an idle traced process's journal gains in ``seconds`` (after its first 5 s), per hour."""
    jdir = os.path.join(work, "idle")
    env = dict(base_env(), LORA_OTEL="1", LORA_OTEL_DIR=jdir)
    proc = subprocess.Popen(
        [PY, "-c", "import time\ntime.sleep(10 ** 6)\n"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(5.0)
        [journal] = list(Path(jdir).glob("*.otel.jsonl"))
        size0, t0 = journal.stat().st_size, time.monotonic()
        time.sleep(seconds)
        size1, t1 = journal.stat().st_size, time.monotonic()
        beats = sum(1 for line in journal.read_text().splitlines() if '"k":"beat"' in line)
    finally:
        proc.terminate()
        proc.wait()
        reap_all()
    return {"bytes": size1 - size0, "window_s": t1 - t0, "per_hour": (size1 - size0) / (t1 - t0) * 3600, "beats": beats}


def first_evidence(work: str, runs: int = 20) -> dict:
    """``lora_otel.preamble.first_evidence_us`` of ``runs`` jobs (a stage) and ``python -c pass``."""
    jdir = os.path.join(work, "evidence")
    env = dict(base_env(), LORA_OTEL="1", LORA_OTEL_DIR=jdir, LORA_OTEL_LIVE="0")
    job = "import lora_otel\nwith lora_otel.stage('x'):\n    pass\n"
    for _ in range(runs):
        for code in (job, "pass"):
            subprocess.run([PY, "-c", code], env=env, capture_output=True, check=True)
    found: dict[str, list[int]] = {"job": [], "short": []}
    for path in Path(jdir).glob("*.otel.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        kind = "job" if any(r.get("k") == "start" and r.get("name") == "x" for r in records) else "short"
        for r in records:
            if r.get("k") == "attrs" and "lora_otel.preamble.first_evidence_us" in r["attrs"]:
                found[kind].append(r["attrs"]["lora_otel.preamble.first_evidence_us"])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=100, help="interleaved python -c pass pairs (default 100)")
    ap.add_argument("--pip-pairs", type=int, default=20, help="interleaved pip --version pairs (default 20)")
    ap.add_argument("--forks", type=int, default=300, help="forks per process (default 300)")
    ap.add_argument("--fork-procs", type=int, default=7, help="processes per kind for the fork figure (default 7)")
    ap.add_argument("--idle-s", type=float, default=125.0, help="idle journal window in seconds (default 125)")
    ap.add_argument("--no-job", action="store_true", help="skip the job's goals (first evidence, hang to line)")
    args = ap.parse_args()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)
    rows: list[tuple[str, str, str, str, str]] = []

    def ratio_row(name: str, r: dict, goal_wall: float, goal_cpu: float) -> None:
        b, t = r["bare"], r["traced"]
        wall = t["wall_ms"] / b["wall_ms"]
        cpu = t["cpu_s"] / b["cpu_s"]
        machine = t["machine_s"] / b["machine_s"] if b["machine_s"] else float("nan")
        rows.append(
            (
                "%s: wall, median of %d" % (name, r["n"]),
                "%.1f ms" % b["wall_ms"],
                "%.1f ms" % t["wall_ms"],
                "%.2fx (+%.1f ms)" % (wall, t["wall_ms"] - b["wall_ms"]),
                "≤ %.2fx: %s" % (goal_wall, "yes" if wall <= goal_wall else "NO"),
            )
        )
        rows.append(
            (
                "%s: CPU of it and all it started (sidecars too), sum of %d" % (name, r["n"]),
                "%.2f s" % b["cpu_s"],
                "%.2f s" % t["cpu_s"],
                "%.2fx" % cpu,
                "≤ %.2fx: %s" % (goal_cpu, "yes" if cpu <= goal_cpu else "NO"),
            )
        )
        rows.append(
            (
                "%s: whole machine's CPU over the runs (/proc/stat, others' load included)" % name,
                "%.2f s" % b["machine_s"],
                "%.2f s" % t["machine_s"],
                "%.2fx" % machine,
                "≤ %.2fx: %s" % (goal_cpu, "yes" if machine <= goal_cpu else "NO"),
            )
        )

    work = tempfile.mkdtemp(prefix="lora-otel-always-on-")
    try:
        short = pairs([PY, "-c", "pass"], args.pairs, os.path.join(work, "pass"))
        ratio_row("python -c pass", short, 1.10, 1.15)
        where = sorted({os.path.relpath(os.path.dirname(p), os.path.join(work, "pass")) for p in short["left"]})
        rows.append(
            (
                "files left by %d `python -c pass` (cwd, HOME, XDG_STATE_HOME, TMPDIR)" % args.pairs,
                "0",
                "%d%s" % (len(short["left"]), " in " + ", ".join(where) if where else ""),
                "+%d" % len(short["left"]),
                "0: %s" % ("yes" if not short["left"] else "NO"),
            )
        )
        pip = pairs([PY, "-m", "pip", "--version"], args.pip_pairs, os.path.join(work, "pip"))
        ratio_row("pip --version", pip, 1.10, 1.15)
        fork = fork_cost(args.forks, args.fork_procs, work)
        added = fork["traced_ms"] - fork["bare_ms"]
        rows.append(
            (
                "os.fork() + os._exit(0): ms per fork, median of %d processes x %d" % (fork["procs"], fork["forks"]),
                "%.3f ms" % fork["bare_ms"],
                "%.3f ms" % fork["traced_ms"],
                "+%.3f ms" % added,
                "≤ +0.3 ms: %s" % ("yes" if added <= 0.3 else "NO"),
            )
        )
        rows.append(
            (
                "os.fork() + os._exit(0): files left per fork",
                "0",
                "%.2f" % fork["files_per_fork"],
                "+%.2f" % fork["files_per_fork"],
                "0: %s" % ("yes" if fork["files_per_fork"] == 0 else "NO"),
            )
        )
        idle = idle_growth(args.idle_s, work)
        rows.append(
            (
                "idle traced process: journal growth per hour (%d B in %.0f s, extrapolated)"
                % (idle["bytes"], idle["window_s"]),
                "0 B",
                "%.1f kB" % (idle["per_hour"] / 1000),
                "+%.1f kB/h" % (idle["per_hour"] / 1000),
                "≤ 50 kB/h: %s" % ("yes" if idle["per_hour"] <= 50_000 else "NO"),
            )
        )
        if not args.no_job:
            fe = first_evidence(work)
            for kind, label in (("job", "a job (a stage)"), ("short", "python -c pass")):
                if fe[kind]:
                    med, worst = statistics.median(fe[kind]), max(fe[kind])
                    rows.append(
                        (
                            "first evidence, %s: µs from the preamble's start, median (max) of %d"
                            % (label, len(fe[kind])),
                            "—",
                            "%d (%d)" % (med, worst),
                            "—",
                            "≤ 5000: %s" % ("yes" if med <= 5000 else "NO"),
                        )
                    )
            import hang_to_line

            for label, case, needle, extra, goal in hang_to_line.CASES:
                seconds = hang_to_line.one(case, needle, hang_to_line._env(**extra))
                rows.append(
                    (
                        "job: hang → line, " + label,
                        "—",
                        "%.2f s" % seconds,
                        "—",
                        "≤ %.0f s: %s" % (goal, "yes" if seconds <= goal else "NO"),
                    )
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        reap_all()
    print(
        "lora_otel always on — %s, Python %s, %d CPUs, load %s, %s\n"
        % (
            os.uname().machine,
            sys.version.split()[0],
            os.cpu_count() or 0,
            "/".join("%.1f" % x for x in os.getloadavg()),
            time.strftime("%Y-%m-%d"),
        )
    )
    print("| measure | baseline (untraced) | LORA_OTEL=1 | ratio / added | goal: met |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print("| %s |" % " | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
