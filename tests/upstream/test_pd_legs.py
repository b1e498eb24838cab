"""PD end to end against recording fake engines: the bodies each leg sees, field by field."""

import copy
import time
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from router.gateway.app import create_app
from router.config.model import load_config
from servers import FakeBackend, serve_app

TOKEN = "t0k"
PROMPT = "Long shared document about the quarterly logistics review. " * 70  # ~4.2k chars ~ 1k tokens
KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "eng-p", "remote_block_ids": [4, 5, 6],
      "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "vendor_extra": {"nested": [1, 2]}}
ADMIN = {"authorization": f"Bearer {TOKEN}"}


@contextmanager
def pd_cluster(prefills, decodes, flavor="vllm", bootstrap_port=8998, extra=(), **overrides):
    with ExitStack() as stack:
        instances = []
        for role, backends in (("prefill", prefills), ("decode", decodes)):
            for b in backends:
                url = stack.enter_context(serve_app(b.app()))
                inst = {"url": url, "name": b.name, "role": role, "flavor": flavor, "model": "m"}
                if role == "prefill" and flavor == "sglang":
                    inst["bootstrap_port"] = bootstrap_port
                instances.append(inst)
        config = load_config(overrides={"instances": instances + list(extra), "policy": {"seed": 2},
                                        "server": {"admin_token": TOKEN}, "health": {"interval_s": 60}, **overrides})
        yield stack.enter_context(serve_app(create_app(config))), config


def body(**kw):
    return {"model": "m", "prompt": PROMPT + " Summarise it.", "max_tokens": 32, "temperature": 0.2, **kw}


def test_vllm_legs_field_by_field():
    p, d = FakeBackend("p", kv_params=copy.deepcopy(KV)), FakeBackend("d")
    with pd_cluster([p], [d]) as (url, _):
        sent = body(stream=True, stream_options={"include_usage": True}, max_completion_tokens=32, min_tokens=4)
        r = httpx.post(f"{url}/v1/completions", json=sent, headers={"x-request-id": "req-42"})
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert len(p.received) == 1 and len(d.received) == 1
    pb, db = p.received[0]["body"], d.received[0]["body"]
    expected_p = {k: v for k, v in sent.items() if k != "stream_options"}
    expected_p.update(max_tokens=1, max_completion_tokens=1, min_tokens=1, stream=False,
                      kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                          "remote_block_ids": None, "remote_host": None, "remote_port": None})
    assert pb == expected_p
    assert db == {**sent, "kv_transfer_params": KV}  # original body, params copied verbatim
    assert p.received[0]["headers"]["x-request-id"] == d.received[0]["headers"]["x-request-id"] == "req-42"
    assert p.received[0]["at"] < d.received[0]["at"]


def test_vllm_min_tokens_pop_mode():
    p, d = FakeBackend("p", kv_params=KV), FakeBackend("d")
    with pd_cluster([p], [d], pd={"vllm_min_tokens": "pop"}) as (url, _):
        assert httpx.post(f"{url}/v1/completions", json=body(min_tokens=3)).status_code == 200
    assert "min_tokens" not in p.received[0]["body"] and d.received[0]["body"]["min_tokens"] == 3


def test_sglang_legs_are_concurrent_with_one_room():
    p = FakeBackend("p", first_byte_s=0.4)  # the prefill answers only after a while
    d = FakeBackend("d")
    with pd_cluster([p], [d], flavor="sglang", bootstrap_port=9123) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=body(stream=True))
        assert r.status_code == 200 and '"backend": "d"' in r.text
        r = httpx.post(f"{url}/v1/completions", json=body(prompt=[PROMPT + "a", PROMPT + "b"], n=2))
        assert r.status_code == 200
    first_p, first_d = p.received[0], d.received[0]
    assert first_p["body"] == first_d["body"]
    b = first_p["body"]
    assert b["bootstrap_host"] == "127.0.0.1" and b["bootstrap_port"] == 9123
    assert isinstance(b["bootstrap_room"], int) and 0 <= b["bootstrap_room"] < 2**63
    assert abs(first_p["at"] - first_d["at"]) < 0.2  # sent together, not after the prefill answered
    assert first_d["at"] < p.finished_at[0]
    batch = p.received[1]["body"]
    assert batch["bootstrap_host"] == ["127.0.0.1"] * 4 and len(set(batch["bootstrap_room"])) == 4
    assert b["bootstrap_room"] not in batch["bootstrap_room"]


def test_failed_prefill_is_retried_on_another_then_falls_back_to_decode():
    bad, good, d = FakeBackend("p_bad", status=500), FakeBackend("p_good", kv_params=KV), FakeBackend("d")
    with pd_cluster([bad, good], [d]) as (url, _):
        for i in range(4):
            assert httpx.post(f"{url}/v1/completions", json=body(prompt=f"{i} " + PROMPT)).status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
    assert len(good.received) == 4 and all(r["body"]["kv_transfer_params"] == KV for r in d.received)
    # At most one try per request on the failing prefill, each retried on the other, and the
    # outlier detector ejects it after health.outlier_failures (3) of them in a row. (Until
    # then it stays a candidate: with one calibration factor per group of like engines,
    # good's fast answers no longer make bad look slow.)
    assert len(bad.received) <= 3
    if bad.received:
        assert (f'pd_router_pd_failures_total{{action="retry_other_prefill",engine="p_bad"}} '
                f'{float(len(bad.received))}') in metrics

    b1, b2, d = FakeBackend("p1", status=503), FakeBackend("p2", status=500), FakeBackend("d")
    with pd_cluster([b1, b2], [d]) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=body())
        assert r.status_code == 200
        assert "prefill_on_decode" in httpx.get(f"{url}/metrics").text
    assert "kv_transfer_params" not in d.received[-1]["body"] and d.received[-1]["body"]["max_tokens"] == 32

    b1, d = FakeBackend("p1", status=503), FakeBackend("d")
    with pd_cluster([b1], [d], pd={"fallback_local_prefill": False, "prefill_retries": 0}) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=body())
        assert r.status_code == 502 and r.json()["error"]["code"] == "prefill_failed"
        assert d.received == []


