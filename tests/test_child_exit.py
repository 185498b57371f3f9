"""A traced process journals each child it reaps: the ``child exit`` event (issue 21 item 2).

The parent says how its child ended (exit code, signal, core dump) whatever reaped it: ``os.wait*``
called by hand, ``subprocess``, multiprocessing's ``Process`` and ``Pool``. What the wrapped call
returns or raises is the program's, unchanged.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import PYTHON, clean_env, journals

from lora_otel.analysis.ends import ChildEnd, child_ends, describe_end
from lora_otel.journal.reader import Journal, read_journal

CHILD_EXIT = "child exit"


def run(tmp_path: Path, program: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], Journal]:
    """Run ``program`` traced in ``tmp_path``; its result and the parent's journal."""
    (tmp_path / "prog.py").write_text(program)
    jdir = tmp_path / "j"
    r = subprocess.run(
        [PYTHON, str(tmp_path / "prog.py")],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(jdir)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    found = [read_journal(p) for p in journals(jdir)]
    pid_text = next((line for line in r.stdout.splitlines() if line.startswith("pid ")), None)
    assert pid_text is not None, r.stdout + r.stderr
    pid = int(pid_text.split()[1])
    parent = next(j for j in found if j.pid == pid)
    return r, parent


def events(journal: Journal) -> list[dict[str, Any]]:
    assert journal.root is not None
    return [attrs for _, name, attrs in journal.root.events if name == CHILD_EXIT]


def by_pid(journal: Journal) -> dict[int, dict[str, Any]]:
    return {attrs["child.pid"]: attrs for attrs in events(journal)}


def results(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``result {...}`` line the program printed: what the calls returned, as it saw them."""
    line = next(line for line in r.stdout.splitlines() if line.startswith("result "))
    value: dict[str, Any] = json.loads(line[len("result ") :])
    return value


@pytest.mark.slow
class TestWaitCalls:
    def test_os_waitpid_wait_wait3_wait4_waitid(self, tmp_path: Path) -> None:
        """Each of the five reaping calls journals its child, with the exit code or the exact
        signal name and core dump, and returns what the plain call returns."""
        r, parent = run(
            tmp_path,
            r"""
import json, os, signal, sys
print("pid", os.getpid(), flush=True)
def child(action):
    pid = os.fork()
    if pid == 0:
        action()
    return pid
def exit3(): os._exit(3)
def kill9(): os.kill(os.getpid(), signal.SIGKILL)
def term(): os.kill(os.getpid(), signal.SIGTERM)
def segv():
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), signal.SIGSEGV)
def exit0(): os._exit(0)
out = {}
a = child(exit3); pid, st = os.waitpid(a, 0); out["waitpid"] = [pid == a, os.waitstatus_to_exitcode(st)]
b = child(kill9); pid, st = os.wait(); out["wait"] = [pid == b, os.waitstatus_to_exitcode(st)]
c = child(term); pid, st, ru = os.wait3(0)
out["wait3"] = [pid == c, os.waitstatus_to_exitcode(st), hasattr(ru, "ru_utime")]
d = child(segv); pid, st, ru = os.wait4(d, 0); out["wait4"] = [pid == d, os.waitstatus_to_exitcode(st)]
e = child(exit0); info = os.waitid(os.P_PID, e, os.WEXITED)
out["waitid"] = [info.si_pid == e, info.si_status, info.si_code == os.CLD_EXITED]
print("result", json.dumps(out))
print("pids", a, b, c, d, e)
""",
        )
        assert r.returncode == 0, r.stderr
        out = results(r)
        assert out == {
            "waitpid": [True, 3],
            "wait": [True, -9],
            "wait3": [True, -15, True],
            "wait4": [True, -11],
            "waitid": [True, 0, True],
        }
        a, b, c, d, e = (int(x) for x in next(x for x in r.stdout.splitlines() if x.startswith("pids ")).split()[1:])
        seen = by_pid(parent)
        assert seen[a] == {"child.pid": a, "child.exit_code": 3, "child.core_dumped": False}
        assert seen[b]["child.signal"] == "SIGKILL" and "child.exit_code" not in seen[b]
        assert seen[c]["child.signal"] == "SIGTERM"
        assert seen[d]["child.signal"] == "SIGSEGV" and seen[d]["child.core_dumped"] is False
        assert seen[e] == {"child.pid": e, "child.exit_code": 0, "child.core_dumped": False}

    def test_no_child_ready_and_errors_are_unchanged(self, tmp_path: Path) -> None:
        """``WNOHANG`` with no child ready returns ``(0, 0)`` and journals nothing; ``WNOWAIT`` leaves
        the child to reap (journalled once, when reaped); a call with no child raises the same
        ``ChildProcessError``; bad arguments raise the same ``TypeError``."""
        r, parent = run(
            tmp_path,
            r"""
