"""Lightning ``Trainer``: ``LoraOtelCallback``, and the wrappers installed with it.

Installed by itself when lora_otel is active and ``lightning.pytorch`` or ``pytorch_lightning``
loads (:func:`install`): every ``Trainer`` gets a ``LoraOtelCallback`` in its ``callbacks`` unless
one is there, and ``Trainer.save_checkpoint`` becomes a span ``save checkpoint``
(``lora_otel.training.step``, ``lora_otel.checkpoint.path``) with a line saying where it saves.

The callback records, from ``on_fit_start`` to ``on_fit_end``, the ``training`` span (attributes
``lora_otel.trainer.*``: framework, version, epochs, max_steps, world_size, rank, num_devices,
precision, strategy, accelerator; ``lora_otel.model.*``/``lora_otel.peft.*`` of the
LightningModule), ``epoch N`` spans (``trainer.current_epoch``), a ``validation`` span per
validation run (``lora_otel.validation.sanity_check``; at its end the logged metrics as
``lora_otel.metric.*``), ``metrics`` events from ``trainer.callback_metrics`` at most once a
second (read only then: ``.item()`` on a GPU tensor waits for the GPU) with
:func:`lora_otel.progress`, a ``save checkpoint`` event when the wrapper is not there, and on an
exception the open spans end in error with its text. Explicit use::

    from lora_otel._boot.frameworks.lightning import LoraOtelCallback
    trainer = Trainer(max_epochs=3, callbacks=[LoraOtelCallback()])

``LoraOtelCallback`` subclasses the ``Callback`` of the Lightning package the program has loaded
(``lightning.pytorch`` first, then ``pytorch_lightning``); :func:`callback_class` gives the class
for a given one. Two callbacks on one trainer record once.
"""

from __future__ import annotations

import functools
import sys

