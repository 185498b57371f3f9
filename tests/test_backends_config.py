"""Every configuration the repository ships, loaded by the real program that runs it.

- ``collector/otelcol.yaml``, ``agent.yaml``, ``gateway.yaml`` and each ``collector/cloud/`` overlay
  merged over ``otelcol.yaml`` as ``docs/cloud.md`` tells users: ``otelcol-lora validate`` (our
  collector, built from the collector's Go modules by ``collector/build.sh``). Validation builds
  every pipeline and creates every exporter, without starting them: the cloud exporters need their
  settings (given here as placeholders) but no real account.
- ``deploy/jaeger/*.yaml``: ``jaeger validate`` (Jaeger v2 built from its module).

Two cloud overlays name exporters that cannot be built here: the Go module proxy serves no
release of ``awscloudwatchlogsexporter`` or ``tencentcloudlogserviceexporter`` at the collector
release every other module is at (v0.161.0; see ``collector/README.md``). For those the test
checks that the collector rejects exactly that exporter type and nothing else in the merge, and
that the overlay with that one exporter replaced by ``debug`` validates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from backends import JAEGER_CONFIG, OTELCOL_CONFIG, REPO, OtelCol, backend_binaries, debian_tool, validate

pytestmark = pytest.mark.slow

CLOUD = REPO / "collector" / "cloud"
CLOUD_OVERLAYS = sorted(CLOUD.glob("*.yaml"))
NOT_BUILT = {"aws-cloudwatch-logs.yaml": "awscloudwatchlogs", "tencentcloud-cls.yaml": "tencentcloud_logservice"}
"""Overlay → the exporter type our collector lacks, because its module is not served here."""

PLACEHOLDERS = {
    # Alibaba Cloud SLS: endpoint, project and logstore must be non-empty to create the exporter.
    "SLS_ENDPOINT": "cn-hangzhou.log.aliyuncs.com",
    "SLS_PROJECT": "lora-otel-test",
    "SLS_LOGSTORE": "stalls",
    "ALIBABA_CLOUD_ACCESS_KEY_ID": "placeholder",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "placeholder",
    # Azure Monitor: a connection string of the documented shape (no request is made at validation).
    "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000000;"
    "IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/",
    # Google Cloud: the project; credentials are looked up when the exporter starts, not here.
    "GOOGLE_CLOUD_PROJECT": "lora-otel-test",
    "AWS_REGION": "eu-west-1",
    "CLOUDWATCH_LOG_GROUP": "/lora-otel/stalls",
    "CLOUDWATCH_LOG_STREAM": "jobs",
    "CLS_REGION": "ap-guangzhou",
    "CLS_LOGSET": "x",
    "CLS_TOPIC": "y",
    "TENCENTCLOUD_SECRET_ID": "placeholder",
    "TENCENTCLOUD_SECRET_KEY": "placeholder",
}


def used_component_types() -> set[str]:
    """Every component type (``otlp_grpc`` of ``otlp_grpc/jaeger``) a file under collector/ names."""
    types = set()
    for path in sorted((REPO / "collector").rglob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        for section in ("receivers", "processors", "exporters", "connectors", "extensions"):
            types |= {name.split("/")[0] for name in (config.get(section) or {})}
    return types


def test_build_gives_a_collector_with_exactly_the_components_the_configs_use() -> None:
    binaries = backend_binaries()
    version = subprocess.run([str(binaries["otelcol-lora"]), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "0.161.0" in version.stdout, version
    listed = yaml.safe_load(
        subprocess.run([str(binaries["otelcol-lora"]), "components"], capture_output=True, text=True, check=True).stdout
    )
    have = set()
    for section in ("receivers", "processors", "exporters", "connectors", "extensions"):
        have |= {c["name"] for c in listed.get(section) or []}
    wanted = used_component_types()
    assert wanted - set(NOT_BUILT.values()) <= have, "missing: %s" % sorted(wanted - have)
    # nothing more than the configs use, apart from otlp_http (the OTLP/HTTP exporter, for a
    # gateway behind an HTTP-only ingress: docs/scale.md)
    assert have - wanted <= {"otlp_http"}, "built but used by no config: %s" % sorted(have - wanted - {"otlp_http"})


def test_build_is_cached() -> None:
    """A second run of collector/build.sh rebuilds nothing: seconds, not minutes."""
    backend_binaries()
    first = {p: p.stat().st_mtime_ns for p in backend_binaries().values()}
    proc = subprocess.run(["bash", str(REPO / "collector" / "build.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "building" not in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in first} == first


@pytest.mark.parametrize("name", ["otelcol.yaml", "agent.yaml", "gateway.yaml"])
def test_collector_config_loads_in_the_real_collector(name: str) -> None:
    proc = validate([REPO / "collector" / name])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("overlay", [p for p in CLOUD_OVERLAYS if p.name not in NOT_BUILT], ids=lambda p: p.name)
def test_cloud_overlay_merged_over_the_base_loads(overlay: Path) -> None:
    proc = validate([OTELCOL_CONFIG, overlay], env=PLACEHOLDERS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alone = validate([overlay], env=PLACEHOLDERS)  # docs/cloud.md: each overlay is also complete
    assert alone.returncode == 0, alone.stdout + alone.stderr


@pytest.mark.parametrize("overlay", [CLOUD / n for n in sorted(NOT_BUILT)], ids=lambda p: p.name)
def test_cloud_overlay_whose_exporter_is_not_built(overlay: Path, tmp_path: Path) -> None:
    """Not a pass for the exporter's own keys (not checked: no binary has it). Checked: the
    collector names that exporter type as the one problem, and the rest of the merge is valid."""
    exporter = NOT_BUILT[overlay.name]
    proc = validate([OTELCOL_CONFIG, overlay], env=PLACEHOLDERS)
    assert proc.returncode != 0
    assert f'unknown type: "{exporter}"' in proc.stderr, proc.stderr
    config = yaml.safe_load(overlay.read_text())
    assert list(config["exporters"]) == [exporter]
    config["exporters"] = {"debug": {"verbosity": "basic"}}
    for pipeline in config["service"]["pipelines"].values():
        pipeline["exporters"] = ["debug" if e == exporter else e for e in pipeline["exporters"]]
    stand_in = tmp_path / overlay.name
    stand_in.write_text(yaml.safe_dump(config))
    proc = validate([OTELCOL_CONFIG, stand_in], env=PLACEHOLDERS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_config_mistake_fails_validation(tmp_path: Path) -> None:
    """The check can fail: the agent's old `port: 4317` (an int where the collector wants a
    string) was accepted by our own YAML checks and refused by the real collector."""
    config = yaml.safe_load((REPO / "collector" / "agent.yaml").read_text())
    config["exporters"]["load_balancing"]["resolver"]["dns"]["port"] = 4317
    bad = tmp_path / "agent.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = validate([bad])
    assert proc.returncode != 0 and "'port' expected type 'string'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["jaeger.yaml", "jaeger-badger.yaml"])
def test_jaeger_config_loads_in_the_real_jaeger(name: str, tmp_path: Path) -> None:
    path = JAEGER_CONFIG.parent / name
    proc = subprocess.run(
        [str(backend_binaries()["jaeger"]), "validate", f"--config={path}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["otelcol.yaml", "gateway.yaml", "agent.yaml"])
def test_collector_starts_without_deprecation_warnings(name: str, tmp_path: Path) -> None:
    """Each config runs in the real collector (ports aside) and it warns of nothing deprecated:
    the 0.116 names (`otlp` exporter, `spanmetrics`, `loadbalancing`, `azuremonitor`,
    `resource_to_telemetry_conversion`) are aliases this release warns about at every start."""
    extra = {}
    if name == "agent.yaml":  # a resolvable gateway address (nothing needs to listen there)
        extra = {"exporters": {"load_balancing": {"resolver": {"dns": {"hostname": "127.0.0.1"}}}}}
    with OtelCol(
        tmp_path,
        config=REPO / "collector" / name,
        extra=extra,
        exporters={e: "127.0.0.1:9" for e in ("otlp_grpc/jaeger", "otlp_grpc/tempo") if name != "agent.yaml"},
    ) as col:
        time.sleep(1)
        log = col.log()
    assert "Everything is ready" in log, log
    assert "deprecated" not in log.lower(), log


def test_build_without_go_fails_with_the_reason(tmp_path: Path) -> None:
    """A machine without Go gets an error that says so, not a skipped test or a traceback."""
    bash = subprocess.run(["bash", "-c", "command -v bash"], capture_output=True, text=True).stdout.strip()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "cat", "sha256sum", "cut", "mkdir", "ls", "dirname", "mv"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    proc = subprocess.run(
        [bash, str(REPO / "collector" / "build.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "LORA_OTEL_BACKENDS_DIR": str(tmp_path / "out")},
    )
    assert proc.returncode == 1
    assert "Go is not installed" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_native_stack_overlay_loads_and_clears_jaegers_ports() -> None:
    """docs/backends.md "Without Docker": the collector with deploy/native/collector-ports.yaml
    validates, listens on no port Jaeger's config takes, and sends to Jaeger's OTLP port."""
    overlay = REPO / "deploy" / "native" / "collector-ports.yaml"
    proc = validate([OTELCOL_CONFIG, overlay])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jaeger = yaml.safe_load(JAEGER_CONFIG.read_text())
    jaeger_ports = {int(p["endpoint"].rsplit(":", 1)[1]) for p in jaeger["receivers"]["otlp"]["protocols"].values()}
    jaeger_ports |= {
        int(jaeger["extensions"][e][k]["endpoint"].rsplit(":", 1)[1])
        for e, k in (("jaeger_query", "http"), ("jaeger_query", "grpc"), ("healthcheckv2", "http"))
    }
    jaeger_ports.add(jaeger["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"])
    ours = yaml.safe_load(overlay.read_text())
    listening = {int(p["endpoint"].rsplit(":", 1)[1]) for p in ours["receivers"]["otlp"]["protocols"].values()}
    listening |= {
        int(ours["extensions"]["health_check"]["endpoint"].rsplit(":", 1)[1]),
        int(ours["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]),
        ours["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"],
    }
    assert not listening & jaeger_ports, sorted(listening & jaeger_ports)
    assert ours["exporters"]["otlp_grpc/jaeger"]["endpoint"] == "127.0.0.1:%d" % int(
        jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1]
    )


def test_native_jaeger_and_prometheus_files_load(tmp_path: Path) -> None:
    """docs/backends.md "Without Docker": Jaeger with deploy/native/jaeger-local.yaml validates and
    binds only 127.0.0.1; Prometheus' deploy/native/prometheus.yml passes `promtool check config`
    (rules included) and scrapes where deploy/native/collector-ports.yaml has the collector listen."""
    native = REPO / "deploy" / "native"
    proc = subprocess.run(
        [
            str(backend_binaries()["jaeger"]),
            "validate",
            f"--config={JAEGER_CONFIG}",
            f"--config={native / 'jaeger-local.yaml'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    local = yaml.safe_load((native / "jaeger-local.yaml").read_text())
    endpoints = [p["endpoint"] for p in local["receivers"]["otlp"]["protocols"].values()]
    endpoints += [
        local["extensions"]["healthcheckv2"]["http"]["endpoint"],
        local["extensions"]["jaeger_query"]["http"]["endpoint"],
        local["extensions"]["jaeger_query"]["grpc"]["endpoint"],
    ]
    assert all(e.startswith("127.0.0.1:") for e in endpoints), endpoints
    assert (
        local["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["host"] == "127.0.0.1"
    )
    check = subprocess.run(
        [str(debian_tool("promtool")), "check", "config", str(native / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and "SUCCESS" in check.stdout + check.stderr, check.stdout + check.stderr
    assert "lora_otel.rules.yml" in check.stdout + check.stderr  # the rules came with it
    prom = yaml.safe_load((native / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in prom["scrape_configs"]}
    collector = yaml.safe_load((native / "collector-ports.yaml").read_text())
    assert targets["lora-otel-spanmetrics"] == [collector["exporters"]["prometheus"]["endpoint"]]
    own = collector["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert targets["otel-collector"] == ["%s:%d" % (own["host"], own["port"])]


def test_build_ignores_the_shells_target_and_rebuilds_a_damaged_binary(tmp_path: Path) -> None:
    """A user's GOOS/GOARCH/GOFLAGS never give a binary this machine cannot run (they are for the
    user's own builds), and a binary cut short after its build is rebuilt, not reused because its
    stamp matched (issue 14's hostile trial)."""
    out = tmp_path / "backends"
    out.mkdir()
    for name, path in backend_binaries().items():
        shutil.copy2(path, out / name)
        shutil.copy2(path.parent / (name + ".stamp"), out / (name + ".stamp"))
    env = {
        **os.environ,
        "LORA_OTEL_BACKENDS_DIR": str(out),
        "GOOS": "windows",
        "GOARCH": "arm64",
        "GOFLAGS": "-tags=nosuchtag",
    }
    with open(out / "jaeger", "r+b") as f:
        f.truncate(1000)
    proc = subprocess.run(
        ["bash", str(REPO / "collector" / "build.sh")], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr
    assert "building jaeger" in proc.stderr and "building otelcol-lora" not in proc.stderr, proc.stderr
    for name in ("jaeger", "otelcol-lora"):
        run = subprocess.run([str(out / name), "--help"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (name, run.stderr[-500:])
