"""The interpreter's exit is a stage of a job (issue 22): a program that hangs after its main code
returned — in an atexit handler (a telemetry flush, a logger's upload) or joining a non-daemon
thread it left running — shows an ``exit`` stage that stalls like any other, with the handler or
the threads named; an exit quicker than a beat writes no span; a program whose threads go on
working after the main thread returned is not an exit. Each case runs a real traced process."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals, lora_otel_cli, span_named, wait_for

from lora_otel.journal.reader import read_journal

pytestmark = [
    pytest.mark.torch,  # every job here imports torch (a heavy framework: a job from its start)
    pytest.mark.slow,
]

ATEXIT_HANG = """\
import atexit, time
import torch  # a job: it imports a heavy framework

def flush_telemetry():
    time.sleep(3600)  # an endpoint that never answers

atexit.register(flush_telemetry)
print("training done", flush=True)
"""

THREAD_HANG = """\
import threading, time
import torch

def upload():
    time.sleep(3600)

threading.Thread(target=upload, name="uploader").start()
print("training done", flush=True)
"""


def lines(text: str) -> list[str]:
    return [m.group(3) for m in (re.match(LINE_RE, line) for line in text.splitlines()) if m]


def hang_at_exit(tmp_path: Path, script: str) -> tuple[str, str]:
    """Run ``script`` traced with an exit limit of 3 s until its job lines give the cause of the
    stall (the ``why`` line), then kill it; its stdout and stderr."""
    (tmp_path / "job.py").write_text(script, encoding="utf-8")
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as stderr, open(tmp_path / "stdout.txt", "wb") as stdout:
        proc = subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="exit=3"),
            stdout=stdout,
            stderr=stderr,
        )
    try:
        wait_for(
            lambda: any(line.startswith("why exit is stalled: ") for line in lines(err.read_text("utf-8", "replace"))),
            timeout=90,
            what="the why line of the exit stall",
        )
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return (tmp_path / "stdout.txt").read_text("utf-8"), err.read_text("utf-8", "replace")


def why(stderr: str) -> str:
    return next(line for line in lines(stderr) if line.startswith("why exit is stalled: "))


class TestExitHangs:
    def test_an_atexit_handler_waiting_on_an_event_is_not_a_lock_wait(self, tmp_path: Path) -> None:
        """A flush that waits for an Event no thread sets (the newcomer's torchtune trial): the why
        line names the Event's wait at the handler's line, not "Waiting for a lock … holding
        self._cond" (Condition.wait releases its lock while it waits)."""
        script = ATEXIT_HANG.replace("import atexit, time", "import atexit, threading, time").replace(
            "    time.sleep(3600)  # an endpoint that never answers", "    threading.Event().wait()  # never set"
        )
        out, err = hang_at_exit(tmp_path, script)
        assert out == "training done\n"
        assert why(err).startswith(
            "why exit is stalled: The exit runs an atexit handler, flush_telemetry() in job.py. "
            "Waiting for an event: the main thread waits in Event.wait() at job.py:5 in flush_telemetry"
        ), why(err)
        assert "lock" not in why(err), why(err)

    def test_an_atexit_handler_that_hangs_is_named(self, tmp_path: Path) -> None:
        out, err = hang_at_exit(tmp_path, ATEXIT_HANG)
        assert out == "training done\n"
        stalled = next(line for line in lines(err) if line.startswith("STALLED: "))
        assert stalled.startswith("STALLED: exit open for "), stalled
        assert "job.py:5 in flush_telemetry" in stalled, stalled
        assert why(err).startswith(
            "why exit is stalled: The exit runs an atexit handler, flush_telemetry() in job.py. "
            "The main thread is sleeping (time.sleep) at job.py:5 in flush_telemetry"
        ), why(err)
        [path] = journals(tmp_path / "lora-otel")
        j = read_journal(path)
        exit_span = span_named(j, "exit")
        assert exit_span.is_open and exit_span.parent_id == j.root.span_id
        assert exit_span.attrs["lora_otel.exit.threads"] == []
        assert exit_span.attrs["lora_otel.exit.atexit_handlers"] >= 1
        assert not span_named(j, "arguments").is_open  # the program's own part is over
        r = lora_otel_cli("inspect", str(tmp_path / "lora-otel"))
        assert r.returncode == 0, r.stderr
        assert "after stalling at exit" in r.stdout.splitlines()[0], r.stdout
        assert "The exit runs an atexit handler, flush_telemetry() in job.py." in r.stdout, r.stdout
        report = tmp_path / "job.html"
        r = lora_otel_cli("report", str(tmp_path / "lora-otel"), "-o", str(report))
        assert r.returncode == 0, r.stderr
        assert "flush_telemetry() in job.py" in report.read_text("utf-8")

    def test_a_thread_left_running_is_named(self, tmp_path: Path) -> None:
        out, err = hang_at_exit(tmp_path, THREAD_HANG)
        assert out == "training done\n"
        said = why(err)
        assert said.startswith(
            "why exit is stalled: The interpreter's exit waits for threads the program left running "
            "(threading._shutdown joins every non-daemon thread: uploader); thread upload() is at job.py:5 in upload."
        ), said
        assert "lock" not in said  # not read as a lock wait (it was, before the exit stage)
        j = read_journal(journals(tmp_path / "lora-otel")[0])
        assert span_named(j, "exit").attrs["lora_otel.exit.threads"] == ["uploader"]
        r = lora_otel_cli("inspect", str(tmp_path / "lora-otel"))
        assert "non-daemon thread: uploader" in r.stdout, r.stdout


class TestExitsThatAreFine:
    @pytest.mark.parametrize("code", [0, 3])
    def test_a_quick_exit_writes_no_exit_span(self, tmp_path: Path, code: int) -> None:
        """A job that exits at once (a job by its torch import, so ``threading._shutdown`` is
        wrapped): exit code and output as without lora_otel, no span. (A 3 s beat: torch's own exit
        took more than the 0.2 s beat this test had on a loaded machine, and was rightly a stage.)"""
        script = "import sys, time, threading\nimport torch\ntime.sleep(1.5)\nprint('ok')\nsys.exit(%d)\n" % code
        (tmp_path / "job.py").write_text(script, encoding="utf-8")
        r = subprocess.run(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="3"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == code and r.stdout == "ok\n", r.stderr
        j = read_journal(journals(tmp_path / "lora-otel")[0])
        assert j.root.attrs.get("lora_otel.promoted"), "a job"
        assert "exit" not in [s.name for s in j.spans]
        assert j.exit is not None and j.exit["code"] == code

    def test_a_slow_exit_is_a_stage_that_ends(self, tmp_path: Path) -> None:
        """A non-daemon thread that ends a while after the main thread returned: an ``exit`` span
        that ends ok, with that thread named; exit code kept."""
        script = (
            "import sys, threading, time\nimport torch\n"
            "threading.Thread(target=time.sleep, args=(2.5,), name='flusher').start()\n"
            "sys.exit(4)\n"
        )
        (tmp_path / "job.py").write_text(script, encoding="utf-8")
        r = subprocess.run(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.2"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 4 and r.stdout == "", r.stderr
        assert not [line for line in lines(r.stderr) if "STALLED" in line or "exit open" in line], r.stderr
        j = read_journal(journals(tmp_path / "lora-otel")[0])
        exit_span = span_named(j, "exit")
        assert exit_span.end_ns is not None and exit_span.status == "ok"
        assert exit_span.attrs["lora_otel.exit.threads"] == ["flusher"]
        assert (exit_span.end_ns - exit_span.start_ns) / 1e9 >= 2.0
        assert j.exit["code"] == 4

    def test_work_in_threads_after_main_returns_is_no_exit(self, tmp_path: Path) -> None:
        """A program that trains in a non-daemon thread while its main thread returns at once:
        the exit span ends as soon as an optimizer step shows that work goes on, and no stall of
        ``exit`` is said though the limit is short."""
        script = """\
import threading, time
import torch

def train():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    time.sleep(1.0)  # the main thread has returned by now: the exit has begun
    for _ in range(40):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        time.sleep(0.1)

threading.Thread(target=train, name="trainer").start()
"""
        (tmp_path / "job.py").write_text(script, encoding="utf-8")
        r = subprocess.run(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_BEAT_S="0.2", LORA_OTEL_STALL_AFTER="exit=30"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert not [line for line in lines(r.stderr) if "exit open" in line], r.stderr
        j = read_journal(journals(tmp_path / "lora-otel")[0])
        [exit_span] = [s for s in j.spans if s.name == "exit"]
        assert exit_span.attrs.get("lora_otel.exit.work_went_on") is True
        training = span_named(j, "training")
        assert exit_span.end_ns is not None and exit_span.end_ns < training.end_ns
        assert j.exit["code"] == 0 and "40 optimizer steps" in r.stderr
