"""``POST /debug/route``: the decision a request would get, without sending or booking it.

It runs the very policy object the router uses on a read-only snapshot of the same state,
so what it shows is what the router would do (up to the random choice among near-ties,
which it lists as ``acceptable``): the same admission checks, and in token mode the same
tokenizer, so the keys and the token count are the request path's own. Every policy is a pipeline of plugins, so every one is
explained the same way: its plugins, then per route the score of each scorer, the cost
terms of the scorers that price routes, the total the picker saw, or the filter that
dropped the route; a two-profile policy shows the same for each profile.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from starlette.requests import Request

from router.core.errors import NoCapacity, NoRoute, bad_request
from router.scheduling.framework import Decision
from router.request.prompt import Endpoint, parse_body
from router.request.keys import route_request
from router.request.inputs import read_body
from router.request.service import RouterService


async def explain(svc: RouterService, request: Request) -> dict[str, Any]:
    raw = await read_body(request, svc.config.proxy.max_body_bytes)
    endpoint: Endpoint
    try:
        endpoint = "chat" if "messages" in json.loads(raw) else "completions"
    except (ValueError, TypeError):
        raise bad_request("request body is not valid JSON", code="invalid_json") from None
    parsed = parse_body(raw, endpoint, svc.config.hashing.chars_per_token)
    svc.admission.check(parsed)
    if svc.tokenizer is not None:  # token mode: the very keys (and exact count) the request path computes
        parsed = await svc.tokenizer.apply(parsed)
        svc.admission.check(parsed)
    req = route_request(parsed, svc.config.hashing, uuid.uuid4().hex, svc.config.policy.default_max_tokens)
    instances = svc.candidates(parsed.model)
    candidates = [i.candidate for i in instances]
    snap = await svc.store.snapshot(req.keys, [c.id for c in candidates])
    try:
        decision = svc.policy.choose(req, candidates, snap)
    except (NoRoute, ValueError) as exc:
        raise NoCapacity(f"no route: {exc}", code="no_route") from None
    describe = getattr(svc.policy, "describe", None)
    return {
        "policy": svc.policy.name,
        "pipeline": describe() if describe is not None else None,
        "request": {"prompt_tokens": req.prompt_tokens, "max_tokens": req.max_tokens, "blocks": len(req.keys),
                    "block_tokens": req.block_tokens, "endpoint": endpoint,
                    "keys": "tokens" if parsed.tokens is not None else "chars"},
        **explain_decision(decision),
        "candidates": [
            {"id": c.id, "role": c.role, "matched_blocks": snap.matched.get(c.id, 0),
             "prefill_tokens_per_s": c.prefill_tokens_per_s, "decode_step_s": c.decode_step_s,
             "load": dataclasses.asdict(snap.loads[c.id])}
            for c in candidates
        ],
    }


def explain_decision(decision: Decision) -> dict[str, Any]:
    """Chosen route, near-ties and every route the policy considered; per profile too."""
    keys = sorted(set(decision.scores) | set(decision.filtered))
    out: dict[str, Any] = {
        "chosen": {"route": decision.key, "instance": decision.instance, "prefill": decision.prefill,
                   "mode": decision.mode, "reason": decision.reason, "estimate_s": decision.estimate_s},
        "acceptable": sorted(decision.acceptable),
        "routes": [
            {"route": key, "total": decision.scores.get(key), "scores": dict(decision.plugin_scores.get(key, {})),
             "terms": dict(decision.terms.get(key, {})), "filtered_by": decision.filtered.get(key)}
            for key in keys
        ],
    }
    if decision.profiles:
        out["profiles"] = {name: explain_decision(d) for name, d in decision.profiles.items()}
    return out
