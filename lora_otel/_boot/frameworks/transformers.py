"""transformers ``Trainer``: :class:`LoraOtelCallback`, and the wrappers installed with it.

Installed by itself when lora_otel is active and ``transformers.trainer`` loads (:func:`install`):
every ``Trainer`` gets a :class:`LoraOtelCallback` unless it has one, and three methods are
wrapped:

- ``Trainer.evaluate`` → span ``evaluate`` (``lora_otel.training.step``; at its end the returned
  metrics as ``lora_otel.metric.*``);
- ``Trainer._save_checkpoint`` → span ``save checkpoint`` (``lora_otel.training.step``,
  ``lora_otel.checkpoint.path``) and a line saying where it saves, so a save that hangs is named;
- ``Trainer.train`` → when it raises, the run's open ``epoch N`` and ``training`` spans end in
  error with the exception's text.

The callback records ``training`` (attributes ``lora_otel.trainer.*``: framework, version,
max_steps, epochs, batch_size, gradient_accumulation_steps, learning_rate, world_size, rank,
output_dir; and ``lora_otel.model.*``/``lora_otel.peft.*``), ``epoch N`` spans,
``metrics`` events from ``on_log`` (at most one a second, and :func:`lora_otel.progress` for the
beat), and — when the wrappers above are not there to do it — ``evaluate`` and
``save checkpoint`` events. Explicit use::

    from lora_otel._boot.frameworks.transformers import LoraOtelCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[LoraOtelCallback()])

Two callbacks on one trainer (explicit and automatic, or added twice) record once: the first to
see a run claims it.
"""

from __future__ import annotations

import functools
import os
import sys

from transformers.trainer_callback import TrainerCallback

from lora_otel._boot import core
from lora_otel._boot.frameworks import TrainingRun, claim, error_text, metric_attrs, model_attrs, numbers, spanned

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any

    from transformers.trainer import Trainer
    from transformers.trainer_callback import TrainerControl, TrainerState
    from transformers.training_args import TrainingArguments

__all__ = ["LoraOtelCallback", "install"]

_saved_step: int | None = None  # global step of the last checkpoint the save span recorded


