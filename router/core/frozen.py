"""Frozen dataclasses built at the cost of a plain object: one ``__dict__`` write per instance.

Why: a frozen dataclass's generated ``__init__`` sets each field with its own
``object.__setattr__`` call (it must get past the class's refusing ``__setattr__``), so
building a 9-field value costs about three times a plain class's. The request path builds
several per request (the parsed body, the routing facts, the snapshot, the decision's
record, TTFT terms), each once, never mutated. :func:`quick_init` replaces that ``__init__``
with one of the same signature (names, order, defaults, default factories) that fills the
instance's ``__dict__`` in one call; the class stays frozen (assignment still raises) and
keeps its generated ``__eq__``, ``__hash__`` and ``__repr__``; ``dataclasses.replace`` goes
through the new ``__init__``.

Only plain frozen dataclasses qualify: every field in ``__init__``, no ``__post_init__``, no
``__slots__`` (there is no ``__dict__`` to fill); anything else is refused when the class is
defined, not at its first use.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

_NO_VALUE = object()  # stands for "not given" of a field with a default factory


def quick_init(cls: type[T]) -> type[T]:
    """``cls`` (a frozen dataclass) with an ``__init__`` that writes its fields in one call."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen dataclass")
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} has __post_init__ or __slots__")
    fields = list(dataclasses.fields(cls))  # type: ignore[arg-type]
    if any(not f.init for f in fields) or len(fields) != len(cls.__dataclass_fields__):  # type: ignore[attr-defined]
        raise TypeError(f"quick_init: {cls.__name__} has fields outside __init__")
    namespace: dict[str, Any] = {"_NO_VALUE": _NO_VALUE}
    args, factories = [], []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_NO_VALUE")
            factories.append(f"    if {f.name} is _NO_VALUE: {f.name} = _factory_{f.name}()\n")
        else:
            args.append(f.name)
    kw_only = [f for f in fields if f.kw_only]
    if kw_only:
        raise TypeError(f"quick_init: {cls.__name__} has keyword-only fields")
    body = "".join(factories) + "    self.__dict__.update(" + ", ".join(f"{f.name}={f.name}" for f in fields) + ")\n"
    source = f"def __init__(self, {', '.join(args)}) -> None:\n{body}"
    exec(source, namespace)  # noqa: S102 - the source is built from the class's own field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - replacing the generated __init__ is the point
    return cls
