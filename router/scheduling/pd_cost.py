"""Cost terms of a disaggregated request, Mooncake-Conductor style, in seconds.

    ttft(P, D) = queue(P) + prefill(P) + transfer(P -> D) + admission(D) + step(D)

queue and prefill are the colocated terms on P (cost.py), slower by the transfer
interference on an SGLang P (its NIC streams KV while it computes). The KV that D lacks
(prompt - cached on D) crosses the link between P and D: bytes / (link bandwidth shared
with what the transfers booked at either end still move when it starts). Overlap follows the protocol: vLLM
(NIXL) pulls after the prefill, so the whole transfer adds to TTFT; SGLang streams each
prefill chunk's KV while the next computes, so only what cannot move during the prefill
adds, and at least the last chunk's share. admission(D) is the wait for KV room
on D, step(D) its decode step time, which must also stay under the TBT target.
"""

from __future__ import annotations

from router.config.model import LinkConfig, PDConfig, TTFTWeights
from router.scheduling.cost import colocated_ttft
from router.scheduling.framework import RouteCost, RouteRequest, View

# A measured step scales the configured model at most this much either way: the engine's
# speed, not one odd window, should move the TBT filter and the wait for KV room.
MAX_STEP_SCALE = 20.0


def link_gbps(p: View, d: View, links: LinkConfig) -> float:
    a, b = p.candidate, d.candidate
    if a.node is not None and a.node == b.node:
        return links.same_node_gbps
    if a.zone is not None and a.zone == b.zone:
        return links.same_zone_gbps
    return links.cross_zone_gbps


def transfer_tokens(req: RouteRequest, d: View) -> int:
    """Tokens whose KV D must receive: those it does not already cache."""
    return req.prompt_tokens - d.cached_tokens(req)


def flavor(v: View) -> str:
    """The PD protocol of an instance (its compat tuple's last field); vLLM when unstated."""
    compat = v.candidate.compat
    return compat[3] if compat else "vllm"


def kv_bytes_per_token(v: View, pd: PDConfig) -> int:
    """The instance's stated KV bytes per token, else the PD default at its KV dtype: an
    fp8 cache (compat's kv_dtype ``fp8*``) holds and sends one byte per element, not two."""
    if v.candidate.kv_bytes_per_token:
        return v.candidate.kv_bytes_per_token
    compat = v.candidate.compat
    if compat and compat[1].startswith("fp8"):
        return pd.kv_bytes_per_token // 2
    return pd.kv_bytes_per_token


def transfer_bytes(req: RouteRequest, p: View, d: View, pd: PDConfig) -> int:
    return max(0, transfer_tokens(req, d)) * kv_bytes_per_token(p, pd)


def link_backlog_s(p: View, d: View, pd: PDConfig, lead_s: float) -> float:
    """Seconds of bytes already booked on the NICs this transfer will cross when it starts:
    all of those into D (other pairs' transfers run concurrently), and those out of P
    that its queue and our prefill (``lead_s``) have not drained yet."""
    nic = (pd.handoff.nic_gbps or link_gbps(p, d, pd.links)) * 1e9 / 8
    return max(d.load.transfer_bytes / nic, p.load.transfer_bytes / nic - lead_s, 0.0)


def overlap_seconds(serial: float, p: View, d: View, pd: PDConfig, lead_s: float) -> float:
    """Seconds a transfer of ``serial`` seconds alone loses to the transfers booked at
    either end that will share the link with it. n transfers with B seconds of bytes left
    share it fairly with ours: each costs us min(T, its rest), min(n T, B) in all.

    P's are ahead of ours on its FCFS queue: they leave as their prefills end, so only
    what the link has not drained by the time ours starts (``lead_s`` from now) is left.
    D's may be those same transfers (a pair used twice); the rest come from other prefill
    instances, whose queues we do not see, and are taken to run alongside ours. (Dividing
    the link by every transfer booked at either end priced ~10% of vLLM transfers at twice
    their measured time: the one before ours on the same pair, already done.)"""
    nic = (pd.handoff.nic_gbps or link_gbps(p, d, pd.links)) * 1e9 / 8
    pl, dl = p.load, d.load
    ahead = min(pl.transfers * serial, max(0.0, pl.transfer_bytes / nic - lead_s))
    others = dl.transfers - pl.transfers
    if others <= 0:
        return ahead
    return max(ahead, min(others * serial, max(0, dl.transfer_bytes - pl.transfer_bytes) / nic))


