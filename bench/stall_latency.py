"""How long after a stall's limit the stall reaches a real collector — the live path end to end.

    python bench/stall_latency.py [--runs 3] [--sdk-wait 8]

Each case runs a real traced job in zero-code mode (``LORA_OTEL=1`` with
``OTEL_EXPORTER_OTLP_ENDPOINT`` set, so the job starts its sidecar) against a real collector (the
``rotel`` agent from PyPI, as in the tests), and measures the time from the moment the stall
became true to the moment the collector printed the span:

- sleep-hang in an import: from the import span's start + its limit (``import=2``);
- GIL held in an import (frozen): from the last beat + ``LORA_OTEL_FROZEN_AFTER`` (3 s);
- SIGSTOP (frozen): from the last beat + 3 s;
- SIGKILL mid-stage: from the kill to the finalised stage;
- a stage that stalls (limit 2 s) and recovers: the stall as above, and the "(continued)" span from
  the stage's real end;
- the collector unreachable, then back: from the collector's start to the last span's arrival;
- with ``--sdk-wait S``, the baseline: the OpenTelemetry SDK's default set-up (``BatchSpanProcessor``
  + ``OTLPSpanExporter``) with a span that hangs: is it at the collector S s after its start, and
  2 s after the job is SIGKILLed? (A finished span of the same job shows the pipeline works.)

The limits are short to keep the run short; the latency does not depend on them. The goal is
≤ 3 s in every case. Prints a markdown table (median and max over the runs).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from collector import Collector, free_port, rotel_agent_path  # noqa: E402
from lora_otel.journal.reader import read_journal  # noqa: E402

LIMIT_S = 2.0
FROZEN_S = 3.0


def env_for(endpoint: str, workdir: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_")) and k != "TRACEPARENT"}
    env.update(
        LORA_OTEL="1",
        LORA_OTEL_DIR=str(workdir / "journals"),
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        LORA_OTEL_STALL_AFTER="import=%g,load model=%g" % (LIMIT_S, LIMIT_S),
        LORA_OTEL_FROZEN_AFTER="%g" % FROZEN_S,
    )
    env.update(extra)
    return env


def kind_of(collector: Collector, name: str) -> str:
    return next(s for s in collector.spans() if s.name == name).attributes.get("lora_otel.stall.kind", "")


def start(workdir: Path, script: str, env: dict) -> subprocess.Popen:
    (workdir / "job.py").write_text(script)
    return subprocess.Popen(
        [sys.executable, "job.py"], cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def journal(workdir: Path):
    found = sorted((workdir / "journals").glob("*.otel.jsonl"))
    return read_journal(found[0]) if found else None


def wait_span(collector: Collector, name: str, timeout: float = 60.0) -> float:
    """The wall time at which the collector had printed a span called ``name``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(s.name == name for s in collector.spans()):
            return time.time()
        time.sleep(0.02)
    raise RuntimeError("no span %r at the collector after %s s" % (name, timeout))


