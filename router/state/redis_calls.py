"""Sending a list of ops (redis_layout.Op) to Redis in one round trip.

Standalone Redis: one call of lua/ops.lua carrying every op (Redis does not check slots
there, and one call costs the server less than several). Redis Cluster: the ops grouped by
hash tag, one call per tag, all in one pipeline; redis-py sends each node its share
concurrently, so the round trip is still one (the slowest node's). Ops of one tag keep
their order; ops of different tags touch different keys, so their order does not matter.

Resharding (a slot moving to another node): redis-py follows MOVED (patching its slot map,
never re-reading the whole topology: ``reinitialize_steps=0``, since a full refresh closes
every node's connections under the other requests in flight) and ASK, and retries TRYAGAIN
for a while. A script declaring several keys of a slot being migrated gets TRYAGAIN as long
as one of them exists on neither node yet (a residency look-up always declares blocks never
seen), so a call whose slot is still moving is sent once more after ``slot_retry_s``; if
its slot is still moving then and it only touches residency (a look-up and its records,
unholds, forget marks), it is skipped: its replies are None and the store decides on its
own residency view for that call (``residency_skipped``). Booked load is never skipped: a
booking that cannot land fails the call, as an outage does. Every op is idempotent (a
booking is applied once per id, releases and records re-apply to the same state), so the
second send is safe even when the first one ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import (
    AskError,
    ClusterError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from router.state.redis_layout import Arg, Op
from router.state.redis_pipe import PipedLine, pack_command

# What a failed call can raise (RedisClusterException is not a RedisError).
FAILURES: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)
# What a call whose slot is moving ends with once redis-py's own redirects gave up: MOVED and
# ASK (MovedError is an AskError), TRYAGAIN, CLUSTERDOWN and "TTL exhausted" (ClusterErrors),
# a slot no node claims for a moment.
SLOT_MOVING: tuple[type[BaseException], ...] = (AskError, TryAgainError, ClusterError, SlotNotCoveredError)
RESIDENCY_OPS = frozenset("LUG")  # ops on residency shards only (redis_layout.Layout)


class LinearPackConnection(Connection):
    """redis-py's asyncio ``pack_command`` re-copies its buffer once per argument until the
    buffer passes 6 KB, so a script call of 1,000 arguments (a 512-block prompt's keys and
    LRU members) cost ~2.4 ms of CPU to pack, 20x what Redis spends running it (hiredis does
    not help: the asyncio connection never uses its packer). The same bytes, joined once."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):  # a command name of several words ('SCRIPT LOAD') goes as several arguments
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        # str, int and bytes without the encoder's chain of type checks (same bytes)
        return [pack_command(args, self.encoder.encode)]


class Line:
    """Connections of the store's own for its one hot call, EVALSHA to a standalone Redis.

    redis-py's ``execute_command`` takes a connection from its pool under a lock, runs the
    call in a retry object (with no retries configured), records observability events at
    each step, and bounds the socket write with ``asyncio.wait_for`` (a task per call): about
    a quarter of a small call's CPU in the router (tools: loadtests/redis_instructions.py
    --router). Here: a list of idle connections made by the client's own pool settings, the
    connection's own pack, send and read, and one ``asyncio.timeout`` over the whole call.
    The same errors reach the store: a reply error (NoScriptError) as redis-py raises it, with
    the connection kept (its reply was read whole); any other failure (ConnectionError, a
    timeout: TimeoutError) closes the connection, whose late reply must never be read as the
    next call's. Bounded: at most ``keep`` idle connections (one per call in flight is made)."""

    def __init__(self, pool: aioredis.ConnectionPool, timeout_s: float | None, keep: int = 64) -> None:
        # the whole call is timed here, so the socket reads and writes are not (see above)
        self._kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        self._make: Callable[..., AbstractConnection] = pool.connection_class
        self._timeout_s = timeout_s
        self._keep = keep
        self._idle: list[AbstractConnection] = []

    async def call(self, *args: Arg) -> Any:
        conn = self._idle.pop() if self._idle else self._make(**self._kwargs)
        try:
            async with asyncio.timeout(self._timeout_s):
                await conn.send_packed_command(conn.pack_command(*args), check_health=False)  # connects if need be
                reply = await conn.read_response()
        except ResponseError:
            await self._put(conn)
            raise
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        await self._put(conn)
        return reply

    async def _put(self, conn: AbstractConnection) -> None:
        if len(self._idle) < self._keep:
            self._idle.append(conn)
        else:
            await conn.disconnect()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()


def cluster_client(url: str, **opts: Any) -> aioredis.RedisCluster:
    """A Cluster client whose node connections pack linearly too. RedisCluster fixes
    ``connection_class=Connection`` in the kwargs it hands every node it discovers, so it is
    swapped there (shared with its NodesManager) and on the seed nodes already built;
    tests/state/test_sharding.py checks it holds for every node."""
    client = aioredis.RedisCluster.from_url(url, reinitialize_steps=0, **opts)
    client.connection_kwargs["connection_class"] = LinearPackConnection
    for node in client.startup_nodes:
        node.connection_class = LinearPackConnection
    return client


