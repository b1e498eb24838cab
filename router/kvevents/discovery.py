"""Find where each instance publishes its KV events, from config or from the engine.

vLLM 0.32 answers ``GET /kv_event_sources`` with a JSON object keyed by data-parallel
rank, each value that rank's publisher config (``{"0": {"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": ..., "topic": "kv",
...}}``, seen from a real engine); a list of entries that carry
``data_parallel_rank`` themselves is read too.
The endpoint is the publisher's own setting, so it says which side binds: vLLM binds
when the host is ``*`` or ``::`` (or for ipc), and then the router connects to the
instance's host on that port; a named host means the publisher connects there, so the
router binds that port (on every interface) and tells engines apart by topic.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import httpx

from router.config.precise import KVEventSourceConfig
from router.kvevents.source import SourceSpec

log = logging.getLogger(__name__)

_WILDCARDS = ("*", "0.0.0.0", "::", "[::]", "")


class DiscoveryError(Exception):
    """The instance does not (yet) say where it publishes."""


def publisher_binds(endpoint: str) -> bool:
    """vLLM's rule: its PUB binds for a wildcard host or a non-TCP transport."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0]
    return host in _WILDCARDS or "::" in host


def port_of(endpoint: str) -> int:
    try:
        return int(endpoint.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        raise DiscoveryError(f"no port in {endpoint!r}") from None


def connect_target(endpoint: str, instance_url: str) -> str:
    """Where a router SUB connects for a publisher that binds ``endpoint``."""
    if not endpoint.startswith("tcp://"):
        return endpoint  # ipc: the same path, on the same machine
    host = urlsplit(instance_url).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port_of(endpoint)}"


def bind_address(endpoint: str) -> str:
    """The router socket a connecting publisher at ``endpoint`` reaches."""
    return f"tcp://*:{port_of(endpoint)}"


def spec_from_config(instance: str, url: str, model: str, cfg: KVEventSourceConfig, bind: str | None) -> SourceSpec:
    """A configured source: ``endpoint`` is the engine's publisher setting, as for discovery."""
    replay = connect_target(cfg.replay_endpoint, url) if cfg.replay_endpoint else None
    if cfg.endpoint is None:
        if bind is None:
            raise DiscoveryError("a source without an endpoint needs kv_events.bind")
        return SourceSpec(instance, cfg.model or model, None, cfg.topic, replay, cfg.dp_rank, bind)
    if publisher_binds(cfg.endpoint):
        return SourceSpec(instance, cfg.model or model, connect_target(cfg.endpoint, url), cfg.topic, replay, cfg.dp_rank)
    return SourceSpec(instance, cfg.model or model, None, cfg.topic, replay, cfg.dp_rank, bind or bind_address(cfg.endpoint))


def specs_from_answer(instance: str, url: str, model: str, body: Any) -> list[SourceSpec]:
    """Source specs from a ``/kv_event_sources`` answer."""
    entries = body.get("sources", body) if isinstance(body, dict) else body
    if isinstance(entries, dict) and entries and all(isinstance(k, str) and k.isdigit() for k in entries):
        entries = [{**v, "data_parallel_rank": int(k)} for k, v in entries.items() if isinstance(v, dict)]
    elif isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        raise DiscoveryError("kv_event_sources is not a list")
    specs = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("endpoint"), str):
            continue
        if entry.get("publisher", "zmq") != "zmq" or entry.get("enable_kv_cache_events") is False:
            continue
        endpoint: str = entry["endpoint"]
        rank = entry.get("data_parallel_rank", entry.get("dp_rank")) or 0
        topic = entry.get("topic") or ""
        replay = entry.get("replay_endpoint")
        replay_target = connect_target(replay, url) if isinstance(replay, str) and replay else None
        if publisher_binds(endpoint):
            specs.append(SourceSpec(instance, model, connect_target(endpoint, url), topic, replay_target, int(rank)))
        else:
            specs.append(SourceSpec(instance, model, None, topic, replay_target, int(rank), bind_address(endpoint)))
    if not specs:
        raise DiscoveryError("the instance publishes no ZMQ KV events")
    return specs


async def served_model(client: httpx.AsyncClient, url: str, timeout_s: float) -> str:
    """The first model the instance serves (the key chain's root)."""
    try:
        resp = await client.get(f"{url}/v1/models", timeout=timeout_s)
        data = resp.json().get("data") if resp.status_code == 200 else None
        if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
            return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    raise DiscoveryError("GET /v1/models names no model")


async def discover(client: httpx.AsyncClient, instance: str, url: str, model: str | None,
                   timeout_s: float) -> list[SourceSpec]:
    """Ask one instance where it publishes; raise DiscoveryError when it cannot say."""
    try:
        resp = await client.get(f"{url}/kv_event_sources", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise DiscoveryError(f"GET /kv_event_sources failed: {type(exc).__name__}") from None
    if resp.status_code != 200:
        raise DiscoveryError(f"GET /kv_event_sources answered {resp.status_code}")
    try:
        body = resp.json()
    except ValueError:
        raise DiscoveryError("GET /kv_event_sources did not answer JSON") from None
    model = model or await served_model(client, url, timeout_s)
    return specs_from_answer(instance, url, model, body)
