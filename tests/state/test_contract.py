"""The StateStore contract, run against the memory store and a real redis-server."""

import asyncio

from router.state.base import Booking, Leg, Load, Snapshot

INSTANCES = ["a", "b", "c"]


class GreedyChooser:
    """Longest cached prefix, then fewest requests, then name: deterministic for tests."""

    def __init__(self, req_id, keys, prompt_tokens=100, only=None):
        self.req_id, self.keys, self.prompt_tokens, self.only = req_id, tuple(keys), prompt_tokens, only

    def pick(self, snap: Snapshot) -> str:
        if self.only:
            return self.only
        return min(snap.matched, key=lambda i: (-snap.matched[i], snap.loads[i].requests, i))

    def __call__(self, snap):
        inst = self.pick(snap)
        return Booking.single(self.req_id, inst, self.prompt_tokens - 10 * snap.matched[inst], self.prompt_tokens + 50, self.keys)

    def revise(self, snap, booking):
        better = self.pick(snap)
        if better == booking.instance or snap.matched[better] == snap.matched[booking.instance] and \
                snap.loads[better].requests >= snap.loads[booking.instance].requests:
            return None
        return self(snap)


async def test_decide_books_load_and_records_prefix(make_store):
    store = await make_store()
    snap, booking = await store.decide([1, 2, 3], INSTANCES, GreedyChooser("r1", [1, 2, 3], only="b"))
    assert snap.matched == {"a": 0, "b": 0, "c": 0}
    view = await store.snapshot([1, 2, 3, 4], INSTANCES)
    assert view.matched == {"a": 0, "b": 3, "c": 0}
    assert view.loads["b"].requests == 1 and view.loads["b"].prefill_tokens == 100 and view.loads["b"].kv_tokens == 150
    assert (await store.snapshot([1, 2, 9], INSTANCES)).matched["b"] == 2
    assert (await store.snapshot([9, 2, 3], INSTANCES)).matched["b"] == 0


async def test_prefill_done_and_release_are_idempotent(make_store):
    store = await make_store()
    _, booking = await store.decide([5], INSTANCES, GreedyChooser("r2", [5], only="a"))
    await store.prefill_done(booking)
    await store.prefill_done(booking)
    load = (await store.snapshot([], INSTANCES)).loads["a"]
    assert (load.requests, load.prefill_tokens, load.kv_tokens) == (1, 0, 150)
    await store.release(booking)
    await store.release(booking)
    load = (await store.snapshot([], INSTANCES)).loads["a"]
    assert (load.requests, load.prefill_tokens, load.kv_tokens) == (0, 0, 0)
    # residency outlives the request: the engine still holds the prefix
    assert (await store.snapshot([5], INSTANCES)).matched["a"] == 1


async def test_release_without_first_byte_returns_prefill_tokens(make_store):
    store = await make_store()
    _, booking = await store.decide([], INSTANCES, GreedyChooser("r3", [], only="c"))
    await store.release(booking)
    load = (await store.snapshot([], INSTANCES)).loads["c"]
    assert (load.requests, load.prefill_tokens, load.kv_tokens) == (0, 0, 0)


async def test_capacity_evicts_least_recent_prefix_from_its_tail(make_store):
    store = await make_store(caps={"a": 4})
    for n, keys in enumerate(([10, 11], [20, 21], [30, 31])):
        _, b = await store.decide(keys, ["a"], GreedyChooser(f"c{n}", keys, only="a"))
        await store.release(b)
    view = lambda keys: store.snapshot(keys, ["a"])  # noqa: E731
    assert (await view([10, 11])).matched["a"] == 0  # oldest prefix gone
    assert (await view([20, 21])).matched["a"] == 2
    assert (await view([30, 31])).matched["a"] == 2
    # a longer prefix over capacity keeps its head, not its tail
    _, b = await store.decide([40, 41, 42, 43, 44, 45], ["a"], GreedyChooser("c9", [40, 41, 42, 43, 44, 45], only="a"))
    await store.release(b)
    assert (await view([40, 41, 42, 43, 44, 45])).matched["a"] == 4


async def test_forget_instance_drops_its_residency_only(make_store):
    store = await make_store()
    for inst in ("a", "b"):
        _, b = await store.decide([7, 8], INSTANCES, GreedyChooser(f"f{inst}", [7, 8], only=inst))
        await store.release(b)
    await store.forget_instance("a")
    assert (await store.snapshot([7, 8], INSTANCES)).matched == {"a": 0, "b": 2, "c": 0}


async def test_concurrent_decisions_see_each_others_bookings(make_store):
    store = await make_store()
    results = await asyncio.gather(
        *(store.decide([], INSTANCES, GreedyChooser(f"burst{i}", [])) for i in range(30))
    )
    counts = {i: sum(1 for _, b in results if b.instance == i) for i in INSTANCES}
    assert counts == {"a": 10, "b": 10, "c": 10}


async def test_residency_expires(make_store):
    store = await make_store(residency_ttl_s=0.2)
    _, b = await store.decide([3, 4], INSTANCES, GreedyChooser("e1", [3, 4], only="a"))
    assert (await store.snapshot([3, 4], INSTANCES)).matched["a"] == 2
    await asyncio.sleep(0.35)
    assert (await store.snapshot([3, 4], INSTANCES)).matched["a"] == 0
    await store.release(b)


class PairChooser:
    """Books a disaggregated request: decode leg on d, prefill leg on p."""

    def __init__(self, req_id, keys, d, p):
        self.req_id, self.keys, self.d, self.p = req_id, tuple(keys), d, p

    def __call__(self, snap):
        return Booking(self.req_id, (Leg(self.d, 0, 300, 1), Leg(self.p, 200, 0, 1, transient=True)), self.keys)

    def revise(self, snap, booking):
        return None


