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
