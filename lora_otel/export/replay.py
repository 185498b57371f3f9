"""``lora-otel replay``: send a journal's spans to the OTLP endpoint.

The spans go straight to ``exporter.export`` in batches of `BATCH` (no BatchSpanProcessor: nothing
should wait in a queue), so a long job stays under collectors' request size limits. Success prints
one line; any failure prints one line on stderr and exits non-zero, never a traceback.

With no endpoint set (no ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``) the spans would go to the
OpenTelemetry default, ``localhost:4318``, which any local user can bind first: replay then sends
only to a listener of this user's or root's, as the sidecar's live export does
(`lora_otel.export.loopback.stranger`), else refuses in one line (exit 2) that says how to name an
endpoint. An endpoint named explicitly, ``localhost`` included, is used as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from lora_otel._boot.seam import redact_text
from lora_otel.export.otlp import REFUSED_STATUS, describe_endpoint, export_with_status, make_exporter, translate
from lora_otel.journal.reader import JournalError, read_journal

BATCH = 512


def run_replay(args: argparse.Namespace) -> int:
    """Replay the journal ``args.journal``.

    Returns:
        0 when the spans were accepted (or there were none), 1 when the export failed, 2 when the
        journal cannot be read, the exporter settings are unusable, or no endpoint is set and the
        default port is not provably this user's (`loopback.stranger`).
    """
    try:
        journal = read_journal(args.journal)
    except JournalError as e:
        return _fail(str(e), 2)
    translation = translate(journal)
    try:
        exporter = make_exporter()
    except Exception as e:  # noqa: BLE001 - bad OTEL_* settings: say so in one line
        return _fail(f"cannot set up the OTLP exporter: {e}", 2)
    endpoint = describe_endpoint(exporter)
    if not translation.spans:
        print(f"nothing to replay: no spans in {journal.path}")
        return 0
    from lora_otel.export import loopback

    why = loopback.stranger(os.environ)
    if why is not None:
        return _fail(
            f"not sent: no OTLP endpoint is set and {why}; name your collector: "
            f"OTEL_EXPORTER_OTLP_ENDPOINT=http://HOST:{loopback.defaulted(os.environ, 'TRACES')} "
            f"lora-otel replay {_arg(args.journal)}",
            2,
        )
    total = len(translation.spans)
    with _sdk_log_captured() as sdk_errors:
        try:
            sent, refused, unsent = _export_all(exporter, translation.spans)
        except Exception as e:  # noqa: BLE001 - an exporter bug must still end in one line
            sdk_errors.append(str(e))
            sent, refused, unsent = 0, 0, total
        finally:
            exporter.shutdown()
    if unsent:
        # The first SDK message usually names the cause, the last says that it gave up.
        reasons = dict.fromkeys(sdk_errors[:1] + sdk_errors[-1:])
        reason = ": " + "; ".join(reasons) if reasons else ""
        what = f"{unsent} spans" if unsent == total else f"{unsent} of {total} spans"
        return _fail(f"could not export {what} to {endpoint}{reason}", 1)
    line = (
        f"replayed {sent} spans ({translation.incomplete} incomplete, "
        f"{translation.dropped_imports} short imports dropped) to {endpoint}"
    )
    if journal.problems:
        line += f"; {len(journal.problems)} journal problems, see lora-otel inspect"
    print(redact_text(line))
    if refused:
        return _fail(
            f"the backend refused {refused} of {total} spans as bad data (HTTP 400/413); they stay in the journal", 1
        )
    return 0


def _export_all(exporter: Any, spans: list[ReadableSpan]) -> tuple[int, int, int]:
    """Send ``spans`` in batches of `BATCH`: ``(sent, refused, unsent)``.

    A batch the backend refuses as such (`otlp.REFUSED_STATUS`) is split in halves until the
    refused spans are alone; those are skipped and counted. Any other failure stops the replay
    (the backend is away: trying the next batches would only wait out more timeouts)."""
    pending = [spans[i : i + BATCH] for i in range(0, len(spans), BATCH)]
    sent = refused = 0
    while pending:
        batch = pending.pop(0)
        result, code = export_with_status(exporter, batch)
        if result is SpanExportResult.SUCCESS:
            sent += len(batch)
        elif code in REFUSED_STATUS:
            if len(batch) > 1:
                pending[:0] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
            else:
                refused += 1
        else:
            return sent, refused, len(batch) + sum(len(b) for b in pending)
    return sent, refused, 0


def _arg(path: str) -> str:
    """``path`` as one shell word (a leading ``-`` made a path, not an option), control characters escaped."""
    from lora_otel.journal.tree import _display

    return _display(shlex.quote(os.path.join(".", path) if path.startswith("-") else path))


def _fail(message: str, status: int) -> int:
    print(f"lora-otel replay: {redact_text(message)}", file=sys.stderr)
    return status


class _Collect(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(" ".join(record.getMessage().split()))


@contextlib.contextmanager
def _sdk_log_captured() -> Iterator[list[str]]:
    """Keep the SDK's own log lines off stderr while exporting; yield them for the failure line."""
    logger = logging.getLogger("opentelemetry")
    messages: list[str] = []
    handler = _Collect(messages)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
