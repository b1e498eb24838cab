"""The replay's handoff world: shared links, per-protocol overlap, transfer interference."""

import pytest

from router.tools.replay.cluster import ClusterSpec
from router.tools.replay.sim import Simulation
from router.tools.replay.trace import Trace, TraceRequest
from tests.tools.replay.test_replay_sim import Scripted

SMALL = {"cache_tokens": 400_000}


def trace_of(*reqs):
    return Trace("t", 512, tuple(reqs))


def req(n_in, n_out=2, t=0.0, base=100):
    return TraceRequest(t, n_in, n_out, tuple(range(base, base + -(-n_in // 512))))


def ttfts(rec):
    return [f - a for f, a in zip(rec.first_token, rec.arrival)]


def test_two_transfers_into_one_decode_engine_share_its_nic():
    spec = ClusterSpec(prefill=2, decode=1, mixed=0, link_gbps=10.0, **SMALL)
    alone = Simulation(trace_of(req(8000)), spec, Scripted([("disaggregated", "d0", "p0")])).run()
    both = Simulation(trace_of(req(8000), req(8000, base=900)), spec,
                      Scripted([("disaggregated", "d0", "p0"), ("disaggregated", "d0", "p1")])).run()
    transfer = 7999 * spec.kv_bytes_per_token() / (10e9 / 8)
    # Both prefills end together; sharing the NIC, both transfers end one transfer later.
    assert min(ttfts(both)) > ttfts(alone)[0] + 0.8 * transfer


def test_sglang_streams_kv_during_a_chunked_prefill_and_vllm_does_not():
    trace = trace_of(req(30000))
    route = Scripted([("disaggregated", "d0", "p0")])
    # A link fast enough that the transfer fits in the prefill time: only the last chunk shows.
    v = Simulation(trace, ClusterSpec(prefill=1, decode=1, link_gbps=50.0, **SMALL), route).run()
    s = Simulation(trace, ClusterSpec(prefill=1, decode=1, link_gbps=50.0, flavor="sglang", **SMALL), route).run()
    chunk = 8192 * ClusterSpec(decode=1).kv_bytes_per_token() / (50e9 / 8)
    full = 29999 * ClusterSpec(decode=1).kv_bytes_per_token() / (50e9 / 8)
    assert ttfts(v)[0] - ttfts(s)[0] > 0.5 * (full - chunk)  # most of the transfer hid behind compute
    assert ttfts(s)[0] > ttfts(v)[0] - full  # but not all: the last chunk still moves after


def test_fp8_kv_halves_the_bytes_and_the_transfer_time():
    assert ClusterSpec(decode=1, kv_dtype="fp8").kv_bytes_per_token() * 2 == ClusterSpec(decode=1).kv_bytes_per_token()
    trace, route = trace_of(req(8000)), Scripted([("disaggregated", "d0", "p0")])
    bf16 = Simulation(trace, ClusterSpec(prefill=1, decode=1, link_gbps=5.0, **SMALL), route).run()
    fp8 = Simulation(trace, ClusterSpec(prefill=1, decode=1, link_gbps=5.0, kv_dtype="fp8", **SMALL), route).run()
    half = 7999 * ClusterSpec(decode=1, kv_dtype="fp8").kv_bytes_per_token() / (5e9 / 8)
    assert ttfts(bf16)[0] - ttfts(fp8)[0] == pytest.approx(half, rel=0.05)


@pytest.mark.parametrize("interference", [0.0, 0.5])
def test_a_transfer_in_flight_slows_the_decode_steps_at_its_end(interference):
    # r0 decodes on d0 for a while; r1's long transfer into d0 overlaps those steps.
    trace = trace_of(req(600, n_out=400), req(30000, t=0.0, base=900))
    spec = ClusterSpec(prefill=1, decode=1, link_gbps=2.0, transfer_interference=interference, **SMALL)
    rec = Simulation(trace, spec, Scripted([("decode_only", "d0", None), ("disaggregated", "d0", "p0")])).run()
    test_a_transfer_in_flight_slows_the_decode_steps_at_its_end.results[interference] = rec.finish[0] - rec.first_token[0]
    if len(test_a_transfer_in_flight_slows_the_decode_steps_at_its_end.results) == 2:
        r = test_a_transfer_in_flight_slows_the_decode_steps_at_its_end.results
        assert r[0.5] > 1.2 * r[0.0]


test_a_transfer_in_flight_slows_the_decode_steps_at_its_end.results = {}  # type: ignore[attr-defined]
