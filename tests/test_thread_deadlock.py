"""Threads that wait for each other, in real jobs that really hang: a module that starts a thread
at import and joins it while that thread imports the module (CPython gh-125037). The job's own
lines say the deadlock with each thread's line and what breaks it; the stall record's evidence,
explained again, gives the same. ``LORA_OTEL_RECORD_EVIDENCE=<dir>`` writes the evidence (paths and
pids made generic) for tests/data/evidence (test_thread_deadlock_evidence.py reads it there)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from procs import PYTHON, clean_env, journals, wait_for

from lora_otel.analysis.diagnose import explain
from lora_otel.analysis.evidence import PREFIX
from lora_otel.analysis.stall import Stall
from lora_otel.journal.reader import read_journal
from lora_otel.journal.records import Span

pytestmark = pytest.mark.slow

FOOMODULE = """\
import threading
msg = "hello from foo"
from barmodule import baz
t = threading.Thread(target=baz)
t.start()
t.join()
"""

BARMODULE = """\
def baz():
    import foomodule
    print("baz", foomodule.msg)
"""

JOB = """\
print("loading plugins", flush=True)
import foomodule
print("never here")
"""


def launch(tmp_path: Path, **env: str) -> subprocess.Popen:
    (tmp_path / "foomodule.py").write_text(FOOMODULE, encoding="utf-8")
    (tmp_path / "barmodule.py").write_text(BARMODULE, encoding="utf-8")
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    with open(tmp_path / "log.txt", "wb") as out:
        return subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_STALL_AFTER="import=2", **env),
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)


def job_lines(tmp_path: Path) -> tuple[str, str]:
    """The job's own why and what-to-do lines (waited for)."""

    def lines() -> Optional[tuple[str, str]]:
        text = (tmp_path / "log.txt").read_text(encoding="utf-8", errors="replace").splitlines()
        why = [line for line in text if "] why import foomodule is stalled: " in line]
        todo = [line for line in text if "] what to do: " in line]
        return (why[0], todo[0]) if why and todo else None

    return wait_for(lines, timeout=90, what="the job's why and what-to-do lines")


def stall_record_journal(tmp_path: Path, pid: int) -> str:
    return wait_for(
        lambda: next((j for j in map(read_journal, journals(tmp_path / "j")) if j.pid == pid), None),
        timeout=60,
        what="the job's journal",
    ).path


def stall_record(tmp_path: Path, pid: int) -> dict:
    journal = read_journal(stall_record_journal(tmp_path, pid))
    return wait_for(lambda: read_journal(journal.path).stalls, timeout=90, what="the watchdog's stall record")[-1]


WHY = (
    "Deadlock between threads: the main thread, importing foomodule, waits at foomodule.py:6 in <module> for "
    "thread baz() to end (Thread.join); thread baz() waits at barmodule.py:2 in baz for the import of foomodule, "
    "which the main thread is running"
)
TODO = (
    "what to do: Do not start threads or pools and wait for them while a module is being imported: move the work at "
    "foomodule.py:6 (the top level of foomodule, run by its import) into a function the program calls after the import"
)


@pytest.mark.parametrize("py_spy", ["", "0"], ids=["py-spy", "beat only"])
def test_a_thread_joined_at_import_that_imports_the_module_is_a_deadlock(tmp_path: Path, py_spy: str) -> None:
    job = launch(tmp_path, **({"LORA_OTEL_PY_SPY": py_spy} if py_spy else {}))
    try:
        why, todo = job_lines(tmp_path)
        assert WHY in why, why
        assert TODO in todo, todo
        record = stall_record(tmp_path, job.pid)
        assert WHY in record["diagnosis"] and TODO[len("what to do: ") :] in record["advice"], record
        if py_spy:
            return
        # the record keeps no stacks (the stacks file has them): the beat's dump, with the record's facts
        journal = read_journal(str(stall_record_journal(tmp_path, job.pid)))
        stacks = Path(str(journal.root.attrs["lora_otel.stacks.path"])).read_text(encoding="utf-8")
        last = stacks[stacks.rindex("Current thread ") :] if "Current thread " in stacks else stacks
        record["evidence"]["python.stacks"] = last
        span = Span(record["stage"], record["span_id"], None, "0" * 32, record["ts"])
        stall = Stall(record["kind"], span, float(record["open_s"]), float(record["limit_s"]), "")
        evidence = {PREFIX + key: value for key, value in record["evidence"].items()}
        found = explain(stall, evidence, now_ns=record["ts"])
        assert found.attrs["lora_otel.diagnosis.rule"] == "thread deadlock", found.sentence
        assert WHY in found.sentence and TODO[len("what to do: ") :] in found.advice
        record["diagnosis"] = found.sentence
        record_case("thread_deadlock_join_at_import", record, tmp_path, {job.pid: 4711})
    finally:
        stop(job)


