"""What one attempt of a request comes to, and what the earlier attempts ruled out.

An attempt is either :class:`Served` (an answer for the client: relayed, or an engine's error
passed back) or :class:`Retry` (move elsewhere); a failure nothing else can fix is raised as
a RouterError. Typed so the retry loop reads what happened rather than decoding a ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.responses import Response

from router.core.errors import RouterError


@dataclass(frozen=True, slots=True)
class Served:
    response: Response


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again without ``exclude``. ``failure`` is what the client gets if no other attempt
    can be made (None: "no healthy instance"); ``local_only`` restricts the next attempts to
    instances that prefill themselves; ``prefill`` marks a failed prefill leg."""

    reason: str
    exclude: str
    failure: RouterError | None = None
    prefill: bool = False
    local_only: bool = False


AttemptOutcome = Served | Retry


@dataclass
class Tried:
    """What the attempts of one request so far ruled out."""

    exclude: set[str] = field(default_factory=set)
    candidates: int = 0  # instances able to answer in the last round
    prefill_failures: int = 0
    local_only: bool = False
    last: Retry | None = None
    disconnected: bool = False  # the client went away: the attempt in flight is cancelled

    def record(self, retry: Retry) -> None:
        self.exclude.add(retry.exclude)
        self.prefill_failures += retry.prefill
        self.local_only = self.local_only or retry.local_only
        self.last = retry

    def give_up(self, otherwise: RouterError) -> RouterError:
        """The error to answer once no attempt is left: the last failure's, else ``otherwise``."""
        if self.last is not None and self.last.failure is not None:
            return self.last.failure
        return otherwise
