"""``lora-otel watch``: a job followed live, one line per change in a log panel, a redrawn tree on a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import JournalBuilder
from procs import PYTHON, clean_env, journal_has_open, journals, lora_otel_cli, run_traced, wait_for
from test_hangs import kill_and_reap, make_module, start_traced

from lora_otel.cli import main
from lora_otel.journal.reader import JournalTail, read_journal

CLEAR = "\x1b[H\x1b[2J"
RED_BOLD = "\x1b[1;31m"


class Watch:
    """``python -m lora_otel watch ARGS`` with its stdout a pipe, its lines collected as they come."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "lora_otel", "watch", *args],
            cwd=cwd,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, text: str, timeout: float = 30) -> str:
        """The first line containing ``text``, waiting for it to be printed."""
        return wait_for(
            lambda: next((line for line in list(self.lines) if text in line), None),
            timeout=timeout,
            what="watch to print %r (so far: %s)" % (text, self.lines),
        )

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        """(exit status, all stdout, stderr) once watch has exited by itself."""
        status = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        return status, "\n".join(self.lines), stderr

    def kill(self) -> None:
        """Stop it if it still runs, and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def watch(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``lora-otel watch`` in this process (stdout captured, so not a terminal): (status, out, err)."""
    status = main(["watch", *args])
    out, err = capsys.readouterr()
    return status, out, err


def in_a_terminal(*args: str, **env: str) -> tuple[int, str]:
    """Run ``lora-otel watch ARGS`` with its stdout a pseudo-terminal: (exit status, what it wrote)."""
    environ = {k: v for k, v in clean_env(**env).items() if k != "NO_COLOR" or "NO_COLOR" in env}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [PYTHON, "-m", "lora_otel", "watch", *args], env=environ, stdout=slave, stderr=subprocess.PIPE
    )
    os.close(slave)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side has closed
                break
            if not chunk:
                break
            data += chunk
        return proc.wait(timeout=30), data.decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


def finished(journal: JournalBuilder, code: int = 0) -> None:
    """A process that imported torch in 2.3 s, trained for 9 s, and exited with ``code``."""
    root = journal.process()
    journal.span("import torch", 0.01, 2.3)
    journal.span("training", 3.0, 9.0)
    if code:
        journal.end(root, 12.3, status="error", message="exit code %d" % code)
        journal.exit(12.3, code=code, how="exception", message="uncaught RuntimeError: CUDA error")
    else:
        journal.end(root, 12.3)
        journal.exit(12.3)


def running_and_stuck(path: Path, since_s: float = 300, beat_ago_s: float = 0.5) -> JournalBuilder:
    """This test process as a running job, stuck in ``import slowmod`` for ``since_s`` seconds."""
    journal = JournalBuilder(path, t0=time.time_ns() - round(since_s * 1e9))
    journal.process(alive=True)
    journal.span("import os", 0.001, 0.002)
    journal.start("import slowmod", 0.01)
    journal.beat(since_s - beat_ago_s)
    return journal


@pytest.mark.slow
def test_real_job_stalls_then_is_killed(tmp_path: Path) -> None:
    """A log panel following a real job sees the import start, the stall, and the kill; status 3."""
    make_module(tmp_path, "slowmod", "import time\ntime.sleep(600)\n")
    job = start_traced(tmp_path, "import os\nimport slowmod\n")
    watcher = None
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import slowmod"), what="import span")
        watcher = Watch("lora-otel", "--interval", "0.2", "--stall-after", "import=1", cwd=tmp_path)
        started = watcher.wait_line("started: import slowmod")
        stalled = watcher.wait_line("STALLED: import slowmod open for")
        assert started == "[watch] %d started: import slowmod" % job.pid
        assert stalled.startswith("[watch] %d STALLED: " % job.pid) and "(limit 1 s) — " in stalled
        assert watcher.proc.poll() is None, "watch keeps following while the job runs"
        kill_and_reap(job)
        status, out, err = watcher.finish()
    finally:
        kill_and_reap(job)
        if watcher is not None:
            watcher.kill()
    assert status == 3, (out, err)
    assert err == ""
    gone = "[watch] %d process gone without an exit record (killed or vanished): stuck in import slowmod" % job.pid
    assert gone in out
    assert out.index("started: import slowmod") < out.index("STALLED") < out.index(gone)
    assert "\x1b" not in out, "no escape codes when stdout is not a terminal"
    tree = out[out.index("[watch] every process has ended") :]
    assert "import slowmod  OPEN for" in tree


