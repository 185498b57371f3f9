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
import os
import re
import signal
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
    pytest.mark.slow,
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


def kill_leftovers(tmp_path: Path) -> None:
    """SIGKILL every process whose command line names ``tmp_path``: torchrun starts each rank in a
    session of its own, so killing the launcher's process group leaves a rank that hangs (in
    torch's teardown, say) running on through the rest of the suite."""
    mark = str(tmp_path).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                if mark in f.read():
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass


def crash_text(err: Path) -> str:
    """What a failed run's stderr says: its crash lines (a C++ ``terminate``, a fatal error, a
    traceback's last line) wherever they are, then its tail (a launcher's own report can fill 3000
    characters and push a rank's crash out of the tail)."""
    text = err.read_text(errors="replace")
    crash = re.compile(
        r"terminate called|what\(\):|Fatal Python|Aborted|Error:|Exception:|Segmentation"
        r"|\[lora-otel\].*(STALLED|why|exiting)"
    )
    lines = [x[:400] for x in text.splitlines() if crash.search(x)]
    return "crash lines:\n%s\n--- tail:\n%s" % ("\n".join(lines[-40:]), text[-3000:])


def finish(proc: subprocess.Popen, tmp_path: Path) -> str:
    (tmp_path / "go").touch()
    try:
        assert proc.wait(timeout=300) == 0, crash_text(tmp_path / "stderr.txt")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(tmp_path)
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
    "exit": ("sft_job.py:", "The main thread polls for "),  # an exit handler that polls for a file never made
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
        # The job's own STALLED line and the watchdog's sentence are written apart: either may come first.
        wait_for(
            lambda: [x for x in err.read_text().splitlines() if "] STALLED: " in x],
            timeout=60,
            what="the job's own STALLED line",
        )
        inspect = lora_otel_cli("inspect", str(tmp_path / "j"))
        assert inspect.returncode in (0, 1) and cause in inspect.stdout, inspect.stdout
        watch = lora_otel_cli("watch", "--once", "--no-color", str(tmp_path / "j"))
        assert cause in watch.stdout, watch.stdout
        page = lora_otel_cli("report", str(tmp_path / "j"), "-o", "-")
        assert cause in page.stdout, page.stdout[-3000:]
    finally:
        if hang == "hub":  # blocked in a socket read nothing releases: ended as a user would
            proc.kill()
            proc.wait(timeout=60)
        else:
            out = finish(proc, tmp_path)
    if hang != "hub":
        assert out.splitlines()[-1] == "TRAINED 8"


