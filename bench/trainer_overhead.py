"""What ``LORA_OTEL=1`` costs a real trainer's run: wall time of the whole process as a launcher sees
it, bare vs traced, interleaved in one invocation (issue 22's figures). Each trainer's job is the one
its test runs unchanged, started by that test's own ``start`` (tiny random Llama, peft LoRA, 8
optimizer steps, CPU):

- ``trl``: TRL's SFTTrainer (``tests/trainers/sft_job.py``, `test_trl.start`), in this venv;
- ``accelerate``: ``accelerate launch --cpu --num_processes 1`` of that job (`test_trl.accelerate_launch`);
- ``llamafactory``: ``llamafactory-cli train train.yaml`` (`test_llamafactory.start`, ``lf_job.py setup``);
- ``axolotl``: ``axolotl train axolotl.yml``, which execs into ``accelerate launch`` (`test_axolotl.start`,
  ``axo_job.py setup``).

    .venv/bin/python bench/trainer_overhead.py [--trainer NAME ...] [--runs 5]

LLaMA-Factory and axolotl run in their own cached venvs (``tests/trainers/trainer_venv.py``): one that
another process is building is waited for (``--venv-wait``), not built beside it. Prints one table:
per trainer, median and min wall seconds of each, the ratio and the difference. Nothing is
downloaded (``HF_HUB_OFFLINE=1``); each run writes into a fresh temporary directory; a run that
fails stops the bench with its stderr's tail.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
TRAINERS_DIR = REPO / "tests" / "trainers"
sys.path[:0] = [str(REPO / "tests"), str(TRAINERS_DIR)]

import test_axolotl  # noqa: E402  (the tests' own helpers: how each job is started)
import test_llamafactory  # noqa: E402
import test_trl  # noqa: E402
import trainer_venv  # noqa: E402
from procs import clean_env  # noqa: E402

TRAINERS = ("trl", "accelerate", "llamafactory", "axolotl")
TITLES = {
    "trl": "TRL SFTTrainer + peft LoRA",
    "accelerate": "accelerate launch --cpu, 1 process (TRL job)",
    "llamafactory": "LLaMA-Factory llamafactory-cli train",
    "axolotl": "axolotl train (execs accelerate launch)",
}
JOB_TIMEOUT_S = 900


def trainer_python(name: str, wait_s: float) -> Path:
    """The python of ``name``'s cached venv (``llamafactory``, ``axolotl``). A venv another process is
    building (its folder there, no ``.built`` yet) is waited for, up to ``wait_s``; one not there at
    all is built here, as the tests would."""
    venv = trainer_venv.cache_root() / ("%s-%s" % (name, trainer_venv.key(name)))
    if venv.exists() and not (venv / ".built").exists():
        print("waiting for %s's venv, being built in %s (up to %.0f s)" % (name, venv, wait_s), file=sys.stderr)
        deadline = time.monotonic() + wait_s
        while not (venv / ".built").exists():
            if time.monotonic() > deadline:
                log = venv.parent / (venv.name + ".log")
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no build log)"
                raise SystemExit(
                    "%s's venv is still not built after %.0f s; its build log ends:\n%s" % (name, wait_s, tail)
                )
            time.sleep(5)
    return trainer_venv.venv_for(name)


def trainer_files(name: str, python: Path, out: Path) -> Path:
    """The model, tokenizer, data and config the job reads, made once into ``out`` by the trainer's
    own job script (what the tests' ``lf_files``/``axo_files`` fixtures do)."""
    job = {"llamafactory": test_llamafactory.JOB, "axolotl": test_axolotl.JOB}[name]
    made = subprocess.run(
        [str(python), str(job), "setup", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(HF_HUB_OFFLINE="1", PYTHONPATH=trainer_venv.pythonpath(TRAINERS_DIR)),
    )
    if made.returncode != 0:
        raise SystemExit("%s setup failed: %s" % (job.name, made.stderr[-2000:]))
    return out


def stop(proc: subprocess.Popen) -> None:
    """Kill a job that is still running: its whole process group when it has one of its own."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        proc.wait()


@contextlib.contextmanager
def untraced(module: ModuleType) -> Iterator[None]:
    """``module``'s jobs started without lora_otel: `test_trl.accelerate_launch` always sets
    ``LORA_OTEL=1`` (its test has no bare run), so its ``clean_env`` is swapped for one that drops
    every ``LORA_OTEL*`` variable while it starts the job."""
    real = module.clean_env
    module.clean_env = lambda **extra: {k: v for k, v in real(**extra).items() if not k.startswith("LORA_OTEL")}
    try:
        yield
    finally:
        module.clean_env = real


def runner(name: str, files: Path, venv_wait_s: float) -> Callable[[Path, bool], tuple[subprocess.Popen, Callable]]:
    """``start(tmp, traced)`` for ``name``: the job started as its test starts its unchanged run, and a
    check of its output that says whether it trained."""
    if name == "trl":
        return lambda tmp, traced: (test_trl.start(tmp, "none", traced=traced)[0], lambda out: "TRAINED 8" in out)

    if name == "accelerate":

        def start_accelerate(tmp: Path, traced: bool) -> tuple[subprocess.Popen, Callable]:
            with contextlib.nullcontext() if traced else untraced(test_trl):
                return test_trl.accelerate_launch(tmp, 1, "none"), lambda out: "TRAINED 8" in out

        return start_accelerate
    python = trainer_python(name, venv_wait_s)
    trainer_files(name, python, files)
    if name == "llamafactory":
        return lambda tmp, traced: (
            test_llamafactory.start(python, files, tmp, traced=traced, cli=True),
            lambda out: "train_loss" in out,
        )
    return lambda tmp, traced: (
        test_axolotl.start(python, files, tmp, traced=traced),
        lambda out: test_axolotl.losses(out) == 8 and "train_loss" in out,
    )


def one(name: str, start: Callable, traced: bool) -> float:
    """Wall seconds of one run, from its start to its exit; stops the bench if it failed."""
    with tempfile.TemporaryDirectory(prefix="trainer-overhead-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        proc, trained = start(tmp, traced)
        try:
            proc.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            wall = time.perf_counter() - t0
            stop(proc)
        out = (tmp / "stdout.txt").read_text(errors="replace") + (tmp / "stderr.txt").read_text(errors="replace")
        if proc.returncode != 0 or not trained(out):
            raise SystemExit(
                "the %s job failed (%s, exit %s): %s"
                % (name, "traced" if traced else "bare", proc.returncode, (tmp / "stderr.txt").read_text()[-2000:])
            )
        return wall


def rows(title: str, bare: list[float], traced: list[float]) -> str:
    """The trainer's two rows: median and min wall seconds, bare and traced, their ratio and difference."""
    out = []
    for stat, how in (("median", statistics.median), ("min", min)):
        b, t = how(bare), how(traced)
        out.append("| %s: wall, %s | %.2f s | %.2f s | %.3f | %+.2f s |" % (title, stat, b, t, t / b, t - b))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--trainer", action="append", choices=TRAINERS, help="the trainer to time (repeatable; default: all four)"
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each, interleaved (default 5)")
    parser.add_argument(
        "--venv-wait", type=float, default=1800, help="seconds to wait for a trainer venv being built (default 1800)"
    )
    args = parser.parse_args()
    print("| job (8 optimizer steps), %d runs each | bare | LORA_OTEL=1 | ratio | added |" % args.runs)
    print("|---|---|---|---|---|", flush=True)
    for name in args.trainer or TRAINERS:
        with tempfile.TemporaryDirectory(prefix="trainer-files-") as files:
            start = runner(name, Path(files), args.venv_wait)
            one(name, start, False)  # warm the page cache (torch, the trainer) before anything is timed
            bare: list[float] = []
            traced: list[float] = []
            for _ in range(args.runs):
                bare.append(one(name, start, False))
                traced.append(one(name, start, True))
        print(rows(TITLES[name], bare, traced), flush=True)


if __name__ == "__main__":
    main()
