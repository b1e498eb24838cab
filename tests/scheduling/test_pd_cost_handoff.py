"""The handoff terms of a PD route's price: overlap per protocol, KV dtype bytes."""

import pytest

from router.config.model import LinkConfig, PDConfig
from router.core.instances import Candidate
from router.scheduling.framework import RouteRequest, View
from router.scheduling.pd_cost import transfer_seconds
from router.state.base import Load

PD = PDConfig(links=LinkConfig(same_zone_gbps=8.0, setup_s=0.0))  # 1 GB/s
REQ = RouteRequest("r", (), 20_001, 16, 16)


def pair(flavor: str, kv_bytes: int = 1000) -> tuple[View, View]:
    compat = ("m", "auto", 16, flavor)
    p = View(Candidate("p", role="prefill", compat=compat, zone="z", kv_bytes_per_token=kv_bytes), 0, Load())
    d = View(Candidate("d", role="decode", compat=compat, zone="z", kv_bytes_per_token=kv_bytes), 0, Load())
    return p, d


def test_vllm_pulls_after_the_prefill_so_the_whole_transfer_counts():
    p, d = pair("vllm")
    assert transfer_seconds(REQ, p, d, PD, prefill_s=10.0) == pytest.approx(20_001 * 1000 / 1e9)


def test_sglang_streams_during_the_prefill_so_only_the_last_chunk_counts():
    p, d = pair("sglang")
    chunk = PD.handoff.overlap_chunk_tokens
    last = (20_001 - 1) % chunk + 1  # 20,001 tokens in chunks of 8192: the last one holds 3,617
    assert transfer_seconds(REQ, p, d, PD, prefill_s=10.0) == pytest.approx(last * 1000 / 1e9)
    exact = RouteRequest("r", (), 2 * chunk, 16, 16)  # a whole last chunk when it divides evenly
    assert transfer_seconds(exact, p, d, PD, prefill_s=10.0) == pytest.approx(chunk * 1000 / 1e9)
    # a prefill shorter than the transfer hides only its own duration
    assert transfer_seconds(REQ, p, d, PD, prefill_s=0.005) == pytest.approx(20_001 * 1000 / 1e9 - 0.005)


def test_fp8_kv_halves_the_transfer_term():
    p, d = pair("vllm", 1000)
    p8, d8 = pair("vllm", 500)
    assert transfer_seconds(REQ, p8, d8, PD) == pytest.approx(transfer_seconds(REQ, p, d, PD) / 2)


def loaded(v: View, nbytes: int, transfers: int = 1) -> View:
    return v._replace(load=Load(transfers=transfers, transfer_bytes=nbytes))


def test_link_aware_pricing_reads_booked_bytes_not_the_count_of_transfers():
    aware = PD.model_copy(update={"handoff": PD.handoff.model_copy(update={"link_aware": True})})
    p, d = pair("vllm")
    alone = transfer_seconds(REQ, p, d, aware)
    # four tiny transfers booked on D barely matter once bytes are booked ...
    assert transfer_seconds(REQ, p, loaded(d, 4_000, 4), aware) == pytest.approx(alone, rel=0.01)
    # ... while the count-based model divides the link by five
    assert transfer_seconds(REQ, p, loaded(d, 4_000, 4), PD) == pytest.approx(5 * alone)
    # a backlog within the reservation share slows it by at most its own time (two fluid flows)
    small = int(0.01 * 1e9)  # 10 ms of D's NIC
    assert transfer_seconds(REQ, p, loaded(d, small), aware) == pytest.approx(alone + 0.01)
    # beyond max_link_backlog_s the transfer waits for the link: the pair gets expensive
    big = int(0.2 * 1e9)
    assert transfer_seconds(REQ, p, loaded(d, big), aware) == pytest.approx(alone + 0.2)


def test_link_aware_pricing_lets_p_drain_its_own_backlog_during_the_prefill():
    aware = PD.model_copy(update={"handoff": PD.handoff.model_copy(update={"link_aware": True})})
    p, d = pair("vllm")
    backlog = int(0.2 * 1e9)
    assert transfer_seconds(REQ, loaded(p, backlog), d, aware, lead_s=1.0) == pytest.approx(transfer_seconds(REQ, p, d, aware))


def test_an_fp8_kv_dtype_halves_the_default_bytes_per_token():
    compat8 = ("m", "fp8_e4m3", 16, "vllm")
    p = View(Candidate("p", role="prefill", compat=compat8, zone="z"), 0, Load())
    d = View(Candidate("d", role="decode", compat=compat8, zone="z"), 0, Load())
    bf = View(Candidate("p", role="prefill", compat=("m", "auto", 16, "vllm"), zone="z"), 0, Load())
    bd = View(Candidate("d", role="decode", compat=("m", "auto", 16, "vllm"), zone="z"), 0, Load())
    assert transfer_seconds(REQ, p, d, PD) == pytest.approx(transfer_seconds(REQ, bf, bd, PD) / 2)
