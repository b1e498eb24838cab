"""What the router reads from the engines themselves: load (``/metrics``) and facts
(``/v1/models``, cache geometry). A section of its own so it can grow without touching
the rest of the configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineCalibrationConfig(BaseModel):
    """Prefill rates measured from the engines' own /metrics (router/engines/prefill_rate.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="fold each engine's own measured prefill rate into the calibration "
                          "(it also sees traffic that bypasses this router and instances the router stopped sending to)")
    weight: float = Field(default=0.5, gt=0, le=1, description="weight of one engine-measured prefill that this router did not "
                          "measure itself, relative to one first-byte measurement (the router's own requests in an engine window "
                          "are not counted again: they were measured at the first byte already)")
    min_requests: int = Field(default=2, ge=1, description="prefills an engine window must hold before it is measured")
    min_prefill_s: float = Field(default=0.01, gt=0, description="engine prefill seconds a window must hold before it is measured")
    min_window_s: float = Field(default=2.0, gt=0, description="a window spans at least this many seconds, so the requests "
                                "finishing in it (whose prefills began earlier) are a fair sample of its prefill time")
    max_overlap: float = Field(default=2.0, ge=1, description="a window whose prefills overlapped more than this on average "
                               "(summed prefill seconds / wall seconds) is dropped: a busy engine's histograms measure its "
                               "queue more than its rate")
    max_window_s: float = Field(default=60.0, gt=0, description="a window that has not filled for this long is dropped, "
                                "so a measurement never mixes old and new hardware behaviour")
    min_tokens_per_s: float = Field(default=10.0, gt=0, description="measured rates below this are refused as implausible")
    max_tokens_per_s: float = Field(default=1.0e8, gt=0, description="measured rates above this are refused as implausible")

    @model_validator(mode="after")
    def _bounds(self) -> "EngineCalibrationConfig":
        if self.min_tokens_per_s >= self.max_tokens_per_s:
            raise ValueError("min_tokens_per_s must be below max_tokens_per_s")
        if self.min_window_s >= self.max_window_s:
            raise ValueError("min_window_s must be below max_window_s")
        return self


class DecodeStepConfig(BaseModel):
    """Each engine's decode step measured from its own inter-token latency (router/engines/decode_step.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="price the wait for KV room on each engine with its own measured "
                          "inter-token latency instead of policy.ttft.decode_step_s (+ decode_interference_s per request); "
                          "on PD decode instances, scale the pd.decode_step_* model to it")
    min_tokens: int = Field(default=32, ge=1, description="generated tokens an engine window must hold before it is measured")
    min_window_s: float = Field(default=2.0, gt=0, description="a window spans at least this many seconds")
    max_window_s: float = Field(default=60.0, gt=0, description="a window that has not filled for this long is dropped")
    alpha: float = Field(default=0.5, gt=0, le=1, description="weight of a new window in the belief (1: the last window alone)")
    min_step_s: float = Field(default=1.0e-4, gt=0, description="measured steps below this are refused as implausible")
    max_step_s: float = Field(default=10.0, gt=0, description="measured steps above this are refused as implausible")

    @model_validator(mode="after")
    def _bounds(self) -> "DecodeStepConfig":
        if self.min_step_s >= self.max_step_s:
            raise ValueError("min_step_s must be below max_step_s")
        if self.min_window_s >= self.max_window_s:
            raise ValueError("min_window_s must be below max_window_s")
        return self


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

    learn_token_ratio: bool = Field(
        default=True,
        description="character keys (hashing.mode chars): learn how many of a model's tokens one estimated token is "
        "from the prompt_tokens its answers report (answers without usage: from the engines' own counts of the prompts "
        "they finished), and express each engine's cache in the router's estimated tokens "
        "with it (off: hashing.chars_per_token is taken as exact)",
    )
    calibration: EngineCalibrationConfig = Field(
        default_factory=EngineCalibrationConfig,
        description="prefill rates measured from the engines' own metrics, folded into the online calibration",
    )
    decode_step: DecodeStepConfig = Field(
        default_factory=DecodeStepConfig,
        description="each engine's decode step measured from its own inter-token latency histogram",
    )

    @model_validator(mode="after")
    def _stale(self) -> "EnginesConfig":
        if self.stale_after_s is None:
            self.stale_after_s = 3 * self.metrics_interval_s
        return self
