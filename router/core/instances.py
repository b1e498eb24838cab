"""The instances the router knows and their health, kept by active checks and by failures
seen while proxying.

Only known instances are ever contacted. They come from the config (``static``), the
admin API (also ``static``: it edits the config's list) or a discovery source
(``kubernetes``, ``dns``); nothing in a client request can add one. Membership changes at
run time: ``sync`` replaces one source's instances with a new set and says what changed.
An instance removed while requests to it are still in flight stays addressable by those
requests (``get``) but is never chosen again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from router.config.model import Compat, HealthConfig, InstanceConfig, RouterConfig
from router.core import outlier
from router.core.outlier import Outlier

log = logging.getLogger(__name__)

STATIC = "static"
_RETIRED_KEPT = 1024  # removed instances still addressable by their in-flight requests


@dataclass(frozen=True)
class Candidate:
    """Static (and calibrated) facts about an instance that scorers may use."""

    id: str
    cache_tokens: int = 500_000
    prefill_tokens_per_s: float | None = None
    role: str = "mixed"
    compat: Compat | tuple[()] = ()  # () = not stated: pairs only with other unstated ones
    node: str | None = None
    zone: str | None = None
    kv_bytes_per_token: int | None = None
    standalone: bool = True  # can serve a request without a remote prefill (SGLang decode workers cannot)
    # the engine's own measured inter-token latency (router/engines/decode_step.py); None = the
    # policy's configured step
    decode_step_s: float | None = None
    # the running batch and KV share (0..1) it was measured at; None: the engine did not say
    decode_step_batch: float | None = None
    decode_step_kv_share: float = 0.0


@dataclass(frozen=True)
class DecodeStep:
    """An engine's measured decode step and the batch it was measured at (router/engines/decode_step.py)."""

    step_s: float
    batch: float | None = None  # running requests, weighted by themselves; None: not reported
    kv_share: float = 0.0  # KV in use then, as a share of the engine's cache


@dataclass
class Instance:
    config: InstanceConfig
    candidate: Candidate
    healthy: bool = True
    failures: int = 0
    successes: int = 0
    source: str = STATIC
    draining: bool = False  # takes no new requests; those in flight finish
    factor: float = 1.0  # calibrated slowdown of the prefill rate
    # engine tokens per router-estimated token (router/engines/token_ratio.py): the candidate's
    # cache_tokens is the engine's capacity over this, in the router's estimated tokens
    token_ratio: float = 1.0
    decode_step: DecodeStep | None = None  # measured from the engine's inter-token latency
    declared: InstanceConfig | None = None  # as its source gave it, once engine facts filled in ``config``
    outlier: Outlier = field(default_factory=Outlier)  # passive record; ``healthy`` is the active checks' verdict
    # called once when the active checks take it out: attempts still waiting on it give up then
    on_down: set[Callable[[], None]] = field(default_factory=set, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.candidate.id  # config.id, one property call fewer (candidates are always built from config)

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining and not self.outlier.ejected()


@dataclass
class Change:
    """What one ``sync`` did."""

    added: list[Instance] = field(default_factory=list)
    removed: list[Instance] = field(default_factory=list)
    updated: list[Instance] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # id -> why it was not added

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.updated)


