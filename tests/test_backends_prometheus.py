"""Metrics and alerts for real: ``deploy/prometheus/`` loaded by Debian's Prometheus 2.42 and promtool.

- ``promtool check rules``/``check config`` over the shipped files, and ``promtool test rules`` over
  ``deploy/prometheus/lora_otel.rules.test.yml`` (each alert firing and not, labels and annotations;
  the recording rules' values).
- End to end: our collector (``collector/otelcol.yaml``, ports only) and Prometheus scraping it with
  ``deploy/prometheus/prometheus.yml`` (targets and intervals only, :func:`backends.prometheus_config`);
  two real traced jobs, one whose import sleeps past ``LORA_OTEL_STALL_AFTER=import=1`` and one
  whose import holds the GIL (frozen); asserted through Prometheus' HTTP API: the stall counter,
  the alerts firing with the job's labels, the span metrics series the rules and the Grafana
  dashboard read.
- ``docs/backends.md``'s alert expressions are the rules file's, word for word.

Bug found here (fixed in the rules file, the dashboard and the doc): the collector's series belong
to one traced process each and start at 1, so ``increase(lora_otel_stalls_total[5m])`` — the
expression shipped before — never saw a job's first stall: the stall alerts never fired, and the
start-up recording rules were 0/0. ``test_the_expressions_shipped_before_miss_it`` shows it on the
same real data.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from backends import PROMETHEUS_CONFIG, PROMETHEUS_RULES, REPO, OtelCol, Prometheus, debian_tool, wait_until
from test_hangs import kill_and_reap, make_module
from test_sidecar import sidecar_pid, traced, wait_gone

RULES_TEST = PROMETHEUS_RULES.parent / "lora_otel.rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "training-jobs.json"
BACKENDS_DOC = REPO / "docs" / "backends.md"

STALLED, FROZEN, CLASHING = "lora-stalled", "lora-frozen", 'my "clashing" job'
CLASHING_ATTRIBUTES = "le=5,job=finetune-42,lora_otel.stall.stage=fake,span.name=zzz"
"""Resource attributes named like the exporter's and the metrics' own labels (issue 14's hostile trial)."""
"""The two jobs' ``OTEL_SERVICE_NAME``: Prometheus' ``service_name`` label."""

OLD_STALL_EXPR = (
    "sum by (service_name, lora_otel_stall_stage, lora_otel_stall_kind) (increase(lora_otel_stalls_total[5m])) > 0"
)
OLD_FROZEN_EXPR = (
    "sum by (service_name, lora_otel_stall_stage) "
    '(increase(lora_otel_stalls_total{lora_otel_stall_kind="frozen"}[5m])) > 0'
)
_PHASES = '{span_name=~"arguments|import .+|cuda probe|cuda init", lora_otel_incomplete=""}'
_DURATION = "traces_span_metrics_duration_milliseconds"
OLD_AVG30M_EXPR = (
    "sum by (service_name, span_name) (increase(%s_sum%s[30m]))"
    " / sum by (service_name, span_name) (increase(%s_count%s[30m]))"
    " / 1000" % (_DURATION, _PHASES, _DURATION, _PHASES)
)
"""The expressions ``deploy/prometheus/lora_otel.rules.yml`` shipped before this module."""


def rules() -> dict[str, dict[str, Any]]:
    """Every rule of the rules file by its alert or record name."""
    groups = yaml.safe_load(PROMETHEUS_RULES.read_text())["groups"]
    return {r.get("alert") or r["record"]: r for g in groups for r in g["rules"]}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(debian_tool("promtool")), *args], capture_output=True, text=True, timeout=120, cwd=REPO)


# --- promtool -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_promtool_checks_the_rules_and_the_config() -> None:
    """``promtool check rules`` and ``check config`` accept the shipped files as they are (the
    config's rule file path is relative to the config file)."""
    checked = promtool("check", "rules", str(PROMETHEUS_RULES.relative_to(REPO)))
    assert checked.returncode == 0 and "SUCCESS: %d rules found" % len(rules()) in checked.stdout, checked
    checked = promtool("check", "config", str(PROMETHEUS_CONFIG.relative_to(REPO)))
    assert checked.returncode == 0 and "SUCCESS: 1 rule files found" in checked.stdout, checked
    assert "is valid prometheus config file syntax" in checked.stdout, checked


