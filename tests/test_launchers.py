"""Launchers for real (docs/launchers.md): torchrun, accelerate launch, `lora-otel run` around
torchrun, a Slurm task's environment, and parents shaped like the training UIs.

The distributed runs are real: two CPU ranks on gloo doing a few optimizer steps with an
all_reduce. Every process of a job must share one trace (``TRACEPARENT``), each rank's root span
must carry ``rank``, ``local_rank`` and ``world_size``, and each rank's root must hang below a span
of the launcher's journal. Anything a test started that is still running at teardown (ranks live in
sessions of their own, so a process group kill does not reach them) is killed by pid, checked
against the start time in its journal.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import PYTHON, REPO, clean_env, journals

from collector import free_port
from lora_otel.journal.reader import Journal, read_journal, start_ticks_from_stat

pytestmark = pytest.mark.slow

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_ACCELERATE = HAVE_TORCH and importlib.util.find_spec("accelerate") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
needs_accelerate = pytest.mark.skipif(not HAVE_ACCELERATE, reason="accelerate is not installed")

STEPS = 3
JOB_TIMEOUT = 120

TRAIN = textwrap.dedent(f"""
    import os, sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range({STEPS}):
        model(torch.ones(2, 4)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    os.write(1, b"RANK_DONE %d\\n" % rank)  # one write: the ranks share the launcher's stdout
    if os.environ.get("FAIL_RANK") == str(rank):
        time.sleep(0.5)  # let the other rank finish first, so only this one fails
        sys.exit(3)
""")

# Variables a launcher sets for its ranks: none may leak in from the environment running pytest.
_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
)
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "TORCHELASTIC_", "ACCELERATE_", "PMI_")


def job_env(**extra: str) -> dict:
    """``clean_env`` without any launcher's rank variables, one thread per rank, plus ``extra``."""
    env = {k: v for k, v in clean_env().items() if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def console_script(name: str, module: str) -> list:
    """The venv's console script (what users type), else ``python -m module``."""
    script = Path(PYTHON).parent / name
    return [str(script)] if script.exists() else [PYTHON, "-m", module]


def _alive(j: Journal) -> bool:
    """The journal's process still exists (same pid *and* start time: never a re-used pid)."""
    if j.pid is None or j.start_ticks is None:
        return False
    try:
        with open(f"/proc/{j.pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return start_ticks_from_stat(stat) == j.start_ticks and stat.rpartition(")")[2].split()[:1] != ["Z"]


class Reaper:
    """Kills, at teardown, what a test left running: the launcher's process group, then every
    process whose journal under the registered directories says it is still alive."""

    def __init__(self) -> None:
        self.dirs: list = []
        self.procs: list = []

    def run(
        self, cmd: list, cwd: Path, env: dict, dirs: list, timeout: float = JOB_TIMEOUT
    ) -> subprocess.CompletedProcess:
        self.dirs.extend(dirs)
        p = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.procs.append(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.reap()
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                out, err = "(still held open)", ""
            pytest.fail("%s did not finish in %s s\nstdout:\n%s\nstderr:\n%s" % (cmd, timeout, out, err))
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def run_torch_job(self, make_cmd, cwd: Path, env: dict, dirs: list) -> subprocess.CompletedProcess:
        """Run a torchrun/accelerate job; once more (fresh port, emptied journal dirs) when a rank
        died by SIGABRT. That is torch's own race between gloo's worker threads and interpreter
        shutdown (pytorch/pytorch PR 179291), seen here once under CI load after a rank had written
        its normal exit record (so after lora_otel's exit hook ran), and reproduced without
        lora_otel at all: the same script under plain torchrun aborted with "terminate called
        without an active exception" in 2 of 15 runs (2026-12-01). A second abort fails the test."""
        r = self.run(make_cmd(), cwd, env, dirs)
        if "(SIGABRT)" in r.stderr:
            self.reap()
            for d in dirs:
                for path in journals(Path(d)) if Path(d).is_dir() else []:
                    base = str(path)[: -len(".otel.jsonl")]
                    for suffix in (".otel.jsonl", ".stacks.txt", ".sidecar.log", ".children"):
                        Path(base + suffix).unlink(missing_ok=True)
            for log in Path(cwd).rglob("*.log"):
                log.unlink()
            r = self.run(make_cmd(), cwd, env, dirs)
        return r

    def reap(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for d in self.dirs:
            for path in journals(Path(d)) if Path(d).is_dir() else []:
                j = read_journal(path)
                if _alive(j):
                    try:
                        os.kill(j.pid, signal.SIGKILL)
                    except OSError:
                        pass
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    r = Reaper()
    try:
        yield r
    finally:
        r.reap()


def read_all(directory: Path) -> list:
    return [read_journal(p) for p in journals(directory)]


def explain(r: subprocess.CompletedProcess) -> str:
    return "exit status %s\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout[-4000:], r.stderr[-4000:])


def assert_one_job(found: list, world_size: int = 2) -> tuple:
    """One launcher and ``world_size`` ranks sharing one trace, each rank below the launcher.

    Returns ``(launcher, ranks by rank)``.
    """
    assert all(j.problems == [] for j in found), [j.problems for j in found]
    assert len({j.trace_id for j in found}) == 1, "more than one trace: %s" % [j.trace_id for j in found]
    ranked = [j for j in found if "rank" in j.root.attrs]
    launchers = [j for j in found if "rank" not in j.root.attrs]
    assert len(launchers) == 1 and len(ranked) == world_size, [j.root.attrs.get("rank") for j in found]
    launcher = launchers[0]
    assert launcher.root.parent_id is None  # no TRACEPARENT given: the launcher starts the trace
    by_rank = {j.root.attrs["rank"]: j for j in ranked}
    assert sorted(by_rank) == list(range(world_size))
    for rank, j in by_rank.items():
        attrs = j.root.attrs
        assert attrs["local_rank"] == rank and attrs["world_size"] == world_size, attrs
        parent = launcher.span(j.root.parent_id)
        assert parent is not None, "rank %d's root is not below a span of the launcher's journal" % rank
        assert j.root.attrs["process.parent_pid"] == launcher.pid
        training = [s for s in j.spans if s.name == "training"]
        assert len(training) == 1, [s.name for s in j.spans]
        assert training[0].attrs["lora_otel.training.steps"] == STEPS
        assert training[0].parent_id == j.root.span_id
        assert j.steps == STEPS
    return launcher, by_rank


def assert_exits(launcher: Journal, by_rank: dict, launcher_code: int = 0, rank_codes=None) -> None:
    rank_codes = rank_codes or {}
    assert launcher.exit is not None and launcher.exit["code"] == launcher_code, launcher.exit
    for rank, j in by_rank.items():
        assert j.exit is not None and j.exit["code"] == rank_codes.get(rank, 0), (rank, j.exit)
        assert j.root.end_ns is not None


# --- torchrun ------------------------------------------------------------------------------------


@needs_torch
def test_torchrun_ranks_share_the_launchers_trace(tmp_path: Path, reaper: Reaper) -> None:
    """`LORA_OTEL=1 python -m torch.distributed.run --nproc-per-node 2 train.py`: three journals
    (torchrun's own process and both ranks), one trace, ranks below torchrun's root, rank attributes."""
    (tmp_path / "train.py").write_text(TRAIN)
    jdir = tmp_path / "j"
    cmd = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "train.py",
    ]
    r = reaper.run_torch_job(
        lambda: [*cmd[: cmd.index("--master-port") + 1], str(free_port()), *cmd[cmd.index("--master-port") + 2 :]],
        tmp_path,
        job_env(LORA_OTEL="1", LORA_OTEL_DIR=str(jdir)),
        [jdir],
    )
    assert r.returncode == 0, explain(r)
    assert "RANK_DONE 0" in r.stdout and "RANK_DONE 1" in r.stdout
    found = read_all(jdir)
    assert len(found) == 3, [j.path for j in found]
    launcher, by_rank = assert_one_job(found)
    assert launcher.root.attrs["process.executable.path"] == PYTHON
    assert_exits(launcher, by_rank)


@needs_torch
def test_lora_otel_run_around_torchrun(tmp_path: Path, reaper: Reaper) -> None:
    """`lora-otel run --dir runs -- torchrun ... -- train.py --log runs/a.log` (the console script):
    the same one job, all of it in runs/ (torchrun's journal there by --dir, the ranks' beside their
    --log), and a failing rank's status comes through torchrun and `lora-otel run` to the caller.

    The `--` before train.py is torchrun's, not lora_otel's: torchrun 2.13 refuses a script option
    spelled `--log` after the script (an ambiguous abbreviation of its own --log-dir/--logs-specs).
    """
    (tmp_path / "train.py").write_text(TRAIN)
    runs = tmp_path / "runs"
    cmd = [
        PYTHON,
        "-m",
        "lora_otel",
        "run",
        "--dir",
        str(runs),
        "--",
        *console_script("torchrun", "torch.distributed.run"),
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "--",
        "train.py",
        "--log",
        "runs/a.log",
    ]
    r = reaper.run_torch_job(
        lambda: [*cmd[: cmd.index("--master-port") + 1], str(free_port()), *cmd[cmd.index("--master-port") + 2 :]],
        tmp_path,
        job_env(FAIL_RANK="1"),
        [runs],
    )
    assert r.returncode == 1, explain(r)  # torchrun exits 1 when a rank failed; passed through
    assert "RANK_DONE 0" in r.stdout and "RANK_DONE 1" in r.stdout
    found = read_all(runs)
    assert len(found) == 3, [j.path for j in found]
    launcher, by_rank = assert_one_job(found)
    assert_exits(launcher, by_rank, launcher_code=1, rank_codes={1: 3})
    assert launcher.root.status == "error"
    assert by_rank[0].root.status == "ok" and by_rank[1].root.status == "error"
    assert sorted(Path(j.path).name.startswith("a.log.") for j in found) == [False, True, True]
    assert not Path(launcher.path).name.startswith("a.log")
    # (short ranks: their lines in their journals, not in a.log, which none of them needed: issue 36)
    assert all(any(ln.msg.startswith("started pid %d" % j.pid) for ln in j.lines) for j in by_rank.values())
    # `lora-otel inspect DIR` shows them as one job.
    inspect = subprocess.run(
        [PYTHON, "-m", "lora_otel", "inspect", str(runs), "--json"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inspect.returncode == 0, inspect.stderr
    jobs = json.loads(inspect.stdout)["jobs"]
    assert len(jobs) == 1 and len(jobs[0]["processes"]) == 3, jobs


# --- accelerate launch ---------------------------------------------------------------------------


@needs_accelerate
def test_accelerate_launch_ranks_share_the_launchers_trace(tmp_path: Path, reaper: Reaper) -> None:
    """`LORA_OTEL=1 accelerate launch --multi_gpu --num_processes 2 train.py`, flags only: accelerate
    runs torch's elastic agent inside its own process, which starts the two ranks.

    (`--cpu --num_processes 2` would start ONE process: accelerate 1.x takes several CPU processes
    only through mpirun. On a machine without GPUs `--multi_gpu` still starts plain processes, and
    train.py picks gloo itself.) HOME and HF_HOME point into tmp_path, so no accelerate config of the
    user's is read and nothing is written to the user's home.
    """
    (tmp_path / "train.py").write_text(TRAIN)
    jdir = tmp_path / "j"
    home = tmp_path / "home"
    home.mkdir()
    cmd = [
        *console_script("accelerate", "accelerate.commands.accelerate_cli"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "train.py",
    ]
    env = job_env(LORA_OTEL="1", LORA_OTEL_DIR=str(jdir), HOME=str(home), HF_HOME=str(home / "hf"))
    r = reaper.run_torch_job(
        lambda: (
            [
                *cmd[: cmd.index("--main_process_port") + 1],
                str(free_port()),
                *cmd[cmd.index("--main_process_port") + 2 :],
            ]
        ),
        tmp_path,
        env,
        [jdir],
    )
    assert r.returncode == 0, explain(r)
    assert "RANK_DONE 0" in r.stdout and "RANK_DONE 1" in r.stdout
    found = read_all(jdir)
    assert len(found) == 3, [j.path for j in found]
    launcher, by_rank = assert_one_job(found)
    assert_exits(launcher, by_rank)
    assert launcher.root.attrs["service.name"] == "accelerate"
    assert list(home.rglob("*")) == []  # flags only: nothing written to HOME


# --- Slurm ----------------------------------------------------------------------------------------

# docs/launchers.md: what a batch script puts before `srun` so that every task shares one trace.
SBATCH_TRACEPARENT = (
    "export TRACEPARENT=\"00-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')-"
    "$(od -An -tx1 -N8 /dev/urandom | tr -d ' \\n')-01\""
)


def run_task(tmp_path: Path, jdir: Path, **env: str) -> Journal:
    """One Slurm-like task: a plain script run with LORA_OTEL=1 and ``env``; its journal."""
    before = set(journals(jdir))
    r = subprocess.run(
        [PYTHON, str(tmp_path / "task.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=job_env(LORA_OTEL="1", LORA_OTEL_DIR=str(jdir), **env),
    )
    assert r.returncode == 0, explain(r)
    new = set(journals(jdir)) - before
    assert len(new) == 1, new
    return read_journal(new.pop())


def test_slurm_task_variables_give_rank_attributes(tmp_path: Path) -> None:
    """What `srun` sets (SLURM_PROCID/LOCALID/NTASKS), without torchrun's variables, gives the root
    span rank/local_rank/world_size; tasks given the batch script's TRACEPARENT share one trace."""
    assert SBATCH_TRACEPARENT in (REPO / "docs" / "launchers.md").read_text(encoding="utf-8")
    (tmp_path / "task.py").write_text("print('task done')\n")
    jdir = tmp_path / "j"
    tp = subprocess.run(
        ["bash", "-c", SBATCH_TRACEPARENT + '; printf %s "$TRACEPARENT"'],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    _, trace_id, parent_id, _ = tp.split("-")
    tasks = {}
    for procid, localid in ((3, 1), (5, 1)):
        tasks[procid] = run_task(
            tmp_path,
            jdir,
            SLURM_PROCID=str(procid),
            SLURM_LOCALID=str(localid),
            SLURM_NTASKS="8",
            SLURM_JOB_ID="4242",
            TRACEPARENT=tp,
        )
    root = tasks[3].root.attrs
    assert (root["rank"], root["local_rank"], root["world_size"]) == (3, 1, 8)
    assert tasks[5].root.attrs["rank"] == 5
    for j in tasks.values():
        assert j.trace_id == trace_id and j.root.parent_id == parent_id
        assert j.exit is not None and j.exit["code"] == 0


def test_torchrun_variables_win_over_slurm_ones(tmp_path: Path) -> None:
    """`srun torchrun ...`: a rank sees both; torchrun's (the global rank) win over the task's."""
    (tmp_path / "task.py").write_text("print('rank done')\n")
    j = run_task(
        tmp_path,
        tmp_path / "j",
        SLURM_PROCID="1",
        SLURM_LOCALID="0",
        SLURM_NTASKS="2",
        RANK="9",
        LOCAL_RANK="1",
        WORLD_SIZE="16",
    )
    attrs = j.root.attrs
    assert (attrs["rank"], attrs["local_rank"], attrs["world_size"]) == (9, 1, 16)


# --- UIs -------------------------------------------------------------------------------------------

TRAINER = textwrap.dedent("""
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--log")
    p.add_argument("--config_file")
    a = p.parse_args()
    print("TRAINER running", flush=True)
""")

# A Python UI of the training venv (kohya_ss's Gradio GUI, lora-scripts' server): it starts the
# trainer as lora-scripts does (`python -m accelerate.commands.launch ...`, the UI's environment
# copied), shows the trainer's output in its log panel, then starts a second run directly.
PYTHON_UI = textwrap.dedent("""
    import os, subprocess, sys
    if os.environ.get("UI_SERVER"):
        import uvicorn  # the web server lora-scripts' UI runs on (a stub package here)
    runs = [
        [sys.executable, "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1",
         "--quiet", "trainer.py", "--config_file", "cfg.toml", "--log", "runs/a.log"],
        [sys.executable, "trainer.py", "--log", "runs/b.log"],
    ]
    for cmd in runs:
        p = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        for line in p.stdout:
            print("[panel]", line, end="", flush=True)
        if p.wait() != 0:
            sys.exit(p.returncode)
""")


@needs_accelerate
@pytest.mark.parametrize("ui_server", [False, True], ids=["plain-ui", "web-ui-server"])
def test_python_ui_starting_accelerate_launch(tmp_path: Path, reaper: Reaper, ui_server: bool) -> None:
    """LORA_OTEL=1 where a Python UI starts: the UI, accelerate's launcher and the trainer are all
    traced; the trainer's journal lies beside its --log, the UI's in ./lora-otel/. A plain UI
    program: every run of its session is in its trace, so the runs are children of the UI's job and
    keep their info lines off the panel (their --log file has them). A UI that runs a web server
    (gradio, uvicorn, streamlit loaded: kohya_ss, lora-scripts): each run is a trace of its own,
    linked to the UI by ``lora_otel.launched_by.*``, and its top process's `[lora-otel]` lines reach
    the UI's log panel. The server is a stub package here (none of them is installed); the rule looks
    only at its name."""
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "ui.py").write_text(PYTHON_UI)
    (tmp_path / "runs").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    # (A stage running long is said on the terminal even by a quiet process: on a loaded machine the
    # launcher's `import accelerate.commands` passed 10 s. The first such line comes after 60 s here.)
    env = job_env(LORA_OTEL="1", HOME=str(home), HF_HOME=str(home / "hf"), LORA_OTEL_NARRATE_S="60")
    if ui_server:
        (tmp_path / "uvicorn").mkdir()
        (tmp_path / "uvicorn" / "__init__.py").write_text("")
        env["UI_SERVER"] = "1"
    r = reaper.run([PYTHON, "ui.py"], tmp_path, env, [tmp_path / "lora-otel", tmp_path / "runs"])
    assert r.returncode == 0, explain(r)
    assert "[panel] TRAINER running" in r.stdout
    if ui_server:  # each run is a job of its own: its top process's lines in the panel
        assert "[panel] [lora-otel]" in r.stdout
    else:  # the runs are processes of the UI's job: quiet on the terminal (their --log has the lines)
        assert "[lora-otel]" not in r.stdout
    ui = read_all(tmp_path / "lora-otel")
    assert len(ui) == 1 and ui[0].root.attrs["service.name"] == "ui"
    ui = ui[0]
    beside_a = [read_journal(p) for p in (tmp_path / "runs").glob("a.log*.otel.jsonl")]
    beside_b = [read_journal(p) for p in (tmp_path / "runs").glob("b.log*.otel.jsonl")]
    # The launcher's argv holds the trainer's `--log` too: both journals lie beside runs/a.log.
    assert len(beside_a) == 2 and len(beside_b) == 1, sorted(p.name for p in (tmp_path / "runs").iterdir())
    launcher = next(j for j in beside_a if j.root.attrs["service.name"] != "trainer")
    trainer = next(j for j in beside_a if j.root.attrs["service.name"] == "trainer")
    assert trainer.root.parent_id == launcher.root.span_id and trainer.trace_id == launcher.trace_id
    if not ui_server:
        assert launcher.root.parent_id == ui.root.span_id
        assert beside_b[0].root.parent_id == ui.root.span_id
        assert {j.trace_id for j in (ui, launcher, trainer, beside_b[0])} == {ui.trace_id}
    else:
        assert launcher.root.parent_id is None and beside_b[0].root.parent_id is None
        assert len({ui.trace_id, launcher.trace_id, beside_b[0].trace_id}) == 3, "one trace per run"
        for run in (launcher, beside_b[0]):
            assert run.root.attrs["lora_otel.launched_by.trace_id"] == ui.trace_id
            assert run.root.attrs["lora_otel.launched_by.span_id"] == ui.root.span_id
        assert "lora_otel.launched_by.trace_id" not in trainer.root.attrs  # below the run: its trace
    for j in (ui, launcher, trainer, beside_b[0]):
        assert j.exit is not None and j.exit["code"] == 0, (j.path, j.exit)
        assert j.problems == []
    # (a short trainer: its lines in its journal, runs/a.log not made for them: issue 36 item 4)
    assert any(ln.msg.startswith("started pid %d" % trainer.pid) for ln in trainer.lines)


def test_non_python_ui_starting_the_trainer(tmp_path: Path, reaper: Reaper) -> None:
    """ai-toolkit's UI (Node) starts `venv/bin/python run.py <job>/.job_config.json` detached, in
    the toolkit's directory, with its environment and stdout/stderr appended to the job's log.txt.
    A shell stands in for Node: the trainer is traced in a trace of its own, its journal in
    ./lora-otel/ of the toolkit's directory, its `[lora-otel]` lines in log.txt."""
    root = tmp_path / "ai-toolkit"
    job = root / "output" / "my_lora"
    job.mkdir(parents=True)
    (root / "run.py").write_text(TRAINER.replace("--config_file", "config"))
    (job / ".job_config.json").write_text("{}")
    log = job / "log.txt"
    cmd = ["sh", "-c", 'exec "$0" run.py output/my_lora/.job_config.json >> output/my_lora/log.txt 2>&1', PYTHON]
    r = reaper.run(cmd, root, job_env(LORA_OTEL="1", IS_AI_TOOLKIT_UI="1"), [root / "lora-otel"])
    assert r.returncode == 0, explain(r)
    found = read_all(root / "lora-otel")
    assert len(found) == 1, [j.path for j in found]
    j = found[0]
    assert j.root.parent_id is None and j.root.attrs["service.name"] == "run"
    assert j.exit is not None and j.exit["code"] == 0
    text = log.read_text(encoding="utf-8")
    assert "TRAINER running" in text  # (a short trainer: its start in its journal only, issue 36 item 9)
    assert any(ln.msg.startswith("started pid %d" % j.pid) for ln in j.lines)
    assert not list(job.glob("*.otel.jsonl"))  # no --log in argv: nothing beside log.txt
