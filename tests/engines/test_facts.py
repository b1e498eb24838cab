"""Engine facts: parsed from the engines' answers, merged under config (config wins)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.config.model import InstanceConfig
from router.engines.facts import EngineFacts, effective_config, parse_models, parse_server_info, serves

MODELS = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-0.32-models.json").read_text())


def test_models_of_real_vllm() -> None:
    assert parse_models(MODELS) == {"tiny": 4096}


def test_models_without_max_model_len_and_junk_entries() -> None:
    doc = {"data": [{"id": "a"}, {"id": "b", "max_model_len": 0}, {"id": ""}, "x", {"no": "id"}]}
    assert parse_models(doc) == {"a": None, "b": None}
    with pytest.raises(ValueError):
        parse_models({"detail": "Not Found"})


def test_sglang_server_info_top_level_or_internal_states() -> None:
    top = {"page_size": 64, "max_total_num_tokens": 640000, "kv_cache_dtype": "fp8_e5m2", "context_length": 8192}
    assert parse_server_info(top) == (64, 640000, "fp8_e5m2", 8192)
    nested = {"page_size": 1, "kv_cache_dtype": "auto", "internal_states": [{"max_total_num_tokens": 1000}]}
    assert parse_server_info(nested) == (1, 1000, "auto", None)
    with pytest.raises(ValueError):
        parse_server_info([1, 2])


GEOMETRY = EngineFacts(models={"tiny": 4096}, block_size=128, capacity_tokens=8192, kv_dtype="auto")


def test_defaults_take_the_engines_values() -> None:
    ic = InstanceConfig(url="http://a:1")
    effective, problems = effective_config(ic, GEOMETRY)
    assert (effective.cache_tokens, effective.block_size, effective.kv_dtype) == (8192, 128, "auto")
    assert effective.compat == (None, "auto", 128, "vllm") and not problems
    assert ic.cache_tokens == 500_000  # the written config is left alone


def test_config_wins_and_each_contradiction_is_reported() -> None:
    ic = InstanceConfig(url="http://a:1", cache_tokens=1000, block_size=16, model="other")
    effective, problems = effective_config(ic, GEOMETRY)
    assert (effective.cache_tokens, effective.block_size) == (1000, 16)
    assert {(p.field, p.configured, str(p.reported)) for p in problems} == {
        ("cache_tokens", 1000, "8192"), ("block_size", 16, "128"), ("model", "other", "['tiny']")}
    assert "config wins" in str(problems[0])


def test_a_config_value_equal_to_the_fact_is_no_contradiction() -> None:
    ic = InstanceConfig(url="http://a:1", block_size=128, kv_dtype="auto")
    assert effective_config(ic, GEOMETRY)[1] == []


def test_unknown_facts_change_nothing() -> None:
    ic = InstanceConfig(url="http://a:1")
    assert effective_config(ic, EngineFacts()) == (ic, [])


def test_serves() -> None:
    free, pinned = InstanceConfig(url="http://a:1"), InstanceConfig(url="http://a:1", model="x")
    assert serves(free, None, "tiny") is None and serves(free, EngineFacts(), "tiny") is None
    assert serves(free, GEOMETRY, "tiny") is True and serves(free, GEOMETRY, "x") is False
    assert serves(pinned, GEOMETRY, "x") is True and serves(pinned, GEOMETRY, "tiny") is False
