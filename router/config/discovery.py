"""Config sections for instances found at run time (Kubernetes pods, DNS records) and for
reloading the config while the router runs. Kept apart from model.py, which only names them.

The annotation names a discovered pod may carry are listed in ``POD_ANNOTATIONS``; the
README documents the same table.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The same literals as router.config.model's Role and Flavor (model.py imports this module,
# so this one cannot import it); tests/config check that they agree.
DiscoveryRole = Literal["prefill", "decode", "mixed"]
EngineFlavor = Literal["vllm", "sglang"]

ANNOTATION_PREFIX = "pd-router.io/"
# Annotation (or label) suffix -> the instance field it sets; a pod's value wins over the defaults.
POD_ANNOTATIONS: dict[str, str] = {
    "port": "engine HTTP port",
    "bootstrap-port": "SGLang bootstrap port (PD handoff)",
    "flavor": "vllm or sglang",
    "model": "served model name",
    "cache-tokens": "KV cache capacity in tokens",
    "prefill-tokens-per-s": "prefill rate",
    "kv-dtype": "KV cache dtype",
    "block-size": "engine KV block size in tokens",
    "kv-bytes-per-token": "KV bytes per token",
    "zone": "topology zone (the node comes from spec.nodeName)",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InstanceDefaults(_Strict):
    """What a discovered instance is when its pod (or DNS record) does not say otherwise."""

    port: int = Field(default=8000, ge=1, le=65535, description="engine HTTP port (pod annotation pd-router.io/port)")
    flavor: EngineFlavor = Field(default="vllm", description="engine protocol: vllm or sglang (pd-router.io/flavor)")
    model: str | None = Field(default=None, description="served model; None = any (pd-router.io/model)")
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535,
                                       description="SGLang bootstrap port (pd-router.io/bootstrap-port)")
    cache_tokens: int = Field(default=500_000, gt=0, description="KV cache capacity in tokens (pd-router.io/cache-tokens)")
    prefill_tokens_per_s: float | None = Field(default=None, gt=0,
                                               description="prefill rate; None = policy.ttft default (pd-router.io/prefill-tokens-per-s)")
    kv_dtype: str = Field(default="auto", description="KV cache dtype; P and D must agree (pd-router.io/kv-dtype)")
    block_size: int = Field(default=16, ge=1, description="engine KV block size in tokens (pd-router.io/block-size)")
    kv_bytes_per_token: int | None = Field(default=None, gt=0,
                                           description="KV bytes per token; None = pd.kv_bytes_per_token (pd-router.io/kv-bytes-per-token)")


class KubernetesDiscoveryConfig(_Strict):
    """List and watch pods by label selector, one selector per role (needs get/list/watch on pods)."""

    enabled: bool = Field(default=False, description="watch pods in the namespace and route to the Ready ones")
    namespace: str | None = Field(default=None, description="namespace to watch; None = the service account's own namespace")
    selectors: dict[DiscoveryRole, dict[str, str]] = Field(
        default_factory=dict,
        description="role -> pod labels that must all match (matchLabels), e.g. {prefill: {app: vllm, pd-role: prefill}}",
    )
    defaults: InstanceDefaults = Field(default_factory=InstanceDefaults, description="instance fields a pod does not set")
    api_server: str | None = Field(
        default=None,
        description="API server URL; None = in cluster (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT "
                    "with the service account's token and CA)",
    )
    service_account_dir: str = Field(default="/var/run/secrets/kubernetes.io/serviceaccount",
                                     description="where the service account's token, ca.crt and namespace files are")
    backoff_initial_s: float = Field(default=1.0, gt=0, description="first wait before relisting after a broken watch")
    backoff_max_s: float = Field(default=30.0, gt=0, description="longest wait between relist attempts")
    request_timeout_s: float = Field(default=10.0, gt=0, description="timeout of a list call (a watch waits without one)")


class DnsTarget(_Strict):
    """One headless service whose records are the instances of one role."""

    name: str = Field(min_length=1, description="DNS name: A/AAAA records (or, with srv, the SRV name such as _http._tcp.svc.ns.svc.cluster.local)")
    role: DiscoveryRole = Field(default="mixed", description="role of every instance behind this name")
    srv: bool = Field(default=False, description="look up SRV records (port from each record) instead of A/AAAA + defaults.port")
    defaults: InstanceDefaults = Field(default_factory=InstanceDefaults, description="instance fields of these instances")


class DnsDiscoveryConfig(_Strict):
    """Resolve headless services periodically; needs no RBAC (a headless service's records
    list only its Ready pods unless publishNotReadyAddresses is set)."""

    targets: list[DnsTarget] = Field(default_factory=list, description="names to resolve; empty = DNS discovery off")
    interval_s: float = Field(default=10.0, gt=0, description="seconds between resolutions")
    timeout_s: float = Field(default=2.0, gt=0, description="timeout of one resolution")
    nameservers: list[str] = Field(default_factory=list,
                                   description="resolver addresses as host or host:port; empty = the system's (/etc/resolv.conf)")


class DiscoveryConfig(_Strict):
    """Instances found at run time, next to (or instead of) the static ``instances`` list."""

    kubernetes: KubernetesDiscoveryConfig = Field(default_factory=KubernetesDiscoveryConfig,
                                                  description="pods found through the Kubernetes API")
    dns: DnsDiscoveryConfig = Field(default_factory=DnsDiscoveryConfig, description="instances found through DNS")

    @property
    def enabled(self) -> bool:
        return self.kubernetes.enabled or bool(self.dns.targets)


class ReloadConfig(_Strict):
    """Live configuration from the file the router was started with."""

    watch_file: bool = Field(default=True, description="reload when the config file changes (a ConfigMap update swaps a symlink)")
    poll_interval_s: float = Field(default=2.0, gt=0, description="how often the file's inode, size and mtime are compared")
