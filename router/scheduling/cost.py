"""TTFT estimate for a colocated instance: queueing + prefill of the uncached tokens.

    ttft = queue + prefill + interference + admission    (route cost: + delays, below)
    queue        = (booked prefill ahead - what its head has run) / rate
                   + others' work sharing the step of the last chunk (chunked prefill)
    prefill      = overhead + uncached / rate + attention * (prompt^2 - cached^2) / 2
    interference = per-request delay * requests in flight (decode steps share the GPU)
    admission    = wait for KV room: until enough running requests end to free the deficit

The attention term is the quadratic part of transformer prefill FLOPs: computing tokens
c..n attends over the whole context, sum_{t=c}^{n} t ~ (n^2 - c^2) / 2. Rates are per
instance when declared (or calibrated), else the configured default. Cached tokens are
the expected ones: the matched run times the confidence that the engine still holds it.
With a shared KV store, the prefill is the cheaper of computing what the instance lacks and
loading what the store holds while computing the rest (store_cost.py); ``delays`` is what the
prefill costs the loads landing on the instance while it computes (store_cost.landing_delay_s),
priced with the route but not part of this request's TTFT.

Why admission: an engine admits a request only when its KV cache has room for it, so on
an instance whose booked KV (the union of the blocks its requests in flight hold, plus
each one's tail and output: state/pins.py) is full, the request waits for running
requests to finish however short its prefill queue is. Without this term a pool of small
caches looks idle to the estimate while least-loaded routing (which spreads KV by
spreading requests) wins. Each running request holds ``kv / requests`` tokens; the wait is
for as many whole requests to end as free the deficit (``admission_wait``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.config.model import TTFTWeights
from router.core.frozen import quick_init
from router.scheduling.framework import RouteRequest, View
from router.scheduling.store_cost import landing_delay_s, load_seconds, stored_tokens


@quick_init
@dataclass(frozen=True)
class TTFTTerms:
    queue_s: float
    prefill_s: float
    interference_s: float
    uncached_tokens: int
    admission_s: float = 0.0
    delays_s: float = 0.0  # others' first tokens this prefill delays (not in total_s: not this request's)

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.interference_s + self.admission_s

    @property
    def cost_s(self) -> float:
        """What the route costs: this request's TTFT and the delays it causes."""
        return self.total_s + self.delays_s


def prefill_seconds(uncached: float, prompt: int, rate: float, weights: TTFTWeights) -> float:
    cached = prompt - uncached
    attention = weights.attention_s_per_token2 * (prompt * prompt - cached * cached) / 2
    return weights.request_overhead_s + uncached / rate + attention


def with_store(req: RouteRequest, view: View, cached: float, rate: float, weights: TTFTWeights) -> tuple[float, float]:
    """(prefill seconds, tokens present before computing): from the instance's cache alone,
    or loading what the store holds beyond it while computing the rest, whichever is faster."""
    prompt = req.prompt_tokens
    compute = prefill_seconds(prompt - cached, prompt, rate, weights)
    stored = stored_tokens(req)
    if stored <= cached:
        return compute, cached
    loaded = max(load_seconds(req, view, stored - cached), prefill_seconds(prompt - stored, prompt, rate, weights))
    return (loaded, stored) if loaded < compute else (compute, cached)


def prefill_work(req: RouteRequest, view: View, weights: TTFTWeights) -> int:
    """The prefill this request queues on ``view``, in tokens at the instance's rate: its
    uncached tokens plus their attention cost. Booking work rather than raw tokens lets the
    requests queued behind a 100K-token prompt see how long it will really hold the GPU."""
    rate = view.candidate.prefill_tokens_per_s or weights.prefill_tokens_per_s
    cached = view.expected_cached_tokens(req)
    if req.store is not None:
        cached = with_store(req, view, cached, rate, weights)[1]
    attention = weights.attention_s_per_token2 * (req.prompt_tokens**2 - cached**2) / 2
    return round(req.prompt_tokens - cached + attention * rate)


