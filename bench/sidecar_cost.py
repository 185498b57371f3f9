"""What the live-export sidecar costs while it follows a job: CPU (% of one core) and memory.

    python bench/sidecar_cost.py [--seconds 60] [--rows idle,marks,stages] [--mark-rate 2000] [--stage-rate 500]

Each row starts one traced job (``LORA_OTEL=1`` with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, so the
job starts its detached sidecar) that runs for ``--seconds`` inside ``lora_otel.stage(...)``:

- idle: ``time.sleep`` (the job only writes its once-per-second beat);
- marks: ``lora_otel.mark(...)`` at ``--mark-rate`` per second (each is a span event, a line on
  stderr and a ``line`` record, which the sidecar sends as an OTLP log record);
- stages: ``with lora_otel.stage(...)`` blocks at ``--stage-rate`` per second (each a span the
  sidecar exports when it ends);
- burst: ``--burst`` short stages as fast as it can at the start, then ``time.sleep``: an idle job
  whose journal already holds many spans. Its window starts ``--burst-warmup`` s after the start,
  once the sidecar has exported the burst.

The collector is a real one, the ``rotel`` agent (blackhole exporter, no debug output, so its own
work stays small), or a loopback port that refuses connections when rotel is not installed; the
output says which. The sidecar's pid is read from the journal (root attribute
``lora_otel.sidecar.pid``). After ``--warmup`` seconds (its start-up: importing the SDK and
reading the journal so far) its ``/proc/<pid>/stat`` utime+stime and ``/proc/<pid>/status``
VmRSS/VmHWM are sampled, again every second, and a last time one second before the job ends:
CPU % is (utime+stime difference) / wall time of that window, for the whole process (all threads).
Rows run one after another, so they do not compete for the CPUs. Stall detection is kept quiet
with ``LORA_OTEL_STALL_AFTER=100000``.
"""

from __future__ import annotations

import argparse
import compileall
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
HZ = os.sysconf("SC_CLK_TCK")
GOAL_CPU = 1.0
GOAL_MB = 100.0

JOB = """\
import sys, time
import lora_otel

kind, seconds, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
t0 = time.monotonic()
end = t0 + seconds
n = 0
with lora_otel.stage(kind):
    if kind == "idle":
        time.sleep(seconds)
    elif kind == "burst":
        while n < rate:
            with lora_otel.stage("step", i=n):
                pass
            n += 1
        time.sleep(max(end - time.monotonic(), 0))
    else:
        while True:
            now = time.monotonic()
            if now >= end:
                break
            due = int((now - t0) * rate)
            while n < due:
                if kind == "marks":
                    lora_otel.mark("tick %d" % n)
                else:
                    with lora_otel.stage("step", i=n):
                        pass
                n += 1
            time.sleep(0.005)
with open(sys.argv[4], "w") as f:
    f.write(str(n))
"""


def env_base() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rotel(workdir: str):
    """A rotel agent (blackhole exporter, no debug log) on a free loopback port; (process, endpoint) or None."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from collector import rotel_agent_path
    except ImportError:
        return None
    binary = rotel_agent_path()
    if binary is None:
        return None
    grpc, http = free_port(), free_port()
    out = open(os.path.join(workdir, "rotel.out"), "wb")  # noqa: SIM115 - rotel's output, closed when it stops
    p = subprocess.Popen(
        [
            str(binary),
            "start",
            "--otlp-grpc-endpoint",
            "127.0.0.1:%d" % grpc,
            "--otlp-http-endpoint",
            "127.0.0.1:%d" % http,
            "--exporter",
            "blackhole",
            "--pid-file",
            os.path.join(workdir, "rotel.pid"),
            "--log-file",
            os.path.join(workdir, "rotel.log"),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        if p.poll() is not None:
            raise RuntimeError("rotel exited with %s" % p.returncode)
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", http)) == 0:
                return p, "http://127.0.0.1:%d" % http
        if time.monotonic() > deadline:
            p.kill()
            raise RuntimeError("rotel is not listening after 20 s")
        time.sleep(0.05)


def proc_sample(pid: int):
    """(cpu seconds, VmRSS MB, VmHWM MB), or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            return None
        cpu = (int(fields[11]) + int(fields[12])) / HZ
        rss = hwm = 0.0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) / 1024
        return cpu, rss, hwm
    except (OSError, ValueError, IndexError):
        return None


