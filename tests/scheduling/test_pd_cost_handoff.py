"""The handoff terms of a PD route's price: overlap per protocol, KV dtype bytes."""

import pytest

from router.config.model import LinkConfig, PDConfig, TTFTWeights
from router.core.instances import Candidate
from router.scheduling.framework import RouteRequest, View
from router.scheduling.pd_cost import route_cost, transfer_seconds
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
    # ... and without link-aware booking too: nothing of them is left on the link when ours starts
    assert transfer_seconds(REQ, p, loaded(d, 4_000, 4), PD) == pytest.approx(alone, rel=0.01)
    # a backlog within the reservation share slows it by at most its own time (two fluid flows)
    small = int(0.01 * 1e9)  # 10 ms of D's NIC
    assert transfer_seconds(REQ, p, loaded(d, small), aware) == pytest.approx(alone + 0.01)
    # beyond max_link_backlog_s the transfer waits for the link: the pair gets expensive
    big = int(0.2 * 1e9)
    assert transfer_seconds(REQ, p, loaded(d, big), aware) == pytest.approx(alone + 0.2)


def test_unaware_pricing_shares_the_link_only_with_what_is_left_when_the_transfer_starts():
    p, d = pair("vllm")
    alone = transfer_seconds(REQ, p, d, PD)  # 20 ms at 1 GB/s
    # two transfers of 1 s booked into D: fair sharing costs each of them min(T, B/n) of ours
    assert transfer_seconds(REQ, p, loaded(d, int(1e9), 2), PD) == pytest.approx(3 * alone)
    # 25 ms of bytes left over two transfers: each takes 12.5 ms of ours, the rest runs alone
    assert transfer_seconds(REQ, p, loaded(d, int(0.025e9), 2), PD) == pytest.approx(alone + 0.025)
    # transfers ahead of ours on P's queue (and booked at D too: the same pair) leave before ours
    # starts when the link drains them in time ...
    assert transfer_seconds(REQ, loaded(p, int(0.5e9), 3), loaded(d, int(0.5e9), 3), PD, lead_s=0.6) == \
        pytest.approx(alone)
    # ... else what is left of them shares the link
    assert transfer_seconds(REQ, loaded(p, int(0.5e9), 3), d, PD, lead_s=0.49) == pytest.approx(alone + 0.01)
    # other pairs' transfers into D start when their prefills end, which P's queue does not tell:
    # they are taken to run alongside ours however long ours waits
    assert transfer_seconds(REQ, p, loaded(d, int(1e9), 2), PD, lead_s=5.0) == pytest.approx(3 * alone)
    # a count without bytes (a store that books none) is not a flow on the link
    assert transfer_seconds(REQ, p, loaded(d, 0, 5), PD) == pytest.approx(alone)


def test_the_last_sglang_chunk_moves_on_the_link_as_shared():
    p, d = pair("sglang")
    last = ((20_001 - 1) % PD.handoff.overlap_chunk_tokens + 1) * 1000 / 1e9
    assert transfer_seconds(REQ, p, d, PD, prefill_s=10.0) == pytest.approx(last)
    # two other pairs' transfers of 1 s into D: a third of the link for the whole of it
    assert transfer_seconds(REQ, p, loaded(d, int(1e9), 2), PD, prefill_s=10.0) == pytest.approx(3 * last)


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


def test_an_sglang_prefill_queue_drains_at_the_slowed_rate():
    # 1 s of booked work whose head has run 0.9 s, on a P whose steps run 10% slower while its
    # NIC streams KV: 1.1 s of work, 0.2 s left (slowing the 0.1 s left at full speed said 0.11)
    compat = ("m", "auto", 16, "sglang")
    pd = PD.model_copy(update={"handoff": PD.handoff.model_copy(update={"transfer_interference": 0.1})})
    p = View(Candidate("p", role="prefill", compat=compat, zone="z", prefill_tokens_per_s=8000.0), 0,
             Load(1, 8000, prefill_started_s=0.9, prefill_head_tokens=8000))
    d = View(Candidate("d", role="decode", compat=compat, zone="z"), 0, Load())
    w = TTFTWeights(prefill_tokens_per_s=8000.0, attention_s_per_token2=0.0, request_overhead_s=0.0,
                    decode_interference_s=0.0)
    cost = route_cost(RouteRequest("r", (), 800, 16, 16), d, p, w, pd)
    assert cost.queue_s == pytest.approx(0.2)
    assert cost.prefill_s == pytest.approx(1.1 * 800 / 8000.0)
