"""Mirror tables in shared memory (router/state/_keyset_shared.h, router.state.shared_mirror):
a reader's mapping holds what the writer applied, against Python sets, through growth and
shrinking into new segments and resyncs; a reader in another process than a churning
writer never sees a key that was not there nor misses one that stayed; bad segments and
writes through a reader are refused; the shared table equals the delta-fed one."""

from __future__ import annotations

import mmap
import os
import random
import subprocess
import sys
import time
from array import array

import pytest

from router.state.precise_mirror import MirrorTable, TableDelta, TrackedTable
from router.state.shared_mirror import SHARED_BUILT, SegmentWriter, SharedMirrorTable, map_segment, shared_tables

pytestmark = pytest.mark.skipif(shared_tables() != "shared", reason="needs the C extension and memfd_create")

if SHARED_BUILT:
    from router.state._keyset import SharedKeys, shared_size


def segment(caps: tuple[int, int]) -> tuple[int, mmap.mmap, "SharedKeys", mmap.mmap, "SharedKeys"]:
    """A memfd with a writer and, through a second, read-only mapping, a reader."""
    fd = os.memfd_create("test-keys")
    os.ftruncate(fd, shared_size(*caps))
    wm = mmap.mmap(fd, shared_size(*caps))
    writer = SharedKeys(wm, caps)
    rm = mmap.mmap(fd, shared_size(*caps), prot=mmap.PROT_READ)
    return fd, wm, writer, rm, SharedKeys(rm)


def q(keys) -> array:
    return array("Q", keys)


EDGE = [0, 1, 2, 2**63, 2**64 - 1]


