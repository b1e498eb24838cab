"""quick_init: a frozen dataclass built by one __dict__ write is the value the generated __init__ builds."""

import dataclasses
from dataclasses import dataclass, field

import pytest

from router.core.frozen import quick_init
from router.request.prompt import ParsedRequest
from router.scheduling.cost import TTFTTerms
from router.scheduling.framework import Decision, RouteCost, RouteRequest
from router.state.base import Booking, Leg, Load, Snapshot


@dataclass(frozen=True)
class Plain:
    a: int
    b: str = "x"
    c: dict[str, int] = field(default_factory=dict)
    d: float = field(default=0.5, compare=False)


@quick_init
@dataclass(frozen=True)
class Quick:
    a: int
    b: str = "x"
    c: dict[str, int] = field(default_factory=dict)
    d: float = field(default=0.5, compare=False)


def test_the_same_signature_defaults_and_fresh_default_factories() -> None:
    assert vars(Quick(1)) == vars(Plain(1))
    assert vars(Quick(1, "y", {"k": 2}, 0.25)) == vars(Plain(1, "y", {"k": 2}, 0.25))
    assert vars(Quick(a=3, d=1.5)) == vars(Plain(a=3, d=1.5))
    assert Quick(1).c is not Quick(1).c  # each instance its own dict, as default_factory gives
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, e=2)  # type: ignore[call-arg]


def test_still_frozen_comparable_hashable_and_replaceable() -> None:
    q = Quick(1, "y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.a = 2  # type: ignore[misc]
    assert q == Quick(1, "y", d=9.0) and q != Quick(2, "y")  # d is not compared, as declared
    assert dataclasses.replace(q, a=5) == Quick(5, "y") and repr(q).startswith("Quick(a=1, b='y'")
    assert hash(Load(1, 2)) == hash(Load(1, 2))


def test_only_plain_frozen_dataclasses_are_accepted() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Posted:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclass(frozen=True)
    class Hidden:
        a: int
        b: int = field(default=0, init=False)

    for cls in (Mutable, Posted, Slotted, Hidden):
        with pytest.raises(TypeError):
            quick_init(cls)


@pytest.mark.parametrize("cls", [ParsedRequest, RouteRequest, RouteCost, Decision, TTFTTerms, Load, Leg, Booking,
                                 Snapshot])
def test_the_request_path_values_keep_their_fields(cls: type) -> None:
    # every field of the class set by the quick __init__, none more (what the generated one did)
    names = [f.name for f in dataclasses.fields(cls)]
    required = [f for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    value = cls(*[f"v{i}" for i in range(len(required))])
    assert list(vars(value)) == names
