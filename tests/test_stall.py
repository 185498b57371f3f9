"""Stall detection on real processes: a stage past its limit (alive) and a stopped beat (frozen)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journal_has_open, journals, wait_for
from test_hangs import kill_and_reap, make_module, start_traced

from lora_otel.analysis.stall import StallConfigError, detect, parse_limits
from lora_otel.journal.reader import read_journal


def journal_of(tmp_path: Path):
    found = wait_for(lambda: journals(tmp_path / "lora-otel"), what="a journal")
    [path] = found
    return read_journal(path)


class TestLimits:
    def test_defaults(self) -> None:
        """Defaults from the issue: arguments 60 s, import 120 s, cuda init 120 s, training floor 120 s."""
        limits = parse_limits(None)
        assert (limits["arguments"], limits["import"], limits["cuda init"], limits["training"]) == (60, 120, 120, 120)

    def test_one_number_for_all_and_per_stage(self) -> None:
        """`300` sets every stage; `import=5,my stage=9` sets those and keeps the other defaults."""
        assert set(parse_limits("300").values()) == {300.0}
        limits = parse_limits("import=5, my stage=9")
        assert limits["import"] == 5 and limits["my stage"] == 9 and limits["arguments"] == 60

    @pytest.mark.parametrize("bad", ["import", "import=soon", "import=-1", "=5", "0", "nan"])
    def test_bad_values_are_one_line_errors(self, bad: str) -> None:
        """A malformed limit is a StallConfigError whose message is one line naming the problem."""
        with pytest.raises(StallConfigError) as e:
            parse_limits(bad)
        assert "\n" not in str(e.value)


@pytest.mark.slow
class TestDetection:
    def test_sleeping_import_is_an_alive_stall(self, tmp_path: Path) -> None:
        """An import sleeping past a 1 s limit: kind `alive`, on that import span; not before the limit."""
        make_module(tmp_path, "slowmod", "import time\ntime.sleep(600)\n")
        proc = start_traced(tmp_path, "import slowmod\n")
        try:
            wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import slowmod"), what="import span")
            limits = parse_limits("import=1.5")
            j = journal_of(tmp_path)
            assert detect(j, time.time_ns(), alive=True, limits=limits) is None
            time.sleep(1.7)
            stall = detect(journal_of(tmp_path), time.time_ns(), alive=True, limits=limits)
            assert stall is not None and stall.kind == "alive"
            assert stall.span.name == "import slowmod" and stall.open_for_s >= 1.5
            assert stall.status_message.startswith("stalled: import slowmod open for ")
        finally:
            kill_and_reap(proc)
        # gone: no stall is reported for a process that no longer exists (death is handled apart)
        assert detect(journal_of(tmp_path), time.time_ns(), alive=False) is None

    def test_gil_held_import_is_frozen(self, tmp_path: Path) -> None:
        """GIL held in C: the beat stops, and the process is frozen after the (shortened) 2 s."""
        make_module(tmp_path, "frozenmod", "import ctypes\nctypes.PyDLL(None).pause()\n")
        proc = start_traced(tmp_path, "import frozenmod\n")
        try:
            wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import frozenmod"), what="import span")
            stall = wait_for(
                lambda: detect(journal_of(tmp_path), time.time_ns(), alive=True, frozen_after_s=2),
                what="frozen",
                timeout=15,
            )
            assert stall.kind == "frozen" and stall.span.name == "import frozenmod"
        finally:
            kill_and_reap(proc)

    def test_sigstopped_process_is_frozen(self, tmp_path: Path) -> None:
        """SIGSTOP in the middle of a stage: frozen; after SIGCONT the beat resumes and it is not."""
        proc = start_traced(
            tmp_path, "import lora_otel, time\nwith lora_otel.stage('load model'):\n    time.sleep(600)\n"
        )
        try:
            wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "load model"), what="stage")
            os.kill(proc.pid, signal.SIGSTOP)
            stall = wait_for(
                lambda: detect(journal_of(tmp_path), time.time_ns(), alive=True, frozen_after_s=2),
                what="frozen",
                timeout=15,
            )
            assert stall.kind == "frozen" and stall.span.name == "load model"
            os.kill(proc.pid, signal.SIGCONT)
            wait_for(
                lambda: detect(journal_of(tmp_path), time.time_ns(), alive=True, frozen_after_s=2) is None,
                what="thawed",
                timeout=10,
            )
        finally:
            kill_and_reap(proc)

    def test_training_that_stops_stepping(self, tmp_path: Path) -> None:
        """Steps every 50 ms, then none: stalled once the gap passes the given training limit."""
        proc = start_traced(
            tmp_path,
            "import lora_otel, time\n"
            "for i in range(60):\n    lora_otel.progress(step=i + 1)\n    time.sleep(0.05)\n"
            "time.sleep(600)\n",
        )
        try:
            wait_for(lambda: journal_of(tmp_path).steps >= 60, what="60 steps", timeout=30)
            limits = parse_limits("training=1")
            assert detect(journal_of(tmp_path), time.time_ns(), alive=True, limits=parse_limits("training=60")) is None
            stall = wait_for(
                lambda: detect(journal_of(tmp_path), time.time_ns(), alive=True, limits=limits),
                what="training stall",
                timeout=15,
            )
            assert stall.kind == "alive" and stall.span.name == "training"
            assert stall.limit_s == 1 and "no optimizer step for" in stall.reason
        finally:
            kill_and_reap(proc)


def test_a_stage_inside_training_keeps_the_step_gap_rule(journal) -> None:
    """An `epoch 0` span (no limit of its own) open inside `training` with no step for 300 s: the
    training span is stalled; a stage with its own limit inside training keeps that limit."""
    journal.process(alive=True)
    train = journal.start("training", 1)
    journal.start("epoch 0", 1, parent=train)
    journal.beat(2, steps=1, last_step_t=2)
    journal.beat(300, steps=1, last_step_t=2)
    j = journal.read()
    stall = detect(j, journal.ns(300), alive=True)
    assert stall is not None and stall.span.name == "training" and "no optimizer step for 298 s" in stall.reason
    assert detect(j, journal.ns(60), alive=True, frozen_after_s=1000) is None
    limits = parse_limits("epoch 0=30")
    own = detect(j, journal.ns(300), alive=True, limits=limits)
    assert own.span.name == "epoch 0" and own.limit_s == 30


class TestTrainingLimit:
    """An explicit ``training=N`` is the limit; the step-based one (20 x the median step, when longer
    than the 120 s floor) is used only when none is given, and the line says so (issue 22 item 4)."""

    def test_given_limit_wins_over_the_step_rule(self, journal) -> None:
        """Steps every 10 s (step rule: 200 s), then none for 30 s: with ``training=25`` the limit is
        25 s and the reason names no step rule; with no training limit given it is 200 s, and says why."""
        journal.process(alive=True)
        journal.start("training", 1)
        for i in range(6):
            journal.beat(1 + 10 * i, steps=i + 1, last_step_t=1 + 10 * i)
        journal.beat(81, steps=6, last_step_t=51)
        j = journal.read()
        given = detect(j, journal.ns(81), alive=True, limits=parse_limits("training=25"))
        assert given is not None and given.limit_s == 25 and given.limit_why == "", given
        assert given.reason == "no optimizer step for 30 s (limit 25 s)", given.reason
        assert detect(j, journal.ns(81), alive=True, limits=parse_limits("between=5")) is None
        journal.beat(51 + 201, steps=6, last_step_t=51)
        j = journal.read()
        late = journal.ns(51 + 201)
        by_steps = detect(j, late, alive=True, limits=parse_limits("between=5"))
        assert by_steps is not None and by_steps.limit_s == 200, by_steps
        assert by_steps.limit_why == "20x the median step of 10 s", by_steps
        every = detect(j, late, alive=True, limits=parse_limits("150"))  # one number for all: given too
        assert every is not None and every.limit_s == 150 and every.limit_why == "", every

    @pytest.mark.slow
    def test_the_jobs_own_line_uses_the_given_limit(self, tmp_path: Path) -> None:
        """A real job stepping every 0.3 s (step rule 6 s), then stuck, with ``training=2``: its own
        STALLED line says ``(limit 2 s)`` — before, ``(limit 6 s)``, whatever was given."""
        (tmp_path / "job.py").write_text(
            "import lora_otel, time\n"
            "for i in range(12):\n    lora_otel.progress(step=i + 1)\n    time.sleep(0.3)\n"
            "time.sleep(600)\n",
            encoding="utf-8",
        )
        log = tmp_path / "err.txt"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [PYTHON, "job.py"],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="training=2", LORA_OTEL_BEAT_S="0.2"),
            )
        try:
            line = wait_for(
                lambda: next((x for x in log.read_text().splitlines() if "STALLED: training" in x), None),
                timeout=60,
                what="the job's STALLED line",
            )
            assert re.search(r"STALLED: training: no optimizer step for \d(\.\d+)? s \(limit 2 s\)", line), line
        finally:
            proc.kill()
            proc.wait(timeout=30)
