"""Facts an engine reports about itself, and how they combine with config.

Served models and their ``max_model_len`` come from ``/v1/models`` (vLLM and SGLang);
cache geometry from ``vllm:cache_config_info`` (``/metrics``) or SGLang's
``/get_server_info``. Config stays the override: a field the operator set explicitly
wins, and a fact that contradicts it is reported (the caller logs it once); a field left
at its default takes the engine's value, so the cost model and the P/D compatibility
contract see the capacity, block size and KV dtype the engine really has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from router.config.model import InstanceConfig
from router.engines.readings import EngineReading


@dataclass(frozen=True)
class EngineFacts:
    """What is known about one engine; None = not (yet) reported."""

    models: Mapping[str, int | None] | None = None  # served name -> max_model_len
    block_size: int | None = None
    capacity_tokens: int | None = None
    kv_dtype: str | None = None

    def with_geometry(self, block_size: int | None, capacity_tokens: int | None, kv_dtype: str | None) -> "EngineFacts":
        """These facts with any geometry reported (a None keeps what was known)."""
        return replace(
            self,
            block_size=block_size or self.block_size,
            capacity_tokens=capacity_tokens or self.capacity_tokens,
            kv_dtype=kv_dtype or self.kv_dtype,
        )

    def with_reading(self, reading: EngineReading) -> "EngineFacts":
        return self.with_geometry(reading.block_size, reading.capacity_tokens, reading.kv_dtype)


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return int(value)


def parse_models(doc: Any) -> dict[str, int | None]:
    """``/v1/models`` -> {model id: max_model_len or None}; ValueError if it is no model list."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("not an OpenAI model list")
    return {
        m["id"]: _positive_int(m.get("max_model_len"))
        for m in data
        if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]
    }


def parse_server_info(doc: Any) -> tuple[int | None, int | None, str | None, int | None]:
    """SGLang ``/get_server_info`` -> (page size, capacity tokens, KV dtype, context length).

    The scheduler's numbers sit at the top level in some SGLang versions and in
    ``internal_states[0]`` in others: both are read."""
    if not isinstance(doc, dict):
        raise ValueError("server info is not a JSON object")
    states = doc.get("internal_states")
    inner = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}

    def get(name: str) -> Any:
        return doc.get(name) if doc.get(name) is not None else inner.get(name)

    dtype = get("kv_cache_dtype")
    return (
        _positive_int(get("page_size")),
        _positive_int(get("max_total_num_tokens")),
        dtype if isinstance(dtype, str) and dtype else None,
        _positive_int(get("context_length")),
    )


# InstanceConfig field -> EngineFacts field
_OVERRIDABLE = {"cache_tokens": "capacity_tokens", "block_size": "block_size", "kv_dtype": "kv_dtype"}


@dataclass(frozen=True)
class Contradiction:
    instance: str
    field: str
    configured: Any
    reported: Any

    def __str__(self) -> str:
        return (f"instance {self.instance}: config sets {self.field}={self.configured!r} but the engine reports "
                f"{self.reported!r}; config wins")


def effective_config(ic: InstanceConfig, facts: EngineFacts) -> tuple[InstanceConfig, list[Contradiction]]:
    """``ic`` with the engine's facts filled in where config left the default.

    ``ic`` must be the instance's config as written (its ``model_fields_set`` tells which
    fields the operator set)."""
    update: dict[str, Any] = {}
    problems: list[Contradiction] = []
    for name, fact_name in _OVERRIDABLE.items():
        reported = getattr(facts, fact_name)
        if reported is None:
            continue
        if name in ic.model_fields_set:
            if getattr(ic, name) != reported:
                problems.append(Contradiction(ic.id, name, getattr(ic, name), reported))
        elif getattr(ic, name) != reported:
            update[name] = reported
    if ic.model is not None and facts.models is not None and ic.model not in facts.models:
        problems.append(Contradiction(ic.id, "model", ic.model, sorted(facts.models)))
    return (ic.model_copy(update=update) if update else ic), problems


def serves(ic: InstanceConfig, facts: EngineFacts | None, model: str) -> bool | None:
    """True/False when it is known whether the instance serves ``model``, None when unknown.

    A model set in config is what the router sends there (config is the override);
    otherwise the engine's own list decides."""
    if ic.model is not None:
        return ic.model == model
    if facts is None or facts.models is None:
        return None
    return model in facts.models
