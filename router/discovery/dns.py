"""Instances from DNS: the A/AAAA records of a headless service (one per Ready pod), or its
SRV records (port per record). Needs no Kubernetes RBAC, works outside Kubernetes too.

Each round resolves every target; a name that does not exist or has no records means no
instances behind it, while a resolver that does not answer (timeout, no nameserver)
keeps that target's last known instances rather than emptying the cluster on a blip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from router.config.discovery import DnsDiscoveryConfig, DnsTarget
from router.config.model import InstanceConfig
from router.discovery.base import Sink, build_instance

log = logging.getLogger(__name__)

SOURCE = "dns"
_ABSENT = (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer)


def make_resolver(config: DnsDiscoveryConfig) -> dns.asyncresolver.Resolver:
    """The system's resolver, or one asking only ``config.nameservers`` (host or host:port)."""
    if not config.nameservers:
        resolver = dns.asyncresolver.Resolver()  # reads /etc/resolv.conf
    else:
        resolver = dns.asyncresolver.Resolver(configure=False)
        servers: list[dns.nameserver.Nameserver] = []
        for entry in config.nameservers:
            host, _, port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "53")
            servers.append(dns.nameserver.Do53Nameserver(host or entry, int(port or 53)))
        resolver.nameservers = servers
    resolver.lifetime = config.timeout_s
    resolver.timeout = config.timeout_s
    return resolver


class DnsSource:
    def __init__(self, config: DnsDiscoveryConfig, sink: Sink, resolver: dns.asyncresolver.Resolver | None = None) -> None:
        self._config = config
        self._sink = sink
        self._resolver = resolver
        self._known: dict[int, list[InstanceConfig]] = {}  # target index -> last resolved instances
        self._published: list[InstanceConfig] | None = None

    async def run(self) -> None:
        if self._resolver is None:
            self._resolver = await asyncio.to_thread(make_resolver, self._config)
        while True:
            await self.resolve_all()
            await asyncio.sleep(self._config.interval_s)

    async def resolve_all(self) -> list[InstanceConfig]:
        """One round: resolve every target, publish the union if it changed."""
        assert self._resolver is not None
        for index, target in enumerate(self._config.targets):
            try:
                self._known[index] = await self._resolve(target)
            except _ABSENT:
                self._known[index] = []
            except dns.exception.DNSException as exc:
                log.warning("dns discovery of %s failed (%s), keeping its %d known instance(s)",
                            target.name, type(exc).__name__, len(self._known.get(index, [])))
        current = [ic for index in range(len(self._config.targets)) for ic in self._known.get(index, [])]
        if current != self._published:
            self._published = current
            await self._sink(SOURCE, current)
        return current

    async def _resolve(self, target: DnsTarget) -> list[InstanceConfig]:
        assert self._resolver is not None
        if not target.srv:
            addresses = await self._addresses(target.name)
            return [build_instance(a, target.role, target.defaults) for a in addresses]
        answer = await self._resolver.resolve(target.name, "SRV")
        glue: dict[str, list[str]] = {}
        for rrset in answer.response.additional:  # servers usually send the targets' addresses along
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                glue.setdefault(rrset.name.to_text(), []).extend(r.address for r in rrset)
        found: list[InstanceConfig] = []
        for record in sorted(answer, key=lambda r: (r.priority, -r.weight, r.target.to_text(), r.port)):
            host = record.target.to_text()
            try:
                addresses = glue.get(host) or await self._addresses(host)
            except _ABSENT:
                continue
            found.extend(build_instance(a, target.role, target.defaults, overrides={"port": record.port}) for a in addresses)
        return _unique(found)

    async def _addresses(self, name: str) -> list[str]:
        """A and AAAA addresses of ``name``; raises NXDOMAIN/NoAnswer when there are none."""
        assert self._resolver is not None
        addresses: list[str] = []
        missing: Exception | None = None
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(name, rdtype)
                addresses.extend(r.address for r in answer)
            except _ABSENT as exc:
                missing = exc
        if not addresses and missing is not None:
            raise missing
        return sorted(set(addresses))


def _unique(instances: Sequence[InstanceConfig]) -> list[InstanceConfig]:
    seen: dict[str, InstanceConfig] = {}
    for ic in instances:
        seen.setdefault(ic.id, ic)
    return list(seen.values())
