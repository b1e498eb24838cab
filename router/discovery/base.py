"""What every discovery source shares: the sink it reports to, instance building, backoff."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from router.config.discovery import DiscoveryRole, InstanceDefaults
from router.config.model import InstanceConfig

# (source name, that source's whole current set of instances) -> applied; the result is unused here.
Sink = Callable[[str, Sequence[InstanceConfig]], Awaitable[Any]]


def host_url(address: str, port: int) -> str:
    """``http://address:port``, bracketing an IPv6 address."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def build_instance(address: str, role: DiscoveryRole, defaults: InstanceDefaults, *, name: str | None = None,
                   overrides: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> InstanceConfig:
    """An instance at ``address`` from ``defaults``, with ``overrides`` (validated field values) on top."""
    fields: dict[str, Any] = defaults.model_dump()
    fields.update(overrides or {})
    port = fields.pop("port")
    return InstanceConfig(url=host_url(address, port), role=role, name=name, labels=labels or {}, **fields)


class Backoff:
    """Exponential backoff with full jitter, so replicas that lost the API server together
    do not come back together."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self._initial = initial_s
        self._max = max(max_s, initial_s)
        self._rng = rng or random.Random()
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self._max, self._initial * (2 ** self._attempt))
        self._attempt += 1
        return self._initial / 2 + self._rng.uniform(0, ceiling - self._initial / 2)

    def reset(self) -> None:
        self._attempt = 0
