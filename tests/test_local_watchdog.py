"""The local watchdog: every job (``LORA_OTEL=1``) gets one, collector or not.

Each case is launched the way a UI launches a job with no collector: a detached launcher writing
the job's stdout and stderr to ``log.txt``, the job given ``--log run.log``. What must hold is what
the user sees there: the ``STALLED``/death line the job could not write itself, in ``log.txt``
and ``run.log``; the ``stall`` record in the journal that ``lora-otel inspect --json`` reads back;
a launcher's pipe at end-of-file the moment the job dies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, lora_otel_cli, wait_for
from test_hangs import make_module
from test_sidecar import wait_gone

from lora_otel.analysis.evidence import py_spy_path
from lora_otel.journal.reader import read_journal

FROZEN_MOD = "import ctypes\ndef hold():\n    while True:\n        ctypes.PyDLL(None).pause()\nhold()\n"


def launch(tmp_path: Path, script: str, **env: str) -> subprocess.Popen:
    """``python job.py --log run.log > log.txt 2>&1``, in its own session, as a UI starts a job."""
    (tmp_path / "job.py").write_text(script, encoding="utf-8")
    with open(tmp_path / "log.txt", "wb") as out:
        return subprocess.Popen(
            [PYTHON, "job.py", "--log", "run.log"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(LORA_OTEL="1", **env),
            start_new_session=True,
        )


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def journal_of(tmp_path: Path):
    path = tmp_path / "run.log.otel.jsonl"
    wait_for(path.exists, what="the journal")
    return read_journal(path)


def sidecar_of(tmp_path: Path) -> int:
    return wait_for(
        lambda: (
            (tmp_path / "run.log.otel.jsonl").exists()
            and journal_of(tmp_path).root is not None
            and journal_of(tmp_path).root.attrs.get("lora_otel.sidecar.pid")
        ),
        what="the sidecar's pid",
    )


def gone(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.slow
def test_gil_held_import_is_called_stalled_in_the_panel(tmp_path: Path) -> None:
    """An import holding the GIL in C cannot speak for itself: the watchdog's STALLED line, with the
    diagnosis, lands in the launcher's log.txt and in --log; the journal has a `frozen` stall record."""
    make_module(tmp_path, "frozenmod", FROZEN_MOD)
    proc = launch(tmp_path, "import frozenmod\n", LORA_OTEL_FROZEN_AFTER="2")
    try:
        line = wait_for(
            lambda: [x for x in text(tmp_path / "log.txt").splitlines() if "STALLED:" in x],
            timeout=30,
            what="the STALLED line in log.txt",
        )[0]
        assert proc.poll() is None
        assert line.startswith("[lora-otel][%d][" % proc.pid), line
        assert re.search(r"STALLED: frozen in import frozenmod: no beat for [\d.]+ s \(limit 2 s\) — ", line), line
        if py_spy_path() is not None:  # the GIL is said held only when py-spy's stacks show it
            assert "Holding the GIL" in line, line
        else:
            assert "whether it holds the GIL is unknown without native stacks" in line, line
        assert line in text(tmp_path / "run.log").splitlines()
        [record] = journal_of(tmp_path).stalls
        assert record["kind"] == "frozen" and record["stage"] == "import frozenmod" and record["by"] == "watchdog"
        assert record["diagnosis"] in line
    finally:
        stop(proc)


@pytest.mark.slow
def test_sigstop_is_called_stalled(tmp_path: Path) -> None:
    """SIGSTOP in a stage: the STALLED line says the process is stopped; it is written once."""
    proc = launch(
        tmp_path,
        "import lora_otel, time\nwith lora_otel.stage('load data'):\n    time.sleep(60)\n",
        LORA_OTEL_FROZEN_AFTER="2",
    )
    try:
        wait_for(lambda: any(s.name == "load data" for s in journal_of(tmp_path).spans), what="the stage")
        os.kill(proc.pid, signal.SIGSTOP)
        line = wait_for(
            lambda: [x for x in text(tmp_path / "log.txt").splitlines() if "STALLED:" in x],
            timeout=30,
            what="the STALLED line",
        )[0]
        assert "STALLED: frozen in load data: no beat for " in line and "The process is stopped (SIGSTOP" in line, line
        time.sleep(1.5)
        assert text(tmp_path / "run.log").count("STALLED:") == 1
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        stop(proc)


