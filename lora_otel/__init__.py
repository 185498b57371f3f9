"""lora_otel: make silent hangs of training jobs visible.

The in-process API is three calls; activation is by ``LORA_OTEL=1``, ``lora-otel run``,
``python -m lora_otel script.py`` or ``import lora_otel.auto`` (see the README). Importing this
package loads only the standard library and does not start anything.

The names load on first use (PEP 562): the ``.pth`` hook imports this package in every process of
the environment, and a process that never calls the API (``pip``, ``python -c ...``) does not pay
for loading it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the names come from __getattr__
    from lora_otel._boot.api import mark, progress, stage
    from lora_otel._version import __version__
del TYPE_CHECKING

__all__ = ["__version__", "mark", "progress", "stage"]


def __getattr__(name: str) -> object:
    if name == "__version__":
        from lora_otel._version import __version__ as value
    elif name in ("mark", "progress", "stage"):
        from lora_otel._boot import api

        value = getattr(api, name)
    else:
        raise AttributeError("module 'lora_otel' has no attribute %r" % name)
    globals()[name] = value  # once: later look-ups find it without this call
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
