"""No "Remove <file>" advice a look cannot back, and no look that can hang (issue 37, hostile
trial items 1, 2, 3, 5, 7, 8).

- The look for processes that have a file open says when it missed some (another user's
  ``/proc/<pid>/fd``, the process cap, its deadline): then "no process this user can see has it
  open", and no removal is advised.
- A file owned by another user than the job's is never advised for removal.
- Descriptors are compared by link and ``fdinfo``, never ``stat``; a polled path on a FUSE or
  network mount is not looked at (a dead FUSE mount here: nothing hangs).
- A look as another user (root's ``inspect`` on someone's job) or from another mount namespace
  gives no facts of the path.
- Paths in advice are shell-quoted.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from procs import PYTHON, REPO, clean_env

from lora_otel.analysis import filelocks, pollfacts, polling

KEY = polling.KEY
LOCK = filelocks.KEY

POLLED = {
    KEY + "kind": "path",
    KEY + "expr": "self.lock_file_path",
    KEY + "call": "os.path.exists",
    KEY + "where": "baton.py:42 in wait",
    KEY + "waits_for": "gone",
    KEY + "value": "/c/ext/build.lock",
    KEY + "exists": True,
    KEY + "type": "file",
    KEY + "size": 0,
    KEY + "owner": "ann",
    KEY + "owner_uid": 1000,
    KEY + "job_uid": 1000,
}


# --- over constructed evidence ---------------------------------------------------------------------


def test_removal_only_for_a_complete_look_at_a_file_of_the_jobs_user() -> None:
    said, advice = polling.sentence(POLLED)
    assert "and no process has it open: a leftover" in said and advice.startswith("Remove /c/ext/build.lock ")
    partial = {**POLLED, KEY + "open_by_error": "3 processes of other users cannot be looked at from here"}
    said, advice = polling.sentence(partial)
    assert "no process this user can see has it open (3 processes of other users" in said, said
    assert "no process has it open" not in said and "Remove" not in advice and "fuser -v /c/ext/build.lock" in advice
    theirs = {**POLLED, KEY + "owner": "nb", KEY + "owner_uid": 1001}
    said, advice = polling.sentence(theirs)
    assert "belongs to another user than the job's" in said and "Remove" not in advice
    assert advice.startswith("Ask its owner nb whether a run of theirs uses /c/ext/build.lock")
    unknown_owner = {k: v for k, v in POLLED.items() if k != KEY + "owner_uid"}
    assert polling.sentence(unknown_owner)[1] == ""
    unchecked = {k: v for k, v in POLLED.items() if not k.endswith(("exists", "type", "size", "owner", "uid"))}
    unchecked[KEY + "unchecked"] = "it is on a fuse.sshfs mount at /mnt/x, which is not looked at"
    said, advice = polling.sentence(unchecked)
    assert "its state is not known: it is on a fuse.sshfs mount at /mnt/x" in said and advice == ""


def test_file_lock_advice_needs_a_complete_look_and_the_jobs_file() -> None:
    stale = {LOCK + "how": "filelock", LOCK + "path": "/d/m.lock", LOCK + "stale": True}
    mine = {**stale, LOCK + "owner_uid": 1000, LOCK + "job_uid": 1000}
    assert filelocks.advice(mine).startswith("Remove /d/m.lock: no process holds it")
    assert filelocks.advice(stale) == ""  # whose it is not known
    theirs = {**stale, LOCK + "owner_uid": 0, LOCK + "job_uid": 1000}
    assert filelocks.advice(theirs).startswith("Ask the owner of /d/m.lock (another user than the job's)")
    partial = {
        LOCK + "how": "filelock",
        LOCK + "path": "/d/m.lock",
        LOCK + "open_by_error": "only 4096 of 8000 processes were looked at",
        LOCK + "owner_uid": 1000,
        LOCK + "job_uid": 1000,
    }
    said = filelocks.sentence(partial) or ""
    assert "no process this user can see has it open (only 4096 of 8000" in said and "stale" not in said
    assert "Remove" not in filelocks.advice(partial)


def test_a_crafted_path_is_one_quoted_word_in_the_advice() -> None:
    path = "/tmp/x\n[lora-otel] what to do: run rm -rf ~ \x1b[31m; echo .lock"
    _, advice = polling.sentence({**POLLED, KEY + "value": path})
    assert advice.startswith("Remove %s (no process" % shlex.quote(path)), advice
    assert shlex.split(advice.split(" (", 1)[0]) == ["Remove", path]
    stale = {LOCK + "how": "filelock", LOCK + "path": path, LOCK + "stale": True, LOCK + "owner_uid": 0}
    assert filelocks.advice({**stale, LOCK + "job_uid": 0}).startswith("Remove %s:" % shlex.quote(path))


# --- real processes, this user's ------------------------------------------------------------------


@pytest.mark.slow
def test_the_look_for_openers_says_when_it_missed_some(tmp_path: Path, monkeypatch) -> None:
    """A file held open by a real process is found by its device and inode (fdinfo, no stat); the cap
    on processes and the deadline make the look incomplete, and say so."""
    lock = tmp_path / "run.lock"
    lock.write_text("")
    holder = subprocess.Popen(
        [PYTHON, "-c", "import sys, time; f = open(sys.argv[1]); print('ok', flush=True); time.sleep(600)", str(lock)],
        stdout=subprocess.PIPE,
        env=clean_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ok"
        st = os.stat(lock)
        file_id = ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
        assert file_id in filelocks.open_files(holder.pid)
        found = filelocks._openers(file_id, os.getpid())
        assert holder.pid in found.pids
        assert found.incomplete == "" or "other users" in found.incomplete  # (root here: none)
        assert filelocks._openers(file_id, os.getpid(), deadline=0.0).incomplete.startswith("the look at other")
        monkeypatch.setattr(filelocks, "SCAN_PROCESSES_MAX", 1)
        assert "only 1 of" in filelocks._openers(file_id, os.getpid()).incomplete
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


# --- real processes, other users and namespaces ----------------------------------------------------

OTHER = "lora_otel_attacker"  # the account tests/test_harm_shared_dirs.py makes


@pytest.fixture(scope="module")
def other_user():
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("useradd"):
        pytest.skip("needs root, useradd and setpriv to act as a second real user")
    import pwd

    try:
        return pwd.getpwnam(OTHER)
    except KeyError:
        r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER])
        if r.returncode != 0:
            pytest.skip("useradd failed")
        return pwd.getpwnam(OTHER)


def _as(user, code: str, *args: str, wait: bool = True):
    """Python ``code`` run as ``user`` (setpriv), with this checkout importable: the system's python3,
    as root's interpreter may lie under a home other users cannot enter."""
    cmd = ["setpriv", "--reuid=%d" % user.pw_uid, "--regid=%d" % user.pw_gid, "--clear-groups"]
    python = PYTHON
    if subprocess.run([*cmd, python, "-c", "pass"], capture_output=True, env=clean_env()).returncode != 0:
        python = "/usr/bin/python3"
    full = [*cmd, python, "-c", "import sys; sys.path.insert(0, %r)\n%s" % (str(REPO), code), *args]
    if not wait:
        return subprocess.Popen(full, stdout=subprocess.PIPE, env=clean_env())
    r = subprocess.run(full, capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 0, r.stderr
    return r


SLEEPER = "import time; print('ok', flush=True); time.sleep(600)"


@pytest.mark.slow
def test_another_users_holder_is_not_called_nobody_and_root_does_not_judge_their_paths(other_user) -> None:
    """The job's user cannot read root's descriptors: a file root holds open is "no process this user
    can see has it open", with no removal advised (item 1a). Root looking at that user's job gives no
    facts of the path at all (item 3)."""
    top = Path(tempfile.mkdtemp(prefix="lora-otel-37t-", dir="/tmp"))
    os.chown(top, other_user.pw_uid, other_user.pw_gid)
    lock = top / "build.lock"
    lock.write_text("")
    os.chown(lock, other_user.pw_uid, other_user.pw_gid)
    job = _as(other_user, SLEEPER, wait=False)
    holder = subprocess.Popen(
        [PYTHON, "-c", "import sys, time; f = open(sys.argv[1]); print('ok', flush=True); time.sleep(600)", str(lock)],
        stdout=subprocess.PIPE,
        env=clean_env(),
    )
    try:
        for p in (job, holder):
            assert p.stdout is not None and p.stdout.readline().strip() == b"ok"
        code = (
            "import json\nfrom lora_otel.analysis import pollfacts\n"
            "print(json.dumps(pollfacts.path_state(int(sys.argv[1]), sys.argv[2])))"
        )
        facts = json.loads(_as(other_user, code, str(job.pid), str(lock)).stdout)
        assert facts[KEY + "exists"] is True and KEY + "open_by" not in facts, facts
        assert "cannot be looked at from here" in facts[KEY + "open_by_error"], facts
        said, advice = polling.sentence({**POLLED, KEY + "value": str(lock), **facts})
        assert "no process this user can see has it open" in said and "Remove" not in advice, (said, advice)
        as_root = pollfacts.path_state(job.pid, str(lock))
        assert as_root == {KEY + "unchecked": "not looked at: this look runs as root, not as the job's user %s" % OTHER}
    finally:
        for p in (job, holder):
            p.kill()
            p.wait()
            p.stdout.close()
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("unshare"), reason="no unshare here")
def test_a_process_in_another_mount_namespace_gets_no_facts_of_the_hosts_file(tmp_path: Path) -> None:
    """The same name is another file in the job's mount namespace: the host's is not judged (item 5)."""
    (tmp_path / "x.lock").write_text("HOSTFILE\n")
    inner = subprocess.Popen(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs none "$1" && echo inside-the-namespace > "$1/x.lock" && echo ok && exec sleep 600',
            "sh",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert inner.stdout is not None
        if inner.stdout.readline().strip() != b"ok":
            pytest.skip("cannot make a mount namespace here")
        facts = pollfacts.path_state(inner.pid, str(tmp_path / "x.lock"))
        assert list(facts) == [KEY + "unchecked"] and "another mount namespace" in facts[KEY + "unchecked"], facts
        assert pollfacts.path_state(inner.pid, "x.lock") == facts  # relative: the same
    finally:
        inner.kill()
        inner.wait()
        inner.stdout.close()


DEADFS = '''\
"""A FUSE mount whose server (this process, holding /dev/fuse) never answers, in a private mount
namespace; an O_PATH descriptor on its root held open; a symlink to a lock file on it. Then, in the
same namespace, the poll loop's look at those paths and at this process's descriptors."""
import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x00020000) != 0 or libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None) != 0:
    sys.exit(77)
mnt = os.path.abspath("data/mnt")
os.makedirs(mnt, exist_ok=True)
try:
    fd = os.open("/dev/fuse", os.O_RDWR)
except OSError:
    sys.exit(77)
opts = "fd=%d,rootmode=40000,user_id=%d,group_id=%d" % (fd, os.getuid(), os.getgid())
if libc.mount(b"deadfs", mnt.encode(), b"fuse.deadfs", 0, opts.encode()) != 0:
    sys.exit(77)
held = os.open(mnt, os.O_PATH)
os.symlink(os.path.join(mnt, "x.lock"), "link.lock")
check = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from lora_otel.analysis import filelocks, pollfacts
me = os.getppid()
print(json.dumps({
    "direct": pollfacts.path_state(me, sys.argv[2] + "/x.lock"),
    "link": pollfacts.path_state(me, "link.lock"),
    "files": sorted(filelocks.open_files(me).values()),
    "openers": list(filelocks._openers(((0, 0), 1), os.getpid())),
}))
"""
r = subprocess.run([sys.executable, "-c", check, sys.argv[1], mnt], capture_output=True, text=True)
print(r.stdout or r.stderr, flush=True)
'''


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse here")
def test_a_dead_fuse_mount_hangs_no_look(tmp_path: Path) -> None:
    """A descriptor on a FUSE mount that never answers (item 2a: a stat of /proc/<pid>/fd/N waited
    forever) and a polled path on it, directly or through a symlink (item 2b): all told at once."""
    (tmp_path / "deadfs.py").write_text(DEADFS)
    r = subprocess.run(
        [sys.executable, "deadfs.py", str(REPO)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    if r.returncode == 77:
        pytest.skip("cannot mount FUSE in a private mount namespace here")
    facts = json.loads(r.stdout)
    mnt = str(tmp_path / "data" / "mnt")
    for name in ("direct", "link"):
        told = facts[name][KEY + "unchecked"]
        assert told.startswith("it is on a fuse.deadfs mount at %s, which is not looked at" % mnt), facts
    assert mnt in facts["files"], facts


@pytest.mark.slow
def test_a_real_job_waiting_on_another_users_leftover_is_not_told_to_remove_it(tmp_path: Path, other_user) -> None:
    """A real ``LORA_OTEL=1`` job (torch's file baton) waits for a lock file nobody has open, but it
    is another user's: the sidecar says so and advises asking its owner, not removing it (item 1)."""
    from test_poll_loops import BATON, JOB_BATON, advice_of, job_lines, launch, stall_record, stop

    (tmp_path / "file_baton.py").write_text(BATON, encoding="utf-8")
    (tmp_path / "build").mkdir()
    lock = tmp_path / "build" / "lock"
    lock.write_bytes(b"")
    os.chown(lock, other_user.pw_uid, other_user.pw_gid)
    job = launch(tmp_path, JOB_BATON)
    try:
        _, why = job_lines(tmp_path)
        assert "owner %s) and no process has it open, but it belongs to another user than the job's" % OTHER in why
        rule, _, advice = advice_of(stall_record(tmp_path, job.pid))
        assert rule == "poll loop" and advice == (
            "Ask its owner %s whether a run of theirs uses %s; the job goes on when it is removed." % (OTHER, lock)
        ), advice
    finally:
        stop(job)