async def test_two_leg_booking_loads_both_and_records_prefix_on_both(make_store):
    store = await make_store()
    _, booking = await store.decide([1, 2], INSTANCES, PairChooser("pd1", [1, 2], "a", "b"))
    view = await store.snapshot([1, 2], INSTANCES)
    assert view.matched == {"a": 2, "b": 2, "c": 0}
    assert view.loads["a"] == Load(1, 0, 300, 1) and view.loads["b"] == Load(1, 200, 0, 1)
    await store.prefill_done(booking)  # the prefill leg is over: gone from b entirely
    view = await store.snapshot([], INSTANCES)
    assert view.loads["a"] == Load(1, 0, 300, 0) and view.loads["b"] == Load()
    await store.release(booking)
    view = await store.snapshot([], INSTANCES)
    assert view.loads["a"] == Load() and view.loads["b"] == Load()


async def test_two_leg_release_before_first_byte(make_store):
    store = await make_store()
    _, booking = await store.decide([], INSTANCES, PairChooser("pd2", [], "c", "a"))
    await store.release(booking)
    view = await store.snapshot([], INSTANCES)
    assert view.loads["a"] == Load() and view.loads["c"] == Load()


async def test_abandon_releases_and_takes_back_only_new_residency(make_store):
    store = await make_store()
    _, first = await store.decide([1, 2], INSTANCES, PairChooser("ab1", [1, 2], "a", "b"))
    await store.release(first)  # a and b now hold [1, 2]
    snap, second = await store.decide([1, 2, 3, 4], INSTANCES, PairChooser("ab2", [1, 2, 3, 4], "a", "c"))
    await store.abandon(second, snap.matched)
    view = await store.snapshot([1, 2, 3, 4], INSTANCES)
    assert view.matched == {"a": 2, "b": 2, "c": 0}
    assert all(load == Load() for load in view.loads.values())


class BytesChooser:
    """A pair whose handoff books KV bytes on both NICs (link-aware booking)."""

    def __init__(self, req_id, d, p, nbytes):
        self.req_id, self.d, self.p, self.nbytes = req_id, d, p, nbytes

    def __call__(self, snap):
        return Booking(self.req_id, (Leg(self.d, 0, 300, 1, self.nbytes), Leg(self.p, 200, 0, 1, self.nbytes, transient=True)))

    def revise(self, snap, booking):
        return None


async def test_transfer_bytes_are_booked_on_both_ends_and_released_at_the_first_byte(make_store):
    store = await make_store()
    big = 3 * 2**40  # beyond 32 bits: byte counts of long prompts add up
    _, one = await store.decide([], INSTANCES, BytesChooser("tb1", "a", "b", big))
    _, two = await store.decide([], INSTANCES, BytesChooser("tb2", "a", "c", 5))
    view = await store.snapshot([], INSTANCES)
    assert view.loads["a"].transfer_bytes == big + 5
    assert view.loads["b"].transfer_bytes == big and view.loads["c"].transfer_bytes == 5
    await store.prefill_done(one)
    view = await store.snapshot([], INSTANCES)
    assert view.loads["a"].transfer_bytes == 5 and view.loads["b"] == Load()
    await store.release(two)  # before its first byte: everything of it goes
    await store.release(one)
    view = await store.snapshot([], INSTANCES)
    assert view.loads["a"] == Load() and view.loads["c"] == Load()


async def test_a_finished_prefill_leg_stops_queueing_but_keeps_its_transfer_booked(make_store):
    store = await make_store()
    _, other = await store.decide([], INSTANCES, GreedyChooser("q1", [], only="b"))  # 100 queued on b, untouched
    _, booking = await store.decide([1, 2], INSTANCES, PairChooser("pd3", [1, 2], "a", "b"))
    await store.prefill_leg_done(booking)
    await store.prefill_leg_done(booking)  # idempotent
    view = await store.snapshot([], INSTANCES)
    assert view.loads["b"] == Load(2, 100, 150, 1) and view.loads["a"] == Load(1, 0, 300, 1)
    await store.prefill_done(booking)  # the first byte: the leg is gone, its work not subtracted twice
    view = await store.snapshot([], INSTANCES)
    assert view.loads["b"] == Load(1, 100, 150, 0) and view.loads["a"] == Load(1, 0, 300, 0)
    _, early = await store.decide([], INSTANCES, PairChooser("pd4", [], "c", "b"))
    await store.prefill_leg_done(early)
    await store.release(early)  # ended before its first byte: the rest of it goes, nothing twice
    await store.release(booking)
    view = await store.snapshot([], INSTANCES)
    assert view.loads["b"] == Load(1, 100, 150, 0) and view.loads["a"] == Load() and view.loads["c"] == Load()
    await store.release(other)
    assert (await store.snapshot([], INSTANCES)).loads["b"] == Load()


def test_a_booked_load_is_the_dataclass_built_the_fast_way():
    fast = Load.booked(1, 2, 3, 4, 5)
    assert fast == Load(1, 2, 3, 4, 5) and vars(fast) == vars(Load(1, 2, 3, 4, 5))
    assert fast.with_head(1.5, 7).prefill_head_tokens == 7 and fast.prefill_started_s == 0.0


def test_a_single_leg_booking_is_the_dataclass_built_the_fast_way():
    fast, slow = Booking.single("b", "i0", 7, 9, [3, 4]), Booking("b", (Leg("i0", 7, 9),), (3, 4))
    assert fast == slow and hash(fast) == hash(slow)
    assert vars(fast.legs[0]) == vars(slow.legs[0]) and vars(fast) == vars(slow)
