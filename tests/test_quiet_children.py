"""Quiet children: a trainer started by a launcher is watched; a worker of its parent is not; the
job's ``--log`` gets the children's warnings, never their start-up lines (issue 22 item 3).

A process started by a traced process of the same job keeps its info lines off the terminal. Before,
that also meant it was never called stalled between stages, so a ``python train.py`` below a
launcher that is not a training job itself (a shell-like wrapper, a UI's runner) could hang with no
line at all; and a forked pool worker wrote its five start-up lines into the job's ``--log``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

LAUNCHER = """\
import argparse, subprocess, sys
argparse.ArgumentParser().add_argument("--log")
sys.exit(subprocess.call([sys.executable, "train.py"]))
"""

TRAINER = """\
import argparse, glob, multiprocessing, os, time
import torch  # a training job: quiet time may be a hang

argparse.ArgumentParser().parse_args()  # the arguments stage ends

def work(_):
    return os.getpid()

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(1) as pool:  # a forked worker: quiet, a worker
        print("worker", pool.map(work, [0])[0], flush=True)
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # a spawned worker: a worker too
        print("spawned", pool.map(work, [0])[0], flush=True)
    deadline, seen = time.monotonic() + 120, None
    while time.monotonic() < deadline and (seen is None or time.monotonic() < seen + 1):
        time.sleep(0.1)  # between stages, quiet, until its stall record is written
        if seen is None and any(b'"kind":"between"' in open(p, "rb").read() for p in glob.glob("j/*.otel.jsonl")):
            seen = time.monotonic()
    print("stall seen", seen is not None, "pid", os.getpid(), flush=True)
"""


@pytest.mark.torch
def test_trainer_below_a_launcher_is_watched_and_workers_stay_quiet(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "launcher.py").write_text(LAUNCHER, encoding="utf-8")
    (tmp_path / "train.py").write_text(TRAINER, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "launcher.py", "--log", "run.log"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j", LORA_OTEL_STALL_AFTER="between=2"),
    )
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert out["stall"].startswith("seen True"), (r.stdout, r.stderr[-3000:])
    trainer = int(out["stall"].rsplit(" ", 1)[1])
    worker, spawned = int(out["worker"]), int(out["spawned"])

    by_pid = {read_journal(p).pid: read_journal(p) for p in journals(tmp_path / "j")}
    config = {pid: j.config for pid, j in by_pid.items() if isinstance(j.config, dict)}
    assert config[trainer]["quiet"] is True and config[trainer]["worker"] is False
    for pid in (worker, spawned):  # a worker that ended before it was a job leaves no journal
        if pid in config:
            assert config[pid]["quiet"] is True and config[pid]["worker"] is True, (pid, config[pid])
    [stall] = [s for s in by_pid[trainer].stalls if s["kind"] == "between"]
    assert stall["limit_s"] == 2

    # the trainer's STALLED line reaches the terminal and the launcher's --log
    mine = "[lora-otel][%d][" % trainer
    stalled = [x for x in r.stderr.splitlines() if x.startswith(mine) and "STALLED: no stage open" in x]
    assert stalled, r.stderr[-3000:]
    log = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert any(x.startswith(mine) and "STALLED: no stage open" in x for x in log.splitlines()), log
    # no start-up line of a child process in the job's log: only the launcher's own
    for pid in (trainer, worker, spawned):
        assert not [x for x in log.splitlines() if x.startswith("[lora-otel][%d][" % pid) and "argv:" in x], log


def test_the_launchers_last_line_names_the_trainers_steps(tmp_path: Path) -> None:
    """A launcher that made no optimizer step itself ends with the steps of the trainer below it
    (``0 optimizer steps here; train, pid N, made 10``), read from the trainer's journal — before,
    its last line said ``0 optimizer steps`` while the trainer made 10."""
    (tmp_path / "launch.py").write_text(
        "import subprocess, sys, lora_otel\nwith lora_otel.stage('prepare'):\n    pass\n"
        "print('trainer pid', subprocess.run([sys.executable, 'train.py'], capture_output=True, text=True).stdout)\n",
        encoding="utf-8",
    )
    (tmp_path / "train.py").write_text(
        "import os, time, lora_otel\nfor i in range(10):\n    lora_otel.progress(step=i + 1)\n    time.sleep(0.02)\n"
        "print(os.getpid(), end='')\n",
        encoding="utf-8",
    )
    r = subprocess.run(
        [PYTHON, "launch.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j"),
    )
    assert r.returncode == 0, r.stderr
    trainer = int(r.stdout.split()[-1])
    [last] = [line for line in r.stderr.splitlines() if "exiting normally after" in line]
    assert last.endswith("(0 optimizer steps here; train, pid %d, made 10)" % trainer), last


ROTATING = """\
import argparse, json, os, shutil, subprocess, sys
args = argparse.ArgumentParser()
args.add_argument("--log")
args.add_argument("--mode")
a = args.parse_args()
open(a.log, "a").write("launcher started\\n")  # its own log first (lora_otel's copy waits until needed)
if a.mode == "moved":
    shutil.move(a.log, a.log + ".1")  # the launcher rotates its log away
elif a.mode == "shared":
    os.chmod(a.log, 0o666)  # a log others may write: lora_otel will not append to it
elif a.mode == "symlink":
    os.rename(a.log, a.log + ".real")
    os.symlink(os.path.basename(a.log) + ".real", a.log)
r = subprocess.run([sys.executable, "-c", "print('child ok')"], capture_output=True, text=True)
print(json.dumps([r.stdout, r.stderr, os.path.exists(a.log)]), flush=True)
"""


@pytest.mark.parametrize("mode", ["moved", "shared", "symlink"])
def test_a_child_never_complains_about_or_recreates_the_jobs_log(tmp_path: Path, mode: str) -> None:
    """A child whose job's ``--log`` cannot be used (moved away, writable by others, a symlink now)
    writes nothing about it on its stderr — its output is the program's own — and never creates the
    file again (a hostile trial: every child said `cannot append to log file …`, and a rotated log
    came back empty)."""
    (tmp_path / "launcher.py").write_text(ROTATING, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "launcher.py", "--log", "run.log", "--mode", mode],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR="j"),
    )
    assert r.returncode == 0, r.stderr
    out, err, exists = json.loads(r.stdout)
    assert (out, err) == ("child ok\n", ""), r.stdout  # before: `[lora-otel]… cannot append to log file …`
    assert exists is (mode != "moved"), r.stdout  # before: a moved log came back, empty
