"""The standalone store's connection per call (redis_calls.Line: TLS URLs; the others use
redis_pipe.PipedLine), on a real redis-server: the errors redis-py's client gave, and no reply
ever read as another call's. An unreachable Redis: tests/state/test_redis_pipe.py, for both."""

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from router.state.redis_calls import LinearPackConnection, Line


def make_line(url: str, timeout_s: float = 1.0, keep: int = 64) -> tuple[aioredis.Redis, Line]:
    client = aioredis.from_url(url, decode_responses=True, connection_class=LinearPackConnection)
    return client, Line(client.connection_pool, timeout_s, keep)


async def test_a_call_that_times_out_leaves_no_late_reply_for_the_next_one(redis_url):
    client, line = make_line(redis_url, timeout_s=0.1)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await line.call("DEBUG", "SLEEP", "0.3")  # its "OK" arrives after the timeout
        assert len(line._idle) == 0  # that connection is closed, never reused
        await asyncio.sleep(0.4)  # (the server sleeps on: the late "OK" is on its way by now)
        assert await line.call("ECHO", "mine") == "mine"
        assert await line.call("ECHO", "again") == "again"
    finally:
        await line.close()
        await client.aclose()


async def test_a_reply_error_is_raised_and_keeps_the_connection(redis_url):
    client, line = make_line(redis_url)
    try:
        first = await line.call("CLIENT", "ID")
        with pytest.raises(NoScriptError):  # what the runner reloads the script on
            await line.call("EVALSHA", "0" * 40, 0)
        assert await line.call("CLIENT", "ID") == first  # the same connection: its reply was read whole
        sha = await client.script_load("return {ARGV[1], tonumber(ARGV[2]) + 1}")
        assert await line.call("EVALSHA", sha, 0, "x", 41) == ["x", 42]
    finally:
        await line.close()
        await client.aclose()


async def test_idle_connections_are_bounded_and_each_call_in_flight_has_its_own(redis_url):
    client, line = make_line(redis_url, keep=2)
    try:
        ids = await asyncio.gather(*(line.call("CLIENT", "ID") for _ in range(6)))
        assert len(line._idle) <= 2
        assert len(set(ids)) >= 2  # calls in flight at once did not share a connection
        assert await line.call("ECHO", "x") == "x"
    finally:
        await line.close()
        await client.aclose()
