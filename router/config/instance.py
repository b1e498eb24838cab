"""Config of one engine instance: where it is, what it serves, and the KV layout a P/D pair must share.

Its own module so that the instance's model (the unit discovery, the admin API and the engine
facts all produce) can be read and changed without the whole router configuration.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["prefill", "decode", "mixed"]
Flavor = Literal["vllm", "sglang"]


# (model, kv_dtype, block_size, flavor): what a prefill and a decode instance must share.
Compat = tuple[str | None, str, int, str]



class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KVShape(_Strict):
    """Model shape from which KV bytes per token follow: layers x 2 (K, V) x KV heads x head dim x bytes."""

    layers: int = Field(gt=0, description="transformer layers")
    kv_heads: int = Field(gt=0, description="KV heads per layer (after GQA)")
    head_dim: int = Field(gt=0, description="dimension of one head")
    dtype_bytes: float = Field(default=2, gt=0, description="2 for bf16/fp16, 1 for fp8")

    @property
    def bytes_per_token(self) -> int:
        return int(self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes)


class InstanceConfig(_Strict):
    """One engine instance the router may send traffic to (and the only kind it ever contacts)."""

    url: str = Field(description="base URL of the engine, e.g. http://10.0.0.5:8000")
    role: Role = Field(default="mixed", description="prefill, decode, or mixed (serves whole requests)")
    name: str | None = Field(default=None, description="id in metrics and logs (default: the URL)")
    flavor: Flavor = Field(default="vllm", description="engine protocol: vllm or sglang")
    labels: dict[str, str] = Field(default_factory=dict, description="topology labels: node and zone set KV transfer bandwidth")
    cache_tokens: int = Field(default=500_000, gt=0, description="KV cache capacity in tokens")
    prefill_tokens_per_s: float | None = Field(default=None, gt=0, description="prefill rate; None = policy.ttft.prefill_tokens_per_s")
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535, description="SGLang bootstrap port of a prefill instance")
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
    def compat(self) -> Compat:
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
