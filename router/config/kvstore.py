"""kv_store: a shared KV store behind the engines (Mooncake Store, LMCache remote backends).

Why a section of its own: with a store, KV computed on any instance can be loaded by any
other instead of computed again, so the router keeps a belief of what the store holds (a
tier of residency with its own capacity and LRU) and prices a load from it against a
recompute. These fields describe the store the engines share; the router moves no KV itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from router.config.standby import StandbyConfig


class KVStoreConfig(BaseModel):
    """kv_store: the shared store the engines write to and load from."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="the engines share a KV store: price loading a prefix from it")
    bandwidth_gbps: float = Field(default=100.0, gt=0, description="the store's read bandwidth, Gbit/s, shared by "
                                  "concurrent loads")
    capacity_tokens: int = Field(default=10_000_000, ge=1, description="tokens of KV the store holds before it evicts "
                                 "(least recently used first)")
    kv_dtype: Literal["auto", "fp8"] = Field(default="auto", description="dtype of the stored KV: fp8 halves the bytes "
                                             "per token of pd.kv_bytes_per_token (an instance's own kv_bytes_per_token wins)")
    bytes_per_token: int | None = Field(default=None, gt=0, description="KV bytes per stored token; None = from "
                                        "pd.kv_bytes_per_token and kv_dtype")
    setup_s: float = Field(default=0.0005, ge=0, description="fixed cost of one load (lookup, connection), seconds")
    max_entries: int = Field(default=1_000_000, ge=1, description="cap on the router's belief of the store, in block "
                             "keys (memory bound; the belief also stops at capacity_tokens / block tokens)")
    ttl_s: float = Field(default=3600.0, gt=0, description="a block the router believes stored is forgotten after "
                         "this long untouched")
    standby: StandbyConfig = Field(default_factory=StandbyConfig, description="a warm backup decode instance for long "
                                   "streams, so a migration loads only the generated tail")

    def token_bytes(self, pd_bytes_per_token: int) -> int:
        if self.bytes_per_token is not None:
            return self.bytes_per_token
        return pd_bytes_per_token // 2 if self.kv_dtype == "fp8" else pd_bytes_per_token
