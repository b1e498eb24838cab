"""Router configuration: a YAML file validated by pydantic, overridable from the environment.

Every field can be set through ``PD_ROUTER_<FIELD>`` with ``__`` between nesting levels,
e.g. ``PD_ROUTER_STATE__BACKEND=redis`` or ``PD_ROUTER_POLICY__TTFT__PREFILL_TOKENS_PER_S=9000``.
Environment values win over the file, the file wins over the defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from router.config.precise import HashingMode, KVEventsConfig, TokensConfig

Role = Literal["prefill", "decode", "mixed"]
Flavor = Literal["vllm", "sglang"]
PolicyName = Literal[
    "ttft", "round_robin", "random", "least_loaded", "cache_aware",
    "sglang_cache_aware", "llmd_weighted", "dynamo_cost",  # peers' policies, router/policy/baselines.py
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KVShape(_Strict):
    """Model shape from which KV bytes per token follow: layers x 2 (K, V) x KV heads x head dim x bytes."""

    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype_bytes: float = Field(default=2, gt=0, description="2 for bf16/fp16, 1 for fp8")

    @property
    def bytes_per_token(self) -> int:
        return int(self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes)


class InstanceConfig(_Strict):
    """One engine instance the router may send traffic to (and the only kind it ever contacts)."""

    url: str
    role: Role = "mixed"
    name: str | None = None
    flavor: Flavor = "vllm"
    labels: dict[str, str] = Field(default_factory=dict)
    cache_tokens: int = Field(default=500_000, gt=0, description="KV cache capacity in tokens")
    prefill_tokens_per_s: float | None = Field(default=None, gt=0)
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    model: str | None = Field(default=None, description="served model; requests for another model never go here (None = any)")
    kv_dtype: str = Field(default="auto", description="KV cache dtype; P and D must agree")
    block_size: int = Field(default=16, ge=1, description="engine KV block size in tokens; P and D must agree")
    kv_bytes_per_token: int | None = Field(default=None, gt=0, description="KV bytes per token (default pd.kv_bytes_per_token)")
    kv_shape: KVShape | None = Field(default=None, description="model shape to derive kv_bytes_per_token from")

    @model_validator(mode="after")
    def _kv_bytes(self) -> "InstanceConfig":
        if self.kv_shape is not None:
            derived = self.kv_shape.bytes_per_token
            if self.kv_bytes_per_token is not None and self.kv_bytes_per_token != derived:
                raise ValueError(f"kv_bytes_per_token={self.kv_bytes_per_token} contradicts kv_shape ({derived})")
            self.kv_bytes_per_token = derived
        return self

    @property
    def compat(self) -> tuple[str | None, str, int, str]:
        """P and D are paired only when these agree: same model, KV layout and protocol."""
        return (self.model, self.kv_dtype, self.block_size, self.flavor)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http(s) URL such as http://10.0.0.5:8000")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("must not carry a path, query or fragment")
        return value.rstrip("/")

    @property
    def id(self) -> str:
        return self.name or self.url


class StateConfig(_Strict):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="pdr", min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    lease_s: float = Field(default=15.0, gt=0, le=30, description="booked load vanishes this long after its owner stops refreshing it")
    residency_ttl_s: float = Field(default=600.0, gt=0, description="a residency entry not touched for this long is forgotten")
    max_keys_per_instance: int | None = Field(default=None, gt=0, description="cap on residency entries per instance; default cache_tokens / block tokens")
    redis_timeout_s: float = Field(default=0.5, gt=0)


class HashingConfig(_Strict):
    mode: HashingMode = Field(default="chars", description="chars: keys over characters of the prompt; tokens: "
                              "over the engine's token blocks (needed for keys that meet the engines' KV events)")
    block_chars: int = Field(default=256, ge=8, description="characters per block key")
    chars_per_token: float = Field(default=4.0, gt=0, description="estimate used to turn characters into tokens")
    max_blocks: int = Field(default=4096, ge=1, description="longest prefix (in blocks) the router tracks")
    seed: int = Field(default=0, ge=0, lt=2**64)
    tokens: TokensConfig = Field(default_factory=TokensConfig)

    @property
    def text_block_tokens(self) -> int:
        """Tokens a character block stands for (an estimate)."""
        return max(1, round(self.block_chars / self.chars_per_token))

    @property
    def block_tokens(self) -> int:
        """Tokens per key of a token prompt: the engine block size in token mode."""
        return self.tokens.block_size if self.mode == "tokens" else self.text_block_tokens


class TTFTWeights(_Strict):
    """Parameters of the colocated TTFT estimate (seconds): queue + prefill of uncached tokens."""

    prefill_tokens_per_s: float = Field(default=8000.0, gt=0, description="default prefill rate when an instance declares none")
    attention_s_per_token2: float = Field(default=1.0e-9, ge=0, description="context-dependent prefill cost per (token x context token)")
    request_overhead_s: float = Field(default=0.005, ge=0, description="fixed cost per queued request")
    decode_interference_s: float = Field(default=0.002, ge=0, description="added delay per running request on the instance")
    tie_tolerance: float = Field(default=0.05, ge=0, lt=1, description="estimates within this fraction of the best are a tie, broken randomly")
    bounded_load_factor: float = Field(default=2.0, gt=1, description="an instance above this multiple of the mean in-flight load is skipped")
    bounded_load_slack: int = Field(default=2, ge=0, description="in-flight requests always allowed above the mean before the bound applies")


class CacheAwareWeights(_Strict):
    """sglang-router style: longest cached prefix unless load is imbalanced."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1)


