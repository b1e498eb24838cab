"""The instances the router knows (from config only: it never contacts anything else)
and their health, kept by active checks and by failures seen while proxying."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from router.config.model import InstanceConfig, RouterConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """Static (and calibrated) facts about an instance that scorers may use."""

    id: str
    cache_tokens: int = 500_000
    prefill_tokens_per_s: float | None = None
    role: str = "mixed"
    compat: tuple = ()
    node: str | None = None
    zone: str | None = None
    kv_bytes_per_token: int | None = None
    standalone: bool = True  # can serve a request without a remote prefill (SGLang decode workers cannot)


@dataclass
class Instance:
    config: InstanceConfig
    candidate: Candidate
    healthy: bool = True
    failures: int = 0
    successes: int = 0

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def url(self) -> str:
        return self.config.url


def _candidate(ic: InstanceConfig, default_rate: float, factor: float = 1.0) -> Candidate:
    return Candidate(
        id=ic.id,
        cache_tokens=ic.cache_tokens,
        prefill_tokens_per_s=(ic.prefill_tokens_per_s or default_rate) / factor,
        role=ic.role,
        compat=ic.compat,
        node=ic.labels.get("node"),
        zone=ic.labels.get("zone"),
        kv_bytes_per_token=ic.kv_bytes_per_token,
        # A vLLM decode instance prefills whatever KV it was not handed; an SGLang decode
        # worker only serves requests paired with a prefill through a bootstrap room.
        standalone=ic.role == "mixed" or (ic.role == "decode" and ic.flavor == "vllm"),
    )


class InstancePool:
    def __init__(self, config: RouterConfig) -> None:
        self._health = config.health
        self._default_rate = config.policy.ttft.prefill_tokens_per_s
        self._instances = {ic.id: Instance(ic, _candidate(ic, self._default_rate)) for ic in config.instances}
        self.version = 0  # bumped whenever an instance's config changes or one joins or leaves (readers memoise on it)

    @property
    def disaggregated(self) -> bool:
        """True when the cluster has a prefill pool (PD routing)."""
        return any(i.config.role == "prefill" for i in self._instances.values())

    def calibrate(self, instance_id: str, factor: float) -> None:
        """Scale an instance's prefill rate by a measured slowdown ``factor``."""
        inst = self._instances[instance_id]
        inst.candidate = _candidate(inst.config, self._default_rate, factor)

    def apply_facts(self, instance_id: str, config: InstanceConfig) -> None:
        """From now on use ``config``: the configured one with engine-reported facts filled
        in (capacity, block size, KV dtype). The calibrated prefill rate is kept."""
        inst = self._instances[instance_id]
        inst.config = config
        self.version += 1
        inst.candidate = dataclasses.replace(inst.candidate, cache_tokens=config.cache_tokens, compat=config.compat)

    def compat_report(self) -> dict[str, str]:
        """Instances that can never be paired, with the reason (empty when all can)."""
        prefills = [i for i in self._instances.values() if i.config.role == "prefill"]
        decodes = [i for i in self._instances.values() if i.config.role in ("decode", "mixed")]
        problems: dict[str, str] = {}
        if not prefills:
            return problems
        for inst, others, what in [(p, decodes, "decode") for p in prefills] + [
            (d, prefills, "prefill") for d in decodes if d.config.role == "decode"
        ]:
            if not any(o.config.compat == inst.config.compat for o in others):
                model, dtype, block, flavor = inst.config.compat
                problems[inst.id] = (
                    f"no {what} instance shares its model={model}, kv_dtype={dtype}, block_size={block}, flavor={flavor}"
                )
        return problems

    def __iter__(self):
        return iter(self._instances.values())

    def get(self, instance_id: str) -> Instance:
        return self._instances[instance_id]

    def healthy(self, roles: Iterable[str], exclude: Iterable[str] = (), model: str | None = None) -> list[Instance]:
        """Healthy instances of ``roles`` that serve ``model`` (instances without a model serve any)."""
        roles, skip = set(roles), set(exclude)
        return [
            i
            for i in self._instances.values()
            if i.healthy and i.config.role in roles and i.id not in skip and (i.config.model in (None, model) or model is None)
        ]

    def any_healthy(self) -> bool:
        return any(i.healthy for i in self._instances.values())

    def caps(self, block_tokens: int) -> dict[str, int]:
        return {i.id: max(1, i.config.cache_tokens // block_tokens) for i in self._instances.values()}

    # -- health bookkeeping ----------------------------------------------------------------
    def record_success(self, instance_id: str) -> bool:
        """Returns True when this success brought the instance back."""
        inst = self._instances[instance_id]
        inst.failures = 0
        inst.successes += 1
        if not inst.healthy and inst.successes >= self._health.successes_to_healthy:
            inst.healthy = True
            log.info("instance %s is healthy again", inst.id)
            return True
        return False

    def record_failure(self, instance_id: str, *, fatal: bool = False) -> None:
        """A failed check or request; ``fatal`` (connection refused) marks it down at once."""
        inst = self._instances[instance_id]
        inst.successes = 0
        inst.failures += 1
        if inst.healthy and (fatal or inst.failures >= self._health.failures_to_unhealthy):
            inst.healthy = False
            log.warning("instance %s marked unhealthy after %d failure(s)", inst.id, inst.failures)
