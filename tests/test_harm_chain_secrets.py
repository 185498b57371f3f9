"""Issue 37 (hostile trial, item 4): the command line of a process at the other end of a chain of
waits reaches the why/advice lines, the journal (so OTLP) and the sidecar's log. A process that is
not part of the job (here: a sibling writing into the job's stdin) is named by pid and program and
script only; nothing of its arguments, which ``redact_argv``'s name rules cannot all catch.

Real processes: ``python hold.py -uroot -pS3CRETPW --user admin:CURLPW`` piped into a traced job
(``LORA_OTEL=1``, ``--log``) that blocks reading its stdin inside a stage with a 2 s limit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, lora_otel_cli
from test_waits import LIMIT, stop, text, why_line

from lora_otel.export.otlp import translate
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

SECRETS = ("S3CRETPW", "CURLPW")

HOLD = """\
import sys, time
print("ready", file=sys.stderr, flush=True)
time.sleep(600)  # holds the pipe's write end, never writes
"""

JOB = """\
import sys, lora_otel
with lora_otel.stage("ask"):
    data = sys.stdin.read()
"""


def test_the_other_end_of_a_pipe_is_named_without_its_arguments(tmp_path: Path) -> None:
    """The why line names the writer as ``pid N (`python hold.py`)``; neither password appears in
    any file the run wrote (job output, --log, journal, sidecar log, stacks), in ``inspect``'s
    output or in the OTLP translation of the journal."""
    (tmp_path / "hold.py").write_text(HOLD, encoding="utf-8")
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    env = clean_env(LORA_OTEL_STALL_AFTER=LIMIT)
    hold = subprocess.Popen(
        [PYTHON, "hold.py", "-uroot", "-pS3CRETPW", "--user", "admin:CURLPW"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    assert hold.stderr is not None and hold.stderr.readline().strip() == b"ready"
    with open(tmp_path / "job.txt", "wb") as out:
        job = subprocess.Popen(
            [PYTHON, "job.py", "--log", "run.log"],
            cwd=tmp_path,
            stdin=hold.stdout,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "LORA_OTEL": "1"},
            start_new_session=True,
        )
    try:
        line = why_line(tmp_path, "waits to read its standard input")
        assert "pid %d (`python" % hold.pid in line and "hold.py`)" in line, line
        journal = read_journal(tmp_path / "run.log.otel.jsonl")
        assert journal.stalls, "the watchdog's record"
        outputs = {
            str(p): p.read_text(encoding="utf-8", errors="replace")
            for p in tmp_path.rglob("*")
            if p.is_file() and p.name not in ("hold.py", "job.py")
        }
        outputs["inspect"] = lora_otel_cli("inspect", str(tmp_path / "run.log.otel.jsonl"), cwd=tmp_path).stdout
        outputs["otlp"] = repr(translate(journal))
        for where, content in outputs.items():
            for secret in SECRETS:
                assert secret not in content, "%s in %s" % (secret, where)
        assert "admin" not in text(tmp_path / "run.log") and "-uroot" not in text(tmp_path / "run.log")
    finally:
        stop(job)
        stop(hold)
        for stream in (hold.stdout, hold.stderr):
            if stream is not None:
                stream.close()
