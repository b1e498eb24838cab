"""The real-time driver keeps host lag out of model time."""

from __future__ import annotations

import time

from router.tools.emulator import EmulatorConfig
from router.tools.emulator.build import build_engine
from router.tools.emulator.driver import EngineDriver
from router.tools.emulator.request import EngineRequest


async def test_event_loop_lag_after_a_submit_is_not_model_time() -> None:
    scale = 0.01
    engine = build_engine(EmulatorConfig(time_scale=scale)).engine
    driver = EngineDriver(engine, scale)
    driver.start()
    try:
        stream = driver.submit(EngineRequest("r", list(range(1000, 1512)), 1))
        time.sleep(0.05)  # noqa: ASYNC251 (on purpose: the loop is busy elsewhere, 5 model seconds at this scale)
        while await stream.next_tokens():
            pass
    finally:
        await driver.stop()
    ttft = stream.request.ttft
    assert ttft is not None and 0 < ttft < 0.5, ttft  # a 512-token prefill, not the host's 5 s stall
