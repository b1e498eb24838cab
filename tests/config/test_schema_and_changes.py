"""The config model describes itself (schema, commented defaults) and the change rules."""

from __future__ import annotations

import json
import typing

import pytest
import yaml
from pydantic import BaseModel

from router.cli import main
from router.config import changes
from router.config.discovery import DiscoveryRole, EngineFlavor
from router.config.model import Flavor, Role, RouterConfig, load_config


def _models(model: type[BaseModel], path: str = ""):
    yield path, model
    for name, field in model.model_fields.items():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            stack.extend(typing.get_args(t))
            if isinstance(t, type) and issubclass(t, BaseModel):
                yield from _models(t, f"{path}{name}.")


def test_every_config_field_has_a_description():
    missing = [f"{path}{name}" for path, model in _models(RouterConfig)
               for name, field in model.model_fields.items() if not field.description]
    assert missing == []


def test_discovery_literals_agree_with_the_model():
    assert typing.get_args(DiscoveryRole) == typing.get_args(Role)
    assert typing.get_args(EngineFlavor) == typing.get_args(Flavor)


def test_config_schema_and_defaults_commands(capsys, tmp_path, monkeypatch):
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["additionalProperties"] is False and "discovery" in schema["properties"]
    assert schema["properties"]["reload"]["description"]

    monkeypatch.setenv("PD_ROUTER_POLICY__NAME", "random")  # the defaults, not this environment's overrides
    assert main(["config", "defaults"]) == 0
    text = capsys.readouterr().out
    assert "# KV cache capacity in tokens" in text
    data = yaml.safe_load(text)
    assert data["policy"]["name"] == "ttft" and data["instances"] == [] and data["discovery"]["kubernetes"]["enabled"] is False
    monkeypatch.delenv("PD_ROUTER_POLICY__NAME")
    assert RouterConfig.model_validate(data) == load_config()  # the printed defaults are a valid config, and the defaults

    path = tmp_path / "c.yaml"
    path.write_text("policy: {name: nope}\n")
    assert main(["config", "check", str(path)]) == 2
    assert "policy.name" in capsys.readouterr().err


def test_merge_patch_follows_rfc_7386():
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}
    assert changes.merge_patch(target, {"a": {"b": 9, "c": None}, "l": [3], "n": {"m": 1}}) == \
        {"a": {"b": 9}, "l": [3], "x": 1, "n": {"m": 1}}
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}  # not modified


def test_secrets_are_redacted_and_a_masked_value_sent_back_keeps_the_secret():
    doc = changes.dump(load_config(overrides={"server": {"admin_token": "s3cr3t-t0k"},
                                              "state": {"redis_url": "redis://user:pw@redis:6379/0"}}))
    shown = changes.redact(doc)
    assert shown["server"]["admin_token"] == changes.REDACTED
    assert shown["state"]["redis_url"] == "redis://user:***@redis:6379/0"
    assert "s3cr3t-t0k" not in json.dumps(shown) and "pw@" not in json.dumps(shown)
    back = changes.unredact({"server": shown["server"], "state": {"redis_url": shown["state"]["redis_url"]}}, doc)
    assert back["server"]["admin_token"] == "s3cr3t-t0k" and back["state"]["redis_url"] == "redis://user:pw@redis:6379/0"
    assert changes.unredact({"server": {"admin_token": "new"}}, doc) == {"server": {"admin_token": "new"}}


def test_parts_that_need_a_restart_are_refused_with_the_reason():
    old = changes.dump(load_config())
    new = changes.dump(load_config(overrides={"state": {"backend": "redis"}, "proxy": {"max_connections": 5,
                                                                                     "connect_timeout_s": 1}}))
    changed = changes.diff(old, new)
    assert changed == ["proxy.connect_timeout_s", "proxy.max_connections", "state.backend"]
    with pytest.raises(changes.Refused, match="state.backend cannot change while the router runs") as info:
        changes.check_live(changed)
    assert "proxy.max_connections" in str(info.value) and "connect_timeout_s" not in str(info.value)
    changes.check_live(["policy.ttft.request_overhead_s", "instances", "health.interval_s"])  # live: no error


def test_environment_variables_that_set_a_path_or_its_section_are_found():
    env = {"PD_ROUTER_PD__TBT_TARGET_S": "0.2", "pd_router_health": '{"interval_s": 3}', "HOME": "/root"}
    found = changes.env_overrides(["pd.tbt_target_s", "health.interval_s", "policy.name", "pd.links.setup_s"], env)
    assert found == {"pd.tbt_target_s": "PD_ROUTER_PD__TBT_TARGET_S", "health.interval_s": "pd_router_health"}
