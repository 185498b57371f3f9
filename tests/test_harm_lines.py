"""What a program sees of lora_otel's lines and files (issue 36 items 4, 7 and 9).

Each case runs a real program with ``LORA_OTEL=1``, as a hostile or merely ordinary neighbour would:
a value with a newline or a terminal escape in argv, an ASCII console, the shell's ``[ -n "$(python
-c 'import x' 2>&1)" ]`` probe, a CLI's usage error, a program that rotates its log at start or
reads its ``--log_file`` back as data, forks that exit failing. What must hold is what the program
and its user would see without lora_otel, and that the journal still has what lora_otel knows.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals, wait_for

from lora_otel._boot.jsonl import printable
from lora_otel.journal.reader import read_journal

STAGE = "import lora_otel\nwith lora_otel.stage('work'):\n    pass\n"  # a stage makes it a job: its lines show


def run(cwd: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd``, traced, journals in ``cwd/j`` (short runs' kept: `clean_env`)."""
    base = {"LORA_OTEL": "1", "LORA_OTEL_DIR": str(cwd / "j")}
    base.update(env)
    return subprocess.run([PYTHON, *args], cwd=cwd, env=clean_env(**base), capture_output=True, timeout=120)


class TestPrintable:
    """`jsonl.printable`, the one escape every human line passes through (milliseconds)."""

    @pytest.mark.parametrize(
        ("text", "shown"),
        [
            ("plain /data/run 1", "plain /data/run 1"),
            ("数据/日本", "数据/日本"),  # printable non-ASCII stays as it is
            ("a\nb\rc\td", "a\\nb\\rc\\td"),
            ("\x1b]0;title\x07\x1b[2J", "\\x1b]0;title\\x07\\x1b[2J"),
            ("next\x85line\u2028sep", "next\\x85line\\u2028sep"),  # C1 NEL, line separator
            ("bad\udcffbyte", "bad\\udcffbyte"),  # a lone surrogate (surrogateescape argv)
        ],
    )
    def test_escapes(self, text: str, shown: str) -> None:
        """Control characters, separators and lone surrogates become their escapes; the rest stays."""
        assert printable(text) == shown


@pytest.mark.slow
class TestForgedLines:
    """Item 7: no value of the program's forges a line or reaches the terminal as a command."""

    def test_a_newline_and_escapes_in_argv_forge_nothing(self, tmp_path: Path) -> None:
        """An argument holding a newline, a forged ``[lora-otel]`` line, CR and ESC sequences: on
        stderr and in the log every line of lora_otel's is one of this process's, with no ESC or CR
        byte anywhere; the journal keeps the argument as it was."""
        (tmp_path / "job.py").write_text(STAGE)
        forged = "x\n[lora-otel][1][2026-01-01T00:00:00.000Z] exiting normally\r\x1b]0;owned\x07\x1b[2J"
        r = run(tmp_path, ["job.py", forged], LORA_OTEL_LOG=str(tmp_path / "ours.log"))
        assert r.returncode == 0, r.stderr
        log = (tmp_path / "ours.log").read_bytes()
        for data in (r.stderr, log):
            assert b"\x1b" not in data and b"\r" not in data
            lines = data.decode().splitlines()
            assert lines and all(re.match(LINE_RE, ln) for ln in lines), lines
            pids = {re.match(LINE_RE, ln).group(1) for ln in lines}
            assert pids == {str(read_journal(journals(tmp_path)[0]).pid)}
            [argv] = [ln for ln in lines if "argv: " in ln]
            assert "x\\n[lora-otel][1]" in argv and "\\x1b]0;owned\\x07" in argv
        j = read_journal(tmp_path / "ours.log.otel.jsonl")
        assert j.root.attrs["process.command_args"][-1] == forged

    def test_an_ascii_console_gets_escapes_the_files_utf8(self, tmp_path: Path) -> None:
        """``PYTHONIOENCODING=ascii`` (an ASCII console) and a journal directory with a Chinese
        name: stderr gets ASCII only, the path backslash-escaped as the program's own output is;
        the ``--log`` file and the journal hold the name in UTF-8."""
        (tmp_path / "job.py").write_text(STAGE + "import sys\nprint('程序', file=sys.stderr)\n")
        d = tmp_path / "日志"
        r = run(tmp_path, ["job.py"], LORA_OTEL_DIR=str(d), LORA_OTEL_LOG=str(d / "ours.log"), PYTHONIOENCODING="ascii")
        assert r.returncode == 0, r.stderr
        assert all(b < 128 for b in r.stderr), r.stderr
        assert b"\\u7a0b\\u5e8f" in r.stderr  # the program's own line, as Python escapes it
        assert b"journal: " + os.fsencode(str(tmp_path)) + b"/\\u65e5\\u5fd7/" in r.stderr
        assert "日志" in (d / "ours.log").read_text(encoding="utf-8")
        assert "日志".encode() in (d / "ours.log.otel.jsonl").read_bytes()


