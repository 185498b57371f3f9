"""The claims of docs/security.md, checked on a real traced job with a live-export sidecar.

The job gets secrets in argv, in the environment and in ``OTEL_EXPORTER_OTLP_HEADERS``; its OTLP
endpoint is a refused port, so the sidecar starts, fails to export, and drains for 1 s. Then every
file lora_otel wrote under ``tmp_path`` is read back: none holds a secret, and each is readable by
its owner only. The suite may run as root, who can read anything: what is checked is the mode bits.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for
from test_sidecar import alive, execd_cmdline, wait_gone

from lora_otel.journal.reader import read_journal

pytestmark = pytest.mark.slow

HF_TOKEN = "hf_abcdefGHIJKLmnopqrSTUVWXyz0123456789"
PASSWORD = "hunter2"
HEADER_BEARER = "sk-live-SECRET123"
HEADER_KEY = "AKIAXXXXXXXXXXXXXXXX"
ENV_HF = "hf_ENVenvENVenvENVenvENVenvENVenv123456"
ENV_WANDB = "0123456789abcdef0123456789abcdef01234567"
ENV_AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
MARK_SECRET = "s3cr3t-mark-value-42"
SECRETS = [HF_TOKEN, PASSWORD, HEADER_BEARER, "SECRET123", HEADER_KEY, ENV_HF, ENV_WANDB, ENV_AWS, MARK_SECRET]
HEADERS = "authorization=Bearer %s,x-api-key=%s" % (HEADER_BEARER, HEADER_KEY)

JOB = r"""
import argparse, os, signal, subprocess, sys, time
import lora_otel

p = argparse.ArgumentParser()
p.add_argument("--hf-token")
p.add_argument("--password")
p.add_argument("--log")
a = p.parse_args()
own_log = open(a.log, "a")   # the program's log, open: lora_otel's lines join it (issue 36 item 4)
lora_otel.mark("logged in with api_key=%s" % os.environ["MARK_VALUE"])
with lora_otel.stage("train", api_key=os.environ["MARK_VALUE"]):
    lora_otel.progress(step=1, loss=0.5)
os.kill(os.getpid(), signal.SIGRTMIN + 10)   # a stack dump beside the journal (the stack request signal)
time.sleep(0.3)
subprocess.run([sys.executable, "-c", "pass"], check=True)   # a traced child: the .children registry
print("READY", flush=True)
deadline = time.time() + 30
while not os.path.exists("go") and time.time() < deadline:
    time.sleep(0.05)