@pytest.mark.slow
def test_promtool_unit_tests_each_alert_and_recording_rule() -> None:
    """``promtool test rules`` passes, and its file tests every alert both firing (with its labels
    and annotations) and not firing, and the value of every recording rule."""
    tested = promtool("test", "rules", str(RULES_TEST.relative_to(REPO)))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    suite = yaml.safe_load(RULES_TEST.read_text())
    assert suite["rule_files"] == [PROMETHEUS_RULES.name]
    cases = [c for t in suite["tests"] for c in t.get("alert_rule_test", [])]
    exprs = [c["expr"] for t in suite["tests"] for c in t.get("promql_expr_test", [])]
    for name, rule in rules().items():
        if "alert" in rule:
            firing = [c for c in cases if c["alertname"] == name and c["exp_alerts"]]
            quiet = [c for c in cases if c["alertname"] == name and not c["exp_alerts"]]
            assert firing and quiet, "%s: no firing or no quiet case" % name
            for case in firing:
                for alert in case["exp_alerts"]:
                    assert alert["exp_labels"]["severity"] == rule["labels"]["severity"], name
                    assert set(alert["exp_annotations"]) == set(rule["annotations"]), name
        else:
            assert name in exprs, "%s: its value is not tested" % name


# --- docs/backends.md -----------------------------------------------------------------------------


def documented_rules() -> dict[str, tuple[str, str]]:
    """``docs/backends.md``'s Prometheus section: ``{name: (heading note, expression)}`` from its
    code block, where each rule is a ``# name (note)`` line followed by its expression."""
    text = BACKENDS_DOC.read_text()
    section = text[text.index("## Prometheus alerts") :]
    section = section[: section.index("\n## ", 1)]
    [block] = re.findall(r"```promql\n(.*?)```", section, re.S)
    out = {}
    for chunk in re.split(r"^(?=# )", block, flags=re.M):
        if chunk.strip():
            heading, _, expr = chunk.partition("\n")
            name, note = re.fullmatch(r"# (\S+) \((.*)\)", heading).groups()
            out[name] = (note, expr.strip())
    return out


def test_the_doc_shows_the_rules_files_expressions() -> None:
    """Every rule's expression in docs/backends.md is the rules file's, character for character
    (so the doc shows what the promtool and end-to-end tests run), with its severity and ``for``."""
    documented = documented_rules()
    shipped = rules()
    assert list(documented) == list(shipped)
    for name, (note, expr) in documented.items():
        rule = shipped[name]
        assert expr == rule["expr"].strip(), name
        if "alert" in rule:
            wanted = rule["labels"]["severity"] + ("" if rule["for"] == "0m" else ", for " + rule["for"])
        else:
            [group] = [g for g in yaml.safe_load(PROMETHEUS_RULES.read_text())["groups"] if rule in g["rules"]]
            wanted = "recording rule, every " + group["interval"]
        assert note == wanted, name


