"""Candidate pruning (router/scheduling/prune.py) against scoring every instance.

On a replayed synthetic trace, each decision is made twice on the same store state: once
over every instance (the reference, nothing booked) and once pruned (booked, so the replay
goes on). Agreement, precisely: the pruned choice is in the reference's near-tie set
(``Decision.acceptable``: estimates within ``tie_tolerance`` of the best), i.e. a choice
full scoring could itself have made.
"""

import random

import pytest

from router.core.instances import Candidate
from router.scheduling import RouteRequest
from router.scheduling.decide import decide as real_decide
from router.scheduling.prune import Pruner
from router.state.base import Booking, Load
from router.state.load_index import LoadIndex
from router.state.memory import MemoryStore
from router.tools.replay import sim as sim_module
from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.run import policy_for
from router.tools.replay.sim import Simulation
from router.tools.replay.synthetic import generate


@pytest.mark.parametrize("workload", ["shared_prefix:groups=12,users=4,system=3000,question=400,stages=6x20",
                                      "dispersed:requests=300,rate=12,input=2048,output=64"])
def test_pruned_decisions_are_ones_full_scoring_accepts(monkeypatch, workload):
    spec = ClusterSpec(mixed=24)
    sim = Simulation(generate(workload, seed=3), spec, policy_for("ttft", spec, 0))
    pruner = Pruner(4, random.Random(1))
    stats = {"decisions": 0, "pruned_to": 0, "same": 0}

    async def both(store, policy, req, candidates, *args, **kwargs):
        reference = policy.choose(req, candidates, store.snapshot_now(req.keys, [c.id for c in candidates]))
        pruned = pruner.prune(store, req, candidates)
        assert pruned is not None and len(pruned.candidates) < len(candidates)
        routed = await real_decide(store, policy, req, candidates, pruner=pruner)
        assert routed.decision.instance in reference.acceptable, (req.id, routed.decision.instance, reference.acceptable)
        stats["decisions"] += 1
        stats["pruned_to"] += len(pruned.candidates)
        stats["same"] += routed.decision.instance == reference.instance
        return routed

    monkeypatch.setattr(sim_module, "decide", both)
    sim.run()
    assert stats["decisions"] == len(sim.trace.requests)
    assert stats["pruned_to"] / stats["decisions"] < 12  # tens of instances at most, here well under half of 24


def test_holders_and_least_loaded_are_kept_and_pool_mean_is_carried():
    store = MemoryStore({}, 600.0, default_cap=100)
    cands = [Candidate(f"i{n}", cache_tokens=10_000, prefill_tokens_per_s=8000) for n in range(20)]
    keys = (11, 12, 13)

    class Book:
        def __init__(self, inst, n, prefill, k=()):
            self.b = Booking.single(f"{inst}-{n}", inst, prefill, 10, list(k))

        def __call__(self, snap):
            return self.b

    import asyncio

    async def setup():
        await store.decide(keys, ["i19"], Book("i19", 0, 5000, keys))  # a busy holder
        for n in range(18):  # every other instance busy except i3, i7
            if n not in (3, 7):
                await store.decide((), [f"i{n}"], Book(f"i{n}", 0, 100 * n))
    asyncio.run(setup())
    req = RouteRequest("r", keys, 3 * 16, 8, 16)
    pruned = Pruner(3, random.Random(0)).prune(store, req, cands)
    ids = [c.id for c in pruned.candidates]
    assert ids[0] == "i19"  # holder first, whatever its load
    assert set(ids[1:]) == {"i3", "i7", "i18"}  # the idle ones, before any loaded one
    assert set(Pruner(5, random.Random(0)).prune(store, req, cands).candidates) >= {cands[0], cands[1]}  # then least key
    assert pruned.request.population == (17, 20)
    # nothing to prune in a small pool
    assert Pruner(16, random.Random(0)).prune(store, req, cands) is None


def test_load_index_orders_and_totals():
    index = LoadIndex(request_tokens=10)
    index.update("a", Load(2, 100, 0, 0))
    index.update("b", Load(1, 0, 0, 0))
    index.update("c", Load(1, 500, 0, 0))
    assert list(index.ascending()) == ["b", "a", "c"] and index.total_requests == 4
    index.update("a", Load(0, 0, 0, 0))
    index.update("c", Load(1, 5, 0, 0))
    assert list(index.ascending()) == ["b", "c"] and index.total_requests == 2


def test_the_load_order_built_on_first_read_is_the_one_kept_from_the_start():
    """An index read only late (its order built then, from the keys) and one read from the
    start (kept sorted on every update) list the same instances in the same order, and keep
    agreeing on the updates after the late one's first read."""
    rng = random.Random(5)
    eager, late = LoadIndex(request_tokens=16), LoadIndex(request_tokens=16)
    list(eager.ascending())
    names = [f"i{i}" for i in range(40)]
    for step in range(3000):
        name = rng.choice(names)
        load = None if rng.random() < 0.2 else Load(rng.randrange(4), rng.choice([0, rng.randrange(3000)]),
                                                     rng.randrange(2), rng.randrange(2))
        eager.update(name, load)
        late.update(name, load)
        if step >= 1500 and step % 100 == 0:
            assert list(late.ascending()) == list(eager.ascending())
        assert late.total_requests == eager.total_requests and late.membership == eager.membership
    assert list(late.ascending()) == list(eager.ascending()) and dict(late.loaded) == dict(eager.loaded)


