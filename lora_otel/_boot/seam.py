"""The seam: everything the reading side (`lora_otel.journal`, `.analysis`, `.export`, `.cli`) may
use of the in-process half, and the only module of `lora_otel._boot` it imports (an import-linter
contract in pyproject.toml says so; `lora-otel doctor`, which checks the in-process half by running
it, is the one listed exception).

What crosses: where journals live and how they are named (`paths`, `files`), the rules both halves
must apply alike — the stall limits' grammar (`limits`), redaction (`redact`), the environment facts
(`envfacts`), the memory cgroup (`cgroup`), the quiet-time rule's check for a launcher's ranks, the program-image
fingerprint a reader compares with the journal's (`image`), how a duration, a time and a stall are
written (`words`) — and whether a process starts a sidecar. The
journal's record format itself is documented in docs/journal.md and read by `lora_otel.journal`.

Importing this module imports those modules (standard library only, no side effects); the function
of `preamble` is looked up when called, so that a reader does not load the preamble.
"""

from __future__ import annotations

from typing import Any

from lora_otel._boot import cgroup, envfacts, files, limits, paths, redact, words
from lora_otel._boot.cgroup import memory_cgroup, oom_kill_count
from lora_otel._boot.envfacts import PACKAGES
from lora_otel._boot.envfacts import _normalize as normalize_package
from lora_otel._boot.image import image_identity
from lora_otel._boot.jsonl import printable
from lora_otel._boot.narrate import waits_for_ranks
from lora_otel._boot.paths import JOURNAL_SUFFIX
from lora_otel._boot.redact import redact_text, redact_value
from lora_otel._boot.spawn import exports as starts_sidecar
from lora_otel._boot.where import text as frames_text
from lora_otel._boot.words import duration, iso_time, learned_why, stall_what, stalled_line

__all__ = [
    "JOURNAL_SUFFIX",
    "PACKAGES",
    "cgroup",
    "duration",
    "envfacts",
    "files",
    "frames_text",
    "image_identity",
    "iso_time",
    "learned_why",
    "limits",
    "memory_cgroup",
    "normalize_package",
    "oom_kill_count",
    "paths",
    "printable",
    "redact",
    "redact_text",
    "redact_value",
    "stack_signal",
    "stall_what",
    "stalled_line",
    "starts_sidecar",
    "waits_for_ranks",
    "words",
]


def stack_signal(env: Any = None) -> int:
    """`lora_otel._boot.preamble.stack_signal`: the signal that asks a process for its stacks."""
    from lora_otel._boot.preamble import stack_signal as signal_number

    return signal_number(env)
