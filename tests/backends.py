"""The backends lora_otel ships, run for real: our collector, Jaeger v2 and Prometheus.

- ``otelcol-lora``: built from ``collector/otelcol-lora`` (the collector's own Go modules, exactly
  the components ``collector/*.yaml`` use) by ``collector/build.sh``;
- ``jaeger``: Jaeger v2 built from ``github.com/jaegertracing/jaeger/cmd/jaeger`` (``deploy/jaeger``),
  in-memory storage (``deploy/jaeger/jaeger.yaml``);
- ``prometheus`` and ``promtool``: Debian's ``prometheus`` package (installed by ``.ci/run``).

Each runs the repository's own configuration file unchanged; only listening ports and the
addresses of its peers differ, given as a second ``--config`` file that the collector deep-merges
over the first (the mechanism ``docs/cloud.md`` tells users to use for overlays). Prometheus has no
such merge: its configuration is the repository's, loaded, with targets, intervals and the rule
file path replaced (:func:`prometheus_config`).

A machine without Go or Prometheus fails these tests with the reason; nothing is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from collector import free_port

REPO = Path(__file__).resolve().parents[1]
OTELCOL_CONFIG = REPO / "collector" / "otelcol.yaml"
AGENT_CONFIG = REPO / "collector" / "agent.yaml"
GATEWAY_CONFIG = REPO / "collector" / "gateway.yaml"
JAEGER_CONFIG = REPO / "deploy" / "jaeger" / "jaeger.yaml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS_RULES = REPO / "deploy" / "prometheus" / "lora_otel.rules.yml"

_built: dict[str, Path] = {}


def backend_binaries() -> dict[str, Path]:
    """``{"otelcol-lora": path, "jaeger": path}``, built by ``collector/build.sh`` (cached: the
    first call of a session checks, a build happens only when the Go sources changed)."""
    if not _built:
        proc = subprocess.run(
            ["bash", str(REPO / "collector" / "build.sh")], capture_output=True, text=True, timeout=3600
        )
        if proc.returncode != 0:
            raise RuntimeError(
                "collector/build.sh failed (exit %d):\n%s%s" % (proc.returncode, proc.stdout, proc.stderr)
            )
        for line in proc.stdout.splitlines():
            name, _, path = line.partition("=")
            if path:
                _built[name] = Path(path)
    return dict(_built)


def debian_tool(name: str) -> Path:
    """``prometheus`` or ``promtool`` from Debian's package, or a clear error."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"{name} is not installed: .ci/run installs Debian's prometheus package "
            "(apt-get install prometheus), which has both prometheus and promtool"
        )
    return Path(found)


def http_get(url: str, timeout: float = 5) -> Any:
    """GET ``url``; the JSON body, or the text when it is not JSON. Raises on HTTP errors."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read().decode("utf-8", "replace")
    try:
        return json.loads(body)
    except ValueError:
        return body


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Call ``check`` until it returns something true; return that. Raises with ``what``."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError) as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not seen after {timeout} s" + (f" (last error: {last_error})" if last_error else "")
            )
        time.sleep(every)


def write_overlay(path: Path, overlay: dict[str, Any]) -> Path:
    """A configuration overlay file (JSON is YAML), merged by the collector over the first file."""
    path.write_text(json.dumps(overlay, indent=1))
    return path


class Service:
    """A backend process started with its own output file; stopped (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        ports: dict[str, int],
        ready_url: Optional[str] = None,
        ready_timeout: float = 60,
    ) -> None:
        self.name, self.ports = name, ports
        self.output = workdir / f"{name}.out"
        self._out = open(self.output, "wb")  # noqa: SIM115 - the backend's output, closed when it stops
        self.process = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(workdir)
        )
        try:
            if ready_url is not None:
                wait_until(lambda: self._ready(ready_url), ready_timeout, f"{name} ready at {ready_url}")
        except BaseException:
            self.stop()
            raise

    def _ready(self, url: str) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return resp.status == 200
        except urllib.error.HTTPError:
            return False

    def log(self) -> str:
        return self.output.read_bytes().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._out.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --- Jaeger v2 -----------------------------------------------------------------------------------


