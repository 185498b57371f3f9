"""How long after a stall's limit the stall is visible in Jaeger — through the backends we ship.

    python bench/backends_visibility.py [--runs 5] [--limit 2]

The path is the one of docs/backends.md and tests/test_backends_jaeger.py, all real: a traced job
in zero-code mode (``LORA_OTEL=1``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` = our collector, OTLP/gRPC)
→ its sidecar → our collector (``otelcol-lora``, ``collector/otelcol.yaml`` unchanged except ports;
no Tempo here, its exporter points at a closed port) → Jaeger v2 (``deploy/jaeger/jaeger.yaml``,
in memory). Binaries from ``collector/build.sh`` (``LORA_OTEL_BACKENDS_DIR`` to reuse a build).

Each run starts a job whose import sleeps, with ``LORA_OTEL_STALL_AFTER=import=LIMIT``, under a
service name of its own, and polls Jaeger every 50 ms. Measured from the moment the stall became
true (the import span's start in the journal + the limit) to the first poll that shows:

- ``/api/v3/traces`` (search by service): the stalled span, incomplete;
- ``/api/traces?tags={"lora_otel.incomplete":"true"}`` (the UI's tag search, as docs/backends.md
  tells a user to search).

What adds up: the sidecar's stall check (it polls the journal), the evidence it gathers (a stack
dump), the OTLP export, the collector's ``batch`` processor (``timeout: 2s`` in otelcol.yaml: a
lone stall waits for it) and Jaeger's own ``batch`` before its store. Prints a markdown table,
median and worst of ``--runs``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from backends import Jaeger, OtelCol, free_port, otlp_spans  # noqa: E402

from lora_otel.journal.reader import read_journal  # noqa: E402

POLL_S = 0.05


def env_for(endpoint: str, service: str, limit: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_")) and k != "TRACEPARENT"}
    env.update(
        LORA_OTEL="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME=service,
        LORA_OTEL_STALL_AFTER="import=%g" % limit,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return env


def import_start(workdir: Path, timeout: float = 30.0) -> float:
    """Wall time (s) at which the journal's ``import slowmod`` span started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (workdir / "lora-otel").glob("*.otel.jsonl"):
            for span in read_journal(path).spans:
                if span.name == "import slowmod":
                    return span.start_ns / 1e9
        time.sleep(0.02)
    raise RuntimeError("no import span in the journal")


def one(jaeger: Jaeger, collector: OtelCol, workdir: Path, service: str, limit: float) -> dict:
    (workdir / "slowmod.py").write_text("import time\ntime.sleep(600)\n")
    (workdir / "job.py").write_text("import slowmod\n")
    env = dict(env_for(collector.grpc_endpoint, service, limit), LORA_OTEL_DIR=str(workdir / "lora-otel"))
    proc = subprocess.Popen(
        [sys.executable, "job.py"], cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    seen: dict = {}
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            now = time.time()
            if "v3" not in seen and any(
                s["name"] == "import slowmod" and s["attrs"].get("lora_otel.incomplete")
                for s in otlp_spans(jaeger.find_traces(service))
            ):
                seen["v3"] = now
            if "tags" not in seen and jaeger.search_tags(service, {"lora_otel.incomplete": "true"}):
                seen["tags"] = now
            time.sleep(POLL_S)
        if len(seen) < 2:
            raise RuntimeError("the stall was not in Jaeger after 60 s (%s)" % sorted(seen))
        assert proc.poll() is None, "the job must still be running"
        stalled_at = import_start(workdir) + limit
    finally:
        proc.kill()
        proc.wait()
    return {k: t - stalled_at for k, t in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--limit", type=float, default=2.0, help="the import stall limit, s (default 2)")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="backends-visibility-") as tmp:
        work = Path(tmp)
        jaeger = Jaeger(work)
        try:
            collector = OtelCol(
                work, exporters={"otlp_grpc/jaeger": jaeger.otlp_grpc, "otlp_grpc/tempo": "127.0.0.1:%d" % free_port()}
            )
            try:
                for i in range(args.runs):
                    run_dir = work / ("run%d" % i)
                    run_dir.mkdir()
                    results.append(one(jaeger, collector, run_dir, "visibility-%d" % i, args.limit))
                    print(
                        "run %d: %s" % (i + 1, ", ".join("%s %.2f s" % kv for kv in sorted(results[-1].items()))),
                        file=sys.stderr,
                    )
            finally:
                collector.stop()
        finally:
            jaeger.stop()
    print(
        "stall → visible in Jaeger — %s, Python %s, %d CPUs, %s; import stall limit %g s, %d runs, poll %d ms"
        % (
            platform.machine(),
            platform.python_version(),
            os.cpu_count() or 0,
            time.strftime("%Y-%m-%d"),
            args.limit,
            args.runs,
            POLL_S * 1000,
        )
    )
    print()
    print("| seen through | s after the limit, median | worst |")
    print("|---|---:|---:|")
    for key, label in (
        ("v3", "`/api/v3/traces` (search by service): the stalled span"),
        ("tags", "`/api/traces` tag search `lora_otel.incomplete=true` (the UI's)"),
    ):
        values = [r[key] for r in results]
        print("| %s | %.2f | %.2f |" % (label, statistics.median(values), max(values)))


if __name__ == "__main__":
    main()
