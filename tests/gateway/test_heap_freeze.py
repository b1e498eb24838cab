"""What ``serve`` adds around the app (router/gateway/process.py): the heap alive once started
is frozen (left out of later garbage collections), and the young generation is larger."""

import asyncio
import gc

from router.config.model import load_config
from router.gateway.app import create_app
from router.gateway.process import YOUNG_THRESHOLD, wrap


async def test_the_heap_alive_at_startup_is_frozen_before_the_first_request():
    gc.unfreeze()
    thresholds = gc.get_threshold()
    app = wrap(create_app(load_config(overrides={"instances": [], "health": {"interval_s": 60}})))
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    frozen_at_startup: list[int] = []
    young: list[tuple[int, int, int]] = []

    async def send(message):
        if message["type"] == "lifespan.startup.complete":
            frozen_at_startup.append(gc.get_freeze_count())
            young.append(gc.get_threshold())
            await inbox.put({"type": "lifespan.shutdown"})

    try:
        assert gc.get_freeze_count() == 0
        await asyncio.wait_for(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send), 30)
        assert frozen_at_startup and frozen_at_startup[0] > 1000
        assert young == [(YOUNG_THRESHOLD, thresholds[1], thresholds[2])]  # the older generations as they were
    finally:
        gc.unfreeze()  # the test process's heap and collector are not ours to keep
        gc.set_threshold(*thresholds)
