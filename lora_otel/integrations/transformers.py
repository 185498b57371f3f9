"""transformers ``Trainer``: `LoraOtelCallback` (code in `lora_otel._boot.frameworks.transformers`)."""

from __future__ import annotations

from lora_otel._boot.frameworks.transformers import LoraOtelCallback, install

__all__ = ["LoraOtelCallback", "install"]