@pytest.mark.slow
class TestShortProcessesSayNothing:
    """Item 9: a process that ends before it is a job prints nothing of lora_otel's."""

    def test_the_shell_probe_is_empty(self, tmp_path: Path) -> None:
        """``[ -n "$(python -c 'import json' 2>&1)" ]``: empty output, as without lora_otel."""
        r = subprocess.run(
            ["sh", "-c", '[ -n "$("$0" -c "import json" 2>&1)" ] && echo noisy || echo quiet', PYTHON],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_BEAT_S="10"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.stdout == "quiet\n", r.stderr

    def test_a_usage_error_ends_with_the_programs_line(self, tmp_path: Path) -> None:
        """A CLI's usage error (exit 2): its stderr is its own lines only; the journal (kept by the
        tests' ``LORA_OTEL_KEEP_SHORT=1``) has the end."""
        script = (
            "import argparse\np = argparse.ArgumentParser(prog='cli')\np.add_argument('n', type=int)\np.parse_args()\n"
        )
        (tmp_path / "cli.py").write_text(script)
        r = run(tmp_path, ["cli.py", "x"], LORA_OTEL_BEAT_S="10")
        assert r.returncode == 2
        assert r.stderr.decode().startswith("usage: cli") and b"[lora-otel]" not in r.stderr, r.stderr
        [j] = [read_journal(p) for p in journals(tmp_path / "j")]
        assert j.exit["code"] == 2 and any(ln.msg.startswith("exiting: exit code 2") for ln in j.lines)

    def test_an_uncaught_exception_ends_with_the_traceback(self, tmp_path: Path) -> None:
        """An uncaught exception: stderr ends with the program's traceback, not a lora_otel line;
        its journal, worth reading, stays (without ``LORA_OTEL_KEEP_SHORT``)."""
        r = run(tmp_path, ["-c", "raise KeyError('k')"], LORA_OTEL_BEAT_S="10", LORA_OTEL_KEEP_SHORT="")
        assert r.returncode == 1
        assert r.stderr.decode().rstrip().endswith("KeyError: 'k'") and b"[lora-otel]" not in r.stderr
        [j] = [read_journal(p) for p in journals(tmp_path / "j")]
        assert any(ln.msg.startswith("exiting: uncaught KeyError") for ln in j.lines)

    def test_an_exit_code_of_a_short_run_leaves_no_file(self, tmp_path: Path) -> None:
        """``sys.exit(3)`` before the first beat: nothing worth reading, no journal left."""
        r = run(tmp_path, ["-c", "import sys; sys.exit(3)"], LORA_OTEL_BEAT_S="10", LORA_OTEL_KEEP_SHORT="")
        assert r.returncode == 3 and r.stderr == b""
        assert journals(tmp_path / "j") == []

    def test_a_job_shows_its_start_at_its_first_beat(self, tmp_path: Path) -> None:
        """A process that lives on: its ``started`` line reaches stderr with its first beat, while
        it runs, and before its ``argv`` line."""
        err = tmp_path / "err.txt"
        with open(err, "wb") as out:
            proc = subprocess.Popen(
                [PYTHON, "-c", "import time\nwhile True:\n    time.sleep(0.1)\n"],
                cwd=tmp_path,
                env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j")),
                stderr=out,
            )
        try:
            wait_for(lambda: "argv: " in err.read_text(), what="the promotion's lines")
            assert proc.poll() is None
            text = err.read_text()
            assert text.index("started pid %d" % proc.pid) < text.index("argv: ")
        finally:
            proc.kill()
            proc.wait()

    def test_the_last_log_wins(self, tmp_path: Path) -> None:
        """``--log a.log --log b.log``: argparse keeps b.log, and so does lora_otel (the journal
        beside it, none beside a.log)."""
        script = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--log')\np.parse_args()\n"
        (tmp_path / "job.py").write_text(script)
        r = run(tmp_path, ["job.py", "--log", "a.log", "--log", "b.log"])
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "b.log.otel.jsonl").exists() and not (tmp_path / "a.log.otel.jsonl").exists()

    def test_failing_forks_leave_no_files_and_little_time(self, tmp_path: Path) -> None:
        """200 forks that exit 1 at once (``os._exit`` and ``sys.exit``) leave no journal of their
        own; the parent's has each one's code (a ``child exit`` event). (Before: a journal and an
        environment check each — and a child exiting by ``sys.exit`` could hang in an import.)"""
        script = (
            "import os, sys\n"
            "for i in range(200):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        os._exit(1) if i % 2 else sys.exit(1)\n"
            "    os.waitpid(pid, 0)\n"
        )
        (tmp_path / "job.py").write_text(script)
        t0 = time.monotonic()
        r = run(tmp_path, ["job.py"])
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - t0 < 60
        [parent] = [read_journal(p) for p in journals(tmp_path / "j")]
        codes = [e[2]["child.exit_code"] for s in parent.spans for e in s.events if e[1] == "child exit"]
        assert codes == [1] * 200


