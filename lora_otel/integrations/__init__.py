"""Framework integrations: transformers ``Trainer``, Lightning ``Trainer``, accelerate ``Accelerator``.

The public names stay here — ``lora_otel.integrations.transformers.LoraOtelCallback``,
``lora_otel.integrations.lightning.LoraOtelCallback`` — and the code lives with the rest of the
in-process half, in `lora_otel._boot.frameworks` (its docstring says what a run records). They
switch themselves on when lora_otel is active and the program loads the framework; explicit use::

    from lora_otel.integrations.transformers import LoraOtelCallback
    Trainer(..., callbacks=[LoraOtelCallback()])
"""

from __future__ import annotations

from lora_otel._boot.frameworks import install, installed

__all__ = ["install", "installed"]
