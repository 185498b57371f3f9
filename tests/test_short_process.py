"""Free where processes are short (issue 20, item 6): a process is a job — a sidecar, a stack dump,
the environment self-check and its lines — only once it lives to its first beat, imports a heavy
framework, opens a stage or was started to be watched; a fork that exits at once leaves nothing;
an idle process's journal grows by touches, not records. Each case runs a real traced process.

Journals are put in ``LORA_OTEL_DIR`` (``tmp/j``) so that every file a case leaves can be counted;
the journal of a short process that ends normally is not relied upon (it may be removed at exit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import LINE_RE, PYTHON, clean_env, journals, wait_for

from lora_otel.analysis.stall import detect
from lora_otel.export.watchdog import append_record
from lora_otel.journal.reader import read_journal


def env(tmp_path: Path, **extra: str) -> dict:
    return clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), **extra)


def lora_lines(text: str) -> list[str]:
    import re

    return [m.group(3) for m in (re.match(LINE_RE, line) for line in text.splitlines()) if m]


def files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def roots(tmp_path: Path) -> list:
    """The root spans of the journals written so far; a journal caught between its creation and
    its first record (a promotion writes the file, then the buffered records) has none yet."""
    found = (read_journal(p).root for p in journals(tmp_path / "j"))
    return [root for root in found if root is not None]


@pytest.mark.slow
class TestShortProcess:
    def test_python_c_pass_says_nothing_and_starts_no_sidecar(self, tmp_path: Path) -> None:
        """``python -c pass``: nothing on stderr (its ``started`` line waits for a beat it never
        lives to: issue 36 item 9), no sidecar and none of its files (log, children registry), no
        stacks file (before: seven lines, and a sidecar per process)."""
        r = subprocess.run(
            [PYTHON, "-c", "pass"],
            cwd=tmp_path,
            env=env(tmp_path, LORA_OTEL_BEAT_S="10"),  # a loaded machine never makes it live a beat
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
        left = files(tmp_path / "j") if (tmp_path / "j").exists() else []
        assert not [f for f in left if not f.endswith(".otel.jsonl")], left

    def test_pip_version_is_no_job(self, tmp_path: Path) -> None:
        """``pip --version`` (a real short tool of the environment): its own output untouched, no
        line of lora_otel's, no sidecar."""
        # a beat of 10 s: pip takes 0.4 s alone but 1.5 s was seen in a full suite on 2 loaded cores,
        # past the default 1 s beat that promotes any process living that long (a real job then)
        r = subprocess.run(
            [PYTHON, "-m", "pip", "--version"],
            cwd=tmp_path,
            env=env(tmp_path, LORA_OTEL_BEAT_S="10"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0 and r.stdout.startswith("pip "), r.stderr
        assert lora_lines(r.stderr) == [], r.stderr
        assert not list((tmp_path / "j").glob("*.sidecar.log"))

    def test_a_short_failure_keeps_its_facts_in_the_journal(self, tmp_path: Path) -> None:
        """A short process that dies of an uncaught exception: nothing of lora_otel's on the
        terminal, after the program's own traceback (issue 36 item 9); its journal gets what a
        job's start-up says (argv, the environment check) and its end, for the post-mortem, still
        without a sidecar."""
        r = subprocess.run(
            [PYTHON, "-c", "raise SystemError('boom')", "--name", "x"],
            cwd=tmp_path,
            env=env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1
        assert lora_lines(r.stderr) == [] and r.stderr.rstrip().endswith("SystemError: boom"), r.stderr
        [path] = journals(tmp_path / "j")
        j = read_journal(path)
        assert j.exit["code"] == 1 and any(ln.msg.startswith("exiting: uncaught SystemError") for ln in j.lines)
        assert j.root.attrs["process.command_args"][-2:] == ["--name", "x"]
        assert any(ln.msg.startswith("environment: Python ") for ln in j.lines)
        assert "lora_otel.sidecar.pid" not in j.root.attrs and not j.root.attrs.get("lora_otel.promoted")

    def test_65000_bytes_into_a_pipe_read_after_the_job_ends(self, tmp_path: Path) -> None:
        """A job writes 65,000 bytes to stdout and stderr, both one 64 KiB pipe that its launcher
        reads only after the job has ended: it finishes, as it does without lora_otel (before, the
        864 bytes of start-up lines filled the pipe and the job blocked for ever)."""
        read_end, write_end = os.pipe()
        try:
            proc = subprocess.Popen(
                [PYTHON, "-c", "import os\nos.write(1, b'x' * 65000)\n"],
                cwd=tmp_path,
                env=env(tmp_path),
                stdout=write_end,
                stderr=write_end,
                stdin=subprocess.DEVNULL,
            )
            os.close(write_end)
            write_end = -1
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail("the job blocked on a full pipe")
            data = b""
            while chunk := os.read(read_end, 1 << 16):
                data += chunk
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        assert rc == 0
        assert data.count(b"x") >= 65000
        assert len(data) <= 65536


@pytest.mark.slow
class TestPromotion:
    def test_a_stage_makes_a_job(self, tmp_path: Path) -> None:
        """A program that opens a stage is a job from then on, however short: the sidecar, the
        start-up lines on the terminal (argv, cwd, environment), the process attributes, and the
        reason in the journal (``lora_otel.promoted``)."""
        (tmp_path / "job.py").write_text("import lora_otel\nwith lora_otel.stage('load'):\n    pass\n")
        r = subprocess.run(
            [PYTHON, "job.py", "--lr", "1"], cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        lines = lora_lines(r.stderr)
        assert lines[0].startswith("started pid ") and "argv: job.py --lr 1" in lines, lines
        assert any(m.startswith("environment: Python ") for m in lines) and lines[-1].startswith("exiting normally")
        [root] = roots(tmp_path)
        assert root.attrs["lora_otel.promoted"] == "stage load"
        assert root.attrs["lora_otel.sidecar.pid"] and root.attrs["process.command_args"][-2:] == ["--lr", "1"]

    def test_the_first_beat_makes_a_job(self, tmp_path: Path) -> None:
        """A process that lives to its first beat is a job: promoted ``first beat``, watched by a
        sidecar, its stack dump registered."""
        proc = subprocess.Popen(
            [PYTHON, "-c", "import time\ntime.sleep(60)\n"],
            cwd=tmp_path,
            env=env(tmp_path, LORA_OTEL_BEAT_S="0.2"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            root = wait_for(
                # (the promotion and the sidecar's pid are two records: both, whichever is read first)
                lambda: [
                    r
                    for r in roots(tmp_path)
                    if r.attrs.get("lora_otel.sidecar.pid") and "lora_otel.promoted" in r.attrs
                ],
                what="the sidecar of a process that lived a beat",
            )[0]
            assert root.attrs["lora_otel.promoted"] == "first beat"
            assert root.attrs["lora_otel.stacks.signal"]
        finally:
            proc.kill()
            proc.wait(timeout=10)

    @pytest.mark.parametrize(
        ("module", "body", "reason"),
        [
            ("vllm", "import time\ntime.sleep(0.01)\nimport ctypes\nctypes.PyDLL(None).pause()\n", "import vllm"),
            ("frozenmod", "import ctypes\nctypes.PyDLL(None).pause()\n", "import ctypes"),
        ],
        ids=["a heavy framework", "ctypes by the program's own code"],
    )
    def test_a_job_frozen_in_its_first_second_is_caught(
        self, tmp_path: Path, module: str, body: str, reason: str
    ) -> None:
        """A job that holds the GIL in C within its first second — before any beat — is still
        caught: the import of a heavy framework, or the program's own ``import ctypes``, made it a
        job before it ran, so its watchdog writes the STALLED line for it."""
        (tmp_path / (module + ".py")).write_text(body)
        (tmp_path / "job.py").write_text("import %s\n" % module)
        with open(tmp_path / "log.txt", "wb") as out:
            proc = subprocess.Popen(
                [PYTHON, "job.py"],
                cwd=tmp_path,
                env=env(tmp_path, LORA_OTEL_FROZEN_AFTER="2"),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            line = wait_for(
                lambda: [x for x in (tmp_path / "log.txt").read_text(errors="replace").splitlines() if "STALLED" in x],
                timeout=40,
                what="the STALLED line",
            )[0]
            assert "frozen" in line, line
            [root] = roots(tmp_path)
            assert root.attrs["lora_otel.promoted"] == reason
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def test_a_library_importing_ctypes_is_no_job(self, tmp_path: Path) -> None:
        """``ctypes`` loaded by the standard library or an installed package (here
        ``multiprocessing.sharedctypes``, as numpy does) is not the program calling C by hand: no
        job for it, no line on the terminal."""
        r = subprocess.run(
            [PYTHON, "-c", "import multiprocessing.sharedctypes, sys\nassert 'ctypes' in sys.modules\n"],
            cwd=tmp_path,
            env=env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert lora_lines(r.stderr) == [], r.stderr
        assert not list((tmp_path / "j").glob("*.sidecar.log"))

    def test_lora_otel_run_makes_a_job_at_once(self, tmp_path: Path) -> None:
        """``lora-otel run -- python -c pass``: started to be watched, a job from its first
        instruction (``lora_otel.promoted`` = ``lora-otel run``, a sidecar) however short."""
        r = subprocess.run(
            [
                PYTHON,
                "-m",
                "lora_otel",
                "run",
                "--journal",
                str(tmp_path / "j" / "run.otel.jsonl"),
                "--",
                PYTHON,
                "-c",
                "pass",
            ],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        root = read_journal(tmp_path / "j" / "run.otel.jsonl").root
        assert root.attrs["lora_otel.promoted"] == "lora-otel run" and root.attrs["lora_otel.sidecar.pid"]


FORKS = """
import os, sys, time, lora_otel
with lora_otel.stage("fork them"):
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    pid = os.fork()
    if pid == 0:  # a worker that lives: it gets a journal, a beat, a job's watch
        time.sleep(1.5)
        os._exit(0)
    os.waitpid(pid, 0)
print("DONE", flush=True)
"""


@pytest.mark.slow
def test_forks_that_exit_at_once_leave_no_file_those_that_live_are_watched(tmp_path: Path) -> None:
    """Twenty ``os.fork()`` + ``os._exit(0)`` leave no file; a forked worker that lives past its
    first beat has its journal — its root under the stage that forked it — and joins the job's
    sidecar (before: two files per fork)."""
    (tmp_path / "job.py").write_text(FORKS)
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=env(tmp_path, LORA_OTEL_BEAT_S="0.2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "DONE\n", r.stderr
    js = [read_journal(p) for p in journals(tmp_path / "j")]
    assert len(js) == 2, [j.path for j in js]
    [parent] = [j for j in js if j.root.parent_id is None]
    [worker] = [j for j in js if j is not parent]
    stage = next(s for s in parent.spans if s.name == "fork them")
    assert worker.root.parent_id == stage.span_id and worker.exit is not None and worker.exit["code"] == 0
    assert worker.root.attrs["lora_otel.promoted"] == "first beat"
    assert worker.root.attrs["lora_otel.sidecar.pid"] == parent.root.attrs["lora_otel.sidecar.pid"]
    assert len(list((tmp_path / "j").glob("*.stacks.txt"))) == 2  # one per job, none per short fork


class TestIdleJournal:
    @pytest.mark.slow
    def test_an_idle_process_touches_its_journal_instead_of_growing_it(self, tmp_path: Path) -> None:
        """An idle process (its main thread in ``time.sleep``): after the first beats, a beat that
        changes nothing writes no record — the journal's modification time moves instead — and a
        record at most every 60 beats; it is not frozen. Stopped (SIGSTOP), neither moves: frozen.
        (Before: a record every beat, 0.5 MB an hour.)"""
        proc = subprocess.Popen(
            [PYTHON, "-c", "import time\ntime.sleep(600)\n"],
            cwd=tmp_path,
            env=env(tmp_path, LORA_OTEL_BEAT_S="0.05"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            path = wait_for(lambda: journals(tmp_path / "j"), what="the journal")[0]
            wait_for(lambda: read_journal(path).beats >= 2, what="the first beats")
            time.sleep(4.0)  # 80 beats of 50 ms
            beats = [json.loads(x) for x in path.read_text().splitlines() if '"k":"beat"' in x]
            assert 2 <= len(beats) <= 5, len(beats)  # the first two, then one each 60 beats
            j = read_journal(path)
            assert j.touched_ns > beats[-1]["ts"] and j.last_life_ns > beats[-1]["ts"]
            assert detect(j, time.time_ns(), alive=True, frozen_after_s=1) is None
            size = path.stat().st_size
            os.kill(proc.pid, signal.SIGSTOP)
            stall = wait_for(
                lambda: detect(read_journal(path), time.time_ns(), alive=True, frozen_after_s=1),
                what="frozen once stopped",
                timeout=15,
            )
            assert stall.kind == "frozen" and path.stat().st_size == size
            os.kill(proc.pid, signal.SIGCONT)
            wait_for(
                lambda: detect(read_journal(path), time.time_ns(), alive=True, frozen_after_s=1) is None,
                what="alive again",
                timeout=15,
            )
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)

    def test_a_touch_after_the_readers_clock_is_life_not_another_clock(self, tmp_path: Path) -> None:
        """A beat that touches the journal between the reader taking its time and reading the file
        leaves a modification time just after the reader's ``now``: the process is alive now, not
        silent since its last record (before: ``frozen: no beat for 0 ms`` in inspect and watch for
        an idle job waiting on its pool)."""
        start = time.time_ns() - 600 * 10**9
        rec = {
            "v": 1,
            "k": "start",
            "ts": start,
            "trace_id": "1" * 32,
            "span_id": "2" * 16,
            "parent_id": None,
            "name": "process",
            "pid": os.getpid(),
            "config": {"beat_s": 1.0, "beat_record_every": 60},
            "attrs": {},
        }
        path = tmp_path / "touched.otel.jsonl"
        path.write_text(json.dumps(rec) + "\n")
        touched = start + 5 * 10**9  # the last beat touched the file 5 s after its last record
        os.utime(path, ns=(touched, touched))
        j = read_journal(path)
        assert detect(j, touched - 200_000_000, alive=True, frozen_after_s=3) is None
        late = start + 100 * 10**9  # the touch window (120 s) holds: life at +5 s, silent 95 s
        frozen = detect(j, late, alive=True, frozen_after_s=3)
        assert frozen is not None and frozen.kind == "frozen"

    def test_the_watchdogs_record_leaves_the_modification_time(self, tmp_path: Path) -> None:
        """The watchdog appending its ``stall`` record does not move the journal's modification time,
        the job's own sign of life (else a frozen job would look alive right after being called
        frozen)."""
        path = tmp_path / "x.otel.jsonl"
        path.write_text('{"v":1,"k":"beat","ts":1,"steps":0,"last_step_ts":null}\n')
        os.chmod(path, 0o600)
        past = time.time_ns() - 3_600 * 10**9
        os.utime(path, ns=(past, past))
        assert append_record(str(path), {"v": 1, "k": "line", "ts": 2, "level": "info", "msg": "x"}) == ""
        assert path.stat().st_mtime_ns == past and path.read_text().count("\n") == 2

    def test_a_copied_journal_does_not_seem_to_live_on(self, tmp_path: Path) -> None:
        """A journal's modification time counts as a sign of life only up to two beat-record periods
        past its last record: a copy made an hour later does not make a dead process live longer."""
        start = time.time_ns() - 7_200 * 10**9
        rec = {
            "v": 1,
            "k": "start",
            "ts": start,
            "trace_id": "1" * 32,
            "span_id": "2" * 16,
            "parent_id": None,
            "name": "process",
            "pid": 1,
            "config": {"beat_s": 1.0, "beat_record_every": 60},
            "attrs": {},
        }
        path = tmp_path / "copy.otel.jsonl"
        path.write_text(json.dumps(rec) + "\n")
        j = read_journal(path)  # written now: its modification time is two hours after its record
        assert j.touched_ns > start + 7_000 * 10**9
        assert j.last_life_ns == start + 120 * 10**9


FORK_TREE = """\
import os, sys
def tree(depth):  # each node forks two children at once; half end with os._exit, half with sys.exit
    kids = []
    for i in range(2):
        pid = os.fork()
        if pid == 0:
            if depth > 0:
                tree(depth - 1)
            if i == 0:
                os._exit(0)
            sys.exit(0)
        kids.append(pid)
    for pid in kids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
tree(3)
print("tree ok", flush=True)
"""


@pytest.mark.slow
def test_a_tree_of_short_forks_leaves_nothing(tmp_path: Path) -> None:
    """A tree of forks that each reap their own children and end at once, all exit 0: no journal
    is left (a hostile trial: 15 of them at depth 3 — each kept because a sibling's journal, just
    created and still empty, was taken for one of its own children's)."""
    (tmp_path / "tree.py").write_text(FORK_TREE, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "tree.py"],
        cwd=tmp_path,
        env=env(tmp_path, LORA_OTEL_KEEP_SHORT=""),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout == "tree ok\n", r.stderr
    left = files(tmp_path / "j") if (tmp_path / "j").exists() else []
    assert left == [], left
