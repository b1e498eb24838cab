"""Pods by label selector, one list+watch per role, through lightkube.

Each role's loop lists the matching pods (that list's resourceVersion is where the watch
starts), then follows the watch. A watch that breaks (410 Gone: the version was
compacted away; a dropped connection; an API server restart) is followed by a fresh
list after a jittered exponential backoff, and the list replaces the role's whole view,
so nothing missed during the gap survives. A watch the server ends cleanly (its timeout)
is resumed by lightkube from the last version seen.

Auth in the cluster: the service account's token (re-read on 401, as bound tokens
rotate) and CA, the API server from KUBERNETES_SERVICE_HOST/PORT; ``api_server`` points
elsewhere without auth (``kubectl proxy``, tests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.resources.core_v1 import Pod

from router.config.discovery import DiscoveryRole, KubernetesDiscoveryConfig
from router.config.model import InstanceConfig
from router.discovery.base import Backoff, Sink
from router.discovery.pods import PodConfigError, is_serving, pod_instance

log = logging.getLogger(__name__)

SOURCE = "kubernetes"


def client_config(config: KubernetesDiscoveryConfig) -> KubeConfig:
    """Where the API server is and how to authenticate (lightkube raises ConfigError/KeyError
    when there is no service account or KUBERNETES_SERVICE_HOST)."""
    if config.api_server:
        return KubeConfig.from_one(cluster=Cluster(server=config.api_server), user=User(),
                                   namespace=config.namespace or "default")
    return KubeConfig.from_service_account(config.service_account_dir)


def namespace_of(config: KubernetesDiscoveryConfig) -> str:
    if config.namespace:
        return config.namespace
    try:
        return (Path(config.service_account_dir) / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


class KubernetesSource:
    def __init__(self, config: KubernetesDiscoveryConfig, sink: Sink) -> None:
        self._config = config
        self._sink = sink
        self._views: dict[DiscoveryRole, dict[str, InstanceConfig]] = {role: {} for role in config.selectors}
        self._published: list[InstanceConfig] | None = None
        self._complained: dict[str, str] = {}  # pod -> last problem logged (once per distinct problem)
        self.relists = 0  # lists after the first, per role, counted for tests and logs

    async def run(self) -> None:
        if not self._config.selectors:
            log.warning("kubernetes discovery is on but has no selectors: no pod will be found")
            return
        backoff = Backoff(self._config.backoff_initial_s, self._config.backoff_max_s)
        while True:
            try:
                kube = await asyncio.to_thread(client_config, self._config)  # reads the token and CA files
                namespace = await asyncio.to_thread(namespace_of, self._config)
                client = AsyncClient(config=kube, namespace=namespace, trust_env=False,
                                     timeout=httpx2.Timeout(self._config.request_timeout_s))
            except Exception as exc:  # noqa: BLE001 - lightkube raises ConfigError, KeyError, OSError
                log.error("kubernetes discovery cannot start (%s: %s); retrying", type(exc).__name__, exc)
                await asyncio.sleep(backoff.next())
                continue
            log.info("kubernetes discovery: watching pods in %s (%s)", namespace,
                     "; ".join(f"{r}: {s}" for r, s in self._config.selectors.items()))
            try:
                await asyncio.gather(*(self._follow(client, namespace, role, selector)
                                       for role, selector in self._config.selectors.items()))
            finally:
                await client.close()

    async def _follow(self, client: AsyncClient, namespace: str, role: DiscoveryRole, selector: dict[str, str]) -> None:
        """List, then watch, forever; relist after any break."""
        backoff = Backoff(self._config.backoff_initial_s, self._config.backoff_max_s)
        first = True
        while True:
            started = time.monotonic()
            try:
                labels: dict[str, Any] = dict(selector)
                listing = client.list(Pod, namespace=namespace, labels=labels)
                view: dict[str, InstanceConfig] = {}
                async for pod in listing:
                    self._admit(view, pod, role)
                version = listing.resourceVersion
                if not first:
                    self.relists += 1
                first = False
                self._views[role] = view
                await self._publish()
                async for kind, pod in client.watch(Pod, namespace=namespace, labels=labels, resource_version=version):
                    self._event(role, kind, pod)
                    await self._publish()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any break (410, transport, decode) means relist
                if time.monotonic() - started > self._config.backoff_max_s:
                    backoff.reset()  # it ran long enough: a fresh break, not a failing loop
                delay = backoff.next()
                log.warning("kubernetes watch of %s pods broke (%s: %s); relisting in %.1fs",
                            role, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)

    def _admit(self, view: dict[str, InstanceConfig], pod: Pod, role: DiscoveryRole) -> None:
        name = pod.metadata.name if pod.metadata else None
        if not name:
            return
        view.pop(name, None)
        if not is_serving(pod):
            return
        try:
            view[name] = pod_instance(pod, role, self._config.defaults)
            self._complained.pop(name, None)
        except PodConfigError as exc:
            if self._complained.get(name) != str(exc):
                self._complained[name] = str(exc)
                log.warning("skipping %s", exc)

    def _event(self, role: DiscoveryRole, kind: str, pod: Pod) -> None:
        view = self._views[role]
        if kind == "DELETED":
            if pod.metadata and pod.metadata.name:
                view.pop(pod.metadata.name, None)
                self._complained.pop(pod.metadata.name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._admit(view, pod, role)

    async def _publish(self) -> None:
        current = [ic for view in self._views.values() for ic in view.values()]
        if current != self._published:
            self._published = current
            await self._sink(SOURCE, current)
