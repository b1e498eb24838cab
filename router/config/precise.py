"""Configuration of precise residency: the engines' KV events and token-mode hashing.

Kept apart from ``router.config.model`` so that the event-ingestion settings stay one
section (``kv_events``) and the token-mode settings one sub-section (``hashing.tokens``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

HashingMode = Literal["chars", "tokens"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_zmq_endpoint(value: str) -> str:
    if not value.startswith(("tcp://", "ipc://")):
        raise ValueError("must be a ZMQ endpoint such as tcp://10.0.0.5:5557 or ipc:///tmp/kv.sock")
    return value


ZmqEndpoint = Annotated[str, AfterValidator(_check_zmq_endpoint)]


class TokensConfig(_Strict):
    """Token mode: request keys are chained over the engine's own token blocks.

    ``source: engine`` asks the engine that serves the model (``POST /tokenize``, which
    applies its own chat template); ``source: file`` tokenizes in the router with the
    ``tokenizers`` package from a local ``tokenizer.json`` (never a hub download)."""

    source: Literal["engine", "file"] = Field(default="engine", description="engine: POST /tokenize on an instance serving the model; file: a local tokenizer.json")
    path: str | None = Field(default=None, description="tokenizer.json, for source: file")
    chat_template_path: str | None = Field(
        default=None, description="tokenizer_config.json (or a .jinja file) holding the chat template; "
        "default: tokenizer_config.json beside path")
    block_size: int = Field(default=16, ge=1, description="tokens per key: the engines' KV block size "
                            "(vLLM GPU 16, vLLM CPU 128, SGLang page size)")
    offload_chars: int = Field(default=2048, ge=0, description="prompts longer than this are tokenized "
                               "in a worker thread so the event loop is not held")
    timeout_s: float = Field(default=2.0, gt=0, description="engine /tokenize timeout (then character keys)")


class KVEventSourceConfig(_Strict):
    """Where one instance publishes its KV events.

    ``endpoint`` set: the router's SUB connects there (the engine's publisher binds, e.g.
    vLLM ``tcp://*:5557``; a ``*`` host is replaced by the instance's host). ``endpoint``
    unset: the engine's publisher connects to the router's ``kv_events.bind`` socket and
    ``topic`` tells its events apart from the other engines'."""

    endpoint: ZmqEndpoint | None = Field(default=None, description="the publisher's ZMQ endpoint (None: asked from GET /kv_event_sources)")
    topic: str = Field(default="", description="the ZMQ topic the engine publishes under")
    replay_endpoint: ZmqEndpoint | None = Field(default=None, description="the publisher's replay (ROUTER) socket")
    model: str | None = Field(default=None, description="model whose key chain the events extend "
                              "(default: the instance's model, else its /v1/models)")
    dp_rank: int = Field(default=0, ge=0, description="data-parallel rank whose events this source carries")


class KVEventsConfig(_Strict):
    """Precise residency: what each engine holds, read from its KV events.

    An instance whose events are missing, out of sequence or not yet synchronised is
    routed on the router's own routing history (approximate) until it is synchronised."""

    enabled: bool = Field(default=False, description="precise residency from the engines' KV events (needs hashing.mode: tokens)")
    discover: bool = Field(default=True, description="ask instances without a source for GET /kv_event_sources")
    discover_interval_s: float = Field(default=10.0, gt=0, description="retry discovery this often until it answers")
    sources: dict[str, KVEventSourceConfig] = Field(default_factory=dict, description="instance id -> source")
    bind: ZmqEndpoint | None = Field(default=None, description="a SUB the engines' publishers connect to, e.g. tcp://*:5557")
    cpu_weight: float = Field(default=0.8, ge=0, le=1, description="a block held only in CPU (offload) "
                              "memory counts as this fraction of a GPU block")
    max_blocks_per_instance: int = Field(default=1_000_000, ge=16, description="engine blocks tracked per "
                                         "instance; beyond it the oldest stored are forgotten")
    sidecar: bool = Field(default=False, description="decode and apply KV events in a child process the "
                          "router owns (restarted if it dies), which ships only changed key sets to the event "
                          "loop: for tens of thousands of events/s and more, so that routing latency stays as it is")
    native_key_sets: bool = Field(default=True, description="with the sidecar, the loop's key sets are the C "
                                  "extension router.state._keyset's where it was built (GET /debug/kv_events: "
                                  "key_sets); false, or not built: Python sets, ~4x the loop's CPU per key change")
    shared_tables: bool = Field(default=True, description="with the sidecar, the tables are in shared memory "
                                "that the sidecar writes and the loop reads in place, so KV events cost the router's "
                                "process nothing (Linux, with native key sets; GET /debug/kv_events: mirror); false, "
                                "or not possible: the sidecar ships changed key sets that the loop applies")
    native_tables: bool = Field(default=True, description="the engine-block tables (in-process, or in the "
                                "sidecar) are the C extension router.state._tracked's where it was built (GET "
                                "/debug/kv_events: tables); false, or not built: Python tables, ~2.4x the CPU per event")
    sidecar_nice: int = Field(default=5, ge=0, le=19, description="the sidecar's CPU priority below the router's "
                              "(Unix nice increment): when the cores are contended, routing goes first and an "
                              "ingestion that falls behind shows as sequence gaps (approximate residency until resynced)")
    speculative_s: float = Field(default=2.0, ge=0, description="a routed prefix counts on its instance for this "
                                 "long before the engine's events confirm it")
    hwm: int = Field(default=100_000, ge=1, description="ZMQ receive high-water mark (messages); beyond it the "
                     "socket drops, which shows as a sequence gap")
    replay_timeout_s: float = Field(default=2.0, gt=0, description="how long to wait for a replay of missed batches")
    max_pending_batches: int = Field(default=10_000, ge=1, description="live batches held while a replay runs")
