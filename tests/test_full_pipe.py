"""A job blocked writing to its stdout, a pipe its launcher never reads (issue 21 item 4).

The launcher is the one the subprocess documentation warns of: ``Popen(stdout=PIPE)`` then
``wait()`` before reading. The job prints 200 kB inside a stage; once the pipe holds its 64 kB, the
job's ``print`` blocks in the kernel with the GIL released, and nothing it does can be seen on that
pipe. What must hold is what the user sees in the job's ``--log`` (its stderr may be the same pipe):
a ``STALLED`` line that names the full stdout pipe and the launcher's pid, which is waiting for its
child to exit; the journal's ``stall`` record and ``lora-otel inspect`` say the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, lora_otel_cli, wait_for

from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import read_journal
from lora_otel.journal.records import Span

JOB = """\
import lora_otel
with lora_otel.stage("write report"):
    for i in range(2000):
        print("x" * 99)  # 200 kB: three pipes' worth
"""

LAUNCHER = """\
import subprocess, sys
stderr = subprocess.STDOUT if sys.argv[1] == "same" else open("err.txt", "wb")
p = subprocess.Popen([sys.executable, "job.py", "--log", "run.log"], stdout=subprocess.PIPE, stderr=stderr)
with open("job.pid", "w") as f:
    f.write(str(p.pid))
p.wait()  # reads the job's output only after it ends: the job never ends
print(p.stdout.read())
"""

LIMIT = "write report=2"


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def launch(tmp_path: Path, stderr: str) -> subprocess.Popen:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    (tmp_path / "launcher.py").write_text(LAUNCHER, encoding="utf-8")
    with open(tmp_path / "launcher.txt", "wb") as out:
        return subprocess.Popen(
            [PYTHON, "launcher.py", stderr],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER=LIMIT),
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(timeout=30)


def watchdog_line(tmp_path: Path) -> str:
    """The watchdog's line with the diagnosis in --log: its STALLED line where the job's own lines
    may not get through (stderr in the full pipe), else the why line after the job's own STALLED
    line (which has no diagnosis)."""
    return wait_for(
        lambda: [
            x
            for x in text(tmp_path / "run.log").splitlines()
            if ("STALLED:" in x or "is stalled: " in x) and "Blocked writing" in x
        ],
        timeout=60,
        what="the watchdog's line with the diagnosis in run.log",
    )[0]


@pytest.mark.slow
def test_launcher_that_never_reads_is_named_with_its_pid(tmp_path: Path) -> None:
    """stdout a pipe nobody reads, stderr a file: the job's own STALLED line gets through (stderr is
    no pipe), and the watchdog's why line after it on --log (and on the job's stderr) says the job
    is blocked writing to its stdout, names the pipe's inode, its fill, and
    the launcher (pid, command line) holding the read end while it waits for its child to exit;
    the stall record has the same sentence and the pipe's facts, and inspect leads with it."""
    launcher = launch(tmp_path, "file")
    try:
        line = watchdog_line(tmp_path)
        job = int(text(tmp_path / "job.pid"))
        inode = os.readlink("/proc/%d/fd/1" % job)[6:-1]
        assert line.startswith("[lora-otel][%d][" % job), line
        assert "why write report is stalled: Blocked writing" in line, line
        own = wait_for(  # the job's own line and the watchdog's are written apart: either may come first
            lambda: [x for x in text(tmp_path / "run.log").splitlines() if "STALLED:" in x],
            what="the job's own STALLED line",
        )
        assert "write report open for" in own[0] and "Blocked" not in own[0], text(tmp_path / "run.log")
        assert "Blocked writing to its stdout, a pipe nobody reads" in line, line
        assert "pipe:[%s]" % inode in line, line
        assert "its read end is held by pid %d (" % launcher.pid in line and "launcher.py" in line, line
        assert "waits for a child process to exit (wait channel do_wait)" in line, line
        assert "GIL" not in line, line
        assert line in text(tmp_path / "err.txt").splitlines(), "the job's own stderr (a file) has it too"

        [record] = read_journal(tmp_path / "run.log.otel.jsonl").stalls
        assert record["kind"] == "alive" and record["stage"] == "write report"
        assert record["diagnosis"] in line
        assert record["evidence"]["pipe.fd1.inode"] == int(inode)
        assert record["evidence"]["pipe.fd1.reader_pids"] == str(launcher.pid)
        assert record["evidence"]["pipe.main_thread_writing"] is True
        assert record["evidence"]["pipe.fd1.queued_bytes"] >= record["evidence"]["pipe.fd1.capacity_bytes"] // 2
        assert "pipe.fd2.inode" not in record["evidence"]

        shown = lora_otel_cli("inspect", str(tmp_path / "run.log.otel.jsonl"), cwd=tmp_path)
        assert shown.returncode != 2, shown.stderr
        assert record["diagnosis"] in shown.stdout, shown.stdout
    finally:
        stop(launcher)


