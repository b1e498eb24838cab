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
from router.config.handoff import HandoffConfig
from router.config.kvstore import KVStoreConfig
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from router.config.discovery import DiscoveryConfig, ReloadConfig
from router.config.engines import EnginesConfig
from router.config.instance import Compat as Compat, Flavor as Flavor, InstanceConfig as InstanceConfig, KVShape as KVShape, Role as Role  # re-exported

from router.config.precise import HashingMode, KVEventsConfig, TokensConfig
from router.config.sharding import ShardingConfig

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StateConfig(_Strict):
    backend: Literal["memory", "redis"] = Field(default="memory", description="memory (one process) or redis (shared by replicas and workers)")
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Redis URL (a password in it is redacted on read)")
    key_prefix: str = Field(default="pdr", min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$", description="namespace of the router's Redis keys")
    lease_s: float = Field(default=15.0, gt=0, le=30, description="booked load vanishes this long after its owner stops refreshing it")
    residency_ttl_s: float = Field(default=600.0, gt=0, description="a residency entry not touched for this long is forgotten")
    max_keys_per_instance: int | None = Field(default=None, gt=0, description="cap on residency entries per instance; default cache_tokens / block tokens")
    redis_timeout_s: float = Field(default=0.5, gt=0, description="timeout of one Redis call")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        """Checked here, not when the first connection fails: a typo must stop the start (exit 2)."""
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        try:
            parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
        except ValueError:
            raise ValueError("has a port that is not a number") from None
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("names no host")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise ValueError("has a database that is not a number (redis://host:port/<db>)")
        return value
    breaker_failures: int = Field(default=3, ge=1, description="consecutive failed Redis calls that open the breaker "
                                  "(decisions on the local view, no waiting on Redis)")
    breaker_probe_s: float = Field(default=0.5, gt=0, description="while the breaker is open, one probe call this often")
    sharding: ShardingConfig = Field(default_factory=ShardingConfig, description="Redis key layout over hash slots (Cluster)")


class HashingConfig(_Strict):
    mode: HashingMode = Field(default="chars", description="chars: keys over characters of the prompt; tokens: "
                              "over the engine's token blocks (needed for keys that meet the engines' KV events)")
    block_chars: int = Field(default=256, ge=8, description="characters per block key")
    chars_per_token: float = Field(default=4.0, gt=0, description="estimate used to turn characters into tokens")
    max_blocks: int = Field(default=4096, ge=1, description="longest prefix (in blocks) the router tracks")
    seed: int = Field(default=0, ge=0, lt=2**64, description="seed of the block hash (all replicas must agree)")
    tokens: TokensConfig = Field(default_factory=TokensConfig, description="token mode: where token ids come from and the engine block size")

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
    prefill_chunk_tokens: int = Field(default=0, ge=0, description="engines' token budget per step (vLLM "
                                      "max_num_batched_tokens, SGLang chunked_prefill_size): a queued request's last chunk "
                                      "shares its step with the work behind it, and with kv_store a prefill is priced "
                                      "the delay it causes to loads landing where it computes; 0 = not modelled")
    decode_step_s: float = Field(default=0.008, ge=0, description="time of one decode step: how fast running requests free KV room for a queued one "
                                 "(until the engine's own is measured: engines.decode_step)")
    tie_tolerance: float = Field(default=0.05, ge=0, lt=1, description="estimates within this fraction of the best are a tie, broken randomly")
    bounded_load_factor: float = Field(default=2.0, gt=1, description="an instance above this multiple of the mean in-flight load is skipped")
    bounded_load_slack: int = Field(default=8, ge=0, description="in-flight requests always allowed above the mean before the bound applies")
    bounded_load_keep_tokens: int = Field(default=4096, ge=0, description="requests expected to find this many prompt tokens cached on an "
                                          "instance are never pushed off it by the bound (leaving would recompute them); 0 = always bound")


class CacheAwareWeights(_Strict):
    """sglang-router style: longest cached prefix unless load is imbalanced."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1, description="minimum cached share of the prompt for the prefix rule")
    balance_abs_threshold: int = Field(default=64, ge=0, description="loads are imbalanced when max - min exceeds this ...")
    balance_rel_threshold: float = Field(default=1.5, ge=1, description="... and max exceeds this multiple of min")


class PluginRef(_Strict):
    """One plugin of a pipeline: its registered name and its parameters."""

    name: str = Field(min_length=1, description="the registered plugin name (router/scheduling/registry.py)")
    params: dict[str, Any] = Field(default_factory=dict, description="checked by the plugin's own parameter model")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value  # `prefix` for `{name: prefix}`


class ScorerRef(PluginRef):
    weight: float = Field(default=1.0, ge=0, description="the pipeline total is the weighted sum of the scores")


class PipelineConfig(_Strict):
    """Routes -> filters -> weighted scorers -> picker. Plugin names and parameters are
    checked against the plugin registry (router/scheduling/registry.py) when the policy
    is built, before the router serves."""

    routes: PluginRef | None = Field(default=None, description="route generator; default instances, or pd_pairs with a prefill pool")
    filters: list[PluginRef] = Field(default_factory=list, description="applied in order; a filter that would drop every route keeps them all")
    scorers: list[ScorerRef] = Field(default_factory=list, description="weighted scores in [0, 1], higher is better, summed per route")
    picker: PluginRef = Field(default_factory=lambda: PluginRef(name="max_score"), description="turns the totals into one route and its near-ties")


class ProfilesConfig(_Strict):
    """Independent P and D choice, as llm-d does PD: the prefill profile chooses among
    prefill instances, then the decode profile among the decode instances compatible
    with that choice (in a cluster without a prefill pool, the decode profile alone)."""

    prefill: PipelineConfig = Field(description="chooses the prefill instance")
    decode: PipelineConfig = Field(description="chooses the decode instance among those compatible with the prefill choice")


class PolicyConfig(_Strict):
    name: str = Field(default="ttft", pattern=r"^[A-Za-z0-9_.-]+$",
                      description="a preset; with pipeline or profiles, the name the policy is reported under")
    pipeline: PipelineConfig | None = Field(default=None, description="the policy as routes -> filters -> weighted scorers -> picker")
    profiles: ProfilesConfig | None = Field(default=None, description="independent prefill and decode profiles instead of one pipeline")
    seed: int | None = Field(default=None, description="RNG seed for tie breaks (None = random)")
    default_max_tokens: int = Field(default=256, ge=1, description="output length assumed when a request sets none")
    candidates: int = Field(default=16, ge=0, description=(
        "colocated pools larger than twice this: score only the holders of the prompt's first block plus this many "
        "least-loaded instances (router/scheduling/prune.py); 0 = score every instance"))
    ttft: TTFTWeights = Field(default_factory=TTFTWeights, description="weights of the ttft policy")
    cache_aware: CacheAwareWeights = Field(default_factory=CacheAwareWeights, description="thresholds of the cache_aware baseline")

    @model_validator(mode="after")
    def _one_declaration(self) -> "PolicyConfig":
        if self.pipeline is not None and self.profiles is not None:
            raise ValueError("set policy.pipeline or policy.profiles, not both")
        if (self.pipeline is not None or self.profiles is not None) and "name" not in self.model_fields_set:
            self.name = "custom"
        return self

    @property
    def preset(self) -> str | None:
        """The preset this config names, None when it declares its own pipeline(s)."""
        return self.name if self.pipeline is None and self.profiles is None else None


class LinkConfig(_Strict):
    """Bandwidth of a KV transfer by topology (instance labels ``node`` and ``zone``)."""

    same_node_gbps: float = Field(default=400.0, gt=0, description="GB/s between instances on one node")
    same_zone_gbps: float = Field(default=100.0, gt=0, description="GB/s between nodes of one zone")
    cross_zone_gbps: float = Field(default=25.0, gt=0, description="GB/s across zones (or topology unknown)")
    setup_s: float = Field(default=0.002, ge=0, description="fixed cost of one transfer")


class PDConfig(_Strict):
    """Prefill/decode disaggregation: pair scoring, handoff and failure policy."""

    kv_bytes_per_token: int = Field(default=131072, gt=0, description="KV bytes per token (Llama-3-8B bf16: 32 layers x 2 x 8 heads x 128 x 2 B)")
    links: LinkConfig = Field(default_factory=LinkConfig, description="KV transfer bandwidth by topology")
    selective_threshold_tokens: int = Field(default=512, ge=0, description="run on the decode instance alone when fewer tokens than this are uncached there")
    tbt_target_s: float = Field(default=0.1, gt=0, description="decode instances whose estimated time between tokens would exceed this are skipped")
    decode_step_base_s: float = Field(default=0.008, ge=0, description="fixed time of one decode step")
    decode_step_per_request_s: float = Field(default=0.0002, ge=0, description="decode step time added per running request")
    decode_step_per_kv_token_s: float = Field(default=1.0e-8, ge=0, description="decode step time added per KV token in flight")
    max_pair_candidates: int = Field(default=8, ge=1, description="prefill and decode instances (each) whose pairs are scored")
    prefill_retries: int = Field(default=1, ge=0, le=5, description="other prefill instances tried when one fails before answering")
    fallback_local_prefill: bool = Field(default=True, description="after the retries, prefill on the decode instance (counted, logged)")
    vllm_min_tokens: Literal["set", "pop"] = Field(default="set", description="prefill leg: set min_tokens=1 (vllm-router) or drop it (vLLM's toy proxy)")
    ttft_slo_s: float | None = Field(default=None, gt=0, description="answer 429 when the best predicted TTFT exceeds this")
    handoff: HandoffConfig = Field(default_factory=HandoffConfig, description="KV handoff: overlap, link booking, shared store")


class CalibrationConfig(_Strict):
    enabled: bool = Field(default=True, description="scale prefill rates by measured / estimated TTFT")
    alpha: float = Field(default=0.2, gt=0, le=1, description="EWMA weight of each new observation")
    min_factor: float = Field(default=0.2, gt=0, description="lower bound of an instance's slowdown factor")
    max_factor: float = Field(default=5.0, gt=1, description="upper bound of an instance's slowdown factor")
    min_estimate_s: float = Field(default=0.05, ge=0, description="only estimates at least this long are compared: "
                                  "shorter ones are dominated by fixed costs the rate model does not describe")
    max_queued_share: float = Field(default=0.1, ge=0, description="a first byte calibrates only when the prefill booked "
                                    "ahead of it on its instance was at most this share of its own: behind a queue the error "
                                    "is mostly the queue model's, not the rate's")
    warmup: int = Field(default=8, ge=0, description="an instance's first N observations are averaged (weight 1/n) before "
                        "the EWMA takes over, so a wrong default rate is corrected by the first requests")
    stale_after_s: float = Field(default=30.0, gt=0, description="a factor not re-measured for this long relaxes toward 1.0, "
                                 "so a belief that keeps traffic away from an instance cannot starve it for good")
    relax_half_life_s: float = Field(default=30.0, gt=0, description="half-life of that relaxation once a factor is stale")
    scope: Literal["pool", "instance"] = Field(default="pool", description="pool: one factor per group of instances declaring the same model "
                                               "and rate, measured by all of them; instance: one factor per instance")


class ProxyConfig(_Strict):
    connect_timeout_s: float = Field(default=2.0, gt=0, description="timeout of a connection to an engine")
    request_timeout_s: float = Field(default=1800.0, gt=0, description="longest time one proxied request may take")
    max_connections: int = Field(default=1000, ge=1, description="connections to engines, in all (fixed at start)")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="largest request body accepted (413 above)")
    retries: int = Field(default=2, ge=0, le=10, description="attempts on another instance before the first byte")
    first_byte_timeout_s: float = Field(default=60.0, gt=0, description="per try: a stream's headers and first chunk must come "
                                        "within this, or the request is retried elsewhere (a JSON answer's first byte is its last: "
                                        "request_timeout_s bounds it)")
    idle_timeout_s: float = Field(default=60.0, gt=0, description="longest gap between two chunks of a stream")
    continuation_attempts: int = Field(default=2, ge=0, le=10, description="a stream broken after tokens were sent goes on "
                                       "elsewhere (prompt + text so far) up to this many times; 0 = off: an error event ends it")
    max_concurrent: int | None = Field(default=None, ge=1, description="inference requests in flight at once (None: no limit); "
                                       "more wait in a bounded queue, then get 429 + Retry-After")
    max_queued: int = Field(default=100, ge=0, description="requests waiting for a slot beyond max_concurrent")
    queue_timeout_s: float = Field(default=5.0, gt=0, description="longest wait for a slot before 429")


class HealthConfig(_Strict):
    interval_s: float = Field(default=5.0, gt=0, description="seconds between active health checks (GET /health)")
    timeout_s: float = Field(default=2.0, gt=0, description="timeout of one health check")
    failures_to_unhealthy: int = Field(default=2, ge=1, description="consecutive failures that take an instance out")
    successes_to_healthy: int = Field(default=1, ge=1, description="consecutive successes that bring it back")
    retry_after_s: int = Field(default=2, ge=1, description="Retry-After sent with 503 when nothing is healthy")
    outlier_failures: int = Field(default=3, ge=1, description="consecutive failures seen while proxying (resets, timeouts, "
                                  "mid-stream deaths, 5xx but a busy 503) that eject an instance")
    outlier_base_ejection_s: float = Field(default=5.0, gt=0, description="first ejection time; each ejection in a row adds as much")
    outlier_max_ejection_s: float = Field(default=300.0, gt=0, description="longest ejection")
    outlier_max_ejected_percent: float = Field(default=50.0, ge=0, le=100, description="never eject beyond this share of the instances")


class ApiKey(_Strict):
    """One client key of the inference routes; ``name`` labels its requests in the metrics."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$", description="label in metrics and logs (never the key)")
    key: str = Field(min_length=16, description="the bearer token clients send")


