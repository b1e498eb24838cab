"""``ResidencyIndex.record`` restamps a held run in place (dict.update on the OrderedDict)
instead of through OrderedDict.__setitem__: the index must end up exactly as the plain
per-key version left it (same keys, same order, same stamps, same first-key index), so
every answer (matched depths, holders, confidence, eviction order) is unchanged."""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Sequence

from router.state.residency import ResidencyIndex, _leading_run


class PerKeyResidency(ResidencyIndex):
    """The record of before the change, one OrderedDict write per key: the reference."""

    def record(self, instance: str, keys: Sequence[int], cap: int, now: float) -> None:
        if not keys:
            return
        lru = self._lru.get(instance)
        if lru is None:
            lru = self._lru[instance] = OrderedDict()
        self._cap[instance] = cap
        n, stamp = len(keys), self._stamp.get(instance, 0)
        dead = self._horizon(instance, now)
        held = _leading_run(lru, keys)
        listed = len(lru)
        for key, s in zip(reversed(keys), range(stamp + 1, stamp + n + 1)):
            lru[key] = s
        if len(lru) - listed != n - held:
            for key in reversed(keys):
                lru.move_to_end(key)
        elif held:
            for key in keys[held - 1 :: -1]:
                lru.move_to_end(key)
        self._heads.setdefault(keys[0], {})[instance] = None
        self._stamp[instance] = stamp + n
        marks = self._marks.setdefault(instance, deque())
        if marks and now - marks[-1][2] < self._mark_s:
            marks[-1] = (max(now, marks[-1][0]), stamp + n, marks[-1][2])
        else:
            marks.append((now, stamp + n, now))
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            self._drop(old, instance)
        while lru:
            old, oldest = next(iter(lru.items()))
            if oldest > dead:
                break
            del lru[old]
            self._drop(old, instance)


def _prompts(rng: random.Random) -> list[tuple[int, ...]]:
    """Chained-key prompts sharing prefixes (a few system prompts, each with many turns)."""
    out = []
    for s in range(4):
        system = [1_000_000 * (s + 1) + j for j in range(rng.randint(1, 30))]
        for t in range(8):
            out.append(tuple(system + [1_000_000 * (s + 1) + 1000 * (t + 1) + j for j in range(rng.randint(0, 40))]))
    return out


def _state(index: ResidencyIndex) -> tuple[object, ...]:
    return ({i: list(lru.items()) for i, lru in index._lru.items()}, {k: list(v) for k, v in index._heads.items()},
            dict(index._stamp), {i: list(m) for i, m in index._marks.items()})


def test_record_leaves_the_index_exactly_as_the_per_key_version():
    for seed in range(30):
        rng = random.Random(seed)
        prompts = _prompts(rng)
        fast, ref = ResidencyIndex(60.0), PerKeyResidency(60.0)
        now = 0.0
        for step in range(400):
            inst = f"i{rng.randrange(3)}"
            prompt = rng.choice(prompts)
            keys = prompt[: rng.randint(1, len(prompt))]
            action = rng.random()
            if action < 0.8:
                cap = rng.choice([20, 60, 500])
                fast.record(inst, keys, cap, now)
                ref.record(inst, keys, cap, now)
            elif action < 0.9:  # an abandoned request takes back what it added beyond a depth
                depth = rng.randint(0, len(keys))
                fast.unrecord(inst, keys[depth:])
                ref.unrecord(inst, keys[depth:])
            else:
                now += rng.choice([0.5, 5.0, 40.0])
            assert _state(fast) == _state(ref), (seed, step)
            query = rng.choice(prompts)
            instances = ["i0", "i1", "i2"]
            matched = fast.matched(query, instances, now)
            assert matched == ref.matched(query, instances, now)
            assert fast.confidences(query, matched) == ref.confidences(query, matched)
            assert fast.holders(query[0], now) == ref.holders(query[0], now)


def test_a_prefix_booked_again_where_it_was_recorded_last_is_only_restamped():
    """Recording the prefix an instance recorded last, untouched since, skips the moves: the
    index must still end up as the per-key version left it, also after other traffic, a
    shorter prefix of it, a take-back, expiry, a cap below its length, or the instance forgotten."""
    prompt = tuple(range(100, 612))
    other = tuple(range(5000, 5040))
    fast, ref = ResidencyIndex(60.0), PerKeyResidency(60.0)
    steps: list[tuple[str, str, Sequence[int], int, float]] = [
        ("record", "i0", prompt, 600, 0.0), ("record", "i0", prompt, 600, 1.0), ("record", "i0", list(prompt), 600, 2.0),
        ("record", "i0", other, 600, 3.0), ("record", "i0", prompt, 600, 4.0),  # other traffic in between
        ("record", "i0", prompt[:300], 600, 5.0), ("record", "i0", prompt, 600, 6.0),  # a shorter prefix of it
        ("record", "i1", prompt, 600, 7.0), ("record", "i0", prompt, 600, 8.0),  # another instance's record
        ("unrecord", "i0", prompt[200:], 0, 9.0), ("record", "i0", prompt, 600, 10.0),  # a take-back
        ("unrecord", "i0", prompt[:1], 0, 11.0), ("record", "i0", prompt, 600, 12.0),  # the head taken back
        ("record", "i0", prompt, 600, 80.0), ("record", "i0", prompt, 600, 81.0),  # after the first ones expired
        ("record", "i0", prompt, 300, 82.0), ("record", "i0", prompt, 300, 83.0),  # a cap below its length
        ("record", "i0", prompt, 600, 84.0), ("record", "i0", prompt, 600, 85.0),
        ("forget", "i0", (), 0, 86.0), ("record", "i0", prompt, 600, 87.0), ("record", "i0", prompt, 600, 88.0),
    ]
    for action, inst, keys, cap, now in steps:
        for index in (fast, ref):
            if action == "record":
                index.record(inst, keys, cap, now)
            elif action == "unrecord":
                index.unrecord(inst, keys)
            else:
                index.forget(inst)
        assert _state(fast) == _state(ref), (action, inst, len(keys), now)
        assert fast.matched(prompt, ["i0", "i1"], now) == ref.matched(prompt, ["i0", "i1"], now)
        assert fast.confidences(prompt, fast.matched(prompt, ["i0"], now)) == ref.confidences(prompt, ref.matched(prompt, ["i0"], now))
