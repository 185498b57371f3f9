"""Issue 37 item 1 (a poll loop): what a sleep loop polls, read from its source and its frame's
locals (`lora_otel.analysis.polling`), in milliseconds — source given as text, no process."""

from __future__ import annotations

import textwrap
from typing import Optional

import pytest

from lora_otel.analysis import polling
from lora_otel.analysis.polling import KEY, PollFrame


def frames_of(source: str, sleep_func: str, locals_: Optional[dict] = None, caller_locals: Optional[dict] = None):
    """The frames of a program sleeping in ``sleep_func`` (innermost first) and a getline over
    ``source``; the sleep frame's line is the first line of the function that calls ``sleep``."""
    lines = textwrap.dedent(source).splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def %s(" % sleep_func))
    line = next(i for i in range(start, len(lines)) if "sleep(" in lines[i]) + 1
    frames = [PollFrame("job.py", line, sleep_func, locals_ or {})]
    calls = [i + 1 for i, text in enumerate(lines) if "%s(" % sleep_func in text and "def " not in text]
    if calls:
        frames.append(PollFrame("job.py", calls[0], "<module>", caller_locals or {}))

    def getline(file: str, number: int) -> str:
        return lines[number - 1] if file == "job.py" and 0 < number <= len(lines) else ""

    return frames, getline


def read(source: str, func: str, locals_: Optional[dict] = None, caller_locals: Optional[dict] = None):
    frames, getline = frames_of(source, func, locals_, caller_locals)
    loop = polling.find_loop(frames, getline)
    assert loop is not None
    targets = polling.read_loop(loop)
    return (targets[0] if targets else None), loop


def test_file_baton_attribute_path_waits_for_it_to_go() -> None:
    target, loop = read(
        """\
        import os, time
        class FileBaton:
            def wait(self):
                while os.path.exists(self.lock_file_path):
                    time.sleep(self.wait_seconds)
        """,
        "wait",
        {"self.lock_file_path": "/c/ext/lock", "self.wait_seconds": 0.1},
    )
    assert target is not None
    assert target[:5] == ("path", "self.lock_file_path", "os.path.exists", "/c/ext/lock", "gone")
    assert target.source == "os.path.exists(self.lock_file_path)"
    assert polling.sleep_seconds(loop) == 0.1


@pytest.mark.parametrize(
    ("body", "waits"),
    [
        ("while not os.path.exists(p):\n        time.sleep(1)", "there"),
        ("while True:\n        if os.path.isfile(p):\n            break\n        time.sleep(1)", "there"),
        ("while True:\n        if not os.path.exists(p):\n            return\n        time.sleep(1)", "gone"),
        ("while os.path.exists(p) == False:\n        time.sleep(1)", "there"),
        ("for _ in range(100):\n        if Path(p).exists():\n            break\n        time.sleep(1)", "there"),
    ],
)
def test_which_way_a_path_loop_waits(body: str, waits: str) -> None:
    source = "import os, time\nfrom pathlib import Path\ndef wait(p):\n    %s\n" % body
    target, _ = read(source, "wait", {"p": "/data/ready"})
    assert target is not None
    assert (target.kind, target.value, target.waits_for) == ("path", "/data/ready", waits)


def test_a_path_built_from_locals_is_evaluated_without_calling_the_program() -> None:
    target, _ = read(
        """\
        import os, time
        def wait(root, name):
            while not os.path.exists(os.path.join(root, f"{name}.done")):
                time.sleep(2)
        """,
        "wait",
        {"root": "/out", "name": "step-7"},
    )
    assert target is not None and target.value == "/out/step-7.done"


def test_a_pid_polled_with_kill_zero_and_a_kill_that_signals_is_not_a_poll() -> None:
    target, _ = read(
        """\
        import os, time
        def wait(pid):
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
        """,
        "wait",
        {"pid": 4711},
    )
    assert target is not None and (target.kind, target.value) == ("pid", 4711)
    target, _ = read(
        "import os, time\ndef wait(pid):\n    while True:\n        os.kill(pid, 15)\n        time.sleep(1)\n",
        "wait",
        {"pid": 4711},
    )
    assert target is None or target.kind != "pid" or target.call != "os.kill"


def test_a_proc_path_is_a_pid() -> None:
    target, _ = read(
        'import os, time\ndef wait(pid):\n    while os.path.exists("/proc/%d" % pid):\n        time.sleep(1)\n',
        "wait",
        {"pid": 4711},
    )
    assert target is not None and target.kind == "pid"
    target, _ = read(
        'import os, time\ndef wait(pid):\n    while os.path.exists(f"/proc/{pid}"):\n        time.sleep(1)\n',
        "wait",
        {"pid": 4711},
    )
    assert target is not None and (target.kind, target.value, target.waits_for) == ("pid", 4711, "gone")


def test_a_connect_retry_loop_polls_the_port() -> None:
    target, _ = read(
        """\
        import socket, time
        def wait_server(host, port):
            while True:
                try:
                    socket.create_connection((host, port), timeout=1).close()
                    return
                except OSError:
                    time.sleep(1)
        """,
        "wait_server",
        {"host": "127.0.0.1", "port": 8765},
    )
    assert target is not None and (target.kind, target.value, target.host) == ("port", 8765, "127.0.0.1")


def test_a_url_and_a_flag() -> None:
    target, _ = read(
        """\
        import time, urllib.request
        def wait(url):
            while True:
                try:
                    urllib.request.urlopen(url)
                    break
                except OSError:
                    time.sleep(1)
        """,
        "wait",
        {"url": "http://localhost:7860/ready"},
    )
    assert target is not None and (target.kind, target.host) == ("url", "localhost:7860")
    target, _ = read(
        "import time\nclass W:\n    def wait(self):\n        while not self.done:\n            time.sleep(1)\n",
        "wait",
        {"self.done": False},
    )
    assert target is not None and (target.kind, target.value) == ("flag", False)


def test_a_sleep_in_a_helper_reads_the_callers_loop() -> None:
    lines = textwrap.dedent(
        """\
        import os, time
        def backoff(n):
            time.sleep(min(2**n, 30))
        def main(path):
            n = 0
            while not os.path.exists(path):
                backoff(n)
                n += 1
        main("/x/ready")
        """
    ).splitlines(keepends=True)
    frames = [
        PollFrame("job.py", 3, "backoff", {"n": 3}),
        PollFrame("job.py", 7, "main", {"path": "/x/ready", "n": 3}),
        PollFrame("job.py", 9, "<module>", {}),
    ]
    loop = polling.find_loop(frames, lambda f, n: lines[n - 1] if 0 < n <= len(lines) else "")
    assert loop is not None and loop.frame.func == "main"
    [target] = polling.read_loop(loop)
    assert (target.kind, target.value, target.waits_for) == ("path", "/x/ready", "there")


def test_no_loop_no_reading() -> None:
    lines = ["import time\n", "def f():\n", "    time.sleep(100)\n", "f()\n"]
    frames = [PollFrame("job.py", 3, "f", {}), PollFrame("job.py", 4, "<module>", {})]
    assert polling.find_loop(frames, lambda f, n: lines[n - 1] if 0 < n <= len(lines) else "") is None


def test_a_loop_using_a_path_through_a_call_of_its_own_falls_back_on_the_names() -> None:
    target, _ = read(
        "import time\ndef wait(path):\n    while not ready(path):\n        time.sleep(1)\n",
        "wait",
        {"path": "/data/shard-0.done"},
    )
    assert target is not None and (target.kind, target.value, target.call) == ("path", "/data/shard-0.done", "")


# --- the sentence and the advice ------------------------------------------------------------------

BASE = {
    KEY + "kind": "path",
    KEY + "expr": "self.lock_file_path",
    KEY + "call": "os.path.exists",
    KEY + "where": "file_baton.py:42 in wait",
    KEY + "every_s": 0.1,
    KEY + "waits_for": "gone",
    KEY + "value": "/c/ext/lock",
    KEY + "exists": True,
    KEY + "type": "file",
    KEY + "size": 0,
    KEY + "owner": "ann",
    KEY + "owner_uid": 1000,
    KEY + "job_uid": 1000,
}


def test_a_lock_file_nobody_has_open_is_a_leftover_to_remove() -> None:
    said, advice = polling.sentence(BASE)
    assert said.startswith(
        "The main thread polls for /c/ext/lock to disappear (os.path.exists(self.lock_file_path) at "
        "file_baton.py:42 in wait, every 0.1 s); the file exists (empty, owner ann) and no process has it open"
    )
    assert advice.startswith("Remove /c/ext/lock (no process has it open")


def test_no_advice_without_the_evidence_for_it() -> None:
    held = {**BASE, KEY + "open_by": ["pid 4711 (python build.py)"]}
    said, advice = polling.sentence(held)
    assert "held open by pid 4711 (python build.py)" in said and "Remove" not in advice
    unknown = {**BASE, KEY + "open_by_error": "cannot read /proc"}
    said, advice = polling.sentence(unknown)
    assert "no process this user can see has it open (cannot read /proc)" in said
    assert "no process has it open" not in said and not advice.startswith("Remove")
    assert advice.startswith("See who has /c/ext/lock open (as root: fuser -v /c/ext/lock)")
    not_a_lock = {**BASE, KEY + "value": "/data/pause"}
    assert polling.sentence(not_a_lock)[1] == ""
    no_value = {k: v for k, v in BASE.items() if k != KEY + "value"}
    said, advice = polling.sentence(no_value)
    assert "which path is not known" in said and advice == ""


def test_a_zombie_pid_and_a_port_nobody_listens_on() -> None:
    zombie = {
        KEY + "kind": "pid",
        KEY + "expr": "pid",
        KEY + "call": "os.kill",
        KEY + "where": "job.py:6 in wait",
        KEY + "waits_for": "gone",
        KEY + "value": 4711,
        KEY + "pid_state": "zombie",
        KEY + "pid_parent": 4700,
    }
    said, advice = polling.sentence(zombie)
    assert "pid 4711 has ended, but its parent, pid 4700, has not collected its exit status (reaped it)" in said
    assert advice.startswith("Reap the child")
    port = {
        KEY + "kind": "port",
        KEY + "expr": "host, port",
        KEY + "call": "socket.create_connection",
        KEY + "where": "job.py:5 in wait_server",
        KEY + "value": 8765,
        KEY + "address": "127.0.0.1:8765",
        KEY + "port": 8765,
        KEY + "listening": False,
    }
    said, advice = polling.sentence(port)
    assert said.endswith("nothing listens on port 8765 on this machine.")
    assert "port 8765" in advice
    remote = {**port, KEY + "remote": True, KEY + "address": "10.1.2.3:8765"}
    del remote[KEY + "listening"]
    assert polling.sentence(remote)[1] == ""


def test_a_lock_on_a_shared_file_system_is_not_called_a_leftover() -> None:
    said, advice = polling.sentence({**BASE, KEY + "shared_fs": "nfs4 at /mnt/cache"})
    assert "no process has it open on this machine, but it is on a file system other machines may share" in said
    assert "leftover" not in said
    assert advice.startswith("If no job on another machine that mounts /mnt/cache is using /c/ext/lock")


def test_shared_fs_reads_the_mount_the_path_is_on(tmp_path) -> None:
    import os

    from lora_otel.analysis import pollfacts

    assert pollfacts.shared_fs(os.getpid(), str(tmp_path)) == ""  # (a local disk or tmpfs here)


def test_a_folder_polled_claims_nothing_about_who_has_it_open() -> None:
    said, advice = polling.sentence({**BASE, KEY + "type": "dir", KEY + "value": "/c/ext/build.lock"})
    assert said.endswith("a folder exists (owner ann).") and advice == ""


@pytest.mark.parametrize(
    "body",
    [
        "for f in files:\n        os.stat(f)\n        shutil.copy(f, dst)\n        time.sleep(0.1)",
        "while True:\n        print(open(log).read())\n        time.sleep(5)",
        "for path in paths:\n        upload(path)\n        time.sleep(1)",
    ],
)
def test_a_loop_doing_work_with_a_path_is_not_a_poll(body: str) -> None:
    source = "import os, shutil, time\ndef wait(files, dst, log, paths):\n    %s\n" % body
    frames, getline = frames_of(source, "wait", {"f": "/data/a.jpg", "log": "/x/log", "path": "/data/b.jpg"})
    loop = polling.find_loop(frames, getline)
    assert loop is not None and polling.read_loop(loop) == []


def test_an_assigned_outcome_the_test_reads_is_a_poll() -> None:
    target, _ = read(
        """\
        import socket, time
        def wait(port):
            while True:
                s = socket.socket()
                err = s.connect_ex(("localhost", port))
                s.close()
                if err == 0:
                    break
                time.sleep(1)
        """,
        "wait",
        {"port": 29500},
    )
    assert target is not None and (target.kind, target.value, target.host) == ("port", 29500, "localhost")


def test_the_last_dump_is_the_beats_after_py_spys(tmp_path, monkeypatch) -> None:
    """py-spy's dump (native thread ids) then the beat's (Python's idents, with locals): inspect
    reads the last one only."""
    import os

    from lora_otel.analysis import verdict

    text = (
        "Current thread 0x0000000000001585 (most recent call first):\n"
        '  File "/x/file_baton.py", line 50 in wait\n\n'
        "Current thread 0x00007fb23d883b80 (most recent call first):\n"
        '  File "/x/file_baton.py", line 50 in wait\n'
        "    local self.lock_file_path = '/x/lock'\n"
        '  File "/x/job.py", line 6 in <module>\n'
    )
    path = tmp_path / "s.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(verdict, "_open_stacks", lambda journal: (str(path), os.open(path, os.O_RDONLY)))
    dump = verdict.last_dump(None)
    assert dump.startswith("Current thread 0x00007fb23d883b80") and dump.count("Current thread") == 1


def test_pauses() -> None:
    assert polling.pauses("        time.sleep(self.wait_seconds)\n") == "sleep"
    assert polling.pauses("        if stop.wait(0.5):\n") == "wait"
    assert polling.pauses("        signaled = self._cond.wait(timeout)\n") == "wait"
    assert polling.pauses("        done.wait()\n") == ""  # (no timeout: a wait, not a pace)
    assert polling.pauses("        x = compute()\n") == ""


def test_a_flag_paced_by_a_timed_wait_is_left_to_the_thread_locks_rule() -> None:
    from lora_otel.analysis.diagnose import explain
    from lora_otel.analysis.evidence import PREFIX
    from lora_otel.analysis.stall import Stall
    from lora_otel.journal.records import Span

    stall = Stall("alive", Span("load model", "a" * 16, None, "b" * 32, 1), 30.0, 2.0, "")
    base = {
        PREFIX + "process.state": "S (sleeping)",
        PREFIX + "process.wait_channel": "futex_wait_queue",
        KEY + "paced_by": "wait",
        KEY + "where": "job.py:5 in wait_ready",
    }
    path = {**base, KEY + "kind": "path", KEY + "value": "/x/ready", KEY + "exists": False, KEY + "waits_for": "there"}
    assert explain(stall, path).attrs["lora_otel.diagnosis.rule"] == "poll loop"
    flag = {**base, KEY + "kind": "flag", KEY + "expr": "self.done", KEY + "value": False}
    assert explain(stall, flag).attrs["lora_otel.diagnosis.rule"] != "poll loop"
    frozen = Stall("frozen", stall.span, 30.0, 2.0, "")
    assert explain(frozen, path).attrs["lora_otel.diagnosis.rule"] != "poll loop"


def test_a_librarys_loop_that_polls_nothing_gives_way_to_the_programs() -> None:
    queue_py = [
        "def get(self, block=True, timeout=None):\n",
        "    while not self._qsize():\n",
        "        remaining = endtime - time()\n",
        "        self.not_empty.wait(remaining)\n",
    ]
    job = [
        "import os, queue\n",
        "def wait(q, flag):\n",
        "    while not os.path.exists(flag):\n",
        "        try:\n",
        "            return q.get(timeout=1)\n",
        "        except queue.Empty:\n",
        "            pass\n",
    ]
    files = {"queue.py": queue_py, "job.py": job}
    frames = [PollFrame("queue.py", 4, "get", {"remaining": 0.5}), PollFrame("job.py", 5, "wait", {"flag": "/x/stop"})]
    loops = polling.find_loops(frames, lambda f, n: files[f][n - 1] if 0 < n <= len(files[f]) else "")
    assert [loop.frame.func for loop in loops] == ["get", "wait"]
    assert polling.read_loop(loops[0]) == []
    [target] = polling.read_loop(loops[1])
    assert (target.kind, target.value, target.waits_for) == ("path", "/x/stop", "there")