@pytest.mark.slow
def test_sigkill_death_line_and_eof_at_once(tmp_path: Path) -> None:
    """SIGKILL in a stage: a launcher reading the job's stderr pipe gets end-of-file right after
    the job dies (the watchdog holds nothing of it); the death line lands in --log, and the journal
    gets a `died` stall record."""
    (tmp_path / "job.py").write_text(
        "import lora_otel, time\nwith lora_otel.stage('load model'):\n    time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [PYTHON, "job.py", "--log", "run.log"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(LORA_OTEL="1"),
    )
    eof_at = []

    def read_all() -> None:
        proc.stderr.read()
        eof_at.append(time.monotonic())

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    try:
        side = sidecar_of(tmp_path)
        wait_for(lambda: any(s.name == "load model" for s in journal_of(tmp_path).spans), what="the stage")
        time.sleep(1)
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        reader.join(timeout=10)
        assert eof_at, "the launcher never saw end-of-file"
        print("EOF %.3f s after SIGKILL" % (eof_at[0] - killed))
        assert eof_at[0] - killed < 1.0
        line = wait_for(
            lambda: [x for x in text(tmp_path / "run.log").splitlines() if "was killed" in x],
            timeout=15,
            what="the death line in run.log",
        )[0]
        assert line.startswith("[lora-otel][%d][" % proc.pid)
        assert (
            "process %d was killed (by a signal: SIGKILL, SIGTERM, ...; or os._exit) in load model after" % proc.pid
            in line
        ), line
        wait_for(lambda: gone(side), timeout=10, what="the sidecar to exit")
        [record] = journal_of(tmp_path).stalls
        assert record["kind"] == "died" and record["stage"] == "load model"
    finally:
        stop(proc)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.slow
def test_oom_killer_death_line(tmp_path: Path) -> None:
    """A job the kernel's OOM killer kills (a real memory cgroup with a 200 MB limit): the death line
    in --log and log.txt names the OOM killer and the stage."""
    from test_sidecar import _make_memory_cgroup

    cg = _make_memory_cgroup(200 * 2**20)
    (tmp_path / "job.py").write_text(
        "import lora_otel, time\nwith lora_otel.stage('load model'):\n    time.sleep(1.5)\n"
        "    hog = []\n    while True:\n        hog.append(bytearray(16 * 2**20))\n"
    )
    try:
        with open(tmp_path / "log.txt", "wb") as out:
            proc = subprocess.Popen(
                ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$1" job.py --log run.log', str(cg), PYTHON],
                cwd=tmp_path,
                env=clean_env(LORA_OTEL="1"),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        line = wait_for(
            lambda: [x for x in text(tmp_path / "run.log").splitlines() if "was killed" in x],
            timeout=60,
            what="the death line (sidecar's log: %s)" % [text(p)[-800:] for p in tmp_path.glob("*.sidecar.log")],
        )[0]
        assert "process %d was killed by the OOM killer in load model after" % proc.pid in line, line
        assert line in text(tmp_path / "log.txt")
    finally:
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), what="the cgroup to empty")
        cg.rmdir()