@pytest.mark.slow
def test_new_journals_in_the_directory_are_picked_up(tmp_path: Path) -> None:
    """A job started after watch began is followed too; both pids are shown, each with its end."""
    make_module(tmp_path, "slowmod", "import time\ntime.sleep(600)\n")
    slow = start_traced(tmp_path, "import slowmod\n")
    watcher = None
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import slowmod"), what="import span")
        watcher = Watch("lora-otel", "--interval", "0.2", cwd=tmp_path)
        watcher.wait_line("[watch] %d started: import slowmod" % slow.pid)
        (tmp_path / "quick.py").write_text("import json\n")
        assert run_traced(["quick.py"], cwd=tmp_path).returncode == 0
        [quick] = {read_journal(p).pid for p in journals(tmp_path / "lora-otel")} - {slow.pid}
        watcher.wait_line("[watch] %d process exited: finished normally" % quick)
        kill_and_reap(slow)
        status, out, _ = watcher.finish()
    finally:
        kill_and_reap(slow)
        if watcher is not None:
            watcher.kill()
    assert status == 3  # the slow one was killed
    assert "pid %d: gone" % slow.pid in out and "pid %d: exited" % quick in out


def test_once_on_a_finished_journal(capsys, journal) -> None:
    """`--once` prints the tree with every span and exits 0 for a job that finished normally."""
    finished(journal)
    status, out, err = watch(capsys, "--once", str(journal.path))
    assert (status, err) == (0, "")
    assert "finished normally in 12.3 s (exit code 0)" in out
    for line in ("process  12.3 s  ok", "  import torch  2.3 s  ok", "  training  9 s  ok"):
        assert line in out.splitlines()


def test_failed_job_exits_1(capsys, journal) -> None:
    """A job that exited with an exception: status 1, and the failure is named."""
    finished(journal, code=1)
    status, out, _ = watch(capsys, "--once", str(journal.path))
    assert status == 1
    assert "failed: uncaught RuntimeError: CUDA error (exit code 1)" in out


def test_following_a_job_that_has_already_ended(capsys, journal) -> None:
    """Without --once, an ended job gives its exit line and final tree at once, not its history."""
    finished(journal)
    status, out, _ = watch(capsys, "--interval", "0.1", str(journal.path))
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("[watch] %d following " % os.getpid()) and lines[0].endswith("(exited)")
    assert lines[1] == "[watch] %d process exited: finished normally in 12.3 s (exit code 0)" % os.getpid()
    assert lines[2] == "[watch] every process has ended"
    assert "started:" not in out and "ended:" not in out


def test_killed_under_lora_otel_run_exits_3(capsys, journal) -> None:
    """An exit record added by `lora-otel run` for a child killed by a signal counts as killed: 3."""
    journal.process()
    journal.start("import bitsandbytes", 0.1)
    journal.exit(5.0, code=137, how="signal", message="killed by SIGKILL")
    assert watch(capsys, "--once", str(journal.path))[0] == 3


