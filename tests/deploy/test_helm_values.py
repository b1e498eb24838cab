"""The chart's values: the schema (its ``config`` part generated from RouterConfig) rejects typos
and wrong types in `helm lint` and `helm template` alike; the example values files lint, render,
validate and give a config the router accepts; value combinations that cannot work fail with a
message; discovery gets exactly the RBAC it needs."""

from __future__ import annotations

import importlib.util
import json
import shutil

import helm_python as helm
import pytest
import yaml

from router.config.model import RouterConfig, load_config
from test_helm_chart import CHART, KUBE_VERSION, container, render, serve_args, validate_all

EXAMPLES = CHART.parent / "examples"
SCHEMA_TOOL = CHART.parent / "schema.py"


def schema_tool():
    spec = importlib.util.spec_from_file_location("chart_schema", SCHEMA_TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def lint_errors(values: dict) -> list[str]:
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    return report["errors"] + [m["error"] for m in report["messages"] if m["severity"] >= 2]


def test_config_schema_is_the_router_config_schema():
    tool = schema_tool()
    checked_in = json.loads((CHART / "values.schema.json").read_text())
    assert checked_in == tool.synced(checked_in), "values.schema.json is stale: run python deploy/helm/schema.py"
    assert tool.main(["--check"]) == 0
    config = checked_in["properties"]["config"]
    assert set(config["properties"]) == set(RouterConfig.model_fields)
    assert config["additionalProperties"] is False and checked_in["additionalProperties"] is False


def test_every_default_value_is_described_by_the_schema(chart):
    props = json.loads((CHART / "values.schema.json").read_text())["properties"]
    assert set(chart.values) <= set(props)
    assert lint_errors({}) == []


BAD_VALUES = {
    "top-level typo": ({"replicaCont": 2}, "additional properties 'replicaCont'"),
    "typo inside config": ({"config": {"polcy": {"name": "ttft"}}}, "additional properties 'polcy'"),
    "deep typo inside config": ({"config": {"policy": {"ttft": {"prefil_tokens_per_s": 9000}}}}, "prefil_tokens_per_s"),
    "typo in an instance": ({"config": {"instances": [{"url": "http://a:8000", "rol": "prefill"}]}}, "'rol'"),
    "wrong type": ({"workers": "2"}, "/workers"),
    "wrong type inside config": ({"config": {"proxy": {"retries": "many"}}}, "/config/proxy/retries"),
    "out of range inside config": ({"config": {"proxy": {"retries": 11}}}, "/config/proxy/retries"),
    # policy.name is any preset, and plugins add presets: the router itself refuses an unknown one (exit 2)
    "policy name not a name": ({"config": {"policy": {"name": "no spaces allowed"}}}, "/config/policy/name"),
    "unknown log format": ({"logFormat": "xml"}, "/logFormat"),
    "instance without url": ({"config": {"instances": [{"name": "a"}]}}, "url"),
    "typo in redis": ({"redis": {"enable": True}}, "'enable'"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_bad_values_fail_lint_and_template(chart, case):
    values, message = BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError, match="schema") as info:
        chart.render(values, name="rt")
    assert message in str(info.value)
    errors = lint_errors(values)
    assert errors and any(message in e for e in errors)


REFUSED = {
    "workers without shared state": ({"workers": 2}, "workers=2 needs state.backend=redis"),
    "two Redis": ({"redis": {"enabled": True, "url": "redis://r:6379/0"}}, "not both"),
    "password in redis.url": ({"redis": {"url": "redis://:hunter2@r:6379/0"}}, "redis.url carries a password"),
    "password in the ConfigMap": (
        {"config": {"state": {"backend": "redis", "redis_url": "redis://u:hunter2@r:6379/0"}}},
        "config.state.redis_url carries a password",
    ),
    "password secret without a URL": ({"redis": {"auth": {"existingSecret": "s"}}}, "needs redis.url or redis.enabled"),
    "preStop longer than the grace period": (
        {"terminationGracePeriodSeconds": 10, "preStopSleepSeconds": 10}, "shorter than terminationGracePeriodSeconds",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_combinations_that_cannot_work_are_refused(chart, case):
    values, message = REFUSED[case]
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(values, name="rt")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_values_lint_render_and_load(chart, path, tmp_path, monkeypatch):
    values = yaml.safe_load(path.read_text())
    assert lint_errors(values) == []
    objs = render(chart, values)
    validate_all(objs)
    c = container(objs)
    args = serve_args(c)
    assert args.workers == values["workers"] and objs["Deployment"][0]["spec"]["replicas"] == values["replicaCount"]
    for key in [k for k in __import__("os").environ if k.startswith("PD_ROUTER_")]:
        monkeypatch.delenv(key)
    for item in c.get("env", []):
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    config_file = tmp_path / "config.yaml"
    config_file.write_text(objs["ConfigMap"][0]["data"]["config.yaml"])
    cfg = load_config(config_file)
    assert cfg.state.backend == "redis"
    roles = sorted(i.role for i in cfg.instances)
    flavor = {i.flavor for i in cfg.instances}
    if path.stem == "vllm-4p4d":
        assert roles == ["decode"] * 4 + ["prefill"] * 4 and flavor == {"vllm"}
        assert "StatefulSet" in objs and "NetworkPolicy" in objs
    else:
        assert flavor == {"sglang"} and all(i.bootstrap_port for i in cfg.instances if i.role == "prefill")
        assert "PDR_REDIS_PASSWORD" in cfg.state.redis_url  # expanded by the kubelet, never written down
        assert "StatefulSet" not in objs


def test_in_chart_redis_is_reachable_only_by_the_router(chart):
    objs = render(chart, {"redis": {"enabled": True, "auth": {"existingSecret": "redis-auth"}}})
    validate_all(objs)
    [sts] = objs["StatefulSet"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    router_selector = objs["Deployment"][0]["spec"]["selector"]["matchLabels"]
    # The router's Service (and a ServiceMonitor) must not select the Redis pod or Service.
    assert not router_selector.items() <= pod_labels.items()
    services = {s["metadata"]["name"]: s for s in objs["Service"]}
    assert not router_selector.items() <= services["rt-pd-router-redis"]["metadata"]["labels"].items()
    assert services["rt-pd-router-redis"]["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    [policy] = objs["NetworkPolicy"]
    assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == router_selector
    redis = sts["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert redis["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "redis-auth"
    url = {e["name"]: e for e in container(objs)["env"]}["PD_ROUTER_STATE__REDIS_URL"]["value"]
    assert url == "redis://:$(PDR_REDIS_PASSWORD)@rt-pd-router-redis:6379/0"


DISCOVERY = {
    "enabled": True,
    "namespace": "engines",
    "selectors": {"prefill": {"app": "vllm", "pd-role": "prefill"}, "decode": {"app": "vllm", "pd-role": "decode"}},
}


@pytest.fixture(scope="module")
def discovery_chart(tmp_path_factory):
    """The chart as it is when RouterConfig has ``discovery``; without it (a tree where the
    discovery config has not landed), a copy without the schema, so the templates are still tested."""
    if "discovery" in RouterConfig.model_fields:
        with helm.Chart.load(CHART) as loaded:
            yield loaded
        return
    copy = tmp_path_factory.mktemp("chart") / "pd-router"
    shutil.copytree(CHART, copy)
    (copy / "values.schema.json").unlink()
    with helm.Chart.load(copy) as loaded:
        yield loaded


def test_discovery_gets_read_only_pod_access_in_its_namespace(discovery_chart):
    objs = render(discovery_chart, {"config": {"discovery": {"kubernetes": DISCOVERY}}})
    validate_all(objs)
    [role], [binding] = objs["Role"], objs["RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "engines"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rt-pd-router", "namespace": "llm"}]
    assert objs["Deployment"][0]["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert objs["ServiceAccount"][0]["automountServiceAccountToken"] is True
    assert yaml.safe_load(objs["ConfigMap"][0]["data"]["config.yaml"])["discovery"]["kubernetes"] == DISCOVERY

    same_namespace = render(discovery_chart, {"config": {"discovery": {"kubernetes": {**DISCOVERY, "namespace": None}}}})
    assert same_namespace["Role"][0]["metadata"]["namespace"] == "llm"
    off = render(discovery_chart, {"config": {"discovery": {"kubernetes": {**DISCOVERY, "enabled": False}}}})
    assert "Role" not in off and "RoleBinding" not in off
