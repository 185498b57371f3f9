"""Moved to `lora_otel.journal.reader` (issue 15, CHANGELOG.md); this path imports for one release."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from lora_otel.journal.reader import *  # noqa: F403 - the old path, re-exported whole

warnings.warn(
    "lora_otel.export.reader moved to lora_otel.journal.reader; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """Names the old module had that now live elsewhere in lora_otel.journal (the tail, say)."""
    for module in ("lora_otel.journal.reader", "lora_otel.journal.tail"):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