@pytest.mark.parametrize("seed", range(12))
def test_the_reader_holds_what_the_writer_applied(seed):
    rng = random.Random(seed)
    fd, _wm, w, _rm, r = segment((1024, 256))
    ref: tuple[set[int], set[int]] = (set(), set())
    universe = [rng.getrandbits(64) for _ in range(300)] + EDGE
    try:
        for step in range(200):
            changes = []
            for tier, limit in ((0, 500), (1, 120)):
                add = [rng.choice(universe) for _ in range(rng.randrange(0, 20))]
                add = [k for k in add if len(ref[tier]) + len(add) < limit]
                rem = [rng.choice(universe) for _ in range(rng.randrange(0, 20))]
                ref[tier].difference_update(rem)
                ref[tier].update(add)
                changes += [q(add), q(rem)]
            w.apply(*changes, step, step // 2, step % 3 != 0)
            assert (set(r.tolist(0)), set(r.tolist(1))) == ref
            assert r.state() == (step, step // 2, step % 3 != 0, len(ref[0]), len(ref[1]))
            assert (r.size, r.overflow, r.fresh) == (step, step // 2, step % 3 != 0)
            for key in rng.sample(universe, 30):
                assert (key in r) == (key in ref[0] or key in ref[1])
            probe = rng.sample(universe, 8)
            expect = 0.0
            for key in probe:
                if key in ref[0]:
                    expect += 1.0
                elif key in ref[1]:
                    expect += 0.5
                else:
                    break
            assert r.depth(probe, 0.5) == expect
    finally:
        os.close(fd)


def test_bad_segments_and_writes_through_a_reader_are_refused():
    fd, wm, w, rm, r = segment((16, 16))
    try:
        with pytest.raises(ValueError):
            SharedKeys(bytearray(shared_size(16, 16)))  # no magic: not a segment
        with pytest.raises(ValueError):
            SharedKeys(bytearray(shared_size(16, 16) - 8), (16, 16))  # the wrong length
        with pytest.raises(ValueError):
            SharedKeys(bytearray(8 * (16 + 24 + 16)), (24, 16))  # not a power of two
        with pytest.raises(ValueError):
            shared_size(8, 16)
        with pytest.raises(TypeError):
            r.apply(q([5]), q([]), q([]), q([]), 1, 0, True)  # a reader never writes
        with pytest.raises(TypeError):
            r.copy_from(w)
        w.apply(q([5, 6]), q([]), q([]), q([]), 2, 0, True)
        with pytest.raises(OverflowError):  # 2 + 13 keys would pass 7/8 of 16 slots
            w.apply(q(range(100, 113)), q([5]), q([]), q([]), 9, 9, False)
        assert r.state() == (2, 0, True, 2, 0) and sorted(r.tolist(0)) == [5, 6]  # unchanged
        with pytest.raises(ValueError):
            r.tolist(2)
    finally:
        os.close(fd)


_CHURN = """
import mmap, os, random, sys
from array import array
from router.state._keyset import SharedKeys, shared_size
fd, n_stable = int(sys.argv[1]), int(sys.argv[2])
caps = (1024, 16)
mm = mmap.mmap(fd, shared_size(*caps))
w = SharedKeys(mm, caps)
w.apply(array("Q", range(1, n_stable + 1)), array("Q"), array("Q"), array("Q"), n_stable, 0, True)
print("ready", flush=True)
rng = random.Random(0)
churn = [rng.getrandbits(62) + 10**9 for _ in range(200)]
held = []
end = __import__("time").monotonic() + float(sys.argv[3])
while __import__("time").monotonic() < end:
    add = rng.sample(churn, 40)
    w.apply(array("Q", add), array("Q", held), array("Q"), array("Q"), n_stable, 0, True)
    held = add
print("done", flush=True)
"""


def test_a_reader_in_another_process_than_a_churning_writer_sees_only_true_answers():
    """The writer shifts stable keys back and forth as churning keys come and go around
    them; every lookup overlapping a change is retried, so the stable prefix is found
    whole and a key never written is never found."""
    n_stable = 300
    fd = os.memfd_create("test-churn")
    size = shared_size(1024, 16)
    os.ftruncate(fd, size)
    child = subprocess.Popen([sys.executable, "-c", _CHURN, str(fd), str(n_stable), "2.0"], pass_fds=(fd,),
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        rm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        r = SharedKeys(rm)
        stable, absent = list(range(1, n_stable + 1)), [10**9 - k for k in range(1, 200)]
        reads = full = 0
        v0 = r.version
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            got = r.depth(stable, 0.5)
            assert got <= n_stable
            full += got == n_stable
            assert r.depth(absent, 0.5) == 0.0 and not any(k in r for k in absent[:20])
            reads += 1
        assert r.version - v0 > 10_000  # the writer really churned meanwhile
        assert reads > 100 and full == reads
    finally:
        child.kill()
        child.wait()
        os.close(fd)


def deltas(seed: int, n: int = 120):
    """TableDeltas of a TrackedTable through random stores (the table filling up, then
    evicting), removals on either tier, a resync now and then, and most blocks removed
    at the end (the key sets grow, then shrink)."""
    rng = random.Random(seed)
    table = TrackedTable(400)
    live: list[int] = []
    next_hash = 1
    for step in range(n):
        growing = step < n * 2 // 3
        for _ in range(rng.randrange(1, 6)):
            op, tier = rng.random(), 1 if rng.random() < 0.8 else 2
            if op < (0.8 if growing else 0.3) or not live:
                hashes = list(range(next_hash, next_hash + rng.randrange(1, 12)))
                next_hash += len(hashes)
                table.store_run(hashes, [(k, k + 10**6) for k in (rng.randrange(1, 3000) for _ in hashes)], tier)
                live.extend(hashes)
            elif op < 0.995:
                for h in rng.sample(live, min(len(live), rng.randrange(1, 30 if growing else 120))):
                    table.remove_run([h], tier)
            else:
                table.clear()
                live.clear()
        table.fresh = rng.random() < 0.9
        delta = table.take_delta()
        if delta is not None:
            yield delta


@pytest.mark.parametrize("seed", range(10))
def test_a_shared_table_equals_the_delta_fed_one_through_new_segments(seed):
    writer, shared, fed = SegmentWriter(), SharedMirrorTable(400), MirrorTable(400)
    caps_seen: list[tuple[int, int]] = []
    try:
        for delta in deltas(seed):
            fed.apply(delta)
            fd = writer.ship(delta)
            if fd is not None:
                shared.attach(*map_segment(fd))
                assert writer.keys is not None
                caps_seen.append(writer.keys.caps)
            assert shared.held() == fed.held()
            assert (len(shared), shared.overflow, shared.fresh) == (len(fed), fed.overflow, fed.fresh)
        biggest = max(caps_seen)
        assert len(set(caps_seen)) >= 3 and biggest[0] >= 256  # grew into new segments ...
        assert min(caps_seen[caps_seen.index(biggest):]) < biggest  # ... and shrank
    finally:
        writer.close()
        shared.clear()


def test_a_resync_starts_a_new_segment_and_a_stale_mark_holds_until_the_next_write():
    writer, table = SegmentWriter(), SharedMirrorTable(64)
    assert not table.fresh and len(table) == 0 and table.depth([1], 0.8) == 0.0 and not table.holds(1)
    first = writer.ship(TableDelta(True, 2, 0, False, q([1, 2])))  # a table's first delta: its first segment
    assert first is not None
    table.attach(*map_segment(first))
    assert table.fresh and table.depth([1, 2, 3], 0.8) == 2.0 and table.holds(2)
    assert writer.ship(TableDelta(True, 3, 0, False, q([3]))) is None  # in place
    assert table.depth([1, 2, 3], 0.8) == 3.0
    table.fresh = False  # the router saw the engine come back
    assert not table.fresh and not table.fresh
    assert writer.ship(TableDelta(True, 3, 0, False)) is None
    assert table.fresh  # the sidecar's next write decides again, as a delta would
    fd = writer.ship(TableDelta(True, 1, 0, True, q([9])))  # cleared first: a segment of its own
    assert fd is not None
    old = table.held()
    table.attach(*map_segment(fd))
    assert old == ({1, 2, 3}, set()) and table.held() == ({9}, set())
    table.clear()  # its sidecar is gone
    assert not table.fresh and len(table) == 0 and table.held() == (set(), set())
    writer.close()
