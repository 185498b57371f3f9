"""bench/real_causes.py, the harness itself: its cases run for real and its rows say what the
views say. Two quick cases whose diagnosis every reading view already gets right (a frozen native
call, a two-lock deadlock) must come out as place yes, cause yes; the regex and summary helpers
are checked on fixed text."""

from __future__ import annotations

import importlib.util
import json
import re
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


def _tracker_module(bench):
    """bench/tracker_causes.py, loaded beside the harness (it imports ``real_causes``)."""
    spec = importlib.util.spec_from_file_location("tracker_causes", BENCH.parent / "tracker_causes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_advice_is_read_from_what_to_do_lines_only() -> None:
    """A view gives the advice when the case's regex is in its ``what to do:`` text: the rest of
    each such line, or the next line when the label stands alone (as a page may set it); the
    report's inline tags are joined so that its sentence stays one line."""
    bench = _bench_module()
    text = "\n".join(
        [
            "STALLED: … waits on build/x/lock, which no process holds",
            "[lora-otel][7][2026-01-01T00:00:00.000Z] what to do: remove build/x/lock (no process holds it)",
            "what to do:",
            "set WANDB_MODE=offline",
        ]
    )
    said = bench._advice_text(text)
    assert said.splitlines() == ["remove build/x/lock (no process holds it)", "set WANDB_MODE=offline"]
    assert bench._advice_text("STALLED: remove build/x/lock") == "", "only a what-to-do line counts"
    page = (
        "<html><body><p>what to do: remove <code>build/x/lock</code> — it is stale</p><h2>Timeline</h2></body></html>"
    )
    assert "what to do: remove build/x/lock — it is stale" in bench._report_inline(page)


def test_table_has_an_advice_column_and_its_total() -> None:
    """place/cause/advice per case and view; a case with no advice regex gets — and is left out of
    the advice total."""
    bench = _bench_module()
    rows = [
        {"view": v, "place": True, "cause": v != "report", "advice": v == "stderr", "seconds": None}
        for v in bench.VIEWS
    ]
    old = [{"view": v, "place": True, "cause": True, "advice": None, "seconds": None} for v in bench.VIEWS]
    text = bench.table(
        [
            {"case": "new", "rows": rows, "limit_s": None, "seconds": None},
            {"case": "old", "rows": old, "limit_s": None, "seconds": None},
        ]
    )
    assert "| case | view | place | cause | advice |" in text
    assert "| new | stderr | yes | yes | yes |" in text and "| new | report | yes | no | no |" in text
    assert "| old | stderr | yes | yes | — |" in text
    assert "a right next step in 1 of 5 (20 %)" in text, text
    assert "stderr   place 2/2, cause 2/2, advice 1/1" in text, text


def test_tracker_set_is_new_real_cases_with_their_sources() -> None:
    """At least 15 cases, each naming the issue it comes from, each with place, cause and advice
    regexes whose marks resolve; none shares a name or program with the first set."""
    bench = _bench_module()
    trackers = _tracker_module(bench)
    assert len(trackers.CASES) >= 15
    old = {c.name for c in bench.CASES}
    old_programs = {src for c in bench.CASES for src in c.files.values()}
    ctx = dict.fromkeys(("port", "ui_pid", "child_pid", "killed_pid", "helper_pid", "service_pid"), "1")
    ctx.update(encoder_pid="2", dead_pid="3")
    for case in trackers.CASES:
        assert case.name not in old, case.name
        assert not set(case.files.values()) & old_programs, case.name
        assert case.source.startswith("https://github.com/"), case.name
        assert case.advice, case.name
        for pattern in (case.place, case.cause, case.advice):
            re.compile(bench._resolve(pattern, case, ctx))
    assert len({c.name for c in trackers.CASES}) == len(trackers.CASES)


def test_near_finds_parts_in_any_order_close_together() -> None:
    """The cause regexes' parts: in any order, on one line, close together."""
    bench = _bench_module()
    near = _tracker_module(bench).near
    pattern = near(r"pipe", r"\b42\b", within=20)
    assert re.search(pattern, "stdin is a pipe held by pid 42", re.S)
    assert re.search(pattern, "pid 42 holds the PIPE", re.S)
    assert not re.search(pattern, "a pipe" + " " * 40 + "pid 42", re.S)
    assert not re.search(pattern, "a pipe, pid 421", re.S)
    assert not re.search(pattern, "a pipe\npid 42", re.S), "one sentence must say them together"


@pytest.mark.slow
@pytest.mark.torch
def test_tracker_case_runs_for_real_with_an_advice_row(tmp_path: Path) -> None:
    """About 20 s. One case of the trackers set (a caption loader that opens a FIFO nothing
    writes) run for real through ``--set trackers``: it hangs, every view names the place, and
    every row has an advice verdict (the case has a regex) in the table's advice column."""
    pytest.importorskip("torch")
    out = tmp_path / "results.json"
    args = [PYTHON, str(BENCH), "--set", "trackers", "--case", "FIFO in the data folder", "--json", str(out)]
    r = subprocess.run(
        [*args, "--wait", "40"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (res,) = json.loads(out.read_text(encoding="utf-8"))
    assert res["hung"] and res["source"].startswith("https://github.com/")
    for row in res["rows"]:
        assert row["place"], (row["view"], row["text"])
        assert row["advice"] in (True, False), row["view"]
    assert "| FIFO in the data folder | stderr | yes |" in r.stdout, r.stdout
    assert "a right next step in" in r.stdout, r.stdout
    assert not list(tmp_path.glob("lora-otel*")), "the case runs in a directory of its own"
