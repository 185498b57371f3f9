"""Framework integrations: transformers ``Trainer``, Lightning ``Trainer``, accelerate ``Accelerator``.

They switch themselves on: when lora_otel is active and the program loads ``transformers.trainer``,
``lightning.pytorch``/``pytorch_lightning`` or ``accelerate``, the import hook calls
:func:`install` (see :mod:`lora_otel._boot.hooks`), which adds a callback to every trainer and
wraps the few methods worth a span. They can also be used explicitly::

    from lora_otel._boot.frameworks.transformers import LoraOtelCallback
    Trainer(..., callbacks=[LoraOtelCallback()])

and a trainer never records twice when both happen. Like the rest of the in-process side they
import nothing but the standard library and the framework itself, do nothing while lora_otel is
not active, and never raise into the program (:class:`~lora_otel._boot.core.fail_open`).

What a training run records (every framework the same way):

- ``training`` — opened when the trainer starts (before the first batch is fetched, so a hang
  there is inside it), pushed as the current span of the trainer's thread, ended when the
  trainer ends (error when it raised). Attributes ``lora_otel.trainer.*`` (framework, version,
  max_steps, epochs, batch size, world size, …) and ``lora_otel.model.*`` (class, parameter
  counts, LoRA rank/alpha/targets when the model is a peft model). An already open ``training``
  span (``lora_otel.stage("training")`` around ``trainer.train()``) gets the attributes instead.
- ``epoch N`` — one span per epoch, N counted from 0 as the frameworks do.
- ``metrics`` — an event with the logged numbers (``lora_otel.metric.<name>``), at most one a
  second per run; every logged value also goes to :func:`lora_otel.progress`, so the beat
  carries the latest.
"""

from __future__ import annotations

import functools

from lora_otel._boot import core, stages, words

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any, TypeVar

    from typing_extensions import ParamSpec

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

MAX_METRICS = 32
"""At most this many metrics per event or progress call (the first ones logged)."""
METRICS_EVENT_INTERVAL_S = 1.0
"""Seconds between two ``metrics`` events of one run (the latest values in between are merged)."""

installed: list[str] = []
"""Frameworks instrumented in this process (also the root span's ``lora_otel.integrations``)."""


def install(kind: str, module: ModuleType) -> None:
    """Instrument ``module`` (a framework module that has just loaded) with integration ``kind``."""
    if kind == "transformers":
        from lora_otel._boot.frameworks import transformers as integration
    elif kind == "lightning":
        from lora_otel._boot.frameworks import lightning as integration  # type: ignore[no-redef]
    elif kind == "accelerate":
        from lora_otel._boot.frameworks import accelerate as integration  # type: ignore[no-redef]
    elif kind in ("hf_args", "hf_models", "datasets"):
        from lora_otel._boot.frameworks import hf

        hf.install(kind, module)
        installed.append(getattr(module, "__name__", kind))
        core.span_attrs(core.root_id, {"lora_otel.integrations": list(installed)})
        return
    else:
        raise ValueError("no lora_otel integration called %r" % (kind,))
    integration.install(module)
    installed.append(getattr(module, "__name__", kind))
    core.span_attrs(core.root_id, {"lora_otel.integrations": list(installed)})


# --- helpers shared by the integrations -------------------------------------------------------


def clean(attrs: Mapping[str, object]) -> dict[str, object]:
    """Attributes with ``None`` dropped, strings redacted, other objects as their repr."""
    from lora_otel._boot.api import _clean_attrs

    return _clean_attrs({k: v for k, v in attrs.items() if v is not None})


def error_text(exc: BaseException) -> str:
    from lora_otel._boot import redact

    return redact.redact_text("%s: %s" % (type(exc).__name__, exc))


