"""The named policies of ``policy.name``: each a preset that returns its pipeline(s).

A preset reads its weights from the existing config sections (``policy.ttft``,
``policy.cache_aware``), so configs written before pipelines existed keep their meaning.
In a cluster with a prefill pool ``ttft`` scores whole (P, D) routes; every other preset
becomes two profiles, as the peers do PD: P by the named rule, D by load (round robin and
random: the same rule, with its own state).
"""

from __future__ import annotations

from typing import Any

from router.config.model import PipelineConfig, PluginRef, ProfilesConfig, ScorerRef
from router.scheduling.registry import BuildContext, NoParams, marked, plugin

PolicySpec = PipelineConfig | ProfilesConfig


def _ref(name: str, **params: Any) -> PluginRef:
    return PluginRef(name=name, params=params)


def _scorer(name: str, weight: float = 1.0) -> ScorerRef:
    return ScorerRef(name=name, weight=weight)


def _least_loaded() -> PipelineConfig:
    return PipelineConfig(scorers=[_scorer("requests")], picker=_ref("max_score"))


def _independent(ctx: BuildContext, prefill: PipelineConfig, decode: PipelineConfig | None = None) -> PolicySpec:
    """``prefill`` alone in a colocated cluster; with a prefill pool, ``prefill`` for P and
    ``decode`` (default: least loaded) for D."""
    if ctx.pd is None:
        return prefill
    return ProfilesConfig(prefill=prefill, decode=decode or _least_loaded())


def _bounded_load(ctx: BuildContext) -> PluginRef:
    """The bounded-load filter with policy.ttft's bound (the ttft presets share it)."""
    w = ctx.policy.ttft
    return _ref("bounded_load", factor=w.bounded_load_factor, slack=w.bounded_load_slack,
                keep_tokens=w.bounded_load_keep_tokens)


def _pd_ttft(ctx: BuildContext) -> PipelineConfig:
    w = ctx.policy.ttft
    # For routes, tie_tolerance has always meant "cost within (1 + tol) of the best",
    # i.e. a score (best / cost) of at least 1 / (1 + tol).
    return PipelineConfig(routes=_ref("pd_pairs"), scorers=[_scorer("pd_ttft")],
                          picker=_ref("max_score", tolerance=w.tie_tolerance / (1 + w.tie_tolerance)))


@plugin("preset", "ttft")
def ttft(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """Lowest estimated TTFT after bounded-load and cache-room filters, near-ties to the prefix's rendezvous home; with a prefill pool, over (P, D) routes priced in full."""
    w = ctx.policy.ttft
    if ctx.pd is not None:
        return _pd_ttft(ctx)
    return PipelineConfig(
        filters=[_bounded_load(ctx), _ref("cache_room")],
        scorers=[_scorer("ttft")],
        picker=_ref("rendezvous", tolerance=w.tie_tolerance),
    )


@plugin("preset", "ttft_spread")
def ttft_spread(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """ttft before cache-room placement: lowest estimated TTFT after a bounded-load filter, random near-ties (for comparison)."""
    w = ctx.policy.ttft
    if ctx.pd is not None:
        return _pd_ttft(ctx)
    return PipelineConfig(
        filters=[_bounded_load(ctx)],
        scorers=[_scorer("ttft")],
        picker=_ref("max_score", tolerance=w.tie_tolerance),
    )


@plugin("preset", "round_robin")
def round_robin(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """Cycle through the healthy instances."""
    rr = PipelineConfig(picker=_ref("round_robin"))
    return _independent(ctx, rr, rr)


@plugin("preset", "random")
def random_(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """Uniform over the healthy instances."""
    uniform = PipelineConfig(picker=_ref("random"))
    return _independent(ctx, uniform, uniform)


@plugin("preset", "least_loaded")
def least_loaded(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """Fewest requests in flight, random among equals."""
    return _independent(ctx, _least_loaded())


@plugin("preset", "cache_aware")
def cache_aware(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """sglang-router's rule (policy.cache_aware), with ties broken at random and least loaded among the deepest matches."""
    return _independent(ctx, PipelineConfig(
        filters=[PluginRef(name="cache_affinity", params=ctx.policy.cache_aware.model_dump())],
        scorers=[_scorer("requests")],
        picker=_ref("max_score"),
    ))


@plugin("preset", "sglang_cache_aware")
def sglang_cache_aware(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """sglang-router 0.3.x cache_aware as documented: ties to the first instance in list order."""
    return _independent(ctx, PipelineConfig(
        filters=[PluginRef(name="cache_affinity", params=ctx.policy.cache_aware.model_dump())],
        picker=_ref("first_max"),
    ))


@plugin("preset", "llmd_weighted")
def llmd_weighted(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """llm-d's weighted profile: prefix x3 + queue x2 + kv x2, max score, random ties."""
    return _independent(ctx, PipelineConfig(
        scorers=[_scorer("prefix", 3.0), _scorer("queue", 2.0), _scorer("kv", 2.0)],
        picker=_ref("max_score"),
    ))


@plugin("preset", "dynamo_cost")
def dynamo_cost(params: NoParams, ctx: BuildContext) -> PolicySpec:
    """Dynamo's KV router cost (overlap x prefill blocks + decode blocks), argmin, random ties."""
    return _independent(ctx, PipelineConfig(scorers=[_scorer("dynamo_cost")], picker=_ref("max_score")))


# The built-in presets, in the order above (installed plugins may add more: see registry.py).
PRESET_NAMES: tuple[str, ...] = tuple(
    info.name for info in map(marked, list(globals().values())) if info is not None and info.kind == "preset"
)