class ServerConfig(_Strict):
    """The router's own server; host and port are command-line flags of ``pd-router serve``."""

    admin_token: str | None = Field(default=None, description="bearer token for /debug and admin routes; unset = admin routes disabled")
    api_keys: list[ApiKey] = Field(default_factory=list, description="keys of the inference routes (/v1/*); none = open")
    api_keys_file: str | None = Field(default=None, description="a file of `name key` lines, read at start, added to api_keys")
    max_connections: int = Field(default=4096, ge=1, description="client connections held at once; more are closed at once "
                                 "(logged). Lowered at start to stay below the file limit")
    header_timeout_s: float = Field(default=10.0, gt=0, description="a request head must be complete this long after its first "
                                    "byte (or after the connection opened); else the connection is closed")
    keepalive_timeout_s: int = Field(default=5, ge=1, description="seconds after which an idle kept-alive connection is closed")
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, description="largest request head (URL and headers); 431 above")


class RouterConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PD_ROUTER_", env_nested_delimiter="__", extra="forbid")

    instances: list[InstanceConfig] = Field(default_factory=list, description="static instances (may be empty: discovery or the admin API adds more)")
    state: StateConfig = Field(default_factory=StateConfig, description="where residency and booked load live")
    hashing: HashingConfig = Field(default_factory=HashingConfig, description="how prompts become block keys")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="the routing policy and its weights")
    proxy: ProxyConfig = Field(default_factory=ProxyConfig, description="how requests are relayed to engines")
    health: HealthConfig = Field(default_factory=HealthConfig, description="active health checks")
    pd: PDConfig = Field(default_factory=PDConfig, description="prefill/decode disaggregation")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig, description="online calibration of prefill rates")
    server: ServerConfig = Field(default_factory=ServerConfig, description="the router's own HTTP server")
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig, description="instances found at run time (Kubernetes, DNS)")
    reload: ReloadConfig = Field(default_factory=ReloadConfig, description="live reload of the config file")
    engines: EnginesConfig = Field(default_factory=EnginesConfig, description="what the router learns from the engines themselves (facts, load)")
    kv_events: KVEventsConfig = Field(default_factory=KVEventsConfig, description="precise residency from the engines' KV events")
    kv_store: KVStoreConfig = Field(default_factory=KVStoreConfig, description="a KV store the engines share: loads priced against recomputes")

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

    def residency_cap(self, inst: InstanceConfig, cache_tokens: int | None = None) -> int:
        """Residency entries kept for ``inst``: its cache capacity expressed in block keys.
        ``cache_tokens``: that capacity in the router's estimated tokens when they differ from
        the engine's (its candidate's: router/engines/token_ratio.py), else ``inst``'s own."""
        if self.state.max_keys_per_instance is not None:
            return self.state.max_keys_per_instance
        return max(1, (inst.cache_tokens if cache_tokens is None else cache_tokens) // self.hashing.block_tokens)


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
    except SettingsError as exc:  # a PD_ROUTER_* value that is not the JSON its field needs
        raise ConfigError(f"invalid configuration from the environment: {exc}") from exc
