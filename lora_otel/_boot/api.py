"""The public in-process API: :func:`stage`, :func:`mark`, :func:`progress`.

All three are safe to call whether or not lora_otel is active (inactive: they do nothing) and never
raise on a journal problem. :func:`progress` never raises at all: a value is recorded as the number
it holds (a torch tensor, a numpy scalar, ``Decimal``, ``Fraction``, ``bool``) or dropped with one
line per key. Only a call that cannot be meant (``stage()`` without a name, ``mark()`` of something
that is not a string) raises ``ValueError``, with tracing on or off, so it shows on the first run.

Numbers are read by duck typing (``.item()``, ``__index__``, ``__float__``): torch and numpy are
never imported. Reading a tensor on an accelerator (``.item()`` on CUDA) waits for the device, so
`progress` does not: it keeps the tensor (detached from its graph) and a converter thread reads it
once per beat interval, off the training thread and off the beat thread (a hung device blocks that
thread only; beats go on).
"""

from __future__ import annotations

import os

from lora_otel._boot import core, jsonl, stages

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from collections.abc import Mapping
    from types import TracebackType
    from typing import Any, Literal

_NO_NUMBER = object()


class _Deferred:
    """A one-element tensor on an accelerator, to be read off the training thread."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


def _on_accelerator(v: object) -> bool:
    """``v.device.type`` is a device other than the CPU (torch: ``cuda``, ``mps``, ``xpu``...)."""
    try:
        kind = getattr(getattr(v, "device", None), "type", None)
    except Exception:  # noqa: BLE001 - a hostile property
        return False
    return isinstance(kind, str) and kind != "cpu"


def _element_count(v: object) -> object:
    """``v.numel()`` (torch) or ``v.size`` (numpy, jax), or None when it says neither."""
    numel = getattr(v, "numel", None)
    if callable(numel):
        return numel()
    size = getattr(v, "size", None)
    return size if type(size) is int else None


def _as_number(v: object, defer: bool = False, depth: int = 0) -> object:
    """The number ``v`` holds, as an ``int`` or ``float`` (a bool as 0 or 1); `_NO_NUMBER` when it
    holds none (a string, None, a tensor of several elements, a complex). With ``defer``, a
    one-element tensor on an accelerator comes back as a `_Deferred` instead of being read (no
    device sync here). Never raises."""
    t = type(v)
    if t is int or t is float:
        return v
    if t is bool:
        return int(v)  # type: ignore[call-overload]  # t is type(v): v is a bool
    try:
        if v is None or isinstance(v, (str, bytes, bytearray, complex)):
            return _NO_NUMBER
        item = getattr(v, "item", None)
        if callable(item) and depth == 0:  # torch tensors, numpy scalars and arrays
            count = _element_count(v)
            if count is not None and count != 1:
                return _NO_NUMBER
            if _on_accelerator(v) and defer:
                detach = getattr(v, "detach", None)  # do not keep the autograd graph alive
                return _Deferred(detach() if callable(detach) else v)
            return _as_number(item(), depth=1)
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return float(v)
        if getattr(t, "__index__", None) is not None:
            return v.__index__()  # type: ignore[attr-defined]
        if getattr(t, "__float__", None) is not None:
            return float(v)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a value that cannot say its number has none
        pass
    return _NO_NUMBER


def _describe(v: object) -> str:
    """``Tensor of shape (4,) on cuda:0`` without reading the data (no device sync, no secrets)."""
    try:
        text = type(v).__name__
        shape = getattr(v, "shape", None)
        if shape is not None:
            text += " of shape %s" % (tuple(shape),)
        device = getattr(v, "device", None)
        if device is not None and not callable(device):
            text += " on %s" % (device,)
        return text
    except Exception:  # noqa: BLE001
        return "value"


def _attr_value(k: str, v: object) -> object:
    """A span attribute from a user's value: the value itself, a number, or a short description."""
    from lora_otel._boot import redact

    if isinstance(v, str):
        return redact.REDACTED if redact.is_secret_name(k) else redact.redact_value(v)
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (list, tuple)):
        if v and all(type(x) is str for x in v):
            # a command line's shape (["train", "--password", "x"]): a secret-named option's value
            # is the next item, which redact_value alone cannot know
            v = redact.redact_argv(list(v))
        items = [_attr_value(k, x) for x in v]
        if all(type(x) in (str, int, float, bool) for x in items):
            return items
        return redact.redact_value("[%s]" % ", ".join(str(x) for x in items))
    if _on_accelerator(v):
        return _describe(v)  # reading it would wait for the device
    number = _as_number(v)
    if number is not _NO_NUMBER:
        return number
    if callable(getattr(v, "item", None)):
        return _describe(v)  # a tensor or an array: its repr would print the data
    try:
        return redact.redact_value(repr(v))
    except Exception:  # noqa: BLE001 - a hostile __repr__
        return _describe(v)


def _clean_attrs(attrs: Mapping[str, object]) -> dict[str, object]:
    return {k: _attr_value(k, v) for k, v in attrs.items()}


