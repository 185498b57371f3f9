"""Retention never deletes a live job's journal (issue 36, item 3): a job in its own pid namespace
(a container, a pod) sharing ``LORA_OTEL_DIR`` with the host, frozen (no beats, so its files age),
names a pid in its journal that means another process on the host. Retention judges it by the
lock the job holds on its journal for its whole life, which holds across pid namespaces: another
job's sidecar on the host leaves its journal and stacks file alone while it runs, and removes them
once it is dead. Real processes, a real pid namespace (``unshare``, as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for
from test_no_clutter import _age, _make_run, run
from test_sidecar import alive

from lora_otel.journal import runs
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

FROZEN = """\
import ctypes, lora_otel, os
with lora_otel.stage("frozen"):  # a job: its journal locked, its stacks file made
    from lora_otel._boot import core
    print(core.journal_path, os.getpid(), flush=True)
    ctypes.PyDLL(None).pause()  # frozen, the GIL held: no beat ever again
"""


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare (a pid namespace)")
def test_a_frozen_job_in_another_pid_namespace_keeps_its_journal(tmp_path: Path) -> None:
    """A job frozen in its own pid namespace (pid 1 there), its files an hour old, and an older
    finished run: another job's sidecar on the host (``LORA_OTEL_KEEP=1``) removes the finished
    run and leaves the frozen job's journal and stacks file; once the frozen job is killed,
    retention removes them."""
    d = tmp_path / "shared"
    d.mkdir()
    decoy = _make_run(d, "import sys; sys.exit(1)")  # the oldest run, finished: retention's sign of life
    frozen = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", PYTHON, "-c", FROZEN],
        cwd=d,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(d)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        path_text, inner_pid = frozen.stdout.readline().split()
        journal = Path(path_text)
        stacks = journal.with_name(journal.name[: -len(".otel.jsonl")] + ".stacks.txt")
        assert inner_pid == "1" and read_journal(journal).pid == 1, "the job is pid 1 in its own namespace"
        assert stacks.exists()
        _age([p for p in d.iterdir() if p.name.startswith(decoy.name[: -len(".otel.jsonl")])], 7200)
        _age([journal, stacks], 3600)
        job = "import lora_otel, time\nwith lora_otel.stage('train'):\n    time.sleep(0.2)\n"
        r = run(
            [PYTHON, "-c", job + "from lora_otel._boot import core\nprint(core.journal_path)\n"],
            d,
            clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(d), LORA_OTEL_KEEP="1"),
        )
        assert r.returncode == 0, r.stderr
        host_job = read_journal(Path(r.stdout.strip()))
        log = Path(host_job.root.attrs["lora_otel.sidecar.log"])
        said = wait_for(
            lambda: [x for x in log.read_text().splitlines() if "retention:" in x], what="the retention line"
        )
        assert "removed the 1 oldest finished run(s)" in said[0], said
        wait_for(lambda: not alive(host_job.root.attrs["lora_otel.sidecar.pid"]), what="the sidecar's exit")
        assert not decoy.exists()
        assert journal.exists() and stacks.exists(), "retention removed a running job's files"
    finally:
        frozen.kill()  # (--kill-child: the frozen job, pid 1 of its namespace, dies with it)
        frozen.communicate(timeout=30)
    removed = wait_for(lambda: runs.prune(str(d), keep_runs=1), what="the killed job's run removed")
    assert [r.journal for r in removed] == [str(journal)]
    assert not journal.exists() and not stacks.exists()
    assert len(journals(d)) == 1


def test_a_journal_held_by_a_process_is_kept(tmp_path: Path) -> None:
    """A journal whose first record names no process here (a pid of another namespace or host) is
    kept while a process holds the lock on it, and removed once the lock is released."""
    d = tmp_path / "j"
    d.mkdir()
    old = _make_run(d, "import sys; sys.exit(1)")
    _make_run(d, "import sys; sys.exit(1)")
    _age(list(d.iterdir()), 3600)
    holder = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\nsys.stdin.read()\n",
            str(old),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        assert runs.prune(str(d), keep_runs=1) == []
        assert old.exists()
    finally:
        holder.communicate(timeout=30)
    assert [r.journal for r in runs.prune(str(d), keep_runs=1)] == [str(old)]


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare (a pid namespace)")
def test_runs_from_another_pid_namespace_go_only_when_they_say_they_ended(tmp_path: Path) -> None:
    """Finished runs of another pid namespace, an hour old: one that exited (an ``exit`` record) is
    removed; one killed in its first second (no exit record, never a job, so no lock) cannot be told
    from one frozen there, and is kept, though its pid names no process here."""
    d = tmp_path / "shared"
    d.mkdir()
    env = clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0", LORA_OTEL_DIR=str(d))
    made = []
    for code in ("import sys; sys.exit(3)", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"):
        before = set(journals(d))
        # (under a shell: the namespace's pid 1 ignores a SIGKILL sent from inside it)
        inner = ["sh", "-c", '"$0" -c "$1"; exit 0', PYTHON, code]
        subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *inner], cwd=d, env=env, timeout=60)
        [new] = set(journals(d)) - before
        made.append(new)
    exited, killed = made
    assert read_journal(exited).exit is not None and read_journal(killed).exit is None
    _make_run(d, "import sys; sys.exit(1)")  # the newest run, of this namespace
    _age(list(d.iterdir()), 3600)
    removed = runs.prune(str(d), keep_runs=1)
    assert [r.journal for r in removed] == [str(exited)]
    assert killed.exists()


def test_retention_locks_only_a_regular_file(tmp_path: Path) -> None:
    """What retention locks before removing a run (`runs._lock`) is opened non-blocking and checked
    to be a regular file: a FIFO put under a journal's name since the listing (a writer waiting on
    it) is not taken for a journal nobody holds, nor is a device; each counts as held (-1), so its
    run is kept."""
    fifo = tmp_path / "run.otel.jsonl"
    os.mkfifo(fifo)
    writer = subprocess.Popen([PYTHON, "-c", f"open({str(fifo)!r}, 'w').write('x')"])
    try:
        assert runs._lock(str(fifo)) == -1
    finally:
        if writer.poll() is None:  # still waiting for a reader: release it
            with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb"):
                writer.wait(60)
    if os.geteuid() == 0:
        device = tmp_path / "dev.otel.jsonl"
        os.mknod(device, 0o600 | 0o020000, os.makedev(1, 3))  # a character device (/dev/null's)
        assert runs._lock(str(device)) == -1
    assert runs._head(str(fifo)) == {}
