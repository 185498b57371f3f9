"""Faults the live path and the journal must survive, each run for real and each with a figure.

* A misbehaving collector, played by a small ``http.server`` on loopback that decodes every
  ``ExportTraceServiceRequest`` it accepts: it answers HTTP 500 to the first requests, or sleeps
  2 s on each, or goes away after the first and comes back on the same port 2 s later. Every span
  of a 20-stage job must arrive exactly once, and the job itself must not wait for any of it.
* A black-holed collector (reads each request, never answers) for its first 4 s.
* Many writers at once: 32 traced jobs of 200 stages each writing journals into one directory,
  and a fork storm (50 children, some forking grandchildren). Every journal must read without a
  problem, no span id may appear twice, every started span must end, and every child journal must
  have its own root and exit record.
* The disk fills mid-run (a 256 KB tmpfs) and space comes back: the job goes on, the gap is one
  block, counted in one line, and everything before and after is in the journal.
* argv and environment with 120 KB values, undecodable bytes and a token, through a real collector.
* The journal cut to 0 bytes under a following sidecar (copytruncate), and the sidecar SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from procs import PYTHON, clean_env, journals, wait_for
from test_hangs import kill_and_reap, start_traced
from test_sidecar import assert_unique, by_name, sidecar_pid, wait_gone

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

STAGES = 20
JOB = (
    """
import time, lora_otel
for i in range(%d):
    with lora_otel.stage("stage %%d" %% i, i=i):
        time.sleep(0.005)
print("JOB done", flush=True)
"""
    % STAGES
)


SPREAD_JOB = (
    """
import time, lora_otel
with lora_otel.stage("first"):
    pass
time.sleep(1.0)                      # the sidecar sends "first" before more comes
for i in range(%d):
    with lora_otel.stage("stage %%d" %% i, i=i):
        time.sleep(0.15)             # stages end while the collector is down, and after
