"""shielded(): the end of a request's bookkeeping runs to completion."""

import asyncio

import anyio
import pytest

from router.core.shielded import shielded


async def test_a_coroutine_that_never_suspends_runs_inline_and_returns_its_value():
    steps = []

    async def end() -> int:
        steps.append("ran")
        return 7

    assert await shielded(end()) == 7 and steps == ["ran"]


async def test_one_that_suspends_finishes_even_when_its_cancel_scope_is_cancelled():
    finished = []

    async def end() -> str:
        await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        finished.append(True)
        return "done"

    with anyio.CancelScope() as scope:
        async def cancel_soon() -> None:
            await asyncio.sleep(0.01)
            scope.cancel()

        canceller = asyncio.get_running_loop().create_task(cancel_soon())
        assert await shielded(end()) == "done"
        await canceller
    assert finished == [True]


async def test_errors_come_out_whether_raised_inline_or_after_suspending():
    async def inline() -> None:
        raise ValueError("inline")

    async def later() -> None:
        await asyncio.sleep(0)
        raise KeyError("later")

    with pytest.raises(ValueError):
        await shielded(inline())
    with pytest.raises(KeyError):
        await shielded(later())


async def test_values_sent_back_into_the_coroutine_arrive():
    async def end() -> int:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, 5)
        return await future + 1

    assert await shielded(end()) == 6
