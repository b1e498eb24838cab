"""kv_store.standby: a warm backup decode instance for long streams (session migration).

Why: when a decode instance dies mid-stream, the session goes on elsewhere and loads the KV of
prompt + generated tokens from the shared store. For a long prompt that load is what the client
waits for (32K tokens x 128 KiB at 200 Gbit/s is ~170 ms against a ~7 ms cached TTFT), and no
scheduling removes it at failure time. A standby moves it earlier: once a long stream's first
token arrived, the session's backup decode instance loads the prompt's KV from the store in the
background (an ordinary max_tokens=1 request with the same prompt), so a failure leaves only the
generated tail to load. In SGLang PD pools the warm goes through a pair (the session's prefill
hands the prompt's KV to the backup decode worker), which pays only if the decode workers keep
transferred KV in a prefix cache (SGLang --disaggregation-decode-enable-radix-cache).

It costs a second copy of the prompt's KV in a backup's prefix cache and the engine work of the
warm (the load, one token computed) for every long stream, failed or not; so it is off by
default, and when on it only covers prompts whose load from the store would take clearly longer
than one decode step (the 4096-token default: ~21 ms of fp16 8B KV at 200 Gbit/s, ~3x a cached
TTFT; below ~2K tokens a migration already meets 2x a cached TTFT without it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StandbyConfig(BaseModel):
    """kv_store.standby: warm a backup decode instance with a long stream's prompt."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="warm each long stream's backup decode instance from the store "
                          "once its first token arrived (needs kv_store.enabled)")
    min_prompt_tokens: int = Field(default=4096, ge=1, description="only streams whose prompt has at least this many "
                                   "tokens get a standby: shorter ones load fast enough at failure time")
    max_in_flight: int = Field(default=8, ge=1, description="warms in flight at most, over the router; a stream that "
                               "finds them all busy gets no standby (never queued)")
    timeout_s: float = Field(default=30.0, gt=0, description="a warm that has not answered by then is cancelled")
