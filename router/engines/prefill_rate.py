"""An engine's own prefill rate, from the counters of its ``/metrics`` between scrapes.

Why: the router's first-byte calibration only measures instances the router sends to. An
engine's histograms also count traffic that bypasses this router (other routers, direct
clients) and keep counting while a stale belief keeps this router away, so they can correct
a wrong rate that no routed request would ever re-measure.

What is measured, per instance, over a *window* of scrapes (counter deltas):

* vLLM: ``request_prefill_kv_computed_tokens`` / ``request_prefill_time_seconds`` (sums):
  KV tokens computed (prefix-cache hits excluded) per second from first scheduled to first
  token. Both are observed when a request finishes, so tokens and seconds belong to the same
  requests. Older vLLM without the computed-tokens histogram: prompt minus prefix-cache-hit
  tokens (counted at scheduling, so a window's tokens and seconds can belong to different
  requests; averaged out over windows).
* SGLang (and any engine with only a TTFT histogram): ``time_to_first_token_seconds`` minus
  ``queue_time_seconds`` against prompt minus cached tokens.

Biases, all toward a *lower* rate than the engine's pure prefill rate (the one the router's
cost model wants: it prices queues and decode interference separately): prefills batched
together each count the shared steps (k overlapping prefills read about 1/k of the rate);
chunked prefill interleaves decode steps into a request's prefill time; the TTFT form
includes detokenisation and any queue the engine does not report. Overlap is bounded with
Little's law: summed prefill seconds over the window's wall time is the mean number of
prefills in flight. Above one, the engine was prefilling at most the whole window, so the
window's wall time replaces the sum; above ``max_overlap`` the window is only reported, not
calibrated from (``usable``): a busy engine's histograms say more about its queue than its
rate, and the router's own first-byte measurements, which price that queue, are the better
source there. Windows
last at least ``min_window_s`` so that the requests finishing in one (whose prefill began
earlier) are a fair sample. What is left is a belief about what one request sees, and goes
into the calibration with a weight (config ``engines.calibration``), not as a fact.

Bounded: one window and one set of totals per instance (``retain`` drops instances that
left); a counter that went backwards (an engine restart) starts a new baseline and drops the
window; non-finite or implausible values never leave this module.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from router.config.engines import EngineCalibrationConfig
from router.engines.readings import EngineReading


@dataclass(frozen=True)
class PrefillSample:
    """One measured window: ``computed_tokens`` prefilled in ``prefill_s`` over ``requests`` prefills
    (``prefill_s`` at most the window's wall time: overlapping prefills are not counted twice)."""

    requests: float
    computed_tokens: float
    prefill_s: float
    source: str  # "prefill_time" (vLLM's prefill phase) or "ttft" (time to first token minus queue)
    overlap: float = 0.0  # mean prefills in flight over the window (summed prefill seconds / wall seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.computed_tokens / self.prefill_s

    def usable(self, config: EngineCalibrationConfig) -> bool:
        """Whether the calibration may learn from it (its prefills did not overlap too much)."""
        return self.overlap <= config.max_overlap


@dataclass(frozen=True)
class _Totals:
    requests: float
    tokens: float
    seconds: float
    source: str
    counters: tuple[float, ...]  # the engine's own counters these come from: any going back is a restart


def _totals(r: EngineReading) -> _Totals | None:
    """The cumulative (requests, computed tokens, prefill seconds) a reading holds, if any."""
    if r.prefill_requests is not None and r.prefill_s is not None:
        if r.computed_tokens is not None:
            return _Totals(r.prefill_requests, r.computed_tokens, r.prefill_s, "prefill_time",
                           (r.prefill_requests, r.computed_tokens, r.prefill_s))
        if r.prompt_tokens is not None and r.hit_tokens is not None:
            return _Totals(r.prefill_requests, r.prompt_tokens - r.hit_tokens, r.prefill_s, "prefill_time",
                           (r.prefill_requests, r.prompt_tokens, r.hit_tokens, r.prefill_s))
    if r.ttft_requests is not None and r.ttft_s is not None and r.prompt_tokens is not None:
        # queue time is observed at scheduling, TTFT at the first token: their difference may
        # dip between scrapes without a restart, so restarts are read on the counters themselves
        hits, queue = r.hit_tokens or 0.0, r.queue_s or 0.0
        return _Totals(r.ttft_requests, r.prompt_tokens - hits, r.ttft_s - queue, "ttft",
                       (r.ttft_requests, r.ttft_s, r.prompt_tokens, hits, queue))
    return None


@dataclass
class _Window:
    base: _Totals  # totals at the window's start
    last: _Totals  # totals at the last scrape
    started: float


class PrefillMeter:
    """Turns successive readings of each instance into measured prefill windows."""

    def __init__(self, config: EngineCalibrationConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self.resets = 0  # counters seen going backwards (engine restarts), for tests and /debug

    def update(self, instance: str, reading: EngineReading) -> PrefillSample | None:
        """Fold one scrape in; a sample when the instance's window has filled, else None."""
        totals = _totals(reading)
        now = self._clock()
        if totals is None or not all(math.isfinite(v) for v in totals.counters):
            self._windows.pop(instance, None)
            return None
        window = self._windows.get(instance)
        if window is None or window.last.source != totals.source:  # first read: what came before is not ours to count
            self._windows[instance] = _Window(totals, totals, now)
            return None
        if any(new < old for new, old in zip(totals.counters, window.last.counters)):
            self.resets += 1  # the engine restarted: its counters start again from zero
            self._windows[instance] = _Window(totals, totals, now)
            return None
        window.last = totals
        c = self._config
        requests = totals.requests - window.base.requests
        tokens = totals.tokens - window.base.tokens
        seconds = totals.seconds - window.base.seconds
        elapsed = now - window.started
        if requests < c.min_requests or seconds < c.min_prefill_s or elapsed < c.min_window_s:
            if elapsed > c.max_window_s:  # too slow to fill: start over rather than mix eras
                self._windows[instance] = _Window(totals, totals, now)
            return None
        self._windows[instance] = _Window(totals, totals, now)
        if tokens <= 0:
            return None
        overlap = seconds / elapsed  # mean prefills in flight (Little's law)
        sample = PrefillSample(requests, tokens, min(seconds, elapsed), totals.source, overlap)
        if not c.min_tokens_per_s <= sample.tokens_per_s <= c.max_tokens_per_s:
            return None
        return sample

    def retain(self, instances: Iterable[str]) -> None:
        """Forget instances that left the pool."""
        keep = set(instances)
        for gone in [i for i in self._windows if i not in keep]:
            del self._windows[gone]