def _candidate(ic: InstanceConfig, default_rate: float, factor: float = 1.0, token_ratio: float = 1.0,
               step: DecodeStep | None = None) -> Candidate:
    candidate = Candidate(
        id=ic.id,
        cache_tokens=router_tokens(ic.cache_tokens, token_ratio),
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
    return candidate if step is None else with_decode_step(candidate, step)


def with_decode_step(candidate: Candidate, step: DecodeStep | None) -> Candidate:
    """``candidate`` priced from the measured ``step`` (None: the configured steps)."""
    if step is None:
        return dataclasses.replace(candidate, decode_step_s=None, decode_step_batch=None, decode_step_kv_share=0.0)
    return dataclasses.replace(candidate, decode_step_s=step.step_s, decode_step_batch=step.batch,
                               decode_step_kv_share=step.kv_share)


def router_tokens(engine_tokens: int, token_ratio: float) -> int:
    """An engine's token count in the router's estimated tokens (``token_ratio`` engine tokens each)."""
    return engine_tokens if token_ratio == 1.0 else max(1, round(engine_tokens / token_ratio))


class InstancePool:
    def __init__(self, config: RouterConfig) -> None:
        self._health: HealthConfig = config.health
        self._default_rate = config.policy.ttft.prefill_tokens_per_s
        self._instances: dict[str, Instance] = {
            ic.id: Instance(ic, _candidate(ic, self._default_rate)) for ic in config.instances
        }
        self._retired: OrderedDict[str, Instance] = OrderedDict()
        self.version = 0  # bumped whenever an instance's config changes or one joins or leaves (readers memoise on it)

    def reconfigure(self, config: RouterConfig) -> None:
        """Take a new config's health thresholds and default prefill rate (calibration kept)."""
        self._health = config.health
        self._default_rate = config.policy.ttft.prefill_tokens_per_s
        for inst in self._instances.values():
            inst.candidate = _candidate(inst.config, self._default_rate, inst.factor, inst.token_ratio, inst.decode_step)
        self.version += 1

    # -- membership ----------------------------------------------------------------------
    def sync(self, source: str, configs: Sequence[InstanceConfig], *, healthy: bool = False) -> Change:
        """Make ``configs`` the instances of ``source``: add the new, remove the missing, update
        the changed. A new instance starts ``healthy`` as given (False: a check must pass
        first). An id another source already holds is refused, never taken over."""
        change = Change()
        wanted: dict[str, InstanceConfig] = {}
        for ic in configs:
            held = self._instances.get(ic.id)
            if held is not None and held.source != source:
                change.refused[ic.id] = f"id already used by a {held.source} instance"
            elif ic.id in wanted:
                change.refused[ic.id] = "duplicate id"
            else:
                wanted[ic.id] = ic
        for inst in [i for i in self._instances.values() if i.source == source]:
            new = wanted.get(inst.id)
            if new is None or new.url != inst.url:  # gone, or the same name elsewhere: a different cache
                change.removed.append(self._remove(inst.id))
            elif new != (inst.declared or inst.config):  # facts the engine reported are not a change
                inst.config, inst.declared = new, None  # the same engine (same URL): its token ratio holds
                inst.candidate = _candidate(new, self._default_rate, inst.factor, inst.token_ratio, inst.decode_step)
                change.updated.append(inst)
        for instance_id, ic in wanted.items():
            if instance_id not in self._instances:
                inst = Instance(ic, _candidate(ic, self._default_rate), healthy=healthy, source=source)
                self._instances[instance_id] = inst
                self._retired.pop(instance_id, None)
                change.added.append(inst)
        for inst in change.added:
            log.info("instance %s (%s, %s) added by %s", inst.id, inst.url, inst.config.role, source)
        for inst in change.removed:
            log.info("instance %s (%s) removed by %s", inst.id, inst.url, source)
        for instance_id, why in change.refused.items():
            log.warning("instance %s from %s refused: %s", instance_id, source, why)
        if change:
            self.version += 1
        return change

    def _remove(self, instance_id: str) -> Instance:
        inst = self._instances.pop(instance_id)
        self._retired[instance_id] = inst
        while len(self._retired) > _RETIRED_KEPT:
            self._retired.popitem(last=False)
        return inst

    def ids(self, source: str) -> list[str]:
        return [i.id for i in self._instances.values() if i.source == source]

    def set_draining(self, instance_id: str, draining: bool) -> Instance:
        inst = self._instances[instance_id]
        if inst.draining != draining:
            inst.draining = draining
            self.version += 1
            log.info("instance %s %s", instance_id, "draining: no new requests" if draining else "takes requests again")
        return inst

    # -- reads ---------------------------------------------------------------------------
    @property
    def disaggregated(self) -> bool:
        """True when the cluster has a prefill pool (PD routing)."""
        return any(i.config.role == "prefill" for i in self._instances.values())

    def calibrate(self, instance_id: str, factor: float) -> None:
        """Scale an instance's prefill rate by a measured slowdown ``factor``."""
        inst = self._lookup(instance_id)
        if inst is not None:
            inst.factor = factor
            inst.candidate = _candidate(inst.config, self._default_rate, factor, inst.token_ratio, inst.decode_step)

    def apply_facts(self, instance_id: str, config: InstanceConfig) -> None:
        """From now on use ``config``: the configured one with engine-reported facts filled
        in (capacity, block size, KV dtype). The calibrated prefill rate is kept."""
        inst = self._instances[instance_id]
        inst.declared = inst.declared or inst.config
        inst.config = config
        self.version += 1
        inst.candidate = dataclasses.replace(inst.candidate, cache_tokens=router_tokens(config.cache_tokens, inst.token_ratio),
                                             compat=config.compat)

    def set_token_ratio(self, instance_id: str, ratio: float) -> Instance | None:
        """From now on count ``ratio`` engine tokens per router-estimated token on this
        instance: its capacity in the router's tokens follows. None when it left the pool."""
        inst = self._instances.get(instance_id)
        if inst is None:
            return None
        inst.token_ratio = ratio
        inst.candidate = dataclasses.replace(inst.candidate, cache_tokens=router_tokens(inst.config.cache_tokens, ratio))
        return inst

    def set_decode_step(self, instance_id: str, step: DecodeStep | None) -> Instance | None:
        """From now on price this instance's decode steps from ``step`` (None: the policy's
        configured steps). None when it left the pool."""
        inst = self._instances.get(instance_id)
        if inst is None:
            return None
        inst.decode_step = step
        inst.candidate = with_decode_step(inst.candidate, step)
        return inst

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

    def __iter__(self) -> Iterator[Instance]:
        return iter(list(self._instances.values()))

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._instances

    def __len__(self) -> int:
        return len(self._instances)

    def get(self, instance_id: str) -> Instance:
        """A known instance, or one removed while a request to it was in flight."""
        inst = self._lookup(instance_id)
        if inst is None:
            raise KeyError(instance_id)
        return inst

    def _lookup(self, instance_id: str) -> Instance | None:
        return self._instances.get(instance_id) or self._retired.get(instance_id)

    def healthy(self, roles: Iterable[str], exclude: Iterable[str] = (), model: str | None = None) -> list[Instance]:
        """Routable (healthy, not draining) instances of ``roles`` that serve ``model``
        (instances without a model serve any)."""
        roles, skip = set(roles), set(exclude)
        return [
            i
            for i in self._instances.values()
            if i.routable and i.config.role in roles and i.id not in skip and (i.config.model in (None, model) or model is None)
        ]

    def any_healthy(self) -> bool:
        """True when some instance can take a new request (what /ready reports)."""
        return any(i.routable for i in self._instances.values())

    # -- health bookkeeping ----------------------------------------------------------------
    # record_success / record_failure: the active checks' verdict (``healthy``);
    # passive_success / passive_failure: what proxied traffic saw (outlier ejection).
    # Neither touches the other's counts.
    def passive_success(self, instance_id: str) -> None:
        inst = self._lookup(instance_id)
        if inst is not None:
            outlier.on_success(inst.outlier, inst.id)

    def passive_failure(self, instance_id: str, *, fatal: bool = False) -> bool:
        """A gateway failure seen while proxying; ``fatal`` (connection refused) ejects at once.
        True when it ejected the instance."""
        inst = self._lookup(instance_id)
        if inst is None:
            return False
        now = time.monotonic()
        others = [i for i in self._instances.values() if i is not inst]
        share = (1 + sum(1 for i in others if i.outlier.ejected(now))) / max(1, len(self._instances))
        return outlier.on_failure(inst.outlier, inst.id, self._health, share, fatal=fatal)

    def record_success(self, instance_id: str) -> bool:
        """An active check passed; returns True when this success brought the instance back."""
        inst = self._lookup(instance_id)
        if inst is None:
            return False
        inst.failures = 0
        inst.successes += 1
        if not inst.healthy and inst.successes >= self._health.successes_to_healthy:
            inst.healthy = True
            log.info("instance %s is healthy again", inst.id)
            return True
        return False

    def record_failure(self, instance_id: str, *, fatal: bool = False) -> None:
        """An active check failed; ``fatal`` (connection refused) marks it down at once."""
        inst = self._lookup(instance_id)
        if inst is None:
            return
        inst.successes = 0
        inst.failures += 1
        if inst.healthy and (fatal or inst.failures >= self._health.failures_to_unhealthy):
            inst.healthy = False
            log.warning("instance %s marked unhealthy after %d failure(s)", inst.id, inst.failures)
            waiting, inst.on_down = inst.on_down, set()
            for give_up in waiting:
                give_up()