def find_sidecar(jdir: str, job: subprocess.Popen, timeout: float = 20.0) -> int:
    from lora_otel.journal.reader import read_journal

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in glob.glob(os.path.join(jdir, "*.otel.jsonl")):
            j = read_journal(path)
            if j.root is not None and j.root.attrs.get("lora_otel.sidecar.pid"):
                return int(j.root.attrs["lora_otel.sidecar.pid"])
        if job.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError("no lora_otel.sidecar.pid in the journal under %s" % jdir)


def run_row(kind: str, rate: float, args, base_env: dict, work: str) -> dict:
    jdir = tempfile.mkdtemp(prefix=kind + "-", dir=work)
    script = os.path.join(work, "job.py")
    count_file = os.path.join(jdir, "count.txt")
    env = dict(base_env, LORA_OTEL="1", LORA_OTEL_DIR=jdir, LORA_OTEL_STALL_AFTER="100000")
    t_start = time.monotonic()
    job = subprocess.Popen(
        [PY, script, kind, str(args.seconds), str(rate), count_file],
        env=env,
        cwd=jdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    pid = find_sidecar(jdir, job)
    t_first = t_start + (args.burst_warmup if kind == "burst" else args.warmup)
    t_last = t_start + args.seconds - 1.0
    time.sleep(max(t_first - time.monotonic(), 0))
    first = proc_sample(pid)
    w0 = time.monotonic()
    job0 = proc_sample(job.pid)
    if first is None:
        raise RuntimeError("the sidecar %d is gone after the warm-up; see its log in %s" % (pid, jdir))
    rss = [first[1]]
    last = first
    while time.monotonic() < t_last:
        time.sleep(min(1.0, max(t_last - time.monotonic(), 0)))
        s = proc_sample(pid)
        if s is None:
            break
        last = s
        rss.append(s[1])
    w1 = time.monotonic()
    job1 = proc_sample(job.pid)
    _, err = job.communicate(timeout=args.seconds + 60)
    t_job_end = time.monotonic()
    # The sidecar finishes by itself: sends what is queued, then exits.
    while proc_sample(pid) is not None and time.monotonic() < t_job_end + 60:
        time.sleep(0.05)
    t_gone = time.monotonic()
    logs = glob.glob(os.path.join(jdir, "*.sidecar.log"))
    summary = ""
    if logs:
        lines = Path(logs[0]).read_text(errors="replace").strip().splitlines()
        ended = [x for x in lines if "process ended" in x]
        summary = (ended or lines or [""])[-1]
    journal = glob.glob(os.path.join(jdir, "*.otel.jsonl"))
    try:
        n = int(Path(count_file).read_text())
    except (OSError, ValueError):
        n = -1
    return {
        "kind": kind,
        "pid": pid,
        "window_s": w1 - w0,
        "cpu_pct": (last[0] - first[0]) / (w1 - w0) * 100,
        "startup_cpu_s": first[0],
        "rss_first": first[1],
        "rss_last": last[1],
        "rss_max": max(rss),
        "hwm": last[2],
        "job_cpu_pct": ((job1[0] - job0[0]) / (w1 - w0) * 100) if job0 and job1 else float("nan"),
        "records": n,
        "rate": n / args.seconds if n >= 0 else float("nan"),
        "window": (t_first - t_start, t_last - t_start),
        "journal_mb": os.path.getsize(journal[0]) / 1e6 if journal else 0.0,
        "exit_after_s": t_gone - t_job_end,
        "log": summary,
        "rc": job.returncode,
        "stderr": err.decode(errors="replace")[-500:],
    }


def measure(
    seconds: float = 60.0,
    warmup: float = 5.0,
    rows=("idle", "marks", "stages", "burst"),
    mark_rate: float = 2000.0,
    stage_rate: float = 500.0,
    burst: int = 30000,
    burst_warmup: float = 20.0,
) -> dict:
    """Run the rows one after another against one collector; a dict per row (see :func:`run_row`)."""
    if seconds < max(warmup, burst_warmup if "burst" in rows else 0) + 3:
        raise ValueError("seconds must be at least warmup/burst_warmup + 3")
    args = argparse.Namespace(seconds=seconds, warmup=warmup, burst_warmup=burst_warmup, burst=burst)
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)
    work = tempfile.mkdtemp(prefix="lora-otel-sidecar-cost-")
    Path(work, "job.py").write_text(JOB)
    base = env_base()
    rotel = start_rotel(work)
    if rotel is not None:
        collector_proc, endpoint = rotel
        collector = "rotel agent (%s, blackhole exporter)" % endpoint
    else:
        collector_proc = None
        endpoint = "http://127.0.0.1:%d" % free_port()
        collector = "NO collector: a refusing loopback port (%s); rotel is not installed" % endpoint
    base["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    rates = {"idle": 0.0, "marks": mark_rate, "stages": stage_rate, "burst": float(burst)}
    results = []
    try:
        for kind in rows:
            print("sidecar_cost: running %s for %g s ..." % (kind, seconds), file=sys.stderr, flush=True)
            results.append(run_row(kind, rates[kind], args, base, work))
    finally:
        if collector_proc is not None:
            collector_proc.terminate()
            collector_proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "results": results,
        "collector": collector,
        "rotel": rotel is not None,
        "seconds": seconds,
        "warmup": warmup,
        "burst": burst,
        "burst_warmup": burst_warmup,
    }