def number(value: object) -> int | float | None:
    """``value`` as an int or float, or None: plain numbers, and one-element tensors (``.item()``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    item = getattr(value, "item", None)
    numel = getattr(value, "numel", None)
    if item is None or numel is None:
        return None
    try:
        if numel() != 1:
            return None
        value = item()
    except Exception:  # noqa: BLE001 - not a tensor after all
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def numbers(values: Mapping[Any, object] | None) -> dict[str, int | float]:
    """The numeric entries of a metrics mapping (at most :data:`MAX_METRICS`), keys as strings."""
    out: dict[str, int | float] = {}
    if not values:
        return out
    for k, v in values.items():
        n = number(v)
        if n is not None:
            out[str(k)] = n
            if len(out) >= MAX_METRICS:
                break
    return out


def metric_attrs(values: Mapping[str, object]) -> dict[str, object]:
    """``{"loss": 0.5}`` → ``{"lora_otel.metric.loss": 0.5}``; NaN and infinities as text (JSON has none)."""
    out: dict[str, object] = {}
    for k, v in values.items():
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            v = repr(v)
        out["lora_otel.metric." + k] = v
    return out


def model_attrs(model: object) -> dict[str, object]:
    """``lora_otel.model.*``: class, parameter counts, and the LoRA settings of a peft model."""
    if model is None:
        return {}
    attrs: dict[str, object] = {"lora_otel.model.class": type(model).__name__}
    params = getattr(model, "parameters", None)
    if params is not None:
        total = trainable = 0
        for p in params():
            n = int(getattr(p, "ds_numel", None) or p.numel())  # DeepSpeed ZeRO-3 partitions: numel() is 0
            total += n
            if p.requires_grad:
                trainable += n
        attrs["lora_otel.model.parameters"] = total
        attrs["lora_otel.model.trainable_parameters"] = trainable
    attrs.update(_peft_attrs(model))
    return attrs


def _peft_attrs(model: Any) -> dict[str, object]:  # a torch module, maybe a peft one
    holder = model if isinstance(getattr(model, "peft_config", None), dict) else None
    if holder is None and hasattr(model, "modules"):  # a LightningModule holding a PeftModel
        for m in model.modules():
            if isinstance(getattr(m, "peft_config", None), dict):
                holder = m
                break
    if holder is None or not holder.peft_config:
        return {}
    configs = holder.peft_config
    active = getattr(holder, "active_adapter", None)
    cfg = configs.get(active) if isinstance(active, str) else None
    cfg = cfg if cfg is not None else next(iter(configs.values()))
    attrs: dict[str, object] = {}
    kind = getattr(cfg, "peft_type", None)
    if kind is not None:
        attrs["lora_otel.peft.type"] = str(getattr(kind, "value", kind))
    for field in ("r", "lora_alpha", "lora_dropout"):
        value = getattr(cfg, field, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs["lora_otel.peft." + field] = value
    targets = getattr(cfg, "target_modules", None)
    if isinstance(targets, str):
        attrs["lora_otel.peft.target_modules"] = targets
    elif targets:
        attrs["lora_otel.peft.target_modules"] = sorted(str(t) for t in targets)[:32]
    return attrs


def spanned(
    orig: Callable[_P, _R],
    name: str,
    before: Callable[..., Mapping[str, object]] | None = None,
    after: Callable[..., Mapping[str, object]] | None = None,
    outermost: bool = False,
) -> Callable[_P, _R]:
    """Wrap a framework method in a span ``name`` (the original is called exactly once).

    ``before(*args, **kwargs)`` returns the start attributes, ``after(result, *args, **kwargs)``
    the end attributes; both run under ``fail_open``. The span ends in error, with the exception's
    text, when the method raises (the exception propagates unchanged). ``outermost``: no span when
    one called ``name`` is open already (a method that calls itself again inside).
    """
    if getattr(orig, "_lora_otel", False):
        return orig

    @functools.wraps(orig)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        sid = None
        if core.active:
            with core.fail_open(name):
                if not (outermost and core.find_open(name) is not None):
                    sid = core.span_start(name, clean(before(*args, **kwargs)) if before else {})
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            if sid is not None:
                with core.fail_open(name):
                    core.span_end(sid, "error", error_text(e))
            raise
        if sid is not None:
            with core.fail_open(name):
                core.span_end(sid, "ok", attrs=clean(after(result, *args, **kwargs)) if after else None)
        return result

    wrapper._lora_otel = True  # type: ignore[attr-defined]
    return wrapper


OWNER = "_lora_otel_callback"
"""Attribute set on the object a run belongs to (a TrainerState, a Lightning Trainer): the id() of
the callback recording it, so explicit plus automatic callbacks record once."""


def claim(run_object: object, callback: object) -> bool:
    """Whether ``callback`` records the run ``run_object`` belongs to (claiming it if unclaimed)."""
    if not core.active:
        return False
    owner: object = getattr(run_object, OWNER, None)
    if owner is None:
        try:
            setattr(run_object, OWNER, id(callback))
        except Exception:  # noqa: BLE001 - an object that takes no attributes: record anyway
            pass
        return True
    return owner == id(callback)


class TrainingRun:
    """What a trainer callback records for one run: ``training``, ``epoch N`` and ``metrics``.

    Not thread-safe: the frameworks call their callbacks from the training thread.

    Args:
        started_by: ``lora_otel.training.started_by`` and the "training started (...)" line.
    """

    def __init__(self, started_by: str) -> None:
        self.started_by = started_by
        self.training_id: str | None = None
        self.owns_training = False
        self.epoch_id: str | None = None
        self.epoch_first_step = 0
        self._last_event = float("-inf")
        self._pending: dict[str, int | float] = {}
        self._pending_step: int | None = None
        self._started = 0.0

    @property
    def running(self) -> bool:
        return self.training_id is not None and self.training_id in core.open_spans

    def begin(self, attrs: Mapping[str, object]) -> None:
        """Open ``training`` (or give the open one ``attrs``)."""

        if self.training_id is not None or self.epoch_id is not None:
            self.end("error", "ended without the trainer's end callback (it raised, or training restarted)")
        self._started = core.monotonic_ns() / 1e9
        self._last_event = float("-inf")
        cleaned = clean(attrs)
        sid = stages.training_id if stages.training_id in core.open_spans else core.find_open("training")
        if sid is None:
            stages.arguments_done("none seen before training")
            cleaned["lora_otel.training.started_by"] = self.started_by
            sid = core.span_start("training", cleaned, parent_id=core.root_id)
            stages.training_id = sid
            self.owns_training = True
            core.info_line("training started (%s)" % self.started_by)
        else:
            core.span_attrs(sid, cleaned)
            self.owns_training = False
        self.training_id = sid

    def end(self, status: str = "ok", message: str | None = None, attrs: Mapping[str, object] | None = None) -> None:
        """End the open epoch and, when this run opened it, ``training`` (with the step counters)."""
        self.end_epoch(status, message)
        if self.training_id is None:
            return
        self.flush_metrics()
        sid, self.training_id = self.training_id, None
        extra = clean(attrs or {})
        if self.owns_training and sid in core.open_spans:
            final = core.training_attrs()
            final.update(extra)
            core.span_end(sid, status, message, final)
            if status == "ok":
                core.info_line(
                    "training ended (%s) after %s, %d optimizer steps"
                    % (self.started_by, words.duration(core.monotonic_ns() / 1e9 - self._started), core.steps)
                )
        elif extra and sid in core.open_spans:
            core.span_attrs(sid, extra)
        self.owns_training = False

    def begin_epoch(self, index: int, step: int) -> None:
        self.end_epoch()
        self.epoch_first_step = step
        self.epoch_id = core.span_start(
            "epoch %d" % index, {"lora_otel.epoch": index}, parent_id=self.training_id or core.current_span_id()
        )

    def end_epoch(self, status: str = "ok", message: str | None = None, step: int | None = None) -> None:
        if self.epoch_id is None:
            return
        sid, self.epoch_id = self.epoch_id, None
        attrs = None
        if step is not None:
            attrs = {"lora_otel.training.step": step, "lora_otel.epoch.steps": max(0, step - self.epoch_first_step)}
        core.span_end(sid, status, message, attrs)

    def metrics(self, step: int | None, values: Mapping[Any, object] | None) -> None:
        """Logged metrics: to :func:`lora_otel.progress` while training runs, and as a ``metrics``
        event at most once per :data:`METRICS_EVENT_INTERVAL_S` (values in between are merged)."""
        found = numbers(values)
        if not found:
            return
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            step = None
        if self.running:
            from lora_otel._boot.api import progress

            progress(step, **{k: v for k, v in found.items() if k != "step"})
        self._pending.update(found)
        if step is not None:
            self._pending_step = step
        now = core.monotonic_ns() / 1e9
        if now - self._last_event >= METRICS_EVENT_INTERVAL_S:
            self._last_event = now
            self.flush_metrics()

    def flush_metrics(self) -> None:
        """Send the metrics held back by the rate limit as one ``metrics`` event."""
        if not self._pending:
            return
        attrs = metric_attrs(self._pending)
        if self._pending_step is not None:
            attrs["lora_otel.training.step"] = self._pending_step
        self._pending = {}
        self._pending_step = None
        core.span_event(
            self.epoch_id or (self.training_id if self.running else None) or core.current_span_id(), "metrics", attrs
        )
