"""The emulator's vLLM /metrics and /v1/models look like vLLM 0.32's own (captured fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.engines.readings import parse_metrics

from .conftest import StartFn

FIXTURES = Path(__file__).parents[2] / "fixtures"


def label_names(text: str, prefix: str) -> dict[str, set[str]]:
    """sample name -> label names, for the samples whose name starts with ``prefix``."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefix) and not s.name.endswith(("_bucket", "_created")):
                out.setdefault(s.name, set()).update(s.labels)
    return out


def test_every_vllm_series_of_the_emulator_exists_in_real_vllm_with_its_labels(
        start_emulator: StartFn, client: httpx.Client) -> None:
    real = label_names((FIXTURES / "vllm-0.32-metrics.txt").read_text(), "vllm:")
    emu = start_emulator(block_size=128, cache_tokens=8192)
    client.post(f"{emu.url}/v1/completions", json={"prompt": "hello " * 300, "max_tokens": 2})
    text = client.get(f"{emu.url}/metrics").text
    mine = label_names(text, "vllm:")
    assert mine, "the emulator exports no vllm: series"
    for name, labels in mine.items():
        assert name in real, f"{name} is not a vLLM 0.32 series"
        if name == "vllm:cache_config_info":
            assert labels <= real[name], labels - real[name]
        else:
            assert labels == real[name], (name, labels, real[name])
    # what the router reads is there, and reads the same as from the real engine
    reading, real_reading = parse_metrics(text), parse_metrics((FIXTURES / "vllm-0.32-metrics.txt").read_text())
    for field in ("running", "waiting", "kv_usage", "queried_tokens", "hit_tokens", "block_size",
                  "capacity_tokens", "kv_dtype", "finished", "prompt_tokens"):
        assert (getattr(reading, field) is None) == (getattr(real_reading, field) is None), field
    assert (reading.block_size, reading.capacity_tokens, reading.kv_dtype) == (128, 8192, "auto")


def test_model_list_has_the_fields_of_real_vllm(start_emulator: StartFn, client: httpx.Client) -> None:
    real = json.loads((FIXTURES / "vllm-0.32-models.json").read_text())["data"][0]
    emu = start_emulator(model="tiny", max_model_len=4096)
    mine = client.get(f"{emu.url}/v1/models").json()["data"][0]
    assert set(mine) == set(real)
    assert (mine["id"], mine["object"], mine["max_model_len"]) == ("tiny", "model", 4096)


def test_context_length_rules_are_vllm_032s(start_emulator: StartFn, client: httpx.Client) -> None:
    """As the real engine answered: prompt >= max_model_len and max_tokens > max_model_len are 400;
    prompt + max_tokens over the limit is clamped (tests/realvllm checks the real one)."""
    emu = start_emulator(model="tiny", max_model_len=512, cache_tokens=4096)
    url = f"{emu.url}/v1/completions"
    too_long = client.post(url, json={"model": "tiny", "prompt": [5] * 512, "max_tokens": 1})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "input_tokens"
    too_many = client.post(url, json={"model": "tiny", "prompt": [5] * 10, "max_tokens": 513})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
    clamped = client.post(url, json={"model": "tiny", "prompt": [5] * 500, "max_tokens": 100, "ignore_eos": True})
    assert clamped.status_code == 200, clamped.text
    assert clamped.json()["usage"]["completion_tokens"] == 12