print("JOB done", flush=True)
"""
    % STAGES
)


class FakeCollector:
    """An OTLP/HTTP trace receiver with a scripted fault.

    ``fail_first``: answer ``fail_code`` (500) to that many trace requests first. ``refuse_name``:
    answer 400 (bad data, not to be retried) to every request holding a span of that name. ``delay_s``: sleep that long
    before each answer. ``blackhole_s``: for that long after creation, read each request and never
    answer (the connection stays open until the client gives up), as a black-holing firewall does.
    ``restart_after_first``: after the first accepted request, stop listening and listen again on the
    same port ``restart_gap_s`` later. Only accepted (200) requests count.
    """

    def __init__(
        self,
        fail_first: int = 0,
        delay_s: float = 0.0,
        restart_after_first: bool = False,
        restart_gap_s: float = 2.0,
        blackhole_s: float = 0.0,
        fail_code: int = 500,
        refuse_name: Optional[str] = None,
    ) -> None:
        self.fail_first, self.delay_s, self.fail_code = fail_first, delay_s, fail_code
        self.refuse_name = refuse_name
        self.refused = 0  # requests answered 400 because they held a span named refuse_name
        self.refused_sizes: list = []  # spans in each of those
        self.blackhole_until = time.monotonic() + blackhole_s
        self.blackholed = 0  # trace requests that got no answer at all
        self.restart_after_first, self.restart_gap_s = restart_after_first, restart_gap_s
        self.lock = threading.Lock()
        self.requests = 0  # trace requests seen, answered 500 or 200
        self.rejected = 0  # answered 500
        self.accepted = 0  # answered 200
        self.span_ids: list = []  # span ids, hex, from accepted requests only, in arrival order
        self.names: list = []
        self.down_between: Optional[tuple] = None  # (monotonic stop, monotonic start) of the restart
        self._server: Optional[ThreadingHTTPServer] = None
        self.port = 0
        self._start(0)

    @property
    def endpoint(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def _start(self, port: int) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces":
                    self._answer(200)
                    return
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                if time.monotonic() < owner.blackhole_until:
                    with owner.lock:
                        owner.blackholed += 1
                    time.sleep(owner.blackhole_until - time.monotonic() + 5)  # far past the client's timeout
                    self.close_connection = True
                    return
                with owner.lock:
                    owner.requests += 1
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
                    if owner.rejected < owner.fail_first:
                        owner.rejected += 1
                        code = owner.fail_code
                    elif owner.refuse_name is not None and any(s.name == owner.refuse_name for s in spans):
                        owner.refused += 1
                        owner.refused_sizes.append(len(spans))
                        code = 400
                    else:
                        owner.span_ids += [s.span_id.hex() for s in spans]
                        owner.names += [s.name for s in spans]
                        owner.accepted += 1
                        code = 200
                    restart = owner.restart_after_first and code == 200 and owner.accepted == 1
                self._answer(code)
                if restart:
                    threading.Thread(target=owner._restart, daemon=True).start()

            def _answer(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()  # an empty body is a valid (empty) Export*ServiceResponse

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _restart(self) -> None:
        server, self._server = self._server, None
        server.shutdown()
        server.server_close()
        stopped = time.monotonic()
        time.sleep(self.restart_gap_s)
        self._start(self.port)
        self.down_between = (stopped, time.monotonic())

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def run_job_against(tmp_path: Path, collector: FakeCollector, script: str = JOB, **env: str):
    """Run the 20-stage job against ``collector``; wait for its sidecar to finish. Returns
    (exit code, job wall seconds, span ids in the job's journal)."""
    t0 = time.monotonic()
    proc = start_traced(
        tmp_path, script, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_LOGS_EXPORTER="none", **env
    )
    side = sidecar_pid(tmp_path)
    out, err = proc.communicate(timeout=60)
    wall = time.monotonic() - t0
    assert b"JOB done" in out, err.decode(errors="replace")
    wait_gone(side, timeout=60)
    ids = []
    for p in journals(tmp_path / "lora-otel"):
        j = read_journal(p)
        assert j.problems == []
        ids += [s.span_id for s in j.spans]
    assert len(list(ids)) >= STAGES + 1
    return proc.returncode, wall, ids


def assert_all_once(collector: FakeCollector, journal_ids: list) -> None:
    got = collector.span_ids
    dup = sorted({i for i in got if got.count(i) > 1})
    assert dup == [], "exported twice: %s" % dup
    missing = sorted(set(journal_ids) - set(got))
    assert missing == [], "%d of %d spans lost: %s" % (len(missing), len(journal_ids), missing)
    assert len(got) == len(journal_ids)
    assert sum(1 for n in collector.names if n.startswith("stage ")) == STAGES


def test_collector_answers_500_then_accepts(tmp_path: Path) -> None:
    """HTTP 500 for the first 3 trace requests: all spans arrive once (0 lost, 0 duplicated) after
    the retries; the job exits 0 without waiting on the backend."""
    c = FakeCollector(fail_first=3)
    try:
        code, wall, ids = run_job_against(tmp_path, c)
    finally:
        c.close()
    assert code == 0
    assert wall < 10, "the job waited on the failing backend (%.1f s)" % wall
    assert c.rejected == 3 and c.accepted >= 1
    assert_all_once(c, ids)


def test_collector_answers_401_then_accepts(tmp_path: Path) -> None:
    """HTTP 401 (credentials refused, e.g. until the collector's token is fixed) for the first 3
    requests: retried like an outage, nothing lost; the sidecar's log names the status and the fix."""
    c = FakeCollector(fail_first=3, fail_code=401)
    try:
        code, _wall, ids = run_job_against(tmp_path, c)
    finally:
        c.close()
    assert code == 0 and c.rejected == 3
    assert_all_once(c, ids)
    log = sidecar_log(tmp_path)
    assert "HTTP 401; check the credentials in OTEL_EXPORTER_OTLP_HEADERS" in log, log


def test_collector_refuses_one_span_as_bad_data(tmp_path: Path) -> None:
    """The collector answers 400 (bad data: per OTLP, never to be retried) to any request holding
    the span "stage 7": the batch is split until that span is alone, it alone is dropped and counted,
    every other span arrives once, and the journal still has it."""
    c = FakeCollector(refuse_name="stage 7")
    try:
        code, _wall, ids = run_job_against(tmp_path, c)
    finally:
        c.close()
    assert code == 0 and c.refused >= 2 and c.refused_sizes[-1] == 1, c.refused_sizes
    assert max(c.refused_sizes) > 1, "the refused span never shared a request: the split was not tried"
    got = c.span_ids
    assert len(got) == len(set(got)), "a span id was exported twice"
    assert "stage 7" not in c.names and sorted(set(ids) - set(got)) != []
    assert len(set(ids) - set(got)) == 1, "only the refused span may be missing"
    log = sidecar_log(tmp_path)
    assert "refused one of the spans (HTTP 400)" in log and "1 refused by the backend, 0 unsent" in log, log


def sidecar_log(tmp_path: Path) -> str:
    [path] = journals(tmp_path / "lora-otel")
    return Path(str(path).replace(".otel.jsonl", ".sidecar.log")).read_text()


def test_slow_collector(tmp_path: Path) -> None:
    """A collector that takes 2 s per request (client timeout 5 s), for a job whose stages end over
    3 s: several requests, all spans arrive once; the job does not wait on it."""
    c = FakeCollector(delay_s=2.0)
    try:
        code, wall, ids = run_job_against(tmp_path, c, SPREAD_JOB, OTEL_EXPORTER_OTLP_TIMEOUT="5")
    finally:
        c.close()
    assert code == 0
    assert wall < 1.0 + STAGES * 0.15 + 3, "the job waited on the slow backend (%.1f s)" % wall
    assert c.rejected == 0 and c.accepted >= 2  # spans kept coming while a request was in flight
    assert_all_once(c, ids)


def test_black_holed_collector(tmp_path: Path) -> None:
    """For its first 4 s the collector reads each request and never answers (client timeout 1 s),
    then it answers: all spans arrive once; the job does not wait on it."""
    c = FakeCollector(blackhole_s=4.0)
    try:
        code, wall, ids = run_job_against(tmp_path, c, SPREAD_JOB, OTEL_EXPORTER_OTLP_TIMEOUT="1")
    finally:
        c.close()
    assert code == 0
    assert wall < 1.0 + STAGES * 0.15 + 3, "the job waited on the black hole (%.1f s)" % wall
    assert c.blackholed >= 1, "no request reached the black hole"
    assert_all_once(c, ids)


def test_collector_restarts(tmp_path: Path) -> None:
    """The collector stops after its first accepted request and listens again on the same port 2 s
    later: connection refused in between, nothing lost, nothing duplicated."""
    c = FakeCollector(restart_after_first=True, restart_gap_s=2.0)
    try:
        t0 = time.monotonic()
        proc = start_traced(tmp_path, SPREAD_JOB, OTEL_EXPORTER_OTLP_ENDPOINT=c.endpoint, OTEL_LOGS_EXPORTER="none")
        side = sidecar_pid(tmp_path)
        out, err = proc.communicate(timeout=60)
        wall = time.monotonic() - t0
        assert proc.returncode == 0 and b"JOB done" in out, err.decode(errors="replace")
        wait_gone(side, timeout=60)
    finally:
        c.close()
    assert c.down_between is not None, "the collector never restarted"
    assert c.accepted >= 2, "nothing was sent after the restart"
    [path] = journals(tmp_path / "lora-otel")
    j = read_journal(path)
    assert j.problems == []
    assert wall < 1.0 + STAGES * 0.15 + 4
    got = c.span_ids
    assert len(got) == len(set(got)), "a span id was exported twice"
    assert set(got) == {s.span_id for s in j.spans}
    assert "first" in c.names and sum(1 for n in c.names if n.startswith("stage ")) == STAGES


# --- many writers ---------------------------------------------------------------------------

WRITERS, WRITER_STAGES = 32, 200
WRITER = (
    """
import lora_otel
for i in range(%d):
    with lora_otel.stage("stage %%d" %% i, i=i):
        pass
"""
    % WRITER_STAGES
)


def check_journals(paths: list) -> list:
    """Every journal reads cleanly, has a root and an exit record, ends every span; span ids are
    unique within and across journals. Returns the journals."""
    out, ids = [], []
    for p in paths:
        j = read_journal(p)
        assert j.problems == [], (p, j.problems)
        assert j.root is not None and j.root.name == "process", p
        assert j.exit is not None, "no exit record in %s" % p
        open_ = [s.name for s in j.spans if s.end_ns is None]
        assert open_ == [], "%s: spans never ended: %s" % (p, open_)
        ids += [s.span_id for s in j.spans]
        out.append(j)
    assert len(ids) == len(set(ids)), "%d span ids appear twice" % (len(ids) - len(set(ids)))
    return out


def test_32_jobs_write_journals_into_one_directory(tmp_path: Path) -> None:
    """32 traced jobs started together, 200 stages each, all journals in one directory: 32 clean
    journals, 6400 stages, every span id once."""
    (tmp_path / "job.py").write_text(WRITER)
    env = clean_env(LORA_OTEL="1")
    procs = [
        subprocess.Popen([PYTHON, "job.py"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(WRITERS)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode(errors="replace")
    found = journals(tmp_path / "lora-otel")
    assert len({p.parent for p in found}) == 1
    assert len(found) == WRITERS
    js = check_journals(found)
    assert len({j.pid for j in js}) == WRITERS
    for j in js:
        assert sum(1 for s in j.spans if s.name.startswith("stage ")) == WRITER_STAGES
        assert j.exit.get("code") == 0


CHILDREN, NESTED = 50, 10
FORKER = """
import os, lora_otel
with lora_otel.stage("storm"):
    pids = []
    for i in range(%d):
        pid = os.fork()
        if pid == 0:
            with lora_otel.stage("child %%d" %% i):
                if i < %d:                       # the first few fork a grandchild of their own
                    g = os.fork()
                    if g == 0:
                        with lora_otel.stage("grandchild %%d" %% i):
                            pass
                        os._exit(0)
                    os.waitpid(g, 0)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
print("PARENT done", flush=True)
""" % (CHILDREN, NESTED)


def test_fork_storm(tmp_path: Path) -> None:
    """A job forks 50 children in a loop, 10 of which fork a grandchild: 61 clean journals, each
    child with its own root (under the stage that forked it) and its own exit record."""
    (tmp_path / "job.py").write_text(FORKER)
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "PARENT done" in r.stdout, r.stderr
    found = journals(tmp_path / "lora-otel")
    assert len(found) == 1 + CHILDREN + NESTED, len(found)
    js = check_journals(found)
    parent = [j for j in js if any(s.name == "storm" for s in j.spans)]
    assert len(parent) == 1
    parent = parent[0]
    storm = next(s for s in parent.spans if s.name == "storm")
    children = {}
    for j in js:
        if j is parent:
            continue
        assert j.pid != parent.pid and j.root.trace_id == parent.root.trace_id
        assert j.root.span_id != parent.root.span_id
        names = [s.name for s in j.spans if s.name != "process"]
        assert len(names) == 1, names  # its own stage only, none of its parent's records
        children[names[0]] = j
    assert len(children) == CHILDREN + NESTED
    assert len({j.pid for j in js}) == 1 + CHILDREN + NESTED
    for i in range(CHILDREN):
        assert children["child %d" % i].root.parent_id == storm.span_id
    for i in range(NESTED):
        child_stage = next(s for s in children["child %d" % i].spans if s.name == "child %d" % i)
        assert children["grandchild %d" % i].root.parent_id == child_stage.span_id


# --- the disk fills up mid-run ----------------------------------------------------------------

DISK_JOB = """
import os, sys, lora_otel
for i in range(600):
    with lora_otel.stage("stage %d" % i, i=i):
        pass
    if i == 400:
        os.remove(sys.argv[1])       # space comes back (someone deleted a checkpoint)
print("JOB done", flush=True)
"""


def mount_small_fs(where: Path, size_kb: int) -> None:
    """A tmpfs of ``size_kb`` at ``where``: a real filesystem that really fills up (needs root)."""
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=%dk,mode=0700" % size_kb, "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): %s" % r.stderr.strip())


def test_disk_fills_mid_run_then_space_returns(tmp_path: Path) -> None:
    """The journal's filesystem fills after a few dozen stages and space comes back at stage 400:
    the job runs to the end (exit 0, no traceback); one line says writes failed, one line says
    they work again and how many records are missing; the journal holds everything written before
    and after, with the gap reported by the reader, not hidden."""
    small = tmp_path / "small"
    mount_small_fs(small, 256)
    try:
        filler = small / "checkpoint.bin"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096) == 4096:
                pass
        except OSError:  # full
            pass
        finally:
            os.close(fd)
        os.truncate(filler, filler.stat().st_size - 24 * 1024)  # ~24 KB left: the start and a few dozen stages
        proc = start_traced(tmp_path, DISK_JOB, str(filler), LORA_OTEL_DIR=str(small / "lora-otel"))
        out, err = proc.communicate(timeout=60)
        out_s, err_s = out.decode(), err.decode()
        assert proc.returncode == 0 and "JOB done" in out_s, err_s
        assert "Traceback" not in err_s
        failed = [ln for ln in err_s.splitlines() if "journal write failed (No space left on device)" in ln]
        back = [ln for ln in err_s.splitlines() if "journal writes work again" in ln]
        assert len(failed) == 1 and len(back) == 1, err_s
        lost = int(back[0].split("; ")[1].split()[0])
        [path] = journals(small / "lora-otel")
        j = read_journal(path)
        stages = {int(s.name.split()[1]): s for s in j.spans if s.name.startswith("stage ")}
        whole = [i for i, s in stages.items() if s.end_ns is not None]
        missing = sorted(set(range(600)) - set(stages))
        # Before the disk filled and after space came back: every stage, started and ended.
        assert missing and min(missing) > 5 and max(missing) <= 401, missing
        assert missing == list(range(min(missing), max(missing) + 1)), "the gap is not one block"
        # The stage whose record met the full disk may have lost its end (the first failed write
        # can be an end record, depending on where the beats fell): every stage before it is whole.
        assert set(whole) >= set(range(min(missing) - 1)) | set(range(402, 600))
        assert lost >= len(missing), (lost, missing)
        print("stages missing %d-%d, %d records lost, problems: %s" % (min(missing), max(missing), lost, j.problems))
        assert j.exit is not None and j.exit.get("code") == 0
        assert any("records could not be written" in ln.msg and ln.level == "error" for ln in j.lines)
        # The reader names what the gap left behind (ends of unknown spans, a cut record), nothing else.
        assert all("unknown span" in p or "not JSON" in p for p in j.problems), j.problems
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", "inspect", str(path)],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=60,
        )
        # A clean exit; the one stage whose end record met the full disk may read as left open.
        straddling = "ended with spans open: stage %d (exit code 0)" % (min(missing) - 1)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r
        assert "finished normally" in r.stdout or straddling in r.stdout, r.stdout
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


# --- hostile argv and environment, on disk and on the wire -------------------------------------

HOSTILE_JOB = """
import sys, lora_otel
with lora_otel.stage("work", arg_bytes=len(sys.argv[1])):
    pass
print("JOB done", len(sys.argv), flush=True)
"""
HUGE = 120_000  # near Linux's 128 KiB limit on one argv string or environment entry


@pytest.mark.collector
def test_huge_and_non_utf8_argv_and_environment(tmp_path: Path, collector) -> None:
    """argv with a 120 KB argument, undecodable bytes and a token; the environment with 120 KB
    values and undecodable bytes in recorded variables: the job runs unchanged; the journal reads
    cleanly and stays small; the collector receives valid spans with the huge values cut, the bad
    bytes escaped (``\\udcff`` text) and the token redacted, on disk and on the wire."""
    token = "hf_" + "Q" * 34
    env = clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint)
    envb = {k.encode(): v.encode() for k, v in env.items()}
    envb.update(
        {
            b"HF_HOME": b"/h/" + b"x" * HUGE,
            b"CUDA_VISIBLE_DEVICES": b"0,\xff\xfe",
            b"TORCH_LOGS": b"\xc3(" * 10,
            b"UNRELATED_HUGE": b"y" * HUGE,
            b"\xffNAME": b"v",
            b"HF_TOKEN": token.encode(),
        }
    )
    script = tmp_path / "job.py"
    script.write_text(HOSTILE_JOB)
    argv = [
        PYTHON.encode(),
        str(script).encode(),
        b"a" * HUGE,
        b"--name",
        b"\xff\xfe\x80bad",
        b"--token",
        token.encode(),
    ]
    proc = subprocess.run(argv, cwd=tmp_path, env=envb, capture_output=True, timeout=60)
    assert proc.returncode == 0 and b"JOB done 6" in proc.stdout, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    side = sidecar_pid(tmp_path)
    wait_gone(side, timeout=60)
    [path] = journals(tmp_path / "lora-otel")
    j = read_journal(path)
    assert j.problems == []
    assert path.stat().st_size < 20_000, "huge values were journaled whole (%d bytes)" % path.stat().st_size
    raw = path.read_bytes() + proc.stdout + proc.stderr
    assert token.encode() not in raw and b"a" * 1000 not in raw and b"x" * 1000 not in raw
    args = j.root.attrs["process.command_args"]
    assert args[2].startswith("…[truncated") and args[4] == "\udcff\udcfe\udc80bad" and token not in args
    received = by_name(collector.wait_for_spans(3, timeout=20))
    root = received["process"]
    wire = " ".join(str(v) for v in [*root.attributes.values(), *root.resource.values()])
    # The bad bytes arrive as escape text (OTLP strings must be UTF-8), the huge ones cut.
    assert "Str(\\udcff\\udcfe\\udc80bad)" in root.resource["process.command_args"]
    assert root.attributes["lora_otel.env.CUDA_VISIBLE_DEVICES"] == "0,\\udcff\\udcfe"
    assert root.attributes["lora_otel.env.HF_HOME"].startswith("…[truncated")
    assert token not in wire and "a" * 1000 not in wire and "x" * 1000 not in wire and "y" * 1000 not in wire
    assert received["work"].attributes.get("arg_bytes") == HUGE
    assert_unique(collector.spans())