class LoraOtelCallback(TrainerCallback):
    """Records a ``Trainer`` run in the lora_otel journal; does nothing while lora_otel is off."""

    def __init__(self) -> None:
        self._run = TrainingRun("transformers Trainer")

    def _mine(self, state: TrainerState) -> bool:
        """Whether this callback records the run ``state`` belongs to (claiming it if unclaimed)."""
        return claim(state, self)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._mine(state):
            with core.fail_open("transformers callback"):
                self._run.begin(_train_attrs(args, state, kwargs.get("model")))

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._mine(state):
            with core.fail_open("transformers callback"):
                self._run.begin_epoch(int(round(state.epoch or 0)), state.global_step)  # noqa: RUF046 - an epoch may be a numpy float

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._mine(state):
            with core.fail_open("transformers callback"):
                self._run.end_epoch(step=state.global_step)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._mine(state):
            with core.fail_open("transformers callback"):
                self._run.metrics(state.global_step, logs)

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Mapping[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._mine(state) and core.find_open("evaluate") is None:  # else the evaluate span has them
            with core.fail_open("transformers callback"):
                attrs = metric_attrs(numbers(metrics))
                attrs["lora_otel.training.step"] = state.global_step
                core.span_event(core.current_span_id(), "evaluate", attrs)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._mine(state) and _saved_step != state.global_step:  # else the save span has it
            with core.fail_open("transformers callback"):
                core.span_event(
                    core.current_span_id(),
                    "save checkpoint",
                    {
                        "lora_otel.training.step": state.global_step,
                        "lora_otel.checkpoint.path": _checkpoint_path(args, state),
                    },
                )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._mine(state):
            with core.fail_open("transformers callback"):
                self._run.end(
                    "ok",
                    attrs={"lora_otel.trainer.global_step": state.global_step, "lora_otel.trainer.epoch": state.epoch},
                )

    def _failed(self, exc: BaseException) -> None:
        if core.active:
            with core.fail_open("transformers callback"):
                self._run.end("error", error_text(exc))


def _checkpoint_path(args: object, state: TrainerState) -> str:
    from lora_otel._boot import redact

    return redact.redact_value(
        os.path.join(str(getattr(args, "output_dir", None) or "."), "checkpoint-%d" % state.global_step)
    )


def _train_attrs(args: TrainingArguments, state: TrainerState, model: object) -> dict[str, object]:
    attrs: dict[str, object] = {
        "lora_otel.trainer.framework": "transformers",
        "lora_otel.trainer.version": getattr(sys.modules.get("transformers"), "__version__", None),
        "lora_otel.trainer.max_steps": getattr(state, "max_steps", None),
        "lora_otel.trainer.epochs": getattr(state, "num_train_epochs", None),
        "lora_otel.trainer.batch_size": getattr(state, "train_batch_size", None),
    }
    for attr, name in (
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ("learning_rate", "learning_rate"),
        ("world_size", "world_size"),
        ("rank", "process_index"),
        ("output_dir", "output_dir"),
    ):
        try:
            attrs["lora_otel.trainer." + attr] = getattr(args, name, None)
        except Exception:  # noqa: BLE001 - a property that needs a distributed state
            pass
    attrs.update(model_attrs(model))
    return attrs


# --- installed wrappers ---------------------------------------------------------------------------


def _callbacks(trainer: object) -> list[object]:
    handler = getattr(trainer, "callback_handler", None)
    return list(getattr(handler, "callbacks", None) or [])


def _wrap_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the name tracebacks show
        init(self, *args, **kwargs)
        if core.active:
            with core.fail_open("transformers integration"):
                if not any(isinstance(cb, LoraOtelCallback) for cb in _callbacks(self)):
                    # transformers leaves CallbackHandler.add_callback unannotated.
                    self.callback_handler.add_callback(LoraOtelCallback())  # type: ignore[no-untyped-call]

    __init__._lora_otel = True  # type: ignore[attr-defined]
    return __init__


def _wrap_train(train: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(train)
    def train_wrapper(self: Trainer, *args: Any, **kwargs: Any) -> object:
        try:
            return train(self, *args, **kwargs)
        except BaseException as e:
            if core.active:
                with core.fail_open("transformers integration"):
                    for cb in _callbacks(self):
                        if isinstance(cb, LoraOtelCallback):
                            cb._failed(e)
            raise

    train_wrapper._lora_otel = True  # type: ignore[attr-defined]
    return train_wrapper


def _evaluate_before(self: Trainer, *args: object, **kwargs: object) -> dict[str, object]:
    return {"lora_otel.training.step": getattr(getattr(self, "state", None), "global_step", None)}


def _evaluate_after(result: object, *args: object, **kwargs: object) -> dict[str, object]:
    return metric_attrs(numbers(result)) if isinstance(result, dict) else {}


def _save_before(self: Trainer, *args: object, **kwargs: object) -> dict[str, object]:
    global _saved_step
    state = self.state
    path = _checkpoint_path(self.args, state)
    _saved_step = state.global_step
    core.info_line("save checkpoint: step %d to %s" % (state.global_step, path))
    return {"lora_otel.training.step": state.global_step, "lora_otel.checkpoint.path": path}


def install(module: ModuleType | None = None) -> None:
    """Instrument ``transformers.trainer`` (imported when not given); safe to call more than once."""
    if module is None:
        import transformers.trainer

        module = transformers.trainer
    trainer = module.Trainer
    if not getattr(trainer.__init__, "_lora_otel", False):
        trainer.__init__ = _wrap_init(trainer.__init__)
    if not getattr(trainer.train, "_lora_otel", False):
        trainer.train = _wrap_train(trainer.train)
    trainer.evaluate = spanned(trainer.evaluate, "evaluate", _evaluate_before, _evaluate_after)
    if hasattr(trainer, "_save_checkpoint"):
        trainer._save_checkpoint = spanned(trainer._save_checkpoint, "save checkpoint", _save_before)
