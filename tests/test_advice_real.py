"""What to do, end to end: a real job that stalls, and the advice in every view.

The classic launcher bug (`Popen(stdout=PIPE)`, then `wait()` before reading): the job blocks
printing to a full pipe that its launcher never reads. Its sidecar exports to a real collector (the
live follower, which also writes the stall record and the lines the job cannot). What must hold is
what the user sees: the ``what to do:`` line right after the why line on the job's stderr and in its
``--log``, naming the launcher (its pid and command) as the program that must read the pipe; the
same advice in ``inspect``, ``watch --once``, the report's HTML, the stall record, and the OTLP
span, event and log record (``lora_otel.diagnosis.advice``). The evidence is recorded (redacted,
generic) under tests/data/evidence/ for tests/test_rules_over_evidence.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import evidence_cases as cases
import pytest
from procs import PYTHON, clean_env, lora_otel_cli, wait_for

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

JOB = """\
import lora_otel
with lora_otel.stage("write report"):
    for i in range(2000):
        print("x" * 99)  # 200 kB: three pipes' worth
"""

LAUNCHER = """\
import subprocess, sys
p = subprocess.Popen([sys.executable, "job.py", "--log", "run.log"], stdout=subprocess.PIPE,
                     stderr=open("err.txt", "wb"))
with open("job.pid", "w") as f:
    f.write(str(p.pid))