# --- the sidecar's journal cut short, the sidecar killed ----------------------------------------

GATED_JOB = """
import os, sys, time, lora_otel
go = sys.argv[1]
for i in range(5):
    with lora_otel.stage("before %d" % i):
        pass
with lora_otel.stage("across"):          # open while the file is cut
    while not os.path.exists(go):
        time.sleep(0.05)
for i in range(5):
    with lora_otel.stage("after %d" % i):
        pass
print("JOB done", flush=True)
"""


@pytest.mark.collector
def test_journal_cut_short_while_the_sidecar_follows(tmp_path: Path, collector) -> None:
    """logrotate's copytruncate on a running job's journal (cut to 0 bytes while the job writes):
    the sidecar keeps what it had read, so the open stage and the root still end and every span
    reaches the collector exactly once; its log names the cut."""
    go = tmp_path / "go"
    proc = start_traced(
        tmp_path,
        GATED_JOB,
        str(go),
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint,
        LORA_OTEL_STALL_AFTER="100000",
    )
    try:
        side = sidecar_pid(tmp_path)
        wait_for(
            lambda: {"before %d" % i for i in range(5)} <= {s.name for s in collector.spans()},
            what="the first stages at the collector",
        )
        [path] = journals(tmp_path / "lora-otel")
        time.sleep(0.5)  # the sidecar polls the open "across" stage's start too
        os.truncate(path, 0)
        go.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        kill_and_reap(proc)
    assert proc.returncode == 0 and b"JOB done" in out, err.decode(errors="replace")
    wait_gone(side, timeout=60)
    received = collector.wait_for_spans(13, timeout=20)
    assert_unique(received)
    names = sorted(s.name for s in received)
    assert names == sorted(
        ["process", "arguments", "across"] + ["before %d" % i for i in range(5)] + ["after %d" % i for i in range(5)]
    ), names
    spans = by_name(received)
    assert spans["across"].parent_id == spans["process"].span_id and spans["process"].status_code != "Error"