class Jaeger(Service):
    """Jaeger v2 with ``deploy/jaeger/jaeger.yaml`` (in memory) on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        ports = {
            name: free_port() for name in ("otlp_grpc", "otlp_http", "query_http", "query_grpc", "health", "metrics")
        }
        overlay = write_overlay(
            workdir / "jaeger-ports.yaml",
            {
                "receivers": {
                    "otlp": {
                        "protocols": {
                            "grpc": {"endpoint": f"127.0.0.1:{ports['otlp_grpc']}"},
                            "http": {"endpoint": f"127.0.0.1:{ports['otlp_http']}"},
                        }
                    }
                },
                "extensions": {
                    "healthcheckv2": {"http": {"endpoint": f"127.0.0.1:{ports['health']}"}},
                    "jaeger_query": {
                        "http": {"endpoint": f"127.0.0.1:{ports['query_http']}"},
                        "grpc": {"endpoint": f"127.0.0.1:{ports['query_grpc']}"},
                    },
                },
                "service": {
                    "telemetry": {
                        "metrics": {
                            "readers": [
                                {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports["metrics"]}}}}
                            ]
                        }
                    }
                },
            },
        )
        binary = backend_binaries()["jaeger"]
        super().__init__(
            "jaeger",
            [str(binary), f"--config={JAEGER_CONFIG}", f"--config={overlay}"],
            workdir,
            ports,
            ready_url=f"http://127.0.0.1:{ports['query_http']}/api/v3/services",
        )

    @property
    def otlp_grpc(self) -> str:
        return f"127.0.0.1:{self.ports['otlp_grpc']}"

    @property
    def query(self) -> str:
        return f"http://127.0.0.1:{self.ports['query_http']}"

    def services(self) -> list[str]:
        return list(http_get(self.query + "/api/v3/services").get("services") or [])

    def find_traces(self, service: str, lookback_s: float = 3600, **params: Any) -> list[dict[str, Any]]:
        """``GET /api/v3/traces``: the OTLP/JSON ``resourceSpans`` of the service's traces."""
        now = time.time()
        query = {
            "query.service_name": service,
            "query.start_time_min": _rfc3339(now - lookback_s),
            "query.start_time_max": _rfc3339(now + 60),
            "query.num_traces": "100",
        }
        query.update(params)
        try:
            body = http_get(self.query + "/api/v3/traces?" + urllib.parse.urlencode(query))
        except urllib.error.HTTPError as e:
            if e.code == 404:  # "trace not found": none yet
                return []
            raise
        return list(body.get("result", {}).get("resourceSpans") or [])

    def get_trace(self, trace_id: str) -> list[dict[str, Any]]:
        """``GET /api/v3/traces/{trace_id}``: the trace's ``resourceSpans``."""
        body = http_get(f"{self.query}/api/v3/traces/{trace_id}")
        return list(body.get("result", {}).get("resourceSpans") or [])

    def search_tags(self, service: str, tags: dict[str, str], limit: int = 20) -> list[dict[str, Any]]:
        """The UI's search (``GET /api/traces?service=&tags=``), as ``docs/backends.md`` tells a
        user to search by tag: the traces (Jaeger's own JSON model) that have a span with them."""
        query = {"service": service, "tags": json.dumps(tags), "limit": str(limit), "lookback": "1h"}
        body = http_get(self.query + "/api/traces?" + urllib.parse.urlencode(query))
        return list(body.get("data") or [])


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)


