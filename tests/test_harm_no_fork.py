"""No fork the program sees (issue 36, item 2): lora_otel starts its sidecar without a fork of the
program's process, so none of the program's ``os.register_at_fork`` handlers runs, its audit hook
sees no ``os.fork``, and its ``os.wait()`` never returns the sidecar (nor anything of lora_otel's).
Each case is a real traced program, run with and without ``LORA_OTEL=1``; the sidecar still starts,
in its own session, holding none of the job's descriptors."""

from __future__ import annotations

import json
import os
import select
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

HANDLERS = """\
import json, os, sys, threading
events = []
sys.addaudithook(lambda ev, args: events.append(ev) if ev.startswith("os.") and "fork" in ev else None)
lock = threading.Lock()
calls_r, calls_w = os.pipe()
# The textbook pattern: no thread holds the lock across a fork (and the child's copy is released).
os.register_at_fork(before=lock.acquire, after_in_parent=lock.release, after_in_child=lock.release)
# A child-side handler that records every call where the parent can read it.
os.register_at_fork(after_in_child=lambda: os.write(calls_w, b"child "))
def work():
    with lock:
        import ctypes  # a native module by the program's own hand: the process becomes a job here
t = threading.Thread(target=work)
t.start()
t.join()
try:
    waited = list(os.wait())
except ChildProcessError:
    waited = None
os.close(calls_w)
print(json.dumps({"fork_events": events, "child_handler": os.read(calls_r, 100).decode(), "waited": waited}),
      flush=True)
sys.stdin.readline()  # alive until the test has looked at the sidecar
"""


def sidecar_of(tmp_path: Path) -> int:
    def find() -> int | None:
        for path in journals(tmp_path / "lora-otel"):
            pid = read_journal(path).root.attrs.get("lora_otel.sidecar.pid")
            if pid:
                return pid
        return None

    return wait_for(find, what="the sidecar's pid in the journal")


def execd(pid: int) -> None:
    def check() -> bool:
        try:
            # (before, the pid is the intermediate's fork, whose argv names the sidecar's too)
            return Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")[1:3] == [b"-m", b"lora_otel.export.sidecar"]
        except OSError:
            pytest.fail("the sidecar %d is gone before its exec" % pid)

    wait_for(check, what="the sidecar's exec")