"""


def _run_job(tmp_path: Path):
    """Run the job to the end; returns (stdout, stderr, sidecar pid, sidecar cmdline while alive)."""
    (tmp_path / "job.py").write_text(JOB)
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()  # the launcher's directory: lora_otel creates none for a --log
    env = clean_env(
        LORA_OTEL="1",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_HEADERS=HEADERS,
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        LORA_OTEL_DRAIN_S="1",
        HF_TOKEN=ENV_HF,
        WANDB_API_KEY=ENV_WANDB,
        AWS_SECRET_ACCESS_KEY=ENV_AWS,
        MARK_VALUE=MARK_SECRET,
    )
    proc = subprocess.Popen(
        [PYTHON, "job.py", "--hf-token", HF_TOKEN, "--password=" + PASSWORD, "--log", str(log)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        jpath = Path(str(log) + ".otel.jsonl")

        def side():
            if not jpath.exists():
                return None
            root = read_journal(jpath).root  # None between creating the file and its first record
            return root.attrs.get("lora_otel.sidecar.pid") if root is not None else None

        pid = wait_for(side, what="the sidecar's pid")

        cmdline = execd_cmdline(pid)  # (before its exec, the intermediate shell shows its own argv)
        environ_mode = os.stat("/proc/%d/environ" % pid).st_mode & 0o777 if alive(pid) else 0o400
        (tmp_path / "go").write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    wait_gone(pid)
    return out, err, pid, cmdline, environ_mode


def _written_files(tmp_path: Path) -> list:
    return sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("job.py", "go"))


def test_no_secret_in_any_file_or_output_and_owner_only_modes(tmp_path: Path) -> None:
    out, err, _, cmdline, environ_mode = _run_job(tmp_path)
    files = _written_files(tmp_path)
    names = [p.name for p in files]
    suffixes = (".otel.jsonl", ".stacks.txt", ".sidecar.log", ".children")
    for suffix in suffixes:
        assert any(n.endswith(suffix) for n in names), "no %s file among %s" % (suffix, names)
    log = tmp_path / "logs" / "train.log"
    assert log.exists() and "[lora-otel]" in log.read_text()
    # 1. no secret anywhere: files, the job's own stdout/stderr, the sidecar's world-readable cmdline
    for f in files:
        data = f.read_bytes()
        for s in SECRETS:
            assert s.encode() not in data, "secret %r found in %s" % (s[:10], f)
    for s in SECRETS:
        assert s not in out and s not in err, "secret %r on the job's stdout/stderr" % s[:10]
        assert s.encode() not in cmdline, "secret %r in the sidecar's /proc/PID/cmdline" % s[:10]
    # 2. lora_otel's own files: owner read/write only
    for f in files:
        if f.name.endswith(suffixes):
            mode = stat.S_IMODE(os.stat(f).st_mode)
            assert mode == 0o600, "%s has mode %o, not 600" % (f, mode)
    # 3. the --log file is the program's own: lora_otel only appends; when it creates it, it is
    #    created 0666 minus the umask, like any file the program writes (tests/test_harm_log_arg.py)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o666 & ~umask
    # 4. the sidecar's environment (it holds the headers: the exporter needs them) is owner-only
    assert environ_mode & 0o077 == 0


def test_redaction_is_visible_in_the_journal(tmp_path: Path) -> None:
    """The secrets are not merely missing: argv and env show ``[REDACTED]`` where they were."""
    _run_job(tmp_path)
    j = read_journal(tmp_path / "logs" / "train.log.otel.jsonl")
    args = j.root.attrs["process.command_args"]
    assert "--hf-token" in args and "[REDACTED]" in args and "--password=[REDACTED]" in args
    assert j.root.attrs.get("lora_otel.env.HF_TOKEN") == "[REDACTED]"
    assert not any(
        k.startswith("lora_otel.env.OTEL_") or k.endswith(("WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY"))
        for k in j.root.attrs
    ), "only allow-listed variables are recorded"


def test_sidecar_log_does_not_print_headers(tmp_path: Path) -> None:
    """The sidecar reports the failed export (refused port) without the header values."""
    _run_job(tmp_path)
    [log] = list(tmp_path.rglob("train.log.sidecar.log"))
    text = log.read_text()
    assert text, "the sidecar should have logged the refused export"
    for s in (HEADER_BEARER, "SECRET123", HEADER_KEY, HEADERS):
        assert s not in text


def test_journal_directory_is_owner_only(tmp_path: Path) -> None:
    """Without --log the journal directory ./lora-otel is created 0700 and its files 0600."""
    (tmp_path / "job.py").write_text("print('hi')\n")
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    d = tmp_path / "lora-otel"
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    [jp] = journals(d)
    assert stat.S_IMODE(os.stat(jp).st_mode) == 0o600


def test_training_process_opens_no_socket(tmp_path: Path) -> None:
    """With an endpoint set, the traced process itself holds no socket: the sidecar does the network."""
    (tmp_path / "job.py").write_text(
        "import os, time\n"
        "time.sleep(0.5)\n"
        "links = []\n"
        "for f in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        links.append(os.readlink('/proc/self/fd/' + f))\n"
        "    except OSError:\n"
        "        pass  # the descriptor listdir itself used\n"
        "print('SOCKETS=%d' % sum(link.startswith('socket:') for link in links))\n"
    )
    env = clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", LORA_OTEL_DRAIN_S="1")
    r = subprocess.run([PYTHON, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "SOCKETS=0" in r.stdout.splitlines(), r.stdout
