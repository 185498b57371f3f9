"""``lora-otel replay``: send a journal's spans to the OTLP endpoint, in one batch.

The spans go straight to ``exporter.export`` (no BatchSpanProcessor: there is nothing to batch and
nothing should wait in a queue). Success prints one line; any failure prints one line on stderr and
exits non-zero, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import Iterator

from opentelemetry.sdk.trace.export import SpanExportResult

from lora_otel.export.otlp import describe_endpoint, make_exporter, translate
from lora_otel.export.reader import JournalError, read_journal


def run_replay(args: argparse.Namespace) -> int:
    """Replay the journal ``args.journal``.

    Returns:
        0 when the spans were accepted (or there were none), 1 when the export failed, 2 when the
        journal cannot be read or the exporter settings are unusable.
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
    with _sdk_log_captured() as sdk_errors:
        try:
            result = exporter.export(translation.spans)
        except Exception as e:  # noqa: BLE001 - an exporter bug must still end in one line
            sdk_errors.append(str(e))
            result = SpanExportResult.FAILURE
        finally:
            exporter.shutdown()
    if result is not SpanExportResult.SUCCESS:
        # The first SDK message usually names the cause, the last says that it gave up.
        reasons = dict.fromkeys(sdk_errors[:1] + sdk_errors[-1:])
        reason = ": " + "; ".join(reasons) if reasons else ""
        return _fail(f"could not export {len(translation.spans)} spans to {endpoint}{reason}", 1)
    line = (f"replayed {len(translation.spans)} spans ({translation.incomplete} incomplete, "
            f"{translation.dropped_imports} short imports dropped) to {endpoint}")
    if journal.problems:
        line += f"; {len(journal.problems)} journal problems, see lora-otel inspect"
    print(line)
    return 0


def _fail(message: str, status: int) -> int:
    print(f"lora-otel replay: {message}", file=sys.stderr)
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
