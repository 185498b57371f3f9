"""The deployment files, checked without a Docker engine: docker-compose.yml, the collector
configurations under collector/, Tempo, Prometheus (scrape config, alert and recording rules) and
Grafana provisioning under deploy/; and, end to end, a real stalled job exported to a real
collector (rotel), carrying every attribute the collector configuration counts and groups by.

What is not checked here: that the pinned images start (no Docker engine), and TraceQL syntax (no
Tempo). The real programs load these files in tests/test_backends_*.py: our collector built from
its Go modules, Jaeger v2 built from its module, and Debian's Prometheus and promtool.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

yaml = pytest.importorskip("yaml")

from procs import REPO  # noqa: E402
from test_hangs import kill_and_reap, make_module  # noqa: E402
from test_sidecar import assert_unique, by_name, sidecar_pid, traced, wait_for, wait_gone  # noqa: E402

COMPOSE = REPO / "docker-compose.yml"
COLLECTOR_CONFIGS = sorted((REPO / "collector").rglob("*.yaml"))
MAIN_COLLECTOR = REPO / "collector" / "otelcol.yaml"
RULES = REPO / "deploy" / "prometheus" / "lora_otel.rules.yml"
PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
TEMPO = REPO / "deploy" / "tempo.yaml"
DATASOURCES = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = REPO / "deploy" / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
COMPOSE_SCHEMA = Path(__file__).parent / "data" / "compose_spec.json"
"""The Compose specification's JSON schema as shipped in the docker-compose 1.29.2 wheel on PyPI
(compose/config/compose_spec.json, Apache-2.0): a 2021 snapshot of compose-spec/compose-spec."""


def load(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def otelcol() -> dict:
    return load(MAIN_COLLECTOR)


def host_port(endpoint: str) -> tuple:
    """``("jaeger", 4317)`` from ``jaeger:4317``, ``http://jaeger:4317`` or ``0.0.0.0:4317``."""
    parts = urlsplit(endpoint if "//" in endpoint else "//" + endpoint)
    return parts.hostname, parts.port


def published(service: dict) -> dict:
    """``{container port: (host ip, host port)}`` of a compose service's short-syntax ports."""
    out = {}
    for entry in service.get("ports", []):
        ip, host, container = str(entry).split("/")[0].split(":")
        out[int(container)] = (ip, int(host))
    return out


def one_shot(service: dict) -> bool:
    return service.get("restart") == "no"


# --- docker-compose.yml -------------------------------------------------------------------------


def test_compose_matches_the_compose_spec_schema(compose) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft201909Validator(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join("%s: %s" % (list(e.absolute_path), e.message) for e in errors)


def test_compose_services_are_pinned_healthy_local_and_persistent(compose) -> None:
    services = compose["services"]
    assert {"collector", "jaeger", "tempo", "grafana", "prometheus"} <= set(services)
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, svc in services.items():
        image, _, tag = svc["image"].rpartition(":")
        assert image and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), "%s: image %r is not pinned" % (name, svc["image"])
        if one_shot(svc):
            assert "ports" not in svc, name
        else:
            check = svc.get("healthcheck") or {}
            assert check.get("test") and check["test"][0] in ("CMD", "CMD-SHELL"), "%s has no healthcheck" % name
            assert {"interval", "timeout", "retries"} <= set(check), name
            assert svc.get("restart") == "unless-stopped", name
        for ip, _ in published(svc).values():
            assert ip == "127.0.0.1", "%s publishes a port beyond loopback" % name
        for mount in svc.get("volumes", []):
            source, _target = mount.split(":")[:2]
            if source.startswith("./"):
                assert (REPO / source).exists(), "%s mounts %s, which is missing" % (name, source)
            else:
                assert source in declared, "%s: volume %s is not declared" % (name, source)
                used.add(source)
        for dep, how in (svc.get("depends_on") or {}).items():
            assert dep in services, "%s depends on unknown %s" % (name, dep)
            want = "service_completed_successfully" if one_shot(services[dep]) else "service_healthy"
            assert how["condition"] == want, (name, dep)
    assert used == declared, "declared but unused volumes: %s" % sorted(declared - used)
    for name in ("jaeger", "tempo", "prometheus", "grafana"):
        assert any(not m.startswith("./") for m in services[name]["volumes"]), (
            "%s keeps its data in a named volume" % name
        )


