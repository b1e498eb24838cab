"""SGLang bootstrap-room PD between two real emulator servers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from router.tools.emulator.launch import EmulatorHandle

from .conftest import StartFn
from .helpers import sse_json

PROMPT = "SGLang pairs a prefill and a decode through a bootstrap room. " * 10


def pair(start_emulator: StartFn, timeout: float = 5.0  # a loaded host may start the legs far apart
         ) -> tuple[EmulatorHandle, EmulatorHandle]:
    p = start_emulator(flavor="sglang", role="prefill", bootstrap_port=0,
                       bootstrap_timeout_s=timeout)
    d = start_emulator(flavor="sglang", role="decode", bootstrap_timeout_s=timeout)
    return p, d


def both(client: httpx.Client, p_url: str, d_url: str, body: dict[str, object]
         ) -> tuple[httpx.Response, httpx.Response]:
    with ThreadPoolExecutor(2) as pool:
        fp = pool.submit(client.post, f"{p_url}/v1/completions", json=body)
        fd = pool.submit(client.post, f"{d_url}/v1/completions", json=body)
        return fp.result(), fd.result()


def test_concurrent_legs_with_same_room_succeed(start_emulator: StartFn,
                                                client: httpx.Client) -> None:
    p, d = pair(start_emulator)
    body = {"prompt": PROMPT, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": p.bootstrap_port, "bootstrap_room": 12345}
    rp, rd = both(client, p.url, d.url, body)
    assert rp.status_code == 200 and rd.status_code == 200, (rp.text, rd.text)
    p_usage = sse_json(rp.text)[-1]["usage"]
    d_usage = sse_json(rd.text)[-1]["usage"]
    assert p_usage["completion_tokens"] == 1      # the prefill's short answer
    assert d_usage["completion_tokens"] == 5
    assert d_usage["prompt_tokens_details"]["cached_tokens"] == d_usage["prompt_tokens"] - 1
    d_stats = client.get(f"{d.url}/emulator/stats").json()
    p_stats = client.get(f"{p.url}/emulator/stats").json()
    assert d_stats["tokens"]["transferred_in"] == d_usage["prompt_tokens"] - 1
    assert p_stats["pd"]["bootstrap_paired"] == 1
    assert client.get(f"{p.url}/server_info").json()["disaggregation_bootstrap_port"] \
        == p.bootstrap_port


def test_batch_rooms(start_emulator: StartFn, client: httpx.Client) -> None:
    p, d = pair(start_emulator)
    body = {"prompt": [PROMPT, "second " + PROMPT], "max_tokens": 3,
            "bootstrap_host": ["127.0.0.1", "127.0.0.1"],
            "bootstrap_port": [p.bootstrap_port, p.bootstrap_port],
            "bootstrap_room": [1, 2]}
    rp, rd = both(client, p.url, d.url, body)
    assert rp.status_code == rd.status_code == 200, (rp.text, rd.text)
    assert rd.json()["usage"]["completion_tokens"] == 6


def test_missing_partner_times_out_on_both_sides(start_emulator: StartFn,
                                                 client: httpx.Client) -> None:
    p, d = pair(start_emulator, timeout=0.5)
    body = {"prompt": PROMPT, "max_tokens": 3, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": p.bootstrap_port}
    lonely_prefill = client.post(f"{p.url}/v1/completions", json={**body, "bootstrap_room": 7})
    assert lonely_prefill.status_code == 504
    assert "room 7" in lonely_prefill.json()["error"]["message"]
    lonely_decode = client.post(f"{d.url}/v1/completions", json={**body, "bootstrap_room": 8})
    assert lonely_decode.status_code == 504
    assert "room 8" in lonely_decode.json()["error"]["message"]
    assert client.get(f"{p.url}/emulator/stats").json()["pd"]["bootstrap_timeouts"] == 2


def test_unreachable_bootstrap_and_missing_fields(start_emulator: StartFn,
                                                  client: httpx.Client) -> None:
    p, d = pair(start_emulator)
    p.stop()
    body = {"prompt": PROMPT, "max_tokens": 3, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": p.bootstrap_port, "bootstrap_room": 3}
    resp = client.post(f"{d.url}/v1/completions", json=body)
    assert resp.status_code == 502 and "unreachable" in resp.json()["error"]["message"]
    no_room = client.post(f"{d.url}/v1/completions", json={"prompt": PROMPT})
    assert no_room.status_code == 400 and no_room.json()["error"]["param"] == "bootstrap_room"
