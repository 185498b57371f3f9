"""Spans/s through our collector into a real Jaeger, with the stall counter exact (issue 14's figure).

    python bench/backends_throughput.py [--jobs 300] [--stages 2000]

1. Capture: one real traced job (``LORA_OTEL=1``, its sidecar exporting OTLP/HTTP) runs
   ``--stages`` short ``lora_otel.stage`` blocks, then stalls in an import (a module that sleeps;
   ``LORA_OTEL_STALL_AFTER=import=1``) and is killed once the stall is out. A small HTTP server in
   this process takes what the sidecar sends (``/v1/traces`` and ``/v1/logs`` request bodies, as
   sent) — the stage spans, the stalled span with its ancestors, the WARN ``stall detected:``
   record, the spans finalised after the kill.
2. Replay: ``--jobs`` copies of that job, each with a new trace id and ``service.instance.id``
   (the bodies re-serialised, nothing else changed), posted over one keep-alive OTLP/HTTP
   connection as fast as the collector answers to our collector (``otelcol-lora`` running
   ``collector/otelcol.yaml``, ports only; its ``otlp_grpc/jaeger`` exporter to a Jaeger v2,
   ``deploy/jaeger/jaeger.yaml``, in memory; ``otlp_grpc/tempo`` to a closed port: no Tempo here).
3. Measured: from the first post until Jaeger's OTLP receiver has accepted every span (its own
   ``otelcol_receiver_accepted_spans`` counter): spans/s; the collector's and Jaeger's CPU
   seconds over that time (/proc); then the stall counters read from the collector's Prometheus
   exporter (what Prometheus scrapes): ``lora_otel_stalls_total`` and
   ``lora_otel_stall_log_records_total`` summed over the copies, beside the stalls sent; and
   Jaeger's query API for three copies: the whole trace, the stalled span with its error status.

The wall rate is bounded by this machine (2 cores shared by the client, the collector and Jaeger);
spans per collector CPU-second is the figure that travels.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import http.server
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from backends import Jaeger, OtelCol, otlp_spans, wait_until  # noqa: E402
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from sidecar_cost import env_base, proc_sample  # noqa: E402

PY = sys.executable
JOB = """\
import lora_otel
names = ("load batch", "forward", "backward", "optimizer step")
for i in range(%d):
    with lora_otel.stage(names[i %% 4]):
        pass