def record_case(name: str, record: dict, tmp_path: Path, pids: dict[int, int]) -> None:
    """With ``LORA_OTEL_RECORD_EVIDENCE=<dir>``: the case's evidence, generic, as ``<dir>/<name>.json``."""
    out = os.environ.get("LORA_OTEL_RECORD_EVIDENCE")
    if not out:
        return
    text = json.dumps(record, sort_keys=True)
    text = text.replace(str(tmp_path), "/work/job").replace(PYTHON, "python")
    for real, generic in pids.items():
        text = re.sub(r"(?<!\d)%d(?!\d)" % real, str(generic), text)
    generic = json.loads(text)
    case = {
        "case": name,
        "source": "tests/test_thread_deadlock.py (real run, paths and pids made generic)",
        "stall": {
            "kind": generic["kind"],
            "stage": generic["stage"],
            "open_for_s": generic["open_s"],
            "limit_s": generic["limit_s"],
        },
        "now_ns": generic["ts"],
        "evidence": {PREFIX + key: value for key, value in generic["evidence"].items()},
        "diagnosis": generic["diagnosis"],
        "expect": {
            "rule": "thread deadlock",
            "sentence": ["waits at foomodule.py:6 in <module> for thread baz() to end", "for the import of foomodule"],
            "advice": ["move the work at foomodule.py:6 (the top level of foomodule"],
        },
    }
    Path(out, name + ".json").write_text(json.dumps(case, indent=1, sort_keys=True) + "\n", encoding="utf-8")


IMPORT_ME = """\
import datasets
ds = datasets.Dataset.from_dict({"text": ["row %d" % i for i in range(200)]})
the_dataset = ds.map(lambda item: item, num_proc=2)
"""


def test_a_datasets_map_with_workers_at_import_is_a_deadlock(tmp_path: Path) -> None:
    """datasets#7756: ``map(num_proc=2)`` in a module's top level. The pool's task handler thread
    pickles the mapped function (dill) and imports its module, whose import the main thread holds
    while it waits for the pool's results."""
    pytest.importorskip("datasets")
    (tmp_path / "import_me.py").write_text(IMPORT_ME, encoding="utf-8")
    (tmp_path / "job.py").write_text("import import_me\nprint(len(import_me.the_dataset))\n", encoding="utf-8")
    with open(tmp_path / "log.txt", "wb") as out:
        job = subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(
                LORA_OTEL="1",
                LORA_OTEL_DIR=str(tmp_path / "j"),
                LORA_OTEL_STALL_AFTER="import=4,prepare dataset=4",
                HF_DATASETS_CACHE=str(tmp_path / "cache"),
                HF_DATASETS_OFFLINE="1",
            ),
            start_new_session=True,
        )
    try:

        def lines() -> Optional[tuple[str, str]]:
            text = (tmp_path / "log.txt").read_text(encoding="utf-8", errors="replace").splitlines()
            why = [line for line in text if " is stalled: " in line]
            todo = [line for line in text if "] what to do: " in line]
            return (why[0], todo[0]) if why and todo else None

        why, todo = wait_for(lines, timeout=150, what="the job's why and what-to-do lines")
        assert (
            "Deadlock between threads: the main thread, importing import_me, waits at import_me.py:3 in <module> "
            "for its pool's results, which depend on the pool's task handler thread" in why
        ), why
        assert "for the import of import_me, which the main thread is running" in why, why
        assert "move the work at import_me.py:3 (the top level of import_me, run by its import)" in todo, todo
    finally:
        stop(job)
