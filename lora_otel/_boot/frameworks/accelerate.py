"""accelerate ``Accelerator``: spans around ``Accelerator()`` and ``Accelerator.prepare``.

Installed by itself when lora_otel is active and ``accelerate`` loads (:func:`install`); it also
covers the ``Accelerator`` that a transformers ``Trainer`` creates.

- ``accelerate init`` — ``Accelerator(...)``, where the distributed process group is set up: a
  rank waiting for the others (a wrong ``MASTER_ADDR``, a rank that never started) hangs inside
  it. A line before (``accelerate init: starting``) and after. At its end:
  ``lora_otel.accelerate.distributed_type``, ``num_processes``, ``process_index``,
  ``local_process_index``, ``mixed_precision``, ``device``, ``gradient_accumulation_steps``.
- ``accelerate prepare`` — ``prepare(*objects)``, which wraps the model for DDP/FSDP/DeepSpeed (a
  collective that waits for every rank): the same attributes, and ``lora_otel.accelerate.objects``
  (the type names of what is prepared).

``lora_otel.accelerate.version`` is on both.
"""

from __future__ import annotations

import sys

from lora_otel._boot import core
from lora_otel._boot.frameworks import spanned

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - never true at runtime: no typing import in the process
    from types import ModuleType

__all__ = ["install"]

_STATE = (
    "distributed_type",
    "num_processes",
    "process_index",
    "local_process_index",
    "mixed_precision",
    "device",
    "gradient_accumulation_steps",
)


def _version() -> dict[str, object]:
    return {"lora_otel.accelerate.version": getattr(sys.modules.get("accelerate"), "__version__", None)}


def state_attrs(accelerator: object) -> dict[str, object]:
    """``lora_otel.accelerate.*`` facts an ``Accelerator`` knows once initialised."""
    out = _version()
    for name in _STATE:
        try:
            value = getattr(accelerator, name)
        except Exception:  # noqa: BLE001 - not initialised (init raised), or an older accelerate
            continue
        if hasattr(type(value), "__members__"):  # an Enum: DistributedType.MULTI_GPU -> "MULTI_GPU"
            value = getattr(value, "value", value)
        if type(value) not in (int, float, str, bool):  # torch.device, a str subclass...
            value = str(value)
        out["lora_otel.accelerate." + name] = value
    return out


def _init_before(self: object, *args: object, **kwargs: object) -> dict[str, object]:
    core.info_line("accelerate init: starting (sets up the distributed process group when there is one)")
    return _version()


def _init_after(result: object, self: object, *args: object, **kwargs: object) -> dict[str, object]:
    attrs = state_attrs(self)
    core.info_line(
        "accelerate init: done, %s process(es), distributed type %s, mixed precision %s, device %s"
        % (
            attrs.get("lora_otel.accelerate.num_processes", "?"),
            attrs.get("lora_otel.accelerate.distributed_type", "?"),
            attrs.get("lora_otel.accelerate.mixed_precision", "?"),
            attrs.get("lora_otel.accelerate.device", "?"),
        )
    )
    return attrs


def _prepare_before(self: object, *args: object, **kwargs: object) -> dict[str, object]:
    attrs = state_attrs(self)
    attrs["lora_otel.accelerate.objects"] = [type(obj).__name__ for obj in args[:16]]
    return attrs


def install(module: ModuleType | None = None) -> None:
    """Instrument ``accelerate`` (imported when not given); safe to call more than once."""
    if module is None:
        import accelerate

        module = accelerate
    cls = module.Accelerator
    cls.__init__ = spanned(cls.__init__, "accelerate init", _init_before, _init_after)
    cls.prepare = spanned(cls.prepare, "accelerate prepare", _prepare_before)
