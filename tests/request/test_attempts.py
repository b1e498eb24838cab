"""give_up_when_down without a deadline: the JSON path's wait ends as a TimeoutError when the
active checks take the instance out, while any other cancellation stays a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from router.config.model import load_config
from router.core.instances import InstancePool
from router.request.attempts import give_up_when_down


def _pool() -> InstancePool:
    return InstancePool(load_config(overrides={"instances": [{"url": "http://127.0.0.1:9", "name": "a"}]}))


def test_the_checks_taking_the_instance_out_end_the_wait_as_a_timeout() -> None:
    async def main() -> None:
        pool = _pool()
        inst = pool.get("a")
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: pool.record_failure("a", fatal=True))
        with pytest.raises(TimeoutError):
            with give_up_when_down(inst):
                await asyncio.sleep(10)
        assert not inst.on_down  # nothing left registered
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # its own cancel taken back

    asyncio.run(asyncio.wait_for(main(), 5))


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def waiter(inst, entered: asyncio.Event) -> None:
        with give_up_when_down(inst):
            entered.set()
            await asyncio.sleep(10)

    async def main() -> None:
        pool = _pool()
        inst = pool.get("a")
        entered = asyncio.Event()
        task = asyncio.create_task(waiter(inst, entered))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not inst.on_down
        # both at once (the client gone and the instance down): still cancelled, not a timeout
        entered.clear()
        task = asyncio.create_task(waiter(inst, entered))
        await entered.wait()
        task.cancel()
        pool.record_failure("a", fatal=True)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 5))


def test_an_answer_in_time_leaves_nothing_behind() -> None:
    async def main() -> None:
        pool = _pool()
        inst = pool.get("a")
        with give_up_when_down(inst):
            await asyncio.sleep(0)
        assert not inst.on_down
        pool.record_failure("a", fatal=True)  # after the block: nothing happens to this task
        await asyncio.sleep(0.01)

    asyncio.run(main())
