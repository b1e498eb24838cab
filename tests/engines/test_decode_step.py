"""Inter-token latency counters -> each engine's believed decode step: windows, smoothing, restarts."""

from __future__ import annotations

import math
import threading
import time

import httpx
import pytest

from router.config.engines import DecodeStepConfig
from router.core.instances import DecodeStep
from router.engines.decode_step import DecodeStepMeter
from router.engines.readings import EngineReading, parse_metrics
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from router.tools.emulator.perf import decode_step_time, get_profile


class Clock:
    """One second later at every read: one scrape a second."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def itl(seconds: float, tokens: float) -> EngineReading:
    return EngineReading(itl_s=seconds, itl_tokens=tokens)


def meter(**config: object) -> DecodeStepMeter:
    config.setdefault("min_window_s", 1.0)
    config.setdefault("min_tokens", 10)
    return DecodeStepMeter(DecodeStepConfig(**config), Clock())  # type: ignore[arg-type]


def test_a_filled_window_is_the_mean_step_and_later_ones_are_smoothed() -> None:
    m = meter(alpha=0.5)
    assert m.update("e", itl(100.0, 5000)) is None  # what the engine did before we watched
    assert m.update("e", itl(100.1, 5005)) is None  # 5 tokens: not yet a window
    step = m.update("e", itl(100.2, 5010))
    assert step is not None and math.isclose(step, 0.02)  # 0.2 s over 10 tokens
    step = m.update("e", itl(101.2, 5020))  # a window of 0.1 s steps
    assert step is not None and math.isclose(step, 0.5 * 0.02 + 0.5 * 0.1)
    assert m.beliefs == {"e": step}


def test_a_restart_an_idle_engine_and_implausible_steps_set_nothing() -> None:
    m = meter(max_step_s=1.0)
    m.update("e", itl(100.0, 5000))
    assert m.update("e", itl(1.0, 20)) is None  # counters went back: a new window, not a negative step
    assert m.resets == 1
    assert m.update("e", itl(1.0, 20)) is None  # nothing generated
    assert m.update("e", itl(41.0, 40)) is None  # 2 s a token: refused
    assert m.update("e", itl(math.nan, 60)) is None
    assert m.update("e", EngineReading(running=3)) is None  # no histogram at all
    assert m.beliefs == {}


def test_an_instance_that_left_is_forgotten() -> None:
    m = meter()
    m.update("a", itl(0.0, 0))
    m.update("b", itl(0.0, 0))
    assert m.update("a", itl(1.0, 100)) == 0.01
    m.retain(["b"])
    assert m.beliefs == {} and m.update("a", itl(2.0, 200)) is None  # a baseline again


def test_the_batch_a_step_was_measured_at_is_weighted_by_the_tokens_it_made() -> None:
    m = meter(alpha=0.5)
    m.update("e", itl(0.0, 0))
    # two scrapes in the window: 2 running at 10% KV, then 6 at 50%; a step makes one token per
    # running request, so the token-weighted batch is (2*2 + 6*6) / 8 = 5, the KV share (2*.1 + 6*.5) / 8
    m.update("e", EngineReading(running=2, kv_usage=0.1, itl_s=0.05, itl_tokens=5))
    assert m.update("e", EngineReading(running=6, kv_usage=0.5, itl_s=0.2, itl_tokens=20)) == 0.01
    belief = m.belief("e")
    assert belief is not None and belief.step_s == 0.01
    assert belief.batch == pytest.approx(5.0) and belief.kv_share == pytest.approx(0.4)
    # the next window (one scrape: 1 running, KV 2.0 read as a full cache) is smoothed as the step is
    assert m.update("e", EngineReading(running=1, kv_usage=2.0, itl_s=0.4, itl_tokens=30)) == pytest.approx(0.015)
    belief = m.belief("e")
    assert belief is not None and belief.batch == pytest.approx(3.0) and belief.kv_share == pytest.approx(0.7)
    # a window whose scrapes saw nobody running keeps the last batch rather than none
    m.update("e", EngineReading(running=0, itl_s=0.6, itl_tokens=40))
    assert m.belief("e") is not None and m.belief("e").batch == pytest.approx(3.0)  # type: ignore[union-attr]
    m.retain([])
    assert m.belief("e") is None and m.measured_at == {}


def test_an_engine_that_reports_no_batch_gives_a_step_without_one() -> None:
    m = meter()
    m.update("e", itl(0.0, 0))
    m.update("e", itl(0.1, 10))
    assert m.belief("e") == DecodeStep(0.01)


def test_the_emulators_histogram_gives_its_decode_step() -> None:
    """Four requests decoding together on the emulator: the step they see is the profile's
    decode step for a batch of four in wall seconds (prefill steps aside, which the mean includes)."""
    cfg = EmulatorConfig(model="m", time_scale=2.0, block_size=16, cache_tokens=65536)
    step = decode_step_time(get_profile(cfg.profile), 4, 4 * 200) * cfg.time_scale
    with start_in_thread(cfg) as emu:
        m = DecodeStepMeter(DecodeStepConfig(min_window_s=0.01, min_tokens=10))
        m.update("e", parse_metrics(httpx.get(f"{emu.url}/metrics").text))
        with httpx.Client(timeout=30) as client:
            threads = [threading.Thread(target=client.post, args=(f"{emu.url}/v1/completions",),
                                        kwargs={"json": {"model": "m", "prompt": f"{i} " + "w " * 150,
                                                         "max_tokens": 100}}) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        time.sleep(0.02)
        believed = m.update("e", parse_metrics(httpx.get(f"{emu.url}/metrics").text))
    assert believed is not None and 0.95 * step <= believed <= 1.15 * step, (believed, step)
