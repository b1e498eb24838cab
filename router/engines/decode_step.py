"""An engine's own decode step, from the inter-token latency histogram of its ``/metrics``.

Why: a request that finds an engine's KV cache full waits for running requests to end,
and they end a decode step at a time (``cost.admission_wait``). That wait was priced with
one configured step (``policy.ttft.decode_step_s`` plus ``decode_interference_s`` per
running request), whatever the engine: 8 ms by default, where the emulator's profiles take
3-33 ms and the real CPU vLLM testbed ~1.4 ms. Nothing else corrects it: the calibration
moves the prefill rate only.

What is measured, per instance, over a window of scrapes (counter deltas): the summed
inter-token latency over the tokens it covers (vLLM ``inter_token_latency_seconds``, older
``time_per_output_token_seconds``; SGLang likewise). That mean is the step time a running
request actually sees on that engine: its batch, its KV reads and the prefill chunks
interleaved into its steps are all in it, so it stands for the whole per-step term of the
wait (the configured interference is not added on top). The belief is an EWMA over windows
(``alpha``); a window needs ``min_tokens`` tokens and ``min_window_s`` seconds, so one
lone request's tokens do not set it. An engine that generated nothing keeps its last
belief: the wait it prices only arises on an engine busy enough to fill its cache.

The batch it was measured at goes with it: the running requests and KV share each scrape
in the window reports, weighted by the running requests (the tokens a step makes), so the
mean matches the token-weighted mean step. A PD decode instance's step grows with its batch
(``pd_cost.decode_step_seconds``): there the measurement scales the configured step model
by its ratio to what the model says at that batch, rather than replacing it.

Bounded: one window and one belief per instance (``retain`` drops instances that left); a
counter that went backwards (an engine restart) starts a new window; non-finite or
implausible steps never leave this module.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from router.config.engines import DecodeStepConfig
from router.core.instances import DecodeStep
from router.engines.readings import EngineReading


@dataclass
class _Window:
    seconds: float  # the counters at the window's start
    tokens: float
    last_seconds: float  # ... and at the last scrape
    last_tokens: float
    started: float
    weight: float = 0.0  # sum of running requests over the window's scrapes
    batch: float = 0.0  # ... of running requests squared
    kv: float = 0.0  # ... of running requests x KV share


@dataclass(frozen=True)
class MeasuredAt:
    """The token-weighted running batch and KV share (0..1) a step belief was measured at."""

    batch: float
    kv_share: float


class DecodeStepMeter:
    """Turns successive readings of each instance into its believed decode step (seconds)."""

    def __init__(self, config: DecodeStepConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self.beliefs: dict[str, float] = {}
        # absent until a window's scrapes report a running batch; a window that saw none keeps the last
        self.measured_at: dict[str, MeasuredAt] = {}
        self.resets = 0  # counters seen going backwards (engine restarts), for tests and /debug

    def update(self, instance: str, reading: EngineReading) -> float | None:
        """Fold one scrape in; the instance's new belief when a window filled, else None."""
        seconds, tokens = reading.itl_s, reading.itl_tokens
        now = self._clock()
        if seconds is None or tokens is None or not (math.isfinite(seconds) and math.isfinite(tokens)):
            self._windows.pop(instance, None)
            return None
        window = self._windows.get(instance)
        if window is None:  # first read: what came before is not ours to count
            self._windows[instance] = _Window(seconds, tokens, seconds, tokens, now)
            return None
        if seconds < window.last_seconds or tokens < window.last_tokens:
            self.resets += 1  # the engine restarted: its counters start again from zero
            self._windows[instance] = _Window(seconds, tokens, seconds, tokens, now)
            return None
        window.last_seconds, window.last_tokens = seconds, tokens
        running = reading.running
        if running is not None and math.isfinite(running) and running > 0:
            share = reading.kv_usage if reading.kv_usage is not None and math.isfinite(reading.kv_usage) else 0.0
            window.weight += running
            window.batch += running * running
            window.kv += running * min(1.0, max(0.0, share))
        c = self._config
        n, spent, elapsed = tokens - window.tokens, seconds - window.seconds, now - window.started
        if n < c.min_tokens or elapsed < c.min_window_s:
            if elapsed > c.max_window_s:  # too slow to fill: start over rather than mix eras
                self._windows[instance] = _Window(seconds, tokens, seconds, tokens, now)
            return None
        self._windows[instance] = _Window(seconds, tokens, seconds, tokens, now)
        step = spent / n
        if not c.min_step_s <= step <= c.max_step_s:
            return None
        old = self.beliefs.get(instance)
        new = step if old is None else (1.0 - c.alpha) * old + c.alpha * step
        self.beliefs[instance] = new
        if window.weight > 0:
            at = MeasuredAt(window.batch / window.weight, window.kv / window.weight)
            was = self.measured_at.get(instance)
            if was is not None and old is not None:  # smoothed alike, so step and batch stay one pair
                at = MeasuredAt((1.0 - c.alpha) * was.batch + c.alpha * at.batch,
                                (1.0 - c.alpha) * was.kv_share + c.alpha * at.kv_share)
            self.measured_at[instance] = at
        return new

    def belief(self, instance: str) -> DecodeStep | None:
        """The instance's believed step with the batch it was measured at, for the pool."""
        step = self.beliefs.get(instance)
        if step is None:
            return None
        at = self.measured_at.get(instance)
        return DecodeStep(step, at.batch, at.kv_share) if at is not None else DecodeStep(step)

    def retain(self, instances: Iterable[str]) -> None:
        """Forget instances that left the pool."""
        keep = set(instances)
        for gone in [i for i in self._windows if i not in keep]:
            del self._windows[gone]
        for gone in [i for i in self.beliefs if i not in keep]:
            del self.beliefs[gone]
            self.measured_at.pop(gone, None)