# --- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """Our collector, Prometheus scraping it, and two traced jobs that stall in an import: one
    whose import sleeps (``import stuckmod``, after an ``import quickmod`` that ends in ~0.3 s),
    one whose import holds the GIL (``import frozenmod``), and one that stalls like the first with
    resource attributes that clash with labels and a quote in its name. Yields once the stall alerts fire; the
    jobs run until the module's tests are done, then are killed and their sidecars waited for."""
    work = tmp_path_factory.mktemp("prometheus")
    jobs: list[tuple[Any, Path]] = []
    with (
        OtelCol(work, exporters={"otlp_grpc/jaeger": "127.0.0.1:1", "otlp_grpc/tempo": "127.0.0.1:1"}) as col,
        Prometheus(work, col) as prom,
    ):
        try:
            stalled, frozen = work / "stalled", work / "frozen"
            stalled.mkdir(), frozen.mkdir()
            make_module(stalled, "quickmod", "import time\ntime.sleep(0.3)\n")
            make_module(stalled, "stuckmod", "import time\ntime.sleep(600)\n")
            jobs.append(
                (
                    traced(
                        stalled,
                        "import quickmod\nimport stuckmod\n",
                        col.grpc_endpoint,
                        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                        OTEL_SERVICE_NAME=STALLED,
                        LORA_OTEL_STALL_AFTER="import=1",
                    ),
                    stalled,
                )
            )
            make_module(
                frozen,
                "frozenmod",
                "import ctypes\ndef hold():\n    while True:\n        ctypes.PyDLL(None).pause()\nhold()\n",
            )
            jobs.append(
                (
                    traced(
                        frozen,
                        "import frozenmod\n",
                        col.grpc_endpoint,
                        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                        OTEL_SERVICE_NAME=FROZEN,
                        LORA_OTEL_FROZEN_AFTER="2",
                    ),
                    frozen,
                )
            )
            clashing = work / "clashing"
            clashing.mkdir()
            make_module(clashing, "stuckmod", "import time\ntime.sleep(600)\n")
            jobs.append(
                (
                    traced(
                        clashing,
                        "import stuckmod\n",
                        col.grpc_endpoint,
                        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                        OTEL_SERVICE_NAME=CLASHING,
                        OTEL_RESOURCE_ATTRIBUTES=CLASHING_ATTRIBUTES,
                        LORA_OTEL_STALL_AFTER="import=1",
                    ),
                    clashing,
                )
            )
            firing = wait_until(
                lambda: _firing(prom, {"LoraOtelStallDetected", "LoraOtelProcessFrozen"}, 4),
                60,
                "both stall alerts firing in Prometheus",
            )
            # the span metrics connector flushes every 15 s: wait for the ended import's series
            wait_until(
                lambda: prom.query(_DURATION + '_count{span_name="import quickmod"}'),
                60,
                "the span metrics of the ended import in Prometheus",
            )
            for proc, _ in jobs:
                assert proc.poll() is None, "the alerts fire while the jobs still run"
            yield SimpleNamespace(collector=col, prometheus=prom, firing=firing)
        finally:
            sidecars = []
            for proc, where in jobs:
                try:
                    sidecars.append(sidecar_pid(where))
                except AssertionError:
                    pass
                kill_and_reap(proc)
            for pid in sidecars:
                wait_gone(pid)


def _firing(prom: Prometheus, names: set[str], count: int) -> list[dict[str, Any]]:
    alerts = [a for a in prom.alerts() if a["labels"]["alertname"] in names and a["state"] == "firing"]
    return alerts if len(alerts) >= count else []


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


@pytest.mark.slow
def test_prometheus_scrapes_the_collector(stack) -> None:
    """Each job of deploy/prometheus/prometheus.yml is up: the collector's Prometheus exporter
    (8889 in compose), its own telemetry (8888) and Prometheus itself; every rule of the alerts
    group evaluates without error."""
    targets = stack.prometheus.targets()
    assert sorted(t["labels"]["job"] for t in targets) == ["lora-otel-spanmetrics", "otel-collector", "prometheus"]
    assert all(t["health"] == "up" for t in targets), targets
    assert {s["metric"]["job"]: _value(s) for s in stack.prometheus.query("up")} == {
        "lora-otel-spanmetrics": 1,
        "otel-collector": 1,
        "prometheus": 1,
    }
    groups = stack.prometheus.rules()
    [alerts] = [g for g in groups if g["name"] == "lora_otel.alerts"]
    assert {r["name"]: r["health"] for r in alerts["rules"]} == {
        name: "ok" for name, rule in rules().items() if "alert" in rule
    }


