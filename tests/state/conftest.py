import pytest

from router.state.memory import MemoryStore
from router.state.redis_store import RedisStore

CAPS = {"a": 8, "b": 8, "c": 8}


@pytest.fixture(params=["memory", "redis"])
async def make_store(request, redis_url, key_prefix):
    """Factory for stores of the parametrised backend; all share one namespace per test."""
    made = []

    async def factory(caps=CAPS, **kwargs):
        if request.param == "memory":
            store = MemoryStore(caps, kwargs.get("residency_ttl_s", 600.0), default_cap=8)
        else:
            store = RedisStore(redis_url, caps, key_prefix=kwargs.pop("key_prefix", key_prefix), default_cap=8, **kwargs)
        await store.start()
        made.append(store)
        return store

    factory.backend = request.param
    yield factory
    for store in made:
        await store.close()
