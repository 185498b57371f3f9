"""Numbers for sizing lora_otel beyond one box (docs/scale.md): what one job produces, how fast the
sidecar exports, how fast a collector ingests, and what N concurrent jobs' sidecars cost.

    python bench/scale.py [--steps 40] [--stages 20000] [--ingest-spans 1000000] [--jobs 1,4,8] [--seconds 20]

(a) per job: runs ``examples/train_lora.py --steps N`` traced (``LORA_OTEL=1``, no endpoint: no
    sidecar) and reports its journal(s): bytes, records, spans (after translation), log lines, and the
    spans' OTLP protobuf size (``encode_spans(...).SerializeToString()``, the body the sidecar
    posts; uncompressed).
(b) sidecar export throughput: a traced job writes ``--stages`` short ``lora_otel.stage`` blocks;
    then a ``Follower`` (the sidecar's core, in this process, the sidecar's OTLP/HTTP exporter)
    exports that whole journal to a real collector (rotel agent, blackhole exporter) until
    everything is delivered: spans/s of wall time and per CPU-second of the follower process.
(c) collector ingest: the same spans, pre-encoded in 512-span OTLP/HTTP requests, posted over one
    keep-alive connection until ``--ingest-spans`` went in; rotel's CPU time from /proc gives
    spans per collector CPU-second (the wall rate is bounded by this Python client on this box).
(d) N concurrent idle jobs: N traced jobs (each with its detached sidecar) against one rotel; after
    a warm-up, the sidecars' summed CPU % (of one core) and RSS over a window, and rotel's.
The collector is rotel (PyPI ``rotel``, see tests/collector.py); without it the bench stops.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from sidecar_cost import JOB, env_base, find_sidecar, proc_sample, start_rotel  # noqa: E402

PY = sys.executable


def journals(d: str) -> list:
    return sorted(glob.glob(os.path.join(d, "**", "*.otel.jsonl"), recursive=True))


def otlp_spans(path: str):
    from lora_otel.export.otlp import translate
    from lora_otel.journal.reader import read_journal

    j = read_journal(path)
    return j, translate(j).spans


def encode(spans) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans).SerializeToString()


def per_job(args, work: str) -> dict:
    d = tempfile.mkdtemp(prefix="job-", dir=work)
    env = dict(env_base(), LORA_OTEL="1", LORA_OTEL_DIR=d)
    t0 = time.monotonic()
    subprocess.run(
        [PY, str(REPO / "examples" / "train_lora.py"), "--steps", str(args.steps)],
        env=env,
        cwd=d,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.monotonic() - t0
    out = {"wall": wall, "files": 0, "jbytes": 0, "records": 0, "jspans": 0, "spans": 0, "lines": 0, "obytes": 0}
    for p in journals(d):
        j, spans = otlp_spans(p)
        out["files"] += 1
        out["jbytes"] += os.path.getsize(p)
        with open(p, "rb") as f:
            out["records"] += sum(1 for _ in f)
        out["jspans"] += len(j.spans)
        out["spans"] += len(spans)
        out["lines"] += len(j.lines)
        out["obytes"] += len(encode(spans)) if spans else 0
    return out


def print_per_job(a: dict, title: str) -> None:
    """`per_job`'s figures as a two-column markdown table headed ``title``."""
    print("| %s | value |" % title)
    print("|---|---:|")
    print("| journals (processes) | %d |" % a["files"])
    print("| journal bytes | %d |" % a["jbytes"])
    print("| journal records (JSON lines) | %d |" % a["records"])
    print("| spans in the journal | %d |" % a["jspans"])
    print("| spans exported (short successful imports dropped) | %d |" % a["spans"])
    print("| log records (journal lines) | %d |" % a["lines"])
    print("| OTLP protobuf bytes of the spans (uncompressed) | %d |" % a["obytes"])
    print("| OTLP bytes per span | %.0f |" % (a["obytes"] / max(a["spans"], 1)))
    print("| job wall time, s | %.1f |" % a["wall"])


