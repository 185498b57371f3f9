"""TRL's SFTTrainer with a peft LoRA, run as its users run it, with the hangs they report
(issue 22 item 1): the job unchanged under ``LORA_OTEL=1``; the stages they expect; and for each
hang the place and the cause in the job's own lines and in ``inspect``.

The job (``sft_job.py``) is a real TRL fine-tune on a tiny Llama with random weights, saved and
loaded with ``from_pretrained``, a word-level tokenizer built locally and a synthetic dataset —
nothing is downloaded (``HF_HUB_OFFLINE=1``; the hub case points ``HF_ENDPOINT`` at a local socket
that never answers). Each hang blocks until the test creates a release file, once the stall is
diagnosed, so the job then finishes and its exit code is checked too.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, journals, lora_otel_cli, wait_for

from lora_otel.journal.reader import read_journal

JOB = Path(__file__).with_name("sft_job.py")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "peft", "datasets")),
        reason="needs torch, trl, peft and datasets (the [test] extra)",
    ),
]
LIMITS = "between=15,training=6,prepare dataset=6,import=600"
"""Short limits for the stages the hangs are in; ``between`` longer: a loaded machine may take
seconds between two stages of a healthy start (the tokenizer built, the model saved)."""


def start(tmp_path: Path, hang: str, *, traced: bool = True) -> tuple[subprocess.Popen, Path]:
    err = tmp_path / "stderr.txt"
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if traced:
        env.update(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j"), LORA_OTEL_STALL_AFTER=LIMITS)
    with open(err, "wb") as stderr, open(tmp_path / "stdout.txt", "wb") as stdout:
        proc = subprocess.Popen(
            [PYTHON, str(JOB), "--out", str(tmp_path / "o"), "--hang", hang, "--release", str(tmp_path / "go")],
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            env=clean_env(**env),
        )
    return proc, err


def finish(proc: subprocess.Popen, tmp_path: Path) -> str:
    (tmp_path / "go").touch()
    try:
        assert proc.wait(timeout=300) == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return (tmp_path / "stdout.txt").read_text()


def why_line(err: Path) -> str:
    """The watchdog's sentence for the stall: its ``why … is stalled:`` line, or its STALLED line
    with the diagnosis (a pool's stall is told on a STALLED line of its own)."""
    for line in err.read_text(encoding="utf-8", errors="replace").splitlines():
        if "] why " in line or ("] STALLED: " in line and ", limit " in line):
            return line
    return ""


def test_the_job_runs_unchanged_and_its_stages_are_there(tmp_path: Path) -> None:
    """Exit code and stdout as without lora_otel; arguments (argparse), load model (from_pretrained),
    prepare dataset (the maps TRL runs), training with its 8 optimizer steps."""
    plain_dir, traced_dir = tmp_path / "plain", tmp_path / "traced"
    plain_dir.mkdir()
    traced_dir.mkdir()
    plain, _ = start(plain_dir, "none", traced=False)
    assert finish(plain, plain_dir).splitlines()[-1] == "TRAINED 8"
    traced, _ = start(traced_dir, "none")
    assert finish(traced, traced_dir).splitlines()[-1] == "TRAINED 8"
    [path] = journals(traced_dir / "j")
    journal = read_journal(path)
    spans = {s.name: s for s in journal.spans}
    assert spans["arguments"].attrs.get("lora_otel.arguments.parser") == "argparse"
    assert spans["load model"].attrs["lora_otel.model.name"].endswith("/o/model")
    assert any(s.name == "prepare dataset" and s.attrs.get("lora_otel.dataset.op") == "map" for s in journal.spans)
    assert spans["training"].end_ns is not None and journal.steps == 8
    names = [s.name for s in journal.spans if not s.name.startswith("import ")]
    assert names.index("load model") < names.index("training") > names.index("prepare dataset"), names


CASES = {
    # hang: (the place, the cause) the watchdog's sentence must name
    "map": ("in upper", "worker pid"),  # datasets' map(num_proc=2): the pool worker holding the task
    "collator": ("in wait_for_release", "The DataLoader makes its batch in the main process"),
    "worker": ("sft_job.py:", "The main thread waits for a DataLoader batch"),  # a worker in the collator
    "hub": ("", "Waiting on the network inside huggingface_hub"),
    "exit": ("sft_job.py:", "The main thread is sleeping (time.sleep)"),  # an exit handler that never returns
}


@pytest.mark.parametrize("hang", list(CASES))
def test_each_hang_is_named_in_the_jobs_lines_and_inspect(tmp_path: Path, hang: str) -> None:
    place, cause = CASES[hang]
    proc, err = start(tmp_path, hang)
    try:
        line = wait_for(lambda: why_line(err), timeout=180, what="the watchdog's sentence for the %s hang" % hang)
        assert cause in line and place in line, line
        if hang == "worker":
            assert "in __call__" in line, line  # the worker's own place, read from outside
        stalled = [x for x in err.read_text().splitlines() if "] STALLED: " in x]
        assert stalled, err.read_text()[-3000:]
        inspect = lora_otel_cli("inspect", str(tmp_path / "j"))
        assert inspect.returncode in (0, 1) and cause in inspect.stdout, inspect.stdout
    finally:
        if hang == "hub":  # blocked in a socket read nothing releases: ended as a user would
            proc.kill()
            proc.wait(timeout=60)
        else:
            out = finish(proc, tmp_path)
    if hang != "hub":
        assert out.splitlines()[-1] == "TRAINED 8"
