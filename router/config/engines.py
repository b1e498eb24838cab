"""What the router reads from the engines themselves: load (``/metrics``) and facts
(``/v1/models``, cache geometry). A section of its own so it can grow without touching
the rest of the configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EnginesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    poll: bool = Field(default=True, description="poll the engines at all (off: config is all the router knows)")
    metrics_interval_s: float = Field(default=1.0, gt=0, description="how often each engine's /metrics is read")
    facts_interval_s: float = Field(default=30.0, gt=0, description="how often served models and cache facts are re-read")
    timeout_s: float = Field(default=2.0, gt=0, description="per request to an engine")
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=4096, description="a longer /metrics or facts answer is dropped")
    stale_after_s: float | None = Field(
        default=None, gt=0, description="external load older than this is ignored (default 3 x metrics_interval_s)"
    )
    text_bytes_per_token_max: float = Field(
        default=32.0, gt=0,
        description="a text prompt is refused as too long (400) only when even at this many UTF-8 bytes per token "
        "it exceeds max_model_len: a lower bound, so a prompt that fits is never refused",
    )

    @model_validator(mode="after")
    def _stale(self) -> "EnginesConfig":
        if self.stale_after_s is None:
            self.stale_after_s = 3 * self.metrics_interval_s
        return self
