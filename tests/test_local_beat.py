"""No collector needed, BEAT: where the main thread is in every beat, and the job's own lines about a
slow stage (issue 13, items 1 and 2; the limits and stderr identity recorded at start).

Real programs launched the way a user launches them: a detached launcher (a shell, as a web UI's
Node process does) appending the job's stdout and stderr to ``log.txt`` with ``LORA_OTEL=1``, and
``lora-otel run``. ``LORA_OTEL_NARRATE_S=1`` (the first line after 1 s instead of 10 s, the whole
cadence scaled alike) and ``LORA_OTEL_BEAT_S=0.2`` make them finish in seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, lora_otel_cli, wait_for

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

FAST = {"LORA_OTEL_NARRATE_S": "1", "LORA_OTEL_BEAT_S": "0.2"}

SLEEPY_IMPORT = "import time\ntime.sleep(%s)\n"
RUN_PY = "import argparse\nimport toolkit.job\nprint('RUN finished', flush=True)\n"


def lora_lines(log: Path) -> list[tuple[int, str]]:
    """``(pid, message)`` of every ``[lora-otel]`` line in ``log``."""
    out = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = re.match(LINE_RE, line)
        if m:
            out.append((int(m.group(1)), m.group(3)))
    return out


def messages(log: Path, start: str) -> list[str]:
    return [msg for _, msg in lora_lines(log) if msg.startswith(start)]


def launch_detached(tmp: Path, script: str, **env: str) -> subprocess.Popen:
    """``sh -c 'exec python SCRIPT >> log.txt 2>&1'`` in a session of its own, as a UI starts a job."""
    cmd = ["sh", "-c", 'exec "$0" "$1" >> log.txt 2>&1', PYTHON, script]
    return subprocess.Popen(cmd, cwd=tmp, env=clean_env(LORA_OTEL="1", **{**FAST, **env}), start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def toolkit(tmp: Path, seconds: str) -> None:
    (tmp / "toolkit").mkdir()
    (tmp / "toolkit" / "__init__.py").write_text("")
    (tmp / "toolkit" / "job.py").write_text(SLEEPY_IMPORT % seconds)
    (tmp / "run.py").write_text(RUN_PY)


@pytest.fixture(scope="module")
def stuck_import(tmp_path_factory):
    """ai-toolkit's run.py whose ``import toolkit.job`` never returns, launched detached into log.txt,
    with ``LORA_OTEL_STALL_AFTER=import=4``; yields once its STALLED line is in log.txt."""
    tmp = tmp_path_factory.mktemp("stuck_import")
    toolkit(tmp, "1000")
    proc = launch_detached(tmp, "run.py", LORA_OTEL_STALL_AFTER="import=4")
    try:
        wait_for(
            lambda: messages(tmp / "log.txt", "STALLED") if (tmp / "log.txt").exists() else None,
            timeout=60,
            what="the STALLED line in log.txt",
        )
        time.sleep(0.5)
        yield tmp, proc
    finally:
        stop(proc)


class TestStuckImport:
    WHERE = "main thread at run.py:2 in <module> → toolkit/job.py:2 in <module> → time.sleep"

    def test_the_panel_says_where_it_is_stuck_at_a_falling_cadence(self, stuck_import) -> None:
        """log.txt has `still in import toolkit.job after …` lines naming where the main thread is
        (the C function included), at 1 s and 3 s (the scaled 10 s, 30 s) and no more often."""
        tmp, _ = stuck_import
        still = messages(tmp / "log.txt", "still in import toolkit.job after ")
        assert len(still) == 2, still
        assert all(line.endswith(" — " + self.WHERE) for line in still), still
        seconds = [float(re.search(r"after ([\d.]+) s", line).group(1)) for line in still]
        assert 1.0 <= seconds[0] < 2.5 and 3.0 <= seconds[1] < 4.0, seconds

    def test_one_stalled_line_at_the_limit(self, stuck_import) -> None:
        """At the limit the job itself writes one `STALLED: import toolkit.job open for N s (limit 4 s)
        — main thread at …` line; no second one while it stays stuck."""
        tmp, _ = stuck_import
        time.sleep(1.0)
        stalled = messages(tmp / "log.txt", "STALLED")
        assert len(stalled) == 1, stalled
        assert re.fullmatch(
            r"STALLED: import toolkit\.job open for 4(\.\d+)? s \(limit 4 s\) — " + re.escape(self.WHERE), stalled[0]
        ), stalled

    def test_beats_carry_main(self, stuck_import) -> None:
        """Beat records journal the main thread's innermost frames, outermost first, the C call
        last. A beat that changes nothing (the same frames, no step) is no record: it touches the
        journal, whose modification time runs ahead of the last beat record."""
        tmp, _ = stuck_import
        journal = read_journal(next((tmp / "lora-otel").glob("*.otel.jsonl")))
        assert journal.main_frames == [
            ["run.py", 2, "<module>"],
            ["toolkit/job.py", 2, "<module>"],
            ["", 0, "time.sleep"],
        ]
        beats = [json.loads(line) for line in Path(journal.path).read_text().splitlines() if '"k":"beat"' in line]
        assert beats and all(beat["main"][:2] == journal.main_frames[:2] for beat in beats[1:])
        # ~25 beats of 0.2 s so far, stuck in one place: the first one or two are records (the C
        # call is named from the second), the rest only touches
        assert len(beats) <= 4, beats
        wait_for(lambda: os.stat(journal.path).st_mtime_ns > beats[-1]["ts"] + 400_000_000, what="a touch")

    def test_inspect_says_main_thread_at(self, stuck_import) -> None:
        """`lora-otel inspect JOURNAL` and `--json` say where the main thread is, the same words."""
        tmp, _ = stuck_import
        path = str(next((tmp / "lora-otel").glob("*.otel.jsonl")))
        text = lora_otel_cli("inspect", path).stdout.splitlines()
        assert text[0].startswith("stuck in import toolkit.job for ")
        assert text[1].startswith("STALLED: import toolkit.job open for "), text[:3]  # the stall leads
        # (an old sample says its age: a loaded machine's beat can be late)
        assert re.fullmatch(re.escape(self.WHERE) + r"( \(sampled [\d.]+ m?s ago\))?", text[2]), text[:3]
        doc = json.loads(lora_otel_cli("inspect", path, "--json").stdout)
        assert doc["main_thread"]["where"] == self.WHERE[len("main thread at ") :]
        assert doc["main_thread"]["frames"][-1] == ["", 0, "time.sleep"]

    def test_watch_says_main_thread_at(self, stuck_import) -> None:
        """`lora-otel watch --once DIR` shows the same line for the running process."""
        tmp, _ = stuck_import
        r = lora_otel_cli("watch", "--once", str(tmp / "lora-otel"))
        assert any(
            re.fullmatch(re.escape(self.WHERE) + r"( \(sampled [\d.]+ m?s ago\))?", line)
            for line in r.stdout.splitlines()
        ), r.stdout


@pytest.mark.torch
def test_a_slow_stage_that_finishes(tmp_path: Path) -> None:
    """An import that takes 2.5 s (limit 120 s): one `still in` line, one `took` line, no STALLED;
    the program's own output and exit status are untouched."""
    toolkit(tmp_path, "2.5")
    proc = launch_detached(tmp_path, "run.py")
    assert proc.wait(timeout=60) == 0
    log = tmp_path / "log.txt"
    assert "RUN finished" in log.read_text()
    assert len(messages(log, "still in import toolkit.job after ")) == 1, lora_lines(log)
    took = messages(log, "import toolkit.job took ")
    assert len(took) == 1 and re.fullmatch(r"import toolkit\.job took 2\.\d s", took[0]), took
    assert not messages(log, "STALLED"), lora_lines(log)


