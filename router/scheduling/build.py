"""From ``policy`` config to a policy object: a preset or a declared pipeline, built from
registered plugins. Every name and parameter is checked here, and a problem is a
``ConfigError`` naming the config field (and, for a name, the known ones)."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from router.config.model import ConfigError, PDConfig, PipelineConfig, PluginRef, PolicyConfig, ProfilesConfig, RouterConfig
from router.core.instances import InstancePool
from router.scheduling import baselines, filters, pd, pickers, placement, presets, routes, scorers
from router.scheduling.framework import Policy
from router.scheduling.pd import TwoProfilePolicy
from router.scheduling.pipeline import Pipeline
from router.scheduling.registry import BuildContext, Kind, PluginError, Registry

_BUILTIN = (routes, filters, scorers, pickers, placement, baselines, pd, presets)

# What the pipeline calls on each kind of plugin, checked once when it is built.
_REQUIRED: dict[Kind, tuple[str, ...]] = {
    "routes": ("name", "disaggregates", "routes", "settle"),
    "filter": ("name", "keep"),
    "scorer": ("name", "score"),
    "picker": ("name", "revisable", "pick"),
}


@functools.cache
def default_registry() -> Registry:
    """The built-in plugins and the installed entry points, loaded once, on first use."""
    registry = Registry()
    for module in _BUILTIN:
        registry.scan(module)
    registry.load_entry_points()
    return registry


def _invalid(where: str, problem: str) -> ConfigError:
    return ConfigError(f"invalid configuration:\n  {where}: {problem}")


def make_plugin(registry: Registry, kind: Kind, ref: PluginRef, ctx: BuildContext, where: str) -> Any:
    """Instantiate the plugin ``ref`` names, its params validated by its own model."""
    try:
        info = registry.get(kind, ref.name)
    except KeyError as exc:
        raise _invalid(f"{where}.name", str(exc.args[0])) from None
    try:
        params = info.params.model_validate(ref.params)
    except ValidationError as exc:
        lines = [f"  {where}.params.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None
    try:
        obj = info.factory(params, ctx)
    except ValueError as exc:
        raise _invalid(where, f"{kind} {ref.name!r}: {exc}") from None
    missing = [a for a in _REQUIRED.get(kind, ()) if not hasattr(obj, a)]
    if missing:
        raise PluginError(f"{kind} plugin {ref.name!r} from {info.origin} built {obj!r}, which lacks {', '.join(missing)}")
    return obj


def build_pipeline(name: str, spec: PipelineConfig, ctx: BuildContext, registry: Registry, where: str,
                   *, profile: bool = False) -> Pipeline:
    """One pipeline. A profile (of a two-profile policy) routes within the pool it is given;
    a whole policy in a cluster with a prefill pool must pair P with D."""
    pairs = ctx.pd is not None and not profile
    ref = spec.routes or PluginRef(name="pd_pairs" if pairs else "instances")
    routes = make_plugin(registry, "routes", ref, ctx, f"{where}.routes")
    if routes.disaggregates and profile:
        raise _invalid(f"{where}.routes", f"{ref.name!r} pairs prefill with decode instances; a profile routes within one pool")
    if pairs and not routes.disaggregates:
        raise _invalid(f"{where}.routes", f"{ref.name!r} does not pair prefill with decode instances, which a cluster "
                                          "with a prefill pool needs (use pd_pairs, or policy.profiles)")
    filters = [make_plugin(registry, "filter", f, ctx, f"{where}.filters.{i}") for i, f in enumerate(spec.filters)]
    scorers = [(make_plugin(registry, "scorer", s, ctx, f"{where}.scorers.{i}"), s.weight) for i, s in enumerate(spec.scorers)]
    picker = make_plugin(registry, "picker", spec.picker, ctx, f"{where}.picker")
    return Pipeline(name, routes, filters, scorers, picker, spec.model_copy(update={"routes": ref}).model_dump())


def policy_spec(config: PolicyConfig, ctx: BuildContext, registry: Registry) -> tuple[PipelineConfig | ProfilesConfig, str]:
    """The pipeline(s) ``config`` declares or its preset returns, and where they come from."""
    if config.pipeline is not None:
        return config.pipeline, "policy.pipeline"
    if config.profiles is not None:
        return config.profiles, "policy.profiles"
    try:
        info = registry.get("preset", config.name)
    except KeyError as exc:
        raise _invalid("policy.name", f"{exc.args[0]} (or declare policy.pipeline)") from None
    spec = info.factory(info.params(), ctx)
    if not isinstance(spec, (PipelineConfig, ProfilesConfig)):
        raise PluginError(f"preset {config.name!r} from {info.origin} returned {spec!r}, not a PipelineConfig or ProfilesConfig")
    return spec, f"policy.name={config.name} (preset)"


def build_policy(config: PolicyConfig, pd: PDConfig | None = None, rng: random.Random | None = None,
                 *, registry: Registry | None = None, clock: Callable[[], float] = time.monotonic) -> Policy:
    """The policy ``config`` names or declares; with ``pd`` (the cluster has a prefill
    pool) its disaggregated form. All its plugins share one RNG (seeded by policy.seed)
    and one ``clock`` (a replay passes its virtual one)."""
    registry = registry or default_registry()
    ctx = BuildContext(config, pd, rng or random.Random(config.seed), clock=clock)
    spec, where = policy_spec(config, ctx, registry)
    if isinstance(spec, PipelineConfig):
        return build_pipeline(config.name, spec, ctx, registry, where)
    if pd is None:  # no prefill pool: the decode profile routes alone
        return build_pipeline(config.name, spec.decode, ctx, registry, f"{where}.decode", profile=True)
    decode = build_pipeline(f"{config.name}:decode", spec.decode, ctx, registry, f"{where}.decode", profile=True)
    prefill = build_pipeline(f"{config.name}:prefill", spec.prefill, ctx, registry, f"{where}.prefill", profile=True)
    return TwoProfilePolicy(config.name, prefill, decode)


def check_config(config: RouterConfig, *, registry: Registry | None = None) -> None:
    """Build the policy the router would build, to report a bad one before serving."""
    pd = config.pd if InstancePool(config).disaggregated else None
    build_policy(config.policy, pd, random.Random(0), registry=registry)
