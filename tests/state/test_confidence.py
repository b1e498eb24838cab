"""The LRU position model: an entry's confidence falls as traffic pushes through its instance."""

import pytest

from router.state.memory import MemoryStore
from router.state.residency import ResidencyIndex


def test_a_fresh_entry_is_certain_and_traffic_through_the_instance_lowers_it():
    idx = ResidencyIndex(ttl_s=600, margin=0.5)
    idx.record("a", [1, 2, 3, 4], cap=100, now=0)
    assert idx.confidence("a", 4) == 1.0
    previous = 1.0
    for batch in range(1, 10):  # other tenants' prefixes, 10 blocks each
        idx.record("a", list(range(1000 * batch, 1000 * batch + 10)), cap=100, now=0)
        c = idx.confidence("a", 4)
        assert c <= previous
        previous = c
    assert 0.0 < previous < 0.5  # near the old end of a full LRU, still listed
    assert idx.matched([1, 2, 3, 4], ["a"], now=1) == {"a": 4}  # the belief is kept, only trusted less


def test_traffic_through_another_instance_changes_nothing():
    idx = ResidencyIndex(ttl_s=600, margin=0.5)
    idx.record("a", [1, 2, 3, 4], cap=100, now=0)
    for batch in range(1, 10):
        idx.record("b", list(range(1000 * batch, 1000 * batch + 10)), cap=100, now=0)
    assert idx.confidence("a", 4) == 1.0


def test_touching_a_prefix_again_restores_its_confidence():
    idx = ResidencyIndex(ttl_s=600, margin=0.5)
    idx.record("a", [1, 2, 3, 4], cap=40, now=0)
    idx.record("a", list(range(100, 130)), cap=40, now=0)
    assert idx.confidence("a", 4) < 1.0
    idx.record("a", [1, 2, 3, 4], cap=40, now=0)
    assert idx.confidence("a", 4) == 1.0


def test_an_empty_cache_trusts_everything_and_an_evicted_entry_is_zero():
    idx = ResidencyIndex(ttl_s=600)
    idx.record("a", [1, 2], cap=1000, now=0)
    idx.record("a", list(range(10, 20)), cap=1000, now=0)
    assert idx.confidence("a", 2) == 1.0  # 12 of 1000 blocks in use: far from eviction
    idx.record("a", list(range(100, 2000)), cap=1000, now=0)
    assert idx.confidence("a", 2) == 0.0 and idx.confidence("z", 2) == 0.0


def test_bad_margin_is_refused():
    with pytest.raises(ValueError):
        ResidencyIndex(ttl_s=1, margin=0)


async def test_the_snapshot_carries_the_confidence_and_the_ttft_estimate_uses_it():
    import random

    from router.config.model import PolicyConfig
    from router.scheduling import Candidate, RouteRequest, build_policy
    from router.state.base import Booking

    store = MemoryStore({"a": 64, "b": 64}, clock=lambda: 0.0)
    prefix = list(range(16))
    store.book(Booking.single("x", "a", 0, 0, prefix))
    store.book(Booking.single("y", "b", 0, 0, prefix))
    for n in range(4):  # a's cache churns with other prefixes, b's does not
        store.book(Booking.single(f"z{n}", "a", 0, 0, list(range(100 * (n + 1), 100 * (n + 1) + 11))))
    snap = await store.snapshot(prefix, ["a", "b"])
    assert snap.matched == {"a": 16, "b": 16}
    assert snap.confidence["b"] == 1.0 and snap.confidence["a"] < 1.0
    policy = build_policy(PolicyConfig(name="ttft"), rng=random.Random(0))
    d = policy.choose(RouteRequest("r", tuple(prefix), 1024, 16, 64), [Candidate("a"), Candidate("b")], snap)
    assert d.instance == "b"  # the same match, more likely still there


def test_a_prefix_touched_again_lives_a_ttl_from_its_last_touch():
    idx = ResidencyIndex(ttl_s=10)
    idx.record("a", [1, 2, 3], cap=100, now=0)
    idx.record("a", [1, 2], cap=100, now=8)  # a shorter prompt with the same head
    assert idx.matched([1, 2, 3], ["a"], now=10.5) == {"a": 2}  # block 3 expired, the touched run did not
    assert idx.holders(1, now=10.5) == ["a"]
    assert idx.matched([1, 2, 3], ["a"], now=18.5) == {"a": 0} and idx.holders(1, now=18.5) == []
    idx.record("a", [7, 8], cap=100, now=19)  # recording purges what expired
    assert idx.fill("a") == 2 / 100


def test_a_held_prefix_extended_keeps_its_head_newest_and_evicts_tail_first():
    idx = ResidencyIndex(ttl_s=600)
    idx.record("a", [1, 2], cap=6, now=0)
    idx.record("a", [9, 10], cap=6, now=0)
    idx.record("a", [1, 2, 3, 4], cap=6, now=0)  # 1, 2 held: 3, 4 join behind them
    idx.record("a", [20], cap=6, now=0)  # one over the cap: 10 (the oldest) goes; then 9
    assert idx.matched([9, 10], ["a"], now=1) == {"a": 1}
    idx.record("a", [21], cap=6, now=0)
    assert idx.matched([9, 10], ["a"], now=1) == {"a": 0}
    assert idx.matched([1, 2, 3, 4], ["a"], now=1) == {"a": 4}
    idx.record("a", [30, 31, 32], cap=6, now=0)  # three go, the deepest of the prefix first
    assert idx.matched([1, 2, 3, 4], ["a"], now=1) == {"a": 1}