@pytest.mark.torch
def test_a_took_line_gives_the_stages_own_time(tmp_path: Path) -> None:
    """The "took" line is written at the beat after the stage ended; when another stage ended in
    between, it gave the time up to that beat (a newcomer's "import transformers took 26 s" for a
    22.4 s span). It gives the span's own duration, as the journal has it."""
    toolkit(tmp_path, "2.5")
    (tmp_path / "run.py").write_text(
        "import argparse\nimport toolkit.job\nimport lora_otel, time\n"
        "with lora_otel.stage('load config'):\n    pass\n"
        "time.sleep(2.5)  # beats come and write the line\nprint('RUN finished', flush=True)\n"
    )
    proc = launch_detached(tmp_path, "run.py", LORA_OTEL_BEAT_S="1", LORA_OTEL_DIR="j", LORA_OTEL_KEEP_SHORT="1")
    assert proc.wait(timeout=60) == 0
    log = tmp_path / "log.txt"
    lines = messages(log, "import toolkit.job took ")
    assert len(lines) == 1, lora_lines(log)
    took = lines[0]
    [path] = sorted((tmp_path / "j").glob("*.otel.jsonl"))
    span = next(s for s in read_journal(path).spans if s.name == "import toolkit.job")
    assert span.end_ns is not None
    seconds = (span.end_ns - span.start_ns) / 1e9
    assert took == "import toolkit.job took %.1f s" % seconds, (took, seconds)