def transfer_seconds(req: RouteRequest, p: View, d: View, pd: PDConfig, prefill_s: float = 0.0,
                     lead_s: float = 0.0) -> float:
    """Time the transfer adds after a prefill of ``prefill_s`` seconds on P (``lead_s``: from
    now until the transfer starts: queue + prefill for vLLM, the queue for SGLang, which
    streams from its first chunk).

    Without link-aware booking, the transfer shares the link with the transfers booked at
    either end that will run alongside it (``overlap_seconds``), its last SGLang chunk too.
    With it (pd.handoff.link_aware), the booked bytes say how long the link
    stays busy: sharing it with a backlog B slows a transfer of T alone to T + min(T, B)
    (two fluid flows); a backlog beyond max_link_backlog_s is a reservation the transfer
    waits out (T + B), which steers decisions to another pair when one has room."""
    tokens = req.prompt_tokens - d.expected_cached_tokens(req)
    if tokens <= 0:
        return 0.0
    per_token = kv_bytes_per_token(p, pd)
    h = pd.handoff
    bytes_per_s = link_gbps(p, d, pd.links) * 1e9 / 8
    serial = tokens * per_token / bytes_per_s
    shared = 1.0  # how much slower than alone the link moves it
    if h.link_aware:
        backlog = link_backlog_s(p, d, pd, lead_s)
        serial += backlog if backlog > h.max_link_backlog_s else min(serial, backlog)
    else:
        overlap = overlap_seconds(serial, p, d, pd, lead_s)
        shared += overlap / serial
        serial += overlap
    if flavor(p) == "sglang":  # what moves after the prefill: the KV of its last chunk, on the link as shared
        chunk = pd.handoff.overlap_chunk_tokens
        computed = max(1, req.prompt_tokens - p.expected_cached_tokens(req))
        last = min(tokens, (computed - 1) % chunk + 1) * per_token / bytes_per_s * shared
        serial = max(last, serial - prefill_s)
    return pd.links.setup_s + serial


def decode_step_seconds(d: View, pd: PDConfig, extra_requests: int = 0, extra_kv: int = 0,
                        measured: bool = True) -> float:
    """D's decode step with its booked batch (plus ``extra_*``), by the configured step model.

    Where the engine's own inter-token latency was measured at a known batch
    (router/engines/decode_step.py), the model is scaled by measured / model-at-that-batch:
    the configured shape (more requests, more KV: slower steps), the engine's own speed.
    That measurement is what a running request's tokens wait, the steps stalled by prefill
    chunks on D included: right for the TBT filter and for how fast running decodes free KV
    room. Isolation's stall arithmetic prices those chunks itself, and so does the route's
    first step (a stall it causes is the isolation's to price), so they ask for the
    configured pure step (``measured=False``): counting the stalls twice made the TBT
    objective refuse most decode-alone prefills (burst shapes: both targets on 11 of 51 runs
    against 35) and, in the first token's step alone, still cost it 6% of TTFT p90
    (docs/benchmarks.md, session 21)."""
    c = d.candidate
    requests = d.load.requests + extra_requests
    kv = d.load.kv_tokens + extra_kv
    step = pd.decode_step_base_s + pd.decode_step_per_request_s * requests + pd.decode_step_per_kv_token_s * kv
    if measured and c.decode_step_s is not None and c.decode_step_batch is not None:
        at = (pd.decode_step_base_s + pd.decode_step_per_request_s * c.decode_step_batch
              + pd.decode_step_per_kv_token_s * c.decode_step_kv_share * c.cache_tokens)
        if at > 0:
            step *= min(MAX_STEP_SCALE, max(1 / MAX_STEP_SCALE, c.decode_step_s / at))
    return step


def kv_fits(req: RouteRequest, d: View) -> bool:
    return d.load.kv_tokens + req.prompt_tokens + req.max_tokens <= d.candidate.cache_tokens


def admission_seconds(req: RouteRequest, d: View, pd: PDConfig) -> float:
    """Wait for KV room on D: the deficit over the rate at which running decodes free KV
    (each holds kv/requests tokens and ends after about max_tokens/2 more steps)."""
    if kv_fits(req, d):
        return 0.0
    deficit = d.load.kv_tokens + req.prompt_tokens + req.max_tokens - d.candidate.cache_tokens
    step = decode_step_seconds(d, pd)
    remaining_steps = max(1.0, req.max_tokens / 2)
    freed_per_s = d.load.kv_tokens / (remaining_steps * step) if d.load.kv_tokens else 0.0
    return deficit / freed_per_s if freed_per_s > 0 else float("inf")


def route_cost(req: RouteRequest, d: View, p: View | None, weights: TTFTWeights, pd: PDConfig) -> RouteCost:
    """Price the route (P, D), or D alone when ``p`` is None: then D's own queue, prefill
    and decode interference, and no transfer."""
    # the first token's step: D's pure step (a stall there is isolation's to price, see decode_step_seconds)
    step = decode_step_seconds(d, pd, 1, req.prompt_tokens, measured=False)
    if p is None:
        t = colocated_ttft(req, d, weights)
        return RouteCost(t.queue_s, t.prefill_s + t.interference_s, 0.0, admission_seconds(req, d, pd), step, t.uncached_tokens, 0)
    # an SGLang prefill instance's NIC streams the KV of what it computes, while it computes
    streams = flavor(p) == "sglang"
    t = colocated_ttft(req, p, weights, 1.0 + pd.handoff.transfer_interference if streams else 1.0)
    queue, prefill = t.queue_s, t.prefill_s
    # the transfer starts with the prefill when it streams, after it otherwise
    transfer = transfer_seconds(req, p, d, pd, prefill, queue if streams else queue + prefill)
    return RouteCost(queue, prefill, transfer, admission_seconds(req, d, pd), step,
                     t.uncached_tokens, transfer_tokens(req, d), transfer_bytes(req, p, d, pd))
