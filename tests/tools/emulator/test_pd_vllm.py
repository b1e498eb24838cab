"""vLLM NixlConnector-shaped PD between two real emulator servers."""

from __future__ import annotations

import time

import httpx

from .conftest import StartFn
from .helpers import sse_json

PROMPT = "Disaggregated prefill moves the KV cache from one engine to another. " * 12
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None,
                  "remote_host": None, "remote_port": None}


def prefill(client: httpx.Client, url: str, prompt: str = PROMPT) -> dict[str, object]:
    resp = client.post(f"{url}/v1/completions",
                       json={"prompt": prompt, "max_tokens": 1, "stream": False,
                             "kv_transfer_params": PREFILL_PARAMS})
    assert resp.status_code == 200, resp.text
    params = resp.json()["kv_transfer_params"]
    assert isinstance(params, dict)
    return params


def test_prefill_then_decode_pulls_kv(start_emulator: StartFn, client: httpx.Client) -> None:
    p = start_emulator(role="prefill")
    d = start_emulator(role="decode")
    params = prefill(client, p.url)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == p.engine_id
    assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == p.port
    assert isinstance(params["remote_block_ids"], list) and params["remote_block_ids"]
    assert client.get(f"{p.url}/emulator/stats").json()["requests"]["held"] == 1

    resp = client.post(f"{d.url}/v1/completions",
                       json={"prompt": PROMPT, "max_tokens": 6, "stream": True,
                             "stream_options": {"include_usage": True},
                             "kv_transfer_params": params})
    assert resp.status_code == 200, resp.text
    chunks = sse_json(resp.text)
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1

    d_stats = client.get(f"{d.url}/emulator/stats").json()
    p_stats = client.get(f"{p.url}/emulator/stats").json()
    assert d_stats["tokens"]["transferred_in"] == usage["prompt_tokens"] - 1
    assert d_stats["tokens"]["prefill_computed"] == 1
    assert d_stats["pd"]["kv_pulls"] == 1
    assert p_stats["pd"] == {**p_stats["pd"], "kv_holds": 1, "kv_pulls_served": 1}
    assert p_stats["requests"]["held"] == 0 and p_stats["kv"]["used_blocks"] == 0

    # The decode continues exactly as a single mixed engine would.
    mixed = start_emulator()
    plain = client.post(f"{mixed.url}/v1/completions",
                        json={"prompt": PROMPT, "max_tokens": 6}).json()
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == plain["choices"][0]["text"]


def test_second_pull_and_expired_blocks_fail_loudly(start_emulator: StartFn,
                                                    client: httpx.Client) -> None:
    p = start_emulator(role="prefill", kv_hold_timeout_s=0.3)
    d = start_emulator(role="decode")
    params = prefill(client, p.url)
    body = {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    assert client.post(f"{d.url}/v1/completions", json=body).status_code == 200
    again = client.post(f"{d.url}/v1/completions", json=body)
    assert again.status_code == 502
    assert again.json()["error"]["type"] == "KVTransferError"

    expiring = prefill(client, p.url, prompt="another prompt " * 30)
    time.sleep(0.6)
    late = client.post(f"{d.url}/v1/completions",
                       json={"prompt": "another prompt " * 30, "max_tokens": 2,
                             "kv_transfer_params": expiring})
    assert late.status_code == 502 and "expired" in late.json()["error"]["message"]
    stats = client.get(f"{p.url}/emulator/stats").json()
    assert stats["pd"]["kv_holds_expired"] == 1 and stats["kv"]["used_blocks"] == 0


def test_prefill_gone_errors_or_recomputes(start_emulator: StartFn,
                                           client: httpx.Client) -> None:
    p = start_emulator(role="prefill")
    strict = start_emulator(role="decode")
    lenient = start_emulator(role="decode", pd_fallback="recompute")
    params = prefill(client, p.url)
    p.stop()
    body = {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    failed = client.post(f"{strict.url}/v1/completions", json=body)
    assert failed.status_code == 502 and "unreachable" in failed.json()["error"]["message"]
    recomputed = client.post(f"{lenient.url}/v1/completions", json=body)
    assert recomputed.status_code == 200
    assert recomputed.headers["x-emulator-pd-fallback"] == "recompute"
    assert recomputed.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    stats = client.get(f"{lenient.url}/emulator/stats").json()
    assert stats["pd"]["fallback_recomputes"] == 1 and stats["tokens"]["transferred_in"] == 0


def test_wrong_prompt_and_wrong_roles_are_rejected(start_emulator: StartFn,
                                                  client: httpx.Client) -> None:
    p = start_emulator(role="prefill")
    d = start_emulator(role="decode")
    params = prefill(client, p.url)
    wrong = client.post(f"{d.url}/v1/completions",
                        json={"prompt": "a different prompt", "max_tokens": 2,
                              "kv_transfer_params": params})
    assert wrong.status_code == 409 and "differs" in wrong.json()["error"]["message"]
    on_decode = client.post(f"{d.url}/v1/completions",
                            json={"prompt": PROMPT, "max_tokens": 1,
                                  "kv_transfer_params": PREFILL_PARAMS})
    assert on_decode.status_code == 400


def test_transfer_time_follows_bandwidth(start_emulator: StartFn,
                                         client: httpx.Client) -> None:
    """A slow link makes the decode leg's TTFT visibly longer (model time)."""
    p = start_emulator(role="prefill", time_scale=0.05)
    fast = start_emulator(role="decode", time_scale=0.05, kv_bandwidth_gbps=400.0)
    slow = start_emulator(role="decode", time_scale=0.05, kv_bandwidth_gbps=0.5)
    long_prompt = "transfer " * 3000
    elapsed = {}
    for name, d in (("fast", fast), ("slow", slow)):
        params = prefill(client, p.url, long_prompt)
        t0 = time.monotonic()
        resp = client.post(f"{d.url}/v1/completions",
                           json={"prompt": long_prompt, "max_tokens": 1,
                                 "kv_transfer_params": params})
        elapsed[name] = time.monotonic() - t0
        assert resp.status_code == 200
    # 3000 tokens x 128 KiB at 0.5 Gb/s = 6.3 model s -> ~0.31 s wall at 0.05: a host stall of
    # less than ~0.2 s in the fast run cannot hide it.
    assert elapsed["slow"] > elapsed["fast"] + 0.1, elapsed
