"""PD end to end through the router with emulated engines, both handoff protocols."""

from contextlib import ExitStack

import httpx
import pytest

from router.gateway.app import create_app
from router.config.model import load_config
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from servers import serve_app

SYSTEM = "You are the support assistant of a large logistics company. Answer precisely. " * 40  # ~800 tokens


def stats(handle):
    return httpx.get(handle.url + "/emulator/stats").json()


def chat(question, stream=True):
    return {"model": "m", "stream": stream, "max_tokens": 12,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_pd_through_the_router_with_emulated_engines(flavor):
    with ExitStack() as stack:
        base = EmulatorConfig(flavor=flavor, model="m", time_scale=0.01, bootstrap_port=0, bootstrap_timeout_s=5)
        p = stack.enter_context(start_in_thread(base.replace(role="prefill", engine_id="p0")))
        d = stack.enter_context(start_in_thread(base.replace(role="decode", engine_id="d0")))
        prefill = {"url": p.url, "name": "p0", "role": "prefill", "flavor": flavor, "model": "m"}
        if flavor == "sglang":
            prefill["bootstrap_port"] = p.bootstrap_port
        config = load_config(overrides={
            "instances": [prefill, {"url": d.url, "name": "d0", "role": "decode", "flavor": flavor, "model": "m"}],
            "health": {"interval_s": 60}, "policy": {"seed": 1},
        })
        url = stack.enter_context(serve_app(create_app(config)))

        r = httpx.post(f"{url}/v1/chat/completions", json=chat("Where is parcel 1?"), timeout=30)
        assert r.status_code == 200, r.text
        assert r.text.rstrip().endswith("data: [DONE]") and '"content"' in r.text
        ps, ds = stats(p), stats(d)
        assert ps["tokens"]["prefill_computed"] > 700  # the prompt was prefilled on P ...
        assert ds["tokens"]["transferred_in"] > 700  # ... and its KV moved to D
        assert ds["tokens"]["prefill_computed"] < 64
        if flavor == "sglang":
            assert ps["pd"]["bootstrap_paired"] == 1
        else:
            assert ps["pd"]["kv_pulls_served"] == 1

        # a different question on the same system prompt
        r = httpx.post(f"{url}/v1/chat/completions", json=chat("And parcel 2?", stream=False), timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        metrics = httpx.get(f"{url}/metrics").text
        if flavor == "vllm":
            # D now holds the prefix: the few uncached tokens are prefilled on D alone
            assert stats(p)["requests"]["added"] == ps["requests"]["added"]
            assert stats(d)["tokens"]["cached"] > ds["tokens"]["cached"] + 700
            assert 'pd_router_route_modes_total{mode="decode_only"} 1.0' in metrics
        else:
            # an SGLang decode worker never runs alone: P again, which now hits its cache
            assert stats(p)["tokens"]["cached"] > ps["tokens"]["cached"] + 700
            assert 'pd_router_route_modes_total{mode="disaggregated"} 2.0' in metrics
