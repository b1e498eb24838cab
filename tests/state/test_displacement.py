"""The LRU displacement model: what a copy costs an instance's cache, from whether the
blocks it evicts come back."""

from router.state.memory import MemoryStore
from router.state.residency import ResidencyIndex


def _prefix(tenant: int, blocks: int = 10) -> list[int]:
    return list(range(1000 * tenant, 1000 * tenant + blocks))


def test_an_instance_in_a_pool_without_settled_evictions_prices_one_re_prefill():
    idx = ResidencyIndex(ttl_s=600)
    assert "a" not in idx.rooms()
    idx.record("a", _prefix(1), cap=40, now=0)
    assert idx.rooms()["a"] == (30, 1.0, 1.0)  # the prior: an eviction as likely as not to come back


def test_an_eviction_not_yet_asked_for_is_not_counted_cold():
    idx = ResidencyIndex(ttl_s=600)
    for tenant in range(1, 6):  # a cache of four prefixes: the fifth evicts the first, not asked for yet
        idx.record("a", _prefix(tenant), cap=40, now=0)
    assert idx.rooms()["a"] == (0, 1.0, 1.0)  # still the prior: the eviction has not had its window
    idx.record("a", _prefix(1), cap=40, now=0)  # it comes back (and evicts the second)
    assert idx.rooms()["a"][1] > 1.0


def test_an_instance_without_evictions_of_its_own_prices_at_the_pools_share():
    hot, cold = ResidencyIndex(ttl_s=600), ResidencyIndex(ttl_s=600)
    for _ in range(30):
        for tenant in range(1, 6):  # five tenants in a four-prefix cache: every eviction returns
            hot.record("a", _prefix(tenant), cap=40, now=0)
    for tenant in range(1, 60):  # every prefix once: no eviction returns
        cold.record("a", _prefix(tenant), cap=40, now=0)
    for idx in (hot, cold):
        idx.record("b", _prefix(1), cap=40, now=0)
        for tenant in range(200, 204):  # b fills and evicts its first prefix
            idx.record("b", _prefix(tenant), cap=40, now=0)
    assert hot.rooms()["b"][0] == 0 and hot.rooms()["b"][1] > 4.0
    assert cold.rooms()["b"][0] == 0 and cold.rooms()["b"][1] < 0.2


def test_evicting_cold_blocks_makes_a_copy_cheap():
    idx = ResidencyIndex(ttl_s=600)
    for tenant in range(1, 60):  # every prefix seen once: what is evicted never returns
        idx.record("a", _prefix(tenant), cap=40, now=0)
    free, misses, _ = idx.rooms()["a"]
    assert free == 0 and misses < 0.2


def test_evicted_blocks_that_come_back_make_a_copy_dear():
    idx = ResidencyIndex(ttl_s=600)
    for _ in range(30):  # five tenants of 10 blocks share a 40-block cache, round robin
        for tenant in range(1, 6):
            idx.record("a", _prefix(tenant), cap=40, now=0)
    free, misses, _ = idx.rooms()["a"]
    assert free == 0 and misses > 4.0  # each returns after one other: q near its bound


def test_hot_and_cold_traffic_lands_in_between_and_only_on_its_instance():
    idx = ResidencyIndex(ttl_s=600)
    cold = 100
    for _ in range(30):
        for tenant in range(1, 4):
            idx.record("a", _prefix(tenant), cap=40, now=0)
            cold += 1
            idx.record("a", _prefix(cold), cap=40, now=0)  # a one-off prompt after each
    idx.record("b", _prefix(1), cap=40, now=0)
    _, misses, _ = idx.rooms()["a"]
    assert 0.3 < misses < 4.0
    free, pooled, _ = idx.rooms()["b"]  # b evicted nothing: the pool's share (a's, without a's prior)
    assert free == 30 and 0.3 < pooled < 4.0


def test_forget_drops_the_room_and_the_ghosts():
    idx = ResidencyIndex(ttl_s=600)
    for _ in range(10):
        for tenant in range(1, 6):
            idx.record("a", _prefix(tenant), cap=40, now=0)
    idx.forget("a")
    assert "a" not in idx.rooms()
    idx.record("a", _prefix(1), cap=40, now=0)
    assert idx.rooms()["a"] == (30, 1.0, 1.0)  # re-recording a forgotten prefix is no re-use: the prior again


def test_the_ghost_list_is_bounded_by_the_capacity():
    idx = ResidencyIndex(ttl_s=600)
    for tenant in range(1, 500):
        idx.record("a", _prefix(tenant), cap=40, now=0)
    assert len(idx._displacement._ghosts) <= 80


def test_the_memory_store_hands_the_room_to_the_policy():
    store = MemoryStore({"a": 40, "b": 40})
    store.record_residency("a", _prefix(1))
    snap = store.snapshot_now(_prefix(1), ["a", "b"])
    assert snap.room["a"] == (30, 1.0, 1.0) and "b" not in snap.room


def test_a_re_use_counts_wherever_the_router_sends_the_request():
    # every prefix goes to a once; the ones a has just evicted are asked for again on b
    idx, other = ResidencyIndex(ttl_s=600), ResidencyIndex(ttl_s=600)
    for tenant in range(1, 80):
        for index in (idx, other):
            index.record("a", _prefix(tenant), cap=40, now=0)
        if tenant > 5:
            idx.record("b", _prefix(tenant - 5), cap=40, now=0)  # in idx only
    assert other.rooms()["a"][1] < 0.2  # without those requests a's evictions are cold
    assert idx.rooms()["a"][1] > 4.0


def test_a_forgotten_instance_leaves_the_pools_share():
    idx = ResidencyIndex(ttl_s=600)
    for _ in range(30):
        for tenant in range(1, 6):  # a: every eviction returns
            idx.record("a", _prefix(tenant), cap=40, now=0)
    for tenant in range(100, 160):  # b: none does
        idx.record("b", _prefix(tenant), cap=40, now=0)
    both = idx._displacement.pool_share()
    idx.forget("a")
    assert 0.1 < both < 0.9
    assert idx._displacement.pool_share() < 0.05  # b's alone
    idx.forget("b")
    assert idx._displacement.pool_share() == 0.5  # nothing settled: the prior


def test_the_pools_share_rides_with_each_instances_own_as_of_its_last_record():
    # a's evictions all come back, c's never: their own shares differ, the pool's is one figure
    # (both instances' settled evictions together), handed with each instance's room
    idx = ResidencyIndex(ttl_s=600)
    for _ in range(30):
        for tenant in range(1, 6):
            idx.record("a", _prefix(tenant), cap=40, now=0)
    for tenant in range(100, 400):
        idx.record("c", _prefix(tenant), cap=40, now=0)
    idx.record("a", _prefix(1), cap=40, now=0)  # a's room is refreshed after c's evictions settled
    own_a, pool_a = idx.rooms()["a"][1:]
    own_c, pool_c = idx.rooms()["c"][1:]
    assert own_c < pool_a < own_a
    share = idx._displacement.pool_share()
    assert pool_a == min(0.9, share) / (1 - min(0.9, share))
    assert own_c < pool_c < own_a  # as of c's last record