@pytest.mark.parametrize("traced", [False, True], ids=["bare", "LORA_OTEL=1"])
def test_fork_handlers_never_run(tmp_path: Path, traced: bool) -> None:
    """The program's at-fork handlers never run: the textbook lock pattern with a native import
    taken under the lock (its promotion starts the sidecar) does not deadlock, the child-side
    handler is never called, the audit hook sees no fork, ``os.wait()`` finds no child. The sidecar
    has started: its own session, not the job's child, /dev/null on 0 and 1, its log on 2, and
    nothing of the job's (its pipes)."""
    (tmp_path / "job.py").write_text(HANDLERS)
    env = clean_env(LORA_OTEL="1") if traced else clean_env()
    proc = subprocess.Popen(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the program hangs (deadlocked at a fork it never made)"
        report = json.loads(proc.stdout.readline())
        assert report == {"fork_events": [], "child_handler": "", "waited": None}, report
        if traced:
            side = sidecar_of(tmp_path)
            execd(side)
            with open("/proc/%d/stat" % side) as f:
                assert int(f.read().rpartition(")")[2].split()[1]) != proc.pid, "the sidecar is the job's child"
            assert os.getsid(side) not in (os.getsid(proc.pid), os.getsid(0)), "the sidecar has its own session"
            assert os.readlink("/proc/%d/fd/0" % side) == os.devnull == os.readlink("/proc/%d/fd/1" % side)
            assert os.readlink("/proc/%d/fd/2" % side).endswith(".sidecar.log")
            job_pipes = {os.readlink("/proc/%d/fd/%d" % (proc.pid, n)) for n in (0, 1, 2)}
            held = {os.readlink("/proc/%d/fd/%s" % (side, n)) for n in os.listdir("/proc/%d/fd" % side)}
            assert not job_pipes & held, "the sidecar holds the job's pipes"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_sidecar_starts_when_sigchld_is_ignored(tmp_path: Path) -> None:
    """A program that ignores SIGCHLD (children reaped by the kernel): the sidecar still starts, and
    the program's ``os.wait()`` finds no child (the intermediate process is gone, not left to it)."""
    (tmp_path / "job.py").write_text(
        "import os, signal\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "import ctypes\n"
        "try:\n    os.wait(); print('a child')\nexcept ChildProcessError:\n    print('no child')\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout == "no child\n", r.stderr
    assert sidecar_of(tmp_path) and "live export off" not in r.stderr


def test_sidecar_with_stdin_and_stdout_closed(tmp_path: Path) -> None:
    """A program that closed its stdin and stdout (the pid pipe then takes their numbers): the sidecar
    still starts, detached, with /dev/null on 0 and 1."""
    (tmp_path / "job.py").write_text(
        "import os, sys\nos.close(0)\nos.close(1)\nimport ctypes\nsys.stderr.write('ok')\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "ok" in r.stderr and "live export off" not in r.stderr, r.stderr
    assert sidecar_of(tmp_path)


STARTER = """\
import json, os, sys, time
from lora_otel._boot import spawn
if sys.argv[1] == "no shell":
    spawn.SHELL = "/nonexistent/sh"  # a distroless image
path = os.path.abspath("j.otel.jsonl")
with open(path, "w") as f:
    f.write(json.dumps({"v": 1, "k": "start", "ts": time.time_ns(), "trace_id": "1" * 32, "span_id": "2" * 16,
                        "parent_id": None, "name": "process", "pid": os.getpid(), "config": {}}) + "\\n")
env = dict(os.environ)
if len(sys.argv) > 2:
    env["LORA_OTEL_SIDECAR_PYTHON"] = sys.argv[2]
print(json.dumps(spawn.start(path, os.getpid(), env)), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("how", ["shell", "no shell"])
def test_sidecar_started_by_spawn(tmp_path: Path, how: str) -> None:
    """`spawn.start` itself, with /bin/sh as the intermediate and without one (this Python then does
    its part): the sidecar runs from "/", in a session of its own, not this process's child."""
    (tmp_path / "starter.py").write_text(STARTER)
    env = clean_env(PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [PYTHON, "starter.py", how], cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        pid, why = json.loads(proc.stdout.readline())
        assert pid and why is None, why
        execd(pid)
        with open("/proc/%d/stat" % pid) as f:
            assert int(f.read().rpartition(")")[2].split()[1]) != proc.pid
        assert os.getsid(pid) not in (os.getsid(proc.pid), os.getsid(0))
        assert os.readlink("/proc/%d/cwd" % pid) == "/"
        assert sorted(os.listdir("/proc/%d/fd" % pid))[:3] == ["0", "1", "2"]
        assert os.readlink("/proc/%d/fd/2" % pid).endswith(".sidecar.log")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_sidecar_exec_failure_is_said(tmp_path: Path) -> None:
    """A LORA_OTEL_SIDECAR_PYTHON that cannot be executed (its interpreter line names nothing): without
    a shell, `spawn.start` says why at once; with one, the shell says it in the sidecar's log and the
    job's next beat says on its stderr that the sidecar is gone, naming that log."""
    bad = tmp_path / "python"
    bad.write_text("#!/nonexistent/python\n")
    bad.chmod(0o755)
    (tmp_path / "starter.py").write_text(STARTER)
    env = clean_env(PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run(
        [PYTHON, "starter.py", "no shell", str(bad)],
        cwd=tmp_path,
        env=env,
        input="\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(r.stdout) == [None, "cannot start the sidecar %s: No such file or directory" % bad]
    (tmp_path / "job.py").write_text("import lora_otel, time\nwith lora_otel.stage('work'):\n    time.sleep(3)\n")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_SIDECAR_PYTHON=str(bad)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0
    [line] = [line for line in r.stderr.splitlines() if "the sidecar" in line]
    assert "is gone" in line and ".sidecar.log" in line, r.stderr
    [log] = (tmp_path / "lora-otel").glob("*.sidecar.log")
    assert "not found" in log.read_text() or "No such file" in log.read_text()


WAITER = """\
import json, os, signal, subprocess, sys, threading, time
sigchld = []
signal.signal(signal.SIGCHLD, lambda *a: sigchld.append(1))
own = subprocess.Popen(["sleep", "1"])  # the program's own child
got = []
def waiter():  # waits for any child, as a pre-fork server or a supervisor thread does
    try:
        got.append(list(os.wait()))
    except ChildProcessError:
        got.append(None)
t = threading.Thread(target=waiter)
t.start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # until the thread is in its wait (the kernel's do_wait)
    try:
        with open("/proc/self/task/%d/wchan" % t.native_id) as f:
            if f.read() in ("do_wait", "0", ""):  # ("0": a kernel that does not say)
                break
    except OSError:
        break  # no /proc: the race is only likelier to go the program's way
    time.sleep(0.001)
import ctypes  # the process becomes a job here: its sidecar starts
t.join()
try:
    rest = list(os.waitpid(own.pid, 0))
except ChildProcessError:
    rest = None
print(json.dumps({"own": own.pid, "got": got[0], "rest": rest, "sigchld": len(sigchld)}), flush=True)
"""


def test_a_thread_waiting_for_any_child_at_the_sidecars_start(tmp_path: Path) -> None:
    """A program with a child of its own and a thread blocked in ``os.wait()`` when it becomes a
    job (the main thread's ``import ctypes``). The sidecar's intermediate (`spawn.start`), the
    job's child for a few ms, may be reaped by that thread instead of by lora_otel: the thread then
    gets a pid the program never started (exit status 0) and its own child is left to the
    program, as docs/reliability.md says; else the thread gets its own child. Either way the sidecar
    starts and the program exits 0. Without lora_otel the thread always gets its own child."""
    (tmp_path / "job.py").write_text(WAITER)
    seen = []
    for _ in range(6):
        r = subprocess.run(
            [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        side = sidecar_of(tmp_path)
        execd(side)
        if out["got"][0] == out["own"]:
            assert out["rest"] is None, out
        else:
            assert out["got"] == [out["got"][0], 0] and out["got"][0] != side and out["rest"][0] == out["own"], out
        seen.append(out["got"][0] == out["own"])
        for path in journals(tmp_path / "lora-otel"):
            path.unlink()
    print("the thread got the intermediate in %d of %d runs" % (seen.count(False), len(seen)))
    r = subprocess.run([PYTHON, "job.py"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["got"][0] == out["own"] and out["rest"] is None, r.stderr