def test_the_pool_check_follows_instances_entering_and_leaving_the_load_index():
    """The pruner keeps "every loaded instance is in the pool" while no instance entered or
    left the index: one outside the pool must still be taken out of the pool's total."""
    store = MemoryStore({}, 600.0, default_cap=100)
    cands = [Candidate(f"i{n}", cache_tokens=10_000, prefill_tokens_per_s=8000) for n in range(12)]
    index = store.load_index()
    for n in range(12):
        index.update(f"i{n}", Load(1, 100 * n, 0, 0))
    pruner = Pruner(2, random.Random(0))
    req = RouteRequest("r", (), 16, 8, 16)
    assert pruner.prune(store, req, cands).request.population == (12, 12)
    assert pruner.prune(store, req, cands).request.population == (12, 12)  # the cached answer
    index.update("i3", Load(4, 300, 0, 0))  # a key change: same members
    assert pruner.prune(store, req, cands).request.population == (15, 12)
    index.update("outside", Load(5, 0, 0, 0))  # an instance of another pool enters
    assert pruner.prune(store, req, cands).request.population == (15, 12)
    index.update("outside", None)
    index.update("i0", None)
    assert pruner.prune(store, req, cands).request.population == (14, 12)
    assert pruner.prune(store, req, cands[1:]).request.population == (14, 11)  # another pool
    index.update("outside", Load(2, 0, 0, 0))
    assert pruner.prune(store, req, cands[1:]).request.population == (14, 11)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_live_policy_wrapped_for_external_load_is_pruned_and_still_finds_the_least_loaded(monkeypatch, seed):
    """The live router wraps every policy in ExternalLoadPolicy. Its decisions are pruned too
    (they once scored every instance: the wrapper hid the route generator), and load that
    only the engines report — here heavy, on instances the index lists as least booked —
    does not push the least-loaded instance out of the scored set."""
    from router.engines.external import ExternalLoadPolicy

    spec = ClusterSpec(mixed=24)
    rng = random.Random(seed)
    extra: dict[str, Load] = {}
    sim = Simulation(generate("dispersed:requests=240,rate=12,input=2048,output=64", seed=seed), spec,
                     ExternalLoadPolicy(policy_for("ttft", spec, 0), lambda: extra))
    pruner = Pruner(4, random.Random(1))
    stats = {"decisions": 0, "scored": 0}

    async def both(store, policy, req, candidates, *args, **kwargs):
        extra.clear()
        index = store.load_index()
        least = [c.id for c in candidates if c.id not in index.loaded] + list(index.ascending())
        for inst in least[:6] + rng.sample([c.id for c in candidates], 2):
            extra[inst] = Load(requests=rng.randrange(2, 9), prefill_tokens=rng.randrange(4000, 40000))
        reference = policy.choose(req, candidates, store.snapshot_now(req.keys, [c.id for c in candidates]))
        routed = await real_decide(store, policy, req, candidates, pruner=pruner)
        assert routed.decision.instance in reference.acceptable, (req.id, routed.decision.instance, reference.acceptable)
        stats["decisions"] += 1
        stats["scored"] += len(routed.decision.scores) + len(routed.decision.filtered)
        return routed

    monkeypatch.setattr(sim_module, "decide", both)
    sim.run()
    assert stats["decisions"] == len(sim.trace.requests)
    assert stats["scored"] / stats["decisions"] < 16  # pruned: 4 least loaded + those with external load + holders, of 24


def test_external_load_is_kept_but_not_counted_among_the_least_loaded():
    store = MemoryStore({}, 600.0, default_cap=100)
    cands = [Candidate(f"i{n}", cache_tokens=10_000, prefill_tokens_per_s=8000) for n in range(12)]
    index = store.load_index()
    for n in range(12):
        index.update(f"i{n}", Load(1, 100 * n, 0, 0))
    req = RouteRequest("r", (), 16, 8, 16)
    plain = Pruner(2, random.Random(0)).prune(store, req, cands)
    assert [c.id for c in plain.candidates] == ["i0", "i1"]
    elsewhere = {"i0": Load(requests=5), "i2": Load(requests=1)}
    pruned = Pruner(2, random.Random(0)).prune(store, req, cands, elsewhere)
    assert [c.id for c in pruned.candidates] == ["i0", "i1", "i2", "i3"]  # two without external load, and those with
    assert pruned.request.population == (12 + 6, 12)  # the mean the scorers' snapshot (booked + external) gives
