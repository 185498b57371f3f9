"""What a check says: one line of ``lora-otel doctor``'s report (`Check`), and how its sizes, times,
frames and paths are written. Imports nothing but ``os`` at module level (see the package's docstring)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # never true at runtime: the check process imports every module here, and not typing
    from typing import Any


class Check:
    """One line of the report: ``name``, ``status`` (ok/warn/fail), ``evidence``, ``advice``."""

    __slots__ = ("advice", "details", "duration_s", "evidence", "name", "status")

    def __init__(
        self,
        name: str,
        status: str,
        evidence: str,
        advice: str | None = None,
        duration_s: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        if status not in ("ok", "warn", "fail"):
            raise ValueError("status must be ok, warn or fail, not %r" % (status,))
        self.name = name
        self.status = status
        self.evidence = evidence
        self.advice = advice
        self.duration_s = None if duration_s is None else round(float(duration_s), 3)
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "evidence": self.evidence,
            "advice": self.advice,
            "duration_s": None if self.duration_s is None else round(float(self.duration_s), 3),
            "details": self.details,
        }

    def __repr__(self) -> str:
        return "Check(%r, %r, %r)" % (self.name, self.status, self.evidence)


_UNITS = {"": 1, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str) -> int:
    """``16G``/``16GiB``/``16Gi`` → 16 * 2**30; ``16GB`` → 16 * 10**9; ``512M``; ``1.5T``; ``1000`` bytes.

    Raises ``ValueError`` with a one-line message on anything else.
    """
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)(i?)([bB]?)\s*", text or "")
    if not m or (m.group(3) and not m.group(2)) or (m.group(4) and not m.group(2) and m.group(3)):
        raise ValueError("%r is not a size; use e.g. 16G, 16GiB, 16GB or 512M" % (text,))
    number, unit, binary, byte = float(m.group(1)), m.group(2).upper(), m.group(3), m.group(4)
    if not unit:
        return int(number)
    base = 1000 if (byte and not binary) else 1024
    return int(number * base ** _UNITS[unit])


def format_bytes(n: float) -> str:
    """``17179869184`` → ``16 GiB``; ``150323855360`` → ``140 GiB``; ``1610612736`` → ``1.5 GiB``."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if abs(n) >= 1024**power:
            value = n / 1024**power
            text = ("%.1f" % value).rstrip("0").rstrip(".") if value < 100 else "%.0f" % value
            return "%s %s" % (text, unit)
    return "%d B" % n


def _secs(s: float) -> str:
    from lora_otel._boot.seam import duration

    return duration(s)


def _limit(s: float) -> str:
    return ("%g s" % s) if s < 100 else "%.0f s" % s


def _frame_text(path: str, line: int, func: str, source: str = "") -> str:
    return "%s:%d in %s%s" % (_short_path(path), line, func, ": " + source if source else "")


def _short_path(path: str) -> str:
    """The last two parts of a path: ``hangpkg/__init__.py``, ``torch/__init__.py``."""
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else path


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
