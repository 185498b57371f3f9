"""Whose is the OTLP collector on this machine's default port: live export without an endpoint.

``LORA_OTEL_LIVE=1`` with no ``OTEL_EXPORTER_OTLP_[TRACES_|LOGS_]ENDPOINT`` set sends to the
OpenTelemetry default, ``localhost:4318`` (``localhost:4317`` over gRPC). Any local user can bind
that port first (it is above 1024) and receive every span of every such job: its stages, paths,
errors and the attributes a program sets. So without an endpoint named, the sidecar exports only
to a listener of this user's or root's, told by the ``uid`` column of ``/proc/net/tcp`` and
``/proc/net/tcp6`` (the owner of each listening socket, in the sidecar's network namespace); a
port nobody listens on (anyone could take it later) or one a stranger listens on means local mode
and one line saying why (`stranger`). An endpoint named explicitly, ``localhost`` included, is
the user's choice and used as it is. The check is made once, at the sidecar's start.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Optional

DEFAULT_PORTS = {"http/protobuf": 4318, "grpc": 4317}
"""The port the OpenTelemetry exporters use on ``localhost`` when no endpoint is set."""
LISTEN = "0A"
"""A listening socket's ``st`` in ``/proc/net/tcp``."""


def defaulted(env: Mapping[str, str], signal: str) -> Optional[int]:
    """The default port ``signal`` (``TRACES``, ``LOGS``) is sent to when no endpoint names a place
    for it, else None (an endpoint is set: the user's choice)."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if env.get(name, "").strip():
            return None
    protocol = (
        env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    )
    return DEFAULT_PORTS.get(protocol.lower())


def _address(hex_text: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """``0100007F`` (127.0.0.1) or a 32-digit IPv6 address as ``/proc/net/tcp[6]`` write them:
    32-bit words in host order (little-endian here)."""
    try:
        raw = bytes.fromhex(hex_text)
    except ValueError:
        return None
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    if len(raw) == 16:
        return ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return None


def _reaches_localhost(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A listener on this address takes connections made to ``localhost``: loopback or any address."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback or addr.is_unspecified


def listener_uids(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> Optional[set[int]]:
    """The owners (uids) of the sockets listening on ``port`` that ``localhost`` reaches; None when
    no table can be read (no ``/proc``)."""
    uids: set[int] = set()
    read_any = False
    for table in tables:
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                next(f, None)  # the heading
                read_any = True
                for line in f:
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != LISTEN:
                        continue
                    host, _, port_hex = fields[1].partition(":")
                    try:
                        if int(port_hex, 16) != port:
                            continue
                        uid = int(fields[7])
                    except ValueError:
                        continue
                    addr = _address(host)
                    if addr is not None and _reaches_localhost(addr):
                        uids.add(uid)
        except OSError:
            continue
    return uids if read_any else None


def stranger(env: Mapping[str, str], signal: str = "TRACES") -> Optional[str]:
    """Why ``signal`` must not go to the default ``localhost`` port (a clause), or None: an endpoint
    is set, or every listener there is this user's or root's."""
    port = defaulted(env, signal)
    if port is None:
        return None
    uids = listener_uids(port)
    if uids is None:
        return None  # no /proc to tell: as before
    trusted = {0, os.geteuid()}
    if not uids:
        return f"nothing listens on localhost:{port} (another user could take the port)"
    others = sorted(uids - trusted)
    if others:
        return f"localhost:{port} is listened on by uid {', '.join(map(str, others))}, not this user nor root"
    return None
