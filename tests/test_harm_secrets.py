"""Issue 12, "Harmless everywhere": secrets (item 8), import-time warnings and journal rotation
(item 10). Real traced programs run the way a user runs them, a real collector (rotel).

What must hold:

- a password given on the command line and quoted by the program in an exception message is in
  none of lora_otel's outputs: the journal's bytes, lora_otel's lines on stderr, the ``--log``
  file, the sidecar's log, what the collector received (the program's own traceback on stderr is
  the program's output and stays as it is);
- an OTLP endpoint with user-info and an API key in its query is shown without them in the
  sidecar's log and in ``lora-otel replay``'s output;
- a warning a module raises while it is imported is attributed, shown and hidden exactly as
  without lora_otel;
- after ``mv run.log.otel.jsonl run.log.otel.jsonl.1`` (rotation by rename) the sidecar follows
  the renamed file and the rest of the job still reaches the collector.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, lora_otel_cli, wait_for
from test_sidecar import alive, by_name, wait_gone

from lora_otel._boot import redact
from lora_otel.export import otlp
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

SECRET = "hunter2sekrit"
API_KEY = "K3ysekrit9876"
LOGIN_FAILS = """\
import argparse, time
import lora_otel
p = argparse.ArgumentParser()
p.add_argument("--password", "-p")
p.add_argument("--log")
args = p.parse_args()
with lora_otel.stage("login"):
    time.sleep(0.2)
