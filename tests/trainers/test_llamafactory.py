"""LLaMA-Factory's ``llamafactory-cli train config.yaml``, run as its users run it, in a venv of its
own where its own requirements decide torch (`trainer_venv.py`, cached): the job unchanged under
``LORA_OTEL=1``; the stages its users expect — ``arguments`` ends when its YAML is parsed
(``HfArgumentParser.parse_dict``), then the model load, the dataset preparation, and training with
its steps; and its characteristic hangs named in the job's lines and in ``inspect``.

The job (``lf_job.py``) is a tiny Llama with random weights, a word-level tokenizer and a local
dataset in ``dataset_info.json``; nothing is downloaded (``HF_HUB_OFFLINE=1``; the hub case points
``HF_ENDPOINT`` at a local socket that never answers). The first use builds the venv (about ten
minutes, several GB: torch comes with it); a build that fails fails these tests with pip's words.
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
JOB = HERE / "lf_job.py"
LIMITS = "between=20,training=8,prepare dataset=8,import=600"
"""Short limits for the stages the hangs are in; ``between`` longer: a loaded machine may take
seconds between two stages of a healthy start."""

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def lf_python() -> Path:
    sys.path.insert(0, str(HERE))
    from trainer_venv import venv_for

    return venv_for("llamafactory")


@pytest.fixture(scope="module")
def lf_files(lf_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model, tokenizer, dataset and ``train.yaml``, made once with the venv's transformers."""
    out = tmp_path_factory.mktemp("lf")
    made = subprocess.run(
        [str(lf_python), str(JOB), "setup", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(HF_HUB_OFFLINE="1", PYTHONPATH=pythonpath()),
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return out


def start(
    lf_python: Path, files: Path, tmp_path: Path, hang: str = "none", *, traced: bool = True, cli: bool = False
) -> subprocess.Popen:
    env = {
        "PYTHONPATH": pythonpath(),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "home" / "hf"),
        "LF_HANG": hang,
        "LF_RELEASE": str(tmp_path / "go"),
        "DISABLE_VERSION_CHECK": "1",
    }
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_STALL_AFTER=LIMITS)
    text = (files / "train.yaml").read_text().replace(str(files / "run"), str(tmp_path / "run"))
    if hang == "map":  # datasets' map(num_proc=2) under the preprocessing
        text = text.replace("preprocessing_num_workers: 1", "preprocessing_num_workers: 2")
    if hang == "hub":  # the model is a hub id: its download never answers
        text = "".join(
            'model_name_or_path: "tiny-org/tiny-llama"\n' if line.startswith("model_name_or_path:") else line + "\n"
            for line in text.splitlines()
        )
    config = tmp_path / "train.yaml"
    config.write_text(text)
    # `llamafactory-cli train` itself for the unchanged run; the hangs go through lf_job.py, which
    # wraps one of LLaMA-Factory's functions and then runs that same CLI.
    argv = (
        [str(lf_python.parent / "llamafactory-cli"), "train", str(config)]
        if cli
        else [str(lf_python), str(JOB), "train", str(config)]
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


def trained_steps(output: str) -> str:
    """LLaMA-Factory's (the Trainer's) own summary of the run: its ``epoch``/``train_loss`` lines."""
    return "\n".join(line.split("=")[0].strip() for line in output.splitlines() if line.strip().startswith("train_"))


def test_the_job_runs_unchanged_and_its_stages_are_there(lf_python: Path, lf_files: Path, tmp_path: Path) -> None:
    """``llamafactory-cli train``: exit code 0 and the same train metrics as without lora_otel;
    ``arguments`` ends at its YAML's ``parse_dict``, before the model load; ``load model``,
    ``prepare dataset`` and ``training`` with its 8 optimizer steps follow."""
    plain, traced = tmp_path / "plain", tmp_path / "traced"
    plain.mkdir()
    traced.mkdir()
    bare = finish(start(lf_python, lf_files, plain, traced=False, cli=True), plain)
    assert "train_loss" in bare, bare[-3000:]
    out = finish(start(lf_python, lf_files, traced, cli=True), traced)
    assert trained_steps(out) == trained_steps(bare), out[-3000:]
    [path] = [p for p in journals(traced / "j") if read_journal(p).spans and read_journal(p).steps]
    journal = read_journal(path)
    spans = {s.name: s for s in journal.spans}
    parser = spans["arguments"].attrs.get("lora_otel.arguments.parser")
    assert parser == "HfArgumentParser.parse_dict", spans["arguments"].attrs
    assert spans["arguments"].end_ns is not None
    assert spans["load model"].start_ns >= spans["arguments"].end_ns
    assert any(s.name == "prepare dataset" for s in journal.spans), sorted(spans)
    assert spans["training"].end_ns is not None and journal.steps == 8, journal.steps
    # arguments end at the YAML's parse, long before training (LLaMA-Factory imports its trainers
    # first: "still in arguments" may be said during those imports, never after the parse)
    lines = [line.split("] ", 1)[-1] for line in out.splitlines() if line.startswith("[lora-otel]")]
    training = lines.index("training started (transformers Trainer)")
    assert not any("still in arguments" in line for line in lines[training:]), lines
    assert not any("STALLED" in line for line in lines), lines


CASES = {
    # hang: (the place, the cause) the watchdog's sentence must name
    "collator": ("in wait_for_release", "The DataLoader makes its batch in the main process"),
    "map": ("in blocking_preprocess", "worker pid"),  # datasets' map(num_proc=2): the pool worker holding it
    "hub": ("", "Waiting on the network"),
}


def why_line(err: Path) -> str:
    for line in err.read_text(encoding="utf-8", errors="replace").splitlines():
        if "] why " in line or ("] STALLED: " in line and ", limit " in line):
            return line
    return ""


@pytest.mark.parametrize("hang", list(CASES))
def test_each_hang_is_named_in_the_jobs_lines_and_inspect(
    lf_python: Path, lf_files: Path, tmp_path: Path, hang: str
) -> None:
    place, cause = CASES[hang]
    proc = start(lf_python, lf_files, tmp_path, hang)
    err = tmp_path / "stderr.txt"
    try:
        line = wait_for(lambda: why_line(err), timeout=300, what="the watchdog's sentence for the %s hang" % hang)
        assert cause in line and place in line, line
        inspect = lora_otel_cli("inspect", str(tmp_path / "j"))
        assert inspect.returncode in (0, 1) and cause in inspect.stdout, inspect.stdout
        watch = lora_otel_cli("watch", "--once", "--no-color", str(tmp_path / "j"))
        assert cause in watch.stdout, watch.stdout
        page = lora_otel_cli("report", str(tmp_path / "j"), "-o", "-")
        assert cause in page.stdout, page.stdout[-3000:]
    finally:
        if hang == "hub":  # blocked in a socket read nothing releases: ended as a user would
            os.killpg(proc.pid, 9)
            proc.wait(timeout=60)
        else:
            out = finish(proc, tmp_path)
    if hang != "hub":
        assert "train_loss" in out, out[-3000:]
