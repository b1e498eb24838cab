"""The standard lifecycle hooks: booking/residency, calibration, metrics, access log.

Each is one concern reacting to the events of router/request/lifecycle.py; the service knows
none of them. Order matters only for the log line, which comes last so it sees the rest done;
hooks given to ``create_app(hooks=...)`` run after these.
"""

from __future__ import annotations

import logging

from router.config.engines import EngineCalibrationConfig
from router.config.model import RouterConfig, TTFTWeights
from router.core.instances import Instance, InstancePool
from router.core.metrics import Metrics
from router.engines.prefill_rate import PrefillSample
from router.engines.readings import EngineReading
from router.engines.token_ratio import PromptCountWindows, TokenRatio
from router.request.admission import Admission
from router.request.lifecycle import Abandon, Attempt, Hook
from router.scheduling.calibration import Calibrator, calibration_key, queued_share
from router.scheduling.cost import prefill_seconds
from router.scheduling.decide import Routed
from router.state.base import StateStore
from router.upstream.relay import Outcome

log = logging.getLogger("router.request.service")  # the access log keeps the name it always had


class BookingHook(Hook):
    """What a route booked in the state store: prefill work until the first byte, the whole
    request until the end; residency stays unless the attempt was abandoned."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    async def first_byte(self, attempt: Attempt) -> None:
        if attempt.streaming:  # a JSON answer's first byte comes with its last: release does it all, one call fewer
            await self.store.prefill_done(attempt.routed.booking)

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        await self.store.release(attempt.routed.booking)

    async def abandon(self, attempt: Attempt, why: Abandon) -> None:
        await self.store.abandon(attempt.routed.booking, attempt.routed.snapshot.matched)


class CalibrationHook(Hook):
    """Measured against estimated prefill time, at the first byte: the TTFT of a stream, and the
    prefill leg the router ran itself (vLLM PD). Slow instances get their prefill rate scaled.

    Also the engines' own measured prefill windows (``observe_engine``, fed by the poller): a
    window's prefills that this router already measured at the first byte are not counted
    again — each of the others weighs ``engines.calibration.weight`` of one measurement."""

    def __init__(self, calibrator: Calibrator, pool: InstancePool, metrics: Metrics) -> None:
        self.calibrator, self.pool, self.metrics = calibrator, pool, metrics
        self._members: dict[str, list[str]] = {}  # calibration key -> instance ids, for pool.version
        self._version = -1
        self._applied: dict[str, float] = {}  # instance -> the factor its rate was last scaled by
        self._measured: dict[str, int] = {}  # instance -> first-byte measurements since its last engine window

    def _key(self, instance: str) -> str:
        inst = self.pool.get(instance)
        declared = inst.declared or inst.config
        return calibration_key(self.calibrator.scope, instance, inst.config.model, declared.prefill_tokens_per_s)

    def _instances_of(self, key: str) -> list[str]:
        if self._version != self.pool.version:
            members: dict[str, list[str]] = {}
            for inst in self.pool:
                members.setdefault(self._key(inst.id), []).append(inst.id)
            self._members, self._version = members, self.pool.version
            self._applied = {i: f for i, f in self._applied.items() if i in self.pool}  # bounded by the pool
            self._measured = {i: n for i, n in self._measured.items() if i in self.pool}
        return self._members.get(key, [])

    async def first_byte(self, attempt: Attempt) -> None:
        routed = attempt.routed
        if attempt.prefill_s is not None and attempt.prefill is not None:
            self._calibrate(attempt.prefill.id, routed, "prefill_leg", attempt.prefill_s)
        if not attempt.streaming or attempt.first_byte_s is None:
            return  # the first byte of a JSON answer is its last: no TTFT in it
        decision = routed.decision
        if decision.mode == "disaggregated":  # the leg was calibrated above, the pair is only observed
            if decision.estimate_s:
                self.metrics.estimate_ratio.labels("disaggregated").observe(attempt.first_byte_s / decision.estimate_s)
        else:
            self._calibrate(attempt.instance.id, routed, decision.mode, attempt.first_byte_s)

    def _calibrate(self, instance: str, routed: Routed, mode: str, actual_s: float) -> None:
        d = routed.decision
        if mode == "prefill_leg":  # only this reads the cost terms, which are built on first read
            terms = d.terms.get(d.key, {})
            estimate = terms.get("queue_s", 0.0) + terms.get("prefill_s", 0.0)
        else:
            estimate = d.estimate_s or 0.0
        if estimate <= 0:
            return
        self.metrics.estimate_ratio.labels(mode).observe(actual_s / estimate)
        if instance not in self.pool:
            return
        key = self._key(instance)
        external = routed.external_prefill if (d.prefill or d.instance) == instance else 0
        queued = queued_share(routed.snapshot, routed.booking, instance, external)
        factor = self.calibrator.observe(key, estimate, actual_s, queued=queued, factor_then=self._factor_then(instance, routed))
        if factor is not None:
            self._measured[instance] = self._measured.get(instance, 0) + 1
        self._apply(key, factor)

    def _factor_then(self, instance: str, routed: Routed) -> float | None:
        """The factor ``instance``'s rate was scaled by when ``routed`` was decided (None: unknown,
        the current one stands in): its declared rate over the rate the decision priced."""
        d, rate = routed.decision, routed.prefill_rate
        if not rate or (d.prefill or d.instance) != instance:
            return None
        inst = self.pool.get(instance)
        rate_now = inst.candidate.prefill_tokens_per_s
        return rate_now * inst.factor / rate if rate_now else None

    def observe_engine(self, instance: str, sample: PrefillSample, weights: TTFTWeights,
                       config: EngineCalibrationConfig) -> float | None:
        """Fold in one engine-measured prefill window of ``instance``; returns its new factor.

        The window is compared with what the router's own model would have estimated for the
        same prefills at the rate it currently believes (mean computed tokens per prefill, no
        queue: the engine's prefill time excludes it), as a whole (``calibration.min_estimate_s``
        applies to the window's sum). Every window settles the count of the router's own
        measurements, also one too busy to learn from."""
        if instance not in self.pool:
            return None
        own = self._measured.pop(instance, 0)
        fresh = max(0.0, sample.requests - own)
        if fresh <= 0 or not sample.usable(config):
            return None  # every prefill in it was measured at the first byte already, or it measured a queue
        inst = self.pool.get(instance)
        if inst.config.role == "decode":  # its "prefill" is the KV transfer of someone else's: not its rate
            return None
        if inst.candidate.prefill_tokens_per_s is None or inst.candidate.prefill_tokens_per_s <= 0:
            return None
        key = self._key(instance)
        # the rate the calibrator's own factor implies (the pool's may lag it by the 1% rule)
        rate = inst.candidate.prefill_tokens_per_s * inst.factor / self.calibrator.factor(key)
        per_request = sample.computed_tokens / sample.requests
        estimate = sample.requests * prefill_seconds(per_request, round(per_request), rate, weights)
        factor = self.calibrator.observe(key, estimate, sample.prefill_s, config.weight * fresh)
        self._apply(key, factor)
        return factor

    def _apply(self, key: str, factor: float | None) -> None:
        changed = self.calibrator.relax()  # factors no traffic re-measures fade toward 1.0
        if factor is not None:
            changed[key] = factor
        for changed_key, value in changed.items():
            for name in self._instances_of(changed_key):
                # A shared factor moves on every member's measurement: rescale a member's
                # rate only when it moved by 1% or more (a pool of hundreds stays cheap).
                if abs(value / self._applied.get(name, 1.0) - 1.0) < 0.01 and value != 1.0:
                    continue
                self._applied[name] = value
                self.pool.calibrate(name, value)
                self.metrics.calibration.labels(name).set(value)


class MetricsHook(Hook):
    """In-flight gauge, time to first byte, requests and latency by outcome, retries.

    An engine's children are kept by ``Metrics.engine`` (bounded: instances x outcomes)."""

    def __init__(self, metrics: Metrics) -> None:
        self._engine = metrics.engine
        self._child = metrics.child

    async def before_send(self, attempt: Attempt) -> None:
        self._engine(attempt.instance.id).inflight.inc()

    async def first_byte(self, attempt: Attempt) -> None:
        assert attempt.first_byte_s is not None  # set just before first_byte runs (lifecycle.py)
        self._engine(attempt.instance.id).ttfb.observe(attempt.first_byte_s)

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        series = self._engine(attempt.instance.id)
        series.inflight.dec()
        requests, latency = series.outcome(attempt.instance.config.model or "", outcome)
        requests.inc()
        assert attempt.duration_s is not None  # set just before end and abandon run
        latency.observe(attempt.duration_s)

    async def abandon(self, attempt: Attempt, why: Abandon) -> None:
        self._engine(attempt.instance.id).inflight.dec()
        if why.kind == "retry":
            self._child("retries", why.instance, why.reason).inc()
        elif why.kind in ("passed", "client_disconnect"):  # passed: an engine's error answer, relayed
            model = attempt.instance.config.model or ""  # the engine's declared model: bounded, never the client's
            outcome = why.reason if why.kind == "passed" else "client_disconnect"
            requests, latency = self._engine(why.instance).outcome(model, outcome)
            requests.inc()
            assert attempt.duration_s is not None
            latency.observe(attempt.duration_s)
        # "failed": the router's own error, counted as rejected where it is raised


class TokenRatioHook(Hook):
    """The engine's own prompt token count against the router's estimate, at each answer that
    reports one: per model, how many engine tokens one estimated token is (character keys
    only), and with it each instance's cache in the router's tokens (residency entries, KV
    room: router/engines/token_ratio.py says why). Answers without usage (streams that did
    not ask for it) are learned from through the engines' own counters, a window at a time
    (``scraped``, fed by the engine poller: token_ratio.PromptCountWindows). Applied to every
    instance serving the model when the ratio has moved 5% since it was last applied, and to
    instances that joined since."""

    _MODELS = 64  # models learned at most (only served models reach here: admission refused the rest)

    def __init__(self, config: RouterConfig, pool: InstancePool, store: StateStore, admission: Admission,
                 metrics: Metrics) -> None:
        self.config, self.pool, self.store, self.admission, self.metrics = config, pool, store, admission, metrics
        self.ratios: dict[str, TokenRatio] = {}
        self.windows = PromptCountWindows()
        self._applied: dict[str, tuple[float, int]] = {}  # model -> (ratio applied, pool version then)

    def _learning(self) -> bool:
        if self.config.engines.learn_token_ratio and self.config.hashing.mode == "chars":
            return True
        if self.ratios:  # turned off while running: back to the estimate taken as exact
            self.ratios.clear()
            self._applied.clear()
            self._apply(list(self.pool), 1.0)
        return False

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        reported, estimated = attempt.reported_prompt_tokens, attempt.estimated_prompt_tokens
        if estimated is None or not self._learning():
            return
        if outcome != "ok":
            self.windows.spoil(attempt.instance.id)
            return
        self.windows.answered(attempt.instance.id, attempt.model, estimated, reported)
        if reported is not None:
            self._learn(attempt.model, estimated, reported, 1)

    async def abandon(self, attempt: Attempt, why: Abandon) -> None:
        if why.kind != "passed" or not why.reason.startswith("http_4"):  # an engine's 4xx never ran the prompt
            self.windows.spoil(why.instance)

    def scraped(self, instance_id: str, reading: EngineReading) -> None:
        """A scrape of ``instance_id`` (the engine poller): a window of answers without usage may close."""
        if not self._learning():
            return
        dropped = self.windows.dropped
        sample = self.windows.scraped(instance_id, reading.answered_prompt_tokens, reading.answered_requests)
        if len(self.windows) > len(self.pool) + 16:
            self.windows.retain({i.id for i in self.pool})
        if self.windows.dropped != dropped:
            self.metrics.token_windows.labels(instance_id, "dropped").inc()
        if sample is not None:
            self.metrics.token_windows.labels(instance_id, "learned").inc()
            self._learn(sample.model, sample.estimated, sample.reported, sample.answers)

    def _learn(self, model: str, estimated: int, reported: int, answers: int) -> None:
        ratio = self.ratios.get(model)
        if ratio is None:
            if len(self.ratios) >= self._MODELS:
                return
            ratio = self.ratios[model] = TokenRatio()
        ratio.observe(estimated, reported, answers)
        value = ratio.ratio
        applied, version = self._applied.get(model, (1.0, -1))
        if abs(value / applied - 1.0) < 0.05 and version == self.pool.version:
            return
        self._applied[model] = (value, self.pool.version)
        self._apply(self.admission.usable(list(self.pool), model), value)

    def _apply(self, instances: list[Instance], value: float) -> None:
        for inst in instances:
            if inst.token_ratio != value and self.pool.set_token_ratio(inst.id, value) is not None:
                self.store.set_capacity(inst.id, self.config.residency_cap(inst.config, inst.candidate.cache_tokens))
                self.metrics.token_ratio.labels(inst.id).set(value)


class OutlierHook(Hook):
    """Passive health: how each relayed answer ended counts for or against its instance
    (router/core/outlier.py). A client disconnect says nothing about the engine."""

    def __init__(self, pool: InstancePool, metrics: Metrics) -> None:
        self.pool, self.metrics = pool, metrics

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        if outcome == "ok":
            self.pool.passive_success(attempt.instance.id)
        elif outcome == "upstream_error":  # a stream that died mid-way, or went idle too long
            if self.pool.passive_failure(attempt.instance.id):
                self.metrics.ejections.labels(attempt.instance.id).inc()


class AccessLogHook(Hook):
    """One line per attempt: id, route, outcome, duration (never prompt text)."""

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        if log.isEnabledFor(logging.INFO):  # the route key is built only for a line that is written
            log.info("request %s -> %s %s %.3fs", attempt.request_id, attempt.routed.decision.key, outcome,
                     attempt.duration_s)

    async def abandon(self, attempt: Attempt, why: Abandon) -> None:
        if why.kind == "retry":
            log.warning("request %s -> %s: %s on %s, trying another instance", attempt.request_id,
                        attempt.routed.decision.key, why.reason, why.instance)
        else:
            log.info("request %s -> %s %s (%s on %s) %.3fs", attempt.request_id, attempt.routed.decision.key,
                     why.kind, why.reason, why.instance, attempt.duration_s)


def standard_hooks(store: StateStore, calibration: CalibrationHook, pool: InstancePool, metrics: Metrics,
                   token_ratio: TokenRatioHook | None = None) -> list[Hook]:
    """The hooks every router runs, in order."""
    ratio = [] if token_ratio is None else [token_ratio]
    return [BookingHook(store), calibration, *ratio, OutlierHook(pool, metrics), MetricsHook(metrics), AccessLogHook()]
