"""The live router's online calibration, in the replay: measured TTFT against the estimate
at each first token, folded into a factor that divides the prefill rate.

Live, ``request/hooks.py``'s CalibrationHook does this for every streamed request that
the instance prefilled itself; the replay does the same with the same ``Calibrator`` and
the same keys (one factor per group of instances declaring the same model and rate, or per
instance: ``calibration.scope``), on the virtual clock, so a router that starts from the
config's default rate (``told=False``) corrects it from measurements as the live one does,
instead of keeping a belief no live router would keep. Only colocated clusters are
calibrated here: the PD replay keeps the figures its own benchmarks were built on.

``ReplayDecodeSteps`` is the live engine poller's decode-step belief
(router/engines/decode_step.py): each engine's inter-token latency counters, read every
metrics interval, set the step its wait for KV room is priced with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from router.config.engines import EnginesConfig
from router.config.model import CalibrationConfig
from router.core.instances import Candidate
from router.core.instances import with_decode_step
from router.engines.decode_step import DecodeStepMeter
from router.engines.readings import EngineReading
from router.scheduling.calibration import Calibrator, calibration_key
from router.tools.emulator.engine import Engine


class ReplayCalibration:
    def __init__(self, candidates: list[Candidate], model: str, default_rate: float, clock: Callable[[], float],
                 config: CalibrationConfig | None = None) -> None:
        self._candidates = candidates  # the list the replay routes over, updated in place
        self.calibrator = Calibrator(config or CalibrationConfig(), clock)
        self._base = {c.id: c.prefill_tokens_per_s or default_rate for c in candidates}
        self._key = {c.id: calibration_key(self.calibrator.scope, c.id, model, c.prefill_tokens_per_s) for c in candidates}

    def observe(self, instance: str, estimate_s: float | None, actual_s: float, queued: float = 0.0,
                rate_then: float | None = None) -> None:
        """One first token (``queued``: its ``queued_share``; ``rate_then``: the instance's rate
        its estimate was priced at, ``Routed.prefill_rate``): as CalibrationHook._calibrate, then
        the rates of every instance whose factor moved (its group's, and any stale one relaxing
        toward 1.0)."""
        if not estimate_s:
            return
        key = self._key[instance]
        # a candidate without a rate of its own was priced at the default: never calibrated yet
        factor_then = self._base[instance] / rate_then if rate_then else 1.0
        factor = self.calibrator.observe(key, estimate_s, actual_s, queued=queued, factor_then=factor_then)
        changed = self.calibrator.relax()
        if factor is not None:
            changed[key] = factor
        if not changed:
            return
        for i, c in enumerate(self._candidates):
            value = changed.get(self._key[c.id])
            if value is not None:
                self._candidates[i] = dataclasses.replace(c, prefill_tokens_per_s=self._base[c.id] / value)


class ReplayDecodeSteps:
    def __init__(self, candidates: list[Candidate], engines: list[Engine], clock: Callable[[], float],
                 config: EnginesConfig | None = None) -> None:
        config = config or EnginesConfig()
        self._candidates = candidates  # the list the replay routes over, updated in place (index = engine)
        self._engines = engines
        self.meter = DecodeStepMeter(config.decode_step, clock)
        self._every = config.metrics_interval_s
        self._clock = clock
        self._next = 0.0 if config.decode_step.enabled else math.inf  # disabled: never due, as live

    def poll(self) -> None:
        """At an arrival: a scrape of every engine when one is due (scrapes between two arrivals
        change nothing a decision sees, so they are taken at arrivals)."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._every
        for i, engine in enumerate(self._engines):
            c = engine.counters
            cid = self._candidates[i].id
            reading = EngineReading(running=engine.num_running, kv_usage=engine.kv.usage,
                                    itl_s=c.itl_seconds, itl_tokens=c.itl_tokens)
            belief = self.meter.belief(cid) if self.meter.update(cid, reading) is not None else None
            if belief is not None:
                self._candidates[i] = with_decode_step(self._candidates[i], belief)