class PolicyConfig(_Strict):
    name: PolicyName = "ttft"
    seed: int | None = Field(default=None, description="RNG seed for tie breaks (None = random)")
    default_max_tokens: int = Field(default=256, ge=1, description="output length assumed when a request sets none")
    ttft: TTFTWeights = Field(default_factory=TTFTWeights)
    cache_aware: CacheAwareWeights = Field(default_factory=CacheAwareWeights)


class LinkConfig(_Strict):
    """Bandwidth of a KV transfer by topology (instance labels ``node`` and ``zone``)."""

    same_node_gbps: float = Field(default=400.0, gt=0)
    same_zone_gbps: float = Field(default=100.0, gt=0)
    cross_zone_gbps: float = Field(default=25.0, gt=0)
    setup_s: float = Field(default=0.002, ge=0, description="fixed cost of one transfer")


class PDConfig(_Strict):
    """Prefill/decode disaggregation: pair scoring, handoff and failure policy."""

    kv_bytes_per_token: int = Field(default=131072, gt=0, description="KV bytes per token (Llama-3-8B bf16: 32 layers x 2 x 8 heads x 128 x 2 B)")
    links: LinkConfig = Field(default_factory=LinkConfig)
    selective_threshold_tokens: int = Field(default=512, ge=0, description="run on the decode instance alone when fewer tokens than this are uncached there")
    tbt_target_s: float = Field(default=0.1, gt=0, description="decode instances whose estimated time between tokens would exceed this are skipped")
    decode_step_base_s: float = Field(default=0.008, ge=0)
    decode_step_per_request_s: float = Field(default=0.0002, ge=0)
    decode_step_per_kv_token_s: float = Field(default=1.0e-8, ge=0)
    max_pair_candidates: int = Field(default=8, ge=1, description="prefill and decode instances (each) whose pairs are scored")
    prefill_retries: int = Field(default=1, ge=0, le=5, description="other prefill instances tried when one fails before answering")
    fallback_local_prefill: bool = Field(default=True, description="after the retries, prefill on the decode instance (counted, logged)")
    vllm_min_tokens: Literal["set", "pop"] = Field(default="set", description="prefill leg: set min_tokens=1 (vllm-router) or drop it (vLLM's toy proxy)")
    ttft_slo_s: float | None = Field(default=None, gt=0, description="answer 429 when the best predicted TTFT exceeds this")


class CalibrationConfig(_Strict):
    enabled: bool = True
    alpha: float = Field(default=0.2, gt=0, le=1, description="EWMA weight of each new observation")
    min_factor: float = Field(default=0.2, gt=0)
    max_factor: float = Field(default=5.0, gt=1)
    min_estimate_s: float = Field(default=0.05, ge=0, description="only estimates at least this long are compared: "
                                  "shorter ones are dominated by fixed costs the rate model does not describe")


class ProxyConfig(_Strict):
    connect_timeout_s: float = Field(default=2.0, gt=0)
    request_timeout_s: float = Field(default=1800.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    retries: int = Field(default=2, ge=0, le=10, description="attempts on another instance before the first byte")


class HealthConfig(_Strict):
    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)
    failures_to_unhealthy: int = Field(default=2, ge=1)
    successes_to_healthy: int = Field(default=1, ge=1)
    retry_after_s: int = Field(default=2, ge=1, description="Retry-After sent with 503 when nothing is healthy")


class ServerConfig(_Strict):
    admin_token: str | None = Field(default=None, description="bearer token for /debug and admin routes; unset = admin routes disabled")


class RouterConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PD_ROUTER_", env_nested_delimiter="__", extra="forbid")

    instances: list[InstanceConfig] = Field(default_factory=list)
    state: StateConfig = Field(default_factory=StateConfig)
    hashing: HashingConfig = Field(default_factory=HashingConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    pd: PDConfig = Field(default_factory=PDConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    kv_events: KVEventsConfig = Field(default_factory=KVEventsConfig)

    @model_validator(mode="after")
    def _unique_instances(self) -> "RouterConfig":
        seen: set[str] = set()
        for inst in self.instances:
            if inst.id in seen:
                raise ValueError(f"duplicate instance {inst.id!r}")
            seen.add(inst.id)
        if self.kv_events.enabled and self.hashing.mode != "tokens":
            raise ValueError("kv_events.enabled needs hashing.mode: tokens (request keys must be chained over "
                             "the engines' token blocks to meet the keys of their events)")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first so it overrides the YAML passed in as init kwargs.
        return (env_settings, init_settings)

    def residency_cap(self, inst: InstanceConfig) -> int:
        """Residency entries kept for ``inst``: its cache capacity expressed in block keys."""
        if self.state.max_keys_per_instance is not None:
            return self.state.max_keys_per_instance
        return max(1, inst.cache_tokens // self.hashing.block_tokens)


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the field and the problem."""


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(root)"
        lines.append(f"  {where}: {item['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RouterConfig:
    """Read ``path`` (YAML), apply environment overrides, validate; raise ConfigError on any problem."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = raw or {}
    if overrides:
        data = {**data, **overrides}
    try:
        return RouterConfig(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc
