"""A virtual environment of its own for each real trainer, cached by what goes into it.

    python tests/trainers/trainer_venv.py llamafactory     # builds it (once), prints its python

The trainers' pins fight each other and ours (LLaMA-Factory's install moves torch 2.13 to 2.14), so
each trainer gets its own venv in which pip resolves the trainer's own requirements — torch is the
one the trainer brings. The venv is cached under ``$LORA_OTEL_TRAINER_VENVS`` (default
``~/.cache/lora_otel/trainers``) by a key of the Python version, the trainer's requirements and
lora_otel's own runtime dependencies; a venv whose build did not finish is built again.

lora_otel itself is not installed into it: the venv gets two ``.pth`` files, one putting this
checkout on ``sys.path`` and lora_otel's own ``lora_otel_hook.pth`` (what ``pip install`` puts in
site-packages), rewritten at every use — the trainer runs the checkout's code as it is now. The
tests also put the checkout first on the job's ``PYTHONPATH`` (`pythonpath`): two checkouts that
test at once share the cached venv, whose ``.pth`` names whichever of them used it last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TRAINERS: dict[str, list[str]] = {
    # LLaMA-Factory as its README installs it; torch is whatever its own requirements resolve to.
    "llamafactory": ["llamafactory==0.9.5"],
    # axolotl as its README installs it without extras (no flash-attn, no deepspeed): it pins torch itself.
    "axolotl": ["axolotl==0.19.0"],
}
"""The requirements of each trainer's venv (pip's syntax)."""

OURS = ["opentelemetry-api>=1.20", "opentelemetry-sdk>=1.20", "opentelemetry-exporter-otlp>=1.20"]
"""lora_otel's runtime dependencies (pyproject.toml): the exporting side runs in the job's Python."""


def cache_root() -> Path:
    return Path(os.environ.get("LORA_OTEL_TRAINER_VENVS") or Path.home() / ".cache" / "lora_otel" / "trainers")


def key(name: str) -> str:
    what = {"python": sys.version, "trainer": TRAINERS[name], "ours": OURS, "v": 1}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def build(name: str, venv: Path, log: Path) -> None:
    """The venv, from nothing (pip's output goes to ``log``); raises with the log's tail on failure."""
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python_of(venv)), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(python_of(venv)), "-m", "pip", "install", "-q", *TRAINERS[name], *OURS],
    ]
    with open(log, "wb") as out:
        for step in steps:
            out.write(("$ %s\n" % " ".join(step)).encode())
            out.flush()
            if subprocess.call(step, stdout=out, stderr=subprocess.STDOUT) != 0:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError("building the %s venv failed at `%s`:\n%s" % (name, " ".join(step), tail))


def link_checkout(venv: Path) -> None:
    """Put this checkout and lora_otel's start hook in the venv's site-packages (see the module doc)."""
    out = subprocess.run(
        [str(python_of(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    site = Path(out.stdout.strip())
    (site / "lora_otel_checkout.pth").write_text(str(REPO) + "\n")
    shutil.copyfile(REPO / "lora_otel_hook.pth", site / "lora_otel_hook.pth")


def pythonpath(*more: Path) -> str:
    """``PYTHONPATH`` for a job in a trainer's venv: this checkout (ahead of the shared venv's
    ``.pth``), then ``more``."""
    return os.pathsep.join([str(REPO), *map(str, more)])


def venv_for(name: str) -> Path:
    """The python of ``name``'s venv, built when the cache has none of this key."""
    if name not in TRAINERS:
        raise SystemExit("unknown trainer %r: one of %s" % (name, ", ".join(sorted(TRAINERS))))
    venv = cache_root() / ("%s-%s" % (name, key(name)))
    done = venv / ".built"
    if not done.exists():
        build(name, venv, cache_root() / ("%s-%s.log" % (name, key(name))))
        done.write_text(json.dumps({"trainer": TRAINERS[name], "ours": OURS, "python": sys.version}) + "\n")
    link_checkout(venv)
    return python_of(venv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trainer", choices=sorted(TRAINERS), help="the trainer whose venv to build (if not cached)")
    args = ap.parse_args()
    print(venv_for(args.trainer))


if __name__ == "__main__":
    main()
