"""Every lora_otel benchmark in one run, printed as ONE markdown table: lora_otel beside its baseline.

    python bench/table.py            # default settings, about 10 minutes on a 2-core machine
    python bench/table.py --quick    # smoke run: small counts, a few minutes
    python bench/table.py --only startup,span,exit

Each section calls the measuring function of one bench script (imported, not copied), which runs
lora_otel and its baseline side by side in the same invocation — interleaved fresh processes
where the script does so — and keeps the raw samples; this script only picks the figures and
formats them. The columns:

- measure: what is measured;
- baseline: what lora_otel is compared with (a bare interpreter, the OpenTelemetry SDK's default
  set-up, an empty function, a raw ``os.write``, ...), and its value;
- lora_otel: the same measure with lora_otel;
- ratio / added: lora_otel ÷ baseline, and/or lora_otel − baseline;
- goal: the design goal and whether this run met it ("yes" / "NO"); "—" where none is set.

Sections (``--only``; default all, in this order):

- startup (bench/startup.py): interpreter start, bare vs ``LORA_OTEL=1`` (vs the OTLP endpoint
  case, which starts the sidecar) vs ``opentelemetry-instrument`` (from opentelemetry-distro, a
  reference; "not installed" when absent); time to first evidence; the unset ``.pth`` hook;
- span (bench/span_cost.py): µs per ``with lora_otel.stage("x"):`` vs an OTel SDK span (default
  ``BatchSpanProcessor(OTLPSpanExporter())`` to rotel, and to a refused port) vs an empty ``with``;
  ``lora_otel.mark`` vs ``span.add_event``;
- step (bench/step_cost.py): per optimizer step, lora_otel's hooks vs two empty functions, and a
  real (tiny) SGD loop traced vs not;
- exit (bench/exit_delay.py): how long the job's exit is delayed, seen by a launcher, with the
  collector refusing, black-holing, slow (answers after ``--slow-s``) or up (rotel), lora_otel
  zero-code and ``lora-otel run`` vs the OTel SDK default;
- journal (bench/journal_throughput.py, which uses bench/scale.py part (a)): journal records/s vs
  raw ``os.write``, and one ``examples/train_lora.py --steps 40`` job's journal vs the OTLP size of
  its spans;
- sidecar (bench/sidecar_cost.py): the sidecar's CPU % of one core and RSS following an idle job
  and an idle job after a burst of short stages, vs an idle process with the OTel SDK set up (this
  script: ``TracerProvider`` + ``BatchSpanProcessor(OTLPSpanExporter())``, one open span, sampled
  from /proc over the same window);
- stall (bench/stall_latency.py): stall → collector latency (rotel) after the stall's limit, the
  SIGKILL case and recovery after an outage, vs the OTel SDK default with a span that hangs.;
- beat (bench/beat_cost.py): per beat, the main thread's frames sampled into the beat record vs
  the beat record without them.
- hang (bench/hang_to_line.py): from a hang to the job's own line naming it and to its STALLED
  line, no collector (an import that sleeps, a read frozen between stages, the GIL held), vs the goal.

The exit status is 1 when a measurement failed (the row says why), 0 otherwise; a goal not met is
shown as "NO" and does not change the exit status. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import beat_cost  # noqa: E402
import exit_delay  # noqa: E402
import hang_to_line  # noqa: E402
import journal_throughput  # noqa: E402
import sidecar_cost  # noqa: E402
import span_cost  # noqa: E402
import startup  # noqa: E402
import step_cost  # noqa: E402

PY = sys.executable
SECTIONS = ["startup", "span", "step", "exit", "journal", "sidecar", "stall", "beat", "hang"]

# Settings per section: (quick, default). Defaults take about 10 minutes on a 2-core machine.
SETTINGS = {
    "startup": ({"runs": 5}, {"runs": 30}),
    "span": ({"spans": 3000, "runs": 2}, {"spans": 20000, "runs": 5}),
    "step": ({"steps": 3000, "runs": 2}, {"steps": 10000, "runs": 5}),
    "exit": ({"runs": 2, "sdk_runs": 1, "drain_s": 2.0}, {"runs": 5, "sdk_runs": 2, "drain_s": 5.0}),
    "journal": ({"stages": 3000, "runs": 2, "steps": 40}, {"stages": 20000, "runs": 5, "steps": 40}),
    "sidecar": (
        {"seconds": 12.0, "warmup": 4.0, "burst": 5000, "burst_warmup": 8.0},
        {"seconds": 30.0, "warmup": 5.0, "burst": 30000, "burst_warmup": 20.0},
    ),
    "stall": ({"runs": 1, "sdk_wait_s": 8.0}, {"runs": 2, "sdk_wait_s": 10.0}),
    "beat": ({"beats": 2000, "runs": 1}, {"beats": 20000, "runs": 5}),
    "hang": ({"runs": 1}, {"runs": 3}),
}
SPAN_VARIANTS = ["empty", "stage", "stage+sidecar", "sdk", "sdk-refused", "mark", "sdk-event"]
EXIT_MODES = ["refused", "blackhole", "slow", "ok"]

SDK_IDLE = """\
import sys, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
with trace.get_tracer("bench").start_as_current_span("idle"):
    time.sleep(float(sys.argv[1]))
