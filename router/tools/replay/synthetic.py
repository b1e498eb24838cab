"""Seeded synthetic workloads, in the same shape as parsed traces.

Three workloads that pull routing in different directions:

* ``shared_prefix`` — llm-d's precise-prefix benchmark shape (inference-perf
  ``shared_prefix``): ``groups`` customers each with a system prompt, ``users`` fixed
  questions per customer (``router.tools.shared_prefix``, the generator the demo and the
  benchmarks use too), Poisson arrivals over a QPS ladder (``stages=RATExSECONDS+...``).
  Cache affinity should win big.
* ``multi_turn`` — chat sessions whose context grows: each turn's prompt is the previous
  prompt plus the previous answer plus a new user message, behind a system prompt shared
  by all sessions. Sessions start as a Poisson process; turns follow after an exponential
  think time (open loop: the next turn does not wait for the answer).
* ``dispersed`` — many distinct prompts with little reuse (a fraction ``reuse`` of the
  requests repeat the first half of an earlier prompt). Cache affinity should NOT win:
  the right answer is load balancing.

Prompts are sequences of 64-token content blocks (segment lengths are rounded up to whole
blocks), so prefix sharing is exact at block granularity. Same name, parameters and seed
give the same trace.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from router.tools.replay.trace import Trace, TraceError, TraceRequest, finish
from router.tools.shared_prefix import SharedPrefix

BLOCK_TOKENS = 64


@dataclass
class _Ids:
    """Fresh content ids: every call returns blocks no other prompt has used yet."""

    next_id: int = 0

    def take(self, n: int) -> tuple[int, ...]:
        ids = tuple(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids


def _blocks(tokens: int) -> int:
    return max(1, -(-tokens // BLOCK_TOKENS))


def _parse_stages(text: str) -> list[tuple[float, float]]:
    """``15x50+3x20`` -> [(15 req/s, 50 s), (3 req/s, 20 s)]."""
    stages = []
    for part in text.split("+"):
        rate, sep, seconds = part.partition("x")
        try:
            stage = (float(rate), float(seconds))
        except ValueError:
            stage = (-1.0, -1.0)
        if not sep or stage[0] <= 0 or stage[1] <= 0:
            raise TraceError(f"bad stage {part!r} in stages={text!r}; expected RATExSECONDS joined by '+', e.g. 5x60+10x60")
        stages.append(stage)
    return stages


def _poisson(rng: random.Random, stages: list[tuple[float, float]]) -> Iterator[float]:
    start = 0.0
    for rate, seconds in stages:
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= start + seconds:
                break
            yield t
        start += seconds


def shared_prefix(rng: random.Random, groups: int = 32, users: int = 5, system: int = 6000, question: int = 1200,
                  output: int = 256, stages: str = "2x60+4x60+8x60") -> list[TraceRequest]:
    workload = SharedPrefix(groups, users, system, question, seed=rng.getrandbits(64))
    blocks = workload.blocks(BLOCK_TOKENS)
    out = []
    for t, pair in zip(_poisson(rng, _parse_stages(stages)), workload.picks()):
        prompt = blocks.prompt(pair)
        out.append(TraceRequest(t, len(prompt) * BLOCK_TOKENS, output, prompt))
    return out


def multi_turn(rng: random.Random, sessions: int = 200, turns: int = 6, rate: float = 1.0, think: float = 20.0,
               system: int = 1024, user: int = 256, output: int = 256) -> list[TraceRequest]:
    ids = _Ids()
    shared = ids.take(_blocks(system))
    out = []
    start = 0.0
    for _ in range(sessions):
        start += rng.expovariate(rate)
        t, context = start, len(shared) * BLOCK_TOKENS
        stream = list(shared)  # the session's token stream, as blocks; prompts are its prefixes
        for _turn in range(turns):
            context += max(1, int(rng.expovariate(1.0 / user)))
            answer = max(1, int(rng.expovariate(1.0 / output)))
            needed = _blocks(context + answer)
            stream.extend(ids.take(max(0, needed - len(stream))))
            out.append(TraceRequest(t, context, answer, tuple(stream[: _blocks(context)])))
            context += answer
            t += rng.expovariate(1.0 / think)
    return out


def dispersed(rng: random.Random, requests: int = 2000, rate: float = 5.0, input: int = 4096, output: int = 256,
              reuse: float = 0.05) -> list[TraceRequest]:
    if not 0 <= reuse <= 1:
        raise TraceError(f"reuse must be within [0, 1], got {reuse}")
    ids = _Ids()
    out: list[TraceRequest] = []
    t = 0.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        n = rng.randint(max(1, input // 2), max(1, input * 3 // 2))
        blocks = ids.take(_blocks(n))
        if out and rng.random() < reuse:
            earlier = rng.choice(out).blocks
            keep = min(len(earlier), len(blocks)) // 2
            blocks = earlier[:keep] + blocks[keep:]
        out.append(TraceRequest(t, n, max(1, int(rng.expovariate(1.0 / output))), blocks))
    return out


@dataclass(frozen=True)
class _Generator:
    fn: Callable[..., list[TraceRequest]]
    params: Mapping[str, type]  # parameter -> its type, for parsing k=v


GENERATORS: Mapping[str, _Generator] = MappingProxyType({
    "shared_prefix": _Generator(shared_prefix, MappingProxyType(
        {"groups": int, "users": int, "system": int, "question": int, "output": int, "stages": str})),
    "multi_turn": _Generator(multi_turn, MappingProxyType(
        {"sessions": int, "turns": int, "rate": float, "think": float, "system": int, "user": int, "output": int})),
    "dispersed": _Generator(dispersed, MappingProxyType(
        {"requests": int, "rate": float, "input": int, "output": int, "reuse": float})),
})


def generate(spec: str, seed: int = 0) -> Trace:
    """``NAME[:k=v,...]`` (``seed=`` among them overrides ``seed``) -> a trace."""
    name, _, args = spec.partition(":")
    gen = GENERATORS.get(name)
    if gen is None:
        raise TraceError(f"unknown synthetic workload {name!r}; known: {', '.join(GENERATORS)}")
    kwargs: dict[str, object] = {}
    for item in filter(None, args.split(",")):
        key, sep, raw = item.partition("=")
        key = key.strip()
        kind = int if key == "seed" else gen.params.get(key)
        if not sep or kind is None:
            known = ", ".join([*gen.params, "seed"])
            raise TraceError(f"synthetic:{name}: bad parameter {item!r}; expected k=v with k one of {known}")
        try:
            value = kind(raw.strip())
        except ValueError:
            raise TraceError(f"synthetic:{name}: {key} must be {kind.__name__}, got {raw!r}") from None
        if kind is not str and value <= 0 and key not in ("seed", "reuse"):
            raise TraceError(f"synthetic:{name}: {key} must be > 0, got {raw!r}")
        kwargs[key] = value
    rng = random.Random(int(kwargs.pop("seed", seed)))  # type: ignore[call-overload]
    requests = gen.fn(rng, **kwargs)
    if not requests:
        raise TraceError(f"synthetic:{spec}: the parameters produce no requests")
    label = f"synthetic:{spec}" if args else f"synthetic:{name}"
    return finish(label, BLOCK_TOKENS, requests)
