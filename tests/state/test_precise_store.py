"""Event residency over the memory and Redis stores: fresh instances route on what the
engine holds, stale ones on routing history."""

from router.kvevents.apply import TableWriter
from router.kvevents.wire import BlockRemoved, BlockStored
from router.request.hashing import root_seed, token_block_keys
from router.state.precise import EventResidency
from router.state.precise_store import PreciseStore
from test_contract import INSTANCES, GreedyChooser

TOKENS = list(range(1000, 1064))
KEYS = token_block_keys(TOKENS, 16, root_seed("m"), 100)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


async def precise(make_store, speculative_s=0.0, clock=None):
    inner = await make_store()
    residency = EventResidency(1000)
    writers = {}
    for inst in INSTANCES:
        table = residency.table(inst)
        table.fresh = True
        writers[inst] = TableWriter(table, "m", 16)
    store = PreciseStore(inner, residency, {i: 64 for i in INSTANCES}, speculative_s=speculative_s,
                         clock=clock or Clock())
    return store, residency, writers


async def test_fresh_instances_use_events_and_stale_ones_fall_back(make_store):
    store, residency, writers = await precise(make_store)
    # routing history: r1 went to b (so b holds the prefix as far as history knows)
    await store.decide(KEYS, INSTANCES, GreedyChooser("r1", KEYS, only="b"))
    # the engines say: a holds all four blocks, b none (it evicted them meanwhile)
    writers["a"].apply([BlockStored((1, 2, 3, 4), None, TOKENS, 16)])
    snap = await store.snapshot(KEYS, INSTANCES)
    assert snap.matched == {"a": 4, "b": 0, "c": 0}
    residency.mark_stale("b")  # b's stream had a gap: history again
    snap = await store.snapshot(KEYS, INSTANCES)
    assert snap.matched == {"a": 4, "b": 4, "c": 0}
    snap, booking = await store.decide(KEYS, INSTANCES, GreedyChooser("r2", KEYS))
    assert booking.instance in ("a", "b") and snap.matched["a"] == 4


async def test_eviction_on_the_engine_is_no_longer_counted(make_store):
    store, _, writers = await precise(make_store)
    writers["c"].apply([BlockStored((1, 2, 3, 4), None, TOKENS, 16)])
    _, booking = await store.decide(KEYS, INSTANCES, GreedyChooser("r1", KEYS))
    assert booking.instance == "c"
    await store.release(booking)
    writers["c"].apply([BlockRemoved((2, 3, 4))])
    assert (await store.snapshot(KEYS, INSTANCES)).matched["c"] == 1


async def test_a_just_routed_prefix_counts_until_it_starts_answering(make_store):
    clock = Clock()
    store, _, writers = await precise(make_store, speculative_s=2.0, clock=clock)
    _, first = await store.decide(KEYS, INSTANCES, GreedyChooser("r1", KEYS, only="a"))
    assert (await store.snapshot(KEYS, INSTANCES)).matched["a"] == 4  # before any event
    writers["a"].apply([BlockStored((1, 2), None, TOKENS[:32], 16)])  # the engine kept only two blocks
    await store.prefill_done(first)
    assert (await store.snapshot(KEYS, INSTANCES)).matched["a"] == 2  # from here on, the events say
    _, second = await store.decide(KEYS, INSTANCES, GreedyChooser("r2", KEYS, only="b"))
    clock.now += 3
    assert (await store.snapshot(KEYS, INSTANCES)).matched["b"] == 0  # never answered: expired


async def test_abandon_takes_back_the_history_and_the_speculation(make_store):
    store, residency, _ = await precise(make_store, speculative_s=2.0)
    snap, booking = await store.decide(KEYS, INSTANCES, GreedyChooser("r1", KEYS, only="b"))
    await store.abandon(booking, snap.matched)
    assert (await store.snapshot(KEYS, INSTANCES)).matched["b"] == 0
    residency.mark_stale("b")
    assert (await store.snapshot(KEYS, INSTANCES)).matched["b"] == 0  # nor in the history
    assert (await store.snapshot(KEYS, INSTANCES)).loads["b"].requests == 0


async def test_forget_instance_marks_it_stale(make_store):
    store, residency, writers = await precise(make_store)
    writers["a"].apply([BlockStored((1,), None, TOKENS[:16], 16)])
    await store.forget_instance("a")
    assert not residency.is_fresh("a")


async def test_pruning_sees_the_inner_load_index_and_holders_by_events_or_history(make_store):
    """Candidate pruning works in precise mode too: booked load is the inner store's index,
    and the first block's holders are those the events name (an engine that cached it for
    traffic that bypassed the router) plus those routing history names."""
    store, residency, writers = await precise(make_store)
    assert store.load_index() is store.inner.load_index()
    writers["c"].apply([BlockStored((1, 2), None, TOKENS[:32], 16)])  # c cached it, not through us
    await store.decide(KEYS, INSTANCES, GreedyChooser("r1", KEYS, only="b"))  # history says b
    residency.mark_stale("b")
    by_history = set(store.inner.first_block_holders(KEYS[0]))  # the memory store's index: {b}; Redis keeps none
    assert set(store.first_block_holders(KEYS[0])) == by_history | {"c"} and "a" not in by_history
    residency.mark_stale("c")  # a stale table names nobody
    assert "c" not in residency.holders(KEYS[0])
