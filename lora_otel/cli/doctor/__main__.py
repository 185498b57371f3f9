"""``python -m lora_otel.cli.doctor --child``: the check process (`lora_otel.cli.doctor.child`).

The parent starts it with ``python -c`` (see ``_CHILD_CODE``), which adds no import spans of its
own; this entry point serves a person or a tool that names the module.
"""

from __future__ import annotations

import sys

from lora_otel.cli.doctor.child import _child_main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child_main(sys.argv[2:]))
    sys.stderr.write("this module is lora-otel doctor's check process; run: lora-otel doctor\n")
    sys.exit(2)
