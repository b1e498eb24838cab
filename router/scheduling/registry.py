"""The plugin registry: routing plugins by kind and name, from this package and from others.

A plugin is a factory marked with ``@plugin(kind, name, params)``. Marking attaches the
registration to the factory and changes nothing else, so importing a module never mutates
shared state; a ``Registry`` collects marked factories by scanning modules. Kinds:

* ``routes``  — route generators: the routes a request may take (instances, or (P, D) pairs)
* ``filter``  — drop routes before scoring (fail-open: a filter that would drop all keeps all)
* ``scorer``  — one score per route, higher is better; a pipeline sums them with weights
* ``picker``  — turns the totals into one route and the set of acceptable near-ties
* ``preset``  — a named policy: a function of the policy config that returns its pipeline(s)

A factory is called as ``factory(params, ctx)``: ``params`` validated by its ``params``
model (pydantic, unknown names rejected), ``ctx`` the ``BuildContext``.

Other packages add plugins through the entry-point group ``pd_router.plugins``: each entry
point names a module (every marked factory in it is registered) or one marked factory.
``build.default_registry()`` loads them once, on first use; a broken one is a
``PluginError`` (a ``ConfigError``) naming the entry point.
"""

from __future__ import annotations

import importlib.metadata
import random
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict

from router.config.model import ConfigError, PDConfig, PolicyConfig

Kind = Literal["routes", "filter", "scorer", "picker", "preset"]
KINDS: tuple[Kind, ...] = get_args(Kind)
ENTRY_POINT_GROUP = "pd_router.plugins"
_MARK = "__pd_router_plugin__"

F = TypeVar("F", bound=Callable[..., Any])


class PluginError(ConfigError):
    """A plugin that cannot be registered or loaded; the message names it and its origin."""


class Params(BaseModel):
    """Base of plugin parameter models: unknown parameters are an error, never ignored."""

    model_config = ConfigDict(extra="forbid")


class NoParams(Params):
    """For plugins that take no parameters."""


@dataclass(frozen=True)
class BuildContext:
    """What a factory may read besides its own parameters: the policy config (its
    ``ttft`` and ``cache_aware`` sections), the PD config (None when the cluster has no
    prefill pool) and the policy's seeded RNG, shared by all its plugins; ``shared``: objects
    its plugins share by name (one TTFT estimator for the cache-room filter and the ttft
    scorer, so a decision prices each candidate once); ``clock``: the time plugins that keep
    a window of their own decisions read (monotonic live, the virtual clock in a replay)."""

    policy: PolicyConfig
    pd: PDConfig | None
    rng: random.Random
    shared: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, hash=False)

    def require_pd(self, what: str) -> PDConfig:
        if self.pd is None:
            raise ValueError(f"{what} needs a cluster with a prefill pool (instances with role: prefill)")
        return self.pd


@dataclass(frozen=True)
class PluginInfo:
    kind: Kind
    name: str
    factory: Callable[[Any, BuildContext], Any]
    params: type[BaseModel]
    origin: str = ""  # the module or entry point it came from, for error messages

    @property
    def summary(self) -> str:
        """First line of the factory's docstring."""
        return (self.factory.__doc__ or "").strip().split("\n", 1)[0]


def plugin(kind: Kind, name: str, params: type[BaseModel] = NoParams) -> Callable[[F], F]:
    """Mark ``factory`` as the plugin ``name`` of ``kind``; it is called ``factory(params, ctx)``."""
    if kind not in KINDS:
        raise ValueError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"plugin name {name!r} must be letters, digits, '_' or '-'")

    def mark(factory: F) -> F:
        setattr(factory, _MARK, PluginInfo(kind, name, factory, params))
        return factory

    return mark


def marked(obj: object) -> PluginInfo | None:
    """The registration ``@plugin`` attached to ``obj``, if any."""
    info = getattr(obj, _MARK, None)
    return info if isinstance(info, PluginInfo) else None


class Registry:
    """Plugins by (kind, name). Built once per process by ``build.default_registry()``;
    tests and tools may build their own."""

    def __init__(self) -> None:
        self._plugins: dict[tuple[str, str], PluginInfo] = {}

    def add(self, info: PluginInfo, origin: str) -> None:
        key = (info.kind, info.name)
        known = self._plugins.get(key)
        if known is not None:
            if known.factory is info.factory:
                return  # the same factory reached through a second module
            raise PluginError(f"{info.kind} plugin {info.name!r} from {origin} clashes with the one from {known.origin}")
        self._plugins[key] = PluginInfo(info.kind, info.name, info.factory, info.params, origin)

    def scan(self, module: types.ModuleType, origin: str | None = None) -> int:
        """Register every marked factory defined in or imported into ``module``; returns how many."""
        found = [info for info in map(marked, vars(module).values()) if info is not None]
        for info in found:
            self.add(info, origin or module.__name__)
        return len(found)

    def get(self, kind: Kind, name: str) -> PluginInfo:
        try:
            return self._plugins[(kind, name)]
        except KeyError:
            raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(self.names(kind)) or '(none)'}") from None

    def names(self, kind: Kind) -> list[str]:
        return sorted(name for k, name in self._plugins if k == kind)

    def plugins(self) -> list[PluginInfo]:
        return sorted(self._plugins.values(), key=lambda i: (KINDS.index(i.kind), i.name))

    def load_entry_points(self, entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> None:
        """Register the plugins of the installed distributions' ``pd_router.plugins`` entry points."""
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        for ep in entry_points:
            dist = f", distribution {ep.dist.name} {ep.dist.version}" if ep.dist is not None else ""
            origin = f"entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP}{dist})"
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - any failure of a third-party import is reported as such
                raise PluginError(f"cannot load plugin {origin}: {type(exc).__name__}: {exc}") from exc
            info = marked(obj)
            if info is not None:
                self.add(info, origin)
            elif isinstance(obj, types.ModuleType):
                if not self.scan(obj, origin):
                    raise PluginError(f"plugin {origin}: module {obj.__name__} defines no @plugin factory")
            else:
                raise PluginError(f"plugin {origin}: {obj!r} is neither a @plugin factory nor a module of them")