def test_prefill_client_error_goes_back_to_the_client():
    p, d = FakeBackend("p", status=400), FakeBackend("d")
    with pd_cluster([p], [d]) as (url, _):
        r = httpx.post(f"{url}/v1/completions", json=body())
        assert r.status_code == 400 and r.json()["error"]["message"] == "p says no"
        inst = httpx.get(f"{url}/debug/instances", headers=ADMIN).json()["instances"]
        assert all(i["load"]["requests"] == 0 for i in inst)
    assert d.received == []


def test_explain_matches_the_decision_taken():
    ps = [FakeBackend(f"p{i}", kv_params=KV) for i in range(2)]
    ds = [FakeBackend(f"d{i}") for i in range(2)]
    with pd_cluster(ps, ds) as (url, _):
        for i in range(6):
            sent = body(prompt=f"tenant {i % 2}: " + PROMPT)
            plan = httpx.post(f"{url}/debug/route", json=sent, headers=ADMIN).json()
            assert plan["chosen"]["route"] in plan["acceptable"]
            chosen = next(r for r in plan["routes"] if r["route"] == plan["chosen"]["route"])
            assert chosen["terms"]["ttft_s"] == pytest.approx(plan["chosen"]["estimate_s"])
            before = {b.name: len(b.received) for b in ps + ds}
            assert httpx.post(f"{url}/v1/completions", json=sent).status_code == 200
            d_name = next(b.name for b in ds if len(b.received) > before[b.name])
            p_name = next((b.name for b in ps if len(b.received) > before[b.name]), None)
            taken = d_name if p_name is None else f"{d_name}<-{p_name}"
            assert taken in plan["acceptable"], (taken, plan["acceptable"])
        assert httpx.post(f"{url}/debug/route", json=body()).status_code == 401


def test_incompatible_prefill_is_never_paired_and_reported():
    p, odd, d = FakeBackend("p", kv_params=KV), FakeBackend("odd", kv_params=KV), FakeBackend("d")
    with ExitStack() as stack:
        odd_url = stack.enter_context(serve_app(odd.app()))
        extra = [{"url": odd_url, "name": "odd", "role": "prefill", "model": "m", "block_size": 32, "prefill_tokens_per_s": 1e9}]
        with pd_cluster([p], [d], extra=extra) as (url, _):
            for i in range(5):
                assert httpx.post(f"{url}/v1/completions", json=body(prompt=f"{i} " + PROMPT)).status_code == 200
            inst = {i["id"]: i for i in httpx.get(f"{url}/debug/instances", headers=ADMIN).json()["instances"]}
            assert "block_size=32" in inst["odd"]["unpairable"] and inst["p"]["unpairable"] is None
    assert odd.received == [] and len(p.received) == 5


def test_ttft_slo_rejects_with_429_before_sending():
    p, d = FakeBackend("p", kv_params=KV), FakeBackend("d")
    with pd_cluster([p], [d], pd={"ttft_slo_s": 5.0}) as (url, _):
        assert httpx.post(f"{url}/v1/completions", json=body()).status_code == 200
        r = httpx.post(f"{url}/v1/completions", json=body(), headers={"x-ttft-slo-ms": "1"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "ttft_slo" and int(r.headers["retry-after"]) >= 1
        assert httpx.post(f"{url}/v1/completions", json=body(), headers={"x-ttft-slo-ms": "soon"}).status_code == 400
    assert len(p.received) == 1 and len(d.received) == 1


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_the_prefill_work_stops_queueing_once_the_prefill_leg_answered(flavor):
    """While D has not sent its first byte (the KV still moving), P's booked prefill is gone
    but the request and its transfer stay booked on it."""
    import threading

    p, d = FakeBackend("p", kv_params=copy.deepcopy(KV)), FakeBackend("d", first_byte_s=1.0)
    with pd_cluster([p], [d], flavor=flavor) as (url, _):
        done = threading.Event()
        threading.Thread(target=lambda: (httpx.post(f"{url}/v1/completions", json=body(stream=True), timeout=10),
                                         done.set()), daemon=True).start()
        deadline = time.monotonic() + 5
        while not (p.received and d.received) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # the prefill leg answered at once; the decode leg holds its first byte for 1 s
        assert not done.is_set()
        routed = httpx.post(f"{url}/debug/route", json=body(), headers=ADMIN).json()
        load = {c["id"]: c["load"] for c in routed["candidates"]}["p"]
        assert load["prefill_tokens"] == 0 and load["requests"] == 1 and load["transfers"] == 1
        assert done.wait(5)