@pytest.mark.slow
def test_stall_record_read_back_by_inspect(tmp_path: Path) -> None:
    """A stage past its limit (LORA_OTEL_STALL_AFTER, recorded by the job): the watchdog appends one
    `stall` record, which `lora-otel inspect --json` (run without that variable) reads back."""
    make_module(tmp_path, "slowmod", "import time\ntime.sleep(60)\n")
    proc = launch(tmp_path, "import slowmod\n", LORA_OTEL_STALL_AFTER="import=1")
    try:
        wait_for(lambda: journal_of(tmp_path).stalls, timeout=30, what="the stall record")
        r = lora_otel_cli("inspect", "--json", str(tmp_path / "run.log.otel.jsonl"))
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        procs = [p for job in doc["jobs"] for p in job["processes"]] if "jobs" in doc else [doc]
        [record] = [s for p in procs for s in p.get("stalls", [])]
        assert record["kind"] == "alive" and record["stage"] == "import slowmod" and record["limit_s"] == 1.0
        assert record["span_id"] == next(s for s in journal_of(tmp_path).spans if s.name == "import slowmod").span_id
        assert record["diagnosis"] and record["evidence"]["process.state"]
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.torch
def test_between_stages_stall(tmp_path: Path) -> None:
    """No stage open after the arguments were parsed (the program's own code hangs, as a download
    frozen at 0 B/s): with `between=2` a `between` stall record names the stage that ended last."""
    proc = launch(
        tmp_path,
        "import argparse, time\nargparse.ArgumentParser().parse_known_args()\nimport torch\ntime.sleep(60)\n",
        LORA_OTEL_STALL_AFTER="between=2",
    )
    try:
        [record] = wait_for(lambda: journal_of(tmp_path).stalls, timeout=30, what="the stall record")
        assert record["kind"] == "between" and record["span_id"] is None and record["stage"] == "between stages"
        assert record["limit_s"] == 2.0 and record["evidence"].get("last_stage")
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.torch
def test_the_jobs_stalled_line_is_followed_by_why(tmp_path: Path) -> None:
    """The job says STALLED itself (with where its main thread is); the watchdog, which diagnoses,
    follows it with the cause on the same stderr and --log: here a deadlock of two thread locks.
    (Before: the job's own lines never said why; only inspect did.)"""
    script = (
        "import argparse, threading, time\nargparse.ArgumentParser().parse_known_args()\nimport torch\n"
        "lock_a, lock_b = threading.Lock(), threading.Lock()\n"
        "def worker():\n"
        "    with lock_b:\n"
        "        time.sleep(0.5)\n"
        "        with lock_a:\n"
        "            pass\n"
        "threading.Thread(target=worker, daemon=True).start()\n"
        "with lock_a:\n"
        "    time.sleep(0.5)\n"
        "    with lock_b:\n"
        "        pass\n"
    )
    proc = launch(tmp_path, script, LORA_OTEL_STALL_AFTER="between=2")
    try:
        for name in ("log.txt", "run.log"):
            wait_for(lambda n=name: "is stalled: " in text(tmp_path / n), timeout=60, what="the why line in " + name)
        for path in (tmp_path / "log.txt", tmp_path / "run.log"):
            lines = text(path).splitlines()
            stalled = next(i for i, line in enumerate(lines) if "STALLED: " in line)
            [why] = [line for line in lines if "why the job is stalled: " in line]
            assert lines.index(why) > stalled, (path, lines)
            assert "Deadlock: the main thread waits in lock_b" in why and "job.py:" in why, why
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.torch
def test_a_killed_jobs_views_keep_the_why_found_while_it_hung(tmp_path: Path) -> None:
    """A job deadlocks, is diagnosed, then is killed (as a user ends a hung job): the death record
    leads the views, and inspect and the report still say why it hung (before: only "The process
    was killed ... with no stage open", the deadlock only in --json)."""
    script = (
        "import argparse, threading, time\nargparse.ArgumentParser().parse_known_args()\nimport torch\n"
        "lock_a, lock_b = threading.Lock(), threading.Lock()\n"
        "def worker():\n    with lock_b:\n        time.sleep(0.5)\n        with lock_a:\n            pass\n"
        "threading.Thread(target=worker, daemon=True).start()\n"
        "with lock_a:\n    time.sleep(0.5)\n    with lock_b:\n        pass\n"
    )
    proc = launch(tmp_path, script, LORA_OTEL_STALL_AFTER="between=2")
    try:
        wait_for(lambda: "is stalled: " in text(tmp_path / "run.log"), timeout=60, what="the why line")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: any(s["kind"] == "died" for s in journal_of(tmp_path).stalls), timeout=60, what="the death")
        r = lora_otel_cli("inspect", str(tmp_path / "run.log.otel.jsonl"))
        assert r.returncode == 0, r.stderr
        [headline] = [ln for ln in r.stdout.splitlines() if ln.startswith("STALLED: ")]
        assert "killed" in headline and "Before, it was stalled: no stage open for " in headline, headline
        assert "Deadlock: the main thread waits in lock_b" in headline, headline
        out = tmp_path / "job.html"
        r = lora_otel_cli("report", str(tmp_path / "run.log.otel.jsonl"), "-o", str(out))
        assert r.returncode == 0, r.stderr
        assert "Deadlock: the main thread waits in lock_b" in out.read_text(encoding="utf-8")
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.torch
def test_a_stuck_dataloader_workers_place_comes_from_its_journal(tmp_path: Path) -> None:
    """A DataLoader worker blocks in the dataset, without py-spy (most users have none): the why
    line names the worker and where its own journal says it is, not just its kernel wait channel
    (the newcomer's torchtune trial: "worker pid 5620 is sleeping in wait_for_partner")."""
    script = (
        "import argparse, os, time\nargparse.ArgumentParser().parse_known_args()\nimport torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Samples(Dataset):\n"
        "    def __len__(self):\n        return 400\n"
        "    def __getitem__(self, i):\n"
        "        if i == 40:\n"
        "            open('hung.pid', 'w').write(str(os.getpid()))\n"
        "            time.sleep(600)\n"
        "        return torch.ones(4)\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for batch in DataLoader(Samples(), batch_size=4, num_workers=2):\n"
        "    model(batch).sum().backward()\n    opt.step()\n    opt.zero_grad()\n"
    )
    proc = launch(tmp_path, script, LORA_OTEL_STALL_AFTER="training=3", LORA_OTEL_PY_SPY="0")
    try:
        wait_for(lambda: "is stalled: " in text(tmp_path / "run.log"), timeout=90, what="the why line")
        hung = int((tmp_path / "hung.pid").read_text())
        [why] = [ln for ln in text(tmp_path / "run.log").splitlines() if "why training is stalled: " in ln]
        assert "The main thread waits for a DataLoader batch" in why, why
        assert "worker pid %d is sleeping" % hung in why, why
        assert "its journal: " in why and "job.py:11 in __getitem__" in why, why
    finally:
        stop(proc)
        for line in text(tmp_path / "hung.pid").split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass


