"""The Helm chart in deploy/helm/pd-router: lint, render offline, validate every manifest
against the Kubernetes schemas, and check that the rendered config.yaml and container
arguments are ones the router accepts. helm_python drives Helm's Go SDK in-process: no helm
binary, no cluster. Values files and the values schema: test_helm_values.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from router.cli import build_parser
from router.config.model import load_config

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "pd-router"
# The oldest release Chart.yaml's kubeVersion admits and the newest kubernetes_validate knows.
KUBE_VERSIONS = ("1.25", "1.37")
KUBE_VERSION = KUBE_VERSIONS[-1]
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
    "in-chart-redis-workers": {"redis": {"enabled": True}, "workers": 3, "replicaCount": 2, "logFormat": "text"},
    "external-redis-password-secret": {
        "redis": {"url": "rediss://redis.infra.svc:6380/2", "auth": {"existingSecret": "redis-auth", "username": "router"}},
        "workers": 2,
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


def validate_all(objs: dict[str, list[dict]]) -> None:
    for items in objs.values():
        for obj in items:
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # a CRD: kubernetes_validate ships no schema for it
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)


def serve_args(c: dict):
    """The container's arguments as the router's own command line parses them."""
    args = build_parser().parse_args(c["args"])
    assert args.command == "serve"
    return args


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

    validate_all(objs)

    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= objs.keys()
    assert ("Secret" in objs) == bool(values.get("adminToken"))
    assert ("HorizontalPodAutoscaler" in objs) == ("autoscaling" in values)
    assert ("PodDisruptionBudget" in objs) == ("podDisruptionBudget" in values)
    assert ("ServiceMonitor" in objs) == ("serviceMonitor" in values)

    deploy = objs["Deployment"][0]
    pod = deploy["spec"]["template"]
    c = container(objs)
    args = serve_args(c)
    assert (args.config, args.host, args.port) == ("/etc/pd-router/config.yaml", "0.0.0.0", 8080)
    assert args.workers == values.get("workers", 1) and args.log_format == values.get("logFormat", "json")
    # SIGTERM drain: the grace period, less the preStop sleep, less a margin before SIGKILL.
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert args.shutdown_timeout == 60 - 5 - 5 == pod["spec"]["terminationGracePeriodSeconds"] - 10
    assert c["startupProbe"]["httpGet"]["path"] == c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert pod["spec"]["automountServiceAccountToken"] is False  # no discovery: no API token
    assert "Role" not in objs and "RoleBinding" not in objs
    assert ("StatefulSet" in objs) == values.get("redis", {}).get("enabled", False)
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
    auth = values.get("redis", {}).get("auth", {})
    if auth:  # the password comes from the Secret; the URL only names the variable
        assert env["PDR_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": auth["existingSecret"], "key": "redis-password"}
        assert list(env).index("PDR_REDIS_PASSWORD") < list(env).index("PD_ROUTER_STATE__REDIS_URL")
        assert env["PD_ROUTER_STATE__REDIS_URL"]["value"] == "rediss://router:$(PDR_REDIS_PASSWORD)@redis.infra.svc:6380/2"

    # The router must accept the ConfigMap's config.yaml, with the pod's plain env applied.
    config_file = tmp_path / "config.yaml"
    config_file.write_text(objs["ConfigMap"][0]["data"]["config.yaml"])
    for key in [k for k in os.environ if k.startswith("PD_ROUTER_")]:
        monkeypatch.delenv(key)
    for key, item in env.items():
        if "value" in item:
            monkeypatch.setenv(key, item["value"])
    cfg = load_config(config_file)

    if values.get("redis", {}).get("enabled"):
        assert cfg.state.backend == "redis" and cfg.state.redis_url == "redis://rt-pd-router-redis:6379/0"
    elif "redis" in values:
        assert cfg.state.backend == "redis"
        assert cfg.state.redis_url == env["PD_ROUTER_STATE__REDIS_URL"]["value"]
        assert "PDR_REDIS_PASSWORD" in cfg.state.redis_url or cfg.state.redis_url == values["redis"]["url"]
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
    # With live reload the pods stay up and read the updated ConfigMap themselves.
    live = render(chart, {"rollOnConfigChange": False})["Deployment"][0]["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" not in live and live["prometheus.io/scrape"] == "true"
