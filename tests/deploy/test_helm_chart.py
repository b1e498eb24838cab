"""The Helm chart in deploy/helm/pd-router: lint, render offline, validate every manifest
against the Kubernetes 1.30 schemas, and check that the rendered config.yaml is one the
router accepts. helm_python drives Helm's Go SDK in-process: no helm binary, no cluster.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from router.config.model import load_config

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "pd-router"
KUBE_VERSION = "1.30"
REDIS = {"redis": {"url": "redis://redis.infra.svc:6379/0"}}
INSTANCES = [
    {"name": "prefill-0", "url": "http://vllm-prefill-0.vllm:8000", "role": "prefill"},
    {"name": "decode-0", "url": "http://vllm-decode-0.vllm:8000", "role": "decode", "flavor": "vllm"},
]

SCENARIOS = {
    "defaults": {},
    "redis-3-replicas-admin": {**REDIS, "replicaCount": 3, "adminToken": "s3cret"},
    "hpa-pdb-servicemonitor": {
        **REDIS,
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8},
        "podDisruptionBudget": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    },
    "instances-existing-secret": {
        "config": {"instances": INSTANCES, "policy": {"name": "cache_aware"}},
        "existingSecret": "router-admin",
        "extraEnv": [{"name": "PD_ROUTER_HEALTH__INTERVAL_S", "value": "2.5"}],
    },
}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart, values: dict) -> dict[str, list[dict]]:
    """Render with ``values``; returns {kind: [objects]} for every YAML manifest."""
    out: dict[str, list[dict]] = {}
    for path, text in chart.render(values, name="rt", namespace="llm", is_install=True).items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.setdefault(doc["kind"], []).append(doc)
    return out


def container(objs) -> dict:
    return objs["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]


def config_checksum(chart, values: dict) -> str:
    return render(chart, values)["Deployment"][0]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_chart_metadata(chart):
    assert chart.metadata["apiVersion"] == "v2"
    assert chart.name == "pd-router"
    assert chart.values["config"]["state"]["backend"] == "memory"


@pytest.mark.parametrize("values", [{}, SCENARIOS["hpa-pdb-servicemonitor"]], ids=["defaults", "redis-hpa"])
def test_lint_is_clean(values):
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", SCENARIOS)
def test_render_validates_and_config_loads(chart, name, tmp_path, monkeypatch):
    values = SCENARIOS[name]
    objs = render(chart, values)

    for kind, items in objs.items():
        for obj in items:
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # a CRD: kubernetes_validate ships no schema for it
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)

    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= objs.keys()
    assert ("Secret" in objs) == bool(values.get("adminToken"))
    assert ("HorizontalPodAutoscaler" in objs) == ("autoscaling" in values)
    assert ("PodDisruptionBudget" in objs) == ("podDisruptionBudget" in values)
    assert ("ServiceMonitor" in objs) == ("serviceMonitor" in values)

    deploy = objs["Deployment"][0]
    pod = deploy["spec"]["template"]
    c = container(objs)
    assert c["args"] == ["serve", "--config", "/etc/pd-router/config.yaml", "--host", "0.0.0.0", "--port", "8080"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["checksum/config"]
    if "autoscaling" in values:
        assert "replicas" not in deploy["spec"]
    else:
        assert deploy["spec"]["replicas"] == values.get("replicaCount", 1)

    env = {e["name"]: e for e in c.get("env", [])}
    secret_name = values.get("existingSecret") or ("rt-pd-router" if values.get("adminToken") else None)
    if secret_name:
        ref = env["PD_ROUTER_SERVER__ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret_name, "key": "admin-token"}
    else:
        assert "PD_ROUTER_SERVER__ADMIN_TOKEN" not in env
    if "Secret" in objs:
        assert objs["Secret"][0]["data"]["admin-token"]  # base64 of the token

    # The router must accept the ConfigMap's config.yaml, with the pod's plain env applied.
    config_file = tmp_path / "config.yaml"
    config_file.write_text(objs["ConfigMap"][0]["data"]["config.yaml"])
    for key in [k for k in os.environ if k.startswith("PD_ROUTER_")]:
        monkeypatch.delenv(key)
    for key, item in env.items():
        if "value" in item:
            monkeypatch.setenv(key, item["value"])
    cfg = load_config(config_file)

    if "redis" in values:
        assert cfg.state.backend == "redis"
        assert cfg.state.redis_url == values["redis"]["url"]
    else:
        assert cfg.state.backend == "memory"
    user_config = values.get("config", {})
    assert [i.url for i in cfg.instances] == [i["url"] for i in user_config.get("instances", [])]
    assert cfg.policy.name == user_config.get("policy", {}).get("name", "ttft")
    if "extraEnv" in values:
        assert cfg.health.interval_s == 2.5


def test_configmap_is_the_config_value(chart):
    # User values are merged over the chart's defaults, then written out unchanged.
    objs = render(chart, {"config": {"instances": INSTANCES, "proxy": {"retries": 4}}})
    assert yaml.safe_load(objs["ConfigMap"][0]["data"]["config.yaml"]) == {
        "instances": INSTANCES,
        "proxy": {"retries": 4},
        "policy": {"name": "ttft"},
        "state": {"backend": "memory"},
    }


@pytest.mark.parametrize(
    "values",
    [{"replicaCount": 3}, {"autoscaling": {"enabled": True, "maxReplicas": 4}}],
    ids=["replicas", "hpa"],
)
def test_memory_backend_with_replicas_fails(chart, values):
    with pytest.raises(helm.HelmRenderError, match="would not share routing state"):
        chart.render(values, name="rt")
    # The explicit override accepts independent replicas.
    objs = render(chart, {**values, "allowMemoryStateWithReplicas": True})
    assert "Deployment" in objs


def test_redis_backend_needs_a_url(chart):
    with pytest.raises(helm.HelmRenderError, match="needs a Redis URL"):
        chart.render({"config": {"state": {"backend": "redis"}}}, name="rt")
    url = {"config": {"state": {"backend": "redis", "redis_url": "redis://r:6379/1"}}, "replicaCount": 2}
    assert render(chart, url)["Deployment"][0]["spec"]["replicas"] == 2


def test_config_checksum_rolls_pods_only_on_config_change(chart):
    base = config_checksum(chart, {})
    assert config_checksum(chart, {"replicaCount": 1, "adminToken": "x"}) == base
    assert config_checksum(chart, {"config": {"policy": {"name": "cache_aware"}}}) != base
    assert config_checksum(chart, REDIS) != base  # backend flips to redis in config.yaml
    data = render(chart, {})["ConfigMap"][0]["data"]["config.yaml"]
    assert base == hashlib.sha256(data.rstrip("\n").encode()).hexdigest()
