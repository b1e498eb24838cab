"""PinCounts keeps the union of in-flight chains as a tree; it must answer exactly as counting
holders per block does, whatever the order of pins and releases and wherever the cap bites."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from router.state.pins import PinCounts


class PerBlockCounts:
    """The reference: one holder count per block key (what the tree replaces)."""

    def __init__(self, cap: int) -> None:
        self.counts: Counter[int] = Counter()
        self.cap = cap

    def pin(self, keys: list[int]) -> tuple[int, int]:
        new = 0
        for n, key in enumerate(keys):
            if key not in self.counts:
                if len(self.counts) >= self.cap:
                    return n, new
                new += 1
            self.counts[key] += 1
        return len(keys), new

    def unpin(self, keys: list[int]) -> int:
        freed = 0
        for key in keys:
            self.counts[key] -= 1
            if self.counts[key] == 0:
                del self.counts[key]
                freed += 1
        return freed


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
    tree, reference = PinCounts(cap), PerBlockCounts(cap)
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
        assert len(tree) == len(reference.counts) <= max(cap, 10_000)
    for keys in in_flight:
        assert tree.unpin(keys) == reference.unpin(keys)
    assert len(tree) == 0


def test_a_repeated_release_takes_nothing_back() -> None:
    tree = PinCounts(100)
    shared, own = [1, 2, 3], [1, 2, 3, 4, 5]
    assert tree.pin(shared) == (3, 3) and tree.pin(own) == (5, 2)
    assert tree.unpin(own) == 2 and tree.unpin(own) == 0 and len(tree) == 3
    assert tree.unpin(shared) == 3 and tree.unpin(shared) == 0 and len(tree) == 0
