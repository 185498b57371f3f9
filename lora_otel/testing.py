"""Helpers for testing code that uses lora_otel: read a journal, find spans.

    from lora_otel.testing import read_journal, find_span
    j = read_journal("runs/train.log.otel.jsonl")
    assert find_span(j, "training").attrs["lora_otel.training.steps"] == 40

These run on the exporting side (they are not for use inside the traced process's hot path).
"""

from __future__ import annotations

from lora_otel.journal.reader import Journal, JournalError, Span, read_journal

__all__ = ["Journal", "JournalError", "Span", "find_span", "read_journal"]


def find_span(journal: Journal, name: str) -> Span:
    """The first span called ``name``; ``LookupError`` listing the names present otherwise."""
    for span in journal.spans:
        if span.name == name:
            return span
    raise LookupError("no span %r in %s (spans: %s)" % (name, journal.path, ", ".join(s.name for s in journal.spans)))