def queued_seconds(view: View, rate: float) -> float:
    """The booked prefill ahead at the instance's rate, less, on a prefill-only instance,
    what the head of that queue has computed since it started (``Load.prefill_started_s``,
    at most its own work): a queue whose head is half done is shorter than its bookings say.

    Only there: a prefill-only engine runs its queue first come first served at its prefill
    rate, while a mixed one interleaves decode steps and chunks of several prompts, and the
    head's progress at the full (uncalibrated) rate overstates it — on the routing-quality
    replays the drain on mixed engines made a busy holder look idle (chat/2x/defaults 0.98x
    -> 1.82x the best peer's p90)."""
    load = view.load
    if view.candidate.role != "prefill":
        return load.prefill_tokens / rate
    done = min(load.prefill_started_s, load.prefill_head_tokens / rate)
    return max(0.0, load.prefill_tokens / rate - done)


def shared_step_tokens(ahead: float, uncached: float, chunk: int) -> float:
    """Tokens of others' work in the step that computes a queued request's last chunk.

    Behind a queue, an engine runs full steps of ``chunk`` tokens (chunked prefill), so the
    request's last tokens share a step with the work queued behind it, up to the rest of
    that step. In a steady FCFS queue the work left behind at one's start is on average what
    was ahead at one's arrival, so ``ahead`` stands for it. No queue, no shared step."""
    if chunk <= 0 or ahead <= 0:
        return 0.0
    through = ahead + uncached
    room = -through % chunk
    return room if room < ahead else ahead

def admission_wait(kv_tokens: int, requests: int, need: float, capacity: int, max_tokens: int,
                   weights: TTFTWeights, step_s: float | None = None) -> float:
    """Seconds until ``need`` KV tokens fit next to the ``kv_tokens`` booked by ``requests``
    running ones in a cache of ``capacity`` (0 when they fit now or nothing can free room).

    ``step_s``: the engine's own measured inter-token latency (``Candidate.decode_step_s``),
    which already holds its batch's interference; else the configured step plus
    ``decode_interference_s`` per running request.

    An engine frees KV a request at a time, not continuously: the deficit is room once
    m = ceil(deficit / (kv / requests)) of the k running requests have ended (at most all k).
    Their remaining lifetimes taken as uniform over an output's decode steps, the m-th of k
    ends after m / (k + 1) of them (the m-th order statistic's mean). Pricing the freeing as
    continuous said a deficit of a few tokens costs a few tokens' worth of steps, where the
    engine waits for a whole request to end."""
    deficit = kv_tokens + need - capacity
    if deficit <= 0 or kv_tokens <= 0:
        return 0.0
    k = requests if requests > 0 else 1
    m = min(k, math.ceil(deficit * k / kv_tokens))
    steps = max(1.0, float(max_tokens))
    step = step_s if step_s is not None else weights.decode_step_s + weights.decode_interference_s * requests
    return m / (k + 1) * steps * step


def colocated_ttft(req: RouteRequest, view: View, weights: TTFTWeights, slow: float = 1.0) -> TTFTTerms:
    """``slow``: the instance's steps take this many times their time (an SGLang prefill
    instance computing while its NIC streams KV): the queue drains slower too, so the head's
    progress is measured at the slowed rate, not slowed after it was subtracted."""
    rate = view.candidate.prefill_tokens_per_s or weights.prefill_tokens_per_s
    cached = view.expected_cached_tokens(req)
    if req.store is None:
        prefill_s = prefill_seconds(req.prompt_tokens - cached, req.prompt_tokens, rate, weights)
    else:
        prefill_s, cached = with_store(req, view, cached, rate, weights)
    prefill_s *= slow
    rate /= slow
    uncached = req.prompt_tokens - cached
    load = view.load
    queue = queued_seconds(view, rate)
    queue_s = queue + shared_step_tokens(queue * rate, uncached, weights.prefill_chunk_tokens) / rate
    delays = 0.0
    if req.landings:
        computing = prefill_seconds(uncached, req.prompt_tokens, rate, weights)
        delays = landing_delay_s(req, view, queue_s, computing, uncached, weights.prefill_chunk_tokens)
    return TTFTTerms(
        queue_s=queue_s,
        prefill_s=prefill_s,
        interference_s=weights.decode_interference_s * load.requests,
        uncached_tokens=round(uncached),
        admission_s=admission_wait(load.kv_tokens, load.requests, uncached + req.max_tokens,
                                   view.candidate.cache_tokens, req.max_tokens, weights, view.candidate.decode_step_s),
        delays_s=delays,
    )