@pytest.mark.slow
@pytest.mark.torch
def test_the_why_line_waits_for_a_late_stalled_line(tmp_path: Path) -> None:
    """A job whose beat comes late (a 12 s beat here; a loaded machine in the full suite, where the
    beat thread waited between its beat record and its STALLED line) says STALLED after the
    watchdog, polling on its own clock, has found the stall and its cause: the why line still comes
    after it. (Before: written at once, it came 7 s before; a CI run failed on that order.)"""
    script = (
        "import argparse, threading\nargparse.ArgumentParser().parse_known_args()\nimport torch\n"
        "threading.Lock().acquire(); lock = threading.Lock(); lock.acquire(); lock.acquire()\n"
    )
    proc = launch(
        tmp_path, script, LORA_OTEL_STALL_AFTER="between=1", LORA_OTEL_BEAT_S="12", LORA_OTEL_FROZEN_AFTER="300"
    )
    try:
        wait_for(lambda: "is stalled: " in text(tmp_path / "run.log"), timeout=90, what="the why line")
        lines = text(tmp_path / "run.log").splitlines()
        stalled = [i for i, line in enumerate(lines) if "STALLED: " in line]
        [why] = [i for i, line in enumerate(lines) if "why the job is stalled: " in line]
        assert stalled and stalled[0] < why, lines
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.torch
def test_the_why_line_is_not_written_over_in_a_positioned_stderr_file(tmp_path: Path) -> None:
    """``> log.txt 2>&1`` (a file the job writes at its own position, no O_APPEND): the watchdog's
    line goes in through the job's own open file, so the job's next lines come after it and neither
    is written over. (Before: appended through another open, it was overwritten by the job's next
    write, leaving garbled text in the job's own output.)"""
    script = (
        "import argparse, os, sys, time\nargparse.ArgumentParser().parse_known_args()\nimport torch\n"
        "deadline = time.monotonic() + 90\n"
        "def said():\n    return os.path.exists('run.log') and 'is stalled' in open('run.log').read()\n"
        "while time.monotonic() < deadline and not said():\n"
        "    time.sleep(0.2)\n"
        "for i in range(200):\n"
        "    sys.stderr.write('job line %03d\\n' % i)\n"
        "sys.stderr.flush()\n"
    )
    proc = launch(tmp_path, script, LORA_OTEL_STALL_AFTER="between=2")
    try:
        assert proc.wait(timeout=120) == 0
        lines = text(tmp_path / "log.txt").splitlines()
        assert [line for line in lines if line.startswith("job line ")] == ["job line %03d" % i for i in range(200)]
        [why] = [line for line in lines if "why the job is stalled: " in line]
        assert why.endswith("not a lock, the network or the GPU."), why
        assert lines.index(why) < lines.index("job line 000")
    finally:
        stop(proc)