@pytest.mark.slow
def test_stdout_and_stderr_in_one_pipe(tmp_path: Path) -> None:
    """``stderr=STDOUT``: the job's own lines on stderr cannot get through either, yet its beat goes
    on (lines on descriptor 2 never block) — its own STALLED line and the watchdog's, naming the
    one pipe for both streams and the launcher, are both in --log."""
    launcher = launch(tmp_path, "same")
    try:
        line = watchdog_line(tmp_path)
        assert "STALLED:" in line, "stderr is in the full pipe: the watchdog speaks for the job"
        assert "Blocked writing to its stdout and stderr (one pipe), a pipe nobody reads" in line, line
        assert "its read end is held by pid %d (" % launcher.pid in line, line
        own = wait_for(  # the job's own line and the watchdog's are written apart: either may come first
            lambda: [x for x in text(tmp_path / "run.log").splitlines() if "STALLED:" in x and x != line],
            what="the job's own STALLED line",
        )
        assert "write report open for" in own[0], text(tmp_path / "run.log")
        [record] = read_journal(tmp_path / "run.log.otel.jsonl").stalls
        assert record["kind"] == "alive", "the beat did not stop: not frozen"
    finally:
        stop(launcher)


# --- the rule on hand-written evidence ------------------------------------------------------------


def a_stall(kind: str = "alive") -> Stall:
    span = Span("write report", "a" * 16, None, "b" * 32, 1)
    return Stall(kind, span, 30.0, 5.0, "")


LAUNCHER_ROW = {
    "pid": 4711,
    "fd": 3,
    "cmdline": "python launcher.py",
    "state": "S",
    "wchan": "do_wait",
    "reading": False,
}


def pipe_evidence(**extra: object) -> dict:
    evidence = {
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "anon_pipe_write",
        PREFIX + "pipe.fd1.inode": 34094,
        PREFIX + "pipe.fd1.queued_bytes": 64000,
        PREFIX + "pipe.fd1.capacity_bytes": 65536,
        PREFIX + "pipe.fd1.readers": [LAUNCHER_ROW],
        PREFIX + "pipe.fd1.reader_pids": "4711",
        PREFIX + "pipe.writing_threads": ["4712 anon_pipe_write"],
        PREFIX + "pipe.main_thread_writing": True,
    }
    evidence.update({PREFIX + k: v for k, v in extra.items()})
    return evidence


def test_the_rule_answers_for_a_full_pipe() -> None:
    found = explain(a_stall(), pipe_evidence())
    assert found.attrs["lora_otel.diagnosis.rule"] == "full pipe"
    assert found.sentence == (
        "Blocked writing to its stdout, a pipe nobody reads: the main thread waits in anon_pipe_write; "
        "pipe:[34094] holding 64000 of its 65536 bytes; its read end is held by pid 4711 (python launcher.py), "
        "which is not reading it: it waits for a child process to exit (wait channel do_wait), to read the "
        "pipe only after the job ends (the stdout=PIPE deadlock)."
    )


def test_no_blame_without_a_blocked_write_or_a_full_pipe() -> None:
    """A stdout pipe that is empty, or a main thread not writing, is not this cause."""
    assert explain(a_stall(), pipe_evidence(**{"pipe.fd1.queued_bytes": 0})).attrs["lora_otel.diagnosis.rule"] != (
        "full pipe"
    )
    quiet = pipe_evidence(**{"process.wait_channel": "hrtimer_nanosleep"})
    del quiet[PREFIX + "pipe.main_thread_writing"]
    del quiet[PREFIX + "pipe.writing_threads"]
    assert explain(a_stall(), quiet).attrs["lora_otel.diagnosis.rule"] != "full pipe"