import json, os, time, sys
print("pid", os.getpid(), flush=True)
out = {}
rd, wr = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(rd, 1)
    os._exit(7)
out["nohang"] = list(os.waitpid(pid, os.WNOHANG))
os.write(wr, b"x")
info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
out["nowait"] = info.si_status
out["reaped"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
try:
    os.waitpid(-1, 0)
except ChildProcessError as e:
    out["echild"] = [type(e).__name__, e.errno]
try:
    os.waitpid("x", 0)
except TypeError as e:
    out["typeerror"] = str(e)
print("result", json.dumps(out))
print("child", pid)
""",
        )
        assert r.returncode == 0, r.stderr
        out = results(r)
        plain = subprocess.run(
            [PYTHON, "-c", "import os\ntry: os.waitpid('x', 0)\nexcept TypeError as e: print(e)"],
            capture_output=True,
            text=True,
            env=clean_env(),
        ).stdout.strip()
        assert out["nohang"] == [0, 0] and out["nowait"] == 7 and out["reaped"] == 7
        assert out["echild"] == ["ChildProcessError", 10]
        assert out["typeerror"] == plain
        child = int(next(x for x in r.stdout.splitlines() if x.startswith("child ")).split()[1])
        assert [attrs for attrs in events(parent) if attrs["child.pid"] == child] == [
            {"child.pid": child, "child.exit_code": 7, "child.core_dumped": False}
        ]


@pytest.mark.slow
class TestLibraries:
    def test_subprocess_run_popen_wait_and_poll(self, tmp_path: Path) -> None:
        """``subprocess.run`` (exit code 3), ``Popen.kill`` + ``wait`` (SIGKILL) and a ``poll`` loop
        (SIGTERM) each journal the child, and the return codes the program sees are unchanged."""
        r, parent = run(
            tmp_path,
            r"""
import json, os, subprocess, sys, time
print("pid", os.getpid(), flush=True)
out = {}
a = subprocess.run([sys.executable, "-c", "import sys; sys.exit(3)"])
out["run"] = a.returncode
b = subprocess.Popen(["sleep", "60"]); b.kill(); out["kill"] = b.wait()
c = subprocess.Popen(["sleep", "60"]); c.terminate()
while c.poll() is None:
    time.sleep(0.01)
out["poll"] = c.returncode
print("result", json.dumps(out))
print("pids", b.pid, c.pid)
""",
        )
        assert r.returncode == 0, r.stderr
        assert results(r) == {"run": 3, "kill": -9, "poll": -15}
        b, c = (int(x) for x in next(x for x in r.stdout.splitlines() if x.startswith("pids ")).split()[1:])
        seen = by_pid(parent)
        assert any(attrs.get("child.exit_code") == 3 for attrs in seen.values())
        assert seen[b]["child.signal"] == "SIGKILL"
        assert seen[c]["child.signal"] == "SIGTERM"

    def test_multiprocessing_process_and_pool(self, tmp_path: Path) -> None:
        """A multiprocessing ``Process`` (spawn) killed by SIGKILL, one that exits with code 4, and a
        ``Pool``'s workers (terminated when the pool closes) are each journalled by the parent."""
        r, parent = run(
            tmp_path,
            r"""
import json, os, signal, sys
import multiprocessing as mp
def die(): os.kill(os.getpid(), signal.SIGKILL)
def four(): sys.exit(4)
if __name__ == "__main__":
    print("pid", os.getpid(), flush=True)
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=die); p.start(); p.join()
    q = ctx.Process(target=four); q.start(); q.join()
    with ctx.Pool(2) as pool:
        squares = pool.map(abs, [-1, -2])
        workers = [w.pid for w in pool._pool]
    print("result", json.dumps({"p": p.exitcode, "q": q.exitcode, "squares": squares}))
    print("pids", p.pid, q.pid, *workers)
""",
        )
        assert r.returncode == 0, r.stderr
        assert results(r) == {"p": -9, "q": 4, "squares": [1, 2]}
        p, q, *workers = (int(x) for x in next(x for x in r.stdout.splitlines() if x.startswith("pids ")).split()[1:])
        seen = by_pid(parent)
        assert seen[p]["child.signal"] == "SIGKILL"
        assert seen[q]["child.exit_code"] == 4
        for worker in workers:
            assert seen[worker]["child.signal"] == "SIGTERM"


class TestEnds:
    @pytest.mark.slow
    def test_child_ends_and_describe_end(self, tmp_path: Path) -> None:
        """`child_ends` reads the events into `ChildEnd`s; `describe_end` says them in words."""
        r, parent = run(
            tmp_path,
            r"""
import os, signal
print("pid", os.getpid(), flush=True)
a = os.fork()
if a == 0:
    os.kill(os.getpid(), signal.SIGKILL)
os.waitpid(a, 0)
b = os.fork()
if b == 0:
    os._exit(3)
os.waitpid(b, 0)
print("pids", a, b)
""",
        )
        assert r.returncode == 0, r.stderr
        a, b = (int(x) for x in next(x for x in r.stdout.splitlines() if x.startswith("pids ")).split()[1:])
        ends = child_ends([parent])
        assert ends[a].signal == "SIGKILL" and ends[a].exit_code is None and ends[a].parent_pid == parent.pid
        assert ends[a].oom_killed is not True  # the cgroup's oom_kill count did not rise
        assert describe_end(ends[a]) == "killed by SIGKILL"
        assert ends[b].exit_code == 3 and ends[b].signal is None and ends[b].oom_killed is False
        assert describe_end(ends[b]) == "exited with code 3"
        assert describe_end(ChildEnd(1, 2, 0, None, "SIGKILL", False, True)) == "killed by the OOM killer (SIGKILL)"
        assert describe_end(ChildEnd(1, 2, 0, None, "SIGSEGV", True, False)) == "killed by SIGSEGV (core dumped)"

    def test_oom_killer_is_told_from_the_cgroup_count(self, tmp_path: Path) -> None:
        """A SIGKILL reaped while the memory cgroup's ``oom_kill`` count rose above the one the
        parent journaled when it became a job (or at its previous SIGKILLed reap) reads as the OOM
        killer's; one with the count unchanged stays a plain SIGKILL."""
        from conftest import JournalBuilder

        j = JournalBuilder(tmp_path / "parent.otel.jsonl")
        root = j.process(0.0)
        j.record("attrs", 0.5, span_id=root, attrs={"lora_otel.cgroup.oom_kills": 2})
        for t, pid, kills in ((1.0, 101, 3), (2.0, 102, 3)):
            j.event(
                root,
                t,
                CHILD_EXIT,
                {"child.pid": pid, "child.signal": "SIGKILL", "child.core_dumped": False, "child.oom_kills": kills},
            )
        ends = child_ends([j.read()])
        assert ends[101].oom_killed is True
        assert describe_end(ends[101]) == "killed by the OOM killer (SIGKILL)"
        assert ends[102].oom_killed is None and describe_end(ends[102]) == "killed by SIGKILL"
