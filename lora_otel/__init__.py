"""lora_otel: make silent hangs of training jobs visible.

The in-process API is three calls; activation is by ``LORA_OTEL=1``, ``lora-otel run``,
``python -m lora_otel script.py`` or ``import lora_otel.auto`` (see the README). Importing this
package loads only the standard library and does not start anything.
"""

from __future__ import annotations

from lora_otel._boot.api import mark, progress, stage
from lora_otel._version import __version__

__all__ = ["__version__", "mark", "progress", "stage"]
