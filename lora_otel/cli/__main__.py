"""``python -m lora_otel.cli``: the `lora-otel` command, as when ``lora_otel.cli`` was a module."""

from __future__ import annotations

import sys

from lora_otel.cli import main

sys.exit(main())