def test_a_frozen_job_with_another_thread_blocked_on_the_pipe() -> None:
    """No beat, and a thread other than the main one waits to write to the full pipe: that is said,
    not that the GIL is held."""
    evidence = pipe_evidence(**{"process.wait_channel": "futex_do_wait"})
    del evidence[PREFIX + "pipe.main_thread_writing"]
    found = explain(a_stall("frozen"), evidence)
    assert found.sentence.startswith(
        "Blocked writing to its stdout, a pipe nobody reads: thread 4712 waits in anon_pipe_write"
    )
    assert "GIL" not in found.sentence


def test_a_reader_nobody_can_see() -> None:
    found = explain(a_stall(), pipe_evidence(**{"pipe.fd1.readers": [], "pipe.fd1.reader_pids": ""}))
    assert "no process this user can see holds its read end" in found.sentence


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_pipe_facts_of_a_real_blocked_writer(tmp_path: Path) -> None:
    """`evidence.pipe_facts` on a child blocked writing to a pipe this process holds and never reads."""
    from lora_otel.analysis.evidence import pipe_facts

    child = subprocess.Popen([PYTHON, "-c", "print('x' * 200000)"], stdout=subprocess.PIPE)
    try:

        def blocked() -> bool:
            try:
                with open("/proc/%d/wchan" % child.pid) as f:
                    return "pipe" in f.read()
            except OSError:
                return False

        wait_for(blocked, what="the child blocked in a pipe write")
        facts = pipe_facts(child.pid)
        assert facts[PREFIX + "pipe.fd1.inode"] == os.fstat(child.stdout.fileno()).st_ino  # type: ignore[union-attr]
        assert facts[PREFIX + "pipe.main_thread_writing"] is True
        [me] = facts[PREFIX + "pipe.fd1.readers"]
        assert me["pid"] == os.getpid() and me["fd"] == child.stdout.fileno()  # type: ignore[union-attr]
        assert facts[PREFIX + "pipe.fd1.queued_bytes"] > 0
    finally:
        child.kill()
        child.communicate()


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ({"state": "T", "wchan": "do_signal_stop"}, "which is stopped (SIGSTOP or a debugger)"),
        ({"state": "R", "wchan": "-"}, "which is running: busy elsewhere, or reading slower than the job writes"),
        ({"wchan": "hrtimer_nanosleep"}, "which is not reading it: it sleeps (wait channel hrtimer_nanosleep)"),
        ({"wchan": "ep_poll"}, "which is not reading it: it polls other descriptors (epoll) (wait channel ep_poll)"),
        ({"wchan": "do_wait"}, "to read the pipe only after the job ends (the stdout=PIPE deadlock)"),
    ],
)
def test_what_the_reader_does_instead(row: dict, said: str) -> None:
    from lora_otel.analysis.pipes import describe_reader

    assert said in describe_reader({**LAUNCHER_ROW, **row})


@pytest.mark.slow
def test_the_readers_command_line_is_redacted(tmp_path: Path) -> None:
    """The process holding the read end is another program: a secret on its command line (``--token``)
    never reaches the evidence or the sentence."""
    from lora_otel.analysis.evidence import pipe_facts

    reader = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', \"print('x' * 200000)\"], stdout=subprocess.PIPE)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    (tmp_path / "reader.py").write_text(reader, encoding="utf-8")
    proc = subprocess.Popen(
        [PYTHON, "reader.py", "--token", "hf_abcdefghijklmnopqrstuvwxyz0123456789"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        child = int(proc.stdout.readline())  # type: ignore[union-attr]

        def facts() -> dict:
            found = pipe_facts(child)
            return found if found.get(PREFIX + "pipe.main_thread_writing") else {}

        found = wait_for(facts, what="the child blocked on its stdout")
        [row] = found[PREFIX + "pipe.fd1.readers"]
        assert row["pid"] == proc.pid and "reader.py --token" in row["cmdline"], row
        assert "hf_abcdefghijklmnopqrstuvwxyz0123456789" not in repr(found)
    finally:
        if child:
            os.kill(child, signal.SIGKILL)  # orphaned by the reader's kill below; init reaps it
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