@pytest.mark.slow
def test_learned_limits_from_three_earlier_runs(tmp_path: Path) -> None:
    """Three earlier runs in the same directory imported `quickmod` in milliseconds; in the fourth it
    hangs: at 10 s one line says it is slow ("usually … over the last 3 runs"), and at the learned
    limit (30 s, far below the default 120 s) it is called stalled; the record says what was learned."""
    make_module(tmp_path, "quickmod", "import os, time\nif os.environ.get('HANG'):\n    time.sleep(120)\n")
    for _ in range(3):
        r = (
            subprocess.run(
                [PYTHON, "job.py", "--log", "run.log"],
                cwd=tmp_path,
                env=clean_env(LORA_OTEL="1"),
                capture_output=True,
                timeout=60,
            )
            if (tmp_path / "job.py").exists()
            else None
        )
        if r is None:
            (tmp_path / "job.py").write_text("import quickmod\n")
            r = subprocess.run(
                [PYTHON, "job.py", "--log", "run.log"],
                cwd=tmp_path,
                env=clean_env(LORA_OTEL="1"),
                capture_output=True,
                timeout=60,
            )
        assert r.returncode == 0
    (tmp_path / "run.log").unlink(missing_ok=True)  # (short runs that said nothing there: none, issue 36 item 4)
    os.rename(tmp_path / "run.log.otel.jsonl", tmp_path / "earlier.otel.jsonl")
    started = time.monotonic()
    proc = launch(tmp_path, "import quickmod\n", HANG="1")
    try:
        slow = wait_for(
            lambda: [x for x in text(tmp_path / "log.txt").splitlines() if "so far, usually" in x],
            timeout=30,
            what="the slow line",
        )[0]
        assert re.search(r"import quickmod: 1\d(\.\d+)? s so far, usually .* over the last 3 runs", slow), slow
        line = wait_for(
            lambda: [x for x in text(tmp_path / "log.txt").splitlines() if "STALLED:" in x],
            timeout=45,
            what="the STALLED line",
        )[0]
        print("learned limit: called stalled %.1f s after the job started" % (time.monotonic() - started))
        assert "import quickmod open for" in line and "limit 30 s: learned from 3 earlier runs, usually " in line, line
        [record] = journal_of(tmp_path).stalls
        assert record["limit_s"] == 30.0 and record["learned"]["from"] == "3 earlier runs"
        assert record["learned"]["longest_s"] < 1
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.collector
def test_exported_stall_matches_the_journal(tmp_path: Path, collector) -> None:
    """With a collector, the live follower appends the same stall record: the exported stall's kind,
    stage and diagnosis are the journal's."""
    make_module(tmp_path, "slowmod", "import time\ntime.sleep(60)\n")
    proc = launch(
        tmp_path,
        "import slowmod\n",
        LORA_OTEL_STALL_AFTER="import=1",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint,
    )
    try:
        [record] = wait_for(lambda: journal_of(tmp_path).stalls, timeout=30, what="the stall record")
        span = wait_for(
            lambda: {s.name: s for s in collector.spans()}.get("import slowmod"), timeout=30, what="the exported stall"
        )
    finally:
        stop(proc)
    assert record["by"] == "sidecar" and record["kind"] == span.attributes["lora_otel.stall.kind"] == "alive"
    assert record["stage"] == span.attributes["lora_otel.stall.stage"]
    assert record["diagnosis"] == span.attributes["lora_otel.diagnosis"]
    assert record["span_id"] == span.span_id


