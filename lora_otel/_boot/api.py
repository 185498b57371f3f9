"""The public in-process API: :func:`stage`, :func:`mark`, :func:`progress`.

All three are safe to call whether or not lora_otel is active (inactive: they do nothing), never
raise on a journal problem, and raise ``ValueError`` only on bad arguments.
"""

from __future__ import annotations

import time

from lora_otel._boot import core

_ATTR_TYPES = (str, int, float, bool)


def _clean_attrs(attrs: dict) -> dict:
    from lora_otel._boot import redact

    out: dict = {}
    for k, v in attrs.items():
        if isinstance(v, str):
            out[k] = redact.REDACTED if redact.is_secret_name(k) else redact.redact_value(v)
        elif isinstance(v, _ATTR_TYPES):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, _ATTR_TYPES) for x in v):
            out[k] = [redact.redact_value(x) if isinstance(x, str) else x for x in v]
        else:
            out[k] = redact.redact_value(repr(v))
    return out


class stage:  # noqa: N801 - used like a function: ``with lora_otel.stage("load model"):``
    """A span around a block: ``with lora_otel.stage("load model", model="llama"):``.

    The start is on disk before the block runs; an exception leaving the block ends the span with
    status error (and propagates unchanged). Nested stages nest. Not re-entrant: use one
    ``stage`` object per ``with``.

    Args:
        name: the span name, a non-empty string.
        **attrs: span attributes (str, int, float, bool or lists of them; strings are redacted).
    """

    __slots__ = ("name", "attrs", "_sid")

    def __init__(self, name: str, **attrs: object) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("lora_otel.stage() needs a non-empty name, got %r" % (name,))
        self.name = name
        self.attrs = attrs
        self._sid: str | None = None

    def __enter__(self) -> "stage":
        if core.active:
            with core.fail_open("stage"):
                from lora_otel._boot import hooks

                if self.name == "training":
                    hooks.arguments_done("none seen before training")
                attrs = _clean_attrs(self.attrs) if self.attrs else {}
                self._sid = core.span_start(self.name, attrs)
                if self.name == "training":
                    hooks._training_id = self._sid
        return self

    def __exit__(self, et, ev, tb) -> bool:
        if self._sid is not None:
            with core.fail_open("stage"):
                extra = core.training_attrs() if self.name == "training" else None
                if et is None:
                    core.span_end(self._sid, "ok", attrs=extra)
                else:
                    from lora_otel._boot import redact

                    core.span_end(self._sid, "error", redact.redact_text("%s: %s" % (et.__name__, ev)), extra)
            self._sid = None
        return False


def mark(message: str) -> None:
    """Record a point in time on the current span, and print it as a line.

    ``mark("arguments parsed")`` ends the ``arguments`` span for programs that do not use argparse.
    """
    if not isinstance(message, str):
        raise ValueError("lora_otel.mark() needs a string, got %r" % (type(message).__name__,))
    if not core.active:
        return
    with core.fail_open("mark"):
        from lora_otel._boot import redact

        text = redact.redact_text(message)
        core.span_event(core.current_span_id(), text)
        core.info_line("mark: %s" % text)
        if text.strip().lower().startswith("arguments parsed"):
            from lora_otel._boot import hooks

            hooks.arguments_done("lora_otel.mark")


def progress(step: int | None = None, **metrics: float) -> None:
    """Report training progress: the step counter and a few metrics (loss=…, lr=…).

    Cheap (no I/O): the values go out with the next once-per-second beat record. Opens the
    ``training`` span if it is not open yet.
    """
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError("lora_otel.progress(step=…) needs a non-negative int, got %r" % (step,))
    for k, v in metrics.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError("lora_otel.progress(%s=…) needs a number, got %r" % (k, type(v).__name__))
    if not core.active:
        return
    with core.fail_open("progress"):
        from lora_otel._boot import hooks

        hooks.ensure_training("lora_otel.progress", "lora_otel.progress")
        if step is not None:
            core.steps = step
            core.last_step_ns = time.time_ns()
        core.metrics.update(metrics)