def row_name(kind: str, burst: int) -> str:
    return {
        "idle": "idle (sleep in a stage)",
        "marks": "busy: lora_otel.mark()",
        "stages": "busy: short lora_otel.stage()",
        "burst": "idle after %d short stages" % burst,
    }[kind]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long each job runs (default 60)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before the first sample (default 5)")
    ap.add_argument("--rows", default="idle,marks,stages,burst", help="which jobs (default idle,marks,stages,burst)")
    ap.add_argument("--mark-rate", type=float, default=2000.0, help="lora_otel.mark calls per second (default 2000)")
    ap.add_argument("--stage-rate", type=float, default=500.0, help="short stages per second (default 500)")
    ap.add_argument("--burst", type=int, default=30000, help="short stages before the burst job idles (default 30000)")
    ap.add_argument("--burst-warmup", type=float, default=20.0, help="the burst row's first sample (default 20 s)")
    args = ap.parse_args()
    if args.seconds < max(args.warmup, args.burst_warmup) + 3:
        ap.error("--seconds must be at least --warmup/--burst-warmup + 3")
    res = measure(
        args.seconds,
        args.warmup,
        [r.strip() for r in args.rows.split(",") if r.strip()],
        args.mark_rate,
        args.stage_rate,
        args.burst,
        args.burst_warmup,
    )
    results = res["results"]

    print(
        "lora_otel sidecar cost — %s, Python %s, %d CPUs, %s; jobs of %g s, window from %g s to %g s "
        "after the job's start (burst: from %g s); collector: %s"
        % (
            os.uname().machine,
            sys.version.split()[0],
            os.cpu_count(),
            time.strftime("%Y-%m-%d"),
            args.seconds,
            args.warmup,
            args.seconds - 1,
            args.burst_warmup,
            res["collector"],
        )
    )
    print()
    print(
        "| job | records/s | window s | sidecar CPU % of one core | sidecar start-up CPU s | RSS MB (start → end) "
        "| peak RSS MB (VmHWM) | job's own CPU % | journal MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        rate = {"idle": "beat only", "burst": "beat only (after the burst)"}.get(r["kind"], "%.0f" % r["rate"])
        print(
            "| %s | %s | %.0f–%.0f | %.2f | %.2f | %.1f → %.1f | %.1f | %.1f | %.1f |"
            % (
                row_name(r["kind"], args.burst),
                rate,
                r["window"][0],
                r["window"][1],
                r["cpu_pct"],
                r["startup_cpu_s"],
                r["rss_first"],
                r["rss_last"],
                r["hwm"],
                r["job_cpu_pct"],
                r["journal_mb"],
            )
        )
    print()
    print("| figure | value | goal |")
    print("|---|---:|---|")
    for r in results:
        if r["kind"] in ("idle", "burst"):
            print(
                "| sidecar CPU following an %s job | %.2f %% | < %g %%: %s |"
                % (row_name(r["kind"], args.burst), r["cpu_pct"], GOAL_CPU, "yes" if r["cpu_pct"] < GOAL_CPU else "NO")
            )
        print(
            "| sidecar peak memory (VmHWM), %s | %.1f MB | < %g MB: %s |"
            % (row_name(r["kind"], args.burst), r["hwm"], GOAL_MB, "yes" if r["hwm"] < GOAL_MB else "NO")
        )
    print()
    for r in results:
        print(
            "%s: sidecar pid %d, exited %.2f s after the job; its log: %s"
            % (r["kind"], r["pid"], r["exit_after_s"], r["log"])
        )
        if r["rc"] != 0:
            print("    job exit code %s: %s" % (r["rc"], r["stderr"]))


if __name__ == "__main__":
    main()
