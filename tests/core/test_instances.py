import httpx

from router.config.model import RouterConfig
from router.core.health import HealthChecker
from router.core.instances import InstancePool
from router.state.memory import MemoryStore
from router.state.base import Booking


def pool_and_client(status: dict[str, int]):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status[request.url.host])

    config = RouterConfig(instances=[{"url": "http://a:1", "name": "a"}, {"url": "http://b:1", "name": "b"}],
                          health={"failures_to_unhealthy": 2, "successes_to_healthy": 1})
    return InstancePool(config), httpx.AsyncClient(transport=httpx.MockTransport(handler)), config


async def test_health_transitions_and_recovered_instance_loses_residency():
    status = {"a": 200, "b": 200}
    pool, client, config = pool_and_client(status)
    store = MemoryStore({"a": 100, "b": 100})
    _, booking = await store.decide([1, 2], ["a", "b"], _Only("a", [1, 2]))
    await store.release(booking)
    checker = HealthChecker(pool, client, config.health, store.forget_instance)
    status["a"] = 503
    await checker.check_all()
    assert pool.get("a").healthy  # one failure is not enough
    await checker.check_all()
    assert not pool.get("a").healthy and pool.get("b").healthy
    assert (await store.snapshot([1, 2], ["a"])).matched["a"] == 2  # down, but maybe only briefly
    status["a"] = 200
    await checker.check_all()
    assert pool.get("a").healthy
    assert (await store.snapshot([1, 2], ["a"])).matched["a"] == 0  # back: assume it restarted cold
    await client.aclose()


def test_connection_refused_marks_down_at_once():
    pool, _, _ = pool_and_client({})
    pool.record_failure("b", fatal=True)
    assert not pool.get("b").healthy and [i.id for i in pool.healthy(("mixed",))] == ["a"]


class _Only:
    def __init__(self, inst, keys):
        self.inst, self.keys = inst, keys

    def __call__(self, snap):
        return Booking.single("x", self.inst, 0, 0, self.keys)

    def revise(self, snap, booking):
        return None
