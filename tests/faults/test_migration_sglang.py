"""Session migration in an SGLang PD pool (issue 12, item 5): a decode worker dying mid-stream.

An SGLang decode worker serves only requests paired with a prefill through a bootstrap room, so
the continuation must go through another prefill+decode PAIR: the new prefill computes (or, with
a shared store, loads) the prompt plus the tokens generated so far and hands that KV to the new
decode worker. The client's stream stays byte-identical to an unbroken run, the dead worker gets
nothing more, and no booking is left behind, with the memory and the Redis state stores."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from faults.conftest import TOKEN, router, stats  # type: ignore[import-not-found]
from test_continuation import stream  # type: ignore[import-not-found]

from router.tools.emulator import FaultConfig

PREFIX = "You are the dispatcher of a parcel service; answer briefly and precisely. " * 60  # ~800 tokens
DIE_AFTER = 40
BOOKED = ("requests", "prefill_tokens", "kv_tokens", "transfers", "transfer_bytes")


def booked(url: str) -> dict[str, dict[str, Any]]:
    """What stays booked per instance once the stream's release ran (the relay releases as it ends)."""
    deadline = time.monotonic() + 5
    while True:
        r = httpx.get(f"{url}/debug/instances", headers={"authorization": f"Bearer {TOKEN}"})
        loads = {i["id"]: {k: i["load"][k] for k in BOOKED} for i in r.json()["instances"]}
        if not any(any(v.values()) for v in loads.values()) or time.monotonic() > deadline:
            return loads
        time.sleep(0.05)


def nothing_booked(url: str) -> bool:
    return not any(any(load.values()) for load in booked(url).values())