@pytest.mark.slow
class TestTheProgramsLog:
    """Item 4: an absent ``--log`` file is lora_otel's to create only when its lines are needed."""

    def test_a_program_rotating_its_log_keeps_its_backup(self, tmp_path: Path) -> None:
        """``os.replace(log, log + '.1')`` at start when the log exists: the backup of the last
        good run (train.log.1) keeps its bytes; train.log holds this run's line."""
        (tmp_path / "train.log.1").write_text("last good run\n")
        script = (
            "import argparse, logging, os\np = argparse.ArgumentParser()\np.add_argument('--log')\n"
            "a = p.parse_args()\nif os.path.exists(a.log):\n    os.replace(a.log, a.log + '.1')\n"
            "logging.basicConfig(filename=a.log, level=logging.INFO)\nlogging.info('this run')\n"
        )
        (tmp_path / "job.py").write_text(script)
        r = run(tmp_path, ["job.py", "--log", "train.log"])
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "train.log.1").read_text() == "last good run\n"
        assert (tmp_path / "train.log").read_text() == "INFO:root:this run\n"

    def test_a_log_file_read_back_as_data(self, tmp_path: Path) -> None:
        """``--log_file m.txt``, rows appended with ``np.savetxt`` by a job (numpy is heavy; it lives
        past a beat) and read back with ``np.loadtxt`` at the end of a normal run: no crash on a
        line of lora_otel's (before: the file was created at start with the ``started`` line)."""
        pytest.importorskip("numpy")
        script = (
            "import argparse, time\nimport numpy as np\np = argparse.ArgumentParser()\np.add_argument('--log_file')\n"
            "a = p.parse_args()\nfor row in ([1.0, 2.0], [3.0, 4.0]):\n"
            "    with open(a.log_file, 'a') as f:\n        np.savetxt(f, [row])\n    time.sleep(0.8)\n"
            "print(np.loadtxt(a.log_file).sum())\n"
        )
        (tmp_path / "job.py").write_text(script)
        r = run(tmp_path, ["job.py", "--log_file", "m.txt"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == b"10.0"


WALK_TB = """import sys
try:
    import outer
except RuntimeError as e:
    tb = e.__traceback__
    while tb:
        print(tb.tb_frame.f_code.co_filename, tb.tb_frame.f_code.co_name, file=sys.stderr)
        tb = tb.tb_next
    raise
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "code",
    ["import nonexistent_module_x", "import badmod", "def f():\n    import badmod\nf()", "import outer", WALK_TB],
)
def test_a_failing_import_traceback_is_the_programs_own(tmp_path: Path, code: str) -> None:
    """An import that fails (no such module; a module raising as it runs, at top level, in a
    function, in a module another imports; the traceback walked by the program): the program's
    traceback is the one it prints without lora_otel — no ``traced_import`` frame of lora_otel's in
    it (issue 36 item 9), on 3.9 and 3.10 too (their bare ``raise`` re-raises the traceback caught:
    `hooks._set_exc_info`)."""
    (tmp_path / "badmod.py").write_text("x = 1\nraise RuntimeError('in module')\n")
    (tmp_path / "outer.py").write_text("import os\nimport badmod\n")
    untraced = subprocess.run(
        [PYTHON, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    traced = subprocess.run(
        [PYTHON, "-c", code],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert traced.returncode == untraced.returncode == 1
    assert "Traceback" in untraced.stderr and traced.stderr == untraced.stderr


@pytest.mark.slow
def test_pdb_step_into_an_import_stops_where_it_does_without_lora_otel(tmp_path: Path) -> None:
    """``python -m pdb job.py``, ``step`` three times on ``import modx`` (a module not loaded yet),
    then ``continue``: pdb shows the same stops as without lora_otel (importlib's ``_find_and_load``
    first), never a line of lora_otel's import hook (issue 36 item 9)."""
    (tmp_path / "modx.py").write_text("X = 1\n")
    (tmp_path / "job.py").write_text("import modx\nprint(modx.X)\n")
    outs = []
    for env in (clean_env(), clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"))):
        r = subprocess.run(
            [PYTHON, "-m", "pdb", "job.py"],
            cwd=tmp_path,
            env=env,
            input="s\ns\ns\nc\nq\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
        outs.append(r.stdout)
    untraced, traced = outs
    assert "_find_and_load" in untraced, untraced
    assert "lora_otel" not in traced and traced == untraced, traced
