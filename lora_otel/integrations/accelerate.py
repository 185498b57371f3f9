"""accelerate ``Accelerator`` (code in `lora_otel._boot.frameworks.accelerate`)."""

from __future__ import annotations

from lora_otel._boot.frameworks.accelerate import install

__all__ = ["install"]
