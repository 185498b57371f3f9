"""Issue 13, VIEWS: ``inspect`` and ``watch`` lead with the stall and its one-sentence diagnosis;
the front door (bad settings, the ``--log`` path, files that are not journals, wording).

Real traced processes launched as a user launches them (``LORA_OTEL=1``, stdout and stderr into a
file). Until the watchdog writes ``stall`` records for every job (the WATCHDOG theme), the views
compute the diagnosis themselves for a live stalled process; where the diagnosis needs the
process's Python stacks, the test makes the stack request the watchdog makes at a stall
(`evidence.python_stacks` after `evidence.stack_request`'s checks) — inspect itself never signals.
Hand-written journals only where a real process cannot produce the state (a ``stall`` record before
the watchdog writes them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import JournalBuilder
from procs import PYTHON, clean_env, journals, lora_otel_cli, start_torchrun, wait_for

from lora_otel.analysis.evidence import python_stacks, stack_request
from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

TORCH_TRAIN_START = """\
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def launch(tmp_path: Path, source: str, **env: str) -> subprocess.Popen:
    """``python job.py`` as a launcher starts it: LORA_OTEL=1, stdout and stderr into log.txt."""
    (tmp_path / "job.py").write_text(source)
    out = open(tmp_path / "log.txt", "wb")  # noqa: SIM115 - the job's stdout and stderr, closed after it
    e = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), OMP_NUM_THREADS="1", **env)
    proc = subprocess.Popen(
        [PYTHON, "job.py"], cwd=tmp_path, env=e, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    out.close()
    return proc


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)


def main_journal(tmp_path: Path, pid: int):
    return wait_for(
        lambda: next((j for j in map(read_journal, journals(tmp_path / "j")) if j.pid == pid), None),
        what="the job's journal",
    )


def open_span(tmp_path: Path, pid: int, name: str):
    def find():
        j = read_journal(main_journal(tmp_path, pid).path)
        return j if any(s.name == name and s.is_open for s in j.spans) else None

    return wait_for(find, timeout=60, what="an open %r span" % name)


def request_stacks(journal) -> None:
    """The stack request the watchdog makes at a stall (verified by `stack_request`)."""
    request = stack_request(journal)
    assert request is not None and request.refusal is None, request
    assert "lora_otel.evidence.python.stacks" in python_stacks(journal.pid, request, py_spy=False)


def inspect(*args: str, **env: str) -> subprocess.CompletedProcess:
    return lora_otel_cli("inspect", *args, **env)


# --- 6. every view shows the diagnosis ------------------------------------------------------------


@pytest.mark.torch
def test_dataloader_worker_that_never_returns_a_sample_is_named(tmp_path: Path) -> None:
    """A DataLoader worker hangs on one sample after training started: ``inspect DIR`` and
    ``watch --once`` lead with the stall of training and name the worker's pid."""
    pytest.importorskip("torch")
    job = launch(
        tmp_path,
        TORCH_TRAIN_START.split("for _")[0]
        + textwrap.dedent("""\
        import os, time
        from torch.utils.data import DataLoader, Dataset

        class Samples(Dataset):
            def __len__(self):
                return 400

            def __getitem__(self, i):
                if i == 40:
                    open("hung.pid", "w").write(str(os.getpid()))
                    time.sleep(600)
                return torch.ones(4)

        for batch in DataLoader(Samples(), batch_size=4, num_workers=2):
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()
        """),
    )
    try:
        journal = open_span(tmp_path, job.pid, "training")
        hung = int(
            wait_for(
                lambda: (tmp_path / "hung.pid").exists() and (tmp_path / "hung.pid").read_text(),
                what="the worker to hang",
            )
        )
        time.sleep(3.5)  # past the 3 s limit
        request_stacks(journal)
        r = inspect(str(tmp_path / "j"), "--stall-after", "training=3")
        assert r.returncode == 0, r.stderr
        stalled = [line for line in r.stdout.splitlines() if line.startswith("STALLED: ")]
        assert stalled and stalled[0].startswith("STALLED: training: no optimizer step for "), r.stdout
        assert "DataLoader" in stalled[0] and "worker pid %d" % hung in stalled[0], r.stdout
        w = lora_otel_cli("watch", "--once", "--stall-after", "training=3", str(tmp_path / "j"))
        assert w.returncode == 3, (w.stdout, w.stderr)
        assert "worker pid %d" % hung in w.stdout, w.stdout
    finally:
        stop(job)


def _deadlock_source() -> str:
    return TORCH_TRAIN_START + textwrap.dedent("""\
        import threading, time
        lock_a, lock_b = threading.Lock(), threading.Lock()

        def worker():
            with lock_b:
                time.sleep(0.5)
                with lock_a:
                    pass

        with lock_a:
            threading.Thread(target=worker, daemon=True).start()
            time.sleep(0.5)
            with lock_b:
                pass
        """)