def test_compose_publishes_the_otlp_ports_the_collector_listens_on(compose, otelcol) -> None:
    protocols = otelcol["receivers"]["otlp"]["protocols"]
    ports = published(compose["services"]["collector"])
    for proto, default in (("grpc", 4317), ("http", 4318)):
        _, port = host_port(protocols[proto]["endpoint"])
        assert port == default and ports[port] == ("127.0.0.1", default)
    config_mount = [m for m in compose["services"]["collector"]["volumes"] if m.startswith("./collector/")]
    command = " ".join(compose["services"]["collector"]["command"])
    assert [m.split(":")[1] for m in config_mount] == [command.split("--config=")[1].split()[0]]


# --- collector configurations -------------------------------------------------------------------


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_collector_config_is_consistent(path: Path) -> None:
    config = load(path)
    service = config["service"]
    pipelines = service["pipelines"]
    defined = {kind: set(config.get(kind) or {}) for kind in ("receivers", "processors", "exporters", "connectors")}
    used = {kind: set() for kind in defined}
    as_exporter, as_receiver = {}, {}
    for name, pipe in pipelines.items():
        kind = name.split("/")[0]
        assert kind in ("traces", "metrics", "logs"), name
        assert pipe.get("receivers") and pipe.get("exporters"), name
        for r in pipe["receivers"]:
            if r in defined["connectors"]:
                as_receiver.setdefault(r, set()).add(kind)
                used["connectors"].add(r)
            else:
                assert r in defined["receivers"], "%s: receiver %s is not defined" % (name, r)
                used["receivers"].add(r)
        for e in pipe["exporters"]:
            if e in defined["connectors"]:
                as_exporter.setdefault(e, set()).add(kind)
                used["connectors"].add(e)
            else:
                assert e in defined["exporters"], "%s: exporter %s is not defined" % (name, e)
                used["exporters"].add(e)
        procs = pipe.get("processors", [])
        for p in procs:
            assert p in defined["processors"], "%s: processor %s is not defined" % (name, p)
            used["processors"].add(p)
        assert procs[:1] == ["memory_limiter"] and "batch" in procs, "%s: memory_limiter first, then batch" % name
    for kind in defined:
        assert used[kind] == defined[kind], "%s defined but unused: %s" % (kind, sorted(defined[kind] - used[kind]))
    for conn in defined["connectors"]:
        assert as_exporter.get(conn) and as_receiver.get(conn), (
            "connector %s must close a pipeline and open another" % conn
        )
    assert set(service.get("extensions", [])) == set(config.get("extensions") or {})


def test_collector_sends_traces_to_jaeger_and_tempo_metrics_to_prometheus(compose, otelcol) -> None:
    pipes = otelcol["service"]["pipelines"]
    assert {"otlp_grpc/jaeger", "otlp_grpc/tempo", "span_metrics", "count"} <= set(pipes["traces"]["exporters"])
    assert {"debug", "count"} <= set(pipes["logs"]["exporters"])
    assert set(pipes["metrics"]["receivers"]) == {"span_metrics", "count"} and pipes["metrics"]["exporters"] == [
        "prometheus"
    ]
    services = compose["services"]
    tempo = load(TEMPO)
    tempo_otlp = host_port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]
    for exporter, service, port in (("otlp_grpc/jaeger", "jaeger", 4317), ("otlp_grpc/tempo", "tempo", tempo_otlp)):
        assert host_port(otelcol["exporters"][exporter]["endpoint"]) == (service, port)
        assert service in services and services["collector"]["depends_on"][service]["condition"] == "service_healthy"
    # Jaeger v2 receives OTLP on 4317 per the config compose mounts into it
    jaeger_mounts = {m.split(":")[1]: m.split(":")[0] for m in services["jaeger"]["volumes"]}
    jaeger_config = load(REPO / jaeger_mounts["/etc/jaeger/config.yaml"][2:])
    assert host_port(jaeger_config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1] == 4317
    assert services["jaeger"]["command"] == ["--config=/etc/jaeger/config.yaml"]


def test_stall_counts_and_dimensions(otelcol) -> None:
    """The count connector counts stall spans (incomplete with a stall kind) and "stall detected:"
    WARN log records, by kind and stage; span metrics carry the incomplete flag and the kind."""
    count = otelcol["connectors"]["count"]
    [span_condition] = count["spans"]["lora_otel.stalls"]["conditions"]
    assert 'attributes["lora_otel.incomplete"] == true' in span_condition
    assert 'attributes["lora_otel.stall.stage"] == name' in span_condition
    [log_condition] = count["logs"]["lora_otel.stall.log_records"]["conditions"]
    assert "SEVERITY_NUMBER_WARN" in log_condition and '"^stall detected:"' in log_condition
    for metric in (count["spans"]["lora_otel.stalls"], count["logs"]["lora_otel.stall.log_records"]):
        assert [a["key"] for a in metric["attributes"]] == ["lora_otel.stall.kind", "lora_otel.stall.stage"]
    dims = [d["name"] for d in otelcol["connectors"]["span_metrics"]["dimensions"]]
    assert dims == ["lora_otel.incomplete", "lora_otel.stall.kind"]


