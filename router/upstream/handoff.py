"""PD handoff protocols, byte-compatible with the engines.

SGLang: prefill and decode receive the same body plus ``bootstrap_host`` (P's host),
``bootstrap_port`` (P's bootstrap server) and ``bootstrap_room`` (random 63-bit, unique per
request; one per item, as lists, for batches), concurrently: the prefill blocks until the
decode of the same room connects to it.

vLLM (NixlConnector): the prefill leg goes first with ``max_tokens=1``, ``stream=false``, no
``stream_options`` and ``kv_transfer_params={"do_remote_decode": true, ...}``; its answer's
``kv_transfer_params`` are copied verbatim into the decode leg, which carries the original
body. One ``X-Request-Id`` spans both legs.

``min_tokens`` on the prefill leg: vLLM's reference proxy drops it, vllm-router sets 1. We
set 1 by default (``pd.vllm_min_tokens: set``): NixlConnector only returns transfer params
for a length-capped request, so a first token that happens to be EOS would silently turn
the handoff into a full prefill on D. ``pop`` restores the reference proxy's behaviour for
engines that reject ``min_tokens``.
"""

from __future__ import annotations

import copy
import random
from typing import Any
from urllib.parse import urlsplit

_NIXL_REQUEST = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def batch_size(body: dict[str, Any]) -> int:
    """Sequences one request produces: prompts in a batch times ``n``."""
    prompt = body.get("prompt")
    prompts = 1
    if isinstance(prompt, list) and prompt and (isinstance(prompt[0], (str, list))):
        prompts = len(prompt)
    n_field = body.get("n")
    n = n_field if isinstance(n_field, int) else 1
    return prompts * max(1, n)


def sglang_body(body: dict[str, Any], prefill_url: str, bootstrap_port: int | None, rng: random.Random) -> dict[str, Any]:
    """The body both SGLang legs receive."""
    host = urlsplit(prefill_url).hostname
    size = batch_size(body)
    out = dict(body)
    if size == 1:
        out.update(bootstrap_host=host, bootstrap_port=bootstrap_port, bootstrap_room=rng.getrandbits(63))
    else:
        out.update(
            bootstrap_host=[host] * size,
            bootstrap_port=[bootstrap_port] * size,
            bootstrap_room=[rng.getrandbits(63) for _ in range(size)],
        )
    return out


def vllm_prefill_body(body: dict[str, Any], min_tokens: str = "set") -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    if min_tokens == "set":
        out["min_tokens"] = 1
    else:
        out.pop("min_tokens", None)
        out.pop("min_completion_tokens", None)
    out["kv_transfer_params"] = dict(_NIXL_REQUEST)
    return out


def vllm_decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The original request plus the prefill's transfer params, copied verbatim."""
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    return out
