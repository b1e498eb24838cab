"""Layer: discovery (beside scheduling and upstream). Instances found at run time:
Kubernetes pods by label selector, DNS records of a headless service. Each source keeps its
whole current view and hands it to a sink (``Sink``: the gateway's ``Live.sync``), which adds,
updates and removes instances.

May import: router.core, router.config. Never scheduling or upstream: it only says who is
out there; the gateway decides what that changes.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from router.config.discovery import DiscoveryConfig
from router.discovery.base import Sink


def start_sources(config: DiscoveryConfig, sink: Sink) -> dict[str, Coroutine[Any, Any, None]]:
    """The run loops of the configured sources, by name (none when discovery is off)."""
    runners: dict[str, Coroutine[Any, Any, None]] = {}
    if config.kubernetes.enabled:
        from router.discovery.kubernetes import KubernetesSource

        runners["kubernetes"] = KubernetesSource(config.kubernetes, sink).run()
    if config.dns.targets:
        from router.discovery.dns import DnsSource

        runners["dns"] = DnsSource(config.dns, sink).run()
    return runners


__all__ = ["Sink", "start_sources"]
