"""Translate a journal into OpenTelemetry spans, and build the OTLP exporter from the environment.

The spans keep the journal's exact trace and span ids, so that a span exported from a journal is
the same span wherever else it is seen. Rules (docs/journal.md):

- The ``process`` span's ``service.*``, ``process.*``, ``host.*``, ``os.*`` and ``container.*``
  attributes become the resource, merged by ``Resource.create`` with ``OTEL_RESOURCE_ATTRIBUTES``
  and ``OTEL_SERVICE_NAME`` (the journal's values win, as attributes given in code do in the SDK).
- Successful ``import ...`` spans shorter than ``config.import_threshold_ms`` (default 5) are
  dropped; their children, if any, move up to the nearest kept ancestor. Failed imports are kept.
- A span still open goes out once as *incomplete*: status ERROR with the description
  ``incomplete: <name> open for N s (no end recorded)``, attribute ``lora_otel.incomplete=true``,
  ending at the journal's last evidence.
- ``error`` spans get StatusCode.ERROR with their message; ``ok`` spans keep status UNSET, as
  OpenTelemetry asks of instrumentation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from lora_otel._boot.seam import redact
from lora_otel._version import __version__
from lora_otel.journal.reader import Journal, Span, format_duration

if TYPE_CHECKING:
    from collections.abc import Container

    from typing_extensions import TypeGuard  # typing.TypeGuard from Python 3.10

INCOMPLETE_ATTRIBUTE = "lora_otel.incomplete"
DEFAULT_IMPORT_THRESHOLD_MS = 5
RESOURCE_PREFIXES = ("service.", "process.", "host.", "os.", "container.")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")

_SCOPE = InstrumentationScope("lora_otel", __version__)
_INT64 = range(-(2**63), 2**63)


class ExporterConfigError(ValueError):
    """The OTLP exporter settings in the environment are not usable. One-line message."""


@dataclass
class Translation:
    """The spans to export, and what happened on the way."""

    spans: list[ReadableSpan]
    incomplete: int
    dropped_imports: int


def translate(journal: Journal) -> Translation:
    """The journal's spans as OpenTelemetry `ReadableSpan` objects, ready for ``exporter.export``."""
    dropped = {span.span_id: span for span in journal.spans if _is_short_import(span, journal)}
    kept = [span for span in journal.spans if span.span_id not in dropped]
    translator = _Translator(journal, dropped)
    return Translation(
        [translator.readable(span) for span in kept],
        incomplete=sum(span.is_open for span in kept),
        dropped_imports=len(dropped),
    )


class _Translator:
    """What every span of one journal shares: resource, trace flags, the dropped imports."""

    def __init__(self, journal: Journal, dropped: dict[str, Span], resource: Optional[Resource] = None) -> None:
        self.journal = journal
        self.dropped = dropped
        self.resource = resource if resource is not None else make_resource(journal)
        self.trace_flags = TraceFlags(TraceFlags.SAMPLED if journal.sampled else TraceFlags.DEFAULT)
        self.known: Container[str] = {span.span_id for span in journal.spans}  # live: every parent but the root's

    def readable(self, span: Span) -> ReadableSpan:
        attributes = otel_attributes(span.attrs)
        if span is self.journal.root:
            attributes = {key: value for key, value in attributes.items() if not _is_resource_key(key)}
        end_ns = span.end_ns
        if end_ns is None:
            end_ns = max(self.journal.last_life_ns or span.start_ns, span.start_ns)
            attributes[INCOMPLETE_ATTRIBUTE] = True
            status = Status(
                StatusCode.ERROR,
                f"incomplete: {clean_text(span.name)} open for "
                f"{format_duration(end_ns - span.start_ns)} (no end recorded)",
            )
        elif span.status == "error":
            status = Status(StatusCode.ERROR, clean_text(span.message or "error"))
        else:
            status = Status(StatusCode.UNSET)
        return ReadableSpan(
            name=clean_text(span.name),
            context=self._context(span.trace_id, span.span_id, is_remote=False),
            parent=self._parent(span),
            resource=self.resource,
            attributes=attributes,
            events=[Event(clean_text(name), otel_attributes(attrs), ts) for ts, name, attrs in span.events],
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=span.start_ns,
            end_time=end_ns,
            instrumentation_scope=_SCOPE,
            links=self._links(span),
        )

    def _links(self, span: Span) -> list[Link]:
        """The root span of a run a UI launched as a trace of its own links to the UI's root span
        (``lora_otel.launched_by.*``): Jaeger and Tempo show it as a reference to follow."""
        if span is not self.journal.root:
            return []
        trace_id, span_id = span.attrs.get(LAUNCHED_BY_TRACE), span.attrs.get(LAUNCHED_BY_SPAN)
        if not (_is_hex(trace_id, 32) and _is_hex(span_id, 16)):
            return []
        context = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=self.trace_flags)
        return [Link(context, {"lora_otel.link": "launched_by"})]

    def _parent(self, span: Span) -> Optional[SpanContext]:
        """The nearest kept ancestor; remote when it is not in this journal (e.g. TRACEPARENT's)."""
        parent_id = span.parent_id
        seen = {span.span_id}
        while parent_id in self.dropped and parent_id not in seen:
            seen.add(parent_id)
            parent_id = self.dropped[parent_id].parent_id
        if parent_id is None or parent_id in seen:
            return None
        return self._context(span.trace_id, parent_id, is_remote=parent_id not in self.known)

    def _context(self, trace_id: str, span_id: str, *, is_remote: bool) -> SpanContext:
        return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=is_remote, trace_flags=self.trace_flags)