@pytest.mark.torch
def test_two_lock_deadlock_names_the_threads_and_locks(tmp_path: Path) -> None:
    """Two threads each hold the lock the other waits for, after training started: inspect's
    second line calls it a deadlock, naming both threads, their lock waits and where."""
    pytest.importorskip("torch")
    source = _deadlock_source()
    job = launch(tmp_path, source)
    lines = source.splitlines()
    main_at = lines.index("    with lock_b:", lines.index("with lock_a:")) + 1
    worker_at = lines.index("        with lock_a:") + 1
    try:
        journal = open_span(tmp_path, job.pid, "training")
        time.sleep(2)
        request_stacks(journal)
        # the limit is max(3 s, 20x the median step time the beats saw)
        r = wait_for(
            lambda: (r := inspect(journal.path, "--stall-after", "training=3")).stdout.startswith("stuck") and r,
            timeout=40,
            what="the stall",
        )
        assert r.returncode == 0, r.stderr
        first, second = r.stdout.splitlines()[:2]
        assert first.startswith("stuck in training for "), r.stdout
        assert second.startswith("STALLED: training: no optimizer step for "), r.stdout
        assert (
            "— Deadlock: the main thread waits in lock_b.acquire at job.py:%d in <module> holding lock_a "
            "(lock_b is held by thread worker()); thread worker() waits in lock_a.acquire at job.py:%d in worker "
            "holding lock_b (lock_a is held by the main thread)." % (main_at, worker_at)
        ) in second, second
        # the stacks file is shown, the main thread first
        at = r.stdout.index("stacks (last dump in ")
        assert r.stdout[at:].splitlines()[1] == "  main thread:", r.stdout[at:]
    finally:
        stop(job)


