"""Short failing runs are bounded without a job's sidecar (issue 36, item 9): 600 failing
``python -c`` runs into one ``LORA_OTEL_DIR`` left 600 journals until some job's sidecar pruned.
A short process that fails and keeps its journal now marks it by name on its way out and keeps at
most `SHORT_RUNS_KEPT` such journals of its user in the directory, the newest; a live job's
journal, another user's file and anything not a marked journal of this user's stay. Real
processes, a real second user (``useradd``, ``setpriv``) in a world-writable sticky directory."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for
from test_harm_shared_dirs import as_attacker, attacker, shared  # noqa: F401 - fixtures

from lora_otel._boot.preamble import SHORT_RUNS_KEPT, is_short_run_name
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

LIVE_JOB = """\
import lora_otel, sys
with lora_otel.stage("waiting"):  # a job: its journal locked for its whole life
    from lora_otel._boot import core
    print(core.journal_path, flush=True)
    sys.stdin.readline()
"""


def _failing_runs(directory: Path, count: int, parallel: int = 4, **extra: str) -> list[int]:
    """``count`` real short runs into ``directory``, ``parallel`` at a time: every other one dies of an
    uncaught exception (its journal kept), the others ``raise SystemExit(2)`` (nothing left).
    Returns the pids of the failing ones, in start order."""
    env = clean_env(**{"LORA_OTEL": "1", "LORA_OTEL_DIR": str(directory), "LORA_OTEL_KEEP_SHORT": "", **extra})
    failed: list[int] = []
    for first in range(0, count, parallel):
        batch = []
        for i in range(first, min(first + parallel, count)):
            code = "raise ValueError('run %d')" % i if i % 2 == 0 else "raise SystemExit(2)"
            batch.append((i, subprocess.Popen([PYTHON, "-c", code], env=env, stderr=subprocess.DEVNULL)))
        for i, proc in batch:
            assert proc.wait(timeout=120) == (1 if i % 2 == 0 else 2)
            if i % 2 == 0:
                failed.append(proc.pid)
    return failed


def _marked(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if is_short_run_name(p.name) and p.stat().st_uid == os.geteuid())


def test_failing_short_runs_leave_at_most_the_bound(tmp_path: Path, shared: Path, attacker) -> None:  # noqa: F811
    """200 real short runs (100 uncaught exceptions, 100 ``SystemExit(2)``) into one shared
    ``LORA_OTEL_DIR``: at most `SHORT_RUNS_KEPT` journals of them stay, the newest, each readable by
    ``lora-otel inspect``; a live job's journal (even one named like a short run's, its files an
    hour old: it holds its lock), another user's file named like a short run's, a hard link to a
    file of ours under such a name, and a file of ours that is no journal all survive. (Before: 100 journals.)"""
    foreign = shared / "20200101T000000Z-0badc0de-short-1.otel.jsonl"
    as_attacker(attacker, "import sys; open(sys.argv[1], 'w').write('not yours\\n')", str(foreign))
    notes = shared / "notes.txt"
    notes.write_text("mine\n")
    precious = tmp_path / "precious.txt"  # a file of ours, hard-linked under a short run's name (by
    precious.write_text("keep\n")  # anyone who can write the directory, with protected_hardlinks=0)
    os.link(precious, shared / "20200101T000003Z-short-3.otel.jsonl")
    os.utime(precious, (0, 0))
    jobs = []
    for extra in (
        {"LORA_OTEL_DIR": str(shared)},
        {"LORA_OTEL_JOURNAL": str(shared / "20200101T000001Z-short-2.otel.jsonl")},
    ):
        env = clean_env(LORA_OTEL="1", LORA_OTEL_KEEP_SHORT="", **extra)
        proc = subprocess.Popen(
            [PYTHON, "-c", LIVE_JOB],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        jobs.append((proc, Path(proc.stdout.readline().strip())))
    try:
        for proc, path in jobs:
            wait_for(lambda path=path: read_journal(path).root is not None, timeout=60)
            proc.send_signal(signal.SIGSTOP)  # frozen: no beat touches its journal any more
            old = time.time() - 3600
            os.utime(path, (old, old))
        failed = _failing_runs(shared, 200)
        marked = _marked(shared)
        kept = [p for p in marked if p.name not in (jobs[1][1].name, "20200101T000003Z-short-3.otel.jsonl")]
        assert len(kept) <= SHORT_RUNS_KEPT, [p.name for p in kept]
        last = {"-short-%d.otel.jsonl" % pid for pid in failed[-2:]}
        assert {p.name[p.name.rindex("-short-") :] for p in kept} >= last, (last, [p.name for p in kept])
        unmarked = [p for p in journals(shared) if p.stat().st_uid == os.geteuid() and not is_short_run_name(p.name)]
        assert unmarked == [jobs[0][1]], unmarked  # every kept failure is marked; the live job is not
        for _proc, path in jobs:
            assert path.exists(), path
        assert foreign.read_text() == "not yours\n" and notes.read_text() == "mine\n"
        assert (shared / "20200101T000003Z-short-3.otel.jsonl").read_text() == "keep\n"
        newest = max(kept, key=lambda p: p.stat().st_mtime_ns)
        r = subprocess.run(
            [PYTHON, "-m", "lora_otel", "inspect", str(newest)],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "uncaught ValueError" in r.stdout, r.stdout + r.stderr
    finally:
        for proc, _path in jobs:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()


def test_lora_otel_keep_lowers_the_bound(tmp_path: Path) -> None:
    """``LORA_OTEL_KEEP=3`` keeps three short failures' journals, the newest; ``LORA_OTEL_KEEP=0``
    (no limit) keeps them all, unmarked; ``LORA_OTEL_KEEP_SHORT=1`` keeps them all under their first names."""
    d = tmp_path / "j"
    failed = _failing_runs(d, 16, LORA_OTEL_KEEP="3")
    names = [p.name for p in _marked(d)]
    assert len(names) == 3, names
    assert any(n.endswith("-short-%d.otel.jsonl" % failed[-1]) for n in names), names
    _failing_runs(d, 8, LORA_OTEL_KEEP="0")
    assert len(_marked(d)) == 3 and len(journals(d)) == 3 + 4
    d2 = tmp_path / "k"
    _failing_runs(d2, 8, LORA_OTEL_KEEP_SHORT="1", LORA_OTEL_KEEP="1")
    assert len(journals(d2)) == 8 and _marked(d2) == []  # (the SystemExit(2) runs too)


def test_a_short_failure_with_a_failed_forked_child_keeps_its_name(tmp_path: Path) -> None:
    """A short run that forks a child dying of an uncaught exception, then fails itself: the
    child's journal is named after the parent's (``<stem>.<pid>``) and names it as its parent, so
    the parent's journal keeps its first name (the mark given at exit is taken back) and neither is
    removed."""
    code = (
        "import os\npid = os.fork()\nif pid == 0:\n    raise ValueError('child')\n"
        "os.waitpid(pid, 0)\nraise KeyError('parent')\n"
    )
    env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_KEEP_SHORT="", LORA_OTEL_KEEP="1")
    r = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    names = sorted(p.name for p in journals(tmp_path / "j"))
    assert len(names) == 2 and _marked(tmp_path / "j") == [], names
    parent, child = names[1], names[0]
    assert child.startswith(parent[: -len(".otel.jsonl")] + "."), names


RSS_OF_CHILD = """\
import resource, subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1]], check=False)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_a_short_run_beside_100000_files_does_not_swell(tmp_path: Path) -> None:
    """``python -c pass`` (and a short failure) in a ``LORA_OTEL_DIR`` holding 100,000 files that
    someone left there peaks no higher than in an empty one (within 2 MB): the exit's look for
    traced children streams the directory instead of listing it whole (before: +4.6 MB at
    ``python -c pass``; a job in a tight memory cgroup pays it)."""
    crowded, empty = tmp_path / "crowded", tmp_path / "empty"
    crowded.mkdir()
    empty.mkdir()
    for i in range(100_000):
        os.close(os.open(crowded / ("left-%06d" % i), os.O_CREAT | os.O_WRONLY, 0o600))
    for code in ("pass", "raise ValueError('short')"):
        peaks = {}
        for d in (empty, crowded, empty, crowded):  # (the second of each: byte code, caches warm)
            env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(d), LORA_OTEL_KEEP_SHORT="")
            r = subprocess.run([PYTHON, "-c", RSS_OF_CHILD, code], env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            peaks[d] = int(r.stdout.split()[-1])  # KiB
        assert peaks[crowded] - peaks[empty] < 2048, (code, peaks)