def burst_journal(args, work: str) -> str:
    d = tempfile.mkdtemp(prefix="burst-", dir=work)
    env = dict(env_base(), LORA_OTEL="1", LORA_OTEL_DIR=d, LORA_OTEL_STALL_AFTER="100000")
    subprocess.run(
        [PY, os.path.join(work, "job.py"), "burst", "0", str(args.stages), os.path.join(d, "n.txt")],
        env=env,
        cwd=d,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    [path] = journals(d)
    return path


def sidecar_throughput(path: str, rotel_pid: int, endpoint: str) -> dict:
    os.environ.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, LORA_OTEL_STALL_AFTER="100000")
    os.environ.pop("OTEL_EXPORTER_OTLP_PROTOCOL", None)
    from lora_otel.export.live import Follower
    from lora_otel.export.otlp import make_exporter

    r0 = proc_sample(rotel_pid)
    c0, t0 = time.process_time(), time.monotonic()
    f = Follower(path, exporter=make_exporter(timeout=10))
    sent = 0
    while True:
        sent += len(f.poll())
        if not f.backlog:
            break
        time.sleep(0.01)
    ok = f.close(120)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    r1 = proc_sample(rotel_pid)
    return {"spans": sent, "ok": ok, "dropped": f.dropped, "wall": wall, "cpu": cpu, "rotel_cpu": r1[0] - r0[0]}


def collector_ingest(path: str, rotel_pid: int, endpoint: str, total: int) -> dict:
    _, spans = otlp_spans(path)
    bodies = [encode(spans[i : i + 512]) for i in range(0, len(spans), 512)]
    sizes = [min(512, len(spans) - i) for i in range(0, len(spans), 512)]
    host, port = endpoint.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    r0 = proc_sample(rotel_pid)
    t0 = time.monotonic()
    n = nbytes = i = 0
    while n < total:
        body = bodies[i % len(bodies)]
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError("rotel answered %d" % resp.status)
        n += sizes[i % len(sizes)]
        nbytes += len(body)
        i += 1
    wall = time.monotonic() - t0
    r1 = proc_sample(rotel_pid)
    conn.close()
    return {"spans": n, "bytes": nbytes, "requests": i, "wall": wall, "rotel_cpu": r1[0] - r0[0], "rotel_rss": r1[1]}