async def test_both_stores_give_decisions_the_lru_confidence(make_store):
    # a's cache (cap 40) churns with another prefix after it got this one, which now sits
    # at the old end of its LRU; both stores' decisions see a's match at lower confidence
    # (Redis: from the replica's local mirror, at no extra round trip).
    from state.test_contract import GreedyChooser  # type: ignore[import-not-found]

    store = await make_store({"a": 40, "b": 40})
    prefix = [1, 2]
    await store.decide(prefix, ["a"], GreedyChooser("x", prefix, only="a"))
    other = list(range(100, 137))
    await store.decide(other, ["a"], GreedyChooser("z", other, only="a"))
    seen: list[dict[str, float]] = []
    rooms: list[dict[str, tuple[int, float, float]]] = []

    class Spy(GreedyChooser):
        def __call__(self, snap):
            seen.append(dict(snap.confidence))
            rooms.append(dict(snap.room))
            return super().__call__(snap)

    snap, _ = await store.decide(prefix, ["a", "b"], Spy("r", prefix, only="a"))
    assert snap.matched["a"] == 2
    assert 0.0 < seen[0]["a"] < 1.0 and 0.0 < snap.confidence["a"] < 1.0
    # and the cache room of the displacement model (router/state/displacement.py): one of a's
    # 40 blocks is free, nothing in the pool has settled (the prior: one re-prefill); b has seen nothing
    assert rooms[0]["a"] == snap.room["a"] == (1, 1.0, 1.0) and "b" not in rooms[0]


def _session_near_the_old_end(idx: ResidencyIndex) -> list[int]:
    """a (cap 40) holds a session: an 8-block system prompt every request touches, then a
    16-block history that three other sessions' requests (each with the system prompt)
    pushed to the old end of a's LRU and partly out of it. Returns the session's keys."""
    system, history = list(range(1, 9)), list(range(100, 116))
    idx.record("a", system + history, cap=40, now=0)
    for other in (200, 300, 400):
        idx.record("a", system + list(range(other, other + 8 if other < 400 else other + 4)), cap=40, now=0)
    return system + history


def test_a_run_near_the_old_end_keeps_its_fresh_head():
    # The engine evicts a run tail first: the system prompt every request touches is still
    # held whatever happens to the history behind it, so the expected held run is at least
    # the system prompt, not the whole run at the deepest block's confidence.
    idx = ResidencyIndex(ttl_s=600, margin=0.25)
    keys = _session_near_the_old_end(idx)
    depth = idx.matched(keys, ["a"], now=0)["a"]
    assert depth == 20  # 4 of the history's 16 blocks evicted
    deepest = idx.confidence("a", keys[depth - 1])
    assert deepest < 0.1  # the deepest held block is about to go
    assert all(idx.confidence("a", k) == 1.0 for k in keys[:8])
    expected = idx.confidences(keys, {"a": depth})["a"] * depth
    assert 8.0 <= expected < depth  # the head counts whole, the old tail is discounted
    assert expected > deepest * depth + 7.0


def test_a_run_that_is_fresh_or_one_block_long_keeps_its_own_confidence():
    idx = ResidencyIndex(ttl_s=600, margin=0.25)
    idx.record("a", [1, 2, 3], cap=40, now=0)
    assert idx.confidences([1, 2, 3, 4], {"a": 3, "b": 0}) == {"a": 1.0}
    idx.record("a", list(range(100, 139)), cap=40, now=0)  # pushes 1..3 to the old end: 2 and 3 evicted
    assert idx.matched([1, 2, 3], ["a"], now=0) == {"a": 1}
    assert idx.confidences([1, 2, 3], {"a": 1}) == {"a": idx.confidence("a", 1)}


def test_steady_traffic_does_not_keep_an_untouched_prefix_alive_past_its_ttl():
    """Expiry marks are kept per ttl/64 period; a mark's period starts at its first touch.
    (A mark whose period moved with every touch covered everything since traffic began:
    an instance touched more often than every ttl/64 never expired anything.)"""
    idx = ResidencyIndex(ttl_s=64)  # a mark per second
    idx.record("a", [1, 2, 3], cap=100_000, now=0)
    for k in range(1, 261):  # another prompt every quarter second, to 65 s
        idx.record("a", [1000 + k], cap=100_000, now=k / 4)
        if k / 4 < 64:
            assert idx.matched([1, 2, 3], ["a"], now=k / 4) == {"a": 3}  # never early
    assert idx.matched([1, 2, 3], ["a"], now=65.01) == {"a": 0}  # at most ttl/64 late
    assert idx.holders(1, now=65.01) == []
    assert idx.matched([1099], ["a"], now=65.01) == {"a": 1}  # touched at 24.75 s: alive
    assert len(idx._marks["a"]) <= 66  # still a mark per period, not per record