def otlp_spans(resource_spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flatten OTLP/JSON ``resourceSpans`` into spans with ``resource`` and plain ``attrs``."""
    out = []
    for rs in resource_spans:
        resource = _attrs(rs.get("resource", {}).get("attributes", []))
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                span = dict(span)
                span["resource"] = resource
                span["attrs"] = _attrs(span.get("attributes", []))
                span["event_names"] = [e.get("name") for e in span.get("events", [])]
                out.append(span)
    return out


def _attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for item in items:
        value = item.get("value", {})
        for kind in ("stringValue", "boolValue", "intValue", "doubleValue"):
            if kind in value:
                v = value[kind]
                out[item["key"]] = int(v) if kind == "intValue" else v
                break
        else:
            out[item["key"]] = value
    return out


# --- our collector --------------------------------------------------------------------------------


class OtelCol(Service):
    """``otelcol-lora`` running ``config`` unchanged except ports: its OTLP receiver, health check,
    telemetry and Prometheus exporter on free loopback ports; ``exporters`` maps an exporter id of
    the file to the address it sends to here (e.g. ``{"otlp_grpc/jaeger": jaeger.otlp_grpc}``)."""

    def __init__(
        self,
        workdir: Path,
        config: Path = OTELCOL_CONFIG,
        name: str = "otelcol",
        exporters: Optional[dict[str, str]] = None,
        extra: Optional[dict[str, Any]] = None,
    ) -> None:
        ports = {n: free_port() for n in ("otlp_grpc", "otlp_http", "health", "metrics", "prometheus")}
        overlay: dict[str, Any] = {
            "receivers": {
                "otlp": {
                    "protocols": {
                        "grpc": {"endpoint": f"127.0.0.1:{ports['otlp_grpc']}"},
                        "http": {"endpoint": f"127.0.0.1:{ports['otlp_http']}"},
                    }
                }
            },
            "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports['health']}"}},
            "service": {
                "telemetry": {
                    "metrics": {
                        "readers": [
                            {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports["metrics"]}}}}
                        ]
                    }
                }
            },
            "exporters": {},
        }
        if "prometheus:" in config.read_text():
            overlay["exporters"]["prometheus"] = {"endpoint": f"127.0.0.1:{ports['prometheus']}"}
        for exporter, address in (exporters or {}).items():
            overlay["exporters"][exporter] = {"endpoint": address}
        _deep_merge(overlay, extra or {})
        self.overlay = write_overlay(workdir / f"{name}-ports.yaml", overlay)
        binary = backend_binaries()["otelcol-lora"]
        super().__init__(
            name,
            [str(binary), f"--config={config}", f"--config={self.overlay}"],
            workdir,
            ports,
            ready_url=f"http://127.0.0.1:{ports['health']}/",
        )

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['otlp_grpc']}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['otlp_http']}"

    def prometheus_metrics(self) -> str:
        """What the Prometheus exporter serves now (the text Prometheus scrapes)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['prometheus']}/metrics", timeout=5) as r:
            return r.read().decode()


def _deep_merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def validate(configs: list[Path], env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``otelcol-lora validate --config=A --config=B ...`` (merged in order, as at start)."""
    binary = backend_binaries()["otelcol-lora"]
    return subprocess.run(
        [str(binary), "validate", *[f"--config={c}" for c in configs]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


# --- Prometheus -----------------------------------------------------------------------------------


def prometheus_config(collector: OtelCol, port: int, interval: str = "1s") -> dict[str, Any]:
    """``deploy/prometheus/prometheus.yml`` as Prometheus loads it here: the file itself, with only
    what must differ on this machine replaced — each job's target (``collector:8889`` → the
    collector's Prometheus exporter, ``collector:8888`` → its own telemetry, ``127.0.0.1:9090`` →
    this Prometheus), the global scrape and evaluation intervals (``interval``, so that a test sees
    a scrape and an evaluation within seconds) and the rule file's path (relative to the repository's
    file, absolute here: the same ``deploy/prometheus/lora_otel.rules.yml``, unchanged)."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets = {
        "collector:8889": collector.ports["prometheus"],
        "collector:8888": collector.ports["metrics"],
        "127.0.0.1:9090": port,
    }
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = ["127.0.0.1:%d" % targets[t] for t in static["targets"]]
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = interval
    config["rule_files"] = [str((PROMETHEUS_CONFIG.parent / f).resolve()) for f in config["rule_files"]]
    return config


class Prometheus(Service):
    """Debian's ``prometheus`` with :func:`prometheus_config` (written to ``workdir/prometheus.yml``),
    its TSDB in ``workdir/prometheus-data``, on a free loopback port."""

    def __init__(self, workdir: Path, collector: OtelCol, interval: str = "1s") -> None:
        port = free_port()
        self.config = prometheus_config(collector, port, interval)
        path = write_overlay(workdir / "prometheus.yml", self.config)
        super().__init__(
            "prometheus",
            [
                str(debian_tool("prometheus")),
                f"--config.file={path}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            workdir,
            {"http": port},
            ready_url=f"http://127.0.0.1:{port}/-/ready",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """``GET /api/v1/query``: the instant vector's ``[{"metric": {...}, "value": [t, "v"]}]``."""
        body = http_get(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body}")
        return list(body["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v1/alerts``: the active alerts (pending and firing), labels and annotations."""
        return list(http_get(self.url + "/api/v1/alerts")["data"]["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        """``GET /api/v1/targets``: the active scrape targets, with ``health`` and ``lastError``."""
        return list(http_get(self.url + "/api/v1/targets")["data"]["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """``GET /api/v1/rules``: the rule groups, each rule with its ``health`` and ``lastError``."""
        return list(http_get(self.url + "/api/v1/rules")["data"]["groups"])
