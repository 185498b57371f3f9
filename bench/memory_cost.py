"""The memory a traced job adds in its memory cgroup: in the job itself and in its sidecar.

    python bench/memory_cost.py [--mb 100] [--seconds 5] [--runs 3] [--limit-mb 120]

Run as root (it creates memory cgroups). Each run gets a fresh memory cgroup of its own, a child
of this process's (cgroup v1 ``memory`` hierarchy, or v2 with the ``memory`` controller), and runs
one job in it: a plain program that allocates ``--mb`` MB (``b"x" * N``, every page touched) and
sleeps ``--seconds`` s, long enough to become a job (its first beat) and to start its sidecar,
which lives in the same cgroup. Rows, one after another, ``--runs`` times each, interleaved:

- without lora_otel (the baseline of the same run);
- ``LORA_OTEL=1 LORA_OTEL_LIVE=0``: the in-process half only (no sidecar);
- ``LORA_OTEL=1``: the in-process half and the local watchdog (the sidecar without an endpoint);
- ``LORA_OTEL=1`` with ``OTEL_EXPORTER_OTLP_ENDPOINT``: the sidecar exports (a real collector, the
  rotel agent with its blackhole exporter, when installed; else a loopback port that refuses).

Per run: the cgroup's peak (``memory.max_usage_in_bytes`` in v1, ``memory.peak`` in v2, and the
highest ``memory.usage_in_bytes``/``memory.current`` polled every 20 ms), the job's own peak
resident size (its ``VmHWM``, read by the job at its end) and the sidecar's (the highest ``VmHWM``
of the process running ``lora_otel.export.sidecar`` in the cgroup, polled until it exits). Figures
are medians of the runs, each beside the baseline's. With ``--limit-mb`` every row runs once more
in a cgroup limited to that many MB and says whether the job survived or was OOM-killed.
``lora_otel`` is byte-compiled first, as pip installs it (compiling from source costs the sidecar
several MB more).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = sys.executable
MB = 1 << 20

JOB = """\
import sys, time
data = b"x" * (int(sys.argv[1]) << 20)
time.sleep(float(sys.argv[2]))
with open("/proc/self/status") as f:
    hwm = [line.split()[1] for line in f if line.startswith("VmHWM:")][0]
with open(sys.argv[3], "w") as f:
    f.write(hwm)
"""

ROWS = ("baseline", "in-process", "local", "exporting")
ROW_NAMES = {
    "baseline": "without lora_otel",
    "in-process": "LORA_OTEL=1 LORA_OTEL_LIVE=0 (no sidecar)",
    "local": "LORA_OTEL=1 (local watchdog)",
    "exporting": "LORA_OTEL=1 + OTLP endpoint (exporting sidecar)",
}


class Cgroup:
    """A fresh memory cgroup (v1 or v2) below this process's, removed by `remove`."""

    def __init__(self, name: str) -> None:
        from lora_otel._boot.cgroup import memory_cgroup

        own = memory_cgroup()
        if own is None:
            raise SystemExit("memory_cost: no memory cgroup found (/proc/self/cgroup)")
        self.v2 = not own.startswith("/sys/fs/cgroup/memory")
        if self.v2:
            # v2: a cgroup with processes cannot hand the memory controller down; the root can.
            for parent in (own, "/sys/fs/cgroup"):
                try:
                    with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                        f.write("+memory")
                    break
                except OSError:
                    continue
            else:
                raise SystemExit("memory_cost: cannot enable the memory controller below %s" % own)
        else:
            parent = own
        self.path = os.path.join(parent, name)
        os.mkdir(self.path)
        self.usage = "memory.current" if self.v2 else "memory.usage_in_bytes"
        self.peak_file = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"

    def read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def limit(self, mb: int) -> None:
        with open(os.path.join(self.path, "memory.max" if self.v2 else "memory.limit_in_bytes"), "w") as f:
            f.write(str(mb * MB))

    def join(self) -> None:
        """Move the calling process into the cgroup (a child's ``preexec_fn``)."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.read("cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    def usage_bytes(self) -> int:
        try:
            return int(self.read(self.usage))
        except (OSError, ValueError):
            return 0

    def peak_bytes(self) -> int:
        try:
            return int(self.read(self.peak_file))
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int:
        from lora_otel._boot.cgroup import oom_kill_count

        return oom_kill_count(self.path) or 0

    def remove(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.rmdir(self.path)
                return
            except OSError:
                for pid in self.pids():  # what is left of the run (a sidecar still draining)
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.1)


def vm_hwm_kb(pid: int) -> int:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def is_sidecar(pid: int) -> bool:
    """Whether ``pid`` runs the sidecar's own program (after its exec: before it, a forked copy of
    the job shares the job's pages and its VmHWM counts them)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"lora_otel.export.sidecar" in f.read()
    except OSError:
        return False


