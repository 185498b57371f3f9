"""A forked child writes its own journal, in the same trace, and never repeats its parent's records."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

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
    r = subprocess.run(
        [PYTHON, "job.py", "--log", str(log)],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    found = journals(tmp_path)
    assert len(found) == 4, found
    parent = read_journal(Path(str(log) + ".otel.jsonl"))
    spawn = next(s for s in parent.spans if s.name == "spawn workers")
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
    """multiprocessing's fork workers end with os._exit(exitcode): one that wrote nothing and exits
    at once leaves no journal at all, whatever its code (0, or 1 when its target raised: its
    traceback is on stderr, and nothing of its own is worth a file: issue 36 item 9); the parent's
    journal has each worker's end (a ``child exit`` event with its code), so none reads as killed."""
    (tmp_path / "job.py").write_text(
        "import multiprocessing as mp\n"
        "def ok():\n    pass\n"
        "def bad():\n    raise ValueError('boom')\n"
        "if __name__ == '__main__':\n"
        "    for target in (ok, bad):\n"
        "        p = mp.get_context('fork').Process(target=target)\n"
        "        p.start(); p.join()\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_KEEP_SHORT="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "ValueError: boom" in r.stderr
    [parent] = [read_journal(p) for p in journals(tmp_path / "lora-otel")]
    ends = [e[2] for s in parent.spans for e in s.events if e[1] == "child exit"]
    assert sorted(a["child.exit_code"] for a in ends) == [0, 1], ends


SPAWNING = """
import multiprocessing as mp, os, subprocess, sys, time, lora_otel

def work():
    pass

if __name__ == "__main__":
    subprocess.run([sys.executable, "top.py"], check=True)
    with lora_otel.stage("convert"):
        subprocess.run([sys.executable, "inherited.py"], check=True)
        env = os.environ.copy()
        env["EXTRA"] = "1"
        subprocess.run([sys.executable, "copied env.py"], env=env, check=True)
        subprocess.run([sys.executable, "own traceparent.py"], check=True,
                       env=dict(env, TRACEPARENT="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
        os.popen(sys.executable + " popen.py").read()
    with lora_otel.stage("workers"):
        p = mp.get_context("spawn").Process(target=work)
        p.start()
        p.join()
    assert "convert" not in os.environ["TRACEPARENT"]  # the job's own environment is left as it was
    print("PARENT done", os.environ["TRACEPARENT"], flush=True)
"""


def children_scripts(tmp_path: Path, *names: str) -> None:
    """One script per child, named for its role: a short child is no job, so its journal names it
    by its root's ``service.name`` (the script's name), not by the argv a job's journal has."""
    for name in names:
        (tmp_path / (name + ".py")).write_text("import sys\n")


def role(j) -> str:
    """A child's role: its script's name, else what multiprocessing started it as."""
    name = j.root.attrs["service.name"]
    if name != "python":
        return name
    if any("resource_tracker" in s.name for s in j.spans):
        return "resource tracker"
    parsers = [s.attrs.get("lora_otel.arguments.parser") for s in j.spans if s.name == "arguments"]
    return "spawn worker" if parsers == ["multiprocessing worker"] else "python"


@pytest.mark.torch
def test_spawned_children_hang_under_the_span_that_started_them(tmp_path: Path) -> None:
    """subprocess (with the inherited environment, a copy of it, os.popen) and a multiprocessing
    spawn worker started inside a stage hang under that stage; one started outside any stage under
    the root; an env with its own TRACEPARENT keeps it; the job's os.environ is unchanged."""
    (tmp_path / "job.py").write_text(SPAWNING)
    children_scripts(tmp_path, "top", "inherited", "copied env", "own traceparent", "popen")
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "PARENT done" in r.stdout, r.stderr
    js = [read_journal(p) for p in journals(tmp_path / "lora-otel")]
    [parent] = [j for j in js if j.root.parent_id is None]
    stage = {s.name: s.span_id for s in parent.spans}
    assert r.stdout.split("PARENT done ")[1].split("-")[2] == parent.root.span_id
    under = {}
    for j in js:
        if j is not parent:
            under[role(j)] = j.root.parent_id
    assert under == {
        "top": parent.root.span_id,
        "inherited": stage["convert"],
        "copied env": stage["convert"],
        "own traceparent": "b7ad6b7169203331",
        "popen": stage["convert"],
        "spawn worker": stage["workers"],
        "resource tracker": stage["workers"],
    }, under


DATALOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    for epoch in range(2):  # the workers of epoch 1 start after the first step: inside training
        for x, y in DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn"):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    print("TRAINED", flush=True)
"""


@pytest.mark.torch
def test_dataloader_workers_started_during_training_hang_under_training(tmp_path: Path) -> None:
    """A DataLoader's spawn workers started once training is open (no stage around them) hang under
    ``training``; those started before the first step under the root."""
    (tmp_path / "job.py").write_text(DATALOADER)
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "TRAINED" in r.stdout, r.stderr
    js = [read_journal(p) for p in journals(tmp_path / "lora-otel")]
    [parent] = [j for j in js if j.root.parent_id is None]
    [training] = [s for s in parent.spans if s.name == "training"]
    workers = [j for j in js if "--multiprocessing-fork" in j.root.attrs["process.command_args"]]
    assert sorted(w.root.parent_id == training.span_id for w in workers) == [False, True], [
        (w.root.parent_id, w.root.start_ns > training.start_ns) for w in workers
    ]
    [late] = [w for w in workers if w.root.parent_id == training.span_id]
    assert late.root.start_ns > training.start_ns


def test_os_system_and_a_ui_run(tmp_path: Path) -> None:
    """os.system inside a stage: the shell's Python hangs under the stage. With
    LORA_OTEL_TRACE_PER_RUN=1, a run started outside any stage (subprocess or os.system) is a trace
    of its own linked to the launcher; one inside a stage stays in the launcher's trace."""
    (tmp_path / "job.py").write_text(
        "import os, subprocess, sys, lora_otel\n"
        "C = sys.executable + ' '\n"
        "os.system(C + 'top.py')\n"
        "subprocess.run([sys.executable, 'popen.py'])\n"
        "with lora_otel.stage('convert'):\n"
        "    os.system(C + 'staged.py')\n"
        "assert 'LORA_OTEL_LAUNCHED_BY' not in os.environ and os.environ['TRACEPARENT']\n"
    )
    children_scripts(tmp_path, "top", "popen", "staged")
    for per_run in ("0", "1"):
        d = tmp_path / ("per-run-" + per_run)
        r = subprocess.run(
            [PYTHON, str(tmp_path / "job.py")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(d), LORA_OTEL_TRACE_PER_RUN=per_run),
        )
        assert r.returncode == 0, r.stderr
        js = [read_journal(p) for p in journals(d)]
        [parent] = [j for j in js if role(j) == "job"]
        stage = next(s.span_id for s in parent.spans if s.name == "convert")
        by = {role(j): j for j in js if j is not parent}
        assert sorted(by) == ["popen", "staged", "top"]
        assert by["staged"].root.parent_id == stage and by["staged"].trace_id == parent.trace_id
        for run in ("top", "popen"):
            j = by[run]
            if per_run == "0":
                assert j.root.parent_id == parent.root.span_id and j.trace_id == parent.trace_id
            else:
                assert j.root.parent_id is None and j.trace_id != parent.trace_id
                assert j.root.attrs["lora_otel.launched_by.trace_id"] == parent.trace_id
                assert j.root.attrs["lora_otel.launched_by.span_id"] == parent.root.span_id


def test_forked_child_places_its_own_children_under_its_stage(tmp_path: Path) -> None:
    """subprocess was loaded (and hooked) in the parent; a forked child that starts a process with a
    copy of its environment inside its own stage puts it under that stage, not the parent's root."""
    (tmp_path / "job.py").write_text(
        "import os, subprocess, sys, lora_otel\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    with lora_otel.stage('in child'):\n"
        "        subprocess.run([sys.executable, 'grandchild.py'], env=os.environ.copy())\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    children_scripts(tmp_path, "grandchild")
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    js = [read_journal(p) for p in journals(tmp_path / "lora-otel")]
    [child] = [j for j in js if any(s.name == "in child" for s in j.spans)]
    [grandchild] = [j for j in js if role(j) == "grandchild"]
    assert grandchild.root.parent_id == next(s.span_id for s in child.spans if s.name == "in child")


CREATED_BY_ANOTHER_THREAD = """
import os, threading, time
import lora_otel
from lora_otel._boot import core

pid = os.fork()
if pid == 0:
    core.settle()  # the child takes over: its journal waits for its first record
    opened = threading.Event()
    open_journal = core.open_journal

    def open_slowly(*args, **kwargs):  # the file is there; its first record comes 0.5 s later
        path = open_journal(*args, **kwargs)
        opened.set()
        time.sleep(0.5)
        return path

    core.open_journal = open_slowly
    threading.Thread(target=core.ensure_journal, daemon=True).start()  # (as the child's first beat)
    opened.wait(60)
    lora_otel.mark("child at work")
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_records_written_while_another_thread_creates_the_journal_wait_for_it(tmp_path: Path) -> None:
    """A forked child's journal is created by its first record, often the beat thread's; the main
    thread's mark and exit record written meanwhile wait for the file instead of being dropped, and
    ``os._exit`` leaves only after its record is in. (The matrix found children's journals empty
    under load, 15 in 75 runs on 3.12: the creation is slowed here, in the real function, to make
    the overlap sure.)"""
    (tmp_path / "job.py").write_text(CREATED_BY_ANOTHER_THREAD)
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert (r.returncode, r.stdout) == (0, "0\n"), r.stderr
    [child] = [j for j in map(read_journal, journals(tmp_path)) if j.root is not None and j.root.parent_id]
    assert child.problems == []
    assert [e[1] for e in child.root.events] == ["child at work"]
    assert child.exit is not None and child.exit["code"] == 0


def test_a_forked_child_may_call_os_exit_with_its_keyword(tmp_path: Path) -> None:
    """``os._exit(status=3)`` in a forked child exits 3, as without lora_otel (the wrapper that
    records the child's exit once took ``code=``, so the keyword raised TypeError in the child);
    the child, which wrote nothing, leaves no journal; its parent's has its code."""
    (tmp_path / "job.py").write_text(
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(status=3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_KEEP_SHORT="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3", r.stderr
    [parent] = [read_journal(p) for p in journals(tmp_path)]
    assert parent.exit["code"] == 0
    ends = [e[2] for s in parent.spans for e in s.events if e[1] == "child exit"]
    assert [a["child.exit_code"] for a in ends] == [3], ends


@pytest.mark.torch
def test_a_short_forked_child_leaves_its_parents_stacks_file(tmp_path: Path) -> None:
    """A job under a traced launcher (it joins the launcher's sidecar) forks a child that ends
    normally at once: the child's journal is removed as a short run's, and the job's stacks file
    stays (before: the child unlinked it, having inherited the job's note of the file it created —
    seen under axolotl, whose trainer then had no stack dump for its diagnosis)."""
    (tmp_path / "launcher.py").write_text(
        "import subprocess, sys, time\nimport torch\ntime.sleep(1.5)\n"
        "sys.exit(subprocess.call([sys.executable, 'job.py']))\n"
    )
    (tmp_path / "job.py").write_text(
        "import os, sys, time\nimport torch\ntime.sleep(1.5)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    import decimal, fractions\n    sys.exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(sorted(os.listdir('j')))\n"
    )
    env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_KEEP_SHORT="")
    r = subprocess.run([PYTHON, "launcher.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    left = ast.literal_eval(r.stdout)  # the job's own listing, taken after its child ended
    jobs = [name for name in left if name.endswith(".otel.jsonl") and "." not in name[: -len(".otel.jsonl")]]
    assert len(jobs) == 2, left  # the launcher's and the job's; the child's went
    for journal in jobs:
        assert journal.replace(".otel.jsonl", ".stacks.txt") in left, left