@pytest.mark.slow
def test_two_journals_in_a_directory(capsys, tmp_path: Path) -> None:
    """A directory of two jobs' journals shows both, one after the other, each with its pid and state."""
    (tmp_path / "job.py").write_text("import json\n")
    for _ in range(2):
        assert run_traced(["job.py"], cwd=tmp_path).returncode == 0
    pids = [read_journal(p).pid for p in journals(tmp_path / "lora-otel")]
    assert len(set(pids)) == 2
    status, out, _ = watch(capsys, "--once", str(tmp_path / "lora-otel"))
    assert status == 0
    for pid in pids:
        assert "pid %d: exited" % pid in out.splitlines()
    assert out.count("finished normally") == 2


@pytest.mark.slow
def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    """A path that does not exist: exit 2 and one line on stderr, no traceback."""
    r = lora_otel_cli("watch", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["lora-otel watch: %s: no such file or directory" % (tmp_path / "nope")]
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.slow
def test_not_a_journal_and_bad_options(tmp_path: Path) -> None:
    """A text file, a bad --stall-after, a bad --interval: each is one line and exit 2."""
    text = tmp_path / "notes.txt"
    text.write_text("hello\nworld\n")
    for args in ([str(text)], ["--stall-after", "import=soon", str(tmp_path)], ["--interval", "0", str(tmp_path)]):
        r = lora_otel_cli("watch", *args)
        assert r.returncode == 2, args
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("lora-otel watch: "), r.stderr
        assert "Traceback" not in r.stderr
    assert "not a journal (line 1: not JSON" in lora_otel_cli("watch", str(text)).stderr


def test_corrupt_journal_is_shown_with_a_problem_count(capsys, journal) -> None:
    """Corrupt and truncated lines do not stop watch; their count is shown instead of each."""
    root = journal.process()
    journal.raw(b"{not json\n\xff\xfe\n")
    journal.span("import torch", 0.01, 2.3)
    journal.end(root, 3.0)
    journal.exit(3.0)
    journal.raw(b'{"v":1,"k":"li')
    status, out, _ = watch(capsys, "--once", str(journal.path))
    assert status == 0
    assert "  import torch  2.3 s  ok" in out.splitlines()
    count = len(JournalTail(journal.path).read().problems)  # the cut-off last record is not one yet
    assert count >= 2 and "problems: %d (lora-otel inspect lists them)" % count in out.splitlines()
    assert "note:" not in out


@pytest.mark.slow
def test_stall_and_frozen_in_plain_output(capsys, monkeypatch, tmp_path: Path) -> None:
    """A running job past its import limit, and one whose beat stopped, are each marked STALLED."""
    for name in ("LORA_OTEL_STALL_AFTER", "LORA_OTEL_FROZEN_AFTER"):
        monkeypatch.delenv(name, raising=False)
    stuck = running_and_stuck(tmp_path / "stuck.otel.jsonl")
    status, out, _ = watch(capsys, "--once", str(stuck.path))
    assert status == 3, "stalled: as inspect DIR --summary says"
    [line] = [line for line in out.splitlines() if "import slowmod  OPEN for " in line]
    assert line.startswith("  import slowmod  OPEN for ") and line.endswith("  <- STALLED")
    assert "\nSTALLED: import slowmod open for " in out and " (limit 120 s) — " in out
    frozen = running_and_stuck(tmp_path / "frozen.otel.jsonl", since_s=60, beat_ago_s=30)
    out = watch(capsys, "--once", str(frozen.path))[1]
    # (30 s when read at once; a slow call on a loaded machine adds its own seconds)
    assert re.search(r"\nSTALLED: frozen in import slowmod: no beat for (3\d|[4-9]\d) s \(limit 10 s\) — ", out), out


@pytest.mark.slow
def test_no_colour_codes_when_not_a_terminal(capsys, monkeypatch, tmp_path: Path) -> None:
    """Piped or captured output has no escape codes at all, even with a stall and NO_COLOR unset."""
    stuck = running_and_stuck(tmp_path / "stuck.otel.jsonl")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = watch(capsys, "--once", str(stuck.path))[1]
    assert "STALLED" in out and "\x1b" not in out
    r = lora_otel_cli("watch", "--once", str(stuck.path))
    assert "STALLED" in r.stdout and "\x1b" not in r.stdout


@pytest.mark.slow
def test_terminal_gets_colour_unless_turned_off(tmp_path: Path) -> None:
    """On a terminal the stalled span is red and bold; --no-color and NO_COLOR turn that off."""
    stuck = running_and_stuck(tmp_path / "stuck.otel.jsonl")
    status, screen = in_a_terminal("--once", str(stuck.path))
    assert status == 3
    assert RED_BOLD + "  import slowmod" not in screen  # the indent stays outside the colour
    assert "  " + RED_BOLD + "import slowmod  OPEN for" in screen
    for args, env in ((["--no-color"], {}), ([], {"NO_COLOR": "1"})):
        status, screen = in_a_terminal("--once", *args, str(stuck.path), **env)
        assert "<- STALLED" in screen and "STALLED: import slowmod open for" in screen and "\x1b" not in screen


@pytest.mark.slow
def test_terminal_redraws_until_the_job_ends(journal) -> None:
    """Without --once a terminal gets whole screens (clear, then the view); watch ends with the job."""
    finished(journal)
    status, screen = in_a_terminal("--interval", "0.1", str(journal.path))
    assert status == 0
    assert screen.startswith(CLEAR) and "lora-otel watch " in screen and "Ctrl-C to stop" in screen
    assert "[watch]" not in screen


@pytest.mark.slow
def test_ctrl_c_exits_quietly_with_130(tmp_path: Path) -> None:
    """Ctrl-C while following a running job: status 130, nothing on stderr."""
    stuck = running_and_stuck(tmp_path / "stuck.otel.jsonl")
    watcher = Watch("--interval", "0.1", str(stuck.path), cwd=tmp_path)
    try:
        watcher.wait_line("started: import slowmod")
        watcher.proc.send_signal(signal.SIGINT)
        status, _, err = watcher.finish()
    finally:
        watcher.kill()
    assert (status, err) == (130, "")


SWALLOWS_CTRL_C = """\
import sys, time
import lora_otel.cli.watch as w
from lora_otel.cli import main

class Clock:  # the loop's sleep loses a KeyboardInterrupt, as Python does in a finalizer or a callback
    time_ns = staticmethod(time.time_ns)

    @staticmethod
    def sleep(seconds):
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            print("Exception ignored in: <a finalizer>", file=sys.stderr, flush=True)

w.time = Clock
sys.exit(main(["watch", "--interval", "0.1", sys.argv[1]]))
"""


@pytest.mark.slow
def test_ctrl_c_lost_to_a_finalizer_still_stops_watch(tmp_path: Path) -> None:
    """A KeyboardInterrupt Python swallows where it is raised (printed as ignored) still ends watch
    with 130 at the loop's next turn: the SIGINT itself is remembered (issue 23: a Ctrl-C that left
    watch running in a loaded CI run)."""
    stuck = running_and_stuck(tmp_path / "stuck.otel.jsonl")
    (tmp_path / "swallow.py").write_text(SWALLOWS_CTRL_C)
    proc = subprocess.Popen(
        [PYTHON, "swallow.py", str(stuck.path)],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        wait_for(lambda: "started: import slowmod" in proc.stdout.readline(), timeout=60, what="watch's first line")
        deadline = time.monotonic() + 60
        ignored = ""
        while "Exception ignored" not in ignored and time.monotonic() < deadline:  # until one is lost
            proc.send_signal(signal.SIGINT)
            ignored = proc.stderr.readline()
        assert "Exception ignored" in ignored
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # and closes the pipes


@pytest.mark.slow
def test_help_teaches_by_example() -> None:
    """`lora-otel watch --help` has examples and the exit statuses."""
    r = lora_otel_cli("watch", "--help")
    assert r.returncode == 0
    assert "lora-otel watch runs/ --once" in r.stdout and "exit status, job by job" in r.stdout
    assert "0 all finished normally" in r.stdout
