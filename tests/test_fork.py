"""A forked child writes its own journal, in the same trace, and never repeats its parent's records."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lora_otel.export.reader import read_journal
from procs import PYTHON, clean_env, journals

PROGRAM = """
import os, lora_otel
with lora_otel.stage("spawn workers"):
    pids = []
    for i in range(3):
        pid = os.fork()
        if pid == 0:
            with lora_otel.stage("worker %d" % i):
                pass
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
print("PARENT done", flush=True)
"""


def test_forked_children_get_their_own_journals(tmp_path: Path) -> None:
    """Three forks: four journals; each child's root hangs under the parent's open stage."""
    (tmp_path / "job.py").write_text(PROGRAM)
    log = tmp_path / "run.log"
    r = subprocess.run([PYTHON, "job.py", "--log", str(log)], cwd=tmp_path, env=clean_env(LORA_OTEL="1"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    found = journals(tmp_path)
    assert len(found) == 4, found
    parent = read_journal(Path(str(log) + ".otel.jsonl"))
    spawn = [s for s in parent.spans if s.name == "spawn workers"][0]
    all_ids: list = []
    children = 0
    for p in found:
        j = read_journal(p)
        assert j.problems == []
        assert j.root.trace_id == parent.root.trace_id
        all_ids += [s.span_id for s in j.spans]
        if j.pid != parent.pid:
            children += 1
            assert j.root.parent_id == spawn.span_id
            names = [s.name for s in j.spans]
            assert names[0] == "process" and len(names) == 2 and names[1].startswith("worker ")
            assert "spawn workers" not in names
    assert children == 3
    assert len(all_ids) == len(set(all_ids)), "a span id appears in two journals"


def test_multiprocessing_fork_worker_records_its_exit(tmp_path: Path) -> None:
    """multiprocessing's fork workers end with os._exit(exitcode): their journals still get an exit
    record with that code (0, and 1 for a target that raised), so they do not read as killed."""
    (tmp_path / "job.py").write_text(
        "import multiprocessing as mp\n"
        "def ok():\n    pass\n"
        "def bad():\n    raise ValueError('boom')\n"
        "if __name__ == '__main__':\n"
        "    for target in (ok, bad):\n"
        "        p = mp.get_context('fork').Process(target=target)\n"
        "        p.start(); p.join()\n")
    r = subprocess.run([PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    children = [read_journal(p) for p in journals(tmp_path / "lora-otel") if p.name.count(".") > 2]
    assert sorted(j.exit["code"] for j in children) == [0, 1]
    assert all(j.root.end_ns is not None for j in children)