"""


class Table:
    """The rows so far; ``fail`` marks a measurement that did not give its figure."""

    def __init__(self) -> None:
        self.rows: list = []
        self.failures: list = []

    def row(self, measure: str, baseline: str, bval: str, lora: str, ratio: str, goal: str) -> None:
        self.rows.append([measure, baseline, bval, lora, ratio, goal])

    def fail(self, measure: str, why: str) -> None:
        self.failures.append("%s: %s" % (measure, why))
        self.rows.append([measure, "", "", "FAILED: %s" % why, "", ""])

    def markdown(self) -> str:
        out = [
            "| measure | baseline | baseline value | lora_otel | ratio / added | goal |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in self.rows:
            out.append("| %s |" % " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r))
        return "\n".join(out)


def goal(ok: bool, text: str) -> str:
    return "%s: %s" % (text, "yes" if ok else "NO")


def ms(x: float) -> str:
    return "%.0f ms" % x if abs(x) >= 100 else "%.1f ms" % x if abs(x) >= 10 else "%.2f ms" % x


def us(x: float) -> str:
    return "%.0f µs" % x if abs(x) >= 100 else "%.2f µs" % x


def ratio(a: float, b: float) -> str:
    if not b:
        return "—"
    r = a / b
    return "%.2fx" % r if r >= 0.01 else "%.4fx" % r


# --- sections -----------------------------------------------------------------------------------


def section_startup(t: Table, s: dict) -> None:
    r = startup.measure(s["runs"], extra_rows=False)
    med, bare, n = r["med"], r["bare"], r["runs"]
    on, side = med[startup.ON], med[startup.SIDECAR]
    t.row(
        "interpreter start, `python -c pass` (median of %d, interleaved)" % n,
        "bare interpreter",
        ms(bare),
        "%s (`LORA_OTEL=1`)" % ms(on),
        "%s, %+.1f ms" % (ratio(on, bare), on - bare),
        goal(on - bare <= 15, "≤ 15 ms added"),
    )
    t.row(
        "interpreter start, OTLP endpoint set (starts the sidecar; sidecar = /bin/true)",
        "bare interpreter",
        ms(bare),
        ms(side),
        "%s, %+.1f ms" % (ratio(side, bare), side - bare),
        goal(side - bare <= 15, "≤ 15 ms added"),
    )
    if r["otel_instrument"]:
        oi = med[startup.OTEL_INSTRUMENT]
        t.row(
            "interpreter start vs OTel auto-instrumentation (reference)",
            "`opentelemetry-instrument python -c pass` (OTLP exporter)",
            ms(oi),
            "%s (`LORA_OTEL=1`)" % ms(on),
            "%s, %+.0f ms" % (ratio(on, oi), on - oi),
            "— (reference)",
        )
    else:
        t.row(
            "interpreter start vs OTel auto-instrumentation (reference)",
            "`opentelemetry-instrument`: not installed (pip install opentelemetry-distro)",
            "not measured",
            "%s (`LORA_OTEL=1`)" % ms(on),
            "—",
            "— (reference)",
        )
    fe = [x[0] for x in r["first_evidence"]]
    if not fe:
        t.fail("time to first evidence", "no lora_otel.preamble.first_evidence_us in the journals")
    else:
        t.row(
            "time to first evidence: preamble start → root span and first line on disk",
            "— (no counterpart measured)",
            "—",
            "%s median, %s max of %d" % (us(statistics.median(fe)), us(max(fe)), len(fe)),
            "—",
            goal(max(fe) <= 5000, "≤ 5000 µs"),
        )
    t.row(
        "`.pth` hook with `LORA_OTEL` unset, per interpreter start",
        "—",
        "—",
        us(r["hook_line_us"]),
        "—",
        goal(r["hook_line_us"] < 1000, "< 1000 µs"),
    )


def section_span(t: Table, s: dict) -> None:
    r = span_cost.measure(s["spans"], s["runs"], SPAN_VARIANTS)
    med, n = r["median_us"], "%d spans × %d processes, interleaved, median" % (s["spans"], s["runs"])
    for note in r["notes"]:
        t.fail("per-span cost", note)
    dropped = {v: span_cost.dropped_text(r, v) for v in r["variants"]}

    def sdk_cell(v: str) -> str:
        return "%s (dropped %s)" % (us(med[v]), dropped[v]) if dropped.get(v) else us(med[v])

    if "sdk" in med:
        for v, what in (("stage", "journal only"), ("stage+sidecar", "+ endpoint to rotel, so its sidecar runs")):
            t.row(
                'per span, `with stage("x"): pass` (%s)' % n,
                "OTel SDK span, default `BatchSpanProcessor(OTLPSpanExporter())` → rotel",
                sdk_cell("sdk"),
                "%s (%s)" % (us(med[v]), what),
                "%s, %+.2f µs" % (ratio(med[v], med["sdk"]), med[v] - med["sdk"]),
                "— (none set)",
            )
    t.row(
        "per span, collector down",
        "OTel SDK span, same set-up, endpoint refused",
        sdk_cell("sdk-refused"),
        "%s (journal only)" % us(med["stage"]),
        "%s, %+.2f µs" % (ratio(med["stage"], med["sdk-refused"]), med["stage"] - med["sdk-refused"]),
        "— (none set)",
    )
    t.row(
        "per span vs doing nothing",
        "empty `with` of a no-op context manager",
        us(med["empty"]),
        "%s (journal only)" % us(med["stage"]),
        "%+.2f µs" % (med["stage"] - med["empty"]),
        "— (none set)",
    )
    if "sdk-event" in med:
        t.row(
            'per `lora_otel.mark("tick")` (event + line record + stderr line)',
            'OTel SDK `span.add_event("tick")`',
            us(med["sdk-event"]),
            us(med["mark"]),
            "%s, %+.2f µs" % (ratio(med["mark"], med["sdk-event"]), med["mark"] - med["sdk-event"]),
            "— (none set)",
        )


def section_step(t: Table, s: dict) -> None:
    r = step_cost.measure(s["steps"], s["runs"])
    e, h = r["empty"], r["hooked"]
    t.row(
        "per optimizer step: lora_otel's step pre+post hooks, called directly (best of 3)",
        "two empty functions",
        us(e / 1000),
        us(h / 1000),
        "%s, %+.2f µs" % (ratio(h, e), (h - e) / 1000),
        goal((h - e) / 1000 <= 2, "≤ 2 µs added"),
    )
    b, tr = r["bare"], r["traced"]
    t.row(
        "per optimizer step, real loop: SGD on `nn.Linear(8, 8)` (%d steps × %d processes, median)"
        % (s["steps"], s["runs"]),
        "same loop, no lora_otel",
        us(b / 1000),
        "%s (`LORA_OTEL=1`)" % us(tr / 1000),
        "%s, %+.2f µs" % (ratio(tr, b), (tr - b) / 1000),
        "— (noise-bound; see the hooks row)",
    )


def section_beat(t: Table, s: dict) -> None:
    r = beat_cost.measure(s["beats"], s["runs"], (0, 32))
    for n in (0, 32):
        v = r[n]
        t.row(
            "per beat: the main thread's innermost frames sampled into the beat record (main thread in a C "
            "call 30 frames deep, %d other threads; median of %d processes)" % (n, s["runs"]),
            "the beat record without `main`",
            us(v["base"]),
            us(v["main"]),
            "%s, %+.2f µs" % (ratio(v["main"], v["base"]), v["added"]),
            goal(v["added"] <= 50, "≤ 50 µs added"),
        )


MODE_TEXT = {
    "refused": "refused (nothing listens)",
    "blackhole": "black-holed (accepts, never answers)",
    "slow": "slow (answers after %g s)",
    "ok": "up (rotel)",
}


def section_exit(t: Table, s: dict) -> None:
    r = exit_delay.measure(s["runs"], s["sdk_runs"], EXIT_MODES, s["drain_s"], s["slow_s"])
    samples = r["samples"]
    for note in r["notes"]:
        if "skipped" in note:
            t.fail("exit delay", note)
    bare = statistics.median(x["eof"] for x in samples[(exit_delay.BARE, "-")])
    for mode in r["endpoints"]:
        sdk = [x["eof"] for x in samples[(exit_delay.SDK_DEFAULT, mode)]]
        sdk_med = statistics.median(sdk)
        text = MODE_TEXT[mode] % s["slow_s"] if mode == "slow" else MODE_TEXT[mode]
        for name, label in (
            (exit_delay.LORA_ZERO_CODE, "zero-code, `LORA_OTEL=1` + endpoint"),
            (exit_delay.LORA_RUN, "`lora-otel run` + endpoint"),
        ):
            runs = samples[(name, mode)]
            eof = [x["eof"] for x in runs]
            checks = r["sidecars"][(name, mode)]
            bad_rc = [x["rc"] for x in runs if x["rc"] != 0]
            missing = [c.get("why", "?") for c in checks if not c.get("pid")]
            measure = "exit delay (launcher's EOF after the last statement), collector %s: %s" % (text, label)
            if bad_rc or missing:
                t.fail(measure, "exit codes %s; %s" % (bad_rc, "no sidecar: %s" % missing[0] if missing else ""))
                continue
            gone = sum(1 for c in checks if c.get("gone"))
            t.row(
                measure,
                "OTel SDK default (`BatchSpanProcessor`, atexit flush), same collector",
                "%s (median of %d)" % (ms(sdk_med), len(sdk)),
                "%s median, %s max of %d; sidecar exited by itself after the job in %d/%d"
                % (ms(statistics.median(eof)), ms(max(eof)), len(eof), gone, len(checks)),
                "%s; %+.1f ms over bare python (%s)"
                % (ratio(statistics.median(eof), sdk_med), statistics.median(eof) - bare, ms(bare)),
                goal(max(eof) <= exit_delay.GOAL_MS, "≤ %d ms worst" % exit_delay.GOAL_MS),
            )


def section_journal(t: Table, s: dict) -> None:
    r = journal_throughput.measure_throughput(s["stages"], s["runs"], True)
    names = {"stage": "empty `lora_otel.stage` blocks", "mark": '`lora_otel.mark("tick")`'}
    for k in r["kinds"]:
        m = r[k]
        t.row(
            "journal write throughput, %s as fast as possible (%d × %d processes, median)"
            % (names[k], s["stages"], s["runs"]),
            "raw `os.write` of a %d-byte line, `O_APPEND` (one syscall per record)" % round(m["per_record"]),
            "%.0f records/s" % m["raw_rate"],
            "%.0f records/s (%.1f MB/s)" % (m["rate"], m["mbs"]),
            ratio(m["rate"], m["raw_rate"]),
            "— (none set)",
        )
    a = journal_throughput.measure_job(s["steps"])
    t.row(
        "journal per job: `examples/train_lora.py --steps %d`, `LORA_OTEL=1`" % s["steps"],
        "OTLP protobuf of the exported spans (uncompressed)",
        "%d bytes (%d spans)" % (a["obytes"], a["spans"]),
        "%d bytes: %d records, %d spans, %d log lines, %d journal(s)"
        % (a["jbytes"], a["records"], a["jspans"], a["lines"], a["files"]),
        ratio(a["jbytes"], a["obytes"]),
        "— (none set)",
    )


def sdk_idle(seconds: float, warmup: float, endpoint: str) -> dict:
    """A process with the OTel SDK's default set-up, idle in one open span: CPU % and RSS over the window."""
    d = tempfile.mkdtemp(prefix="lora-otel-sdk-idle-")
    script = os.path.join(d, "sdk_idle.py")
    Path(script).write_text(SDK_IDLE)
    env = dict(sidecar_cost.env_base(), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="bench")
    t0 = time.monotonic()
    p = subprocess.Popen(
        [PY, script, str(seconds)],
        env=env,
        cwd=d,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(max(t0 + warmup - time.monotonic(), 0))
        first, w0 = sidecar_cost.proc_sample(p.pid), time.monotonic()
        time.sleep(max(t0 + seconds - 1 - time.monotonic(), 0.5))
        last, w1 = sidecar_cost.proc_sample(p.pid), time.monotonic()
    finally:
        p.kill()
        p.wait()
        import shutil

        shutil.rmtree(d, ignore_errors=True)
    if first is None or last is None:
        raise RuntimeError("the OTel SDK idle process exited early (exit code %s)" % p.returncode)
    return {"cpu_pct": (last[0] - first[0]) / (w1 - w0) * 100, "rss": last[1], "hwm": last[2]}


def section_sidecar(t: Table, s: dict) -> None:
    print("table: OTel SDK idle baseline for %g s ..." % s["seconds"], file=sys.stderr, flush=True)
    base = sdk_idle(s["seconds"], s["warmup"], "http://127.0.0.1:%d" % exit_delay.refused_port())
    r = sidecar_cost.measure(
        s["seconds"], s["warmup"], ["idle", "burst"], burst=s["burst"], burst_warmup=s["burst_warmup"]
    )
    if not r["rotel"]:
        t.fail("sidecar cost", "rotel is not installed: the sidecar exported to a refusing port")
    for x in r["results"]:
        what = (
            "idle job (sleeps in a stage)"
            if x["kind"] == "idle"
            else "idle job after a burst of %d short stages" % s["burst"]
        )
        window = "window %.0f–%.0f s of a %g s job" % (x["window"][0], x["window"][1], s["seconds"])
        if x["rc"] != 0:
            t.fail("sidecar, %s" % what, "job exit code %s: %s" % (x["rc"], x["stderr"][-200:]))
            continue
        t.row(
            "sidecar CPU, following an %s (%s)" % (what, window),
            "idle process with the OTel SDK default set-up, one open span",
            "%.2f %% of one core" % base["cpu_pct"],
            "%.2f %% of one core" % x["cpu_pct"],
            "%+.2f points" % (x["cpu_pct"] - base["cpu_pct"]),
            goal(x["cpu_pct"] < sidecar_cost.GOAL_CPU, "< %g %%" % sidecar_cost.GOAL_CPU),
        )
        t.row(
            "sidecar memory, following an %s: RSS at the end / peak (VmHWM)" % what,
            "same OTel SDK process: RSS / peak",
            "%.1f / %.1f MB" % (base["rss"], base["hwm"]),
            "%.1f / %.1f MB" % (x["rss_last"], x["hwm"]),
            "%s, %+.1f MB (peaks)" % (ratio(x["hwm"], base["hwm"]), x["hwm"] - base["hwm"]),
            goal(x["hwm"] < sidecar_cost.GOAL_MB, "< %g MB" % sidecar_cost.GOAL_MB),
        )


STALL_KEYS = {"stall": "stall", "death": "SIGKILL", "continued": "continued"}


def section_stall(t: Table, s: dict) -> None:
    import stall_latency

    if stall_latency.rotel_agent_path() is None:
        t.fail("stall → collector latency", "rotel is not installed (pip install rotel)")
        return
    r = stall_latency.measure(s["runs"], sdk_wait_s=s["sdk_wait_s"])
    res, sdk = r["results"], r["sdk"]
    stalls = [(v, label) for (label, key), vals in res.items() if key == "stall" for v in vals]
    deaths = [v for (label, key), vals in res.items() if key == "death" for v in vals]
    cont = [v for (label, key), vals in res.items() if key == "continued" for v in vals]
    sdk_text = (
        (
            "not at the collector %g s after its start (a finished span of the same job arrived: %s)"
            % (sdk["wait_s"], "yes" if sdk["setup_seen"] else "no")
        )
        if not sdk["hung_seen"]
        else "at the collector within %g s" % sdk["wait_s"]
    )
    worst = max(stalls)
    cases = sorted({label for _, label in stalls})
    t.row(
        "stall → collector (rotel), after the stall's limit: %d cases, %d run(s) each (%s)"
        % (len(cases), s["runs"], "; ".join(cases)),
        "OTel SDK default, a span that hangs",
        sdk_text,
        "%.2f s median, %.2f s max (%s)" % (statistics.median(v for v, _ in stalls), worst[0], worst[1]),
        "—",
        goal(worst[0] <= 3, "≤ 3 s"),
    )
    t.row(
        "SIGKILL mid-stage → finalised span at the collector (%d run(s))" % len(deaths),
        "OTel SDK default, the open span, SIGKILLed",
        "not at the collector 2 s after the kill" if not sdk["killed_seen"] else "at the collector",
        "%.2f s median, %.2f s max" % (statistics.median(deaths), max(deaths)),
        "—",
        goal(max(deaths) <= 3, "≤ 3 s"),
    )
    t.row(
        'stalled stage recovers → "(continued)" span at the collector, after its real end (%d run(s))' % len(cont),
        "— (the SDK exports the span when it ends)",
        "—",
        "%.2f s median, %.2f s max" % (statistics.median(cont), max(cont)),
        "—",
        goal(max(cont) <= 3, "≤ 3 s"),
    )
    backs = [o["back"] for o in r["outage"]]
    lost, dup = sum(o["lost"] for o in r["outage"]), sum(o["duplicates"] for o in r["outage"])
    t.row(
        "collector down for the whole job, then up: all 32 spans at the collector, after its start (%d run(s))"
        % len(backs),
        "—",
        "—",
        "%.2f s median, %.2f s max; %d lost, %d duplicated" % (statistics.median(backs), max(backs), lost, dup),
        "—",
        goal(lost == 0 and dup == 0, "0 lost, 0 duplicated"),
    )


def section_hang(t: Table, s: dict) -> None:
    for label, case, needle, extra, target in hang_to_line.CASES:
        times = [hang_to_line.one(case, needle, hang_to_line._env(**extra)) for _ in range(s["runs"])]
        med = statistics.median(times)
        t.row(
            "from a hang to the job's own line naming it, no collector: %s (median of %d jobs launched as a UI "
            "does, stdout+stderr to log.txt)" % (label, s["runs"]),
            "the goal",
            "%.0f s" % target,
            "%.2f s" % med,
            "—",
            goal(med <= target, "≤ %.0f s" % target),
        )


RUNNERS = {
    "startup": section_startup,
    "span": section_span,
    "step": section_step,
    "exit": section_exit,
    "journal": section_journal,
    "sidecar": section_sidecar,
    "stall": section_stall,
    "beat": section_beat,
    "hang": section_hang,
}


# --- header -------------------------------------------------------------------------------------


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_facts() -> list:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = "%.1f GiB" % (int(line.split()[1]) / 1024 / 1024)
    except OSError:
        pass
    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "?"
        )
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return [
        (
            "machine",
            "%s, %d CPUs (%s), %s RAM, %s"
            % (platform.machine(), os.cpu_count() or 0, model, mem, platform.platform(terse=True)),
        ),
        (
            "software",
            "Python %s, torch %s, opentelemetry-sdk %s, opentelemetry-distro %s, rotel %s, lora_otel %s "
            "(git %s)"
            % (
                platform.python_version(),
                version("torch"),
                version("opentelemetry-sdk"),
                version("opentelemetry-distro"),
                version("rotel"),
                version("lora-otel"),
                commit,
            ),
        ),
        ("temporary directory", "%s (%s)" % (tempfile.gettempdir(), fs_type(tempfile.gettempdir()))),
    ]


