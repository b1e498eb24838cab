"""The standalone store's pipelined connection (redis_pipe.PipedLine), on a real redis-server:
every call in flight on one connection, each reply read as its own call's whatever happens
around it (errors, a caller that went away, a timeout, a killed connection)."""

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from router.state.redis_calls import FAILURES, Line, LinearPackConnection, Runner
from router.state.redis_pipe import PipedLine, pack_command
from router.tools.process import free_port


@contextlib.asynccontextmanager
async def piped(url: str, timeout_s: float = 1.0) -> AsyncIterator[tuple[aioredis.Redis, PipedLine]]:
    """A client (for set-up and checks) and the pipelined line of its pool, both closed after."""
    client = aioredis.from_url(url, decode_responses=True, connection_class=LinearPackConnection)
    assert PipedLine.serves(client.connection_pool)
    line = PipedLine(client.connection_pool, timeout_s)
    try:
        yield client, line
    finally:
        await line.close()
        await client.aclose()


async def test_calls_in_flight_share_one_connection_and_each_gets_its_own_reply(redis_url):
    async with piped(redis_url) as (client, line):
        sha = await client.script_load("return {ARGV[1], tonumber(ARGV[2]) * 2}")
        rng = random.Random(4)

        async def one(i: int):
            await asyncio.sleep(rng.random() * 0.002)
            kind = i % 4
            if kind == 0:
                return await line.call("ECHO", f"v{i}")
            if kind == 1:
                return await line.call("EVALSHA", sha, 0, f"s{i}", i)
            if kind == 2:
                try:
                    await line.call("EVALSHA", "0" * 40, 0)
                except NoScriptError:  # a reply error is that call's, parsed whole
                    return "noscript"
            return await line.call("CLIENT", "ID")

        replies = await asyncio.gather(*(one(i) for i in range(400)))
        for i, reply in enumerate(replies):
            if i % 4 < 3:
                assert reply == (f"v{i}", [f"s{i}", 2 * i], "noscript")[i % 4], i
        assert len({replies[i] for i in range(3, 400, 4)}) == 1  # one connection carried them all


async def test_a_caller_that_goes_away_leaves_its_reply_dropped_in_step(redis_url):
    async with piped(redis_url) as (client, line):
        first = await line.call("CLIENT", "ID")
        gone = asyncio.ensure_future(line.call("DEBUG", "SLEEP", "0.2"))
        await asyncio.sleep(0.05)
        behind = asyncio.ensure_future(line.call("ECHO", "behind"))  # queued after the sleeper's reply
        gone.cancel()
        assert await behind == "behind"
        assert await line.call("ECHO", "next") == "next"
        assert await line.call("CLIENT", "ID") == first  # cancelling a caller kept the connection


async def test_a_call_that_times_out_closes_the_connection_and_no_late_reply_is_misread(redis_url):
    async with piped(redis_url, timeout_s=0.1) as (client, line):
        first = await line.call("CLIENT", "ID")
        with pytest.raises(asyncio.TimeoutError):
            await line.call("DEBUG", "SLEEP", "0.3")  # its "OK" arrives after the timeout
        await asyncio.sleep(0.35)  # the late "OK" is on its way to the closed connection
        assert await line.call("ECHO", "mine") == "mine"
        assert await line.call("CLIENT", "ID") != first  # a new connection


async def test_a_killed_connection_fails_its_calls_and_the_next_call_reconnects(redis_url):
    async with piped(redis_url) as (client, line):
        victim = await line.call("CLIENT", "ID")
        blocked = asyncio.ensure_future(line.call("BLPOP", f"nothing-{victim}", "0.8"))  # blocks this client only
        waiting = asyncio.ensure_future(line.call("ECHO", "lost"))  # behind it on the same connection
        await asyncio.sleep(0.05)
        await client.client_kill_filter(_id=victim)
        for call in (blocked, waiting):
            with pytest.raises(RedisConnectionError) as failed:
                await call
            assert isinstance(failed.value, FAILURES)
        assert await line.call("ECHO", "again") == "again"
        assert await line.call("CLIENT", "ID") != victim


@pytest.mark.parametrize("kind", [PipedLine, Line])
async def test_an_unreachable_redis_fails_as_the_store_expects(kind):
    client = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0", decode_responses=True,
                               connection_class=LinearPackConnection)
    line = kind(client.connection_pool, 1.0)
    try:
        with pytest.raises(RedisConnectionError) as failed:
            await line.call("PING")
        assert isinstance(failed.value, FAILURES)
    finally:
        await line.close()
        await client.aclose()


async def test_the_url_s_user_password_and_database_are_used(redis_url):
    admin = aioredis.from_url(redis_url, decode_responses=True)
    parts = urlsplit(redis_url)
    user = f"piped{free_port()}"
    await admin.acl_setuser(user, enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all"])
    try:
        async with piped(f"redis://{user}:s3cret@{parts.hostname}:{parts.port}/5") as (client, line):
            await line.call("SET", f"{user}:k", "in db 5")
            info = await line.call("CLIENT", "INFO")
            assert f"user={user}" in info and "db=5" in info
            assert await admin.get(f"{user}:k") is None  # not in db 0
            assert await line.call("DEL", f"{user}:k") == 1
        async with piped(f"redis://{user}:wrong@{parts.hostname}:{parts.port}/5") as (client, line):
            with pytest.raises((AuthenticationError, ResponseError)):
                await line.call("PING")
    finally:
        await admin.acl_deluser(user)
        await admin.aclose()


async def test_a_large_argument_and_reply_cross_whole(redis_url):
    async with piped(redis_url) as (client, line):
        big = "x" * (3 << 20)  # past the transport's write buffer: flow control pauses and resumes
        replies = await asyncio.gather(line.call("ECHO", big), line.call("ECHO", "small"))
        assert replies == [big, "small"]


def test_commands_are_packed_as_redis_py_packs_them(monkeypatch):
    from redis.asyncio.connection import Connection

    from router.state import redis_pipe

    args = ("EVALSHA", "ab" * 20, 2, "k1", "k\u00e9", -7, b"\x00raw", 1.5, 2**70)
    for packer in (redis_pipe._C_PACK, None):  # hiredis's, then the Python one
        monkeypatch.setattr(redis_pipe, "_C_PACK", packer)
        assert [pack_command(args)] == [pack_command(list(args))] == Connection().pack_command(*args)
        with pytest.raises(TypeError):
            pack_command(("SET", "k", object()))
        assert pack_command(("SET", "k", memoryview(b"v")), bytes) == Connection().pack_command("SET", "k", b"v")[0]


async def test_the_store_runs_on_the_pipe_for_tcp_and_keeps_connections_per_call_for_tls(redis_url):
    tcp = aioredis.from_url(redis_url, decode_responses=True, connection_class=LinearPackConnection)
    tls = aioredis.from_url("rediss://127.0.0.1:1/0", decode_responses=True)
    try:
        assert isinstance(Runner(tcp, cluster=False)._line, PipedLine)
        assert isinstance(Runner(tls, cluster=False)._line, Line)
    finally:
        await tcp.aclose()
        await tls.aclose()
