"""A minimal JSON encoder for journal records (the training process cannot afford ``import json``).

``import json`` pulls in ``re`` and costs ~16 ms at interpreter start; this module uses the C
string escaper from ``_json`` when it is there (it is in every CPython build we know of) and a pure
Python one otherwise. It encodes ``dict``, ``list``/``tuple``, ``str``, ``int``, ``float``,
``bool`` and ``None``; anything else is written as its ``repr``. Strings that are not valid Unicode
(lone surrogates from ``surrogateescape``-decoded argv) become ``\\udcXX`` escapes, so every line
is valid UTF-8 JSON. Not for general use: no indentation, no key sorting, no cycle detection
(records are small, flat and built by us).
"""

from __future__ import annotations

__all__ = ["_quote", "dumps_line"]  # _quote: core writes its own small records with it

try:
    from _json import encode_basestring as _quote
except ImportError:  # pragma: no cover - every CPython build has _json
    _ESC = {i: "\\u%04x" % i for i in range(32)}
    _ESC.update({ord('"'): '\\"', ord("\\"): "\\\\", 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"})

    def _quote(s: str, /) -> str:
        return '"' + s.translate(_ESC) + '"'


def _enc(obj: object, out: list[str]) -> None:
    t = type(obj)
    if t is str:
        out.append(_quote(obj))  # type: ignore[arg-type]  # a str: mypy does not narrow through ``t``
    elif obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif t is int:
        out.append(int.__repr__(obj))
    elif t is float:
        if obj != obj or obj in (float("inf"), float("-inf")):
            out.append("null")  # JSON has no NaN/Infinity
        else:
            out.append(float.__repr__(obj))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for k, v in obj.items():
            if not first:
                out.append(",")
            first = False
            out.append(_quote(k if type(k) is str else str(k)))
            out.append(":")
            _enc(v, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        first = True
        for v in obj:
            if not first:
                out.append(",")
            first = False
            _enc(v, out)
        out.append("]")
    elif isinstance(obj, bool):
        out.append("true" if obj else "false")
    elif isinstance(obj, int):
        out.append(int.__repr__(int(obj)))
    elif isinstance(obj, float):
        _enc(float(obj), out)
    elif isinstance(obj, str):
        _enc(str(obj), out)
    else:
        try:
            text = repr(obj)
        except Exception:  # noqa: BLE001 - a hostile __repr__ must not break a record
            text = "<unrepresentable %s>" % type(obj).__name__
        out.append(_quote(text))


def dumps_line(obj: object) -> bytes:
    """Encode ``obj`` as one JSON line (with the trailing newline), UTF-8, never raising on strings."""
    out: list[str] = []
    _enc(obj, out)
    out.append("\n")
    # Lone surrogates cannot be UTF-8; backslashreplace turns them into \udcXX, which inside a
    # JSON string literal is exactly the JSON escape for that code unit.
    return "".join(out).encode("utf-8", "backslashreplace")
