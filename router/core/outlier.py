"""Passive outlier detection: what proxied traffic says about an instance, kept apart from the
active health checks (router/core/health.py) so that neither resets the other.

Why apart: an engine whose ``/health`` answers 503 while it still serves must be taken out by
the checks even though its requests succeed, and an engine that passes every check but drops
every stream after a few tokens must be taken out by the traffic. Envoy's model: consecutive
gateway failures (resets, timeouts, mid-stream deaths, 5xx other than a busy 503; never 4xx
or 429) eject the instance for a time that grows with each ejection; a cap on the ejected
share keeps a cluster-wide fault from ejecting everyone; when the time is up the instance is
half-open: its next request decides, a failure ejects it again at once, for longer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from router.config.model import HealthConfig

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outlier:
    """One instance's passive record."""

    failures: int = 0  # consecutive failures seen while proxying
    ejections: int = 0  # how many times in a row it was ejected (the ejection time grows with it)
    ejected_until: float = 0.0  # monotonic time; 0 = not ejected
    half_open: bool = False  # back from an ejection: the next failure ejects again

    def ejected(self, now: float | None = None) -> bool:
        return self.ejected_until > (time.monotonic() if now is None else now)


def eject_for(config: HealthConfig, ejections: int) -> float:
    """Seconds of the ``ejections``-th ejection in a row: base x count, capped."""
    return min(config.outlier_max_ejection_s, config.outlier_base_ejection_s * max(1, ejections))


def on_failure(record: Outlier, instance: str, config: HealthConfig, ejected_share: float, *, fatal: bool = False) -> bool:
    """Count one failure; True when it ejected the instance. ``ejected_share``: the share of the
    pool that would be ejected with this one, checked against the cap."""
    now = time.monotonic()
    if record.ejected(now):
        return False
    if record.ejected_until:  # its ejection ran out: it is half-open until it succeeds
        record.half_open, record.ejected_until = True, 0.0
    record.failures += 1
    if not (fatal or record.half_open or record.failures >= config.outlier_failures):
        return False
    if ejected_share > config.outlier_max_ejected_percent / 100:
        log.warning("instance %s not ejected after %d failure(s): %.0f%% of the pool would be, above the cap",
                    instance, record.failures, ejected_share * 100)
        return False
    record.ejections += 1
    seconds = eject_for(config, record.ejections)
    record.ejected_until, record.failures, record.half_open = now + seconds, 0, False
    log.warning("instance %s ejected for %.1fs (ejection %d in a row)", instance, seconds, record.ejections)
    return True


def on_success(record: Outlier, instance: str) -> None:
    """A request relayed to its end: the consecutive count starts over, a half-open instance is back."""
    record.failures = 0
    if record.ejected_until and not record.ejected():
        record.ejected_until = 0.0
        record.half_open = True
    if record.half_open:
        record.half_open, record.ejections = False, 0
        log.info("instance %s is back from its ejection", instance)