raise RuntimeError("login failed for " + args.password)
"""


def run_job(tmp_path: Path, script: str, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(script, encoding="utf-8")
    return subprocess.run(
        [PYTHON, "job.py", *args],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sidecar_of(journal: Path) -> tuple[int, Path]:
    root = read_journal(journal).root
    assert root is not None and "lora_otel.sidecar.pid" in root.attrs, "no sidecar started"
    return root.attrs["lora_otel.sidecar.pid"], Path(root.attrs["lora_otel.sidecar.log"])


def lora_otel_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[lora-otel")]


@pytest.mark.collector
@pytest.mark.parametrize("option", ["--password", "-p"])
def test_password_from_argv_is_nowhere_in_lora_otels_outputs(tmp_path: Path, collector, option: str) -> None:
    """``job.py --password hunter2sekrit`` (and ``-p``) raising ``RuntimeError("login failed for
    hunter2sekrit")``: the exit is recorded as the failure it is, with the password as
    ``[REDACTED]``, and the password is in no byte of the journal, the --log file, the sidecar log,
    lora_otel's stderr lines or what the collector received."""
    r = run_job(
        tmp_path,
        LOGIN_FAILS,
        option,
        SECRET,
        "--log",
        "run.log",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint,
        LORA_OTEL_DRAIN_S="5",
    )
    assert r.returncode == 1 and f"RuntimeError: login failed for {SECRET}" in r.stderr  # the program's own
    journal = tmp_path / "run.log.otel.jsonl"
    side, side_log = sidecar_of(journal)
    wait_gone(side)
    exiting = [line for line in lora_otel_lines(r.stderr) if "exiting:" in line]
    assert exiting and f"login failed for {redact.REDACTED}" in exiting[0]
    for line in lora_otel_lines(r.stderr):
        assert SECRET not in line
    for path in [*journals(tmp_path), tmp_path / "run.log", side_log]:
        assert SECRET.encode() not in path.read_bytes(), "the password is in %s" % path.name
    received = wait_for(
        lambda: by_name(collector.spans()).get("process") and collector.spans(),
        what="the process span at the collector",
    )
    process = by_name(received)["process"]
    assert process.status_code == "STATUS_CODE_ERROR"
    assert f"login failed for {redact.REDACTED}" in process.status_message
    assert SECRET.encode() not in collector.output.read_bytes(), "the password reached the collector"
    assert any(f"login failed for {redact.REDACTED}" in rec.body for rec in collector.logs())


def test_sidecar_learns_what_the_process_redacted(tmp_path: Path) -> None:
    """The sidecar scrubs what it sends of the values the traced process redacted, learnt from that
    process's command line by the same rules (stacks and errors gathered from outside may quote
    them); the journal never had them."""
    proc = subprocess.Popen(
        [PYTHON, "-c", "import time; time.sleep(30)", "--hf_token", SECRET, "-k", API_KEY], env=clean_env()
    )
    try:
        cmdline = Path("/proc/%d/cmdline" % proc.pid)
        wait_for(lambda: SECRET.encode() in cmdline.read_bytes(), what="the child's command line")
        otlp.learn_secrets(proc.pid, environ={})
        learned = redact.remembered()
    finally:
        proc.kill()
        proc.wait()
    assert SECRET in learned and API_KEY in learned, learned
    attrs = otlp.otel_attributes(
        {
            "lora_otel.evidence.python.stacks": f'File "x.py", line 3 in f ({SECRET})',
            "lora_otel.evidence.error": f"key {API_KEY} refused",
        }
    )
    assert attrs == {
        "lora_otel.evidence.python.stacks": f'File "x.py", line 3 in f ({redact.REDACTED})',
        "lora_otel.evidence.error": f"key {redact.REDACTED} refused",
    }


@pytest.mark.collector
def test_endpoint_credentials_are_absent_from_sidecar_log_and_replay(tmp_path: Path, collector) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT=http://alice:pw@127.0.0.1:PORT/?api_key=...``: the sidecar log
    and ``lora-otel replay`` (failing there, and succeeding with a traces endpoint that carries the
    same credentials) name the endpoint as ``http://[REDACTED]@127.0.0.1:PORT/...api_key=[REDACTED]``."""
    port = collector.http_port
    bad = f"http://alice:pw@127.0.0.1:{port}/?api_key={API_KEY}"
    r = run_job(
        tmp_path,
        "import lora_otel\nwith lora_otel.stage('work'):\n    pass\n",
        "--log",
        "run.log",
        OTEL_EXPORTER_OTLP_ENDPOINT=bad,
        LORA_OTEL_DRAIN_S="3",
    )
    assert r.returncode == 0, r.stderr
    journal = tmp_path / "run.log.otel.jsonl"
    side, side_log = sidecar_of(journal)
    wait_gone(side)
    log = side_log.read_text()
    assert f"http://[REDACTED]@127.0.0.1:{port}/" in log
    for leaked in ("alice", ":pw@", API_KEY):
        assert leaked not in log, "%r is in the sidecar log:\n%s" % (leaked, log)
        assert leaked not in r.stderr and leaked not in journal.read_text()

    failed = lora_otel_cli("replay", str(journal), OTEL_EXPORTER_OTLP_ENDPOINT=bad, OTEL_EXPORTER_OTLP_TIMEOUT="3")
    good = lora_otel_cli(
        "replay",
        str(journal),
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=(f"http://alice:pw@127.0.0.1:{port}/v1/traces?api_key={API_KEY}"),
    )
    assert failed.returncode == 1, failed.stderr
    assert good.returncode == 0, good.stderr
    assert f"to http://[REDACTED]@127.0.0.1:{port}/v1/traces?api_key=[REDACTED]" in good.stdout
    for out in (failed.stdout + failed.stderr, good.stdout + good.stderr):
        for leaked in ("alice", ":pw@", API_KEY):
            assert leaked not in out, "%r is in the replay output:\n%s" % (leaked, out)


OLDLIB = """\
import warnings
warnings.warn("oldlib is deprecated: stacklevel 2", DeprecationWarning, stacklevel=2)
warnings.warn("oldlib is deprecated: stacklevel 1", DeprecationWarning)
warnings.warn("oldlib says: stacklevel 1", UserWarning)
warnings.warn("oldlib says: stacklevel 2", UserWarning, stacklevel=2)
"""
MIDDLE = "import oldlib\n"
MAIN = """\
import sys
import oldlib
import middle
import importlib
importlib.import_module("lazy")
print("done", flush=True)
"""


@pytest.mark.parametrize("flags", [[], ["-W", "always"]], ids=["default filters", "-W always"])
def test_import_time_warnings_look_as_without_lora_otel(tmp_path: Path, flags: list[str]) -> None:
    """Warnings raised by modules at import time, with ``stacklevel`` 1 and 2, imported by the
    script, by another module and through ``importlib``: the program's stdout and stderr are byte
    for byte what they are without lora_otel, apart from lora_otel's own lines. (Before: a
    ``stacklevel=2`` warning pointed into ``lora_otel/_boot/hooks.py``, and the default filters hid
    the DeprecationWarning that the script's own import shows.)"""
    (tmp_path / "oldlib.py").write_text(OLDLIB)
    (tmp_path / "middle.py").write_text(MIDDLE)
    (tmp_path / "lazy.py").write_text(OLDLIB.replace("oldlib", "lazy"))
    (tmp_path / "main.py").write_text(MAIN)

    def run(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, *flags, "main.py"], cwd=tmp_path, env=clean_env(**env), capture_output=True, text=True, timeout=60
        )

    plain, traced = run(), run(LORA_OTEL="1")
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert "main.py:2: DeprecationWarning: oldlib is deprecated: stacklevel 2" in plain.stderr  # shown by default
    assert journals(tmp_path / "lora-otel"), "lora_otel was not active"  # (a short run says nothing: issue 36)
    for stream in ("stdout", "stderr"):
        ours = [line for line in getattr(traced, stream).splitlines() if not line.startswith("[lora-otel")]
        assert ours == getattr(plain, stream).splitlines(), stream


