"""What one span costs the job: ``with lora_otel.stage("x"):`` side by side with an OpenTelemetry SDK span.

    python bench/span_cost.py [--spans 20000] [--runs 7] [--variants empty,stage,stage+sidecar,sdk,sdk-refused,...]

Each variant runs in a fresh process that opens and closes ``--spans`` spans in a tight loop
(``with ...: pass``, after 500 untimed ones) and reports the loop's wall time divided by the
count: the mean cost of one span in that process, everything included (a background exporter
thread that takes the GIL in the middle of the loop is part of the cost). Variants are run
interleaved ``--runs`` times, so machine noise hits them alike; the table shows the median over
the runs, in µs per span, and the ratio to the OTel SDK span and the added µs over the empty
``with``.

Variants (rows):
- empty: ``with noop("x"): pass``, a context-manager class whose ``__init__``, ``__enter__`` and
  ``__exit__`` do nothing: the Python cost of the ``with`` statement itself (the baseline);
- stage, inactive: ``with lora_otel.stage("x"):`` with LORA_OTEL unset (the API does nothing);
- stage: the same in a traced process (``LORA_OTEL=1``, journal in a temporary directory, no
  endpoint): a ``start`` and an ``end`` record, each one ``os.write``;
- stage + sidecar: the same with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set to a real collector (rotel
  agent, blackhole exporter), so the job starts its sidecar, which exports the spans from another
  process (it polls the journal every 0.5 s, so with a short loop most of its work comes after
  the loop); each run waits for that sidecar to finish before the next starts;
- sdk: ``with tracer.start_as_current_span("x"):`` after the OTel SDK's default set-up
  (``TracerProvider`` + ``BatchSpanProcessor(OTLPSpanExporter())``, http/protobuf, endpoint from
  the environment) exporting to the same rotel agent;
- sdk-refused: the same with the endpoint a loopback port nobody listens on;
- mark: ``lora_otel.mark("tick")`` inside one stage, traced (an ``event`` record, a ``line``
  record and the line on stderr, a pipe the bench reads);
- sdk-event: ``span.add_event("tick")`` on one open SDK span (rotel endpoint).

The SDK's ``BatchSpanProcessor`` holds at most 2048 spans and drops the rest when the exporter
cannot keep up (it logs "Queue full" once). The SDK span rows count them: the processor's queue (a
private attribute; ``?`` when absent) is swapped for a ``deque`` subclass that counts each append
to a full queue, by the end of the loop; the subclass adds one Python call per span (~0.3 µs
here, charged to the SDK rows). A dropped span costs the job less than an exported one, so a row
with drops flatters the SDK. lora_otel drops nothing: every span is in the journal. The SDK
processes leave with ``os._exit`` after the loop (their exit-time flush is exit_delay.py's
subject). The span event rows (``mark``, ``sdk-event``) are compared with each other. No goal is
set for the per-span cost.
"""

from __future__ import annotations

import argparse
import compileall
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
from exit_delay import check_sidecar, refused_port  # noqa: E402
from sidecar_cost import env_base, start_rotel  # noqa: E402

PY = sys.executable

