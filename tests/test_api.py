"""The public surface: `stage`, `mark`, `progress`, and nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from procs import PYTHON, clean_env, only_journal, span_named

import lora_otel


def test_public_names() -> None:
    """`__all__` is the whole public surface; changing it is a deliberate act."""
    assert lora_otel.__all__ == ["__version__", "mark", "progress", "stage"]


class TestBadArguments:
    def test_stage_needs_a_name(self) -> None:
        """An empty or non-string stage name is a programming error: ValueError."""
        with pytest.raises(ValueError):
            lora_otel.stage("")
        with pytest.raises(ValueError):
            lora_otel.stage(None)  # type: ignore[arg-type]

    def test_progress_never_raises(self) -> None:
        """progress() is called in the training loop: a value it cannot record is dropped, not
        raised (tests/test_harm_api_values.py checks what is recorded and said)."""
        lora_otel.progress(step=-1)
        lora_otel.progress(step=1, loss="low")

    def test_mark_needs_text(self) -> None:
        with pytest.raises(ValueError):
            lora_otel.mark(42)  # type: ignore[arg-type]


def test_inactive_calls_do_nothing() -> None:
    """Without activation the API works as no-ops (no journal, no output)."""
    with lora_otel.stage("x", a=1):
        lora_otel.mark("hello")
        lora_otel.progress(step=3, loss=0.1)


@pytest.mark.slow
def test_stage_mark_and_errors_in_a_real_process(tmp_path: Path) -> None:
    """Nested stages nest; marks are events; an exception ends its stage in error and propagates."""
    (tmp_path / "job.py").write_text(
        "import lora_otel\n"
        "with lora_otel.stage('load model', model='tiny', token='hf_abcdefghijklmnopqrstuvwxyz0123456'):\n"
        "    with lora_otel.stage('load weights'):\n"
        "        lora_otel.mark('weights found')\n"
        "try:\n"
        "    with lora_otel.stage('save'):\n"
        "        raise OSError('disk quota exceeded')\n"
        "except OSError:\n"
        "    print('CAUGHT')\n"
        "lora_otel.mark('arguments parsed')\n"
    )
    r = subprocess.run(
        [PYTHON, "job.py"], cwd=tmp_path, env=clean_env(LORA_OTEL="1"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "CAUGHT" in r.stdout
    j = only_journal(tmp_path / "lora-otel")
    load = span_named(j, "load model")
    weights = span_named(j, "load weights")
    assert load.parent_id == j.root.span_id and weights.parent_id == load.span_id
    assert load.attrs["model"] == "tiny" and load.attrs["token"] == "[REDACTED]"
    assert [e[1] for e in weights.events] == ["weights found"]
    save = span_named(j, "save")
    assert save.status == "error" and "disk quota exceeded" in save.message
    assert "mark: weights found" in r.stderr and "[lora-otel]" not in r.stdout
    args = span_named(j, "arguments")
    assert args.attrs["lora_otel.arguments.parser"] == "lora_otel.mark"
