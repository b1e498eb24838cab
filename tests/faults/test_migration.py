"""Session migration (issue 12, item 5): a decode instance dies mid-stream and the session goes
on on another decode instance, which loads the KV of prompt + tokens so far from the shared
store (written by the prefill and by the dying decode as it generated) instead of prefilling it."""

from __future__ import annotations

import pytest

from faults.conftest import router, stats  # type: ignore[import-not-found]
from router.tools.emulator import FaultConfig
from test_continuation import stream  # type: ignore[import-not-found]


def test_a_session_migrates_to_another_decode_instance_that_loads_its_kv_from_the_store(emulators, kv_store):
    reference = emulators()
    base = {"flavor": "vllm", "kv_store_url": kv_store.url, "kv_store_write_blocks": 1}
    p0 = emulators(role="prefill", engine_id="p0", **base)
    d0 = emulators(role="decode", engine_id="d0", faults=FaultConfig(die_after_tokens=40), **base)
    d1 = emulators(role="decode", engine_id="d1", **base)
    instances = [{"url": e.url, "name": n, "role": r, "flavor": "vllm", "model": "m"}
                 for e, n, r in ((p0, "p0", "prefill"), (d0, "d0", "decode"), (d1, "d1", "decode"))]
    prefix = "You are the dispatcher of a parcel service; answer briefly and precisely. " * 60
    with router(instances, kv_store={"enabled": True}) as (url, app):
        for i in range(8):
            body = {"model": "m", "prompt": f"{prefix} Parcel {i}: where is it now?", "max_tokens": 60}
            expected, _, _, _ = stream(reference.url, body)
            before = stats(d1.url)
            got, done, _, error = stream(url, body)
            assert not error and done == 1 and got == expected
            if stats(d0.url)["http"]["injected_drops"]:
                break
        else:
            pytest.fail("no stream went to the dying decode instance")
        after = stats(d1.url)
        prompt_tokens = after["recent"][-1]["prompt_tokens"]  # the continuation: prompt + 40 generated
        loaded = after["store"]["loaded_tokens"] - before["store"]["loaded_tokens"]
        computed = after["tokens"]["prefill_computed"] - before["tokens"]["prefill_computed"]
        assert loaded >= prompt_tokens - 2 * 16  # prompt and generated blocks, all but the tail block
        assert computed <= 2 * 16
        assert after["pd"]["kv_pulls"] == before["pd"]["kv_pulls"]  # decode alone: no prefill instance involved


def test_without_a_store_the_continuation_prefills_again(emulators):
    reference = emulators()
    base = {"flavor": "vllm"}
    p0 = emulators(role="prefill", engine_id="p0", **base)
    d0 = emulators(role="decode", engine_id="d0", faults=FaultConfig(die_after_tokens=40), **base)
    d1 = emulators(role="decode", engine_id="d1", **base)
    instances = [{"url": e.url, "name": n, "role": r, "flavor": "vllm", "model": "m"}
                 for e, n, r in ((p0, "p0", "prefill"), (d0, "d0", "decode"), (d1, "d1", "decode"))]
    prefix = "You are the dispatcher of a parcel service; answer briefly and precisely. " * 60
    with router(instances) as (url, app):
        for i in range(8):
            body = {"model": "m", "prompt": f"{prefix} Parcel {i}: where is it now?", "max_tokens": 60}
            expected, _, _, _ = stream(reference.url, body)
            got, done, _, error = stream(url, body)
            assert not error and done == 1 and got == expected
            if stats(d0.url)["http"]["injected_drops"]:
                break
        else:
            pytest.fail("no stream went to the dying decode instance")
        s = stats(d1.url)
        assert s["store"]["loaded_tokens_admitted"] == 0
        # the prompt + generated text is computed again, on d1 or on the prefill instance for d1
        assert s["tokens"]["prefill_computed"] + stats(p0.url)["tokens"]["prefill_computed"] > 1000
