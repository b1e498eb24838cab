"""Counter deltas -> measured prefill windows: what counts, what is refused, restarts."""

from __future__ import annotations

import math

import httpx

from router.config.engines import EngineCalibrationConfig
from router.engines.prefill_rate import PrefillMeter
from router.engines.readings import EngineReading, parse_metrics
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from router.tools.emulator.perf import get_profile, prefill_time


class Clock:
    """Fixed unless moved, or (``tick``) one second later at every read: one scrape a second."""

    def __init__(self, tick: float = 0.0) -> None:
        self.t = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def vllm(requests: float, tokens: float, seconds: float) -> EngineReading:
    return EngineReading(prefill_requests=requests, computed_tokens=tokens, prefill_s=seconds,
                         prompt_tokens=tokens * 2, hit_tokens=tokens)


def meter(clock: Clock | None = None, **config: object) -> PrefillMeter:
    config.setdefault("min_window_s", 1.0)
    return PrefillMeter(EngineCalibrationConfig(**config), clock or Clock(tick=1.0))  # type: ignore[arg-type]


def test_the_first_reading_is_a_baseline_and_a_filled_window_is_a_sample() -> None:
    m = meter(min_requests=2, min_prefill_s=0.01)
    assert m.update("e", vllm(100, 1e6, 50)) is None  # what the engine did before we watched
    assert m.update("e", vllm(101, 1e6 + 1000, 50.1)) is None  # one prefill: not yet a window
    sample = m.update("e", vllm(102, 1e6 + 3000, 50.2))
    assert sample is not None and sample.source == "prefill_time"
    assert (sample.requests, sample.computed_tokens) == (2, 3000) and math.isclose(sample.prefill_s, 0.2)
    assert math.isclose(sample.tokens_per_s, 15000)
    assert m.update("e", vllm(102, 1e6 + 3000, 50.2)) is None  # a new window starts after a sample


def test_an_engine_restart_starts_a_new_baseline() -> None:
    m = meter(min_requests=1)
    m.update("e", vllm(100, 1e5, 10))
    assert m.update("e", vllm(3, 900, 0.1)) is None and m.resets == 1  # counters went back: no negative rate
    sample = m.update("e", vllm(5, 2900, 0.2))
    assert sample is not None and sample.requests == 2 and math.isclose(sample.tokens_per_s, 20000)


def test_implausible_and_non_finite_values_never_leave_the_meter() -> None:
    m = meter(min_requests=1, min_tokens_per_s=100, max_tokens_per_s=1e6)
    m.update("e", vllm(0, 0, 0))
    assert m.update("e", vllm(1, 1e7, 1)) is None  # 10M tokens/s
    assert m.update("e", vllm(2, 1e7 + 10, 2)) is None  # 10 tokens/s
    assert m.update("e", vllm(3, math.inf, 3)) is None
    assert m.update("e", vllm(4, math.nan, 4)) is None
    m.update("e", vllm(5, 1000, 5))  # a baseline again
    assert m.update("e", vllm(6, 1000, 6)) is None  # nothing computed (all cached): nothing to measure
    sample = m.update("e", vllm(7, 6000, 6.5))
    assert sample is not None and math.isclose(sample.tokens_per_s, 10000)


def test_a_window_that_does_not_fill_is_dropped_rather_than_mixing_eras() -> None:
    clock = Clock()
    m = meter(clock, min_requests=2, max_window_s=10)
    m.update("e", vllm(0, 0, 0))
    clock.t = 1
    m.update("e", vllm(1, 1000, 1.0))  # one slow prefill ...
    clock.t = 11
    assert m.update("e", vllm(1, 1000, 1.0)) is None  # ... and nothing for longer than the window: start over
    clock.t = 12
    m.update("e", vllm(2, 11000, 1.1))
    clock.t = 13
    sample = m.update("e", vllm(3, 21000, 1.2))
    assert sample is not None and sample.requests == 2 and math.isclose(sample.tokens_per_s, 20000 / 0.2)