def run_once(row: str, args: argparse.Namespace, work: str, n: int, endpoint: str, limit_mb: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if row != "baseline":
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=os.path.join(work, "journals"), LORA_OTEL_STALL_AFTER="100000")
    if row == "in-process":
        env["LORA_OTEL_LIVE"] = "0"
    if row == "exporting":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    cg = Cgroup("lora-otel-memory-cost-%d-%s-%d" % (os.getpid(), row, n))
    if limit_mb:
        cg.limit(limit_mb)
    hwm_file = os.path.join(work, "hwm-%s-%d" % (row, n))
    try:
        job = subprocess.Popen(
            [PY, os.path.join(work, "job.py"), str(args.mb), str(args.seconds), hwm_file],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=cg.join,
        )
        usage = 0
        others: dict[int, int] = {}
        deadline = time.monotonic() + args.seconds + 120
        while time.monotonic() < deadline:
            usage = max(usage, cg.usage_bytes())
            pids = cg.pids()
            for pid in pids:
                if pid != job.pid and is_sidecar(pid):
                    others[pid] = max(others.get(pid, 0), vm_hwm_kb(pid))
            if job.poll() is not None and not [p for p in pids if p != job.pid]:
                break
            time.sleep(0.02)
        rc = job.wait()
        try:
            job_hwm = int(Path(hwm_file).read_text()) / 1024
        except (OSError, ValueError):
            job_hwm = float("nan")
        return {
            "peak": max(cg.peak_bytes(), usage) / MB,
            "job": job_hwm,
            "sidecar": max(others.values()) / 1024 if others else 0.0,
            "rc": rc,
            "oom": cg.oom_kills(),
        }
    finally:
        cg.remove()


def measure(args: argparse.Namespace) -> dict:
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)  # as pip installs it: compiling costs memory too
    work = tempfile.mkdtemp(prefix="lora-otel-memory-cost-")
    Path(work, "job.py").write_text(JOB)
    from sidecar_cost import free_port, start_rotel

    rotel = start_rotel(work)
    if rotel is not None:
        collector_proc, endpoint = rotel
        collector = "rotel agent (blackhole exporter)"
    else:
        collector_proc, endpoint = None, "http://127.0.0.1:%d" % free_port()
        collector = "none: a refusing loopback port (rotel is not installed)"
    rows = [r for r in ROWS if r in args.rows.split(",")]
    results: dict[str, list[dict]] = {row: [] for row in rows}
    limited: dict[str, dict] = {}
    try:
        run_once("baseline", args, work, -1, endpoint)  # warm the page cache: the first run reads every file
        for n in range(args.runs):
            for row in rows:
                print("memory_cost: %s, run %d ..." % (row, n + 1), file=sys.stderr, flush=True)
                results[row].append(run_once(row, args, work, n, endpoint))
        if args.limit_mb:
            for row in rows:
                print("memory_cost: %s in %d MB ..." % (row, args.limit_mb), file=sys.stderr, flush=True)
                limited[row] = run_once(row, args, work, 99, endpoint, args.limit_mb)
    finally:
        if collector_proc is not None:
            collector_proc.terminate()
            collector_proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return {"results": results, "limited": limited, "collector": collector}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="MB the job allocates (default 100)")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the job sleeps after (default 5)")
    ap.add_argument("--runs", type=int, default=3, help="runs per row, interleaved (default 3)")
    ap.add_argument("--rows", default=",".join(ROWS), help="which rows (default %s)" % ",".join(ROWS))
    ap.add_argument("--limit-mb", type=int, default=0, help="also run each row once in a cgroup of this many MB")
    args = ap.parse_args()
    res = measure(args)
    results = res["results"]

    def med(row: str, key: str) -> float:
        return statistics.median(r[key] for r in results[row])

    print(
        "lora_otel memory cost — %s, Python %s, %d CPUs, %s; a job allocating %d MB then sleeping %g s, "
        "median of %d runs per row (interleaved); collector: %s"
        % (
            os.uname().machine,
            sys.version.split()[0],
            os.cpu_count(),
            time.strftime("%Y-%m-%d"),
            args.mb,
            args.seconds,
            args.runs,
            res["collector"],
        )
    )
    print()
    print("| row | cgroup peak MB | vs baseline | job's own VmHWM MB | vs baseline | sidecar VmHWM MB |")
    print("|---|---:|---:|---:|---:|---:|")
    base = "baseline" if "baseline" in results else None
    for row in results:
        peak, job = med(row, "peak"), med(row, "job")
        print(
            "| %s | %.1f | %s | %.1f | %s | %s |"
            % (
                ROW_NAMES[row],
                peak,
                "+%.1f MB (%.2f×)" % (peak - med(base, "peak"), peak / med(base, "peak")) if base else "",
                job,
                "+%.1f MB" % (job - med(base, "job")) if base else "",
                "%.1f" % med(row, "sidecar") if row in ("local", "exporting") else "—",
            )
        )
    if res["limited"]:
        print()
        print("| row | in a %d MB memory cgroup | cgroup peak MB |" % args.limit_mb)
        print("|---|---|---:|")
        for row, r in res["limited"].items():
            killed = r["oom"] or r["rc"] in (-9, 137)
            fate = ("OOM-killed (exit %s)" if killed else "survived (exit %s)") % r["rc"]
            print("| %s | %s | %.1f |" % (ROW_NAMES[row], fate, r["peak"]))


if __name__ == "__main__":
    main()
