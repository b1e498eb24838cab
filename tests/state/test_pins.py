"""PinCounts keeps the union of in-flight chains as a tree; it must answer exactly as counting
holders per block does, whatever the order of pins and releases and wherever the cap bites."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from router.state.pins import PIN_FINE, PIN_PER_OCTAVE, PIN_STRIDE, PinCounts


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
        previous = 0
        for d in pinned_positions(len(keys)):
            key, weight, previous = keys[d - 1], d - previous, d
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


def step_at(position: int) -> int:
    """The grid's step at a 1-based block position: PIN_STRIDE up to PIN_FINE, then doubling
    with each doubling of the position (written apart from pins.py's own walk of the grid)."""
    if position <= PIN_FINE:
        return PIN_STRIDE
    octave = (position - 1).bit_length() - PIN_FINE.bit_length()  # position in (FINE 2^o, FINE 2^(o+1)]
    return (PIN_FINE << octave) // PIN_PER_OCTAVE


def pinned_positions(blocks: int) -> list[int]:
    """1-based positions of the pinned keys: the grid's, and the last block."""
    return sorted({d for d in range(1, blocks + 1) if d % step_at(d) == 0} | ({blocks} - {0}))


def test_the_grid_is_fine_up_to_its_start_then_a_fixed_number_of_keys_per_doubling() -> None:
    assert pinned_positions(20) == [8, 16, 20]
    assert pinned_positions(PIN_FINE)[-2:] == [PIN_FINE - PIN_STRIDE, PIN_FINE]
    assert len(pinned_positions(PIN_FINE)) == PIN_FINE // PIN_STRIDE
    for octave in range(4):
        lo = PIN_FINE << octave
        inside = [d for d in pinned_positions(2 * lo) if d > lo]
        assert len(inside) == PIN_PER_OCTAVE and inside[-1] == 2 * lo
    assert len(pinned_positions(2048)) == 80


def chain(rng: random.Random, tenants: int, longest: int = 40) -> list[int]:
    """Chained keys: a tenant's shared prefix of random length, then the request's own blocks."""
    key, keys = rng.randrange(tenants), []
    shared = longest * 3 // 4
    for j in range(rng.randint(1, longest)):
        token = 0 if j < rng.randint(0, shared) else rng.getrandbits(20)
        key = hash((key, token)) & (2**63 - 1)
        keys.append(key)
    return keys


@pytest.mark.parametrize("seed", range(12))
def test_the_tree_answers_as_per_block_counts_do(seed: int) -> None:
    rng = random.Random(seed)
    longest = 40 if seed < 8 else 1500  # short chains, and chains across the grid's octaves
    scale = 1 if seed < 8 else 40
    steps = 3000 if seed < 8 else 400
    cap = rng.choice([10_000, 120, 40]) * scale
    tree, reference = PinCounts(cap), PerKeyCounts(cap)
    in_flight: list[list[int]] = []
    for step in range(steps):
        if step % 500 == 250 or (seed >= 8 and step % 100 == 50):  # a lowered or raised cap applies to new keys only
            tree.cap = reference.cap = rng.choice([10_000, 80, 20]) * scale
        if in_flight and rng.random() < 0.48:
            keys = in_flight.pop(rng.randrange(len(in_flight)))
            assert tree.unpin(keys) == reference.unpin(keys)
        else:
            keys = chain(rng, tenants=rng.choice([1, 3, 8]), longest=longest)
            got = tree.pin(keys)
            assert got == reference.pin(keys)
            if got[0]:
                in_flight.append(keys[:got[0]])
        assert len(tree) == reference.blocks() <= max(cap, 10_000 * scale)
    for keys in in_flight:
        assert tree.unpin(keys) == reference.unpin(keys)
    assert len(tree) == 0


def test_a_repeated_release_takes_nothing_back() -> None:
    tree = PinCounts(100)
    shared, own = list(range(1, 4)), list(range(1, 6))
    assert tree.pin(shared) == (3, 3) and tree.pin(own) == (5, 5)  # short chains: their last keys differ
    assert tree.unpin(own) == 5 and tree.unpin(own) == 0 and len(tree) == 3
    assert tree.unpin(shared) == 3 and tree.unpin(shared) == 0 and len(tree) == 0


@pytest.mark.parametrize("seed", range(8))
def test_the_union_is_never_under_counted_and_over_counted_by_less_than_a_grid_step_per_chain(seed: int) -> None:
    rng = random.Random(seed)
    longest = 40 if seed < 6 else 1500
    tree, exact = PinCounts(10**9), Counter[int]()
    in_flight: list[list[int]] = []
    for _ in range(2000 if seed < 6 else 300):
        if in_flight and rng.random() < 0.45:
            keys = in_flight.pop(rng.randrange(len(in_flight)))
            tree.unpin(keys)
            exact.subtract(keys)
            exact = +exact
        else:
            keys = chain(rng, tenants=3, longest=longest)
            assert tree.pin(keys)[0] == len(keys)
            exact.update(keys)
            in_flight.append(keys)
        ends = {keys[-1]: len(keys) for keys in in_flight}
        # a chain ending at block n over-counts less than the step before n: at most n / 16 past PIN_FINE
        assert len(exact) <= len(tree) <= len(exact) + sum(step_at(n) - 1 for n in ends.values())
        assert sum(step_at(n) - 1 for n in ends.values()) <= sum(max(PIN_STRIDE, n // 16) for n in ends.values())


def test_the_lua_store_pins_on_the_same_grid() -> None:
    import re
    from pathlib import Path

    lua = (Path(__file__).resolve().parents[2] / "router" / "state" / "lua" / "pins.lua").read_text()
    for name, value in (("PIN_STRIDE", PIN_STRIDE), ("PIN_FINE", PIN_FINE), ("PIN_PER_OCTAVE", PIN_PER_OCTAVE)):
        assert re.search(rf"local {name} = (\d+)", lua).group(1) == str(value)  # type: ignore[union-attr]