JOB_PY = """\
import argparse
import socket
import urllib.request
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)  # accepts, never answers: a download frozen at 0 B/s
args = argparse.ArgumentParser().parse_args()
import torch
print("JOB downloading", flush=True)
urllib.request.urlopen("http://127.0.0.1:%d/model.safetensors" % server.getsockname()[1]).read()
"""


@pytest.mark.torch
def test_a_download_frozen_between_stages_under_lora_otel_run(tmp_path: Path) -> None:
    """`lora-otel run --stall-after between=4` of a job whose download freezes after `import torch`,
    no stage open, into log.txt: `no stage open for N s since import torch ended — main thread at …
    socket.py:… in readinto → self._sock.recv_into`, then one STALLED line at 4 s."""
    (tmp_path / "job.py").write_text(JOB_PY)
    log = tmp_path / "log.txt"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "lora_otel", "run", "--stall-after", "between=4", "--", PYTHON, "job.py"],
            cwd=tmp_path,
            env=clean_env(**FAST),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        stalled = wait_for(lambda: messages(log, "STALLED"), timeout=90, what="the STALLED line")
        quiet = messages(log, "no stage open for ")
        assert quiet and all(" since import torch ended — main thread at " in line for line in quiet), quiet
        assert re.search(r"socket\.py:\d+ in readinto → self\._sock\.recv_into$", quiet[0]), quiet[0]
        assert len(stalled) == 1 and re.match(
            r"STALLED: no stage open for 4(\.\d+)? s since import torch ended \(limit 4 s\) — main thread at ",
            stalled[0],
        ), stalled
        journal = read_journal(next((tmp_path / "lora-otel").glob("*.otel.jsonl")))
        assert journal.config["stall_after"] == "between=4"
        text = lora_otel_cli("inspect", journal.path).stdout
        assert "main thread at " in text and "in readinto → self._sock.recv_into" in text, text
    finally:
        stop(proc)


PARENT_PY = """\
import subprocess, sys, time
import torch
subprocess.run([sys.executable, "run.py"], check=True)
"""


@pytest.mark.torch
def test_a_quiet_child_still_narrates(tmp_path: Path) -> None:
    """A traced parent (with torch imported) runs run.py as a child: the child's info lines stay off
    the terminal (issue 12), but its slow import is reported there. (The parent waiting for it is
    narrated like any job — its ``arguments`` is still open here, so no quiet time is said:
    tests/test_pools.py has a parent whose child hangs.)"""
    toolkit(tmp_path, "3.5")
    (tmp_path / "parent.py").write_text(PARENT_PY)
    proc = launch_detached(tmp_path, "parent.py")
    assert proc.wait(timeout=90) == 0
    log = tmp_path / "log.txt"
    lines = lora_lines(log)
    parent_pid = lines[0][0]
    child = [(pid, msg) for pid, msg in lines if pid != parent_pid]
    assert child and not any(msg.startswith("started pid") for _, msg in child), child  # quiet
    assert any(msg.startswith("still in import toolkit.job after ") for _, msg in child), lines
    assert any(msg.startswith("import toolkit.job took 3.") for _, msg in child), lines
    assert not any("no stage open" in msg for _, msg in lines), lines


def test_limits_and_stderr_recorded_at_start_and_a_bad_value_said_once(tmp_path: Path) -> None:
    """The root start record carries the limits as given and stderr's identity and path (a regular
    file here); `LORA_OTEL_STALL_AFTER=abc` gives one line at start naming the variable and the
    default used, and the job runs to its end."""
    toolkit(tmp_path, "0")
    proc = launch_detached(tmp_path, "run.py", LORA_OTEL_STALL_AFTER="abc", LORA_OTEL_FROZEN_AFTER="30")
    assert proc.wait(timeout=60) == 0
    log = tmp_path / "log.txt"
    bad = [msg for _, msg in lora_lines(log) if "LORA_OTEL_STALL_AFTER" in msg]
    assert (
        len(bad) == 1
        and bad[0].startswith("LORA_OTEL_STALL_AFTER='abc': ")
        and "using the default limits (arguments 60 s, import 120 s" in bad[0]
        and "between 120 s" in bad[0]
    ), bad
    path = next((tmp_path / "lora-otel").glob("*.otel.jsonl"))
    root = json.loads(path.read_text().splitlines()[0])
    assert root["config"]["stall_after"] == "abc" and root["config"]["frozen_after"] == "30"
    st = os.stat(log)
    assert root["stderr"] == [st.st_dev, st.st_ino]
    assert root["stderr_path"] == os.path.realpath(log)
