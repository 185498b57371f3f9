"""``python -m lora_otel.cli``: the `lora-otel` command (as the module ``lora_otel.cli`` ran before it was a package)."""

from __future__ import annotations

import sys

from lora_otel.cli import main

sys.exit(main())
