"""A real OpenTelemetry collector for tests: the ``rotel`` agent from PyPI, on loopback ports.

The ``rotel`` package ships its binary as ``rotel/rotel-agent`` inside the package directory (no
console script). It runs in the foreground with

    rotel-agent start --otlp-grpc-endpoint 127.0.0.1:P1 --otlp-http-endpoint 127.0.0.1:P2
        --exporter blackhole --debug-log traces --debug-log-verbosity detailed

(and ``--debug-log logs``) and prints every span and log record it receives on stdout, in the
OpenTelemetry Collector's "debug exporter" text layout, which `parse_debug_log` reads back::

    ResourceSpans #0
    Resource attributes:
         -> service.name: Str(train.py)
    Span #0
        Trace ID       : 4bf92f3577b34da6a3ce929d0e0e4736
        Parent ID      : 00f067aa0ba902b7
        ID             : 53995c3f42cd8ad8
        Name           : import torch
        Status code    : STATUS_CODE_ERROR
        Status message : boom
    Attributes:
         -> lora_otel.incomplete: Bool(true)
    Events:
    SpanEvent #0
         -> Name: mark

rotel has no file exporter, so this text is the record. Attribute values that contain a newline
continue on the next line and are cut at the first one here; tests avoid them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


def rotel_agent_path() -> Optional[Path]:
    """The ``rotel-agent`` binary inside the installed ``rotel`` package, or None.

    ``LORA_OTEL_TEST_ROTEL_AGENT`` names another (.ci/matrix.py: PyPI's rotel for Python 3.9 is an
    older build that needs a newer glibc than Debian 12's; the agent is one binary for any Python).
    """
    given = os.environ.get("LORA_OTEL_TEST_ROTEL_AGENT")
    if given:
        return Path(given) if Path(given).is_file() else None
    spec = importlib.util.find_spec("rotel")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "rotel-agent"
    return path if path.is_file() else None


@dataclass
class ReceivedSpan:
    """A span as the collector printed it. ``attributes`` values are typed (``Int(3)`` → 3)."""

    name: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_id: Optional[str] = None
    status_code: str = ""
    status_message: str = ""
    start_ns: int = 0
    end_ns: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)


_SPAN_FIELDS = {
    "Trace ID": "trace_id",
    "Parent ID": "parent_id",
    "ID": "span_id",
    "Name": "name",
    "Status code": "status_code",
    "Status message": "status_message",
}
_FIELD = re.compile(r"^\s+(Trace ID|Parent ID|ID|Name|Kind|Status code|Status message)\s*: ?(.*)$")
_TIME = re.compile(r"^(Start|End) time: (\d+)$")
_ARROW = re.compile(r"^\s+-> ([^:]+): (.*)$")
_TYPED = re.compile(r"^(Str|Int|Double|Bool)\((.*)\)$")


@dataclass
class ReceivedLog:
    """A log record as the collector printed it."""

    body: str = ""
    severity: str = ""
    trace_id: str = ""
    span_id: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


_LOG_FIELD = re.compile(r"^\s*(SeverityText|Body|Trace ID|Span ID)\s*: ?(.*)$")


def parse_debug_log_records(text: str) -> list[ReceivedLog]:
    """The log records in rotel's ``--debug-log logs --debug-log-verbosity detailed`` output."""
    logs: list[ReceivedLog] = []
    resource: dict[str, Any] = {}
    section = ""
    for line in text.splitlines():
        line = line.lstrip("\0")
        if line.startswith(("ResourceLog #", "ResourceLogs #", "ResourceSpans #")):
            resource, section = {}, "resource" if line.startswith("ResourceLog") else "other"
        elif line.startswith("LogRecord #"):
            logs.append(ReceivedLog(resource=resource))
            section = "log"
        elif line.startswith(("Span #", "ScopeSpans #")):
            section = "other"
        elif line.startswith("Attributes:") and section in ("log", "log-attributes"):
            section = "log-attributes"
        elif section in ("log", "log-attributes") and (m := _LOG_FIELD.match(line)):
            key, value = m.groups()
            if key == "SeverityText":
                logs[-1].severity = value.strip()
            elif key == "Body":
                logs[-1].body = str(_typed(value.strip()))
            elif key == "Trace ID":
                logs[-1].trace_id = value.strip()
            else:
                logs[-1].span_id = value.strip()
        elif (m := _ARROW.match(line)) and section in ("resource", "log-attributes"):
            if section == "resource":
                resource[m.group(1).strip()] = _typed(m.group(2))
            else:
                logs[-1].attributes[m.group(1).strip()] = _typed(m.group(2))
    return logs


def parse_debug_log(text: str) -> list[ReceivedSpan]:
    """The spans in rotel's ``--debug-log traces --debug-log-verbosity detailed`` output."""
    spans: list[ReceivedSpan] = []
    resource: dict[str, Any] = {}
    section = ""
    for line in text.splitlines():
        line = line.lstrip("\0")  # a file truncated under a running writer starts with NULs
        if line.startswith("ResourceSpans #"):
            resource, section = {}, "resource"
        elif line.startswith(("ResourceLog #", "ResourceLogs #", "LogRecord #")):
            section = "logs"  # parse_debug_log_records reads these
        elif line.startswith("Span #"):
            spans.append(ReceivedSpan(resource=resource))
            section = "span"
        elif section == "logs":
            continue
        elif line.startswith(("Attributes:", "Events:", "SpanEvent #", "Links:")):
            section = line.split()[0].rstrip(":")
        elif section == "span" and (m := _FIELD.match(line)) and m.group(1) in _SPAN_FIELDS:
            label, value = m.group(1), m.group(2).strip()
            setattr(spans[-1], _SPAN_FIELDS[label], (value or None) if label == "Parent ID" else value)
        elif spans and (m := _TIME.match(line)):
            setattr(spans[-1], "start_ns" if m.group(1) == "Start" else "end_ns", int(m.group(2)))
        elif m := _ARROW.match(line):
            key, value = m.group(1).strip(), _typed(m.group(2))
            if section == "resource":
                resource[key] = value
            elif section == "Attributes" and spans:
                spans[-1].attributes[key] = value
            elif section == "SpanEvent" and spans and key == "Name":
                spans[-1].events.append(str(value))
    return spans


def _typed(text: str) -> Any:
    m = _TYPED.match(text)
    if not m:
        return text
    kind, value = m.groups()
    if kind == "Int":
        return int(value)
    if kind == "Double":
        return float(value)
    if kind == "Bool":
        return value == "true"
    return value


_given_ports: set = set()
PORT_CLAIMS = Path(tempfile.gettempdir()) / "lora-otel-test-ports"
"""One file per port a test session was given, for ten minutes: two sessions side by side (a
second checkout's suite, the Python matrix) never get one port from a kernel that hands a port just
freed to the next bind."""
PORT_CLAIM_S = 600


def _claim(port: int) -> bool:
    """Whether ``port`` is now this session's: no session claimed it in the last ten minutes."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    path = PORT_CLAIMS / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        pass
    try:
        if time.time() - path.stat().st_mtime < PORT_CLAIM_S:
            return False
        os.utime(path)  # an old claim: taken over
        return True
    except FileNotFoundError:
        return False


def free_port() -> int:
    """A loopback port nothing listens on, never one this test process was given before, nor one
    another session was given in the last ten minutes: the kernel may hand the same free port to
    two binds in a row (a gateway once got one port for both its health check and its Prometheus
    exporter, and failed to start: ``address already in use``)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given_ports and _claim(port):
            _given_ports.add(port)
            return port


class Collector:
    """A running rotel agent on two free loopback ports; its debug output goes to a file."""

    def __init__(self, binary: Path, workdir: Path, http_port: Optional[int] = None) -> None:
        self.grpc_port, self.http_port = free_port(), http_port or free_port()
        self.output = workdir / "rotel.out"
        self._out = open(self.output, "wb")  # noqa: SIM115 - rotel's output, closed when it stops
        self.process = subprocess.Popen(
            [
                str(binary),
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{self.grpc_port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{self.http_port}",
                "--exporter",
                "blackhole",
                "--debug-log",
                "traces",
                "--debug-log",
                "logs",
                "--debug-log-verbosity",
                "detailed",
                "--pid-file",
                str(workdir / "rotel.pid"),
                "--log-file",
                str(workdir / "rotel.log"),
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            self._wait_listening(timeout=20)
        except BaseException:
            self.stop()
            raise

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = {self.grpc_port, self.http_port}
        while waiting:
            if self.process.poll() is not None:
                raise RuntimeError(f"rotel exited with {self.process.returncode}: {self.output.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rotel is not listening on {sorted(waiting)} after {timeout} s")
            for port in list(waiting):
                with socket.socket() as s:
                    s.settimeout(0.2)
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        waiting.discard(port)
            time.sleep(0.05)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        return parse_debug_log(self.output.read_bytes().decode("utf-8", "replace"))

    def logs(self) -> list[ReceivedLog]:
        """Every log record received so far."""
        return parse_debug_log_records(self.output.read_bytes().decode("utf-8", "replace"))

    def wait_for_spans(self, count: int, timeout: float = 15) -> list[ReceivedSpan]:
        """The spans received, once there are at least ``count`` (rotel batches for 200 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._out.close()
