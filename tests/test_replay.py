"""``lora-otel replay`` and the journal → OpenTelemetry translation behind it."""

from __future__ import annotations

import os

import pytest
from conftest import FUZZ, TRACE_ID, TRACEPARENT_PARENT, journal_lines
from hypothesis import given
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPCExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
from opentelemetry.trace import StatusCode

from collector import free_port
from lora_otel.cli import main
from lora_otel.export.otlp import ExporterConfigError, make_exporter, translate
from lora_otel.journal.reader import read_journal

PROTOCOLS = ["http/protobuf", "grpc"]


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    """No OTEL_* setting of the machine running the tests leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def killed_run(journal, *, exited: bool = False) -> dict[str, str]:
    """A process started under a TRACEPARENT that imported json (1 ms, short) and torch (2.3 s),
    then hung in ``cuda init`` and was killed — or, with ``exited``, finished. Returns span ids."""
    ids = {
        "process": journal.process(
            parent_id=TRACEPARENT_PARENT,
            attrs={
                "service.name": "train.py",
                "process.pid": 4242,
                "host.name": "gpu-7",
                "lora_otel.activation": "pth",
            },
        )
    }
    ids["arguments"] = journal.span("arguments", 0.001, 0.0002)
    ids["import json"] = journal.span("import json", 0.002, 0.001)
    torch = ids["import torch"] = journal.start("import torch", 0.01)
    journal.end(torch, 2.31, attrs={"lora_otel.package.version": "2.13.0"})
    ids["cuda init"] = journal.start("cuda init", 2.4)
    journal.event(ids["cuda init"], 2.5, "mark", {"lora_otel.note": "probing"})
    journal.beat(47.4)
    if exited:
        journal.end(ids["cuda init"], 50.0)
        journal.end(ids["process"], 51.0)
        journal.exit(51.0)
    return ids


def replay(capsys, journal, monkeypatch, protocol: str, endpoint: str) -> tuple[int, str, str]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    status = main(["replay", str(journal.path)])
    out, err = capsys.readouterr()
    return status, out, err


class TestTranslate:
    def test_ids_parents_and_times(self, journal):
        """Spans keep the journal's trace id, span ids and times; children point at the process
        span; the process span's parent is the TRACEPARENT span, marked remote."""
        ids = killed_run(journal)
        spans = {span.name: span for span in translate(journal.read()).spans}
        assert {span.context.trace_id for span in spans.values()} == {int(TRACE_ID, 16)}
        assert {name: f"{span.context.span_id:016x}" for name, span in spans.items()} == {
            name: ids[name] for name in spans
        }
        process = spans["process"]
        assert f"{process.parent.span_id:016x}" == TRACEPARENT_PARENT and process.parent.is_remote
        for name in ("arguments", "import torch", "cuda init"):
            assert spans[name].parent.span_id == process.context.span_id and not spans[name].parent.is_remote
        torch = spans["import torch"]
        assert (torch.start_time, torch.end_time) == (journal.ns(0.01), journal.ns(2.31))
        assert torch.status.status_code is StatusCode.UNSET
        assert [event.name for event in spans["cuda init"].events] == ["mark"]

    def test_open_spans_are_incomplete(self, journal):
        """An open span ends at the last evidence, status ERROR 'incomplete: …', lora_otel.incomplete."""
        killed_run(journal)
        translation = translate(journal.read())
        cuda = next(span for span in translation.spans if span.name == "cuda init")
        assert cuda.end_time == journal.ns(47.4)
        assert cuda.status.status_code is StatusCode.ERROR
        assert cuda.status.description == "incomplete: cuda init open for 45 s (no end recorded)"
        assert cuda.attributes["lora_otel.incomplete"] is True
        assert translation.incomplete == 2  # cuda init and process

    def test_exited_journal_has_no_incomplete_spans(self, journal):
        """With an exit record every span has ended: none is incomplete."""
        killed_run(journal, exited=True)
        translation = translate(journal.read())
        assert translation.incomplete == 0
        assert not any("lora_otel.incomplete" in span.attributes for span in translation.spans)

    def test_short_imports_dropped_and_children_moved_up(self, journal):
        """Successful imports under the threshold are dropped; a child of a dropped import moves to
        the nearest kept ancestor; failed and open short imports are kept."""
        root = journal.process(config={"import_threshold_ms": 50})
        outer = journal.start("import outer", 0.1)
        inner = journal.span("import inner", 0.11, 0.1, parent=outer)
        journal.end(outer, 0.12)
        failed = journal.start("import broken", 0.2)
        journal.end(failed, 0.201, status="error", message="ImportError: no module")
        journal.start("import slow", 0.3)
        translation = translate(journal.read())
        spans = {span.name: span for span in translation.spans}
        assert set(spans) == {"process", "import inner", "import broken", "import slow"}
        assert f"{spans['import inner'].parent.span_id:016x}" == root != outer
        assert f"{spans['import inner'].context.span_id:016x}" == inner
        assert spans["import broken"].status.description == "ImportError: no module"
        assert translation.dropped_imports == 1

    def test_resource_from_process_span_and_environment(self, journal, monkeypatch):
        """service.*, process.*, host.* of the process span form the resource (and leave the span);
        OTEL_RESOURCE_ATTRIBUTES is merged in; the journal's service.name wins over OTEL_SERVICE_NAME."""
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
        killed_run(journal)
        process = translate(journal.read()).spans[0]
        resource = dict(process.resource.attributes)
        assert resource["service.name"] == "train.py" and resource["process.pid"] == 4242
        assert resource["host.name"] == "gpu-7" and resource["deployment.environment"] == "test"
        assert dict(process.attributes) == {"lora_otel.activation": "pth", "lora_otel.incomplete": True}

    def test_service_name_from_environment_when_journal_has_none(self, journal, monkeypatch):
        """Without service.name in the journal, OTEL_SERVICE_NAME names the service."""
        monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
        journal.process(attrs={"process.pid": 1})
        assert translate(journal.read()).spans[0].resource.attributes["service.name"] == "from-env"

    def test_attribute_values_made_valid(self, journal):
        """Values OpenTelemetry cannot carry become JSON text; nulls are left out; lone surrogates
        become \\udcXX text; int/float lists become floats."""
        journal.process(
            attrs={
                "lora_otel.obj": {"a": 1},
                "lora_otel.none": None,
                "lora_otel.mixed": [1, "a"],
                "lora_otel.nums": [1, 2.5],
                "lora_otel.bad": "x\udcff",
                "lora_otel.big": 2**70,
            }
        )
        attrs = translate(journal.read()).spans[0].attributes
        assert attrs["lora_otel.obj"] == '{"a": 1}' and "lora_otel.none" not in attrs
        assert attrs["lora_otel.mixed"] == '[1, "a"]' and attrs["lora_otel.nums"] == [1.0, 2.5]
        assert attrs["lora_otel.bad"] == "x\\udcff" and attrs["lora_otel.big"] == str(2**70)
        encode_spans(translate(journal.read()).spans).SerializeToString()