CHILD = r"""
import sys, time
kind, n = sys.argv[1], int(sys.argv[2])

class noop:
    __slots__ = ("name",)
    def __init__(self, name):
        self.name = name
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False

if kind in ("sdk", "sdk-event"):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    import collections
    class CountingQueue(collections.deque):  # counts the spans the processor drops when its queue is full
        dropped = 0
        def appendleft(self, item):
            if len(self) == self.maxlen:
                CountingQueue.dropped += 1
            super().appendleft(item)
    provider = TracerProvider()
    bsp = BatchSpanProcessor(OTLPSpanExporter())
    inner = getattr(bsp, "_batch_processor", None)
    counting = isinstance(getattr(inner, "_queue", None), collections.deque)
    if counting:
        inner._queue = CountingQueue(inner._queue, inner._queue.maxlen)
    provider.add_span_processor(bsp)
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("bench")
    span = tracer.start_as_current_span
    outer = tracer.start_as_current_span("outer")
else:
    import lora_otel
    span = noop if kind == "empty" else lora_otel.stage
    outer = lora_otel.stage("outer")

def loop(count):
    if kind in ("mark", "sdk-event"):
        if kind == "mark":
            ev = lora_otel.mark
        else:
            ev = trace.get_current_span().add_event
        t = time.perf_counter_ns()
        for _ in range(count):
            ev("tick")
        return time.perf_counter_ns() - t
    t = time.perf_counter_ns()
    for _ in range(count):
        with span("x"):
            pass
    return time.perf_counter_ns() - t

with outer:
    loop(500)
    dt = loop(n)
print("SPAN", dt / n, flush=True)
if kind == "sdk":
    print("DROPPED", CountingQueue.dropped if counting else -1, flush=True)
if kind in ("sdk", "sdk-event"):
    import os
    os._exit(0)  # the exporter's flush at exit (seconds while it retries) is exit_delay.py's business
"""

VARIANTS = {
    # name: (label, child kind, traced?, endpoint: None | "rotel" | "refused")
    "empty": ("empty `with` of a no-op context manager", "empty", False, None),
    "stage-inactive": ("lora_otel.stage, LORA_OTEL unset (inactive)", "stage", False, None),
    "stage": ("lora_otel.stage, LORA_OTEL=1 (journal only)", "stage", True, None),
    "stage+sidecar": ("lora_otel.stage, LORA_OTEL=1 + endpoint to rotel (its sidecar runs)", "stage", True, "rotel"),
    "sdk": ("OTel SDK span, BatchSpanProcessor(OTLPSpanExporter()) → rotel", "sdk", False, "rotel"),
    "sdk-refused": ("OTel SDK span, same set-up, endpoint refused", "sdk", False, "refused"),
    "mark": ('lora_otel.mark("tick"), LORA_OTEL=1', "mark", True, None),
    "sdk-event": ('OTel SDK span.add_event("tick") → rotel', "sdk-event", False, "rotel"),
}
DEFAULT_VARIANTS = list(VARIANTS)


def reference(variant: str) -> str:
    """The OTel SDK row a variant is compared with: the span, or for the event rows the span event."""
    return "sdk-event" if VARIANTS[variant][1] in ("mark", "sdk-event") else "sdk"


def dropped_text(r: dict, variant: str) -> str:
    """Spans the SDK dropped over all runs of a row ("?" when unknown, "" for lora_otel rows)."""
    if VARIANTS[variant][1] != "sdk":
        return ""
    return "?" if r["dropped"][variant] < 0 else "%d of %d" % (r["dropped"][variant], (r["spans"] + 500) * r["runs"])


