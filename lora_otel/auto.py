"""``import lora_otel.auto`` as the first line of a script starts tracing this process."""

from lora_otel._boot import preamble as _preamble

_preamble.start("import lora_otel.auto")
