"""`lora-otel run` writes the exit record its child could not: deaths by signal and os._exit."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, only_journal

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow


def run(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(script)
    return subprocess.run(
        [PYTHON, "-m", "lora_otel", "run", "--", PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_killed_child_gets_an_exit_record(tmp_path: Path) -> None:
    """SIGKILL: the journal ends with the supervisor's exit record, and inspect says killed."""
    r = run(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert r.returncode == -9
    j = only_journal(tmp_path / "lora-otel")
    assert j.exit == {"ts": j.exit["ts"], "code": 137, "how": "signal", "message": "killed by SIGKILL"}
    assert not j.problems
    out = subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", str(j.path)], capture_output=True, text=True, env=clean_env()
    )
    assert "killed by SIGKILL" in out.stdout.splitlines()[0], out.stdout


def test_os_exit_gets_an_exit_record_with_the_code(tmp_path: Path) -> None:
    """os._exit(3) skips exit handlers: the supervisor records code 3; the launcher sees 3."""
    r = run(tmp_path, "import os\nos._exit(3)\n")
    assert r.returncode == 3
    j = only_journal(tmp_path / "lora-otel")
    assert j.exit["code"] == 3 and j.exit["how"] == "no exit record"


def test_normal_exit_is_not_recorded_twice(tmp_path: Path) -> None:
    """A child that exits normally wrote its own record: no second one (no reader problem)."""
    r = run(tmp_path, "import sys\nsys.exit(4)\n")
    assert r.returncode == 4
    j = only_journal(tmp_path / "lora-otel")
    assert j.exit["code"] == 4 and j.exit["how"] == "normal" and not j.problems


def test_bad_stall_after_is_one_line(tmp_path: Path) -> None:
    """A bad --stall-after: exit status 2, one line naming the problem, the job not started."""
    (tmp_path / "job.py").write_text("open('ran', 'w').close()\n")
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "run", "--stall-after", "import=soon", "--", PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and not (tmp_path / "ran").exists()
    assert r.stderr.strip().count("\n") == 0 and "--stall-after" in r.stderr and "'soon'" in r.stderr


def test_pythons_under_a_shell_get_their_own_journals(tmp_path: Path) -> None:
    """`lora-otel run -- sh -c 'python ...; python ...'`: the exact journal path is for the direct
    child only, so each Python under the shell writes its own journal beside it."""
    cmd = "%s -c pass; %s -c pass" % (PYTHON, PYTHON)
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "run", "--dir", "d", "--", "sh", "-c", cmd],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    found = sorted((tmp_path / "d").glob("*.otel.jsonl"))
    assert len(found) == 2
    for path in found:
        j = read_journal(path)
        assert [s.name for s in j.spans].count("process") == 1 and not j.problems


def test_python_dash_m_keeps_the_module_name(tmp_path: Path) -> None:
    """`python -m tool.cli`: argv in the journal starts with the module's name, not '-m'. (Here
    it fails, by an uncaught exception: a short process that fails so keeps its argv in its
    journal, as a job does; one ending by an exit code leaves no file, issue 36 item 9.)"""
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "__init__.py").write_text("")
    (tmp_path / "tool" / "cli.py").write_text("import sys\nopen(sys.argv[1])\n")
    r = subprocess.run(
        [PYTHON, "-m", "tool.cli", "missing.json"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0, r.stderr
    j = only_journal(tmp_path / "lora-otel")
    assert j.root.attrs["process.command"] == "tool.cli"
    assert j.root.attrs["process.command_args"][1:] == ["tool.cli", "missing.json"]


def test_a_command_killed_by_a_signal_gets_a_last_line(tmp_path: Path) -> None:
    """A command that dies by a signal it does not handle writes no last line of its own; the
    launcher's log ends with the wrapper's: how it died and the exit status it passes on (a
    newcomer's SIGTERMed job ended at its last warning, with nothing saying it was killed)."""
    r = subprocess.run(
        [
            PYTHON,
            "-m",
            "lora_otel",
            "run",
            "--",
            PYTHON,
            "-c",
            "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == -signal.SIGTERM, r.stderr
    assert r.stderr.splitlines()[-1] == "lora-otel run: the command was killed by SIGTERM (exit status 143)", r.stderr
