"""In-process residency index: block key -> instances holding it, with per-instance LRU,
and a confidence for each instance's match.

Bounded: each instance keeps at most ``cap`` keys (its cache capacity in blocks: the
engine's capacity in tokens over the router's block size) and entries expire after
``ttl_s``. Keys of one prefix are touched tail first, so when LRU evicts it drops the
deepest blocks of a prefix before its head, as engines do, and "leading blocks held"
stays a contiguous run.

Confidence (the LRU position model): the router sees only part of what fills an
engine's cache (decode tokens, other routers, its own token estimate is approximate),
so an entry near the old end of the LRU may already be gone on the engine even though
the router still lists it. Each touch gets a stamp from the instance's counter; the
entry's position is estimated from its stamp between the oldest and newest resident
stamps, and its confidence is 1 while it sits in the newest ``1 - margin`` of the
capacity, falling linearly to 0 at the capacity. Traffic pushing through an instance
lowers the confidence of everything older, not only the TTL. A match's confidence is its
leading blocks at confidence 1 counted whole and the rest at its deepest block's (the
expected share of the run still held: a run near the old end loses its tail first, as the
engine evicts it), not the whole run at its deepest block's.

Why it is laid out this way (recording a 512-block prompt is on every decision's path):
- Expiry is kept per stamp range, not per entry: each instance has a short queue of
  (time, last stamp handed out by then) marks, at most one per ``ttl / 64`` of its first
  touch (a mark's time moves to its latest touch, but a new mark starts once ``ttl / 64``
  has passed since the mark began, so steady traffic cannot keep one mark, and with it
  every stamp it covers, alive forever); every stamp up to the newest expired mark is
  expired. Refreshing a held key is then one C-level
  stamp update and move in its LRU, with no expiry of its own to rewrite (an entry may
  outlive its TTL by up to ``ttl / 64``, never expire early).
- The prefix an instance recorded last is kept (its keys and the stamp count after them)
  until anything else touches that instance's LRU: the same prefix booked there again (a
  hot prefix: every request of a shared system prompt) is then a C-level tuple comparison
  and a restamp, without moving 512 keys that already sit at the newest end in order.
- Only first keys are indexed by holder: prefixes are recorded whole from their first
  block, so "which instances hold this prompt's first block" (the matching and pruning
  question) is all the reverse index needs; the depth of each holder's match is then a
  binary search in that holder's own LRU.

The margin is the share of the cache the router cannot account for (output tokens of
requests in flight, blocks the engine rounds up): 0.1. Once the capacity comes from the
engine itself (router/engines facts), a wider margin mostly discounts prefixes the
engine still holds: in the quality matrix's replay, with margin 0.25 the predicted hit
ratio already matched the measured one within a point, and the discount sent a long
document's requests away from its only holder (copies, then evictions of other docs).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice

from router.state.displacement import Displacement

_MARKS_PER_TTL = 64


class ResidencyIndex:
    def __init__(self, ttl_s: float, margin: float = 0.1) -> None:
        if not 0 < margin <= 1:
            raise ValueError("confidence margin must be in (0, 1]")
        self._ttl_s = ttl_s
        self._mark_s = ttl_s / _MARKS_PER_TTL
        self._margin = margin
        self._heads: dict[int, dict[str, None]] = {}  # first key of a recorded prefix -> instances listing it
        self._lru: dict[str, OrderedDict[int, int]] = {}  # instance -> {key: stamp}, oldest first
        self._stamp: dict[str, int] = {}  # instance -> stamps handed out
        self._cap: dict[str, int] = {}  # instance -> the capacity it was last recorded with
        # instance -> (time, last stamp by then, when the mark began), oldest first
        self._marks: dict[str, deque[tuple[float, int, float]]] = {}
        self._dead: dict[str, int] = {}  # instance -> every stamp up to this one has expired
        self._displacement = Displacement()  # what a copy would cost each instance's cache
        # instance -> (keys, stamps handed out after recording them) while they are its newest
        # entries, head newest, untouched since: recording them again is then a restamp.
        self._newest: dict[str, tuple[tuple[int, ...], int]] = {}

    def record(self, instance: str, keys: Sequence[int], cap: int, now: float) -> None:
        """``instance`` now holds ``keys`` (a whole prefix, from its first block); evict beyond ``cap``."""
        if not keys:
            return
        lru = self._lru.get(instance)
        if lru is None:
            lru = self._lru[instance] = OrderedDict()
        self._cap[instance] = cap
        n, stamp = len(keys), self._stamp.get(instance, 0)
        dead = self._horizon(instance, now)
        keys = keys if isinstance(keys, tuple) else tuple(keys)
        last = self._newest.get(instance)
        if last is not None and last[1] == stamp and last[0] == keys:
            # The prefix recorded here last, untouched since, so still the newest entries, head
            # newest (a hot prefix booked again): moving each key to the end would change
            # nothing, so they are only restamped, in place as in _place. The comparison runs
            # in C over the tuples, a quarter of the moves' cost on a 512-block prompt.
            dict.update(lru, zip(reversed(keys), range(stamp + 1, stamp + n + 1)))
        else:
            self._place(lru, keys, stamp)
        self._heads.setdefault(keys[0], {})[instance] = None
        self._stamp[instance] = stamp + n
        marks = self._marks.get(instance)
        if marks is None:
            marks = self._marks[instance] = deque()
        if marks and now - marks[-1][2] < self._mark_s:  # within the period the last mark began
            marks[-1] = (max(now, marks[-1][0]), stamp + n, marks[-1][2])
        else:
            marks.append((now, stamp + n, now))
        evicted: list[int] = []
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            self._drop(old, instance)
            evicted.append(old)
        while lru:  # expired entries sit at the old end
            old, oldest = next(iter(lru.items()))
            if oldest > dead:
                break
            del lru[old]
            self._drop(old, instance)
        self._displacement.evicted(instance, evicted, cap, cap - len(lru))
        if len(lru) >= n:  # nothing of the prefix evicted (a cap below its length would)
            self._newest[instance] = (keys, stamp + n)
        else:
            self._newest.pop(instance, None)

    def _place(self, lru: OrderedDict[int, int], keys: tuple[int, ...], stamp: int) -> None:
        """List ``keys`` as the newest entries of ``lru``, head newest, stamped after ``stamp``."""
        n = len(keys)
        held = _leading_run(lru, keys)  # listed already (expired or not): a prefix's run is contiguous
        listed = len(lru)
        self._displacement.asked(islice(keys, held, None))
        # Stamps tail first, so the head is the newest; new keys land at the end in that order,
        # the held run is moved behind them: the tail of the LRU reads keys reversed.
        lru.update(zip(islice(reversed(keys), n - held), range(stamp + 1, stamp + n - held + 1)))
        whole = len(lru) - listed == n - held  # the new keys were all new: the held run is one run
        if whole and held:
            run = keys[held - 1 :: -1]
            try:
                deque(map(lru.move_to_end, run), maxlen=0)
            except KeyError:  # a block inside the run was taken back (unrecord): not one run after all
                whole = False
            else:
                # Every key of the held run is listed (move_to_end just found each), so
                # restamping them only replaces values: dict.update does that in place,
                # leaving the OrderedDict's links as they are, at half the cost of
                # OrderedDict.__setitem__ (a hot prefix restamps hundreds of keys per decision).
                dict.update(lru, zip(run, range(stamp + n - held + 1, stamp + n + 1)))
        if not whole:  # list and restamp every key the slow way
            lru.update(zip(islice(reversed(keys), n - held, None), range(stamp + n - held + 1, stamp + n + 1)))
            for key in reversed(keys):
                lru.move_to_end(key)

    def rooms(self) -> Mapping[str, tuple[int, float, float]]:
        """Per instance, (free blocks, future re-prefills per displaced token there and in the
        pool): what a prompt placed there costs the cache (displacement.py; read-only, live)."""
        return self._displacement.rooms()

    def unrecord(self, instance: str, keys: Sequence[int]) -> None:
        """Take back a speculative ``record`` (the request went elsewhere after all)."""
        lru = self._lru.get(instance)
        if lru is None:
            return
        self._newest.pop(instance, None)
        for key in keys:
            if lru.pop(key, None) is not None:
                self._drop(key, instance)

    def matched(self, keys: Sequence[int], instances: Iterable[str], now: float) -> dict[str, int]:
        """Leading blocks of ``keys`` held by each instance (0 when none).

        Only instances holding the first key can match; each one's depth is found by
        binary search, valid because an instance's run of a prefix is contiguous (prefixes
        are recorded whole, evicted tail first, expire tail first) — so the cost is
        O(holders x log blocks), not O(blocks)."""
        result = dict.fromkeys(instances, 0)
        if not keys:
            return result
        first = self._heads.get(keys[0])
        if not first:
            return result
        for inst in first:
            if inst not in result:
                continue
            lru, dead = self._lru[inst], self._horizon(inst, now)
            if lru.get(keys[0], 0) <= dead:
                continue
            lo, hi = 1, len(keys)  # keys[:lo] held; find the largest such lo
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if lru.get(keys[mid - 1], 0) > dead:
                    lo = mid
                else:
                    hi = mid - 1
            result[inst] = lo
        return result

    def holders(self, key: int, now: float) -> list[str]:
        """Instances whose entry for ``key`` (the first key of a prompt) has not expired."""
        return [inst for inst in self._heads.get(key, ()) if self._lru[inst].get(key, 0) > self._horizon(inst, now)]

    def confidence(self, instance: str, key: int) -> float:
        """How likely the engine still holds ``key`` given the traffic recorded since
        (1.0 for a fresh entry, 0.0 for one not held). O(1)."""
        lru = self._lru.get(instance)
        if lru is None:
            return 0.0
        stamp = lru.get(key)
        if stamp is None:
            return 0.0
        cap = self._cap.get(instance, len(lru))
        newest = self._stamp[instance]
        oldest = lru[next(iter(lru))]
        # Resident stamps spread over [oldest, newest]: the entry's distance from the newest
        # end, as a share of that span, times the resident count, is its LRU position.
        span = newest - oldest + 1
        position = len(lru) * (newest - stamp) / span
        free = 1.0 - position / max(1, cap)  # share of the capacity still ahead of eviction
        return max(0.0, min(1.0, free / self._margin))

    def confidences(self, keys: Sequence[int], matched: dict[str, int]) -> dict[str, float]:
        """Per instance, the expected share of its matched run the engine still holds
        (``matched x confidence`` is then the expected run). An engine evicts a run tail
        first, so a run whose deepest block nears the old end loses its tail, not its head:
        its leading blocks still at confidence 1 count whole (a history behind a system
        prompt every request touches keeps that prompt), the rest at the deepest block's
        confidence. Priced at the deepest block's confidence alone, a session's home
        looked emptier than instances holding only the system prompt, and the session was
        sent away to compute its whole history again."""
        out: dict[str, float] = {}
        confidence = self.confidence
        for inst, depth in matched.items():
            if not depth:
                continue
            deep = confidence(inst, keys[depth - 1])
            out[inst] = deep if deep >= 1.0 or depth == 1 else self._expected_run(inst, keys, depth, deep) / depth
        return out

    def _expected_run(self, instance: str, keys: Sequence[int], depth: int, deep: float) -> float:
        """The expected held length of ``instance``'s ``depth``-block run of ``keys`` whose
        deepest block has confidence ``deep`` < 1: the leading blocks still at confidence 1
        (by binary search: a run is touched tail first, so confidence falls with depth),
        plus the rest at ``deep``. Not at the mean of the rest's two ends: engines also
        cache output tokens the router never sees, so their LRU turns over faster than its
        model says: in the quality matrix's seed 3 longdoc/2x/facts the mean over-predicted
        80,640 cached tokens where this does 2,656, and p90 went 0.07x -> 1.84x cache_aware's)."""
        confidence = self.confidence
        lo, hi = 0, depth - 1  # keys[:lo] at confidence 1; the largest such lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if confidence(instance, keys[mid - 1]) >= 1.0:
                lo = mid
            else:
                hi = mid - 1
        return lo + (depth - lo) * deep

    def fill(self, instance: str) -> float:
        """Share of the instance's capacity the router believes occupied."""
        lru = self._lru.get(instance)
        return 0.0 if not lru else len(lru) / max(1, self._cap.get(instance, len(lru)))

    def forget(self, instance: str) -> None:
        for key in self._lru.pop(instance, ()):
            self._drop(key, instance)
        self._stamp.pop(instance, None)
        self._newest.pop(instance, None)
        self._cap.pop(instance, None)
        self._marks.pop(instance, None)
        self._dead.pop(instance, None)
        self._displacement.forget(instance)

    def _horizon(self, instance: str, now: float) -> int:
        """The newest expired stamp of ``instance`` at ``now`` (0: none)."""
        dead = self._dead.get(instance, 0)
        marks = self._marks.get(instance)
        if marks and marks[0][0] <= now - self._ttl_s:
            limit = now - self._ttl_s
            while marks and marks[0][0] <= limit:
                dead = marks.popleft()[1]
            self._dead[instance] = dead
        return dead

    def _drop(self, key: int, instance: str) -> None:
        heads = self._heads.get(key)
        if heads is not None:
            heads.pop(instance, None)
            if not heads:
                del self._heads[key]


def _leading_run(lru: OrderedDict[int, int], keys: Sequence[int]) -> int:
    """How many leading ``keys`` ``lru`` lists, by binary search (the run is contiguous)."""
    if keys[0] not in lru:
        return 0
    lo, hi = 1, len(keys)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in lru:
            lo = mid
        else:
            hi = mid - 1
    return lo
