import pytest

from router.state.memory import MemoryStore
from router.state.redis_store import RedisStore

CAPS = {"a": 8, "b": 8, "c": 8}


@pytest.fixture(params=["memory", "redis", "cluster"])
async def make_store(request, key_prefix):
    """Factory for stores of the parametrised backend (in memory, standalone Redis, a 3-node
    Redis Cluster); all share one namespace per test."""
    made = []
    url = request.getfixturevalue("redis_cluster_url" if request.param == "cluster" else "redis_url") \
        if request.param != "memory" else ""

    async def factory(caps=CAPS, **kwargs):
        if request.param == "memory":
            store = MemoryStore(caps, kwargs.get("residency_ttl_s", 600.0), default_cap=8)
        else:
            store = RedisStore(url, caps, key_prefix=kwargs.pop("key_prefix", key_prefix), default_cap=8,
                               cluster=request.param == "cluster", **kwargs)
        await store.start()
        made.append(store)
        return store

    factory.backend = request.param
    yield factory
    for store in made:
        await store.close()


@pytest.fixture(params=["redis", "cluster"])
def redis_target(request):
    """(url, cluster) of a standalone redis-server and of a 3-node Redis Cluster."""
    cluster = request.param == "cluster"
    return request.getfixturevalue("redis_cluster_url" if cluster else "redis_url"), cluster
