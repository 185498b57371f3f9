"""The sidecar, end to end: real traced processes, a real collector (rotel), zero-code mode.

Each case is what a user would see in their backend: the spans that arrived (names, parentage,
status, the incomplete flag, the evidence events), every span ID once, and the log records.
Stall limits are shortened by the same variables a user sets (``LORA_OTEL_STALL_AFTER``,
``LORA_OTEL_FROZEN_AFTER``) so the suite stays quick.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journal_has_open, journals, wait_for
from test_hangs import kill_and_reap, make_module, start_traced

from collector import Collector, free_port, rotel_agent_path
from lora_otel.journal.reader import read_journal

pytestmark = [pytest.mark.collector, pytest.mark.slow]


def traced(tmp_path: Path, script: str, endpoint: str, **env: str) -> subprocess.Popen:
    return start_traced(tmp_path, script, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **env)


SHORT_JOB = "import lora_otel, time\nwith lora_otel.stage('work'):\n    %s\n"
"""A job that ends at once: its stage makes it one (a process that is no job has no sidecar)."""


def sidecar_pid(tmp_path: Path) -> int:
    """The pid of the sidecar of the job whose journals are under tmp_path/lora-otel (or tmp_path)."""
    where = tmp_path / "lora-otel" if (tmp_path / "lora-otel").exists() else tmp_path

    def find():
        for path in journals(where):
            j = read_journal(path)
            if j.root is not None and "lora_otel.sidecar.pid" in j.root.attrs:
                return j.root.attrs["lora_otel.sidecar.pid"]
        return None

    return wait_for(find, what="the sidecar's pid in the journal")


def alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def execd_cmdline(pid: int) -> bytes:
    """The sidecar's ``/proc/PID/cmdline`` once it has exec'd, or ``b"(gone)"`` when it ended first.
    Its pid is recorded at the intermediate shell's fork; until the exec it is that shell, whose
    argv names the sidecar's too (``sh -c SCRIPT python -m lora_otel.export.sidecar ...``)."""

    def execd() -> bytes | None:
        try:
            cmd = Path("/proc/%d/cmdline" % pid).read_bytes()
        except OSError:
            cmd = b""
        if not alive(pid):
            return b"(gone)"
        return cmd if cmd.split(b"\0")[1:3] == [b"-m", b"lora_otel.export.sidecar"] else None

    return wait_for(execd, what="the sidecar's exec")


def wait_gone(pid: int, timeout: float = 30) -> None:
    wait_for(lambda: not alive(pid), timeout=timeout, what="the sidecar to exit")


def assert_unique(received) -> None:
    ids = [s.span_id for s in received]
    assert len(ids) == len(set(ids)), "a span id was exported twice: %s" % sorted(ids)


def by_name(received) -> dict:
    return {s.name: s for s in received}


def test_sleeping_import_stall_then_sigkill(tmp_path: Path, collector) -> None:
    """Zero-code mode: a sleeping import past its limit reaches the collector while the process
    lives (incomplete, ERROR, evidence with the stack, a WARN "stall detected" log record); after
    SIGKILL the sidecar finalises the rest once and exits."""
    make_module(tmp_path, "slowmod", "import time\ndef fetch():\n    time.sleep(600)\nfetch()\n")
    proc = traced(tmp_path, "import slowmod\n", collector.http_endpoint, LORA_OTEL_STALL_AFTER="import=1")
    try:
        side = sidecar_pid(tmp_path)
        received = wait_for(
            lambda: by_name(collector.spans()).get("import slowmod") and collector.spans(),
            what="the stalled import at the collector",
            timeout=20,
        )
        assert proc.poll() is None, "the stall must arrive while the process still runs"
    finally:
        kill_and_reap(proc)
    wait_gone(side)
    received = collector.spans()
    assert_unique(received)
    spans = by_name(received)
    imp, root, args = spans["import slowmod"], spans["process"], spans["arguments"]
    assert imp.parent_id == root.span_id and args.parent_id == root.span_id
    assert imp.status_code == "STATUS_CODE_ERROR"
    assert imp.status_message.startswith("stalled: import slowmod open for")
    assert imp.attributes["lora_otel.incomplete"] is True and imp.attributes["lora_otel.stall.kind"] == "alive"
    assert "stall detected" in imp.events
    assert root.attributes["lora_otel.incomplete"] is True
    assert args.attributes["lora_otel.incomplete"] is True
    assert "without an exit record" in args.status_message
    warn = [r for r in collector.logs() if r.severity == "WARN"]
    assert len(warn) == 1 and warn[0].body.startswith("stall detected: import slowmod open for")
    assert warn[0].attributes["lora_otel.stall.stage"] == "import slowmod"
    assert warn[0].span_id == imp.span_id and warn[0].trace_id == imp.trace_id
    assert any(r.body.startswith("started pid %d" % proc.pid) for r in collector.logs())


