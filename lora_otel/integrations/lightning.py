"""Lightning ``Trainer``: ``LoraOtelCallback``, made for whichever of ``lightning.pytorch`` and
``pytorch_lightning`` is installed when first asked for (code in `lora_otel._boot.frameworks.lightning`)."""

from __future__ import annotations

from lora_otel._boot.frameworks.lightning import callback_class, install

__all__ = ["LoraOtelCallback", "callback_class", "install"]  # noqa: F822 - LoraOtelCallback comes from __getattr__


def __getattr__(name: str) -> type:
    if name == "LoraOtelCallback":
        return callback_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