class TestMakeExporter:
    def test_default_is_http_protobuf(self):
        """No protocol set: the OTLP http/protobuf exporter."""
        assert isinstance(make_exporter(), HTTPExporter)

    def test_grpc(self, monkeypatch):
        """OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the gRPC exporter."""
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        assert isinstance(make_exporter(), GRPCExporter)

    def test_traces_protocol_wins(self, monkeypatch):
        """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL overrides OTEL_EXPORTER_OTLP_PROTOCOL."""
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        assert isinstance(make_exporter(), HTTPExporter)

    def test_unknown_protocol(self, monkeypatch):
        """An unsupported protocol is a clear error naming the variable and the choices."""
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        with pytest.raises(ExporterConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is not supported"):
            make_exporter()


class TestReplayCommand:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    def test_export_failure_is_one_line(self, capsys, journal, monkeypatch, protocol):
        """Nothing listening: exit 1, one line on stderr naming the endpoint, no traceback."""
        killed_run(journal)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
        port = free_port()
        status, out, err = replay(capsys, journal, monkeypatch, protocol, f"http://127.0.0.1:{port}")
        assert status == 1 and out == ""
        assert err.count("\n") == 1 and err.startswith("lora-otel replay: could not export 4 spans to ")
        assert f"127.0.0.1:{port}" in err and "Traceback" not in err

    def test_unknown_protocol_exits_2(self, capsys, journal, monkeypatch):
        """A bad protocol setting: exit 2 with one line."""
        killed_run(journal)
        status, out, err = replay(capsys, journal, monkeypatch, "carrier-pigeon", "http://127.0.0.1:9")
        assert status == 2 and out == "" and err.count("\n") == 1 and "carrier-pigeon" in err

    def test_missing_journal_exits_2(self, capsys, tmp_path):
        """An unreadable journal: exit 2, one line."""
        assert main(["replay", str(tmp_path / "nope.otel.jsonl")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no such file" in err

    def test_empty_journal_sends_nothing(self, capsys, journal, monkeypatch):
        """No spans: nothing is sent (the endpoint is never contacted) and the exit status is 0."""
        status, out, _ = replay(capsys, journal, monkeypatch, "http/protobuf", f"http://127.0.0.1:{free_port()}")
        assert status == 0 and out.startswith("nothing to replay")


@pytest.mark.slow
@pytest.mark.collector
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_replay_to_real_collector(capsys, journal, monkeypatch, collector, protocol):
    """A real collector receives each kept span once, with the journal's ids and parentage, the
    TRACEPARENT parent on the process span, the open span as ERROR + lora_otel.incomplete, the
    short import dropped, and the process span's resource."""
    ids = killed_run(journal)
    endpoint = collector.grpc_endpoint if protocol == "grpc" else collector.http_endpoint
    status, out, err = replay(capsys, journal, monkeypatch, protocol, endpoint)
    assert (status, err) == (0, "")
    port = collector.grpc_port if protocol == "grpc" else collector.http_port
    assert out.startswith("replayed 4 spans (2 incomplete, 1 short imports dropped) to ")
    assert f"127.0.0.1:{port}" in out and out.count("\n") == 1

    received = collector.wait_for_spans(4)
    spans = {span.name: span for span in received}
    assert len(received) == 4 and set(spans) == {"process", "arguments", "import torch", "cuda init"}
    assert len({span.span_id for span in received}) == 4
    assert {span.trace_id for span in received} == {TRACE_ID}
    assert {name: span.span_id for name, span in spans.items()} == {name: ids[name] for name in spans}
    assert spans["process"].parent_id == TRACEPARENT_PARENT
    assert {spans[name].parent_id for name in ("arguments", "import torch", "cuda init")} == {ids["process"]}

    cuda = spans["cuda init"]
    assert cuda.status_code == "STATUS_CODE_ERROR"
    assert cuda.status_message == "incomplete: cuda init open for 45 s (no end recorded)"
    assert cuda.attributes["lora_otel.incomplete"] is True and cuda.events == ["mark"]
    assert (cuda.start_ns, cuda.end_ns) == (journal.ns(2.4), journal.ns(47.4))
    assert spans["import torch"].status_code == "STATUS_CODE_UNSET"
    assert spans["import torch"].attributes["lora_otel.package.version"] == "2.13.0"
    assert spans["process"].resource["service.name"] == "train.py"
    assert spans["process"].resource["process.pid"] == 4242


@pytest.mark.slow
@FUZZ
@given(text=journal_lines)
def test_fuzz_translation_encodes(tmp_path, text):
    """Whatever the journal holds, translation gives spans the OTLP encoder accepts."""
    path = tmp_path / "fuzz.otel.jsonl"
    path.write_text(text)
    translation = translate(read_journal(path))
    encode_spans(translation.spans).SerializeToString()
    assert translation.incomplete <= len(translation.spans)


@pytest.mark.parametrize(
    "trace_id, span_id, linked",
    [
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", True),
        ("0af7651916cd43dd8448eb211c80319c", "not-hex-at-all!!", False),
        ("0" * 32, "b7ad6b7169203331", False),
        (12345, None, False),
    ],
)
def test_run_launched_by_a_ui_links_to_it(journal, trace_id, span_id, linked):
    """A run a UI started as a trace of its own: its root span carries one link to the UI's root
    span (from ``lora_otel.launched_by.*``), in the OTLP it is encoded to, and kept when the sidecar
    amends the span (a stall, a death); values that are not span ids give no link."""
    from opentelemetry.trace import Status

    from lora_otel.export.live import _amend

    journal.process(
        attrs={
            "service.name": "train.py",
            "lora_otel.launched_by.trace_id": trace_id,
            "lora_otel.launched_by.span_id": span_id,
        }
    )
    journal.span("arguments", 0.1, 0.1)
    spans = {s.name: s for s in translate(read_journal(journal.path)).spans}
    root = spans["process"]
    assert spans["arguments"].links == ()
    if not linked:
        assert root.links == ()
        return
    [link] = root.links
    assert (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) == (trace_id, span_id)
    assert dict(link.attributes) == {"lora_otel.link": "launched_by"}
    [encoded] = encode_spans([root]).resource_spans[0].scope_spans[0].spans
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in encoded.links] == [(trace_id, span_id)]
    amended = _amend(root, status=Status(StatusCode.ERROR, "x"), attrs={}, events=[], end_ns=root.end_time)
    assert amended.links == root.links