def fs_type(path: str) -> str:
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) >= len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def command_line() -> str:
    py = sys.executable
    rel = os.path.relpath(py)
    return shlex.join([rel if not rel.startswith("..") else py, os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small counts (a few minutes)")
    ap.add_argument(
        "--only", default=",".join(SECTIONS), help="sections, comma-separated (default all: %s)" % ",".join(SECTIONS)
    )
    ap.add_argument("--slow-s", type=float, default=30.0, help="the slow collector's delay per answer (default 30)")
    args = ap.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in SECTIONS]
    if unknown:
        ap.error("unknown sections %s; known: %s" % (unknown, ", ".join(SECTIONS)))
    settings = {k: dict(SETTINGS[k][0 if args.quick else 1]) for k in SECTIONS}
    settings["exit"]["slow_s"] = args.slow_s

    t = Table()
    started, load0 = time.time(), loadavg()
    took = {}
    for name in [s for s in SECTIONS if s in only]:
        print("table: section %s %s ..." % (name, settings[name]), file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            RUNNERS[name](t, settings[name])
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            t.fail("section %s" % name, "%s: %s" % (type(e).__name__, first))
        took[name] = time.monotonic() - t0
        print("table: section %s took %.0f s" % (name, took[name]), file=sys.stderr, flush=True)

    print("# lora_otel benchmarks, side by side — %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)))
    print()
    print("```")
    print(command_line())
    print("```")
    print()
    for k, v in machine_facts():
        print("- %s: %s" % (k, v))
    print("- load average (1, 5, 15 min) at the start: %s; at the end: %s" % (load0, loadavg()))
    print(
        "- settings (%s): %s"
        % (
            "--quick" if args.quick else "default",
            "; ".join("%s %s" % (k, ", ".join("%s=%s" % kv for kv in settings[k].items())) for k in took),
        )
    )
    print("- wall time: %s, total %.0f s" % (", ".join("%s %.0f s" % kv for kv in took.items()), time.time() - started))
    print()
    print(t.markdown())
    if t.failures:
        print()
        print("%d measurement(s) failed:" % len(t.failures))
        for f in t.failures:
            print("- %s" % f)
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main())
