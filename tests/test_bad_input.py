"""Unwritable paths and full disks: the program finishes, one clear line, no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, only_journal

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

SCRIPT = "import json\nprint('PROGRAM done')\n"

needs_non_root = pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(SCRIPT)
    return subprocess.run(
        [PYTHON, "job.py", *args],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def lora_errors(stderr: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith("[lora-otel]")]


def _no_room() -> None:
    """In the child before exec: no regular file may grow (``ulimit -f 0``), as on a full disk."""
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing


def run_full(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``run`` where every write that grows a regular file fails: a full disk. (``/dev/full`` no
    longer serves: lora_otel writes only to regular files, see docs/security.md.)"""
    (tmp_path / "job.py").write_text(SCRIPT)
    return subprocess.run(
        [PYTHON, "-B", "job.py", *args],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", **env),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_no_room,
    )


def test_journal_on_a_full_disk(tmp_path: Path) -> None:
    """A journal on a full disk: every write fails; the program runs; one line says so."""
    journal = str(tmp_path / "j.otel.jsonl")
    r = run_full(tmp_path, LORA_OTEL_JOURNAL=journal)
    assert r.returncode == 0
    assert "PROGRAM done" in r.stdout
    assert "Traceback" not in r.stderr
    errs = [ln for ln in lora_errors(r.stderr) if "journal write failed" in ln]
    assert len(errs) == 1 and journal in errs[0]


def test_journal_directory_is_a_file(tmp_path: Path) -> None:
    """A journal directory that cannot be created: fall back to a temp dir, and say where."""
    blocker = tmp_path / "blocked"
    blocker.write_text("not a directory")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    r = run(tmp_path, LORA_OTEL_DIR=str(blocker / "sub"), TMPDIR=str(tmpdir))
    assert r.returncode == 0 and "PROGRAM done" in r.stdout
    assert "Traceback" not in r.stderr
    [line] = [ln for ln in lora_errors(r.stderr) if "cannot write journal" in ln]
    assert str(tmpdir) in line
    j = only_journal(tmpdir)
    assert j.exit is not None and j.exit["code"] == 0


def test_nowhere_to_write_a_journal(tmp_path: Path) -> None:
    """Neither the journal dir nor the temp fallback is writable: the program still runs."""
    blocker = tmp_path / "blocked"
    blocker.write_text("x")
    r = run(tmp_path, LORA_OTEL_DIR=str(blocker / "a"), TMPDIR=str(blocker / "b"))
    assert r.returncode == 0 and "PROGRAM done" in r.stdout
    assert "Traceback" not in r.stderr
    assert any("cannot write a journal anywhere" in ln for ln in lora_errors(r.stderr))


def test_log_file_that_cannot_be_opened(tmp_path: Path) -> None:
    """`--log` pointing under a regular file: no lines go there, one line says why (its directory
    does not exist: lora_otel creates none) — in the journal, a short run shows none on the terminal
    (issue 36 item 9) — and the journal goes to LORA_OTEL_DIR."""
    blocker = tmp_path / "blocked"
    blocker.write_text("x")
    r = run(tmp_path, "--log", str(blocker / "run.log"), LORA_OTEL_DIR=str(tmp_path / "j"))
    assert r.returncode == 0 and "PROGRAM done" in r.stdout
    assert "Traceback" not in r.stderr
    [path] = journals(tmp_path / "j")
    assert [ln for ln in read_journal(path).lines if "does not exist" in ln.msg and "not copied there" in ln.msg]


def test_log_file_on_a_full_disk(tmp_path: Path) -> None:
    """The log file (``LORA_OTEL_LOG``: created at start) on a full disk: appends fail once, reported
    once; the program runs. (An argv ``--log`` that does not exist waits until needed: issue 36 item 4.)"""
    log = str(tmp_path / "run.log")
    r = run_full(tmp_path, LORA_OTEL_LOG=log, LORA_OTEL_JOURNAL=str(tmp_path / "j.otel.jsonl"))
    assert r.returncode == 0 and "PROGRAM done" in r.stdout
    errs = [ln for ln in lora_errors(r.stderr) if "cannot append to log file %s" % log in ln]
    assert len(errs) == 1


def test_closed_stdout(tmp_path: Path) -> None:
    """stdout closed by the launcher: the program runs; lines fall back to stderr."""
    (tmp_path / "job.py").write_text("import sys\nsys.stderr.write('PROGRAM ran\\n')\n")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: os.close(1),
    )
    assert r.returncode == 0
    assert "PROGRAM ran" in r.stderr and "Traceback" not in r.stderr
    assert journals(tmp_path / "lora-otel")


def test_bad_config_values_warn_and_use_defaults(tmp_path: Path) -> None:
    """A bad LORA_OTEL_IMPORT_THRESHOLD_MS: one line naming it, default 5 used."""
    r = run(tmp_path, LORA_OTEL_IMPORT_THRESHOLD_MS="fast")
    assert r.returncode == 0
    assert any("LORA_OTEL_IMPORT_THRESHOLD_MS='fast'" in ln for ln in lora_errors(r.stderr))
    assert only_journal(tmp_path / "lora-otel").config["import_threshold_ms"] == 5.0


def test_a_program_that_restores_sigxfsz_outlives_its_file_size_limit(tmp_path: Path) -> None:
    """A program that lowers its own RLIMIT_FSIZE and restores SIGXFSZ's default (CPython ignores it
    at start): the journal stops short of the limit, so no write of lora_otel's raises the signal
    that would kill the program (before: killed, exit -25, by a journal record). One line says the
    journal could not be written; the program's own output and exit status are its own."""
    (tmp_path / "job.py").write_text(
        "import resource, signal\n"
        "import lora_otel\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
        "for i in range(3000):\n"
        "    with lora_otel.stage('stage %d' % i):\n"
        "        pass\n"
        "print('PROGRAM done')\n"
    )
    journal = tmp_path / "j.otel.jsonl"
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_JOURNAL=str(journal)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout == "PROGRAM done\n"
    assert "Traceback" not in r.stderr
    errs = [ln for ln in lora_errors(r.stderr) if "journal write failed" in ln]
    assert len(errs) == 1 and "RLIMIT_FSIZE" in errs[0], r.stderr[-2000:]
    assert 0 < journal.stat().st_size <= 64 * 1024
