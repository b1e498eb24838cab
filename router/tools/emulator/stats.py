"""Exact engine-side counters for tests and the demo (``/emulator/stats``).

Why besides Prometheus: tests and the demo need exact, per-request numbers
(how many prompt tokens hit the cache on *this* engine, how many arrived via
PD transfer) without parsing histograms.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass


@dataclass
class PdCounters:
    """PD handoff bookkeeping, per engine."""

    kv_holds: int = 0
    """Prefill side: requests whose KV was pinned for a decode peer."""
    kv_pulls_served: int = 0
    """Prefill side: pins released by a peer's pull."""
    kv_holds_expired: int = 0
    """Prefill side: pins released because nobody pulled in time."""
    kv_pulls: int = 0
    """Decode side: successful KV receipts (vLLM pull or SGLang bootstrap)."""
    kv_pull_failures: int = 0
    fallback_recomputes: int = 0
    bootstrap_paired: int = 0
    bootstrap_timeouts: int = 0


@dataclass
class HttpCounters:
    generation_requests: int = 0
    client_errors: int = 0
    server_errors: int = 0
    injected_errors: int = 0
    injected_stalls: int = 0
    injected_drops: int = 0


@dataclass(frozen=True, slots=True)
class FinishedRecord:
    request_id: str
    client_request_id: str | None
    prompt_tokens: int
    cached_tokens: int
    transferred_tokens: int
    output_tokens: int
    queue_model_s: float | None
    ttft_model_s: float | None
    e2e_model_s: float | None
    finish_reason: str | None


class StatsRecorder:
    """Counters plus a bounded history of finished requests."""

    def __init__(self, history: int) -> None:
        self.pd = PdCounters()
        self.http = HttpCounters()
        self.recent: deque[FinishedRecord] = deque(maxlen=max(1, history))
        self.ttft_model_sum = 0.0
        self.ttft_model_count = 0

    def record(self, record: FinishedRecord) -> None:
        self.recent.append(record)
        if record.ttft_model_s is not None:
            self.ttft_model_sum += record.ttft_model_s
            self.ttft_model_count += 1

    def to_dict(self, recent: int) -> dict[str, object]:
        """Counters plus the ``recent`` newest finished requests (oldest first)."""
        records = list(self.recent)[-recent:] if recent > 0 else []
        return {
            "pd": asdict(self.pd),
            "http": asdict(self.http),
            "ttft_model_mean_s": (self.ttft_model_sum / self.ttft_model_count
                                  if self.ttft_model_count else None),
            "recent": [asdict(r) for r in records],
        }
