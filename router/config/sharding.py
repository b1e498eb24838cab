"""state.sharding: how the Redis store spreads its keys over hash slots (Redis Cluster).

The layout is the same for standalone Redis and a Cluster (router/state/redis_layout.py):
residency in shards by the prompt's first block, load and bookings in shards by instance.
Only ``cluster`` changes how the store talks to Redis (one script call per slot,
pipelined, instead of one call for everything). Every replica and worker sharing one
Redis must use the same shard counts: they name the keys.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ShardingConfig(BaseModel):
    """state.sharding: Redis key layout over hash slots."""

    model_config = ConfigDict(extra="forbid")

    cluster: bool = Field(default=False, description="redis_url names a node of a Redis Cluster: use the Cluster "
                          "protocol (one script call per hash slot, pipelined, so a decision is still one round trip)")
    residency_shards: int = Field(default=16, ge=1, le=4096, description="residency hash tags: a prompt's blocks live in "
                                  "the shard of its first block, so one decision reads one of them")
    instance_shards: int = Field(default=4, ge=1, le=1024, description="hash tags for booked load, bookings and each "
                                 "instance's LRU, by instance name: a decision reads at most this many")
