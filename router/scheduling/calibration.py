"""Online calibration: keep TTFT estimates honest by measuring them.

Each observation compares the measured time (first byte seen by the router, or the
prefill leg's answer) with what the policy predicted, and moves the instance's slowdown
factor toward actual/estimated. The pool divides the instance's prefill rate by that
factor, so queue and prefill estimates both track the hardware actually serving.

Two rules keep the beliefs self-correcting:

* Warm-up: an instance's first ``warmup`` observations are averaged (the n-th with weight
  1/n), so a default rate that is 2.5x wrong is corrected by the first measurement instead
  of the EWMA's dozens, and a slow first request is averaged away by the next few.
* Scope: by default one factor is shared by every instance that declares the same model
  and prefill rate (``scope: pool``): such instances run the same hardware, and a
  per-instance factor fitted to a handful of noisy TTFTs (a queue the estimate
  misjudged, a decode batch it did not see) makes identical engines look 30% apart,
  which the TTFT policy then acts on — in replays that noise cost more p90 TTFT than
  the wrong default rate it corrected. Pooled, every member's measurement corrects the
  group at once. ``scope: instance`` keeps one factor per instance (a pool of mixed
  hardware that declares no rates).
* Only what measures the rate: a first byte behind a queue (booked, or reported by the
  engine beyond the bookings: external load) says more about how long the
  work ahead took (the queue model: booked prefill on a mixed engine is released only at
  its first token, a head half done counts whole) than about the rate. Fitting the rate to
  it moved the factor of engines whose true rate the router was told between 1.0 and 4.6 on
  the conversation replay. So a first byte counts only when the work booked ahead of it was
  at most ``max_queued_share`` of its own (``queued_share``); the routing-quality matrix
  then meets the target in 36 of 180 cells, as before, and misses the hit target in 14
  against 20 (docs/benchmarks.md).
* Two sources: the router's own first-byte TTFTs, and the engines' own prefill histograms
  (router/engines/prefill_rate.py, folded in with a weight below one), which also measure
  traffic that bypasses this router and instances it stopped sending to.
* The factor an estimate was made with: a first byte corrects that factor (``factor_then``),
  not whatever the factor has become while it was in flight (else a warm-up burst drives it
  to a bound).
* Staleness: a factor is only as good as its last measurement. One that has not been
  re-measured for ``stale_after_s`` relaxes toward 1.0 (the configured rate) with
  ``relax_half_life_s``. A factor high enough to keep all traffic away from an instance
  therefore fades until the instance wins a request again and is measured: exploration
  bounded by time, at the cost of at most one request per half-life on an instance that
  really is slow.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from router.config.model import CalibrationConfig
from router.state.base import Booking, Snapshot

_SETTLED = 0.01  # a relaxed factor this close to 1.0 is dropped: the prior again


def queued_share(snap: Snapshot, booking: Booking, instance: str, external: int = 0) -> float:
    """The prefill booked ahead of a request on ``instance`` when it was decided (the
    snapshot it was decided on), over what its own booking queued there (the same units):
    0 on an idle queue, infinite when there was work ahead and it queued none there.

    ``external``: the prefill the engine itself reported queued there beyond every booking
    (traffic that bypasses the router, router/engines/external.py), which the decision
    priced as queue too: a first byte behind it measures that queue, not the rate."""
    load = snap.loads.get(instance)
    ahead = (load.prefill_tokens if load is not None else 0) + external
    if ahead <= 0:
        return 0.0
    own = sum(leg.prefill_tokens for leg in booking.legs if leg.instance == instance)
    return ahead / own if own > 0 else math.inf


def calibration_key(scope: str, instance: str, model: str | None, declared_rate: float | None) -> str:
    """What one factor is kept for: the instance, or its group (same model, same declared rate)."""
    if scope == "instance":
        return instance
    return f"{model or '*'}@{declared_rate or 'default'}"


class Calibrator:
    def __init__(self, config: CalibrationConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self.factors: dict[str, float] = {}
        self._observed: dict[str, float] = {}  # observations folded in (summed weights), per instance
        self._measured_at: dict[str, float] = {}  # when each factor was last measured (or relaxed)

    @property
    def scope(self) -> str:
        return self._config.scope

    def factor(self, key: str) -> float:
        """The factor of an instance or group key (calibration_key), 1.0 when unmeasured."""
        return self.factors.get(key, 1.0)

    def observe(self, instance: str, estimated_s: float, actual_s: float, weight: float = 1.0,
                queued: float = 0.0, factor_then: float | None = None) -> float | None:
        """Fold one measurement in; return the new factor (None when nothing changed).

        ``factor_then``: the factor the estimate was made with, when it may differ from the
        current one (a first byte comes back after the factor moved on others' measurements).
        The measurement says the factor should have been ``factor_then * actual / estimated``;
        scaling the *current* factor by that ratio instead counts the correction twice: in a
        burst decided before the first measurement, every later first byte pushed a factor
        already corrected 4x on by its ratio again, down to ``min_factor``.

        ``queued``: the ``queued_share`` of the measured request; above ``max_queued_share``
        the measurement is the queue's, and is not folded in.

        ``weight`` is how many first-byte TTFTs the measurement is worth: an engine-reported
        window of prefills is worth a fraction of one per prefill. A weight of w folds in like
        w measurements of the same ratio (the warm-up mean counts it w times, the EWMA applies
        w times), so how the engine's prefills were cut into scrape windows does not matter."""
        if (not self._config.enabled or estimated_s <= 0 or actual_s <= 0 or estimated_s < self._config.min_estimate_s
                or not 0 < weight < math.inf or queued > self._config.max_queued_share):
            return None
        c = self._config
        n = self._observed.get(instance, 0.0) + weight
        self._observed[instance] = n
        ewma = c.alpha if weight == 1.0 else 1.0 - math.pow(1.0 - c.alpha, weight)  # exact for one measurement
        alpha = min(1.0, max(ewma, weight / n)) if n <= c.warmup else ewma
        old = self.factor(instance)
        target = (factor_then if factor_then is not None and 0 < factor_then < math.inf else old) * actual_s / estimated_s
        new = min(c.max_factor, max(c.min_factor, (1 - alpha) * old + alpha * target))
        self.factors[instance] = new
        self._measured_at[instance] = self._clock()
        return new

    def relax(self) -> dict[str, float]:
        """Move stale factors toward 1.0; returns the instances whose factor changed."""
        c, now = self._config, self._clock()
        changed: dict[str, float] = {}
        for instance, factor in list(self.factors.items()):
            at = self._measured_at.get(instance, now)
            idle = now - at - c.stale_after_s
            if idle <= 0:
                continue
            # relax in log space, so a 5x and a 0.2x factor fade alike
            new = math.exp(math.log(factor) * 0.5 ** (idle / c.relax_half_life_s))
            if abs(new - 1.0) < _SETTLED:
                new = 1.0
                del self.factors[instance]
                self._measured_at.pop(instance, None)
            else:
                self.factors[instance] = new
                self._measured_at[instance] = now - c.stale_after_s  # stays stale: keeps relaxing from here
            changed[instance] = new
        return changed

    def forget(self, instance: str) -> None:
        """An instance left: its measurements go with it."""
        self.factors.pop(instance, None)
        self._observed.pop(instance, None)
        self._measured_at.pop(instance, None)