@pytest.mark.slow
def test_a_real_stall_raises_the_counter_and_fires_the_alert(stack) -> None:
    """The job stalled in ``import stuckmod``: ``lora_otel_stalls_total`` is 1 for it (one stall,
    its open ancestors not counted), and LoraOtelStallDetected fires in /api/v1/alerts with the
    job's service_name, the stage and the kind, and the rule's annotations filled in."""
    [counted] = stack.prometheus.query('lora_otel_stalls_total{service_name="%s"}' % STALLED)
    assert counted["metric"]["lora_otel_stall_stage"] == "import stuckmod"
    assert counted["metric"]["lora_otel_stall_kind"] == "alive"
    assert _value(counted) == 1
    [logged] = stack.prometheus.query('lora_otel_stall_log_records_total{service_name="%s"}' % STALLED)
    assert _value(logged) == 1 and logged["metric"]["lora_otel_stall_stage"] == "import stuckmod"
    [alert] = [
        a
        for a in stack.prometheus.alerts()
        if a["labels"]["alertname"] == "LoraOtelStallDetected" and a["labels"]["service_name"] == STALLED
    ]
    assert alert["state"] == "firing"
    assert alert["labels"] == {
        "alertname": "LoraOtelStallDetected",
        "severity": "warning",
        "service_name": STALLED,
        "lora_otel_stall_stage": "import stuckmod",
        "lora_otel_stall_kind": "alive",
    }
    assert alert["annotations"]["summary"] == "%s: stall in import stuckmod (alive)" % STALLED
    assert 'resource.service.name = "%s"' % STALLED in alert["annotations"]["description"]
    assert not [
        a
        for a in stack.prometheus.alerts()
        if a["labels"]["alertname"] == "LoraOtelProcessFrozen" and a["labels"]["service_name"] == STALLED
    ]


@pytest.mark.slow
def test_a_frozen_process_fires_both_stall_alerts(stack) -> None:
    """The job whose import holds the GIL: its stall is kind "frozen"; LoraOtelStallDetected and
    the critical LoraOtelProcessFrozen both fire for it."""
    [counted] = stack.prometheus.query('lora_otel_stalls_total{service_name="%s"}' % FROZEN)
    assert counted["metric"]["lora_otel_stall_kind"] == "frozen" and _value(counted) == 1
    by_name = {a["labels"]["alertname"]: a for a in stack.prometheus.alerts() if a["labels"]["service_name"] == FROZEN}
    assert by_name["LoraOtelProcessFrozen"]["state"] == "firing"
    assert by_name["LoraOtelProcessFrozen"]["labels"] == {
        "alertname": "LoraOtelProcessFrozen",
        "severity": "critical",
        "service_name": FROZEN,
        "lora_otel_stall_stage": "import frozenmod",
    }
    assert by_name["LoraOtelStallDetected"]["labels"]["lora_otel_stall_kind"] == "frozen"


@pytest.mark.slow
def test_the_expressions_shipped_before_miss_it(stack) -> None:
    """The bug this module found: on the same real series, the stall expressions shipped before
    (``increase(lora_otel_stalls_total[5m]) > 0``) return nothing — the counter of a job's stall
    starts at 1 — and the old 30-minute phase mean is 0/0; the shipped ones see them."""
    prom = stack.prometheus
    assert prom.query(OLD_STALL_EXPR) == [] and prom.query(OLD_FROZEN_EXPR) == []
    stalled = prom.query(rules()["LoraOtelStallDetected"]["expr"])
    assert {s["metric"]["service_name"] for s in stalled} == {STALLED, FROZEN, CLASHING}
    assert {s["metric"]["service_name"] for s in prom.query(rules()["LoraOtelProcessFrozen"]["expr"])} == {FROZEN}
    old = [_value(s) for s in prom.query(OLD_AVG30M_EXPR) if s["metric"]["span_name"] == "import quickmod"]
    assert all(math.isnan(v) for v in old), old  # nothing, or 0/0


@pytest.mark.slow
def test_span_metrics_carry_what_the_rules_select(stack) -> None:
    """The span metrics series the rules and the dashboard select exist as the collector exports
    them: an ended phase (``import quickmod``) without ``lora_otel_incomplete``; the stalled span
    with ``lora_otel_incomplete="true"`` and its stall kind; and the 30-minute phase mean (the
    recording rule's expression, evaluated now) is the ended import's ~0.3 s, the stalled one left out."""
    prom = stack.prometheus
    series = prom.query(_DURATION + '_count{service_name="%s"}' % STALLED)
    by_span = {s["metric"]["span_name"]: s["metric"] for s in series}
    assert "lora_otel_incomplete" not in by_span["import quickmod"]
    assert by_span["import quickmod"]["status_code"] == "STATUS_CODE_UNSET"
    stalled = prom.query(_DURATION + '_count{service_name="%s", span_name="import stuckmod"}' % STALLED)
    assert [
        (s["metric"]["lora_otel_incomplete"], s["metric"]["lora_otel_stall_kind"], s["metric"]["status_code"])
        for s in stalled
    ] == [("true", "alive", "STATUS_CODE_ERROR")]
    assert prom.query(_DURATION + '_bucket{service_name="%s", span_name="import quickmod", le="500.0"}' % STALLED)
    assert prom.query('traces_span_metrics_calls_total{service_name="%s", span_name="import quickmod"}' % STALLED)
    avg30m = rules()["lora_otel:phase_duration_seconds:avg30m"]["expr"]
    mean = {s["metric"]["span_name"]: _value(s) for s in prom.query(avg30m) if s["metric"]["service_name"] == STALLED}
    assert 0.3 <= mean["import quickmod"] < 3, mean
    assert "import stuckmod" not in mean