def run_one(variant: str, spans: int, work: str, endpoints: dict) -> dict:
    _label, kind, traced, ep = VARIANTS[variant]
    d = tempfile.mkdtemp(prefix=variant + "-", dir=work)
    env = env_base()
    env["OTEL_SERVICE_NAME"] = "bench"
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=d, LORA_OTEL_STALL_AFTER="100000")
    if ep is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoints[ep]
    r = subprocess.run(
        [PY, "-c", CHILD, kind, str(spans)],
        env=env,
        cwd=d,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    t_end = time.time()
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("SPAN ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError("%s: exit code %s, no result; stderr: %s" % (variant, r.returncode, r.stderr[-800:]))
    dropped = [int(ln.split()[1]) for ln in r.stdout.splitlines() if ln.startswith("DROPPED ")]
    out = {"ns": float(lines[-1].split()[1]), "dropped": dropped[-1] if dropped else 0}
    if traced and ep is not None:  # let the sidecar finish before the next run, so sidecars never overlap
        out["sidecar"] = check_sidecar(d, t_end, 60)
    shutil.rmtree(d, ignore_errors=True)
    return out


def measure(spans: int = 20000, runs: int = 7, variants=tuple(DEFAULT_VARIANTS)) -> dict:
    """Run the variants interleaved; per variant the per-process µs per span, and dropped-span counts."""
    compileall.compile_dir(str(REPO / "lora_otel"), quiet=1)
    work = tempfile.mkdtemp(prefix="lora-otel-span-cost-")
    notes = []
    endpoints = {"refused": "http://127.0.0.1:%d" % refused_port()}
    rotel = start_rotel(work)
    if rotel is not None:
        endpoints["rotel"] = rotel[1]
        collector = "rotel agent (%s, blackhole exporter)" % rotel[1]
    else:
        collector = "none: rotel is not installed"
        dropped_variants = [v for v in variants if VARIANTS[v][3] == "rotel"]
        if dropped_variants:
            notes.append("skipped (rotel is not installed): %s" % ", ".join(dropped_variants))
        variants = [v for v in variants if VARIANTS[v][3] != "rotel"]
    samples: dict = {v: [] for v in variants}
    dropped: dict = dict.fromkeys(variants, 0)
    sidecar_logs: dict = {}
    try:
        for v in variants:  # warm the page cache (not counted)
            run_one(v, 1000, work, endpoints)
        t0 = time.monotonic()
        for i in range(runs):
            for v in variants:
                r = run_one(v, spans, work, endpoints)
                samples[v].append(r["ns"] / 1000)
                dropped[v] = -1 if min(dropped[v], r["dropped"]) < 0 else dropped[v] + r["dropped"]
                if "sidecar" in r:
                    sidecar_logs[v] = r["sidecar"].get("log", "")
            print(
                "span_cost: run %d of %d done (%.0f s)" % (i + 1, runs, time.monotonic() - t0),
                file=sys.stderr,
                flush=True,
            )
    finally:
        if rotel is not None:
            rotel[0].terminate()
            rotel[0].wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "spans": spans,
        "runs": runs,
        "variants": list(variants),
        "us": samples,
        "median_us": {v: statistics.median(s) for v, s in samples.items()},
        "dropped": dropped,
        "collector": collector,
        "notes": notes,
        "sidecar_logs": sidecar_logs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=20000, help="spans per process (default 20000)")
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per variant, interleaved (default 7)")
    ap.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="which rows (default all: %s)" % ",".join(DEFAULT_VARIANTS),
    )
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error("unknown variants %s; known: %s" % (unknown, ", ".join(VARIANTS)))
    r = measure(args.spans, args.runs, variants)
    med = r["median_us"]
    print(
        "lora_otel per-span cost — %s, Python %s, %d CPUs, %s; %d spans per process, %d processes per row "
        "(interleaved, median); collector: %s"
        % (
            os.uname().machine,
            sys.version.split()[0],
            os.cpu_count(),
            time.strftime("%Y-%m-%d"),
            args.spans,
            args.runs,
            r["collector"],
        )
    )
    for note in r["notes"]:
        print(note)
    print()
    print(
        "| what | µs per span (median) | min–max over runs | vs OTel SDK (span; event for the event rows) "
        "| added µs vs empty `with` | OTel SDK spans dropped (queue full) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for v in r["variants"]:
        m, ref = med[v], med.get(reference(v))
        print(
            "| %s | %.2f | %.2f–%.2f | %s | %s | %s |"
            % (
                VARIANTS[v][0],
                m,
                min(r["us"][v]),
                max(r["us"][v]),
                "%.2fx" % (m / ref) if ref else "",
                "%+.2f" % (m - med["empty"]) if "empty" in med else "",
                dropped_text(r, v),
            )
        )
    for v, log in r["sidecar_logs"].items():
        print("%s: last run's sidecar log: %s" % (v, log))


if __name__ == "__main__":
    main()