def test_gil_held_import_is_frozen(tmp_path: Path, collector) -> None:
    """An import that holds the GIL in C: beats stop, the stall is kind "frozen", the stacks are
    still in the evidence (faulthandler needs no GIL)."""
    make_module(
        tmp_path,
        "frozenmod",
        "import ctypes\ndef hold():\n    while True:\n        ctypes.PyDLL(None).pause()\nhold()\n",
    )
    proc = traced(tmp_path, "import frozenmod\n", collector.http_endpoint, LORA_OTEL_FROZEN_AFTER="2")
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "import frozenmod"), what="import span")
        received = wait_for(
            lambda: by_name(collector.spans()).get("import frozenmod") and collector.spans(),
            what="the frozen import",
            timeout=30,
        )
    finally:
        kill_and_reap(proc)
    imp = by_name(received)["import frozenmod"]
    assert imp.attributes["lora_otel.stall.kind"] == "frozen"
    assert imp.attributes["lora_otel.incomplete"] is True and "stall detected" in imp.events
    warn = wait_for(lambda: [r for r in collector.logs() if r.severity == "WARN"], what="the stall log record")
    assert "(frozen)" in warn[0].body


def test_sigstopped_process_is_frozen(tmp_path: Path, collector) -> None:
    """SIGSTOP in the middle of a stage: the stage goes out as a frozen stall; after SIGCONT and a
    normal end, the rest goes out as "(continued)" and nothing twice."""
    proc = traced(
        tmp_path,
        "import lora_otel, time\nwith lora_otel.stage('load data'):\n    time.sleep(3)\n",
        collector.http_endpoint,
        LORA_OTEL_FROZEN_AFTER="2",
    )
    try:
        wait_for(lambda: journal_has_open(tmp_path / "lora-otel", "load data"), what="stage")
        side = sidecar_pid(tmp_path)
        os.kill(proc.pid, signal.SIGSTOP)
        received = wait_for(
            lambda: by_name(collector.spans()).get("load data") and collector.spans(),
            what="the frozen stage",
            timeout=30,
        )
        os.kill(proc.pid, signal.SIGCONT)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            kill_and_reap(proc)
    wait_gone(side)
    received = collector.spans()
    assert_unique(received)
    spans = by_name(received)
    assert spans["load data"].attributes["lora_otel.stall.kind"] == "frozen"
    assert spans["load data (continued)"].parent_id == spans["load data"].span_id
    assert spans["load data"].attributes["lora_otel.diagnosis"].startswith("The process is stopped (SIGSTOP")


