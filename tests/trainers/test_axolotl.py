"""axolotl's ``axolotl train config.yml``, run as its users run it, in a venv of its own where its
own requirements decide torch (`trainer_venv.py`, cached): ``axolotl train`` execs into
``accelerate launch -m axolotl.cli.train``, whose trainer is a quiet child. The job runs unchanged
under ``LORA_OTEL=1``; the launcher's last line names the trainer's steps; the trainer's stages
are there (model load, dataset preparation, training with its 8 steps); its characteristic hangs —
the collator blocking, a telemetry flush at exit that never gets an answer — are named in the
job's lines (from the quiet trainer, on the terminal), ``inspect``, ``watch`` and the report.

The job (``axo_job.py``) is the tiny Llama with random weights and local alpaca data of
``lf_job.py``; nothing is downloaded (``HF_HUB_OFFLINE=1``, ``AXOLOTL_DO_NOT_TRACK=1``). The first
use builds the venv (about three minutes with pip's cache warm, several GB); a build that fails
fails these tests with pip's words.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import clean_env, journals, lora_otel_cli, wait_for
from trainer_venv import pythonpath

from lora_otel.journal.reader import read_journal

HERE = Path(__file__).resolve().parent
JOB = HERE / "axo_job.py"
# far from what a loaded machine takes: a false STALLED fails the test
LIMITS = "between=120,training=60,exit=30,import=600"

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def axo_python() -> Path:
    sys.path.insert(0, str(HERE))
    from trainer_venv import venv_for

    return venv_for("axolotl")


@pytest.fixture(scope="module")
def axo_files(axo_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("axo")
    made = subprocess.run(
        [str(axo_python), str(JOB), "setup", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(HF_HUB_OFFLINE="1", PYTHONPATH=pythonpath(HERE)),
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return out


def start(
    axo_python: Path, files: Path, tmp_path: Path, hang: str = "none", *, traced: bool = True
) -> subprocess.Popen:
    bin_dir = axo_python.parent
    env = {
        "PATH": "%s:%s" % (bin_dir, os.environ.get("PATH", "")),  # as in an activated venv
        "PYTHONPATH": pythonpath(HERE),
        "HF_HUB_OFFLINE": "1",
        "AXOLOTL_DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "home" / "hf"),
        "AXO_HANG": hang,
        "AXO_RELEASE": str(tmp_path / "go"),
    }
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_STALL_AFTER=LIMITS)
    config = tmp_path / "axolotl.yml"
    config.write_text(
        (files / "axolotl.yml")
        .read_text()
        .replace(str(files / "run"), str(tmp_path / "run"))
        .replace(str(files / "prepared"), str(tmp_path / "prepared"))
    )
    argv = (
        [str(bin_dir / "axolotl"), "train", str(config)]
        if hang == "none"
        else [str(bin_dir / "accelerate"), "launch", "-m", "axo_job", str(config)]
    )
    (tmp_path / "home").mkdir(exist_ok=True)
    with open(tmp_path / "stderr.txt", "wb") as stderr, open(tmp_path / "stdout.txt", "wb") as stdout:
        return subprocess.Popen(
            argv, cwd=tmp_path, stdout=stdout, stderr=stderr, env=clean_env(**env), start_new_session=True
        )


def finish(proc: subprocess.Popen, tmp_path: Path) -> str:
    (tmp_path / "go").touch()
    try:
        assert proc.wait(timeout=600) == 0, (tmp_path / "stderr.txt").read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return (tmp_path / "stdout.txt").read_text(errors="replace") + (tmp_path / "stderr.txt").read_text(errors="replace")


def losses(output: str) -> int:
    return output.count("'loss': ")


def lora_lines(output: str) -> list[str]:
    return [line.split("] ", 1)[-1] for line in output.splitlines() if line.startswith("[lora-otel]")]


def test_the_job_runs_unchanged_and_its_stages_are_there(axo_python: Path, axo_files: Path, tmp_path: Path) -> None:
    plain, traced = tmp_path / "plain", tmp_path / "traced"
    plain.mkdir()
    traced.mkdir()
    bare = finish(start(axo_python, axo_files, plain, traced=False), plain)
    assert losses(bare) == 8 and "train_loss" in bare, bare[-3000:]
    out = finish(start(axo_python, axo_files, traced), traced)
    assert losses(out) == 8 and "train_loss" in out, out[-3000:]
    lines = lora_lines(out)
    assert sum(line.startswith("started pid ") for line in lines) == 1, lines
    assert sum(line.startswith("environment: ") for line in lines) == 1, lines  # not again after the exec
    assert any(" exec'd into " in line and "accelerate launch" in line for line in lines), lines
    last = [line for line in lines if line.startswith("exiting normally")][-1]
    assert "axolotl.cli.train, pid " in last and " made 8)" in last, last
    [trainer] = [read_journal(p) for p in journals(traced / "j") if read_journal(p).steps]
    names = [s.name for s in trainer.spans]
    for stage in ("load model", "prepare dataset", "training"):
        assert stage in names, names
    assert trainer.steps == 8
    assert not any("STALLED" in line for line in lines), lines


CASES = {
    # hang: (what the job's line and every view must say, where)
    "collator": ("The DataLoader makes its batch in the main process", "in wait_for_release"),
    "exit": ("The exit runs an atexit handler, flush_telemetry() in axo_job.py.", "Waiting on the network"),
}


def why_line(err: Path) -> str:
    for line in err.read_text(encoding="utf-8", errors="replace").splitlines():
        if "] why " in line:
            return line
    return ""


@pytest.mark.parametrize("hang", list(CASES))
def test_each_hang_is_named_in_every_view(axo_python: Path, axo_files: Path, tmp_path: Path, hang: str) -> None:
    cause, detail = CASES[hang]
    proc = start(axo_python, axo_files, tmp_path, hang)
    err = tmp_path / "stderr.txt"
    try:
        line = wait_for(lambda: why_line(err), timeout=300, what="the watchdog's sentence for the %s hang" % hang)
        assert cause in line and detail in line, line
        inspect = lora_otel_cli("inspect", str(tmp_path / "j"))
        assert inspect.returncode in (0, 1) and cause in inspect.stdout, inspect.stdout
        watch = lora_otel_cli("watch", "--once", "--no-color", str(tmp_path / "j"))
        assert cause in watch.stdout, watch.stdout
        page = lora_otel_cli("report", str(tmp_path / "j"), "-o", "-")
        assert cause in page.stdout, page.stdout[-3000:]
    finally:
        if hang == "exit":  # blocked in a socket read nothing releases: ended as a user would
            os.killpg(proc.pid, 9)
            proc.wait(timeout=60)
        else:
            out = finish(proc, tmp_path)
    if hang != "exit":
        assert "train_loss" in out, out[-3000:]