p.wait()  # reads the job's output only after it ends: the job never ends
print(p.stdout.read())
"""

RECORDED = Path(__file__).resolve().parent / "data" / "evidence" / "full_pipe_launcher_waits.json"


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


@pytest.mark.collector
def test_full_pipe_advice_in_every_view(tmp_path: Path, collector) -> None:
    (tmp_path / "job.py").write_text(JOB, encoding="utf-8")
    (tmp_path / "launcher.py").write_text(LAUNCHER, encoding="utf-8")
    with open(tmp_path / "launcher.txt", "wb") as out:
        launcher = subprocess.Popen(
            [PYTHON, "launcher.py"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(
                LORA_OTEL="1",
                LORA_OTEL_STALL_AFTER="write report=2",
                OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint,
            ),
            start_new_session=True,
        )
    want = "what to do: The program that started this job (pid %d %s launcher.py) must read the job's stdout" % (
        launcher.pid,
        PYTHON,
    )
    try:
        # the job's own lines: in --log, the what-to-do line right after the why line; on its stderr too
        lines = wait_for(
            lambda: (
                [x for x in text(tmp_path / "run.log").splitlines() if "what to do: " in x]
                and text(tmp_path / "run.log").splitlines()
            ),
            timeout=90,
            what="the what-to-do line in run.log",
        )
        job = int(text(tmp_path / "job.pid"))
        [i] = [n for n, x in enumerate(lines) if "what to do: " in x]
        assert lines[i].startswith("[lora-otel][%d][" % job) and want in lines[i], lines[i]
        assert "or start the job with stdout to a file." in lines[i], lines[i]
        assert "why write report is stalled: Blocked writing to its stdout" in lines[i - 1], lines[i - 1 :]
        assert lines[i] in wait_for(lambda: text(tmp_path / "err.txt").splitlines(), what="stderr"), "on stderr too"

        journal = str(tmp_path / "run.log.otel.jsonl")
        [record] = read_journal(journal).stalls
        assert record["by"] == "sidecar" and want[len("what to do: ") :] in record["advice"], record

        shown = lora_otel_cli("inspect", journal, cwd=tmp_path)
        out = shown.stdout.splitlines()
        [n] = [k for k, x in enumerate(out) if x.startswith("what to do: ")]
        assert out[n - 1].startswith("STALLED: write report open for") and want in out[n], shown.stdout
        assert (
            json.loads(lora_otel_cli("inspect", journal, "--json", cwd=tmp_path).stdout)["stall"]["advice"]
            == (record["advice"])
        )
        watched = lora_otel_cli("watch", "--once", str(tmp_path), cwd=tmp_path)
        assert want in watched.stdout, watched.stdout
        report = lora_otel_cli("report", str(tmp_path), "-o", str(tmp_path / "job.html"), cwd=tmp_path)
        assert report.returncode == 0, report.stderr
        page = text(tmp_path / "job.html")
        assert '<p class="advice">what to do: The program that started this job (pid %d ' % launcher.pid in page

        # OTLP: the stalled span, its event and the log record carry lora_otel.diagnosis.advice
        span = wait_for(
            lambda: next((s for s in collector.spans() if s.name == "write report"), None),
            timeout=30,
            what="the stalled span at the collector",
        )
        assert span.attributes["lora_otel.diagnosis.advice"] == record["advice"], span.attributes
        logs = wait_for(
            lambda: [x for x in collector.logs() if x.attributes.get("lora_otel.diagnosis.advice")],
            timeout=30,
            what="the stall's log record",
        )
        assert logs[0].attributes["lora_otel.diagnosis.advice"] == record["advice"]

        _record(record, job, launcher.pid)
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except OSError:
            pass
        launcher.wait(timeout=30)

    # the job is gone: inspect still shows the last stall's advice
    gone = wait_for(
        lambda: (r := lora_otel_cli("inspect", journal, cwd=tmp_path)) and "what to do: " in r.stdout and r,
        timeout=60,
        what="inspect of the dead job",
    )
    assert want in gone.stdout, gone.stdout


HOLDER = """\
import fcntl, sys, time
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(600)
"""

LOCKED_JOB = """\
import fcntl, lora_otel
with lora_otel.stage("load model"):
    f = open("model.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
"""


def test_file_lock_held_by_a_live_process_advice_from_the_local_watchdog(tmp_path: Path) -> None:
    """No collector: the local watchdog. The job blocks in flock on a file an untraced process
    holds; its stderr has the why line and, right after it, what to do: wait for or stop that pid."""
    (tmp_path / "holder.py").write_text(HOLDER, encoding="utf-8")
    (tmp_path / "job.py").write_text(LOCKED_JOB, encoding="utf-8")
    lock = tmp_path / "model.lock"
    holder = subprocess.Popen([PYTHON, "holder.py", str(lock)], cwd=tmp_path, env=clean_env(), start_new_session=True)
    job = None
    try:
        wait_for((tmp_path / "model.lock.ready").exists, timeout=60, what="the holder to take the lock")
        with open(tmp_path / "err.txt", "wb") as err:
            job = subprocess.Popen(
                [PYTHON, "job.py"],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_STALL_AFTER="load model=2"),
                start_new_session=True,
            )
        lines = wait_for(
            lambda: (
                [x for x in text(tmp_path / "err.txt").splitlines() if "what to do: " in x]
                and text(tmp_path / "err.txt").splitlines()
            ),
            timeout=90,
            what="the what-to-do line on the job's stderr",
        )
        [i] = [n for n, x in enumerate(lines) if "what to do: " in x]
        assert "why load model is stalled: Waiting for a file lock on %s" % lock in lines[i - 1], lines
        assert lines[i].endswith(
            "what to do: Wait for pid %d (%s holder.py %s) to finish with %s, or stop it if it should not be "
            "running: the kernel frees its lock when it ends." % (holder.pid, PYTHON, lock, lock)
        ), lines[i]
        [journal] = [str(p) for p in (tmp_path / "j").glob("*.otel.jsonl")]
        shown = lora_otel_cli("inspect", journal, cwd=tmp_path)
        assert "\nwhat to do: Wait for pid %d " % holder.pid in shown.stdout, shown.stdout
    finally:
        for proc in (job, holder):
            if proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait(timeout=30)


FAKE_HUB = """\
import socket
PORT = int(open("port").read())

def hf_hub_download(repo_id, filename):
    s = socket.create_connection(("127.0.0.1", PORT))
    s.sendall(b"GET /%s/resolve/main/%s HTTP/1.1\\r\\n\\r\\n" % (repo_id.encode(), filename.encode()))
    return s.recv(1)
"""

HUB_JOB = """\
import lora_otel
from huggingface_hub import hf_hub_download
with lora_otel.stage("load model"):
    hf_hub_download("some-org/tiny-model", "model.safetensors")
"""


def test_hub_download_of_a_cached_model_advises_offline(tmp_path: Path) -> None:
    """A hub download that never answers (a local huggingface_hub package and a server that accepts
    and stays silent), of a repo whose snapshot is in the job's HF_HUB_CACHE: the watchdog reads the
    repo id from the job's own line and the cache from the job's environment, and says HF_HUB_OFFLINE=1."""
    import socket

    (tmp_path / "huggingface_hub").mkdir()
    (tmp_path / "huggingface_hub" / "__init__.py").write_text(FAKE_HUB, encoding="utf-8")
    (tmp_path / "job.py").write_text(HUB_JOB, encoding="utf-8")
    cache = tmp_path / "cache"
    snapshot = cache / "models--some-org--tiny-model" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}", encoding="utf-8")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    (tmp_path / "port").write_text(str(server.getsockname()[1]), encoding="utf-8")
    job = None
    try:
        with open(tmp_path / "err.txt", "wb") as err:
            job = subprocess.Popen(
                [PYTHON, "job.py"],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=clean_env(
                    LORA_OTEL="1",
                    LORA_OTEL_DIR=str(tmp_path / "j"),
                    LORA_OTEL_STALL_AFTER="load model=2",
                    HF_HUB_CACHE=str(cache),
                ),
                start_new_session=True,
            )
        line = wait_for(
            lambda: [x for x in text(tmp_path / "err.txt").splitlines() if "what to do: " in x],
            timeout=90,
            what="the what-to-do line on the job's stderr",
        )[0]
        assert line.endswith(
            "what to do: some-org/tiny-model is in the local Hugging Face cache already (%s): start the job with "
            "HF_HUB_OFFLINE=1 to load it from there without the network." % cache
        ), line
        [journal] = [str(p) for p in (tmp_path / "j").glob("*.otel.jsonl")]
        [record] = read_journal(journal).stalls
        assert record["diagnosis"].startswith("Waiting on the network inside huggingface_hub"), record
    finally:
        if job is not None:
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except OSError:
                pass
            job.wait(timeout=30)
        server.close()


RENDEZVOUS = """\
import glob, os, threading, time, lora_otel
import torch.distributed as dist
def watch():  # end the wait once the stall record is written (and 1 s more), as a user's Ctrl-C would
    while not any(b'"stall"' in open(p, "rb").read() for p in glob.glob("j/*.otel.jsonl")):
        time.sleep(0.1)
    time.sleep(1)
    print("stall seen", flush=True)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
with lora_otel.stage("join"):
    dist.init_process_group("gloo")  # WORLD_SIZE=2 left in the environment: rank 1 never comes
"""


@pytest.mark.torch
def test_rendezvous_advice_names_the_rank_to_start_and_the_address(tmp_path: Path) -> None:
    """``RANK=0 WORLD_SIZE=2`` left in the environment, one process: the advice names rank 1 as
    the one to start and the store's address from the job's recorded MASTER_ADDR:MASTER_PORT."""
    pytest.importorskip("torch.distributed")
    from collector import free_port

    port = free_port()
    (tmp_path / "job.py").write_text(RENDEZVOUS, encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env=clean_env(
            LORA_OTEL="1",
            LORA_OTEL_DIR="j",
            LORA_OTEL_STALL_AFTER="join=3",
            RANK="0",
            WORLD_SIZE="2",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        ),
    )
    assert r.returncode == 0 and r.stdout == "stall seen\n", (r.stdout, r.stderr[-3000:])
    [path] = (tmp_path / "j").glob("*.otel.jsonl")
    [record] = read_journal(str(path)).stalls
    assert record["advice"] == (
        "Start rank 1 of world size 2 with MASTER_ADDR and MASTER_PORT that reach 127.0.0.1:%d (this one is rank 0); "
        "if this job was meant to run alone, unset WORLD_SIZE and RANK in its environment." % port
    ), record


def _record(record: dict, job: int, launcher: int) -> None:
    """The evidence of this run, generic (pids and paths made generic), as ``<dir>/full_pipe_launcher_waits.json``
    (tests/evidence_cases.py's format); written only with LORA_OTEL_RECORD_EVIDENCE=<dir>."""
    out = cases.record_dir()
    if out is None:
        return
    evidence = {k: v for k, v in record["evidence"].items() if k.startswith(("pipe.", "process.state", "process.wait"))}
    raw = json.dumps(evidence).replace(str(launcher), "4711").replace(str(job), "4712").replace(PYTHON, "python")
    evidence = json.loads(raw)
    evidence["pipe.fd1.readers"] = [
        {"pid": 4711, "fd": 3, "cmdline": "python launcher.py", "state": "S", "wchan": "do_wait", "reading": False}
    ]
    evidence["pipe.writing_threads"] = ["4712 anon_pipe_write"]
    case = {
        "case": RECORDED.stem,
        "source": "tests/test_advice_real.py (real run, pids and paths made generic)",
        "stall": {"kind": "alive", "stage": "write report", "open_for_s": 30.0, "limit_s": 5.0},
        "now_ns": None,
        "journal": {"pid": 4712, "main_frames": None, "root_attrs": {"process.parent_pid": 4711}},
        "evidence": {"lora_otel.evidence." + k: v for k, v in evidence.items()},
        "expect": {
            "rule": "full pipe",
            "sentence": [
                cases.literal("Blocked writing to its stdout, a pipe nobody reads"),
                cases.literal("held by pid 4711"),
            ],
            "advice": [
                cases.literal(
                    "The program that started this job (pid 4711 python launcher.py) must read the job's stdout"
                ),
                cases.literal("or start the job with stdout to a file."),
            ],
        },
    }
    (out / RECORDED.name).write_text(json.dumps(case, indent=1) + "\n", encoding="utf-8")
