"""A pod as an instance: Ready, with an IP, not terminating; port, bootstrap port, flavor,
model and capacity from ``pd-router.io/*`` annotations (or labels), else the defaults."""

from __future__ import annotations

from typing import Any

from lightkube.resources.core_v1 import Pod
from pydantic import TypeAdapter, ValidationError

from router.config.discovery import ANNOTATION_PREFIX, DiscoveryRole, InstanceDefaults
from router.config.model import InstanceConfig
from router.discovery.base import build_instance

# annotation suffix -> InstanceDefaults field
_FIELDS = {
    "port": "port",
    "bootstrap-port": "bootstrap_port",
    "flavor": "flavor",
    "model": "model",
    "cache-tokens": "cache_tokens",
    "prefill-tokens-per-s": "prefill_tokens_per_s",
    "kv-dtype": "kv_dtype",
    "block-size": "block_size",
    "kv-bytes-per-token": "kv_bytes_per_token",
}


class PodConfigError(ValueError):
    """A pod's annotations do not describe a usable instance; the message says which one."""


def is_serving(pod: Pod) -> bool:
    """Ready, has an IP, and not being deleted (a terminating pod finishes what it has)."""
    if pod.metadata is None or pod.metadata.deletionTimestamp is not None:
        return False
    status = pod.status
    if status is None or not status.podIP:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())


def _pod_value(pod: Pod, key: str) -> str | None:
    meta = pod.metadata
    if meta is None:
        return None
    for source in (meta.annotations, meta.labels):
        if source and ANNOTATION_PREFIX + key in source:
            return str(source[ANNOTATION_PREFIX + key])
    return None


def pod_instance(pod: Pod, role: DiscoveryRole, defaults: InstanceDefaults) -> InstanceConfig:
    """The instance ``pod`` serves as (``is_serving`` must hold); PodConfigError when an
    annotation has a value the field does not accept."""
    assert pod.metadata is not None and pod.status is not None and pod.status.podIP
    overrides: dict[str, Any] = {}
    for key, field in _FIELDS.items():
        raw = _pod_value(pod, key)
        if raw is None:
            continue
        annotation: Any = InstanceDefaults.model_fields[field].annotation
        try:
            overrides[field] = TypeAdapter(annotation).validate_strings(raw) if raw != "" else None
            InstanceDefaults.model_validate({**defaults.model_dump(), field: overrides[field]})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            raise PodConfigError(f"pod {pod.metadata.name}: annotation {ANNOTATION_PREFIX}{key}={raw!r}: {msg}") from None
    labels = {}
    if pod.spec is not None and pod.spec.nodeName:
        labels["node"] = pod.spec.nodeName
    zone = _pod_value(pod, "zone")
    if zone:
        labels["zone"] = zone
    try:
        return build_instance(pod.status.podIP, role, defaults, name=pod.metadata.name, overrides=overrides, labels=labels)
    except ValidationError as exc:
        raise PodConfigError(f"pod {pod.metadata.name}: {exc.errors()[0]['msg']}") from None