LAUNCHED_BY_TRACE = "lora_otel.launched_by.trace_id"
LAUNCHED_BY_SPAN = "lora_otel.launched_by.span_id"


def _is_hex(value: Any, length: int) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and len(value) == length
        and value != "0" * length
        and all(c in "0123456789abcdef" for c in value)
    )


def make_resource(journal: Journal) -> Resource:
    """The resource: the ``process`` span's resource attributes, merged with the OTEL_* variables."""
    attrs = otel_attributes(journal.root.attrs) if journal.root is not None else {}
    return Resource.create({key: value for key, value in attrs.items() if _is_resource_key(key)})


def make_exporter(timeout: Optional[float] = None) -> SpanExporter:
    """The OTLP span exporter the standard environment asks for.

    http/protobuf by default; gRPC when ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or else
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` is ``grpc``. The exporter classes read their own endpoint,
    headers, timeout and TLS variables; ``timeout`` (seconds) applies only when no
    ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` is set.

    Raises:
        ExporterConfigError: the protocol is neither ``http/protobuf`` nor ``grpc``.
    """
    variable, protocol = _protocol_setting(PROTOCOL_VARIABLES)
    kwargs = _timeout_kwargs(timeout, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
    if protocol.lower() == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter

        exporter: SpanExporter = _with_http_status(HTTPExporter, kwargs, "TRACES")
        return exporter
    if protocol.lower() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPCExporter

        return GRPCExporter(**kwargs)
    raise ExporterConfigError(f"{variable}={protocol!r} is not supported: use 'http/protobuf' (the default) or 'grpc'")


def make_log_exporter(timeout: Optional[float] = None) -> Any:
    """The OTLP log record exporter the standard environment asks for (``OTEL_EXPORTER_OTLP_LOGS_*``).

    Raises:
        ExporterConfigError: the protocol is neither ``http/protobuf`` nor ``grpc``.
    """
    variable, protocol = _protocol_setting(("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"))
    kwargs = _timeout_kwargs(timeout, "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT")
    if protocol.lower() == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HTTPLogExporter

        return _with_http_status(HTTPLogExporter, kwargs, "LOGS")
    if protocol.lower() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GRPCLogExporter

        return GRPCLogExporter(**kwargs)
    raise ExporterConfigError(f"{variable}={protocol!r} is not supported: use 'http/protobuf' (the default) or 'grpc'")


REFUSED_STATUS = (400, 413)
"""HTTP answers that refuse the data itself (bad data, too large): per the OTLP specification not
retried as they are; a refused batch is split until the refused spans are alone, and those skipped."""


class HTTPStatus:
    """The HTTP status of an OTLP/HTTP exporter's last answer, kept by a ``requests`` response hook.

    The SDK exporters report only success or failure; the outbox needs to tell a backend that is
    away (retry) from one that refuses the data itself (400, 413: do not send it again as it is).
    """

    code: Optional[int] = None

    def __call__(self, response: Any, *args: Any, **kwargs: Any) -> None:
        self.code = getattr(response, "status_code", None)


def _with_http_status(exporter_class: Any, kwargs: dict[str, Any], signal: str) -> Any:
    """``exporter_class(**kwargs)`` with its own ``requests`` session whose answers set the
    exporter's ``lora_otel_http_status`` (an `HTTPStatus`). Left to the SDK when a credential
    provider session is configured (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_*CREDENTIAL_PROVIDER``)."""
    if any(os.environ.get(f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{part}CREDENTIAL_PROVIDER") for part in ("", signal + "_")):
        return exporter_class(**kwargs)
    try:
        import requests

        session = requests.Session()
        status = HTTPStatus()
        session.hooks["response"].append(status)
        exporter = exporter_class(session=session, **kwargs)
    except (ImportError, TypeError):  # an SDK without the session argument
        return exporter_class(**kwargs)
    exporter.lora_otel_http_status = status
    return exporter


def http_status(exporter: Any) -> Optional[HTTPStatus]:
    """The `HTTPStatus` `make_exporter`/`make_log_exporter` attached, if any."""
    status = getattr(exporter, "lora_otel_http_status", None)
    return status if isinstance(status, HTTPStatus) else None


def export_with_status(exporter: Any, batch: Any) -> tuple[Any, Optional[int]]:
    """``exporter.export(batch)``, and the HTTP status of the answer it ended on (None: not an
    OTLP/HTTP exporter of `make_exporter`'s, or no answer at all). Exceptions pass through."""
    status = http_status(exporter)
    if status is not None:
        status.code = None
    result = exporter.export(batch)
    return result, status.code if status is not None else None


def _timeout_kwargs(timeout: Optional[float], signal_variable: str) -> dict[str, Any]:
    if timeout is None or os.environ.get(signal_variable) or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
        return {}
    return {"timeout": timeout}


def _protocol_setting(variables: tuple[str, ...]) -> tuple[str, str]:
    """``(variable, value)`` of the first protocol variable set, else the default."""
    for variable in variables:
        value = os.environ.get(variable, "").strip()
        if value:
            return variable, value
    return "", "http/protobuf"


def describe_endpoint(exporter: SpanExporter) -> str:
    """Where the exporter sends, for messages: the URL, or ``host:port (gRPC)``, without its
    user-info and secret query parameters (``http://[REDACTED]@host/v1/traces?api_key=[REDACTED]``)."""
    # The SDK exporters resolve the endpoint from the environment and keep it only privately.
    endpoint = redact.redact_value(str(getattr(exporter, "_endpoint", "") or "the OTLP endpoint"))
    if "grpc" in type(exporter).__module__:
        return f"{endpoint} (gRPC)"
    return endpoint


def otel_attributes(attrs: dict[str, Any]) -> dict[str, AttributeValue]:
    """Journal attributes as valid OpenTelemetry attributes.

    Strings become valid UTF-8 (lone surrogates as ``\\udcXX`` text); integers beyond 64 bits,
    objects and mixed lists become JSON text; nulls are left out.
    """
    result: dict[str, AttributeValue] = {}
    for key, value in attrs.items():
        converted = _otel_value(value)
        if converted is not None:
            if converted and isinstance(key, str) and redact.is_secret_name(key):
                converted = redact.REDACTED  # a secret-named attribute goes out as no other output shows it
            result[clean_text(key)] = converted
    return result


def clean_text(text: str) -> str:
    """``text`` as valid Unicode (lone surrogates from non-UTF-8 argv become ``\\udcXX`` text),
    redacted as every other output is.

    The one redaction point of the OTLP export: every text bound for a backend passes here (span and
    event names, every string attribute value and the JSON text of structured ones, status
    descriptions, log bodies), so it is redacted by the rules the journal, the job's lines and the
    views apply (``redact_text``: secret shapes, ``name=value`` and ``--name value`` pairs, URL
    user-info and secret query parameters) and loses the values this process knows to be secret
    (``redact.scrub``; the sidecar learns the traced process's, see `learn_secrets`). Evidence
    gathered from outside the job (another process's command line, stacks) was never redacted by
    the job itself. A long text is redacted line by line (a pair's value ends at its line anyway),
    so only a single line over ``redact.MAX_VALUE_CHARS`` is cut."""
    valid = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(valid) <= redact.MAX_VALUE_CHARS:
        return redact.redact_text(valid)
    return "\n".join(redact.redact_text(line) for line in valid.split("\n"))


def learn_secrets(pid: Optional[int], environ: Optional[Any] = None) -> None:
    """Teach ``redact.scrub`` the values the traced process ``pid`` redacted at its start: the
    same rules applied to its command line (``/proc/<pid>/cmdline``) and to the variables its
    self-check records (``environ``: the sidecar's own, inherited from that process). So evidence
    gathered from outside (stacks, errors) cannot carry them to the backend. Never raises."""
    from lora_otel._boot.seam import envfacts

    try:
        envfacts.relevant_env(os.environ if environ is None else environ, redact.redact_env)
    except Exception:  # noqa: BLE001 - best effort
        pass
    if not pid:
        return
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
    except (OSError, ValueError):
        return
    redact.redact_argv(argv)


def _otel_value(value: Any) -> Optional[AttributeValue]:
    if value is None:
        return None
    if _is_scalar(value):
        return clean_text(value) if isinstance(value, str) else value
    if isinstance(value, list) and value:
        kinds = {type(item) for item in value}
        if all(_is_scalar(item) for item in value):
            if len(kinds) == 1:
                return [clean_text(item) if isinstance(item, str) else item for item in value]
            if kinds == {int, float}:
                return [float(item) for item in value]
    return clean_text(json.dumps(value, sort_keys=True))


def _is_scalar(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return value in _INT64
    return isinstance(value, (str, bool, float))


def _is_resource_key(key: str) -> bool:
    return key.startswith(RESOURCE_PREFIXES)


def _is_short_import(span: Span, journal: Journal) -> bool:
    threshold_ms = journal.config.get("import_threshold_ms", DEFAULT_IMPORT_THRESHOLD_MS)
    if isinstance(threshold_ms, bool) or not isinstance(threshold_ms, (int, float)):
        threshold_ms = DEFAULT_IMPORT_THRESHOLD_MS
    return (
        span.name.startswith("import ")
        and span.end_ns is not None
        and span.status == "ok"
        and span.end_ns - span.start_ns < threshold_ms * 1_000_000
    )
