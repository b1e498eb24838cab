"""PinCounts keeps the union of in-flight chains as a tree; it must answer exactly as counting
holders per block does, whatever the order of pins and releases and wherever the cap bites."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from router.state.pins import PIN_STRIDE, PinCounts


class PerKeyCounts:
    """The reference: one holder count per pinned key (what the tree replaces, in pins.py and
    in lua/pins.lua: tests/state/test_pins_redis.py), each key standing for its weight in blocks."""

    def __init__(self, cap: int) -> None:
        self.counts: Counter[int] = Counter()
        self.weights: dict[int, int] = {}
        self.cap = cap

    def blocks(self) -> int:
        return sum(self.weights[k] for k in self.counts)

    def pin(self, keys: list[int]) -> tuple[int, int]:
        new, pinned = 0, 0
        for d in pinned_positions(len(keys)):
            key, weight = keys[d - 1], d - (d - 1) // PIN_STRIDE * PIN_STRIDE
            if key not in self.counts:
                if self.blocks() + weight > self.cap:
                    return pinned, new
                new += weight
                self.weights[key] = weight
            self.counts[key] += 1
            pinned = d
        return pinned, new

    def unpin(self, keys: list[int]) -> int:
        freed = 0
        for d in pinned_positions(len(keys)):
            key = keys[d - 1]
            self.counts[key] -= 1
            if self.counts[key] == 0:
                del self.counts[key]
                freed += self.weights.pop(key)
        return freed


def pinned_positions(blocks: int) -> list[int]:
    """1-based positions of the pinned keys: every PIN_STRIDE-th block and the last."""
    return sorted({*range(PIN_STRIDE, blocks + 1, PIN_STRIDE), blocks} - {0})


def chain(rng: random.Random, tenants: int) -> list[int]:
    """Chained keys: a tenant's shared prefix of random length, then the request's own blocks."""
    key, keys = rng.randrange(tenants), []
    for j in range(rng.randint(1, 40)):
        token = 0 if j < rng.randint(0, 30) else rng.getrandbits(20)
        key = hash((key, token)) & (2**63 - 1)
        keys.append(key)
    return keys


@pytest.mark.parametrize("seed", range(12))
def test_the_tree_answers_as_per_block_counts_do(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice([10_000, 120, 40])
    tree, reference = PinCounts(cap), PerKeyCounts(cap)
    in_flight: list[list[int]] = []
    for step in range(3000):
        if step % 500 == 250:  # a lowered or raised cap applies to new keys only
            tree.cap = reference.cap = rng.choice([10_000, 80, 20])
        if in_flight and rng.random() < 0.48:
            keys = in_flight.pop(rng.randrange(len(in_flight)))
            assert tree.unpin(keys) == reference.unpin(keys)
        else:
            keys = chain(rng, tenants=rng.choice([1, 3, 8]))
            got = tree.pin(keys)
            assert got == reference.pin(keys)
            if got[0]:
                in_flight.append(keys[:got[0]])
        assert len(tree) == reference.blocks() <= max(cap, 10_000)
    for keys in in_flight:
        assert tree.unpin(keys) == reference.unpin(keys)
    assert len(tree) == 0


def test_a_repeated_release_takes_nothing_back() -> None:
    tree = PinCounts(100)
    shared, own = list(range(1, 4)), list(range(1, 6))
    assert tree.pin(shared) == (3, 3) and tree.pin(own) == (5, 5)  # short chains: their last keys differ
    assert tree.unpin(own) == 5 and tree.unpin(own) == 0 and len(tree) == 3
    assert tree.unpin(shared) == 3 and tree.unpin(shared) == 0 and len(tree) == 0


@pytest.mark.parametrize("seed", range(6))
def test_the_union_is_never_under_counted_and_over_counted_by_less_than_a_stride_per_chain(seed: int) -> None:
    rng = random.Random(seed)
    tree, exact = PinCounts(10**9), Counter[int]()
    in_flight: list[list[int]] = []
    for _ in range(2000):
        if in_flight and rng.random() < 0.45:
            keys = in_flight.pop(rng.randrange(len(in_flight)))
            tree.unpin(keys)
            exact.subtract(keys)
            exact = +exact
        else:
            keys = chain(rng, tenants=3)
            assert tree.pin(keys)[0] == len(keys)
            exact.update(keys)
            in_flight.append(keys)
        ends = {keys[-1] for keys in in_flight}
        assert len(exact) <= len(tree) <= len(exact) + (PIN_STRIDE - 1) * len(ends)


def test_the_lua_store_pins_with_the_same_stride() -> None:
    import re
    from pathlib import Path

    lua = (Path(__file__).resolve().parents[2] / "router" / "state" / "lua" / "pins.lua").read_text()
    assert re.search(r"local PIN_STRIDE = (\d+)", lua).group(1) == str(PIN_STRIDE)  # type: ignore[union-attr]