from lora_otel._boot import core
from lora_otel._boot.frameworks import (
    METRICS_EVENT_INTERVAL_S,
    TrainingRun,
    claim,
    clean,
    error_text,
    metric_attrs,
    model_attrs,
    numbers,
    spanned,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from lightning.pytorch import LightningModule, Trainer

__all__ = ["LoraOtelCallback", "callback_class", "install"]  # noqa: F822 - LoraOtelCallback comes from __getattr__

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


class _Recorder:
    """The callback's hooks, mixed into a ``Callback`` subclass per Lightning package."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._run = TrainingRun("lightning Trainer")
        self._validation_id: str | None = None
        self._last_metrics = float("-inf")

    def _mine(self, trainer: Trainer) -> bool:
        """Whether this callback records ``trainer`` (claiming it if no callback has)."""
        return claim(trainer, self)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                self._run.begin(_train_attrs(trainer, pl_module))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                self._run.begin_epoch(int(trainer.current_epoch), int(trainer.global_step))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                self._run.end_epoch(step=int(trainer.global_step))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if not core.active:
            return
        now = core.monotonic_ns() / 1e9
        if now - self._last_metrics >= METRICS_EVENT_INTERVAL_S and self._mine(trainer):
            self._last_metrics = now
            with core.fail_open("lightning callback"):
                self._run.metrics(int(trainer.global_step), trainer.callback_metrics)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                self._end_validation("error", "a new validation began before this one ended")
                self._validation_id = core.span_start(
                    "validation",
                    clean(
                        {
                            "lora_otel.training.step": int(trainer.global_step),
                            "lora_otel.epoch": int(trainer.current_epoch),
                            "lora_otel.validation.sanity_check": bool(trainer.sanity_checking),
                        }
                    ),
                )

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                found = {} if trainer.sanity_checking else numbers(trainer.callback_metrics)
                self._end_validation("ok", attrs=metric_attrs(found))
                if found:
                    self._run.metrics(int(trainer.global_step), found)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: object) -> None:
        if self._mine(trainer) and not getattr(type(trainer).save_checkpoint, "_lora_otel", False):
            with core.fail_open("lightning callback"):
                core.span_event(
                    core.current_span_id(), "save checkpoint", {"lora_otel.training.step": int(trainer.global_step)}
                )

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                text = error_text(exception)
                self._end_validation("error", text)
                self._run.end("error", text)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._mine(trainer):
            with core.fail_open("lightning callback"):
                self._end_validation("error", "fit ended inside validation")
                self._run.end(
                    "ok",
                    attrs={
                        "lora_otel.trainer.global_step": int(trainer.global_step),
                        "lora_otel.trainer.epoch": int(trainer.current_epoch),
                    },
                )

    def _end_validation(self, status: str, message: str | None = None, attrs: dict[str, object] | None = None) -> None:
        if self._validation_id is not None:
            sid, self._validation_id = self._validation_id, None
            core.span_end(sid, status, message, attrs)


def _train_attrs(trainer: Trainer, pl_module: LightningModule) -> dict[str, object]:
    package = type(trainer).__module__.partition(".")[0]
    attrs: dict[str, object] = {
        "lora_otel.trainer.framework": "lightning",
        "lora_otel.trainer.version": getattr(sys.modules.get(package), "__version__", None),
    }
    for attr, name in (
        ("epochs", "max_epochs"),
        ("max_steps", "max_steps"),
        ("world_size", "world_size"),
        ("rank", "global_rank"),
        ("num_devices", "num_devices"),
        ("precision", "precision"),
    ):
        try:
            value = getattr(trainer, name, None)
        except Exception:  # noqa: BLE001 - a property the trainer cannot answer yet
            continue
        attrs["lora_otel.trainer." + attr] = value if isinstance(value, (int, float)) or value is None else str(value)
    for attr in ("strategy", "accelerator"):
        try:
            attrs["lora_otel.trainer." + attr] = type(getattr(trainer, attr)).__name__
        except Exception:  # noqa: BLE001
            pass
    attrs.update(model_attrs(pl_module))
    return attrs


_classes: dict[str, type] = {}  # Lightning package name -> its LoraOtelCallback class


def _package(module: ModuleType | None = None) -> ModuleType:
    """The Lightning package module: ``module``'s, else the one loaded, else the one importable."""
    if module is not None:
        name = "pytorch_lightning" if module.__name__.partition(".")[0] == "pytorch_lightning" else "lightning.pytorch"
        return sys.modules.get(name) or module
    for name in _PACKAGES:
        if name in sys.modules:
            return sys.modules[name]
    try:
        import lightning.pytorch as package
    except ImportError:
        import pytorch_lightning as package  # type: ignore[no-redef]
    return package


def callback_class(package: ModuleType | None = None) -> type:
    """``LoraOtelCallback`` for ``package`` (``lightning.pytorch`` or ``pytorch_lightning``).

    Args:
        package: the Lightning package module (or one of its modules); None: the one the program
            has loaded, ``lightning.pytorch`` first.
    """
    package = _package(package)
    cls = _classes.get(package.__name__)
    if cls is None:
        cls = type(
            "LoraOtelCallback",
            (_Recorder, package.Callback),
            {
                "__module__": __name__,
                "__doc__": "Records a Lightning ``Trainer`` run in the lora_otel journal (see the module); "
                "does nothing while lora_otel is off.",
            },
        )
        _classes[package.__name__] = cls
    return cls


def __getattr__(name: str) -> type:
    if name == "LoraOtelCallback":
        return callback_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


# --- installed wrappers ---------------------------------------------------------------------------


def _with_callback(callbacks: object, package: ModuleType) -> object:
    """``callbacks`` (None, one Callback, or a list) with a LoraOtelCallback added unless present."""
    if callbacks is None:
        items: list[object] = []
    elif isinstance(callbacks, package.Callback):
        items = [callbacks]
    elif isinstance(callbacks, (list, tuple)):
        items = list(callbacks)
    else:
        return callbacks  # something this code does not know: left as given
    if any(isinstance(cb, _Recorder) for cb in items):
        return callbacks
    return [*items, callback_class(package)()]


def _wrap_init(init: Callable[..., None], package: ModuleType) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the name tracebacks show
        if core.active:
            with core.fail_open("lightning integration"):
                kwargs["callbacks"] = _with_callback(kwargs.get("callbacks"), package)
        init(self, *args, **kwargs)

    __init__._lora_otel = True  # type: ignore[attr-defined]
    return __init__


def _save_before(self: Trainer, *args: object, **kwargs: object) -> dict[str, object]:
    from lora_otel._boot import redact

    filepath = args[0] if args else kwargs.get("filepath")
    path = redact.redact_value(str(filepath))
    step = int(self.global_step)
    core.info_line("save checkpoint: step %d to %s" % (step, path))
    return {"lora_otel.training.step": step, "lora_otel.checkpoint.path": path}


def install(module: ModuleType | None = None) -> None:
    """Instrument a Lightning package (``lightning.pytorch`` or ``pytorch_lightning``; the one
    loaded when not given); safe to call more than once."""
    package = _package(module)
    trainer = package.Trainer
    if not getattr(trainer.__init__, "_lora_otel", False):
        trainer.__init__ = _wrap_init(trainer.__init__, package)
    trainer.save_checkpoint = spanned(trainer.save_checkpoint, "save checkpoint", _save_before)