def wait_open(workdir: Path, name: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = journal(workdir)
        if j is not None:
            for s in j.spans:
                if s.name == name and s.end_ns is None:
                    return s
        time.sleep(0.02)
    raise RuntimeError("no open span %r" % name)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def case_sleep_import(collector: Collector, workdir: Path) -> dict:
    (workdir / "slowmod.py").write_text("import time\ntime.sleep(600)\n")
    proc = start(workdir, "import slowmod\n", env_for(collector.http_endpoint, workdir))
    try:
        span = wait_open(workdir, "import slowmod")
        arrived = wait_span(collector, "import slowmod")
    finally:
        stop(proc)
    return {"stall": arrived - (span.start_ns / 1e9 + LIMIT_S)}


def _frozen_deadline(workdir: Path, collector: Collector, name: str) -> float:
    """The last sign of life before the stall was declared, + the frozen limit (as stall.detect).

    The stall's detection time is the incomplete span's end; records after it (the stack request signal for the
    stacks can wake a GIL holder for a moment) do not count.
    """
    import json

    detected = next(s for s in collector.spans() if s.name == name).end_ns
    path = sorted((workdir / "journals").glob("*.otel.jsonl"))[0]
    last = 0
    for line in path.read_bytes().splitlines():
        try:
            ts = json.loads(line)["ts"]
        except (ValueError, KeyError):
            continue
        if ts < detected:
            last = max(last, ts)
    return last / 1e9 + FROZEN_S


def case_gil_import(collector: Collector, workdir: Path) -> dict:
    (workdir / "frozenmod.py").write_text("import ctypes\nwhile True:\n    ctypes.PyDLL(None).pause()\n")
    proc = start(
        workdir, "import frozenmod\n", env_for(collector.http_endpoint, workdir, LORA_OTEL_STALL_AFTER="import=600")
    )
    try:
        wait_open(workdir, "import frozenmod")
        arrived = wait_span(collector, "import frozenmod")
        deadline = _frozen_deadline(workdir, collector, "import frozenmod")
        assert kind_of(collector, "import frozenmod") == "frozen"
    finally:
        stop(proc)
    return {"stall": arrived - deadline}


def case_sigstop(collector: Collector, workdir: Path) -> dict:
    proc = start(
        workdir,
        "import lora_otel, time\nwith lora_otel.stage('load data'):\n    time.sleep(600)\n",
        env_for(collector.http_endpoint, workdir),
    )
    try:
        wait_open(workdir, "load data")
        time.sleep(1.2)
        os.kill(proc.pid, signal.SIGSTOP)
        arrived = wait_span(collector, "load data")
        deadline = _frozen_deadline(workdir, collector, "load data")
        assert kind_of(collector, "load data") == "frozen"
        os.kill(proc.pid, signal.SIGCONT)
    finally:
        stop(proc)
    return {"stall": arrived - deadline}


def case_sigkill(collector: Collector, workdir: Path) -> dict:
    proc = start(
        workdir,
        "import lora_otel, time\nwith lora_otel.stage('save checkpoint'):\n    time.sleep(600)\n",
        env_for(collector.http_endpoint, workdir),
    )
    try:
        wait_open(workdir, "save checkpoint")
        time.sleep(1.0)
        killed = time.time()
        proc.kill()
        proc.wait()
        arrived = wait_span(collector, "save checkpoint")
    finally:
        stop(proc)
    return {"death": arrived - killed}


def case_recover(collector: Collector, workdir: Path) -> dict:
    proc = start(
        workdir,
        "import lora_otel, time\nwith lora_otel.stage('load model'):\n    time.sleep(%g)\n" % (LIMIT_S + 2),
        env_for(collector.http_endpoint, workdir),
    )
    try:
        span = wait_open(workdir, "load model")
        stalled = wait_span(collector, "load model")
        proc.wait(60)
        continued = wait_span(collector, "load model (continued)")
    finally:
        stop(proc)
    end = next(s for s in journal(workdir).spans if s.name == "load model").end_ns / 1e9
    return {"stall": stalled - (span.start_ns / 1e9 + LIMIT_S), "continued": continued - end}


def case_outage(binary: Path, workdir: Path) -> dict:
    port = free_port()
    script = "import lora_otel\nfor i in range(30):\n    with lora_otel.stage('step %d' % i):\n        pass\n"
    proc = start(workdir, script, env_for("http://127.0.0.1:%d" % port, workdir, OTEL_EXPORTER_OTLP_TIMEOUT="1"))
    proc.wait(60)
    time.sleep(3)
    up = time.time()
    collector = Collector(binary, workdir, http_port=port)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            spans = collector.spans()
            if len(spans) >= 32:
                break
            time.sleep(0.02)
        arrived = time.time()
        time.sleep(1)
        spans = collector.spans()
    finally:
        collector.stop()
    ids = [s.span_id for s in spans]
    return {"back": arrived - up, "lost": 32 - len(set(ids)), "duplicates": len(ids) - len(set(ids))}


SDK_HANG = """\
import time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("bench")
with tracer.start_as_current_span("setup"):
    pass
with tracer.start_as_current_span("load model"):
    with open("started", "w") as f:
        f.write(repr(time.time()))
    time.sleep(600)
"""


def case_sdk_hang(collector: Collector, workdir: Path, wait_s: float) -> dict:
    """The baseline: the OTel SDK's default set-up, a span that hangs, then a SIGKILL.

    A finished span ("setup") goes first, to show the pipeline delivers; then "load model" stays
    open. Reports whether "load model" reached the collector ``wait_s`` after its start, and 2 s
    after the SIGKILL that follows.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORA_OTEL", "OTEL_")) and k != "TRACEPARENT"}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint, OTEL_SERVICE_NAME="bench")
    proc = start(workdir, SDK_HANG, env)
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "started").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the OTel SDK job did not start its span (exit code %s)" % proc.returncode)
            time.sleep(0.02)
        started = float((workdir / "started").read_text())
        time.sleep(max(started + wait_s - time.time(), 0))
        names = [x.name for x in collector.spans()]
        setup_seen, hung_seen = "setup" in names, "load model" in names
        proc.kill()
        proc.wait()
        time.sleep(2.0)
        killed_seen = "load model" in [x.name for x in collector.spans()]
    finally:
        stop(proc)
    return {"wait_s": wait_s, "setup_seen": setup_seen, "hung_seen": hung_seen, "killed_seen": killed_seen}


CASES = [
    ("sleep-hang in an import", case_sleep_import),
    ("GIL held in an import", case_gil_import),
    ("SIGSTOPped process", case_sigstop),
    ("SIGKILL mid-stage", case_sigkill),
    ("stage stalls, then recovers", case_recover),
]


WHAT = {
    "stall": "stall at the collector, after the limit",
    "death": "finalised spans, after the SIGKILL",
    "continued": '"(continued)" span, after the real end',
}


def measure(runs: int = 3, binary: Path | None = None, sdk_wait_s: float = 0.0) -> dict:
    """Every case ``runs`` times, each against a fresh collector; seconds per (case, what arrived).

    Returns ``results`` {(case label, key): [seconds]} (keys as in :data:`WHAT`), ``outage``
    (one dict per run: ``back`` seconds, ``lost``, ``duplicates``) and, when ``sdk_wait_s`` > 0,
    ``sdk`` (:func:`case_sdk_hang` once, the OTel SDK baseline). Raises when rotel is missing.
    """
    binary = binary or rotel_agent_path()
    if binary is None:
        raise RuntimeError("rotel is not installed: pip install rotel")
    results: dict = {}
    for label, case in CASES:
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                workdir = Path(tmp)
                collector = Collector(binary, workdir)
                try:
                    for key, value in case(collector, workdir).items():
                        results.setdefault((label, key), []).append(value)
                finally:
                    collector.stop()
        print("stall_latency: %s done" % label, file=sys.stderr, flush=True)
    outage = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            outage.append(case_outage(binary, Path(tmp)))
    sdk = None
    if sdk_wait_s > 0:
        with tempfile.TemporaryDirectory() as tmp:
            collector = Collector(binary, Path(tmp))
            try:
                sdk = case_sdk_hang(collector, Path(tmp), sdk_wait_s)
            finally:
                collector.stop()
    return {"runs": runs, "results": results, "outage": outage, "sdk": sdk}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--sdk-wait",
        type=float,
        default=0.0,
        help="also run the OTel SDK baseline: a hung span, looked for this many s after its start (default 0: skip)",
    )
    args = parser.parse_args()
    binary = rotel_agent_path()
    if binary is None:
        print("rotel is not installed: pip install rotel", file=sys.stderr)
        return 2
    res = measure(args.runs, binary, args.sdk_wait)
    results, outage = res["results"], res["outage"]
    print(
        "Stall-to-collector latency (%d runs each; limits: import/stage %g s, frozen %g s)\n"
        % (args.runs, LIMIT_S, FROZEN_S)
    )
    print("| case | what arrived | median s | max s |")
    print("|---|---|---:|---:|")
    for (label, key), values in results.items():
        print("| %s | %s | %.2f | %.2f |" % (label, WHAT[key], statistics.median(values), max(values)))
    backs = [o["back"] for o in outage]
    print(
        "| collector down, then back | all 32 spans, after the collector started | %.2f | %.2f |"
        % (statistics.median(backs), max(backs))
    )
    print(
        "\nOutage: %d runs, 32 spans each: %d lost, %d duplicated"
        % (len(outage), sum(o["lost"] for o in outage), sum(o["duplicates"] for o in outage))
    )
    if res["sdk"]:
        print(sdk_summary(res["sdk"]))
    return 0


def sdk_summary(sdk: dict) -> str:
    return (
        "OTel SDK default (BatchSpanProcessor), a span that hangs: at the collector %g s after its start: %s; "
        "2 s after a SIGKILL: %s (a finished span of the same job: %s)"
        % (
            sdk["wait_s"],
            "yes" if sdk["hung_seen"] else "no",
            "yes" if sdk["killed_seen"] else "no",
            "arrived" if sdk["setup_seen"] else "did not arrive",
        )
    )


if __name__ == "__main__":
    sys.exit(main())
