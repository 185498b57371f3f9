"""A minimal JSON encoder for journal records (the training process cannot afford ``import json``).

``import json`` pulls in ``re`` and costs ~16 ms at interpreter start; this module escapes strings
in pure Python until `use_c_escaper` switches to the C escaper of ``_json`` (in every CPython
build we know of; loading it costs ~0.2 ms, which a process that ends at once does not pay: the
preamble switches when the process becomes a job). It encodes ``dict``, ``list``/``tuple``, ``str``, ``int``, ``float``,
``bool`` and ``None``; anything else is written as its ``repr``. Strings that are not valid Unicode
(lone surrogates from ``surrogateescape``-decoded argv) become ``\\udcXX`` escapes, so every line
is valid UTF-8 JSON. Not for general use: no indentation, no key sorting, no cycle detection
(records are small, flat and built by us).
"""

from __future__ import annotations

__all__ = ["_quote", "dumps_line", "printable", "use_c_escaper"]  # _quote: core writes its own small records with it

_ESC = {i: "\\u%04x" % i for i in range(32)}
_ESC.update({ord('"'): '\\"', ord("\\"): "\\\\", 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"})


def _quote(s: str, /) -> str:
    """``s`` as a JSON string, as ``_json.encode_basestring`` writes it (`use_c_escaper`)."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'  # ids, names, paths: nothing to escape (one pass each, in C)
    return '"' + s.translate(_ESC) + '"'


def printable(text: str, /) -> str:
    """``text`` safe for one line of a terminal or a log file: every character Python does not
    print — control characters (``\\n``, ``\\r``, ESC, the C1 set), line and paragraph separators,
    lone surrogates — as its escape (``\\x1b``), the way ``lora-otel inspect`` shows them. A value
    lora_otel prints (an argument, a path, a frame) can then neither forge a line of its own nor
    reach the terminal as a command. Printable text, non-ASCII included, is returned as it is."""
    if text.isprintable():
        return text  # (one pass, in C: the common case)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def use_c_escaper() -> None:
    """From now on escape strings with ``_json.encode_basestring`` (the same output, ~5x faster)."""
    global _quote
    try:
        from lora_otel._boot.stdlib import module

        _quote = module("_json").encode_basestring
    except (ImportError, AttributeError):  # pragma: no cover - every CPython build has _json
        return


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
