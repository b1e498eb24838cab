"""Issue 10, finding 12 (security): optional API keys on the inference routes."""

from __future__ import annotations

import httpx
import pytest

from router.config.model import ConfigError, load_config
from router.gateway.auth import load_keys
from gateway.test_app import TOKEN, cluster, completion  # type: ignore[import-not-found]
from servers import FakeBackend

KEY_A, KEY_B = "a" * 24, "team-b-" + "x" * 20


def test_inference_routes_need_a_known_key_and_count_it_by_name(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"# name key\nteam-b {KEY_B}\n")
    engine = FakeBackend("e")
    with cluster(engine, server={"admin_token": TOKEN, "api_keys": [{"name": "team-a", "key": KEY_A}],
                                 "api_keys_file": str(keys)}) as (url, _):
        for headers in ({}, {"authorization": "Bearer wrong-key-wrong-key"}, {"authorization": f"Basic {KEY_A}"}):
            r = httpx.post(f"{url}/v1/completions", json=completion(1), headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401
        assert engine.received == []
        for key in (KEY_A, KEY_B, KEY_A):
            r = httpx.post(f"{url}/v1/completions", json=completion(1), headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200
        assert all("authorization" not in got["headers"] for got in engine.received)  # the router's key, not the engine's
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pd_router_api_key_requests_total{key="team-a"} 2.0' in metrics
        assert 'pd_router_api_key_requests_total{key="team-b"} 1.0' in metrics
        assert KEY_A not in metrics and KEY_B not in metrics
        assert httpx.get(f"{url}/health").status_code == 200  # probes need no key
        doc = httpx.get(f"{url}/admin/config", headers={"authorization": f"Bearer {TOKEN}"}).json()
        assert doc["server"]["api_keys"] == [{"name": "team-a", "key": "***"}]


def test_without_keys_the_routes_stay_open_and_authorization_is_forwarded():
    engine = FakeBackend("e")
    with cluster(engine) as (url, _):
        assert httpx.post(f"{url}/v1/completions", json=completion(1), headers={"authorization": "Bearer engine-key"}).status_code == 200
    assert engine.received[0]["headers"]["authorization"] == "Bearer engine-key"


def test_a_malformed_key_file_is_a_config_error(tmp_path):
    bad = tmp_path / "keys"
    bad.write_text("only-a-name\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_keys(load_config(overrides={"server": {"api_keys_file": str(bad)}}))
    with pytest.raises(ConfigError, match="api_keys_file"):
        load_keys(load_config(overrides={"server": {"api_keys_file": str(tmp_path / "missing")}}))
