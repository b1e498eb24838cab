"""How the router prices and books the KV handoff between prefill and decode instances.

Kept apart from the PD pairing knobs because each field is one axis of the handoff:
overlap (what of the transfer hides behind the prefill), isolation (booking bytes per
link so transfers do not saturate a NIC the decode steps share), and reuse through a
shared KV store (loading a prefix instead of recomputing it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StoreTierConfig(BaseModel):
    """A shared KV store every instance can load prefix blocks from (Mooncake Store, LMCache remote)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="price loading a prefix from the store against recomputing it")
    gbps: float = Field(default=100.0, gt=0, description="store -> instance bandwidth, Gbit/s")
    setup_s: float = Field(default=0.001, ge=0, description="fixed cost of one store load")


class HandoffConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    overlap_chunk_tokens: int = Field(default=8192, ge=1, description="SGLang streams KV per prefill chunk of this "
                                      "many tokens, so only the last chunk's transfer adds to TTFT (vLLM pulls after the prefill)")
    link_aware: bool = Field(default=False, description="book KV bytes in flight per instance NIC and price waiting for them")
    nic_gbps: float | None = Field(default=None, gt=0, description="each instance's NIC, Gbit/s; None = the topology link")
    max_link_backlog_s: float = Field(default=0.05, ge=0, description="with link_aware: pairs whose NIC (either end) "
                                      "already has more booked bytes than this many seconds of its bandwidth are "
                                      "avoided while another pair is under it (bandwidth reservation)")
    store: StoreTierConfig = Field(default_factory=StoreTierConfig, description="shared KV store tier")