def concurrent(n: int, args, work: str, endpoint: str, rotel_pid: int) -> dict:
    env = dict(env_base(), LORA_OTEL="1", LORA_OTEL_STALL_AFTER="100000", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    jobs = []
    for k in range(n):
        d = tempfile.mkdtemp(prefix="n%d-%d-" % (n, k), dir=work)
        p = subprocess.Popen(
            [PY, os.path.join(work, "job.py"), "idle", str(args.seconds), "0", os.path.join(d, "n.txt")],
            env=dict(env, LORA_OTEL_DIR=d),
            cwd=d,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        jobs.append((d, p))
    t_start = time.monotonic()
    pids = [find_sidecar(d, p, timeout=60) for d, p in jobs]
    time.sleep(max(t_start + args.warmup - time.monotonic(), 0))
    first = [proc_sample(pid) for pid in pids]
    r0 = proc_sample(rotel_pid)
    w0 = time.monotonic()
    time.sleep(max(t_start + args.seconds - 1.5 - time.monotonic(), 1.0))
    last = [proc_sample(pid) for pid in pids]
    r1 = proc_sample(rotel_pid)
    w = time.monotonic() - w0
    for _, p in jobs:
        p.wait(args.seconds + 60)
    if any(s is None for s in first + last):
        raise RuntimeError("a sidecar vanished inside the window (N=%d)" % n)
    return {
        "n": n,
        "window": w,
        "cpu_pct": sum(b[0] - a[0] for a, b in zip(first, last)) / w * 100,
        "startup_cpu": sum(a[0] for a in first) / n,
        "rss": sum(b[1] for b in last),
        "hwm": max(b[2] for b in last),
        "rotel_pct": (r1[0] - r0[0]) / w * 100,
        "rotel_rss": r1[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="(a) train_lora.py --steps (default 40)")
    ap.add_argument("--stages", type=int, default=20000, help="(b) short stages in the journal (default 20000)")
    ap.add_argument("--ingest-spans", type=int, default=1000000, help="(c) spans posted to rotel (default 1000000)")
    ap.add_argument("--jobs", default="1,4,8", help="(d) concurrent idle jobs per row (default 1,4,8)")
    ap.add_argument("--seconds", type=float, default=20.0, help="(d) each idle job's length (default 20)")
    ap.add_argument("--warmup", type=float, default=10.0, help="(d) first sample after the start (default 10)")
    ap.add_argument("--skip", default="", help="parts to skip, e.g. a,d")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    work = tempfile.mkdtemp(prefix="lora-otel-scale-")
    Path(work, "job.py").write_text(JOB)
    rotel = start_rotel(work)
    if rotel is None:
        sys.exit("rotel is not installed (pip install rotel): no collector to measure against")
    rp, endpoint = rotel
    print(
        "lora_otel scale bench — %s, Python %s, %d CPUs, %s; collector: rotel agent %s (blackhole exporter)"
        % (os.uname().machine, sys.version.split()[0], os.cpu_count(), time.strftime("%Y-%m-%d"), endpoint)
    )
    print()
    try:
        if "a" not in skip:
            print("running (a) train_lora.py --steps %d ..." % args.steps, file=sys.stderr, flush=True)
            a = per_job(args, work)
            print_per_job(a, "(a) one job: examples/train_lora.py --steps %d" % args.steps)
            print()
        if not {"b", "c"} <= skip:
            print("writing a journal of %d stages ..." % args.stages, file=sys.stderr, flush=True)
            path = burst_journal(args, work)
            jb = os.path.getsize(path)
            print(
                "| (b, c) %d short stages | spans | wall s | spans/s (wall) | CPU s | spans per CPU-s | notes |"
                % args.stages
            )
            print("|---|---:|---:|---:|---:|---:|---|")
            if "b" not in skip:
                print("running (b) the sidecar's Follower ...", file=sys.stderr, flush=True)
                b = sidecar_throughput(path, rp.pid, endpoint)
                print(
                    "| sidecar Follower → rotel, OTLP/HTTP | %d | %.2f | %.0f | %.2f (follower) | %.0f "
                    "| journal %.1f MB; delivered: %s, dropped %d; rotel CPU %.2f s |"
                    % (
                        b["spans"],
                        b["wall"],
                        b["spans"] / b["wall"],
                        b["cpu"],
                        b["spans"] / b["cpu"],
                        jb / 1e6,
                        b["ok"],
                        b["dropped"],
                        b["rotel_cpu"],
                    )
                )
            if "c" not in skip:
                print("running (c) collector ingest ...", file=sys.stderr, flush=True)
                c = collector_ingest(path, rp.pid, endpoint, args.ingest_spans)
                print(
                    "| rotel ingest, pre-encoded 512-span OTLP/HTTP requests, 1 connection | %d | %.2f | %.0f "
                    "| %.2f (rotel) | %.0f | %d requests, %.1f MB, %.0f bytes/span; rotel RSS %.0f MB |"
                    % (
                        c["spans"],
                        c["wall"],
                        c["spans"] / c["wall"],
                        c["rotel_cpu"],
                        c["spans"] / c["rotel_cpu"] if c["rotel_cpu"] > 0 else float("inf"),
                        c["requests"],
                        c["bytes"] / 1e6,
                        c["bytes"] / c["spans"],
                        c["rotel_rss"],
                    )
                )
            print()
        if "d" not in skip:
            rows = []
            for n in [int(x) for x in args.jobs.split(",") if x.strip()]:
                print("running (d) N=%d idle jobs for %g s ..." % (n, args.seconds), file=sys.stderr, flush=True)
                rows.append(concurrent(n, args, work, endpoint, rp.pid))
            print(
                "| (d) N concurrent idle jobs | window s | sidecars' CPU % of one core (sum) | per sidecar | "
                "sidecar start-up CPU s (mean) | sidecars' RSS MB (sum) | per sidecar | rotel CPU % | rotel RSS MB |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in rows:
                print(
                    "| %d | %.1f | %.2f | %.2f | %.2f | %.0f | %.1f | %.2f | %.0f |"
                    % (
                        r["n"],
                        r["window"],
                        r["cpu_pct"],
                        r["cpu_pct"] / r["n"],
                        r["startup_cpu"],
                        r["rss"],
                        r["rss"] / r["n"],
                        r["rotel_pct"],
                        r["rotel_rss"],
                    )
                )
            print()
    finally:
        rp.terminate()
        rp.wait(10)
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