class stage:  # noqa: N801 - used like a function: ``with lora_otel.stage("load model"):``
    """A span around a block: ``with lora_otel.stage("load model", model="llama"):``.

    The start is on disk before the block runs; an exception leaving the block ends the span with
    status error (and propagates unchanged). Nested stages nest. Not re-entrant: use one
    ``stage`` object per ``with``.

    Args:
        name: the span name, a non-empty string.
        **attrs: span attributes (str, int, float, bool or lists of them; strings are redacted;
            a value holding one number, such as a CPU tensor or a numpy scalar, becomes that number;
            anything else a short description, never the data of a tensor).
    """

    __slots__ = ("_sid", "attrs", "name")

    def __init__(self, name: str, **attrs: object) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("lora_otel.stage() needs a non-empty name, got %r" % (name,))
        self.name = name
        self.attrs = attrs
        self._sid: str | None = None

    def __enter__(self) -> stage:
        if core.active:
            with core.fail_open("stage"):
                if self.name == "training":
                    stages.arguments_done("none seen before training")
                attrs = _clean_attrs(self.attrs) if self.attrs else {}
                core.promote("stage %s" % self.name)  # a program that says its stages is a job
                self._sid = core.span_start(self.name, attrs)
                if self.name == "training":
                    stages.training_id = self._sid
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
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
            stages.arguments_done("lora_otel.mark")


STEP = "step"

_dropped: set[str] = set()
"""Keys already reported as holding no number (one line per key, not per call)."""
_pending: dict[str, _Deferred] = {}
"""key -> `_Deferred` value the converter thread has not read yet."""
_converter_pid = 0
converter_begun: tuple[int, Any] | None = None
"""(pid, a lock held until that process's converter thread runs): `preamble.threads_begun`."""


def _drop(key: str, value: object, why: str = "which is not one number") -> None:
    if key in _dropped:
        return
    _dropped.add(key)
    core.error_line(
        "lora_otel.progress(%s=…) got a %s, %s; %s is not recorded (said once)" % (key, _describe(value), why, key)
    )


def _set_step(value: object, number: object) -> bool:
    if type(number) is float and number.is_integer():
        number = int(number)
    if type(number) is not int or number < 0:
        _drop(STEP, value, "which is not a non-negative whole number")
        return False
    core.steps = number
    return True


def _defer(key: str, deferred: _Deferred) -> None:
    global _converter_pid, converter_begun
    if _converter_pid != os.getpid():  # first use in this process (or a forked child)
        import _thread

        _pending.clear()
        _converter_pid = os.getpid()
        begun = _thread.allocate_lock()
        begun.acquire()
        _thread.start_new_thread(_convert_loop, (_converter_pid, begun))
        converter_begun = (_converter_pid, begun)
    _pending[key] = deferred


def _convert_loop(my_pid: int, begun: Any) -> None:
    begun.release()  # (`preamble.threads_begun`)
    while core.active and os.getpid() == my_pid:
        core.sleep(core.beat_interval)
        try:
            convert_pending()
        except Exception as e:  # noqa: BLE001 - the thread must not die on one value
            core._stderr("[lora-otel] progress: %s\n" % jsonl.printable("%s: %s" % (type(e).__name__, e)))


def convert_pending() -> None:
    """Read the deferred accelerator tensors (waits for the device; not on the training thread)."""
    while _pending:
        try:
            key, deferred = _pending.popitem()
        except KeyError:
            return
        number = _as_number(deferred.value)
        if number is _NO_NUMBER:
            _drop(key, deferred.value)
        elif key == STEP:
            _set_step(deferred.value, number)
        else:
            core.metrics[key] = number


def progress(step: object = None, **metrics: object) -> None:
    """Report training progress: the step counter and a few metrics (loss=…, lr=…).

    Cheap (no I/O): the values go out with the next once-per-second beat record. Opens the
    ``training`` span if it is not open yet. Never raises: each value is recorded as the number it
    holds — ``int``, ``float``, ``bool`` (0/1), ``Decimal``, ``Fraction``, numpy scalars, one-element
    torch tensors and arrays — or, when it holds none (a string, None, several elements; a ``step``
    that is not a non-negative whole number), dropped with one line per key. A tensor on an
    accelerator is read off the training thread, within a beat interval (no device sync here).
    """
    if not core.active:
        return
    with core.fail_open("progress"):
        stages.ensure_training("lora_otel.progress", "lora_otel.progress")
        if type(step) is int and step >= 0:  # the common case, first
            core.steps = step
            core.last_step_ns = core.now_ns()
            if _pending:
                _pending.pop(STEP, None)
        elif step is not None:
            number = _as_number(step, defer=True)
            if isinstance(number, _Deferred):
                _defer(STEP, number)
                core.last_step_ns = core.now_ns()
            elif number is _NO_NUMBER:
                _drop(STEP, step, "which is not a non-negative whole number")
            elif _set_step(step, number):
                _pending.pop(STEP, None)
                core.last_step_ns = core.now_ns()
        for k, v in metrics.items():
            t = type(v)
            number = v if (t is float or t is int) else _as_number(v, defer=True)
            if isinstance(number, _Deferred):
                _defer(k, number)
                continue
            if _pending:
                _pending.pop(k, None)  # a newer value than the one waiting to be read
            if number is _NO_NUMBER:
                _drop(k, v)
            else:
                core.metrics[k] = number
