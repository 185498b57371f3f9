"""The journal's encoder: the general ``dumps_line`` and the templates span starts and ends use
(the hot path of ``lora_otel.stage``) must write the very same bytes, valid JSON, for any text."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lora_otel._boot import core
from lora_otel._boot.jsonl import dumps_line

TEXT = st.text(
    alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=40
) | st.sampled_from(["", '"', "\\", "\n", "\udcff", "\udcff\udcfe\udc80bad", "日本語", "a\x00b", "\u2028"])


def captured(monkeypatch) -> list:
    """Journal writes as bytes, whichever path made them."""
    out: list = []
    monkeypatch.setattr(core, "write_line", out.append)
    monkeypatch.setattr(core, "write", lambda rec: out.append(dumps_line(rec)))
    monkeypatch.setattr(core, "trace_id", "4bf92f3577b34da6a3ce929d0e0e4736")
    monkeypatch.setattr(core, "root_id", "b7ad6b7169203331")
    monkeypatch.setattr(core, "open_spans", {})
    monkeypatch.setattr(core, "_stacks", {})
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=TEXT, status=st.sampled_from(["ok", "error"]) | TEXT, ts=st.integers(1, 2**63 - 1))
def test_templates_write_what_the_encoder_writes(monkeypatch, name, status, ts) -> None:
    out = captured(monkeypatch)
    sid = core.span_start(name, ts=ts)
    core.span_end(sid, status, ts=ts + 1)
    start = {
        "v": 1,
        "k": "start",
        "ts": ts,
        "trace_id": core.trace_id,
        "span_id": sid,
        "parent_id": core.root_id,
        "name": name,
        "attrs": {},
    }
    end = {"v": 1, "k": "end", "ts": ts + 1, "span_id": sid, "status": status}
    assert out == [dumps_line(start), dumps_line(end)]
    for line, record in zip(out, (start, end)):
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        decoded = json.loads(line.decode("utf-8"))  # valid UTF-8 JSON, whatever the text
        assert decoded["ts"] == record["ts"] and decoded["span_id"] == sid


def test_attributes_messages_and_odd_types_take_the_general_path(monkeypatch) -> None:
    out = captured(monkeypatch)
    sid = core.span_start("load", {"model": "tiny"}, ts=5)
    core.span_end(sid, "error", "boom", {"n": 1}, ts=6)
    assert [json.loads(line) for line in out] == [
        {
            "v": 1,
            "k": "start",
            "ts": 5,
            "trace_id": core.trace_id,
            "span_id": sid,
            "parent_id": core.root_id,
            "name": "load",
            "attrs": {"model": "tiny"},
        },
        {"v": 1, "k": "end", "ts": 6, "span_id": sid, "status": "error", "message": "boom", "attrs": {"n": 1}},
    ]