def test_older_vllm_and_sglang_forms() -> None:
    m = meter(min_requests=1)
    older = EngineReading(prefill_requests=1, prefill_s=0.5, prompt_tokens=4000, hit_tokens=1000)
    m.update("old", older)
    s = m.update("old", EngineReading(prefill_requests=2, prefill_s=0.6, prompt_tokens=6000, hit_tokens=1000))
    assert s is not None and s.source == "prefill_time" and math.isclose(s.tokens_per_s, 20000)
    sglang = EngineReading(ttft_requests=4, ttft_s=2.0, queue_s=0.5, prompt_tokens=8000, hit_tokens=2000)
    m.update("sg", sglang)
    s = m.update("sg", EngineReading(ttft_requests=6, ttft_s=2.5, queue_s=0.6, prompt_tokens=12000, hit_tokens=2000))
    assert s is not None and s.source == "ttft" and math.isclose(s.tokens_per_s, 4000 / 0.4)
    assert m.update("none", EngineReading(running=1.0)) is None


def test_overlapping_prefills_are_counted_once_and_a_busy_window_is_not_usable() -> None:
    config = EngineCalibrationConfig(min_window_s=1.0, max_overlap=2.0, min_requests=1)
    clock = Clock()
    m = PrefillMeter(config, clock)
    m.update("e", vllm(0, 0, 0))
    clock.t = 10.0
    short = m.update("e", vllm(3, 3000, 1.5))  # 3 prefills of 0.5 s in 10 s: no overlap
    assert short is not None and short.prefill_s == 1.5 and short.overlap == 0.15 and short.usable(config)
    clock.t = 20.0
    shared = m.update("e", vllm(9, 9000, 16.5))  # 6 prefills of 2.5 s in 10 s: 1.5 in flight on average
    assert shared is not None and shared.prefill_s == 10.0 and shared.tokens_per_s == 600 and shared.usable(config)
    clock.t = 30.0
    busy = m.update("e", vllm(19, 19000, 46.5))  # 3 in flight: the histograms measure the queue
    assert busy is not None and busy.overlap == 3.0 and not busy.usable(config)
    clock.t = 30.5
    assert m.update("e", vllm(20, 20000, 46.6)) is None  # shorter than min_window_s: not yet


def test_queue_time_observed_before_the_first_token_is_not_a_restart() -> None:
    m = meter(min_requests=2)
    m.update("sg", EngineReading(ttft_requests=4, ttft_s=2.0, queue_s=0.5, prompt_tokens=8000, hit_tokens=0))
    # two more scheduled (their queue time counted), no first token yet: TTFT - queue went down
    assert m.update("sg", EngineReading(ttft_requests=4, ttft_s=2.0, queue_s=0.7, prompt_tokens=8000, hit_tokens=0)) is None
    s = m.update("sg", EngineReading(ttft_requests=6, ttft_s=2.6, queue_s=0.7, prompt_tokens=12000, hit_tokens=0))
    assert m.resets == 0 and s is not None and math.isclose(s.tokens_per_s, 4000 / 0.4)


def test_retain_forgets_instances_that_left() -> None:
    m = meter(min_requests=1)
    m.update("a", vllm(0, 0, 0))
    m.update("b", vllm(0, 0, 0))
    m.retain(["b"])
    assert m.update("a", vllm(1, 1000, 0.1)) is None  # a baseline again
    assert m.update("b", vllm(1, 1000, 0.1)) is not None


def test_the_emulators_histograms_give_its_true_prefill_rate() -> None:
    cfg = EmulatorConfig(model="m", time_scale=1.0, block_size=16, cache_tokens=65536, max_model_len=8192)
    m = meter(min_requests=1)
    with start_in_thread(cfg) as emu:
        m.update("e", parse_metrics(httpx.get(f"{emu.url}/metrics").text))
        prompt = [7 + (i * 31) % 3000 for i in range(2000)]
        r = httpx.post(f"{emu.url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
        sample = m.update("e", parse_metrics(httpx.get(f"{emu.url}/metrics").text))
    assert sample is not None and sample.computed_tokens == 2000
    truth = 2000 / prefill_time(get_profile(cfg.profile), 2000)  # one step, alone on the engine
    assert abs(sample.tokens_per_s / truth - 1) < 0.05, (sample, truth)
