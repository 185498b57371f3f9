"""Harmless everywhere, signals: a stack request never kills, requeues or triggers anything of the program's.

Each case is a real program run the way a user runs it (``LORA_OTEL=1``, a live sidecar exporting
to a real collector, real exec, real ``subprocess``, real gevent, real PyTorch Lightning), with the
stall limits shortened by the variables a user sets (``LORA_OTEL_FROZEN_AFTER``). A stall is made
by holding the GIL in C (``ctypes.PyDLL``): the beat stops, the sidecar declares the process
frozen and asks for its stacks. What is asserted is what the user checks: their program's exit
status and output, their files, their signal handlers, what ``inspect`` says, what reached the
collector.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, wait_for
from test_sidecar import by_name, sidecar_pid, wait_gone

from lora_otel.journal.reader import read_journal

pytestmark = [
    pytest.mark.collector,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and real-time signals"),
    pytest.mark.slow,
]

STACK_SIGNAL = signal.SIGRTMIN + 10 if hasattr(signal, "SIGRTMIN") else 0
"""lora_otel's default stack request signal (docs/journal.md)."""

FROZEN = {"LORA_OTEL_FROZEN_AFTER": "2", "LORA_OTEL_POLL_S": "0.2"}

HOLD_GIL = '''
import ctypes, time

def hold_gil(seconds):
    """Freeze with the GIL held in C, as a native call that never returns would."""
    libc, end = ctypes.PyDLL(None), time.monotonic() + seconds
    while time.monotonic() < end:
        libc.sleep(max(1, int(end - time.monotonic() + 0.999)))
'''


def run_job(
    tmp_path: Path, script: str, endpoint: str, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess:
    """Run ``python job.py ARGS`` traced (``LORA_OTEL=1``) with a live sidecar, until it exits."""
    path = tmp_path / "job.py"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(
        [PYTHON, str(path), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(LORA_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **FROZEN, **env),
    )


def lora_otel_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "lora_otel", *args], capture_output=True, text=True, timeout=60, env=clean_env()
    )


def collector_text(collector) -> str:
    return collector.output.read_bytes().decode("utf-8", "replace")


def stacks_files(tmp_path: Path) -> list:
    return sorted((tmp_path / "lora-otel").glob("*.stacks.txt"))


def stacks_text(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in stacks_files(tmp_path))


def wait_sidecar_gone(tmp_path: Path) -> None:
    wait_gone(sidecar_pid(tmp_path), timeout=40)


