"""Cost terms of a disaggregated request, Mooncake-Conductor style, in seconds.

    ttft(P, D) = queue(P) + prefill(P) + transfer(P -> D) + admission(D) + step(D)

queue and prefill are the colocated terms on P (cost.py), slower by the transfer
interference on an SGLang P (its NIC streams KV while it computes). The KV that D lacks
(prompt - cached on D) crosses the link between P and D: bytes / (link bandwidth shared
by the transfers already in flight at either end). Overlap follows the protocol: vLLM
(NIXL) pulls after the prefill, so the whole transfer adds to TTFT; SGLang streams each
prefill chunk's KV while the next computes, so only what cannot move during the prefill
adds, and at least the last chunk's share. admission(D) is the wait for KV room
on D, step(D) its decode step time, which must also stay under the TBT target.
"""

from __future__ import annotations

from router.config.model import LinkConfig, PDConfig, TTFTWeights
from router.scheduling.cost import colocated_ttft
from router.scheduling.framework import RouteCost, RouteRequest, View


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


def transfer_seconds(req: RouteRequest, p: View, d: View, pd: PDConfig, prefill_s: float = 0.0,
                     lead_s: float = 0.0) -> float:
    """Time the transfer adds after a prefill of ``prefill_s`` seconds on P (``lead_s``:
    queue + prefill, before the transfer starts).

    Without link-aware booking, the link is divided by the count of transfers booked at
    either end. With it (pd.handoff.link_aware), the booked bytes say how long the link
    stays busy: sharing it with a backlog B slows a transfer of T alone to T + min(T, B)
    (two fluid flows); a backlog beyond max_link_backlog_s is a reservation the transfer
    waits out (T + B), which steers decisions to another pair when one has room."""
    tokens = transfer_tokens(req, d)
    if tokens <= 0:
        return 0.0
    per_token = kv_bytes_per_token(p, pd)
    h = pd.handoff
    sharing = 1 if h.link_aware else 1 + max(p.load.transfers, d.load.transfers)
    bytes_per_s = link_gbps(p, d, pd.links) * 1e9 / 8 / sharing
    serial = tokens * per_token / bytes_per_s
    if h.link_aware:
        backlog = link_backlog_s(p, d, pd, lead_s)
        serial += backlog if backlog > h.max_link_backlog_s else min(serial, backlog)
    if flavor(p) == "sglang":  # what moves after the prefill: the KV of its last chunk
        chunk = pd.handoff.overlap_chunk_tokens
        computed = max(1, req.prompt_tokens - p.cached_tokens(req))
        last = min(tokens, (computed - 1) % chunk + 1) * per_token / bytes_per_s
        serial = max(last, serial - prefill_s)
    return pd.links.setup_s + serial


def decode_step_seconds(d: View, pd: PDConfig, extra_requests: int = 0, extra_kv: int = 0) -> float:
    requests = d.load.requests + extra_requests
    kv = d.load.kv_tokens + extra_kv
    return pd.decode_step_base_s + pd.decode_step_per_request_s * requests + pd.decode_step_per_kv_token_s * kv


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
    step = decode_step_seconds(d, pd, 1, req.prompt_tokens)
    if p is None:
        t = colocated_ttft(req, d, weights)
        return RouteCost(t.queue_s, t.prefill_s + t.interference_s, 0.0, admission_seconds(req, d, pd), step, t.uncached_tokens, 0)
    t = colocated_ttft(req, p, weights)
    # an SGLang prefill instance's NIC streams the KV of what it computes, while it computes
    slow = 1.0 + pd.handoff.transfer_interference if flavor(p) == "sglang" else 1.0
    queue, prefill = t.queue_s * slow, t.prefill_s * slow
    transfer = transfer_seconds(req, p, d, pd, prefill, queue + prefill)
    return RouteCost(queue, prefill, transfer, admission_seconds(req, d, pd), step,
                     t.uncached_tokens, transfer_tokens(req, d), transfer_bytes(req, p, d, pd))