class QuietServer:
    """A TCP server that accepts and never sends a byte (a download frozen at 0 B/s)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            self.conns.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


def test_network_read_frozen_at_zero_bytes_names_host_port(tmp_path: Path) -> None:
    """A download stage reading from a server that sends nothing: inspect says which host:port
    has gone quiet (0 B/s) and for how long."""
    server = QuietServer()
    job = launch(
        tmp_path,
        textwrap.dedent(
            """\
        import socket
        import lora_otel
        with lora_otel.stage("download"):
            socket.create_connection(("127.0.0.1", %d)).recv(1)
        """
            % server.port
        ),
    )
    try:
        journal = open_span(tmp_path, job.pid, "download")
        time.sleep(2.5)
        r = inspect(journal.path, "--stall-after", "download=2")
        assert r.returncode == 0, r.stderr
        second = r.stdout.splitlines()[1]
        assert second.startswith("STALLED: download open for "), r.stdout
        # A local peer is a process: the descriptor wait names the connection and who holds its other
        # end (this test's own process); a remote one is the network rule's "has gone quiet".
        assert re.search(
            r"Waiting on the network: 127\.0\.0\.1:%d has gone quiet \(the process read [\d.]+ k?B/s in "
            r"all over the [\d.]+ m?s sampled\) and it has waited on it for [\d.]+ s\." % server.port,
            second,
        ) or re.search(
            r"waits to read descriptor \d+ \(a TCP connection 127\.0\.0\.1:\d+ → 127\.0\.0\.1:%d\) at job\.py:4 in "
            r"<module> → recv; the other end is held by pid %d " % (server.port, os.getpid()),
            second,
        ), second
    finally:
        stop(job)
        server.close()


@pytest.mark.torch
def test_gloo_rank_that_never_reaches_all_reduce_is_named_by_inspect_dir(tmp_path: Path) -> None:
    """Two gloo ranks under torchrun, no collector: rank 1 never reaches the all_reduce. ``inspect
    DIR`` leads with rank 0's stall and names rank 1 as the one that never arrived."""
    pytest.importorskip("torch.distributed")
    from test_collective import TRAIN

    (tmp_path / "train.py").write_text(TRAIN)
    where = tmp_path / "j"
    env = clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(where), OMP_NUM_THREADS="1")
    proc = start_torchrun(tmp_path, env, tmp_path / "log.txt")
    ranks: dict = {}
    try:

        def both():
            found = {
                j.root.attrs["rank"]: j
                for j in map(read_journal, journals(where))
                if j.root is not None and isinstance(j.root.attrs.get("rank"), int)
            }
            return found if len(found) == 2 and found[0].steps >= 39 else None

        ranks = wait_for(both, timeout=60, what="rank 0 at step 39")
        time.sleep(4)
        request_stacks(read_journal(ranks[0].path))
        r = inspect(str(where), "--stall-after", "training=3")
        assert r.returncode == 0, r.stderr
        stalled = [line for line in r.stdout.splitlines() if line.startswith("STALLED: ")]
        assert stalled, r.stdout
        assert "Waiting inside a collective (all_reduce" in stalled[0] and "rank 1 never arrived" in stalled[0], (
            r.stdout
        )
    finally:
        for j in ranks.values():
            try:
                os.killpg(j.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        stop(proc)


def test_stall_record_leads_inspect_and_watch(tmp_path: Path) -> None:
    """A journal with the watchdog's ``stall`` record (written by hand until the watchdog writes
    them): inspect's second line and watch's stall line are the record's stage, limit and diagnosis,
    with the learned limit named, and the time open as of the reading; ``--json`` carries it under
    ``stall``."""
    b = JournalBuilder(tmp_path / "job.otel.jsonl", t0=time.time_ns() - 40 * 10**9)
    b.process(alive=True)
    b.span("import torch", 0.0, 2.0)
    span = b.start("import toolkit.job", 2.0)
    b.beat(39.5)
    b.raw(
        json.dumps(
            {
                "v": 1,
                "k": "stall",
                "ts": b.ns(33.0),
                "span_id": span,
                "stage": "import toolkit.job",
                "kind": "alive",
                "limit_s": 31.0,
                "open_s": 31.0,
                "learned": {"from": "5 earlier runs", "usual_s": 0.4, "longest_s": 0.6},
                "evidence": {},
                "diagnosis": "Cannot tell why; the innermost Python frame is job.py:2 in <module>.",
                "by": "watchdog",
            }
        ).encode()
        + b"\n"
    )
    r = inspect(str(b.path))
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()[:2]
    assert first.startswith("stuck in import toolkit.job for "), r.stdout
    # the record said 31 s at 33 s; read at 40 s or later, the stage has been open for 38 s or more
    line = re.compile(
        r"STALLED: import toolkit\.job open for ([\d.]+) s "
        r"\(limit 31 s: learned from 5 earlier runs, usually [\d.]+ m?s\) — "
        r"Cannot tell why; the innermost Python frame is job\.py:2 in <module>\."
    )
    m = line.fullmatch(second)
    assert m and float(m.group(1)) >= 38, second
    doc = json.loads(inspect("--json", str(b.path)).stdout)
    assert doc["stall"]["by"] == "watchdog" and line.fullmatch(doc["stall"]["line"]), doc["stall"]
    w = lora_otel_cli("watch", "--once", str(b.path))
    assert any(line.fullmatch(text) for text in w.stdout.splitlines()) and w.returncode == 3, w.stdout


# --- 7. the front door -----------------------------------------------------------------------------


def test_garbage_otlp_endpoint_is_one_line_in_the_jobs_output(tmp_path: Path) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT=garbage``: one line in the job's own output naming the
    variable and what is done instead, when it becomes a job (here: its stage); the job runs on
    and its stdout is its own."""
    (tmp_path / "job.py").write_text("import lora_otel\nwith lora_otel.stage('x'):\n    print('hello')\n")
    r = subprocess.run(
        [PYTHON, "job.py", "--log", "run.log"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT="garbage"),
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == "hello\n"
    said = [line for line in r.stderr.splitlines() if "OTEL_EXPORTER_OTLP_ENDPOINT" in line]
    assert len(said) == 1 and said[0].endswith(
        "OTEL_EXPORTER_OTLP_ENDPOINT is not an http(s) URL (such as http://localhost:4318): ignored, no live "
        "export; the journal remains for `lora-otel inspect` and `lora-otel replay`"
    ), r.stderr
    assert "=garbage" not in r.stderr and "'garbage'" not in r.stderr
    assert said[0] in (tmp_path / "run.log").read_text()


def test_inspect_the_log_path_reads_its_newest_run(tmp_path: Path) -> None:
    """``inspect runs/demo.log`` (the ``--log`` path itself) and a re-run with the same ``--log``:
    inspect and watch read the newest run's journal and say which file."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "job.py").write_text("import sys\nsys.exit(int(sys.argv[-1]))\n")
    env = clean_env(LORA_OTEL="1")
    for code in ("0", "3"):
        subprocess.run(
            [PYTHON, "job.py", "--log", "runs/demo.log", code], cwd=tmp_path, env=env, timeout=60, capture_output=True
        )
    newest = [p for p in journals(runs) if p.name != "demo.log.otel.jsonl"]
    assert len(newest) == 1
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", "runs/demo.log"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "failed with exit code 3"
    assert r.stderr == "lora-otel inspect: reading runs/%s\n" % newest[0].name
    w = subprocess.run(
        [PYTHON, "-m", "lora_otel", "watch", "--once", "runs/demo.log"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert w.returncode == 1 and w.stderr == "lora-otel watch: following runs/%s\n" % newest[0].name, w


def test_inspect_a_file_that_is_not_a_journal_says_so_once(tmp_path: Path) -> None:
    """A plain log and a binary file: "not a journal" once on stderr, exit 2 (as watch does); a
    journal with some bad lines reads, with a count and the first line numbers."""
    log = tmp_path / "demo.log"
    log.write_text("".join("step %d loss 0.1\n" % i for i in range(2000)))
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 4000)
    for path in (log, binary):
        r = inspect(str(path))
        assert r.returncode == 2 and r.stdout == "", r.stdout[:300]
        assert r.stderr.count("not a journal") == 1 and len(r.stderr.splitlines()) == 1, r.stderr[:300]
    b = JournalBuilder(tmp_path / "bad.otel.jsonl")
    root = b.process()
    for _ in range(12):
        b.raw(b"garbage\n")
    b.end(root, 1.0)
    b.exit(1.0)
    r = inspect(str(b.path))
    assert r.returncode == 0 and r.stdout.startswith("finished normally")
    notes = [line for line in r.stdout.splitlines() if line.startswith("note: ")]
    assert (
        len(notes) == 6
        and notes[-1] == "note: 12 lines could not be read in all (lines 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...)"
    )


def test_healthy_job_just_into_training_is_not_stuck(tmp_path: Path) -> None:
    """A job a moment into training, stepping: inspect says it is still in training, not stuck;
    a running process between stages is not "ended with spans open"."""
    job = launch(
        tmp_path,
        textwrap.dedent("""\
        import argparse, time
        import lora_otel
        argparse.ArgumentParser().parse_args()
        with lora_otel.stage("load model"):
            pass
        time.sleep(600)
        """),
    )
    try:
        journal = open_span(tmp_path, job.pid, "process")
        wait_for(
            lambda: any(s.name == "load model" and not s.is_open for s in read_journal(journal.path).spans),
            what="load model to end",
        )
        first = inspect(journal.path).stdout.splitlines()[0]
        assert re.fullmatch(r"no stage open for [\d.]+ m?s since load model ended \(process running\)", first), first
    finally:
        stop(job)
    b = JournalBuilder(tmp_path / "young.otel.jsonl", t0=time.time_ns() - 300_000_000)
    b.process(alive=True)
    b.start("training", 0.035)
    b.beat(0.2, steps=0)
    first = inspect(str(b.path)).stdout.splitlines()[0]
    assert re.fullmatch(r"still in training for (\d+ ms|\d+(\.\d+)? s) \(process running\)", first), first


def test_sigstop_then_sigkill_watch_says_how_long_it_was_stuck(tmp_path: Path) -> None:
    """SIGSTOP, then SIGKILL ~12 s later: watch's end line says it was stuck in the stage until it
    was last seen (not "died after" the seconds before the stop)."""
    job = launch(
        tmp_path,
        textwrap.dedent("""\
        import time
        import lora_otel
        with lora_otel.stage("load model"):
            time.sleep(600)
        """),
    )
    try:
        journal = open_span(tmp_path, job.pid, "load model")
        time.sleep(1.5)
        os.kill(job.pid, signal.SIGSTOP)
        watch = subprocess.Popen(
            [PYTHON, "-m", "lora_otel", "watch", "--interval", "0.5", journal.path],
            env=clean_env(LORA_OTEL_FROZEN_AFTER="3"),
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(12)
        os.kill(job.pid, signal.SIGKILL)
        out, _ = watch.communicate(timeout=60)
    finally:
        stop(job)
    assert "STALLED: frozen in load model: no beat for " in out, out
    [end] = [line for line in out.splitlines() if "process gone without an exit record" in line]
    m = re.search(r"stuck in load model for ([\d.]+) s", end)
    assert m and float(m.group(1)) >= 12, end


def test_lora_otel_run_sigkill_keeps_the_stuck_duration(tmp_path: Path) -> None:
    """Under ``lora-otel run`` a SIGKILLed job's inspect first line still says how long it was in
    the stage it died in."""
    (tmp_path / "job.py").write_text(
        "import time, lora_otel\nwith lora_otel.stage('load model'):\n    time.sleep(600)\n"
    )
    run = subprocess.Popen(
        [PYTHON, "-m", "lora_otel", "run", "--", PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL_DIR=str(tmp_path / "j")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        journal = wait_for(
            lambda: next(
                (
                    j
                    for j in map(read_journal, journals(tmp_path / "j"))
                    if any(s.name == "load model" for s in j.spans)
                ),
                None,
            ),
            what="load model",
        )
        time.sleep(2)
        os.kill(journal.pid, signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        run.kill()
        run.wait()
    first = inspect(journal.path).stdout.splitlines()[0]
    assert re.fullmatch(
        r"killed by SIGKILL while in load model for [\d.]+ s, spans open: process, .*load model "
        r"\(exit status 137\)",
        first,
    ), first