class TestExec:
    """A process that exec'd another program is that program now: never signalled, never "frozen"."""

    def test_python_wrapper_that_execs_sleep(self, tmp_path: Path, collector) -> None:
        """``os.execv("/bin/sleep", ...)`` from a traced wrapper: the sleep outlives the frozen limit
        and exits 0; the journal has an ``exec`` record; inspect and the sidecar say "exec'd into
        /bin/sleep", not killed, frozen or stalled. (The wrapper says a stage first, which makes it a
        job with a sidecar: a wrapper that execs at once is none, and starts none.)"""
        t0 = time.monotonic()
        script = (
            'import os, lora_otel\nwith lora_otel.stage("prepare"):\n    pass\nos.execv("/bin/sleep", ["sleep", "5"])\n'
        )
        r = run_job(tmp_path, script, collector.http_endpoint)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
        assert time.monotonic() - t0 >= 5
        wait_sidecar_gone(tmp_path)
        [path] = journals(tmp_path / "lora-otel")
        journal = read_journal(path)
        assert journal.exec is not None and journal.exec["path"] == "/bin/sleep"
        assert journal.exec["argv"] == ["sleep", "5"]
        first = lora_otel_cli("inspect", str(path)).stdout.splitlines()[0]
        assert first.startswith("exec'd into /bin/sleep after "), first
        summary = lora_otel_cli("inspect", str(tmp_path / "lora-otel"), "--summary")
        assert summary.returncode == 0 and "finished" in summary.stdout, summary.stdout
        root = by_name(collector.spans())["process"]
        assert root.attributes["lora_otel.process.end"] == "exec'd into /bin/sleep"
        assert root.status_code != "STATUS_CODE_ERROR"
        assert "stall detected" not in collector_text(collector)

    def test_failed_exec_is_recorded_and_the_program_goes_on(self, tmp_path: Path) -> None:
        """An exec that fails (no such file) is journaled as failed and the process is still the
        traced program: it finishes normally and inspect says so."""
        script = (
            'import os\ntry:\n    os.execv("/nonexistent/prog", ["prog"])\nexcept OSError as e:\n'
            '    print("exec failed:", e.errno)\n'
        )
        (tmp_path / "job.py").write_text(script)
        r = subprocess.run(
            [PYTHON, "job.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=clean_env(LORA_OTEL="1")
        )
        assert r.returncode == 0 and "exec failed: 2" in r.stdout, r.stderr
        [path] = journals(tmp_path / "lora-otel")
        records = [line for line in path.read_text().splitlines() if '"k":"exec"' in line]
        assert len(records) == 2 and '"error":"FileNotFoundError' in records[1], records
        journal = read_journal(path)
        assert journal.exec is None and journal.exit is not None and not journal.problems
        assert lora_otel_cli("inspect", str(path)).stdout.startswith("finished normally")

    @pytest.mark.parametrize("how", ["execv", "execve"])
    def test_a_process_that_execs_python_says_it_started_once(self, tmp_path: Path, how: str) -> None:
        """A traced wrapper that execs another traced Python (axolotl's CLI does): one ``started
        pid N`` line, then ``pid N exec'd into …`` — not two starts; the marker is gone from the
        new image's environment, and an execve's own mapping is not changed."""
        call = (
            "os.execv(sys.executable, argv)"
            if how == "execv"
            else "env = dict(os.environ)\nos.execve(sys.executable, argv, env)"
        )
        script = (
            "import os, sys, lora_otel\nwith lora_otel.stage('prepare'):\n    pass\n"
            "argv = [sys.executable, '-c', 'import os; print(\"marker\", os.environ.get(\"LORA_OTEL_EXEC_FROM\"))']\n"
            + call
            + "\n"
        )
        (tmp_path / "job.py").write_text(script)
        r = subprocess.run(
            [PYTHON, "job.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=clean_env(LORA_OTEL="1")
        )
        assert r.returncode == 0 and r.stdout == "marker None\n", (r.stdout, r.stderr)
        started = [line for line in r.stderr.splitlines() if "] started pid " in line]
        execd = [
            line
            for line in r.stderr.splitlines()
            if "] pid %d exec'd into " % int(started[0].split("[")[2][:-1]) in line
        ]
        assert len(started) == 1 and len(execd) == 1, r.stderr

    @pytest.mark.parametrize("preexec", ["setsid", "setpgrp"])
    def test_popen_with_preexec_fn(self, tmp_path: Path, collector, preexec: str) -> None:
        """``subprocess.Popen([...], preexec_fn=os.setsid)`` (or ``os.setpgrp``) forks with the
        at-fork hooks (a child journal) and execs from C: the child exits 0, the job's summary is
        not "killed"."""
        script = (
            "import os, subprocess, sys\n"
            "p = subprocess.Popen(['/bin/sleep', '5'], preexec_fn=getattr(os, sys.argv[1]))\n"
            "print('child exit', p.wait(), flush=True)\n"
        )
        r = run_job(tmp_path, script, collector.http_endpoint, preexec)
        assert r.returncode == 0 and "child exit 0" in r.stdout, (r.stdout, r.stderr[-2000:])
        wait_sidecar_gone(tmp_path)
        summary = lora_otel_cli("inspect", str(tmp_path / "lora-otel"), "--summary")
        assert summary.returncode == 0 and "killed" not in summary.stdout, summary.stdout
        assert "stall detected" not in collector_text(collector)

    def test_exec_from_c_without_a_record(self, tmp_path: Path, collector) -> None:
        """An exec the process does in C (here libc's ``execv`` through ctypes: no ``exec`` record)
        is seen from outside by the image (``/proc/<pid>/exe``, auxv): the sleep survives the
        frozen limit and the sidecar says the process exec'd."""
        script = (
            "import ctypes\nargv = (ctypes.c_char_p * 3)(b'sleep', b'5', None)\n"
            "ctypes.CDLL(None).execv(b'/bin/sleep', argv)\n"
        )
        r = run_job(tmp_path, script, collector.http_endpoint)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
        wait_sidecar_gone(tmp_path)
        log = next((tmp_path / "lora-otel").glob("*.sidecar.log")).read_text()
        assert "process ended (exec'd into " in log and "sleep" in log, log
        assert "stall detected" not in collector_text(collector)

    @pytest.mark.torch
    def test_gevent_subprocess(self, tmp_path: Path, collector) -> None:
        """Plain ``subprocess.Popen`` under gevent's monkey-patching (fork in Python, then
        ``os.execvpe``): the child exits 0."""
        pytest.importorskip("gevent")
        script = (
            "from gevent import monkey\nmonkey.patch_all()\nimport subprocess\n"
            "p = subprocess.Popen(['/bin/sleep', '5'])\nprint('child exit', p.wait(), flush=True)\n"
        )
        r = run_job(tmp_path, script, collector.http_endpoint)
        assert r.returncode == 0 and "child exit 0" in r.stdout, (r.stdout, r.stderr[-2000:])
        wait_sidecar_gone(tmp_path)
        summary = lora_otel_cli("inspect", str(tmp_path / "lora-otel"), "--summary")
        assert summary.returncode == 0 and "killed" not in summary.stdout, summary.stdout


LIGHTNING = (
    HOLD_GIL
    + """
import os, sys
import torch
import lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, i):
        if sys.argv[1] == "during" and i == 1:
            hold_gil(6)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)
trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=os.getcwd())
trainer.fit(Tiny(), data)
if sys.argv[1] == "after":
    # What a job does after fit (evaluate, save) before it freezes: long enough for the beat to take
    # the stack signal back (Lightning reset it to SIG_DFL), which a loaded machine can delay by
    # seconds, so the job waits to see it caught again (its bit in SigCgt), 60 s at most.
    import signal as sig_
    stack_signal = sig_.SIGRTMIN + 10
    def caught():
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith("SigCgt:"))
        return int(line.split()[1], 16) >> (stack_signal - 1) & 1
    deadline = time.monotonic() + 60
    while not caught() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    hold_gil(8)
print("done", flush=True)
"""
)


@pytest.mark.torch
class TestLightning:
    """Real PyTorch Lightning: its SIGUSR1 auto-requeue and its signal teardown are left alone."""

    @pytest.fixture(autouse=True)
    def _lightning(self) -> None:
        pytest.importorskip("lightning")

    def test_slurm_auto_requeue_is_never_triggered(self, tmp_path: Path, collector) -> None:
        """Slurm variables set (Lightning registers its SIGUSR1 auto-requeue handler) and a freeze
        inside ``fit``: no requeue (``scontrol`` never called, no ``hpc_ckpt`` file), the job ends
        normally, and the stacks were still gathered. ``scontrol`` is a stand-in script first on
        PATH that records being called: no Slurm runs here."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        called = tmp_path / "scontrol.called"
        (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" >> %s\n' % called)
        (bin_dir / "scontrol").chmod(0o755)
        slurm = {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": "1",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_NODELIST": "localhost",
            "PATH": "%s:%s" % (bin_dir, os.environ.get("PATH", "")),
        }
        r = run_job(tmp_path, LIGHTNING, collector.http_endpoint, "during", timeout=120, **slurm)
        assert r.returncode == 0 and "done" in r.stdout, (r.returncode, r.stderr[-3000:])
        assert not called.exists(), "scontrol was called: %s" % called.read_text()
        assert not list(tmp_path.rglob("hpc_ckpt*")), "Lightning's requeue wrote a checkpoint"
        assert "hold_gil" in stacks_text(tmp_path), "the stacks were not gathered"

    def test_stall_after_fit_does_not_kill(self, tmp_path: Path, collector) -> None:
        """After ``trainer.fit()`` Lightning restores every signal to what ``signal.getsignal``
        said (SIG_DFL), which removes faulthandler from lora_otel's signal too: a later freeze does
        not kill the job, and its stacks are gathered (the beat registers the handler again at its
        next beat; the job waits for that, as a freeze before it is not signalled at all)."""
        r = run_job(tmp_path, LIGHTNING, collector.http_endpoint, "after", timeout=120)
        assert r.returncode == 0 and "done" in r.stdout, (r.returncode, r.stderr[-3000:])
        assert "hold_gil" in stacks_text(tmp_path), "the stacks were not gathered"


class TestHandlers:
    """A program's own signal handlers are never replaced or triggered; no handler means the default."""

    def test_own_sigusr1_handler_is_never_triggered(self, tmp_path: Path, collector) -> None:
        """A program with its own SIGUSR1 handler (installed after start, as frameworks do) that
        freezes: the stall is declared and its stacks gathered, the handler never runs."""
        script = HOLD_GIL + (
            "import signal\ncalls = []\nsignal.signal(signal.SIGUSR1, lambda s, f: calls.append(s))\n"
            "hold_gil(6)\nprint('handler calls:', len(calls), flush=True)\n"
        )
        r = run_job(tmp_path, script, collector.http_endpoint)
        assert r.returncode == 0 and "handler calls: 0" in r.stdout, (r.stdout, r.stderr[-2000:])
        wait_sidecar_gone(tmp_path)
        assert "stall detected" in collector_text(collector)
        assert "hold_gil" in stacks_text(tmp_path)

    def test_no_sigusr1_handler_dies_of_sigusr1(self, tmp_path: Path) -> None:
        """Without a handler of its own, a traced program dies of SIGUSR1 (exit status -10) as it
        would without lora_otel (Slurm relies on it), and no stacks are written."""
        (tmp_path / "job.py").write_text("import time\nprint('ready', flush=True)\ntime.sleep(30)\n")
        proc = subprocess.Popen(
            [PYTHON, "job.py"],
            cwd=tmp_path,
            env=clean_env(LORA_OTEL="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            while "ready" not in (proc.stdout.readline() or "ready"):
                pass
            proc.send_signal(signal.SIGUSR1)
            assert proc.wait(timeout=20) == -signal.SIGUSR1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        assert not stacks_text(tmp_path)

    @pytest.mark.torch
    def test_program_that_takes_signals_with_sigwait(self, tmp_path: Path, collector) -> None:
        """A service that blocks every signal and takes them with ``sigwait`` (its shutdown
        loop): a stall never sends it a signal it would receive as its own and act on — the stack
        request goes to a thread that runs the handler, or is not sent and the evidence says why.
        (Found by the hostile trial: it got signal 44 and shut down.)"""
        # It takes signals until its journal holds the stall record, and 2 s more (a stack request
        # sent at the stall would be pending by then). The stall is one between stages, after the
        # signals are blocked and the arguments parsed: `import torch` (seconds on a loaded machine)
        # and the arguments stage open around it have limits far from it.
        script = (
            "import glob, signal, sys, time\nimport torch  # a training job (quiet time alone is no stall elsewhere)\n"
            "sigs = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, sigs)\n"
            "import argparse\nargparse.ArgumentParser().parse_args()  # the stages end: quiet time is between them\n"
            "got, seen, deadline = [], None, time.monotonic() + 90\n"
            "while time.monotonic() < deadline and (seen is None or time.monotonic() < seen + 2):\n"
            "    s = signal.sigtimedwait(sigs, 0.25)\n"
            "    if s: got.append(s.si_signo)\n"
            "    if seen is None and any(b'\"stall\"' in open(p, 'rb').read()\n"
            "                            for p in glob.glob('lora-otel/**/*.otel.jsonl', recursive=True)):\n"
            "        seen = time.monotonic()\n"
            "print('got', got or None, 'stall seen', seen is not None, flush=True)\n"
        )
        r = run_job(
            tmp_path,
            script,
            collector.http_endpoint,
            timeout=150,
            LORA_OTEL_STALL_AFTER="arguments=600,import=600,between=2",
        )
        assert r.returncode == 0 and "got None stall seen True" in r.stdout, (r.stdout, r.stderr[-2000:])
        wait_sidecar_gone(tmp_path)
        text = collector_text(collector)
        assert "stall detected" in text
        # torch's own threads, started before the mask, run the handler: the request goes to one of
        # them alone (tgkill), the stacks are had, and the program's sigtimedwait got nothing (above).
        # Without such a thread the evidence says why no request was sent.
        had = "lora_otel.evidence.python.stacks: Str(" in text
        refused = "waits for signals (sigwait)" in text or "blocks signal %d" % STACK_SIGNAL in text
        assert had or refused, text[-3000:]

    def test_own_handler_for_the_stack_signal(self, tmp_path: Path, collector) -> None:
        """A program that installs its own handler for lora_otel's stack request signal after start:
        a stall never triggers it, and the evidence says why there are no stacks. (py-spy off: with it
        the stacks are read from outside and no signal is considered — test_stack_requests.py.)"""
        signum = STACK_SIGNAL
        script = HOLD_GIL + (
            "import signal, time\ncalls = []\nsignal.signal(%d, lambda s, f: calls.append(s))\n"
            "time.sleep(1.5)\nhold_gil(6)\nprint('handler calls:', len(calls), flush=True)\n" % signum
        )
        r = run_job(tmp_path, script, collector.http_endpoint, LORA_OTEL_PY_SPY="0")
        assert r.returncode == 0 and "handler calls: 0" in r.stdout, (r.stdout, r.stderr[-2000:])
        wait_sidecar_gone(tmp_path)
        text = collector_text(collector)
        assert "stall detected" in text
        assert "not requested: the program installed its own handler for signal %d" % signum in text
        [path] = journals(tmp_path / "lora-otel")
        assert "lora_otel.stacks.off" in read_journal(path).root.attrs

    def test_reused_stacks_descriptor_is_not_signalled(self, tmp_path: Path, collector) -> None:
        """After the program closes every descriptor (``os.closerange(3, SC_OPEN_MAX)``, daemonising
        code) and opens its own files, the stacks file's descriptor is gone or, if a file took its
        number (``dup2`` onto it), someone else's: a stall then sends no signal (a dump would go
        nowhere or into the user's file); the evidence says why. (The descriptor sits high, so a
        plain ``closerange(3, 1024)`` does not reach it; py-spy off, which would read the stacks
        without any signal.)"""
        script = HOLD_GIL + (
            "import os\nos.closerange(3, os.sysconf('SC_OPEN_MAX'))\n"
            "files = [open('user%d.bin' % i, 'wb') for i in range(8)]\n"
            "hold_gil(6)\nprint('done', flush=True)\n"
        )
        r = run_job(tmp_path, script, collector.http_endpoint, LORA_OTEL_PY_SPY="0")
        assert r.returncode == 0 and "done" in r.stdout, (r.stdout, r.stderr[-2000:])
        wait_for(lambda: "stall detected" in collector_text(collector), timeout=20, what="the stall")
        for user_file in tmp_path.glob("user*.bin"):
            assert b"most recent call first" not in user_file.read_bytes(), "a stack dump landed in %s" % user_file
        assert "not requested: descriptor" in collector_text(collector)


def test_bad_stack_signal_value_warns_once_and_uses_the_default(tmp_path: Path) -> None:
    """``LORA_OTEL_STACK_SIGNAL=SIGKILL`` (not a number) or ``9``: one line on stderr, the default
    signal is used; a valid number is used as given (said by a job, when it registers its stack
    dump: a stage makes this one a job)."""
    (tmp_path / "job.py").write_text("import lora_otel\nwith lora_otel.stage('x'):\n    pass\n")
    default = STACK_SIGNAL
    for value, expected in (("SIGKILL", default), ("9", default), ("50", 50)):
        d = tmp_path / value
        r = subprocess.run(
            [PYTHON, str(tmp_path / "job.py")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(d), LORA_OTEL_STACK_SIGNAL=value),
        )
        assert r.returncode == 0, r.stderr
        [path] = journals(d)
        assert read_journal(path).root.attrs["lora_otel.stacks.signal"] == expected
        assert r.stderr.count("LORA_OTEL_STACK_SIGNAL") == (0 if value == "50" else 1), r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stack_signal_set_to_a_standard_one_never_takes_its_meaning(tmp_path: Path, sig: int) -> None:
    """A parent exported ``LORA_OTEL_STACK_SIGNAL=15`` (or 1): the running job still dies of
    ``kill -TERM`` (``-HUP``) as without lora_otel, and one line says the value was not used.
    Before, faulthandler took the signal over and the job went on after ``kill``, to its end."""
    prog = "import time, lora_otel\nwith lora_otel.stage('x'):\n    print('READY', flush=True)\n    time.sleep(60)\n"
    for traced in ("0", "1"):
        p = subprocess.Popen(
            [PYTHON, "-c", prog],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(LORA_OTEL=traced, LORA_OTEL_DIR=str(tmp_path / traced), LORA_OTEL_STACK_SIGNAL=str(int(sig))),
        )
        try:
            assert p.stdout is not None and p.stdout.readline() == b"READY\n"
            if traced == "1":  # the stack handler is registered once the stage made it a job
                [job] = wait_for(lambda: journals(tmp_path / "1"), what="the journal")
                wait_for(lambda j=job: "lora_otel.stacks.signal" in read_journal(j).root.attrs, what="the handler")
            os.kill(p.pid, sig)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        assert p.returncode == -sig, (traced, err.decode(errors="replace"))
        assert err.decode().count("LORA_OTEL_STACK_SIGNAL") == int(traced)


def _wchan(pid: int) -> str:
    """Where the process's main thread sleeps in the kernel (``anon_pipe_read``: reading a pipe)."""
    try:
        return Path("/proc/%d/wchan" % pid).read_text()
    except OSError:
        return ""


TEARDOWN_PROG = r"""
import ctypes, signal, sys
import lora_otel   # a job: the stack request handler is lora_otel's
if sys.argv[1:] == ["ignore"]:
    signal.signal(signal.SIGRTMIN + 10, signal.SIG_IGN)   # the program's own choice, after lora_otel's

# Slow in C after the interpreter is gone, as a gloo or NCCL teardown is: an exit handler of the C
# library's that waits for a line on stdin.
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.getchar, ctypes.c_void_p), None, None)
print("READY", flush=True)
"""


@pytest.mark.parametrize(
    "case, sig, env, code",
    [
        ("request", STACK_SIGNAL, {}, 0),  # killed by 44 before the fix
        ("ignore", STACK_SIGNAL, {}, 0),  # the program's SIG_IGN: killed by 44 before (faulthandler's default back)
        ("sigterm", signal.SIGUSR2, {"LORA_OTEL_STACK_SIGNAL": "12"}, -signal.SIGUSR2),  # as without lora_otel
    ],
)
def test_a_signal_during_the_c_teardown_after_exit_does_as_without_lora_otel(
    tmp_path: Path, case: str, sig: int, env: dict, code: int
) -> None:
    """faulthandler gives the stack request signal its default action back when the interpreter
    finalizes, and a real-time signal's default action ends the process: a request that came during
    a slow C++ teardown after that (gloo's, NCCL's) killed a process exiting 0 by signal 44, and a
    program that ignored the signal itself lost its SIG_IGN. lora_otel's exit hook now ignores its
    real-time signal from there on and keeps the program's SIG_IGN; a stack signal chosen by
    ``LORA_OTEL_STACK_SIGNAL`` (SIGUSR2 here, a standard signal) gets its default back, so a
    supervisor's signal still ends a stuck teardown, as without lora_otel."""
    (tmp_path / "prog.py").write_text(TEARDOWN_PROG)
    p = subprocess.Popen(
        [PYTHON, "prog.py", case],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(LORA_OTEL="1", **env),
    )
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline() == b"READY\n"
        [path] = wait_for(lambda: journals(tmp_path / "lora-otel"), what="the journal")
        assert read_journal(path).root.attrs.get("lora_otel.stacks.signal") == sig
        wait_for(lambda: read_journal(path).exit is not None, what="the exit record (the exit hook ran)")
        # the interpreter then finalizes and the C exit handler waits on stdin: the signals come
        # now (several, as a sidecar asks again)
        wait_for(lambda: "pipe" in _wchan(p.pid), what="the C exit handler reading stdin")
        for _ in range(5):
            os.kill(p.pid, sig)
        _, err = p.communicate(b"\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == code, err.decode(errors="replace")