def test_sidecar_killed_mid_job(tmp_path: Path) -> None:
    """SIGKILL the sidecar while the job runs: the job goes on (exit 0, no delay) and says once that
    live export stopped; the journal still holds every span, and `lora-otel replay` ships the job
    afterwards."""
    c = FakeCollector()
    go = tmp_path / "go"
    try:
        t0 = time.monotonic()
        proc = start_traced(
            tmp_path,
            GATED_JOB,
            str(go),
            OTEL_EXPORTER_OTLP_ENDPOINT=c.endpoint,
            OTEL_LOGS_EXPORTER="none",
            LORA_OTEL_STALL_AFTER="100000",
        )
        side = sidecar_pid(tmp_path)
        os.kill(side, signal.SIGKILL)
        wait_gone(side, timeout=10)
        [path] = journals(tmp_path / "lora-otel")
        wait_for(lambda: "live export stopped" in path.read_text(), timeout=10, what="the job's line")  # next beat
        go.touch()
        out, err = proc.communicate(timeout=60)
        wall = time.monotonic() - t0
        assert proc.returncode == 0 and b"JOB done" in out, err.decode(errors="replace")
        # one line (stderr and journal) says live export stopped and how to ship the journal later
        said = [ln for ln in err.decode().splitlines() if ln.startswith("[lora-otel]") and "live export" in ln]
        assert b"[lora-otel]" not in out
        assert len(said) == 1 and "live export stopped: the sidecar (pid %d) is gone" % side in said[0], said
        assert "lora-otel replay " in said[0]
        assert wall < 10
        [path] = journals(tmp_path / "lora-otel")
        j = read_journal(path)
        assert j.problems == [] and j.exit is not None and all(s.end_ns is not None for s in j.spans)
        assert any("live export stopped" in ln.msg and ln.level == "error" for ln in j.lines)
        assert len(j.spans) == 13
        live = set(c.span_ids)
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", "replay", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=c.endpoint),
        )
        assert r.returncode == 0, r.stderr
    finally:
        c.close()
    assert set(c.span_ids) == {s.span_id for s in j.spans}
    assert len(c.span_ids) == 13 + len(live), "replay sends the whole journal, once"


def test_replay_of_a_long_job_in_batches_past_a_refused_span(tmp_path: Path) -> None:
    """`lora-otel replay` of a 1200-stage journal to a collector that refuses (400) any request
    holding "stage 700": requests of at most 512 spans, every other span once, that one skipped and
    named in one line on stderr, exit 1 (not everything was delivered)."""
    script = "import lora_otel\nfor i in range(1200):\n    with lora_otel.stage('stage %d' % i):\n        pass\n"
    r = subprocess.run(
        [PYTHON, "-c", script], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    [path] = journals(tmp_path / "lora-otel")
    ids = {s.span_id for s in read_journal(path).spans}
    c = FakeCollector(refuse_name="stage 700")
    try:
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", "replay", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=c.endpoint),
        )
    finally:
        c.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        "lora-otel replay: the backend refused 1 of %d spans as bad data "
        "(HTTP 400/413); they stay in the journal" % len(ids)
    ], r.stderr
    assert r.stdout.startswith("replayed %d spans" % (len(ids) - 1))
    assert len(c.span_ids) == len(set(c.span_ids)) == len(ids) - 1 and "stage 700" not in c.names
    assert max(c.refused_sizes) <= 512 and c.refused_sizes[-1] == 1
