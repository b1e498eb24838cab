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
    chunk = PD.handoff.overlap_chunk_tokens * 1000 / 1e9
    assert transfer_seconds(REQ, p, d, PD, prefill_s=10.0) == pytest.approx(chunk)
    # a prefill shorter than the transfer hides only its own duration
    assert transfer_seconds(REQ, p, d, PD, prefill_s=0.005) == pytest.approx(20_001 * 1000 / 1e9 - 0.005)


def test_fp8_kv_halves_the_transfer_term():
    p, d = pair("vllm", 1000)
    p8, d8 = pair("vllm", 500)
    assert transfer_seconds(REQ, p8, d8, PD) == pytest.approx(transfer_seconds(REQ, p, d, PD) / 2)