# --- Prometheus ---------------------------------------------------------------------------------


def prometheus_names(otelcol: dict) -> tuple:
    """The metric and label names the collector's Prometheus exporter gives what the rules use."""

    def prom(name: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", name)

    count = otelcol["connectors"]["count"]
    metrics = {prom(n) + "_total" for kind in ("spans", "logs") for n in count[kind]}
    ns = prom(otelcol["connectors"]["span_metrics"]["namespace"])
    unit = {"ms": "milliseconds", "s": "seconds"}[otelcol["connectors"]["span_metrics"]["histogram"]["unit"]]
    metrics |= {ns + "_calls_total"} | {"%s_duration_%s_%s" % (ns, unit, s) for s in ("bucket", "sum", "count")}
    labels = {"service_name", "span_name", "status_code", "le", "job", "instance"}
    labels |= {prom(a["key"]) for kind in ("spans", "logs") for m in count[kind].values() for a in m["attributes"]}
    labels |= {prom(d["name"]) for d in otelcol["connectors"]["span_metrics"]["dimensions"]}
    return metrics, labels


def test_prometheus_scrapes_the_collector(compose, otelcol) -> None:
    config = load(PROMETHEUS)
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    exporter_port = host_port(otelcol["exporters"]["prometheus"]["endpoint"])[1]
    telemetry_port = otelcol["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"]
    assert {"collector:%d" % exporter_port, "collector:%d" % telemetry_port} <= targets
    mounts = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./" + str(PROMETHEUS.relative_to(REPO))
    for rule_file in config["rule_files"]:  # relative to the config file, in the repo and in compose
        assert (PROMETHEUS.parent / rule_file).resolve() == RULES.resolve()
        assert (REPO / mounts["/etc/prometheus/" + rule_file][2:]).resolve() == RULES.resolve()


def test_prometheus_rules(otelcol) -> None:
    groups = load(RULES)["groups"]
    rules = [r for g in groups for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert {"LoraOtelStallDetected", "LoraOtelProcessFrozen", "LoraOtelStartupSlowerThanBaseline"} <= set(alerts)
    for name, rule in alerts.items():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, name
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"], name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
    metrics, labels = prometheus_names(otelcol)
    known = metrics | recorded | {"up"}
    functions = {
        "sum",
        "by",
        "increase",
        "rate",
        "last_over_time",
        "and",
        "or",
        "unless",
        "offset",
        "histogram_quantile",
    }
    for rule in rules:
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        for selector in re.findall(r"\{([^}]*)\}", expr):
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", selector):
                assert label in labels, "%s: label %s is not exported" % (rule.get("alert") or rule["record"], label)
        stripped = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"|\b(\d+[smhdwy])+\b|\b\d+(\.\d+)?\b', "", expr)
        for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped):
            if name in functions or re.fullmatch(r"\d+[smhd]?", name):
                continue
            if name in labels:  # inside by (...)
                continue
            assert name in known, "%s: %s is neither an exported metric nor a recording rule" % (
                rule.get("alert") or rule["record"],
                name,
            )
    stall = alerts["LoraOtelStallDetected"]["expr"]
    assert "lora_otel_stalls_total" in stall
    assert 'lora_otel_stall_kind="frozen"' in alerts["LoraOtelProcessFrozen"]["expr"]


# --- Grafana ------------------------------------------------------------------------------------


def datasource_uids(node) -> set:
    found = set()
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            found.add(node["datasource"]["uid"])
        for value in node.values():
            found |= datasource_uids(value)
    elif isinstance(node, list):
        for value in node:
            found |= datasource_uids(value)
    return found


def test_grafana_provisioning(compose) -> None:
    sources = load(DATASOURCES)["datasources"]
    by_uid = {s["uid"]: s for s in sources}
    assert len(by_uid) == len(sources) and {s["type"] for s in sources} == {"prometheus", "tempo", "jaeger"}
    services = compose["services"]
    tempo_port = load(TEMPO)["server"]["http_listen_port"]
    ports = {"prometheus": 9090, "tempo": tempo_port, "jaeger": 16686}
    for source in sources:
        host, port = host_port(source["url"])
        assert host in services and port == ports[host], source["url"]
    assert by_uid["tempo"]["jsonData"]["serviceMap"]["datasourceUid"] in by_uid
    mounts = {m.split(":")[1]: m.split(":")[0] for m in services["grafana"]["volumes"]}
    assert (REPO / mounts["/etc/grafana/provisioning"]).resolve() == DATASOURCES.parent.parent.resolve()
    [provider] = load(DASHBOARD_PROVIDERS)["providers"]
    assert (REPO / mounts[provider["options"]["path"]]).resolve() == DASHBOARDS[0].parent.resolve()
    assert DASHBOARDS


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard(path: Path) -> None:
    dash = json.loads(path.read_text())
    uids = {s["uid"] for s in load(DATASOURCES)["datasources"]}
    assert datasource_uids(dash) <= uids and {"prometheus", "tempo"} <= datasource_uids(dash)
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    titles = " | ".join(p["title"] for p in panels).lower()
    for needed in ("jobs by stage", "start-up phase durations", "stalls", "frozen processes"):
        assert needed in titles, needed
    queries = [t.get("query") or t.get("expr") for p in panels for t in p["targets"]]
    assert all(queries)
    assert any("span.lora_otel.incomplete = true" in q for q in queries)
    assert any('span.lora_otel.stall.kind = "frozen"' in q for q in queries)
    for p in panels:
        for t in p["targets"]:
            assert t["datasource"]["uid"] == p["datasource"]["uid"]
            if p["datasource"]["uid"] == "tempo":
                assert t["queryType"] == "traceql" and t["query"].startswith("{"), t


# --- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.collector
def test_stalled_job_carries_what_the_collector_counts(tmp_path: Path, collector, otelcol) -> None:
    """A real job whose import stalls, exported over OTLP/gRPC (the compose file's 4317) to a real
    collector: the stall span and its WARN log record arrive while the process lives, with every
    attribute the count connector's conditions and keys and the span metrics' dimensions use."""
    make_module(tmp_path, "stuckmod", "import time\ntime.sleep(600)\n")
    proc = traced(
        tmp_path,
        "import stuckmod\n",
        collector.grpc_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        LORA_OTEL_STALL_AFTER="import=1",
    )
    try:
        side = sidecar_pid(tmp_path)
        wait_for(
            lambda: [r for r in collector.logs() if r.severity == "WARN"],
            timeout=20,
            what="the stall's WARN log record at the collector",
        )
        assert proc.poll() is None, "the stall arrives while the job still runs"
    finally:
        kill_and_reap(proc)
    wait_gone(side)
    received = collector.spans()
    assert_unique(received)
    stall = by_name(received)["import stuckmod"]
    assert stall.status_code == "STATUS_CODE_ERROR"
    assert stall.attributes["lora_otel.incomplete"] is True
    assert stall.attributes["lora_otel.stall.kind"] == "alive"
    assert stall.attributes["lora_otel.diagnosis"]
    # the stalled span's open ancestors come as incomplete too, with the same stall attributes:
    # the span count condition (stage == name) picks the stalled span alone
    flagged = [
        s
        for s in received
        if s.attributes.get("lora_otel.incomplete") is True and s.attributes.get("lora_otel.stall.kind") is not None
    ]
    assert {"process", "import stuckmod"} <= {s.name for s in flagged}
    stalls = [s for s in flagged if s.attributes.get("lora_otel.stall.stage") == s.name]
    assert [s.name for s in stalls] == ["import stuckmod"]
    spanmetrics_dims = [d["name"] for d in otelcol["connectors"]["span_metrics"]["dimensions"]]
    assert all(d in stall.attributes for d in spanmetrics_dims)
    [warn] = [r for r in collector.logs() if r.severity == "WARN"]
    assert warn.body.startswith("stall detected:")  # the log count condition
    assert warn.span_id == stall.span_id and warn.trace_id == stall.trace_id
    for metric, record in (
        (otelcol["connectors"]["count"]["spans"]["lora_otel.stalls"], stall),
        (otelcol["connectors"]["count"]["logs"]["lora_otel.stall.log_records"], warn),
    ):
        for key in (a["key"] for a in metric["attributes"]):
            assert key in record.attributes, "%s lacks %s, which the count connector groups by" % (record, key)
    assert warn.attributes["lora_otel.stall.stage"] == "import stuckmod" == stall.name
    assert warn.attributes["lora_otel.stall.kind"] == "alive"
    assert stall.resource.get("service.name"), "spanmetrics' service_name label"