@pytest.mark.slow
def test_local_mode_imports_no_opentelemetry(tmp_path: Path) -> None:
    """Without an endpoint the sidecar never imports the OpenTelemetry SDK (-X importtime of the
    sidecar itself, following a finished job); LORA_OTEL_LIVE=0 starts none."""
    (tmp_path / "job.py").write_text("pass\n")
    r = subprocess.run(
        [PYTHON, "job.py", "--log", "run.log"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_LIVE="0"),
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0
    j = journal_of(tmp_path)
    assert "lora_otel.sidecar.pid" not in j.root.attrs and not list(tmp_path.glob("*.sidecar.log"))
    r = subprocess.run(
        [
            PYTHON,
            "-X",
            "importtime",
            "-m",
            "lora_otel.export.sidecar",
            "--journal",
            str(tmp_path / "run.log.otel.jsonl"),
            "--pid",
            str(j.pid),
        ],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL_SIDECAR="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "lora_otel.export.watchdog" in r.stderr and "local mode" in r.stderr
    assert "opentelemetry" not in r.stderr, [x for x in r.stderr.splitlines() if "opentelemetry" in x][:3]


NOT_BEFORE_A_STALL = (
    "lora_otel._boot.preamble",
    "lora_otel.analysis.evidence",
    "lora_otel.analysis.diagnose",
    "statistics",
    "shutil",
    "logging",
    "opentelemetry",
)
"""What the local watchdog must not load while its job runs without a stall: each is resident in the
job's memory cgroup for the job's whole life (docs/performance.md, "Memory a traced job adds")."""


@pytest.mark.slow
def test_local_watchdog_loads_no_evidence_or_diagnosis_before_a_stall(tmp_path: Path) -> None:
    """A job that runs for a while without a stall, followed by its local watchdog: the watchdog
    (its ``-X importtime`` lines in its log, as it polls the running job and after it ends) never
    imports the preamble, the evidence gathering, the diagnosis, `statistics`, `shutil` or `logging` — they
    are loaded at the first stall (the stall tests show they still work then)."""
    proc = launch(
        tmp_path,
        "import os, time\nimport lora_otel\nwith lora_otel.stage('work'):\n"
        "    while not os.path.exists('go'):\n        time.sleep(0.05)\n",
        PYTHONPROFILEIMPORTTIME="1",
    )
    try:
        side = sidecar_of(tmp_path)
        side_log = tmp_path / "run.log.sidecar.log"
        wait_for(lambda: "lora_otel.export.watchdog" in text(side_log), what="the watchdog's imports")
        time.sleep(2)  # a few of its polls of the running job (POLL_S 0.5)
        (tmp_path / "go").touch()
        assert proc.wait(timeout=60) == 0, text(tmp_path / "log.txt")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_gone(side)
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in text(side_log).splitlines() if line.startswith("import time:")
    }
    assert "lora_otel.export.watchdog" in imported and "lora_otel.analysis.stall" in imported
    loaded = sorted(name for name in imported if name.startswith(NOT_BEFORE_A_STALL))
    assert not loaded, loaded


@pytest.mark.slow
def test_recorded_limits_apply_unless_the_command_line_says_otherwise(journal) -> None:
    """One set of limits: `inspect` applies the limits the job recorded at start (config.stall_after,
    config.frozen_after), not its own defaults; its own --stall-after still wins."""
    journal.process(0, alive=True, config={"stall_after": "import=1e12", "frozen_after": "1e12"})
    journal.start("import slowmod", 1)
    r = lora_otel_cli("inspect", "--json", str(journal.path.parent))
    assert r.returncode == 0, r.stderr
    [proc] = [p for job in json.loads(r.stdout)["jobs"] for p in job["processes"]]
    assert proc["stall"] is None, proc["stall"]
    r = lora_otel_cli("inspect", "--json", "--stall-after", "import=5", str(journal.path.parent))
    [proc] = [p for job in json.loads(r.stdout)["jobs"] for p in job["processes"]]
    assert proc["stall"]["kind"] == "alive" and proc["stall"]["limit_s"] == 5


def test_between_limit_in_stall_rules(journal) -> None:
    """`between=` is a limit like the others: with only `process` open, the time since the last
    stage ended counts against it (default 120 s)."""
    from lora_otel.analysis.stall import DEFAULT_LIMITS_S, detect, parse_limits

    assert DEFAULT_LIMITS_S["between"] == 120 and parse_limits("between=30")["between"] == 30
    journal.process(0, alive=True, config={"stall_after": None, "frozen_after": "1e12"})
    journal.span("import torch", 0.1, 2.0)
    j = journal.read()
    assert detect(j, journal.ns(100), True) is None
    stall = detect(j, journal.ns(130), True)
    assert stall.kind == "between" and stall.after == "import torch" and round(stall.open_for_s) == 128
    assert detect(j, journal.ns(20), True, parse_limits("between=10")).kind == "between"


@pytest.mark.slow
def test_watchdog_writes_only_to_the_log_recorded_at_start(tmp_path: Path) -> None:
    """A process can append records to its own journal (after dropping root it still holds the
    descriptor): a later attrs record naming another file as its ``--log`` is not believed. The
    death line goes to the ``--log`` file the process opened at start (its identity is in the first
    record), never to the file named later. (Found by the hostile trial: the root watchdog
    appended the attacker's text to a root-owned file.)"""
    victim = tmp_path / "victim.conf"
    victim.write_bytes(b"precious\n")
    (tmp_path / "job.py").write_text(
        "import os, signal, sys, time\nimport lora_otel\nfrom lora_otel._boot import core\n"
        "core.span_attrs(core.root_id, {'lora_otel.log.path': sys.argv[3]})\n"
        "with lora_otel.stage('ALL=(ALL) NOPASSWD: ALL'):\n"
        "    time.sleep(0.5)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py", "--log", "run.log", str(victim)],
        cwd=tmp_path,
        capture_output=True,
        env=clean_env(LORA_OTEL="1"),
        timeout=60,
    )
    assert r.returncode == -signal.SIGKILL
    wait_for(lambda: "was killed" in text(tmp_path / "run.log"), timeout=15, what="the death line in run.log")
    time.sleep(1)
    assert victim.read_bytes() == b"precious\n"