def sglang_pool(emulators, store_url: str | None, **fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """2 prefill + 2 decode SGLang emulators; d0 drops every stream after DIE_AFTER tokens."""
    base: dict[str, Any] = {"flavor": "sglang", "bootstrap_port": 0, "bootstrap_timeout_s": 5, **fields}
    if store_url is not None:
        base |= {"kv_store_url": store_url, "kv_store_write_blocks": 1}
    engines = {"p0": emulators(role="prefill", engine_id="p0", **base),
               "p1": emulators(role="prefill", engine_id="p1", **base),
               "d0": emulators(role="decode", engine_id="d0", faults=FaultConfig(die_after_tokens=DIE_AFTER), **base),
               "d1": emulators(role="decode", engine_id="d1", **base)}
    instances = []
    for name, e in engines.items():
        role = "prefill" if name.startswith("p") else "decode"
        inst = {"url": e.url, "name": name, "role": role, "flavor": "sglang", "model": "m"}
        if role == "prefill":
            inst["bootstrap_port"] = e.bootstrap_port
        instances.append(inst)
    return engines, instances


def migrate_one(url: str, reference_url: str, engines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stream sessions until one lands on the dying d0; asserts each is unbroken; the stats of every
    engine taken just before the broken one."""
    for i in range(10):
        body = {"model": "m", "prompt": f"{PREFIX} Parcel {i}: where is it now?", "max_tokens": 60,
                "stream_options": {"include_usage": True}}
        expected, _, usage, _ = stream(reference_url, body)
        before = {n: stats(e.url) for n, e in engines.items()}
        got, done, got_usage, error = stream(url, body)
        assert not error and done == 1 and got == expected  # no token twice or lost, one [DONE]
        assert got_usage["completion_tokens"] == 60 and got_usage["prompt_tokens"] == usage["prompt_tokens"]
        if stats(engines["d0"].url)["http"]["injected_drops"]:
            return before
    pytest.fail("no stream went to the dying decode worker")


def continuation_legs(engines: dict[str, Any], before: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per engine, the requests it served since ``before`` (the broken session and its continuation)."""
    out = {}
    for name, e in engines.items():
        seen = {r["request_id"] for r in before[name]["recent"]}
        out[name] = [r for r in stats(e.url)["recent"] if r["request_id"] not in seen]
    return out


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_dying_sglang_decode_worker_migrates_the_session_to_another_pair_that_loads_from_the_store(
        emulators, kv_store, backend, request):
    reference = emulators()
    engines, instances = sglang_pool(emulators, kv_store.url)
    state = {} if backend == "memory" else {
        "state": {"backend": "redis", "redis_url": request.getfixturevalue("redis_url"),
                  "key_prefix": request.getfixturevalue("key_prefix")}}
    with router(instances, kv_store={"enabled": True}, **state) as (url, _):
        before = migrate_one(url, reference.url, engines)
        legs = continuation_legs(engines, before)
        assert len(legs["d1"]) == 1, "the continuation's decode leg ran on the other decode worker"
        cont = legs["d1"][0]
        assert cont["prompt_tokens"] > 800 + DIE_AFTER - 16  # the prompt plus the tokens generated so far
        # through a PAIR: exactly one prefill ran the continuation's prefill leg (its first and only token)
        prefill_legs = [r for n in ("p0", "p1") for r in legs[n] if r["prompt_tokens"] == cont["prompt_tokens"]]
        assert len(prefill_legs) == 1
        pname = next(n for n in ("p0", "p1") if prefill_legs[0] in legs[n])
        after = stats(engines[pname].url)
        loaded = after["store"]["loaded_tokens"] - before[pname]["store"]["loaded_tokens"]
        # what that prefill did not hold (at least the generated blocks: no prefill ever computed them)
        # came from the store, written by d0 as it generated; only the tail block is computed
        assert loaded >= DIE_AFTER - 16
        assert prefill_legs[0]["cached_tokens"] + loaded >= cont["prompt_tokens"] - 2 * 16
        assert after["pd"]["bootstrap_paired"] > before[pname]["pd"]["bootstrap_paired"]
        # the dead worker took nothing after it died: its one new request is the broken one
        d0 = stats(engines["d0"].url)["http"]["generation_requests"] - before["d0"]["http"]["generation_requests"]
        assert d0 == 1 and not legs["d0"]
        assert nothing_booked(url), booked(url)  # no phantom load


def test_without_a_store_the_sglang_continuation_is_prefilled_again_by_a_pair(emulators):
    reference = emulators()
    engines, instances = sglang_pool(emulators, None)
    with router(instances) as (url, _):
        before = migrate_one(url, reference.url, engines)
        legs = continuation_legs(engines, before)
        assert len(legs["d1"]) == 1
        cont = legs["d1"][0]
        prefill_legs = [r for n in ("p0", "p1") for r in legs[n] if r["prompt_tokens"] == cont["prompt_tokens"]]
        assert len(prefill_legs) == 1
        pname = next(n for n in ("p0", "p1") if prefill_legs[0] in legs[n])
        computed = stats(engines[pname].url)["tokens"]["prefill_computed"] - before[pname]["tokens"]["prefill_computed"]
        # computed again: all of it but what that prefill's own prefix cache held (the shared prefix)
        assert computed >= cont["prompt_tokens"] - prefill_legs[0]["cached_tokens"] - 1
        assert computed >= DIE_AFTER
        d0 = stats(engines["d0"].url)["http"]["generation_requests"] - before["d0"]["http"]["generation_requests"]
        assert d0 == 1 and not legs["d0"]
        assert all(stats(e.url)["store"]["loaded_tokens_admitted"] == 0 for e in engines.values())
        assert nothing_booked(url), booked(url)


def test_a_paired_standby_hands_the_prompt_to_the_backup_decode_worker_so_the_continuation_moves_only_the_tail(
        emulators, kv_store):
    # time scale 0.3: the warm (the prompt's KV over the PD link) is done well within the 40 tokens
    reference = emulators()
    engines, instances = sglang_pool(emulators, kv_store.url, time_scale=0.3)
    d2 = emulators(role="decode", engine_id="d2", flavor="sglang", bootstrap_port=0, kv_store_url=kv_store.url,
                   kv_store_write_blocks=1, time_scale=0.3)
    engines["d2"] = d2
    instances.append({"url": d2.url, "name": "d2", "role": "decode", "flavor": "sglang", "model": "m"})
    standby = {"enabled": True, "min_prompt_tokens": 256}
    with router(instances, kv_store={"enabled": True, "standby": standby}) as (url, _):
        before = migrate_one(url, reference.url, engines)
        legs = continuation_legs(engines, before)
        warmed = {n: [r for r in legs[n] if r["client_request_id"].endswith("-standby")] for n in ("d1", "d2")}
        # the session's backup got the prompt; the other one the re-armed warm (prompt + text so far)
        backup = min((n for n in ("d1", "d2") if warmed[n]), key=lambda n: warmed[n][0]["prompt_tokens"])
        warm = warmed[backup][0]
        assert warm["transferred_tokens"] >= warm["prompt_tokens"] - 16  # the prompt's KV went there ahead of time
        cont = next(r for r in legs[backup] if r not in warmed[backup])
        assert cont["prompt_tokens"] >= warm["prompt_tokens"] + DIE_AFTER - 2
        # the continuation found the prompt on the backup: only the generated tail crossed the link
        assert cont["cached_tokens"] >= warm["prompt_tokens"] - 16
        assert cont["transferred_tokens"] <= DIE_AFTER + 2 * 16
        # the session's prefill paired the warm (it held the prompt: nothing computed for it)
        prefill_warms = [r for n in ("p0", "p1") for r in legs[n] if r["client_request_id"].endswith("-standby")]
        assert prefill_warms and all(r["cached_tokens"] >= r["prompt_tokens"] - 16 for r in prefill_warms)
        assert nothing_booked(url), booked(url)
