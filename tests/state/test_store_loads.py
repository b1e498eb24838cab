"""The store tier's bookings: running sums and lazy landings answer as a scan of every booking."""

from __future__ import annotations

import random

import pytest

from router.state.store_loads import LandingBook, LoadBook


def scan_in_flight(loads: list[tuple[float, float, float]], now: float) -> tuple[int, float]:
    live = [(a, b, s) for a, b, s in loads if b > now]
    return len(live), sum(s * (b - now) / (b - a) for a, b, s in live)


@pytest.mark.parametrize("seed", range(6))
def test_the_backlog_is_the_scan_of_every_load_still_moving(seed: int) -> None:
    rng = random.Random(seed)
    book, loads, now = LoadBook(10_000), [], 1_000.0 * seed
    for _ in range(2_000):
        now += rng.expovariate(20.0)
        if rng.random() < 0.6:
            alone = rng.uniform(0.001, 0.5)
            end = now + alone * rng.uniform(1.0, 4.0)
            book.add(now, end, alone)
            loads.append((now, end, alone))
        count, backlog = book.in_flight(now)
        want_count, want_backlog = scan_in_flight(loads, now)
        assert count == want_count
        assert backlog == pytest.approx(want_backlog, rel=1e-9, abs=1e-9)


def test_a_quiet_moment_resets_the_sums() -> None:
    book = LoadBook(16)
    book.add(0.0, 1e6, 1e6)  # a huge load leaves no residue once it has ended
    assert book.in_flight(2e6) == (0, 0.0)
    book.add(2e6, 2e6 + 2.0, 1.0)
    count, backlog = book.in_flight(2e6 + 1.0)
    assert count == 1 and backlog == pytest.approx(0.5, abs=1e-12)


def test_at_capacity_the_load_ending_soonest_goes_first() -> None:
    book = LoadBook(2)
    book.add(0.0, 10.0, 1.0)
    book.add(0.0, 5.0, 1.0)
    book.add(0.0, 20.0, 1.0)  # evicts the one ending at 5
    count, backlog = book.in_flight(0.0)
    assert count == 2 and backlog == pytest.approx(2.0)
    assert book.in_flight(10.0)[0] == 1


@pytest.mark.parametrize("seed", range(4))
def test_landings_are_the_scan_of_the_pending_ones_per_instance(seed: int) -> None:
    rng = random.Random(seed)
    book, booked, now = LandingBook(10_000), [], 0.0
    for _ in range(1_500):
        now += rng.expovariate(30.0)
        if rng.random() < 0.5:
            ready, instance = now + rng.uniform(0.0, 0.3), f"i{rng.randrange(12)}"
            book.add(ready, instance)
            booked.append((ready, instance))
        view = book.pending(now)
        want: dict[str, list[float]] = {}
        for t, i in booked:
            if t > now:
                want.setdefault(i, []).append(t - now)
        assert set(view) == set(want)
        for i in rng.sample(sorted(want), min(3, len(want))):  # a decision reads a few of them
            assert sorted(view[i]) == pytest.approx(sorted(want[i]))
        assert view.get("nobody") is None
    assert len(book) == sum(1 for t, _ in booked if t > now)


def test_landings_stay_bounded_and_drop_the_soonest() -> None:
    book = LandingBook(3)
    for ready, inst in [(5.0, "a"), (1.0, "b"), (3.0, "a"), (4.0, "c")]:
        book.add(ready, inst)
    view = book.pending(0.0)
    assert len(book) == 3 and "b" not in view  # the one landing soonest (1.0) went
    assert sorted(view["a"]) == [3.0, 5.0] and view["c"] == (4.0,)
    assert not book.pending(10.0)  # all landed: an empty view is falsy
