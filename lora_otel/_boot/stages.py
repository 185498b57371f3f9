"""The process's standard stages that several hooks open and close: ``arguments`` (ended by the
first of argparse, ``lora_otel.mark``, a stage, training) and ``training`` (opened by the first
optimizer step, ``lora_otel.progress``, a framework's trainer, or ``lora_otel.stage("training")``).
Below `hooks`, `api` and the framework integrations, which all use it."""

from __future__ import annotations

from lora_otel._boot import core

training_id: str | None = None
"""The open ``training`` span's id, once one is open (a forked child starts without one)."""


def arguments_done(how: str, status: str = "ok", message: str | None = None) -> None:
    """End the ``arguments`` span (first call only)."""
    sid = core.find_open("arguments")
    if sid is not None:
        core.span_end(sid, status, message, {"lora_otel.arguments.parser": how})


def ensure_training(started_by: str, why: str) -> None:
    """Open the ``training`` span under ``process`` unless one is open (ends ``arguments`` first)."""
    global training_id
    if core.forked_at:
        core.settle()  # (the parent's training is none of a forked child's)
    if training_id is not None and training_id in core.open_spans:
        return
    if core.find_open("training") is None:
        arguments_done("none seen before training")
        core.promote("training")
        training_id = core.span_start(
            "training", {"lora_otel.training.started_by": started_by}, parent_id=core.root_id, push=False
        )
        core.info_line("training started (%s)" % why)