@pytest.mark.slow
def test_the_dashboards_prometheus_queries_show_the_jobs(stack) -> None:
    """Each Prometheus query of the Grafana dashboard (its variables given values as Grafana
    would: the job, a 10-minute range, a 1-minute rate interval) returns the jobs' series from the
    real Prometheus; the panels of recorded series are checked through their rules above."""
    dashboard = json.loads(DASHBOARD.read_text())
    recorded = {name for name, rule in rules().items() if "record" in rule}
    checked = 0
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            if target["datasource"]["uid"] != "prometheus" or any(r in target["expr"] for r in recorded):
                continue
            job = FROZEN if 'lora_otel_stall_kind="frozen"' in target["expr"] else STALLED
            expr = target["expr"].replace("$job", job).replace("$__range", "10m").replace("$__rate_interval", "1m")
            # the span metrics' calls counter is 0 at its first flush and counts at the next (15 s)
            result = wait_until(
                lambda: [s for s in stack.prometheus.query(expr) if _value(s) > 0],  # noqa: B023 - called in this iteration
                40,
                "%s: %s" % (panel["title"], expr),
            )
            assert all(s["metric"].get("service_name", job) == job for s in result), (panel["title"], expr)
            checked += 1
    assert checked >= 5


@pytest.mark.slow
def test_a_jobs_resource_attributes_cannot_break_or_falsify_the_metrics(stack) -> None:
    """A job with OTEL_RESOURCE_ATTRIBUTES ``le=5,job=...,lora_otel.stall.stage=fake,span.name=zzz``
    beside the others: every target stays up (``le`` as a label once made every
    scrape fail for every job), its stall is counted under its real stage (the attribute once
    replaced the metric's label), the alert fires for it, and no series carries its command line
    (resource attributes other than service name, instance, host and pid stay in target_info).
    Before the exporter's resource labels were limited, this job took the other jobs' alerts down."""
    assert all(t["health"] == "up" for t in stack.prometheus.targets()), stack.prometheus.targets()
    [counted] = stack.prometheus.query("lora_otel_stalls_total{service_name=%s}" % json.dumps(CLASHING))
    assert counted["metric"]["lora_otel_stall_stage"] == "import stuckmod"
    assert "le" not in counted["metric"] and _value(counted) == 1
    [alert] = [
        a
        for a in stack.prometheus.alerts()
        if a["labels"]["alertname"] == "LoraOtelStallDetected" and a["labels"]["service_name"] == CLASHING
    ]
    assert alert["state"] == "firing" and alert["labels"]["lora_otel_stall_stage"] == "import stuckmod"
    # the Tempo query in the description stays valid TraceQL for a name with quotes
    assert "resource.service.name = %s }" % json.dumps(CLASHING) in alert["annotations"]["description"]
    labels = set()
    for line in stack.collector.prometheus_metrics().splitlines():
        if line.startswith(("lora_otel_", "traces_span_metrics_")):
            labels |= set(re.findall(r'([A-Za-z_]\w*)="', line.split("{", 1)[1] if "{" in line else ""))
    resource = {"service_name", "service_instance_id", "host_name", "process_pid", "job", "instance"}
    metric = {
        "lora_otel_stall_kind",
        "lora_otel_stall_stage",
        "lora_otel_incomplete",
        "span_name",
        "span_kind",
        "status_code",
        "le",
        "otel_scope_name",
        "otel_scope_version",
        "otel_scope_schema_url",
        "collector_instance_id",
    }  # the span metrics connector's own
    assert labels - resource - metric == set(), "labels from the resource: %s" % sorted(labels - resource - metric)