def script_source() -> str:
    """lua/pins.lua then lua/ops.lua, as one script (the second calls the first's functions)."""
    lua = resources.files("router.state") / "lua"
    return (lua / "pins.lua").read_text() + "\n" + (lua / "ops.lua").read_text()


def _encode(ops: Sequence[Op]) -> tuple[list[str], list[Arg]]:
    keys: list[str] = []
    argv: list[Arg] = []
    for op in ops:
        keys += op.keys
        argv += [op.code, len(op.keys), len(op.args), *op.args]
    return keys, argv


class Runner:
    """Runs ops on a standalone client or a Cluster client, loading the script when missing."""

    def __init__(self, client: aioredis.Redis | aioredis.RedisCluster, cluster: bool, slot_retry_s: float = 0.05,
                 timeout_s: float | None = None) -> None:
        self._client = client
        self._cluster = cluster
        self._line: Line | PipedLine | None = None
        if not isinstance(client, aioredis.RedisCluster):
            pool = client.connection_pool
            self._line = PipedLine(pool, timeout_s) if PipedLine.serves(pool) else Line(pool, timeout_s)
        self._source = script_source()
        self._sha = ""
        self._slot_retry_s = slot_retry_s
        self.slot_retries = 0  # Cluster calls sent again because their slot was moving
        self.residency_skipped = 0  # residency-only calls given up on while their slot moved

    async def close(self) -> None:
        if self._line is not None:
            await self._line.close()

    async def load(self) -> None:
        """SCRIPT LOAD (on every primary of a Cluster)."""
        self._sha = str(await self._client.script_load(self._source))

    async def run(self, ops: Sequence[Op]) -> list[Any]:
        """Every op's reply, in order, after one round trip (None for the ops of a skipped
        residency call: module docstring)."""
        if not ops:
            return []
        if not self._sha:
            await self.load()
        for attempt in (1, 2):
            try:
                return await self._send(ops)
            except NoScriptError:  # Redis restarted, was flushed, or a node joined: load it, once
                if attempt == 2:
                    raise
                await self.load()
        raise AssertionError("unreachable")

    async def _send(self, ops: Sequence[Op]) -> list[Any]:
        if self._line is not None:
            keys, argv = _encode(ops)
            return list(await self._line.call("EVALSHA", self._sha, len(keys), *keys, *argv))
        groups: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            groups.setdefault(op.tag, []).append(i)
        results = await self._groups(ops, groups)
        moving = {tag: indices for tag, indices in groups.items() if isinstance(results[tag], SLOT_MOVING)}
        if moving:  # its slot is moving: once more, on the slot map redis-py patched meanwhile
            self.slot_retries += 1
            await asyncio.sleep(self._slot_retry_s)
            results.update(await self._groups(ops, moving))
        replies: list[Any] = [None] * len(ops)
        for tag, indices in groups.items():
            result = results[tag]
            if isinstance(result, BaseException):
                if isinstance(result, SLOT_MOVING) and all(ops[i].code in RESIDENCY_OPS for i in indices):
                    self.residency_skipped += 1
                    continue
                raise result
            for i, one in zip(indices, result):
                replies[i] = one
        return replies

    async def _groups(self, ops: Sequence[Op], groups: dict[str, list[int]]) -> dict[str, Any]:
        """One call per tag, all in one round trip: tag -> its replies, or what it raised."""
        client = self._client
        assert isinstance(client, aioredis.RedisCluster)
        calls = []
        for indices in groups.values():
            keys, argv = _encode([ops[i] for i in indices])
            calls.append(("EVALSHA", self._sha, len(keys), *keys, *argv))
        results: list[Any]
        if len(calls) == 1:
            tag = next(iter(groups))
            try:
                results = [await client.execute_command(*calls[0], target_nodes=client.get_node_from_key(tag))]
            except (RedisError, RedisClusterException) as exc:
                results = [exc]
        else:
            pipe = client.pipeline()
            for tag, call in zip(groups, calls):
                # execute_command: redis-py blocks the evalsha helper on Cluster pipelines, not the command.
                # target_nodes: the node of the tag's slot, looked up once instead of redis-py hashing every
                # key of the call (a 512-block prompt's KEYS) to check they share it; a redirected call is
                # re-sent by redis-py without it, by key.
                pipe.execute_command(*call, target_nodes=client.get_node_from_key(tag))
            results = await pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, NoScriptError):
                raise result
            if isinstance(result, BaseException) and not isinstance(result, (RedisError, RedisClusterException)):
                raise result
        return {tag: (result if isinstance(result, BaseException) else list(result)) for tag, result in zip(groups, results)}
