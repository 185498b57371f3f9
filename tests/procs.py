"""Helpers for tests that run real traced Python processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lora_otel.journal.reader import Journal, read_journal

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent
LINE_RE = r"^\[lora-otel\]\[(\d+)\]\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)\] (.*)$"


TEST_DEFAULTS = {"LORA_OTEL_DIR": "lora-otel", "LORA_OTEL_KEEP_SHORT": "1"}
"""What `clean_env` sets unless told otherwise: journals in ``./lora-otel/`` of the process's
working directory (a relative ``LORA_OTEL_DIR``, taken from the working directory at start, and
given absolute to its children), and every short run's journal kept. Most tests read a traced
process's journal there; those about the defaults themselves pass ``LORA_OTEL_DIR=""`` or
``LORA_OTEL_KEEP_SHORT=""``, which leaves the variable unset."""


def clean_env(**extra: str) -> dict:
    """The test process's environment without lora_otel or tracing variables (but a recording
    directory ``LORA_OTEL_RECORD_EVIDENCE``), plus `TEST_DEFAULTS`, plus ``extra``. For the names in
    `TEST_DEFAULTS`, an empty string in ``extra`` means unset."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LORA_OTEL", "OTEL_", "PYTEST_")) and k != "TRACEPARENT"
    }
    env.update(TEST_DEFAULTS)
    if os.environ.get("LORA_OTEL_RECORD_EVIDENCE", "") not in ("", "0", "1"):
        # Recording (tests/evidence_cases.py): the job's sidecar records each diagnosis there too.
        env["LORA_OTEL_RECORD_EVIDENCE"] = os.path.abspath(os.environ["LORA_OTEL_RECORD_EVIDENCE"])
    env.update(extra)
    for name in TEST_DEFAULTS:
        if env[name] == "":
            del env[name]
    return env


def run_traced(args: list, cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` with ``LORA_OTEL=1`` (the .pth activation) and capture its output."""
    e = clean_env(LORA_OTEL="1", **env)
    return subprocess.run([PYTHON, *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


def journals(directory: Path) -> list:
    return sorted(directory.rglob("*.otel.jsonl"))


def only_journal(directory: Path) -> Journal:
    found = journals(directory)
    assert len(found) == 1, "expected one journal under %s, found %s" % (directory, found)
    return read_journal(found[0])


def span_named(j: Journal, name: str):
    matches = [s for s in j.spans if s.name == name]
    assert matches, "no span %r in %s" % (name, [s.name for s in j.spans])
    return matches[0]


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail("timed out after %s s waiting for %s" % (timeout, what))


def journal_has_open(directory: Path, name: str) -> bool:
    for p in journals(directory):
        j = read_journal(p)
        if any(s.name == name and s.end_ns is None for s in j.spans):
            return True
    return False


def lora_otel_cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "lora_otel", *args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=120
    )


def torchrun_argv(script: str = "train.py", nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N --master-port <free> SCRIPT``."""
    from collector import free_port

    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        script,
    ]


def start_torchrun(cwd: Path, env: dict, output: Path, script: str = "train.py") -> subprocess.Popen:
    """A 2-rank torchrun of ``script`` in ``cwd``, in its own session (so the test can end the
    whole group), stdout and stderr to ``output``."""
    with open(output, "wb") as out:
        return subprocess.Popen(
            torchrun_argv(script),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
