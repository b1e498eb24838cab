"""Token mode: the prompt's token ids, so request keys meet the engines' KV-event keys.

Two sources, both exact for the engine they describe:

* ``engine``: ``POST /tokenize`` on a healthy instance serving the model. The engine
  applies its own chat template and special tokens, so the ids are the ones it will
  cache; the cost is one short round trip per request.
* ``file``: a local ``tokenizer.json`` through the ``tokenizers`` package (never a hub
  download); chat requests are rendered with the chat template of the
  ``tokenizer_config.json`` beside it (jinja2, sandboxed), as Hugging Face servers do.
  Encoding takes about 0.35 ms per 1,000 characters with a small BPE (35 ms for 100k;
  ``python loadtests/kv_events_bench.py --parts tokenize``), so prompts longer than
  ``offload_chars`` (2,048) are encoded in a worker thread, through ``encode_batch``: the
  single-text ``encode`` keeps the GIL for the whole call, so a thread would not free the
  event loop, while the batch call releases it. Shorter prompts hold the loop for under a
  millisecond.

When the tokenizer cannot answer (engine down, template missing) the request keeps its
character keys: routed on approximate residency, counted in ``fallbacks``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx

from router.config.model import HashingConfig
from router.config.precise import TokensConfig
from router.core.instances import InstancePool
from router.request.prompt import ParsedRequest

log = logging.getLogger(__name__)


class PromptTokenizer(Protocol):
    fallbacks: int

    async def apply(self, parsed: ParsedRequest) -> ParsedRequest:
        """``parsed`` with its token ids (unchanged when they cannot be had)."""
        ...


def with_tokens(parsed: ParsedRequest, ids: list[int]) -> ParsedRequest:
    """The request with token ids for its (first) prompt; the count is exact when it has one."""
    single = parsed.endpoint == "chat" or isinstance(parsed.body.get("prompt"), str)
    count = len(ids) if single else parsed.prompt_tokens
    return dataclasses.replace(parsed, tokens=ids, prompt_tokens=max(1, count))


class EngineTokenizer:
    """Asks the engine (vLLM and SGLang both serve ``POST /tokenize``)."""

    def __init__(self, pool: InstancePool, client: httpx.AsyncClient, config: TokensConfig) -> None:
        self._pool = pool
        self._client = client
        self._timeout = config.timeout_s
        self.fallbacks = 0

    async def apply(self, parsed: ParsedRequest) -> ParsedRequest:
        if parsed.tokens is not None:
            return parsed
        body: dict[str, Any] = {"model": parsed.model}
        if parsed.endpoint == "chat":
            body["messages"] = parsed.body.get("messages")
            for name in ("tools", "chat_template_kwargs", "add_generation_prompt"):
                if name in parsed.body:
                    body[name] = parsed.body[name]
        else:
            prompt = parsed.body.get("prompt")
            body["prompt"] = prompt[0] if isinstance(prompt, list) else prompt
        for inst in self._pool.healthy(("mixed", "prefill", "decode"), model=parsed.model)[:2]:
            try:
                resp = await self._client.post(f"{inst.url}/tokenize", json=body, timeout=self._timeout)
                if resp.status_code == 200:
                    ids = resp.json().get("tokens")
                    if isinstance(ids, list) and ids and all(type(t) is int and 0 <= t < 2**32 for t in ids):
                        return with_tokens(parsed, ids)
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
        self.fallbacks += 1
        return parsed


class FileTokenizer:
    """A local tokenizer.json, with the chat template of its tokenizer_config.json."""

    def __init__(self, config: TokensConfig) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - the 'tokens' extra is not installed
            raise RuntimeError("hashing.tokens.source: file needs the tokenizers package "
                               "(pip install 'pd-router[tokens]')") from None
        if not config.path:
            raise RuntimeError("hashing.tokens.source: file needs hashing.tokens.path (a tokenizer.json)")
        self._tok = Tokenizer.from_file(config.path)
        self._offload = config.offload_chars
        self._render = _chat_renderer(Path(config.path), config.chat_template_path)
        self.fallbacks = 0

    def encode(self, text: str, special: bool) -> list[int]:
        """On the calling thread, holding the GIL throughout."""
        return list(self._tok.encode(text, add_special_tokens=special).ids)

    def encode_released(self, text: str, special: bool) -> list[int]:
        """The same ids, with the GIL released while the Rust encoder runs (for a worker thread)."""
        return list(self._tok.encode_batch([text], add_special_tokens=special)[0].ids)

    async def apply(self, parsed: ParsedRequest) -> ParsedRequest:
        if parsed.tokens is not None:
            return parsed
        if parsed.endpoint == "chat":
            if self._render is None:
                self.fallbacks += 1
                return parsed
            try:
                text, special = self._render(parsed.body), False
            except Exception as exc:  # noqa: BLE001 - a template error must not fail the request
                log.debug("chat template failed: %s", type(exc).__name__)
                self.fallbacks += 1
                return parsed
        else:
            prompt = parsed.body.get("prompt")
            text, special = str(prompt[0] if isinstance(prompt, list) else prompt), True
        if len(text) > self._offload:
            ids = await asyncio.to_thread(self.encode_released, text, special)
        else:
            ids = self.encode(text, special)
        return with_tokens(parsed, ids)


def _chat_renderer(tokenizer_path: Path, template_path: str | None) -> Callable[[dict[str, Any]], str] | None:
    """Render chat bodies with the model's template, or None when it has none."""
    path = Path(template_path) if template_path else tokenizer_path.with_name("tokenizer_config.json")
    if not path.is_file():
        return None
    raw = path.read_text()
    settings: dict[str, Any] = {}
    if path.suffix == ".json":
        settings = json.loads(raw)
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    else:
        template = raw
    if not isinstance(template, str):
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    compiled = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)

    def token(name: str) -> str:
        value = settings.get(name)
        return value.get("content", "") if isinstance(value, dict) else (value or "")

    def render(body: dict[str, Any]) -> str:
        return compiled.render(messages=body.get("messages"), tools=body.get("tools"),
                               add_generation_prompt=body.get("add_generation_prompt", True),
                               bos_token=token("bos_token"), eos_token=token("eos_token"))

    return render


def build_tokenizer(hashing: HashingConfig, pool: InstancePool, client: httpx.AsyncClient) -> PromptTokenizer | None:
    """The configured tokenizer in token mode; None in character mode."""
    if hashing.mode != "tokens":
        return None
    if hashing.tokens.source == "file":
        return FileTokenizer(hashing.tokens)
    return EngineTokenizer(pool, client, hashing.tokens)