@pytest.mark.slow
def test_a_quiet_service_is_not_called_stalled(tmp_path: Path) -> None:
    """A long-running service (no argparse, no torch: a select loop) with the whole environment
    traced: its `arguments` span stays open and nothing happens for a while, by design. The
    watchdog writes no stall record, sends no stack request and prints no STALLED line, as the
    job's own narration stays quiet (found by the hostile trial: at 60 s the service was called
    stalled in `arguments` and signalled)."""
    proc = launch(
        tmp_path,
        "import select, socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen(1)\n"
        "select.select([s], [], [], 6)\n",
        LORA_OTEL_STALL_AFTER="arguments=1,between=1",
    )
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    j = journal_of(tmp_path)
    assert j.stalls == []
    assert "STALLED" not in text(tmp_path / "log.txt")
    assert all(p.stat().st_size == 0 for p in (tmp_path / "lora-otel").glob("*.stacks.txt"))


MEMORY_BOUND_LOAD = """\
import mmap, os, time
import lora_otel
with open("weights.bin", "wb") as f:  # written from inside the cgroup: its page cache is charged there
    for _ in range(160):
        f.write(os.urandom(1 << 20))
with lora_otel.stage("load model"):
    with open("weights.bin", "rb") as f:
        weights = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        end, total = time.time() + 14, 0
        while time.time() < end:  # the load keeps touching pages the memory limit evicted
            for offset in range(0, len(weights), 4096):
                total += weights[offset]
print("loaded", total > 0)
"""


