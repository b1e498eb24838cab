"""Shared KV links: transfers divide a link, a growing transfer waits for its seal."""

import asyncio
import time

import pytest

from router.tools.emulator.links import AsyncLink, Fabric


def test_two_transfers_on_one_link_take_twice_as_long_as_one():
    fabric = Fabric({"nic": 100.0})
    fabric.start("a", ["nic"], 100.0, sealed=True)
    fabric.start("b", ["nic"], 100.0, sealed=True)
    eta, _ = fabric.next_done()
    assert eta == pytest.approx(2.0)  # each moves at 50 B/s


def test_a_transfer_moves_at_its_slowest_link_share():
    fabric = Fabric({"p": 100.0, "d": 100.0, "up": 120.0})
    fabric.start("x", ["p", "up"], 60.0, sealed=True)
    fabric.start("y", ["d", "up"], 60.0, sealed=True)  # uplink shared: 60 B/s each
    eta, _ = fabric.next_done()
    assert eta == pytest.approx(1.0)


def test_the_remaining_transfer_speeds_up_when_the_other_leaves():
    fabric = Fabric({"nic": 100.0})
    fabric.start("a", ["nic"], 50.0, sealed=True)
    fabric.start("b", ["nic"], 150.0, sealed=True)
    eta, first = fabric.next_done()
    assert (first.id, eta) == ("a", pytest.approx(1.0))
    fabric.advance(eta)
    fabric.finish("a")
    eta, second = fabric.next_done()
    assert (second.id, eta) == ("b", pytest.approx(2.0))  # 100 B left at the full 100 B/s


def test_the_fabric_counts_the_bytes_that_moved_on_a_divided_link():
    # the burst's saturation measure (loadtests/burst_objective_rule.md): a byte moved slower than alone
    fabric = Fabric({"nic": 100.0, "other": 100.0})
    fabric.start("a", ["nic"], 50.0, sealed=True)
    fabric.start("b", ["nic"], 150.0, sealed=True)
    fabric.advance(1.0)  # both at 50 B/s: a done, 50 of b's moved shared
    fabric.finish("a")
    fabric.start("c", ["other"], 100.0, sealed=True)  # alone on its link: never shared
    fabric.advance(2.0)
    assert (fabric.moved_bytes, fabric.shared_bytes) == (pytest.approx(300.0), pytest.approx(100.0))
    assert fabric.busy_s == {"nic": pytest.approx(2.0), "other": pytest.approx(1.0)}  # b's last 50 B alone


def test_an_unsealed_transfer_never_completes_and_does_not_load_the_link_when_drained():
    fabric = Fabric({"nic": 100.0})
    fabric.start("s", ["nic"], 100.0)
    assert fabric.next_done() is None
    fabric.advance(1.0)
    assert fabric.transfers["s"].remaining == 0 and not fabric.busy("nic")
    fabric.grow("s", 50.0, seal=True)
    assert fabric.busy("nic")
    assert fabric.next_done()[0] == pytest.approx(1.5)


def test_time_may_not_go_backwards():
    fabric = Fabric({"nic": 1.0})
    fabric.advance(2.0)
    with pytest.raises(ValueError):
        fabric.advance(1.0)


async def test_async_link_shares_the_nic_between_concurrent_sends():
    busy: list[bool] = []
    link = AsyncLink(1000.0, 1.0, busy.append)
    started = time.perf_counter()
    await link.send(100.0)  # alone: 0.1 s
    alone = time.perf_counter() - started
    started = time.perf_counter()
    await asyncio.gather(link.send(100.0), link.send(100.0))  # together: 0.2 s
    together = time.perf_counter() - started
    assert together > 1.6 * alone
    assert busy[0] is True and busy[-1] is False