def accelerate_launch(tmp_path: Path, nproc: int, hang: str) -> subprocess.Popen:
    """``accelerate launch`` of the job, as its users start it: one CPU process (``--cpu``), or two
    (``--multi_gpu``: without GPUs it starts plain processes and the Trainer takes gloo; accelerate
    1.x takes several CPU processes only through mpirun). HOME points into tmp_path: no accelerate
    config of the user's is read."""
    from collector import free_port

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    how = ["--cpu"] if nproc == 1 else ["--multi_gpu", "--main_process_port", str(free_port())]
    env = clean_env(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HOME=str(home),
        HF_HOME=str(home / "hf"),
        LORA_OTEL="1",
        LORA_OTEL_DIR=str(tmp_path / "j"),
        LORA_OTEL_STALL_AFTER=LIMITS,
    )
    with open(tmp_path / "stderr.txt", "wb") as stderr, open(tmp_path / "stdout.txt", "wb") as stdout:
        return subprocess.Popen(
            [
                *(PYTHON, "-m", "accelerate.commands.launch", *how, "--num_processes", str(nproc)),
                *("--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"),
                *(str(JOB), "--out", str(tmp_path / "o"), "--hang", hang, "--release", str(tmp_path / "go")),
            ],
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
def test_accelerate_launch_one_process_runs_unchanged(tmp_path: Path) -> None:
    """``accelerate launch --cpu --num_processes 1``: the trainer is the launcher's quiet child; the
    job ends as without lora_otel, and the launcher's last line names the trainer's steps."""
    proc = accelerate_launch(tmp_path, 1, "none")
    assert finish(proc, tmp_path).splitlines()[-1] == "TRAINED 8"
    [last] = [x for x in (tmp_path / "stderr.txt").read_text().splitlines() if "exiting normally" in x][-1:]
    assert "optimizer steps here; sft_job, pid " in last and ", made 8)" in last, last


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
def test_accelerate_launch_a_rank_that_never_reaches_the_collective(tmp_path: Path) -> None:
    """Two ranks; rank 1's collate function blocks, so rank 0 waits in a collective: rank 0's line
    says rank 1 never arrived and where rank 1 is; rank 1's line names its DataLoader; ``inspect
    DIR`` leads with rank 1 as the one stuck. Released, both ranks finish."""
    proc = accelerate_launch(tmp_path, 2, "rank")
    err = tmp_path / "stderr.txt"
    try:

        def whys() -> list[str]:
            lines = [x for x in err.read_text(errors="replace").splitlines() if "] why training is stalled: " in x]
            said = " ".join(lines)
            return lines if "rank 1 never arrived" in said and "The DataLoader makes its batch" in said else []

        lines = wait_for(whys, timeout=240, what="both ranks' why lines")
        waiting = next(x for x in lines if "Waiting inside a collective" in x)
        assert "rank 1 never arrived: rank 1 is not in a collective (at sft_job.py:" in waiting, waiting
        assert "in wait_for_release" in waiting, waiting
        inspect = lora_otel_cli("inspect", str(tmp_path / "j"))
        assert re.search(
            r"rank 1 \(pid \d+\) is the one stuck: .*rank 0 \(pid \d+\) waits for it in a collective", inspect.stdout
        ), inspect.stdout
    finally:
        (tmp_path / "go").touch()
        try:
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            kill_leftovers(tmp_path)
    assert proc.returncode == 0, crash_text(err)
    assert (tmp_path / "stdout.txt").read_text().count("TRAINED") == 2


HF_ARGS = """\
import dataclasses, json, sys
import transformers

@dataclasses.dataclass
class ModelArgs:
    model_name_or_path: str = "tiny"
    lora_rank: int = 8

parser = transformers.HfArgumentParser(ModelArgs)
how = sys.argv[1]
if how == "dict":
    (args,) = parser.parse_dict({"lora_rank": 4})
elif how == "yaml":
    (args,) = parser.parse_yaml_file("args.yaml")
else:
    (args,) = parser.parse_json_file("args.json")
print("rank", args.lora_rank, flush=True)
"""


@pytest.mark.parametrize("how", ["dict", "yaml", "json"])
def test_hf_argument_parser_ends_arguments(tmp_path: Path, how: str) -> None:
    """LLaMA-Factory and axolotl parse their config with ``HfArgumentParser.parse_dict`` /
    ``parse_yaml_file`` / ``parse_json_file``, never ``parse_args``: that call ends ``arguments``
    (before, it stayed open until training and every load was "still in arguments")."""
    (tmp_path / "job.py").write_text(HF_ARGS, encoding="utf-8")
    (tmp_path / "args.yaml").write_text("lora_rank: 4\n", encoding="utf-8")
    (tmp_path / "args.json").write_text('{"lora_rank": 4}', encoding="utf-8")
    r = subprocess.run(
        [PYTHON, "job.py", how],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(LORA_OTEL="1", LORA_OTEL_DIR=str(tmp_path / "j")),
    )
    assert r.returncode == 0 and r.stdout == "rank 4\n", r.stderr[-2000:]
    [path] = journals(tmp_path / "j")
    [arguments] = [s for s in read_journal(path).spans if s.name == "arguments"]
    method = {"dict": "parse_dict", "yaml": "parse_yaml_file", "json": "parse_json_file"}[how]
    assert arguments.attrs.get("lora_otel.arguments.parser") == "HfArgumentParser." + method, arguments.attrs