@pytest.mark.collector
def test_sidecar_follows_a_journal_renamed_by_log_rotation(tmp_path: Path, collector) -> None:
    """``mv run.log.otel.jsonl run.log.otel.jsonl.1`` while the job runs: the job goes on writing
    the file it has open, and the sidecar follows that file, not the name: the stage after the
    rotation and the job's clean end reach the collector; the sidecar never says it cannot read."""
    script = textwrap.dedent("""\
        import os, time
        import lora_otel
        with lora_otel.stage("before rotation"):
            pass
        while not os.path.exists("rotated"):
            time.sleep(0.05)
        with lora_otel.stage("after rotation"):
            time.sleep(0.2)
        """)
    (tmp_path / "job.py").write_text(script)
    proc = subprocess.Popen(
        [PYTHON, "job.py", "--log", "run.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint, LORA_OTEL_DRAIN_S="5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        journal = tmp_path / "run.log.otel.jsonl"
        wait_for(
            lambda: (
                journal.exists()
                and "lora_otel.sidecar.pid" in (read_journal(journal).root.attrs if read_journal(journal).root else {})
            ),
            what="the sidecar",
        )
        side, side_log = sidecar_of(journal)
        wait_for(lambda: "before rotation" in by_name(collector.spans()), what="the first stage at the collector")
        os.rename(journal, tmp_path / "run.log.otel.jsonl.1")
        time.sleep(1.5)  # several polls of the sidecar on the renamed file
        assert alive(side), "the sidecar stopped after the rename:\n" + side_log.read_text()
        (tmp_path / "rotated").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    wait_gone(side)
    log = side_log.read_text()
    assert "cannot read" not in log and "unreadable journal" not in log, log
    received = wait_for(
        lambda: {"after rotation", "process"} <= set(by_name(collector.spans())) and collector.spans(),
        what="the rest of the job at the collector",
    )
    spans = by_name(received)
    assert spans["after rotation"].parent_id == spans["process"].span_id
    assert spans["process"].status_code != "STATUS_CODE_ERROR"
    assert "lora_otel.incomplete" not in spans["process"].attributes


# --- issue 36, item 5: every place a user can put a secret, every output --------------------------

PLANTED = {
    # the job's own argv
    "--token=": "jobTok4Lq8",
    "--api-key": "jobApi7Wm2",
    "--hf_token": "jobHf3Rz9",
    "job url user:pass": "jobUrl5Pw6",
    "job url ?token=": "jobQry8Tk1",
    # the environment (inherited by the children)
    "HF_TOKEN": "envHf2Xc7",
    "WANDB_API_KEY": "envWandb9Qa4",
    "AWS_SECRET_ACCESS_KEY": "envAws6Ty3",
    "env url user:pass": "envUrl1Pq5",
    # a config file named on argv (the job reads it and hands its token to a child)
    "config hf_token": "cfgHf8Vb2",
    # the children's argv
    "child --token=": "kidTok3Nm8",
    "child --api-key": "kidApi5Jh1",
    "child url user:pass": "kidUrl7Gf4",
    "child url ?token=": "kidQry2Ds9",
}
SECRETS_JOB = """\
import os, subprocess, sys
import lora_otel

argv = sys.argv[1:]
with open(argv[argv.index("--config") + 1]) as f:
    hf_token = f.read().split("hf_token:")[1].split()[0]
WAIT = "import os, time\\nwhile not os.path.exists('go'):\\n    time.sleep(0.05)\\n"
kids = [
    subprocess.Popen([sys.executable, "-c", WAIT, "--token=" + os.environ["KID_TOKEN"], "--api-key",
                      os.environ["KID_API"], "--hf_token", hf_token]),
    subprocess.Popen([sys.executable, "-c", WAIT, os.environ["KID_URL"]]),
]
with lora_otel.stage("wait for children"):
    for kid in kids:
        kid.wait()
"""


class OTLPTee:
    """A loopback OTLP/HTTP receiver that keeps every request body as it arrived (gzip undone) and
    hands it on to a real collector, answering with the collector's answer."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading
        import urllib.request

        bodies: list[tuple[str, bytes]] = []
        self.bodies = bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                import gzip

                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                bodies.append((self.path, body))
                request = urllib.request.Request(
                    upstream + self.path,
                    data=body,
                    method="POST",
                    headers={"Content-Type": self.headers["Content-Type"]},
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        code, content_type, data = answer.status, answer.headers.get("Content-Type"), answer.read()
                except OSError:
                    code, content_type, data = 503, "text/plain", b""
                self.send_response(code)
                self.send_header("Content-Type", content_type or "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def attribute_texts(self, key: str) -> list[str]:
        """The string values (lists joined) of attribute ``key`` on every span, event and log record received."""
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []

        def scan(attributes) -> None:
            for kv in attributes:
                if kv.key == key:
                    value = kv.value
                    found.append(
                        value.string_value
                        if value.HasField("string_value")
                        else " ".join(v.string_value for v in value.array_value.values)
                    )

        for path, body in list(self.bodies):
            if path.endswith("/v1/traces"):
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            scan(span.attributes)
                            for event in span.events:
                                scan(event.attributes)
            elif path.endswith("/v1/logs"):
                for resource_logs in ExportLogsServiceRequest.FromString(body).resource_logs:
                    for scope in resource_logs.scope_logs:
                        for record in scope.log_records:
                            scan(record.attributes)
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.mark.collector
def test_secrets_planted_everywhere_are_in_no_output(tmp_path: Path, collector) -> None:
    """Secrets in every place a user can put one — the job's argv (``--token=``, ``--api-key X``,
    ``--hf_token X``, a URL with ``user:pass@`` and ``?token=``), the environment (``HF_TOKEN``,
    ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, a URL with user-info), a YAML config named on argv
    (``hf_token: ...``) and the argv of the children the job starts — are in no byte of any output,
    while the job stalls waiting for its children (so their command lines are gathered as evidence)
    and after it ends: the journals, the stacks file, the sidecar log, the children registry, the
    ``--log`` file, stderr, ``inspect``, ``watch``, the HTML report, the Perfetto export, the
    webhook's body, and the raw OTLP requests a real collector receives (the children's evidence is
    there, redacted)."""
    s = PLANTED
    (tmp_path / "config.yaml").write_text("model: tiny\nhf_token: %s\nlr: 0.0001\n" % s["config hf_token"])
    (tmp_path / "job.py").write_text(SECRETS_JOB)
    tee = OTLPTee(collector.http_endpoint)
    from test_watch_alerts import Hook

    hook = Hook()
    try:
        env = clean_env(
            LORA_OTEL="1",
            OTEL_EXPORTER_OTLP_ENDPOINT=tee.endpoint,
            LORA_OTEL_STALL_AFTER="wait for children=2",
            LORA_OTEL_DRAIN_S="5",
            HF_TOKEN=s["HF_TOKEN"],
            WANDB_API_KEY=s["WANDB_API_KEY"],
            AWS_SECRET_ACCESS_KEY=s["AWS_SECRET_ACCESS_KEY"],
            PIP_INDEX_URL="https://carol:%s@pypi.example.org/simple" % s["env url user:pass"],
            KID_TOKEN=s["child --token="],
            KID_API=s["child --api-key"],
            KID_URL="https://dave:%s@hub.example.org/m?token=%s" % (s["child url user:pass"], s["child url ?token="]),
        )
        argv = [
            PYTHON,
            "job.py",
            "--config",
            "config.yaml",
            "--token=" + s["--token="],
            "--api-key",
            s["--api-key"],
            "--hf_token",
            s["--hf_token"],
            "--hub",
            "https://alice:%s@hub.example.org/repo?token=%s" % (s["job url user:pass"], s["job url ?token="]),
            "--log",
            "run.log",
        ]
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            journal = tmp_path / "run.log.otel.jsonl"
            children = wait_for(
                lambda: tee.attribute_texts("lora_otel.evidence.process.children"),
                timeout=90,
                what="the children's evidence at the collector",
            )
            views = {
                "inspect": lora_otel_cli("inspect", str(journal), cwd=tmp_path),
                "watch": lora_otel_cli(
                    "watch",
                    "--once",
                    "--stall-after",
                    "wait for children=2",
                    "--alert-webhook",
                    hook.url,
                    str(journal),
                    cwd=tmp_path,
                ),
                "report": lora_otel_cli("report", str(journal), "-o", "report.html", cwd=tmp_path),
                "perfetto": lora_otel_cli(
                    "report", "--format", "perfetto", str(journal), "-o", "trace.json", cwd=tmp_path
                ),
            }
            (tmp_path / "go").touch()
            out, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err.decode(errors="replace")
        side, side_log = sidecar_of(journal)
        wait_gone(side)
        wait_for(lambda: by_name(collector.spans()).get("process"), what="the process span at the collector")
    finally:
        tee.close()
        hook.close()

    assert any("--api-key [REDACTED]" in text and "https://[REDACTED]@" in text for text in children), children
    assert hook.bodies, "watch posted no alert: %s" % views["watch"].stderr
    assert views["inspect"].stdout and (tmp_path / "report.html").exists() and (tmp_path / "trace.json").exists()
    outputs: dict[str, bytes] = {
        "stderr": err,
        "stdout": out,
        "collector's output": collector.output.read_bytes(),
        "webhook bodies": b"".join(body for _, _, body in hook.bodies),
    }
    for n, (path, body) in enumerate(tee.bodies):
        outputs["OTLP request %d (%s)" % (n, path)] = body
    for name, result in views.items():
        outputs[name] = (result.stdout + result.stderr).encode()
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("job.py", "config.yaml", "rotel.out")]
    assert side_log in files and tmp_path / "run.log" in files
    assert any(p.name.endswith(".stacks.txt") for p in files) and any(p.name.endswith(".children") for p in files)
    for path in files:
        outputs[str(path.relative_to(tmp_path))] = path.read_bytes()
    leaks = [
        "%s (%s) in %s" % (secret, where, name)
        for name, data in outputs.items()
        for where, secret in s.items()
        if secret.encode() in data
    ]
    assert not leaks, "\n".join(leaks)