@pytest.mark.slow
def test_a_load_slowed_by_memory_pressure_is_named(tmp_path: Path) -> None:
    """A model load in a real memory cgroup (48 MB) that maps a 160 MB file: the pages the limit
    evicts are read back from disk again and again. Past the stage's limit the watchdog's stall
    record, and inspect after it, name memory reclaim with its figures (major faults, the limit),
    not "cannot tell why". (No swap on this machine: reclaim of the page cache, not swapping.)"""
    from test_sidecar import _make_memory_cgroup

    cg = _make_memory_cgroup(48 * 2**20)
    (tmp_path / "job.py").write_text(MEMORY_BOUND_LOAD)
    try:
        env = clean_env(LORA_OTEL="1", LORA_OTEL_STALL_AFTER="load model=4")
        with open(tmp_path / "log.txt", "wb") as out:
            proc = subprocess.Popen(
                ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$1" job.py --log run.log', str(cg), PYTHON],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        assert proc.wait(timeout=120) == 0, text(tmp_path / "log.txt")
        [record] = wait_for(
            lambda: read_journal(tmp_path / "run.log.otel.jsonl").stalls, timeout=15, what="the stall record"
        )
        assert record["stage"] == "load model" and record["kind"] == "alive"
        assert record["diagnosis"].startswith("Loading is slowed by memory reclaim"), json.dumps(record)[:3000]
        assert "major page faults/s" in record["diagnosis"] and "memory limit of 50 MB" in record["diagnosis"]  # 48 MiB
        doc = json.loads(lora_otel_cli("inspect", "--json", str(tmp_path / "run.log.otel.jsonl")).stdout)
        assert [s["diagnosis"] for s in doc["stalls"]] == [record["diagnosis"]]
    finally:
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), what="the cgroup to empty")
        cg.rmdir()


@pytest.mark.slow
def test_one_watchdog_per_job_also_with_a_bad_endpoint(tmp_path: Path) -> None:
    """A job whose OTEL_EXPORTER_OTLP_ENDPOINT is not a URL (dropped with one line) still has one
    sidecar for the job: a child process joins its parent's (the registry once went into a copy
    of the environment, so every child started a sidecar of its own). Both processes say a stage,
    which makes each a job (a process that ends at once, not one, starts no sidecar at all)."""
    import subprocess as sp

    from procs import PYTHON, clean_env, journals

    from lora_otel.journal.reader import read_journal

    child = "import lora_otel\nwith lora_otel.stage('child work'):\n    pass\n"
    (tmp_path / "job.py").write_text(
        "import lora_otel, subprocess, sys\nwith lora_otel.stage('run child'):\n"
        "    subprocess.run([sys.executable, '-c', %r], check=True)\n" % child
    )
    r = sp.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        env=clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT="collector:4317"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is not an http(s) URL" in r.stderr
    found = [read_journal(p) for p in journals(tmp_path)]
    assert len(found) == 2
    pids = {j.root.attrs.get("lora_otel.sidecar.pid") for j in found}
    assert len(pids) == 1 and None not in pids, pids


SLOW_PROMOTION = """
import os, subprocess, sys, threading
import lora_otel
from lora_otel._boot import core, preamble

assert not core.promoted, core.promoted
under_way, go_on = threading.Event(), threading.Event()
real_start = preamble._start_sidecar


def slow_start(env):  # a promotion that a loaded machine makes slow: the registry comes late
    under_way.set()
    go_on.wait(30)
    real_start(env)


preamble._start_sidecar = slow_start
preamble.PROMOTION_WAIT_S = 120  # (2 s in use) far from the timer below on a loaded machine
threading.Thread(target=core.promote, args=("another thread",)).start()
under_way.wait(30)
# The job's main thread starts a child while that promotion is under way: lora_otel.stage finds the
# process promoted already and returns at once; the child must still join this job's sidecar.
threading.Timer(0.5, go_on.set).start()
with lora_otel.stage("run child"):
    subprocess.run([sys.executable, "-c", %r], check=True)
"""


@pytest.mark.slow
def test_a_child_started_while_another_thread_promotes_joins_its_sidecar(tmp_path: Path) -> None:
    """The main thread starts a child while the beat thread is promoting the process (starting the
    sidecar): the child waits for that promotion and joins its sidecar, instead of starting a
    second one before the registry is in the environment (seen on 3.10 under load). The delay is
    injected into the real sidecar start; the job, the child and the sidecar are real."""
    import subprocess as sp

    from procs import PYTHON, clean_env, journals

    from lora_otel.journal.reader import read_journal

    child = "import lora_otel\nwith lora_otel.stage('child work'):\n    pass\n"
    (tmp_path / "job.py").write_text(SLOW_PROMOTION % child)
    r = sp.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    found = [read_journal(p) for p in journals(tmp_path)]
    assert len(found) == 2
    pids = {j.root.attrs.get("lora_otel.sidecar.pid") for j in found}
    assert len(pids) == 1 and None not in pids, pids
