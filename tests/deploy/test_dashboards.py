"""The Grafana dashboard (deploy/grafana) and the alert rules (deploy/prometheus) query only what
the router exports: every PromQL expression parses, and every metric and label it names is in the
/metrics of a real router process after some traffic (sample names with their _total, _bucket,
_count and _sum suffixes, as exposed)."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import httpx
import promql_parser as promql
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from router.tools.localrun import router_process
from servers import FakeBackend, serve_app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "pd-router.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
# Labels the scrape adds (Prometheus; a Prometheus Operator ServiceMonitor), not the router.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
             "gauge": ("",), "info": ("_info",), "summary": ("", "_count", "_sum", "_created"), "unknown": ("",)}


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from a running router's /metrics after some traffic."""
    good, busy = FakeBackend("good"), FakeBackend("busy", status=503)
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(b.app())) for b in (good, busy)]
        # round_robin sends every other request to the busy engine first: it is retried on the good one.
        config = {"instances": [{"url": urls[0], "name": "good", "model": "m"}, {"url": urls[1], "name": "busy"}],
                  "policy": {"name": "round_robin"}, "health": {"failures_to_unhealthy": 100}}
        router = stack.enter_context(router_process(config)).url
        for i in range(6):  # streaming and not
            body = {"model": "m", "prompt": f"question {i} " + "shared prefix " * 200, "max_tokens": 4, "stream": i % 2 == 0}
            assert httpx.post(f"{router}/v1/completions", json=body).status_code == 200
        assert httpx.post(f"{router}/v1/completions", content=b"{not json").status_code == 400
        text = httpx.get(f"{router}/metrics").text
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        names = {family.name + suffix for suffix in _SUFFIXES[family.type]}
        labels = {label for s in family.samples for label in s.labels}
        for name in names:
            out.setdefault(name, set()).update(labels)
    assert out["pd_router_retries_total"] >= {"engine", "reason"}  # the traffic reached the paths it should
    return out


def substitute(expr: str) -> str:
    """Grafana's variables, replaced by what they expand to, so the query parses as PromQL."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it matches on or aggregates by) for every selector in ``expr``."""
    found: list[tuple[str | None, set[str]]] = []
    grouping: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, promql.VectorSelector):
            found.append((node.name, {m.name for m in node.matchers.matchers}))
        elif isinstance(node, promql.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)

    promql.walk(promql.parse(expr), visit)
    assert all(name for name, _ in found), f"a selector without a metric name in {expr}"
    # ``by`` labels belong to the selectors below them; checking them against every one is
    # stricter than needed only where one expression aggregates two different metrics.
    return [(name, labels | (grouping - {"le"})) for name, labels in found]  # type: ignore[misc]


def check(expr: str, exported: dict[str, set[str]]) -> None:
    for name, labels in selectors(expr):
        assert name in exported, f"{name} (in {expr!r}) is not exported"
        unknown = labels - exported[name] - TARGET_LABELS - {"__name__"}
        if exported[name]:  # a family without samples in this run: its labels are unknown here
            assert not unknown, f"{name} has no label {unknown} (in {expr!r})"


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert match, var["query"]
            queries.append(match.group(1))
    return queries


def test_dashboard_queries_name_only_exported_metrics(exported):
    queries = dashboard_queries()
    assert len(queries) >= 30
    for expr in queries:
        check(substitute(expr), exported)
    named = {name for expr in queries for name, _ in selectors(substitute(expr))}
    # What the dashboard promises to show.
    for metric in ("pd_router_requests_total", "pd_router_time_to_first_byte_seconds_bucket",
                   "pd_router_ttft_estimate_ratio_bucket", "pd_router_inflight_requests",
                   "pd_router_estimated_cached_prefix_ratio_sum", "pd_router_decisions_total",
                   "pd_router_retries_total", "pd_router_pd_failures_total", "pd_router_state_store_seconds_bucket",
                   "process_cpu_seconds_total"):
        assert metric in named, metric


def test_dashboard_is_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "pd-router" and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]


def test_alert_rules_parse_and_name_only_exported_metrics(exported):
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"PdRouter[A-Z][A-Za-z]+", n) for n in names)
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        check(rule["expr"], exported)
    # The failure modes the rules are there for.
    assert {"PdRouterNoInstances", "PdRouterAllInstancesEjected", "PdRouterHighErrorRatio", "PdRouterStateStoreErrors",
            "PdRouterTTFTEstimateOff"} <= set(names)


def test_an_unknown_metric_or_label_is_caught(exported):
    with pytest.raises(AssertionError, match="not exported"):
        check("rate(pd_router_request_total[5m])", exported)
    with pytest.raises(AssertionError, match="no label"):
        check('sum by (instance_id) (rate(pd_router_requests_total{outcome="ok"}[5m]))', exported)
    with pytest.raises(ValueError):
        selectors("sum(rate(pd_router_requests_total[5m])")
