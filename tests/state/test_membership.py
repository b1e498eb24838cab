"""Instances that join and leave at run time: capacity for newcomers, nothing left of leavers."""

from router.state.base import Booking, Load

from test_contract import GreedyChooser


async def test_a_dropped_instance_loses_residency_and_booked_load(make_store):
    store = await make_store()
    keys = [11, 12, 13]
    _, booking = await store.decide(keys, ["a"], GreedyChooser("r1", keys, only="a"))
    snap = await store.snapshot(keys, ["a", "b"])
    assert snap.matched["a"] == 3 and snap.loads["a"].requests == 1
    await store.drop_instance("a")
    snap = await store.snapshot(keys, ["a", "b"])
    assert snap.matched["a"] == 0 and snap.loads["a"] == Load()
    # the request still in flight to it ends later: released into nothing, never below zero
    await store.release(booking)
    snap = await store.snapshot(keys, ["a"])
    assert snap.loads["a"] == Load() and snap.matched["a"] == 0


async def test_a_newcomer_gets_the_capacity_it_declares(make_store):
    store = await make_store()
    store.set_capacity("new", 2)
    keys = [21, 22, 23, 24]
    for i, prefix in enumerate(([21, 22], [31, 32], [41, 42])):
        _, booking = await store.decide(prefix, ["new"], GreedyChooser(f"n{i}", prefix, only="new"))
        await store.release(booking)
    snap = await store.snapshot([41, 42], ["new"])
    assert snap.matched["new"] == 2  # the newest prefix is kept ...
    assert (await store.snapshot(keys[:2], ["new"])).matched["new"] == 0  # ... the oldest evicted at 2 entries
    assert isinstance(booking, Booking)