def test_sigkill_mid_stage_under_lora_otel_run(tmp_path: Path, collector) -> None:
    """`lora-otel run`, SIGKILL in a stage: the launcher gets the signal back; the supervisor's exit
    record makes the sidecar finalise the open spans with "killed by SIGKILL"."""
    (tmp_path / "job.py").write_text(
        "import os, signal, lora_otel\nwith lora_otel.stage('save checkpoint'):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint)
    r = subprocess.run(
        [PYTHON, "-m", "lora_otel", "run", "--", PYTHON, "job.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    side = sidecar_pid(tmp_path)
    wait_gone(side)
    received = collector.spans()
    assert_unique(received)
    spans = by_name(received)
    stage = spans["save checkpoint"]
    assert stage.parent_id == spans["process"].span_id
    assert stage.attributes["lora_otel.incomplete"] is True
    assert "killed by SIGKILL" in stage.status_message and "killed by SIGKILL" in spans["process"].status_message
    errors = [r for r in collector.logs() if r.severity == "ERROR"]
    assert any("killed by SIGKILL" in r.body and "save checkpoint" in r.body for r in errors)


def test_collector_unreachable_then_back(tmp_path: Path) -> None:
    """The collector is down while the job runs and ends; it comes up later on the same port:
    every span arrives exactly once, and the job itself was not slowed by the outage."""
    binary = rotel_agent_path()
    if binary is None:
        pytest.skip("the rotel collector is not installed (pip install rotel)")
    port = free_port()
    script = "import lora_otel\nfor i in range(30):\n    with lora_otel.stage('step %d' % i):\n        pass\n"
    proc = traced(
        tmp_path, script, "http://127.0.0.1:%d" % port, LORA_OTEL_DRAIN_S="60", OTEL_EXPORTER_OTLP_TIMEOUT="1"
    )  # each attempt gives up after 1 s: the outbox retries
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    side = sidecar_pid(tmp_path)
    time.sleep(2)  # the sidecar has tried and failed by now
    assert alive(side), "the sidecar keeps the spans while the collector is down"
    collector = Collector(binary, tmp_path, http_port=port)
    try:
        wait_gone(side, timeout=60)
        received = collector.wait_for_spans(32, timeout=10)
        log = Path(str(journals(tmp_path / "lora-otel")[0]).replace(".otel.jsonl", ".sidecar.log")).read_text()
    finally:
        collector.stop()
    assert_unique(received)
    names = sorted(s.name for s in received)
    assert names == sorted(["process", "arguments"] + ["step %d" % i for i in range(30)]), names
    assert "not accepting the spans" in log and "accepts the spans again" in log and "0 unsent" in log


def test_sidecar_is_detached(tmp_path: Path) -> None:
    """The sidecar has its own session, /dev/null for stdin/stdout, its log file for stderr, none of
    the launcher's pipes; the launcher reads end-of-file while the sidecar is still draining."""
    port = free_port()  # nothing listens: the sidecar keeps retrying for LORA_OTEL_DRAIN_S
    proc = traced(tmp_path, SHORT_JOB % "time.sleep(1)", "http://127.0.0.1:%d" % port, LORA_OTEL_DRAIN_S="20")
    side = sidecar_pid(tmp_path)
    execd_cmdline(side)  # (before its exec it is the intermediate shell)
    pipes = {os.readlink("/proc/self/fd/%d" % f.fileno()) for f in (proc.stdout, proc.stderr)}
    held = set()
    for fd in os.listdir("/proc/%d/fd" % side):
        try:
            held.add(os.readlink("/proc/%d/fd/%s" % (side, fd)))
        except FileNotFoundError:
            pass  # closed between the listing and the look (the sidecar opens and closes files)
    assert not pipes & held, "the sidecar holds the launcher's pipes"
    assert os.readlink("/proc/%d/fd/0" % side) == os.devnull == os.readlink("/proc/%d/fd/1" % side)
    assert os.readlink("/proc/%d/fd/2" % side).endswith(".sidecar.log")
    assert os.getsid(side) not in (os.getsid(proc.pid), os.getsid(0)), "the sidecar has its own session"
    with open("/proc/%d/stat" % side) as f:
        assert int(f.read().rpartition(")")[2].split()[1]) != proc.pid, "the sidecar is not the job's child"
    _, err = proc.communicate(timeout=30)  # returns at EOF: the job's exit, not the sidecar's
    assert proc.returncode == 0 and b"exiting normally" in err
    assert alive(side), "EOF came while the sidecar was still running"
    assert len(journals(tmp_path / "lora-otel")) == 1, "the sidecar itself is not traced"
    os.kill(side, signal.SIGTERM)


def test_sidecar_that_cannot_start(tmp_path: Path) -> None:
    """A bad LORA_OTEL_SIDECAR_PYTHON: the job runs and exits as usual, one line says live export
    is off and the journal is complete for `lora-otel replay`."""
    for bad, expect in (
        (str(tmp_path / "missing-python"), "is not an executable Python"),
        (str(tmp_path), "cannot start the sidecar"),
    ):  # a directory passes access(), fails exec
        proc = traced(
            tmp_path,
            SHORT_JOB % "print('trained', flush=True)",
            "http://127.0.0.1:9",
            LORA_OTEL_SIDECAR_PYTHON=bad,
            LORA_OTEL_DIR=str(tmp_path / "lora-otel" / expect.split()[0]),
        )
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and b"trained" in out
        lines = [line for line in err.decode().splitlines() if "live export off" in line]
        assert len(lines) == 1 and expect in lines[0], err
        assert "Traceback" not in err.decode()
    for path in journals(tmp_path / "lora-otel"):
        j = read_journal(path)
        assert j.exit is not None and j.exit["code"] == 0 and not j.problems


def test_no_sidecar_with_live_off(tmp_path: Path) -> None:
    """LORA_OTEL_LIVE=0: no sidecar, no sidecar log, the journal only. Without it and without an
    endpoint the sidecar runs as the local watchdog and exits with the job."""
    proc = start_traced(tmp_path, SHORT_JOB % "pass", LORA_OTEL_LIVE="0")
    proc.communicate(timeout=30)
    [path] = journals(tmp_path / "lora-otel")
    assert "lora_otel.sidecar.pid" not in read_journal(path).root.attrs
    assert not list((tmp_path / "lora-otel").glob("*.sidecar.log"))
    proc = start_traced(tmp_path, SHORT_JOB % "pass", LORA_OTEL_DIR=str(tmp_path / "local"))
    proc.communicate(timeout=30)
    wait_gone(sidecar_pid(tmp_path / "local"), timeout=10)
    [log] = (tmp_path / "local").glob("*.sidecar.log")
    assert "in local mode" in log.read_text()


def test_outage_longer_than_the_queue(tmp_path: Path) -> None:
    """More spans than LORA_OTEL_QUEUE_SIZE while the collector is down: the sidecar holds that many,
    drops and counts the rest in its log, and what it held arrives once; the job is unaffected."""
    binary = rotel_agent_path()
    if binary is None:
        pytest.skip("the rotel collector is not installed (pip install rotel)")
    port = free_port()
    script = "import lora_otel\nfor i in range(30):\n    with lora_otel.stage('step %d' % i):\n        pass\n"
    proc = traced(
        tmp_path,
        script,
        "http://127.0.0.1:%d" % port,
        LORA_OTEL_DRAIN_S="60",
        LORA_OTEL_QUEUE_SIZE="10",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    side = sidecar_pid(tmp_path)
    log = tmp_path / "lora-otel" / (journals(tmp_path / "lora-otel")[0].name.replace(".otel.jsonl", ".sidecar.log"))
    wait_for(lambda: "not accepting the spans" in log.read_text(), what="the outage noticed")
    time.sleep(1)
    collector = Collector(binary, tmp_path, http_port=port)
    try:
        wait_gone(side, timeout=60)
        received = collector.wait_for_spans(10, timeout=10)
        time.sleep(0.5)
        received = collector.spans()
    finally:
        collector.stop()
    assert_unique(received)
    assert len(received) == 10 and "22 dropped by a full queue" in log.read_text(), log.read_text()


def _make_memory_cgroup(limit_bytes: int) -> Path:
    """A child memory cgroup of ours with a limit; skips where cgroups cannot be written (not root)."""
    from lora_otel.analysis.evidence import memory_cgroup

    base = memory_cgroup(os.getpid())
    if base is None:
        pytest.skip("no memory cgroup visible here")
    cg = Path(base) / ("lora-otel-test-%d" % os.getpid())
    try:
        cg.mkdir(exist_ok=True)
        for name in ("memory.limit_in_bytes", "memory.max", "memory.memsw.limit_in_bytes", "memory.swap.max"):
            if (cg / name).exists():
                (cg / name).write_text("0" if name == "memory.swap.max" else str(limit_bytes))
    except OSError as e:
        pytest.skip("cannot create a memory cgroup here: %s" % e)
    return cg


def test_oom_killer(tmp_path: Path, collector) -> None:
    """A job the kernel's OOM killer kills (a real memory cgroup with a 200 MB limit, the job and its
    sidecar inside it, as in a container): the sidecar finalises the open stage as killed by the OOM
    killer, from the cgroup's oom_kill count."""
    cg = _make_memory_cgroup(200 * 2**20)
    # The job grows once its sidecar is up (~40 MB), so the OOM killer picks the job, as it would
    # pick a training process many times the sidecar's size.
    (tmp_path / "job.py").write_text(
        "import lora_otel, time\nwith lora_otel.stage('load model'):\n    time.sleep(1.5)\n"
        "    hog = []\n    while True:\n        hog.append(bytearray(16 * 2**20))\n"
    )
    env = clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint)
    proc = subprocess.Popen(
        ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$1" job.py', str(cg), PYTHON],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        wait_gone(sidecar_pid(tmp_path))
    finally:
        if proc.poll() is None:
            kill_and_reap(proc)
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), what="the cgroup to empty")
        cg.rmdir()
    stage = by_name(collector.spans())["load model"]
    assert stage.attributes["lora_otel.incomplete"] is True
    assert "killed by the OOM killer" in stage.status_message and "137" in stage.status_message, stage.status_message


def test_sidecar_from_another_environment(tmp_path: Path, collector) -> None:
    """The training environment has no OpenTelemetry at all (a bare venv, lora_otel on PYTHONPATH);
    LORA_OTEL_SIDECAR_PYTHON names a Python that has it: spans arrive, and the job never imported
    opentelemetry. Without the setting, one line says live export is off and why."""
    from procs import REPO

    venv = tmp_path / "trainenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    bare = str(venv / "bin" / "python")
    (tmp_path / "job.py").write_text(
        "import sys, lora_otel\nwith lora_otel.stage('train'):\n    pass\n"
        "print('otel modules:', sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [bare, "-m", "lora_otel", "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(LORA_OTEL_SIDECAR_PYTHON=sys.executable, LORA_OTEL_DIR="with", **base),
    )
    assert r.returncode == 0 and "otel modules: []" in r.stdout, r.stderr
    wait_gone(sidecar_pid(tmp_path / "with"))
    assert {"process", "arguments", "train"} <= set(by_name(collector.spans()))
    r = subprocess.run(
        [bare, "-m", "lora_otel", "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(LORA_OTEL_DIR="without", **base),
    )
    assert r.returncode == 0
    [line] = [line for line in r.stderr.splitlines() if "live export off" in line]
    assert "OpenTelemetry SDK is not installed for %s" % bare in line and "LORA_OTEL_SIDECAR_PYTHON" in line


def test_one_sidecar_follows_the_whole_job(tmp_path: Path, collector) -> None:
    """A job with a forked worker and a spawned worker (multiprocessing, as DataLoader workers are):
    one sidecar for all three processes, every span of every process arrives, all in one trace, each
    worker's root under the span that started it. (multiprocessing's resource tracker, no job of
    its own unless it lives to its first beat, joins that sidecar then or has none.)"""
    script = (
        "import multiprocessing as mp, os, lora_otel\n"
        "def work(tag):\n"
        "    with lora_otel.stage('work ' + tag):\n"
        "        pass\n"
        "if __name__ == '__main__':\n"
        "    with lora_otel.stage('start workers'):\n"
        "        for method in ('fork', 'spawn'):\n"
        "            p = mp.get_context(method).Process(target=work, args=(method,))\n"
        "            p.start()\n"
        "            p.join()\n"
    )
    proc = traced(tmp_path, script, collector.http_endpoint)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    found = journals(tmp_path / "lora-otel")
    assert len(found) == 4, found  # the job, its two workers, and multiprocessing's resource tracker
    roots = [read_journal(p).root for p in found]
    jobs = [r for r in roots if r.attrs.get("lora_otel.promoted")]
    assert len(jobs) >= 3, [r.attrs for r in roots]
    sidecars = {r.attrs.get("lora_otel.sidecar.pid") for r in jobs}
    assert len(sidecars) == 1 and None not in sidecars, "one sidecar for the job"
    assert all("lora_otel.sidecar.pid" not in r.attrs for r in roots if r not in jobs)
    wait_gone(sidecars.pop())
    received = collector.spans()
    assert_unique(received)
    names = [s.name for s in received]
    assert {"work fork", "work spawn", "start workers"} <= set(names), names
    assert names.count("process") == len(jobs)
    assert len({s.trace_id for s in received}) == 1, "one trace for the job"
    spans = by_name(received)
    job_root = next(s for s in received if s.name == "process" and s.parent_id is None)
    parents = sorted(
        s.parent_id == spans["start workers"].span_id for s in received if s.name == "process" and s is not job_root
    )
    # every worker, forked or spawned, and the resource tracker the spawn started, sits under the
    # span that started it
    assert parents == [True] * (len(jobs) - 1)
    assert all(s.attributes.get("lora_otel.incomplete") is None for s in received), "nothing left open"
    spawned = [read_journal(p) for p in found if "--multiprocessing-fork" in str(read_journal(p).root.attrs)]
    assert spawned and spawned[0].span(spawned[0].root.span_id) is not None
    assert next(s for s in spawned[0].spans if s.name == "arguments").end_ns is not None
