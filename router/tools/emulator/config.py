"""Configuration of one emulated engine.

Every knob of the emulator lives here so that the CLI, the in-process
launchers, the subprocess launcher and the trace replay all build the very
same engine from one value. ``None`` means "take the profile's default".
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field
from typing import Literal

Flavor = Literal["vllm", "sglang"]
Role = Literal["prefill", "decode", "mixed"]
PdFallback = Literal["error", "recompute"]
KvDtype = Literal["auto", "fp8"]

FLAVORS: tuple[str, ...] = ("vllm", "sglang")
ROLES: tuple[str, ...] = ("prefill", "decode", "mixed")
PD_FALLBACKS: tuple[str, ...] = ("error", "recompute")
KV_DTYPES: tuple[str, ...] = ("auto", "fp8")


@dataclass
class FaultConfig:
    """Injected misbehaviour; mutable at runtime via ``POST /emulator/faults``.

    All fields default to "healthy" so an empty config injects nothing.
    """

    error_rate: float = 0.0
    """Fraction of generation requests answered with HTTP 503."""
    stall_rate: float = 0.0
    """Fraction of generation requests that stall before answering."""
    stall_seconds: float = 0.0
    """How long a stalled request hangs; <= 0 with stall_rate > 0 means forever."""
    die_after_tokens: int = -1
    """Drop the connection after this many streamed tokens (-1 = never)."""
    crash_on_request: bool = False
    """Kill the whole process (``os._exit``) when the next request arrives."""
    slowdown: float = 1.0
    """Multiply every engine step duration (a slow or throttled GPU)."""
    unhealthy: bool = False
    """Answer /health with 503 while still serving requests."""

    def validate(self) -> None:
        """Raise ValueError on nonsensical values (admin endpoint input)."""
        for name in ("error_rate", "stall_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if self.slowdown <= 0:
            raise ValueError(f"slowdown must be > 0, got {self.slowdown}")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def updated(self, changes: dict[str, object]) -> FaultConfig:
        """Return a copy with ``changes`` applied, type-checked per field."""
        known = {f.name: f for f in dataclasses.fields(self)}
        values = self.to_dict()
        for key, raw in changes.items():
            if key not in known:
                raise ValueError(f"unknown fault field {key!r}")
            current = values[key]
            if isinstance(current, bool):
                if not isinstance(raw, bool):
                    raise ValueError(f"{key} must be a boolean")
                values[key] = raw
            elif isinstance(current, int):
                if isinstance(raw, bool) or not isinstance(raw, int):
                    raise ValueError(f"{key} must be an integer")
                values[key] = raw
            else:
                if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                    raise ValueError(f"{key} must be a number")
                values[key] = float(raw)
        result = FaultConfig(**values)  # type: ignore[arg-type]
        result.validate()
        return result


@dataclass
class EmulatorConfig:
    """Everything needed to build one emulated vLLM or SGLang server."""

    flavor: Flavor = "vllm"
    role: Role = "mixed"
    profile: str = "llama3-8b-h100"
    model: str | None = None
    """Served model name; default ``emulated-<profile>``."""
    host: str = "127.0.0.1"
    port: int = 8000
    """Public port; advertised to PD peers as ``remote_port``."""
    advertise_host: str | None = None
    """Host put in ``kv_transfer_params.remote_host``; default: ``host``."""
    engine_id: str | None = None
    """Stable engine id; default: a random one per process."""
    seed: int = 0
    time_scale: float = 1.0
    """Wall seconds slept per model second (0.01 = 100x faster than a GPU)."""
    cache_tokens: int | None = None
    block_size: int = 16
    max_batched_tokens: int | None = None
    max_num_seqs: int = 256
    max_model_len: int | None = None
    default_max_tokens: int = 16
    kv_bandwidth_gbps: float | None = None
    kv_transfer_latency_s: float = 0.0005
    kv_dtype: KvDtype = "auto"
    """KV cache dtype: "auto" keeps the model's (bf16, 2 B), "fp8" stores and sends 1 B."""
    kv_transfer_interference: float = 0.1
    """Fraction by which every engine step slows while a KV transfer is in flight on the
    engine's NIC (the copy engines and PCIe/HBM traffic of RDMA reads contend with
    compute; an assumption, not a measurement: set it from your hardware)."""
    overlap_chunk_tokens: int | None = None
    """SGLang: KV is sent per prefill chunk of this many tokens while the prefill runs, so
    only the last chunk's transfer adds to TTFT; None = max_batched_tokens."""
    kv_hold_timeout_s: float = 30.0
    """Wall seconds a prefill keeps KV pinned for its decode peer."""
    pd_fallback: PdFallback = "error"
    bootstrap_port: int = 8998
    """SGLang prefill bootstrap listener port (0 = pick a free one)."""
    bootstrap_timeout_s: float = 10.0
    stats_history: int = 2000
    kv_events_endpoint: str | None = None
    """Publish KV events (vLLM's ZMQ format) here: ``tcp://*:PORT`` binds (``:0`` = any
    free port), a named host connects; None = no events."""
    kv_events_topic: str = ""
    kv_events_replay_endpoint: str | None = None
    """A replay ROUTER socket (always binds), e.g. ``tcp://*:0``."""
    kv_events_positional: bool = False
    """Encode events as positional arrays (vLLM before 0.32) instead of maps."""
    kv_store_url: str | None = None
    """A shared KV store (store_server.py): prompts look up their leading blocks there on
    arrival and load what the engine lacks; computed blocks are written back. None = no store."""
    kv_store_write_blocks: int = 16
    """A stream writes its generated blocks to the store every this many blocks (and its
    prompt's at the first token), so a session that moves on loses at most that many."""
    faults: FaultConfig = field(default_factory=FaultConfig)

    def validate(self) -> None:
        """Raise ValueError early instead of failing deep inside a request."""
        if self.flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        if self.pd_fallback not in PD_FALLBACKS:
            raise ValueError(f"pd_fallback must be one of {PD_FALLBACKS}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}")
        if self.kv_transfer_interference < 0:
            raise ValueError("kv_transfer_interference must be >= 0")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.cache_tokens is not None and self.cache_tokens < self.block_size:
            raise ValueError("cache_tokens must hold at least one block")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.kv_store_write_blocks < 1:
            raise ValueError("kv_store_write_blocks must be >= 1")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        self.faults.validate()

    def kv_bytes_per_token(self, model_bytes: int) -> int:
        """Bytes per token of KV on this engine given the model's bf16 figure."""
        return model_bytes // 2 if self.kv_dtype == "fp8" else model_bytes

    @property
    def served_model(self) -> str:
        return self.model or f"emulated-{self.profile}"

    @property
    def public_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        if self.host in ("0.0.0.0", "::", ""):
            # Bound to every interface: advertise this machine's own address
            # (a pod IP in Kubernetes) so PD peers on other hosts can reach it.
            try:
                return socket.gethostbyname(socket.gethostname())
            except OSError:
                return "127.0.0.1"
        return self.host

    def replace(self, **changes: object) -> EmulatorConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