import stuckmod
"""


class _Capture(http.server.BaseHTTPRequestHandler):
    """Keeps every OTLP/HTTP body it is sent; answers 200 with an empty (valid) response."""

    bodies: list = []  # noqa: RUF012 - one list shared by every request handler instance, on purpose

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _stall_spans(bodies: list) -> list:
    out = []
    for path, body in bodies:
        if path == "/v1/traces":
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        stage = [a.value.string_value for a in span.attributes if a.key == "lora_otel.stall.stage"]
                        if stage == [span.name]:
                            out.append(span)
    return out


def capture(work: str, stages: int) -> list:
    """What one real job's sidecar sends: [(path, body)], traces and logs."""
    _Capture.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    job = os.path.join(work, "job")
    os.makedirs(job)
    Path(job, "stuckmod.py").write_text("import time\ntime.sleep(600)\n")
    Path(job, "job.py").write_text(JOB % stages)
    env = dict(
        env_base(),
        LORA_OTEL="1",
        LORA_OTEL_DIR=os.path.join(job, "journal"),
        PYTHONPATH=str(REPO),
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:%d" % server.server_address[1],
        OTEL_SERVICE_NAME="bench-job",
        LORA_OTEL_STALL_AFTER="import=1",
    )
    proc = subprocess.Popen(
        [PY, "job.py"], cwd=job, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(
            lambda: (
                _stall_spans(list(_Capture.bodies))
                and any(p == "/v1/logs" and b"stall detected:" in b for p, b in list(_Capture.bodies))
            ),
            120,
            "the stall from the real job's sidecar",
        )
    finally:
        proc.kill()
        proc.wait()
    from lora_otel.journal.reader import read_journal

    [path] = glob.glob(os.path.join(job, "journal", "**", "*.otel.jsonl"), recursive=True)
    sidecar = read_journal(path).root.attrs.get("lora_otel.sidecar.pid")
    if sidecar:  # it finalises the spans left open by the kill, sends them and exits
        wait_until(
            lambda: (
                not os.path.exists("/proc/%d" % sidecar) or open("/proc/%d/stat" % sidecar).read()  # noqa: SIM115 - /proc, read once and dropped.rpartition(")")[2].split()[0] == "Z"
            ),
            60,
            "the sidecar to exit",
        )
    server.shutdown()
    server.server_close()
    return list(_Capture.bodies)


def _set_attr(attributes, key: str, value: str) -> None:
    for a in attributes:
        if a.key == key:
            a.value.string_value = value
            return


def copies(bodies: list, jobs: int):
    """Yield (path, body, spans) for each copy: a new trace id and service.instance.id each."""
    parsed = [
        (p, (ExportTraceServiceRequest if p == "/v1/traces" else ExportLogsServiceRequest).FromString(b))
        for p, b in bodies
        if p in ("/v1/traces", "/v1/logs")
    ]
    for _ in range(jobs):
        trace_id, instance = os.urandom(16), str(uuid.uuid4())
        for path, template in parsed:
            req = type(template)()
            req.CopyFrom(template)
            n = 0
            groups = req.resource_spans if path == "/v1/traces" else req.resource_logs
            for group in groups:
                _set_attr(group.resource.attributes, "service.instance.id", instance)
                for scope in group.scope_spans if path == "/v1/traces" else group.scope_logs:
                    for item in scope.spans if path == "/v1/traces" else scope.log_records:
                        item.trace_id = trace_id
                        n += path == "/v1/traces"
            yield path, req.SerializeToString(), n, trace_id.hex()


def metric_sum(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if re.match(re.escape(name) + r"(\{| )", line)
    )


def run(args) -> dict:
    work = tempfile.mkdtemp(prefix="backends-throughput-")
    bodies = capture(work, args.stages)
    per_job = sum(n for _, _, n, _ in copies(bodies, 1))
    stalls_per_job = len(_stall_spans(bodies))
    jaeger = Jaeger(Path(work))
    try:
        col = OtelCol(Path(work), exporters={"otlp_grpc/jaeger": jaeger.otlp_grpc, "otlp_grpc/tempo": "127.0.0.1:1"})
        try:
            jaeger_metrics = "http://127.0.0.1:%d/metrics" % jaeger.ports["metrics"]

            def accepted() -> float:
                with __import__("urllib.request").request.urlopen(jaeger_metrics, timeout=5) as r:
                    return metric_sum(r.read().decode(), "otelcol_receiver_accepted_spans_total")

            before = accepted()
            payload = list(copies(bodies, args.jobs))
            total = sum(n for _, _, n, _ in payload)
            conn = http.client.HTTPConnection("127.0.0.1", col.ports["otlp_http"], timeout=60)
            c0, j0 = proc_sample(col.process.pid)[0], proc_sample(jaeger.process.pid)[0]
            t0 = time.monotonic()
            refused = 0
            for path, body, _, _ in payload:
                while True:
                    conn.request("POST", path, body=body, headers={"Content-Type": "application/x-protobuf"})
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status == 200:
                        break
                    refused += 1  # memory_limiter or a full queue: back off as an exporter does
                    time.sleep(0.1)
            posted = time.monotonic() - t0
            wait_until(lambda: accepted() - before >= total, 600, "Jaeger accepting every span", every=0.05)
            wall = time.monotonic() - t0
            c1, j1 = proc_sample(col.process.pid)[0], proc_sample(jaeger.process.pid)[0]
            conn.close()
            stalls_sent = stalls_per_job * args.jobs
            counted = wait_until(
                lambda: (
                    lambda t: (
                        (metric_sum(t, "lora_otel_stalls_total"), metric_sum(t, "lora_otel_stall_log_records_total"))
                        if metric_sum(t, "lora_otel_stalls_total") >= stalls_sent
                        else None
                    )
                )(col.prometheus_metrics()),
                60,
                "the stall counter",
            )
            checked = []
            for _, _, _, trace_id in [payload[0], payload[len(payload) // 2], payload[-1]]:
                spans = otlp_spans(jaeger.get_trace(trace_id))
                stall = [s for s in spans if s["attrs"].get("lora_otel.stall.stage") == s["name"]]
                checked.append(
                    len(spans) == per_job
                    and len(stall) == stalls_per_job
                    and all(s["status"].get("code") in (2, "STATUS_CODE_ERROR") for s in stall)
                )  # OTLP/JSON: 2
            time.sleep(1)  # nothing more arrives after the wait: the count is final
            extra = accepted() - before - total
        finally:
            col.stop()
    finally:
        jaeger.stop()
    return {
        "jobs": args.jobs,
        "per_job": per_job,
        "spans": total,
        "posted": posted,
        "wall": wall,
        "col_cpu": c1 - c0,
        "jaeger_cpu": j1 - j0,
        "refused": refused,
        "stalls_sent": stalls_sent,
        "stalls_counted": counted[0],
        "log_records_counted": counted[1],
        "traces_checked": checked,
        "extra": extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300, help="copies of the captured job (one stall each)")
    ap.add_argument("--stages", type=int, default=2000, help="stage spans of the captured job")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    r = run(args)
    rate = r["spans"] / r["wall"]
    print("# spans through our collector (collector/otelcol.yaml) into Jaeger v2 (in memory), OTLP/HTTP in")
    print(
        "python bench/backends_throughput.py --jobs %d --stages %d; %d cores"
        % (args.jobs, args.stages, os.cpu_count() or 0)
    )
    print()
    print("| measure | value |")
    print("|---|---:|")
    print("| jobs replayed (spans per job, as its sidecar sent them) | %d (%d) |" % (r["jobs"], r["per_job"]))
    print("| spans sent | %d |" % r["spans"])
    print("| posting took (client, one keep-alive connection) | %.2f s |" % r["posted"])
    print("| first post → all spans accepted by Jaeger | %.2f s |" % r["wall"])
    print("| spans/s into Jaeger (wall) | %.0f |" % rate)
    print(
        "| collector CPU s (spans per collector CPU-second) | %.2f (%.0f) |"
        % (r["col_cpu"], r["spans"] / max(r["col_cpu"], 1e-9))
    )
    print("| Jaeger CPU s | %.2f |" % r["jaeger_cpu"])
    print("| requests refused (retried) | %d |" % r["refused"])
    print("| spans accepted by Jaeger beyond those sent | %d |" % r["extra"])
    print("| stalls sent / lora_otel_stalls_total counted | %d / %d |" % (r["stalls_sent"], r["stalls_counted"]))
    print(
        "| stall WARN records sent / lora_otel_stall_log_records_total | %d / %d |"
        % (r["stalls_sent"], r["log_records_counted"])
    )
    print(
        "| traces checked in Jaeger's query API, whole with the stalled span in error | %s |"
        % ", ".join("yes" if ok else "NO" for ok in r["traces_checked"])
    )
    exact = r["stalls_sent"] == r["stalls_counted"] == r["log_records_counted"] and all(r["traces_checked"])
    print()
    print("stall counter exact: %s" % ("yes" if exact else "NO"))
    sys.exit(0 if exact and r["extra"] == 0 else 1)


if __name__ == "__main__":
    main()
