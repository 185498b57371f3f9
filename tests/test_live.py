"""Live export to a real collector (rotel): stalls go out once as incomplete, recoveries as "(continued)"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from procs import journal_has_open, journals, wait_for
from test_hangs import kill_and_reap, make_module, start_traced

from lora_otel.analysis.stall import parse_limits
from lora_otel.export.live import Follower

pytestmark = [pytest.mark.collector, pytest.mark.slow]


def follower_for(tmp_path: Path, collector, limits: str) -> Follower:
    found = wait_for(lambda: journals(tmp_path / "lora-otel"), what="a journal")
    exporter = OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces", timeout=5)
    return Follower(str(found[0]), exporter, limits=parse_limits(limits), frozen_after_s=3)


def test_stalled_import_then_kill(tmp_path: Path, collector) -> None:
    """A sleeping import past 1 s: process and import go out once as incomplete with evidence; after
    SIGKILL the rest (arguments) is finalised once; no span ID twice."""
    make_module(tmp_path, "slowmod", "import time\ndef fetch():\n    time.sleep(600)\nfetch()\n")
    proc = start_traced(tmp_path, "import json\nimport slowmod\n")
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import slowmod"), what="import span")
        f = follower_for(tmp_path, collector, "import=1")
        sent = wait_for(lambda: [s for s in f.poll() if s.name == "import slowmod"], what="stall", timeout=10)
        assert f.stalls and f.stalls[0].kind == "alive"
        f.poll()
        f.poll()  # repeated polls send nothing new
    finally:
        kill_and_reap(proc)
    f.finalize("killed by SIGKILL")
    received = collector.wait_for_spans(4)
    time.sleep(0.5)
    received = collector.spans()
    ids = [s.span_id for s in received]
    assert len(ids) == len(set(ids)), "a span id was exported twice"
    by_name = {s.name: s for s in received}
    imp, root = by_name["import slowmod"], by_name["process"]
    assert imp.parent_id == root.span_id
    assert imp.status_code == "STATUS_CODE_ERROR" and imp.status_message.startswith("stalled: import slowmod open for")
    assert imp.attributes["lora_otel.incomplete"] is True and imp.attributes["lora_otel.stall.kind"] == "alive"
    assert "stall detected" in imp.events
    assert "fetch" in str(sent[0].events[0].attributes["lora_otel.evidence.python.stacks"])
    assert root.attributes["lora_otel.incomplete"] is True
    args = by_name["arguments"]
    assert args.attributes["lora_otel.incomplete"] is True and "killed by SIGKILL" in args.status_message


def test_stage_that_stalls_then_recovers(tmp_path: Path, collector) -> None:
    """A stage open past its limit, then ending: the stalled export plus one "(continued)" child."""
    proc = start_traced(
        tmp_path,
        "import lora_otel, time\nwith lora_otel.stage('load model'):\n    time.sleep(2.5)\nprint('done', flush=True)\n",
    )
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "load model"), what="stage")
        f = follower_for(tmp_path, collector, "load model=1")
        wait_for(lambda: any(s.name == "load model" for s in f.poll()), what="stall", timeout=10)
        proc.wait(timeout=30)
        f.poll()
    finally:
        kill_and_reap(proc)
    time.sleep(0.5)
    f.poll()
    received = wait_for(
        lambda: [s for s in collector.spans() if s.name == "load model (continued)"] and collector.spans(),
        what="continued span",
        timeout=10,
    )
    ids = [s.span_id for s in received]
    assert len(ids) == len(set(ids)), "a span id was exported twice"
    stalled = [s for s in received if s.name == "load model"]
    cont = [s for s in received if s.name == "load model (continued)"]
    assert len(stalled) == 1 and len(cont) == 1
    assert cont[0].parent_id == stalled[0].span_id
    assert cont[0].start_ns >= stalled[0].end_ns - 1
    # the process span was exported incomplete with the stall, so its normal end is a continuation too
    assert [s.name for s in received].count("process (continued)") == 1


def test_lora_otel_run_exports_a_stall_and_the_kill(tmp_path: Path, collector) -> None:
    """`lora-otel run` with an OTLP endpoint: the stalled import reaches the collector while the job
    runs, the SIGKILL that ends it finalises the rest, and the exit status is the child's."""
    import subprocess
    import sys

    from procs import clean_env

    make_module(tmp_path, "slowmod", "import os, signal, time\ntime.sleep(3)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "job.py").write_text("import slowmod\n")
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint)
    r = subprocess.run(
        [sys.executable, "-m", "lora_otel", "run", "--stall-after", "import=1", "--", sys.executable, "job.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == -9, r.stderr  # the supervisor dies by the same signal
    received = wait_for(
        lambda: [s for s in collector.spans() if s.name == "arguments"] and collector.spans(),
        what="finalised spans",
        timeout=10,
    )
    ids = [s.span_id for s in received]
    assert len(ids) == len(set(ids))
    by_name = {s.name: s for s in received}
    assert by_name["import slowmod"].status_message.startswith("stalled: import slowmod open for")
    assert "killed by SIGKILL" in by_name["arguments"].status_message
