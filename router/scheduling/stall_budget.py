"""Isolation by a TBT objective: how much of the decode tail prefills on decode instances may spend.

The objective (pd.handoff.tbt_objective) is a quantile q of the time between tokens, a
target and a window: at most a share 1 - q of the decode steps made in the window may
last longer than the target. A decode step here is what a TBT histogram counts: one per
running decode per engine step. A prefill that selective disaggregation sends to a decode
instance runs its chunks in the steps of the decodes running there; each chunk whose
compute plus a decode step passes the target is one stalled step for each of them, and so
is the step its first tokens share with the prefill queued there when they tip it past the
target (the engine packs queued prefill into its steps). So the router can price a
candidate's stall (stalled steps x the decodes booked on the instance) and
count what it has spent: the stalls it booked in the last window. It can also estimate the
window's denominator from what it books: the pool makes sum(decodes_d / step_d) decode
steps a second. A stalling prefill is admitted only while the spent stalls plus its own
stay within (1 - q) x that rate x window, and only when the TTFT it saves against the best
pair pays for its stalled steps at a price that rises with the share in use (``worth``): the
router spends the tail it is allowed, on the routes that buy more TTFT per stalled step as
the share runs out, and no more.

The ledger is per router process (each replica spends its own share) and bounded
(``max_entries``, oldest first; entries older than the window are dropped). A request
decided again (a revised decision) replaces its own entry, so it is never counted twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from router.config.handoff import TBTObjective
from router.config.model import PDConfig, TTFTWeights
from router.scheduling.cost import prefill_seconds
from router.scheduling.framework import RouteRequest, View
from router.scheduling.pd_cost import decode_step_seconds


def stall_steps(req: RouteRequest, d: View, weights: TTFTWeights, pd: PDConfig, target_s: float) -> float:
    """Decode steps the prefill of ``req`` on ``d`` would stall, each counted as the decodes
    booked there now (those whose KV is still on its way included: they decode by the time
    the queue ahead drains).

    The engine packs waiting prefill first come first served into steps of
    ``overlap_chunk_tokens`` (its step budget) beside the decodes, so the prompt's tokens
    first fill the step the prefill queued on ``d`` leaves part-empty: that step stalls
    because of us when it passes ``target_s`` with our tokens and not without (short
    prompts stall decodes this way, packed together). Then each chunk of its own stalls
    when its compute (its attention over the context before it, the request overhead once,
    plus a decode step) passes ``target_s``. 0 on an instance with no decodes.

    Not counted: decodes that will join meanwhile. Extrapolating the pool's net growth
    (tried) priced the ramp before a burst into an instance the router then stops feeding
    (24x48K 2P+4D: 4-5 decodes held per stalled step, priced 11), and under-spent the share."""
    decodes = d.load.requests
    if decodes <= 0:
        return 0.0
    prompt = req.prompt_tokens
    done = d.cached_tokens(req)
    if done >= prompt:
        return 0.0
    rate = d.candidate.prefill_tokens_per_s or weights.prefill_tokens_per_s
    chunk = pd.handoff.overlap_chunk_tokens
    step = decode_step_seconds(d, pd, measured=False)  # the chunks' stalls are priced here, not in the step
    overhead = weights.request_overhead_s
    stalled = 0
    tail = d.load.prefill_tokens % chunk
    if tail:  # share the queue's last step
        size = min(prompt - done, chunk - tail)
        alone = overhead + tail / rate + step
        packed = alone + prefill_seconds(size, done + size, rate, weights) - overhead
        stalled += packed > target_s >= alone
        done += size
    # the costliest chunk of our own: a whole one, with the whole prompt before it
    if done >= prompt or prefill_seconds(min(chunk, prompt - done), prompt, rate, weights) + step <= target_s:
        return float(stalled * decodes)
    first = True
    while done < prompt:
        size = min(chunk, prompt - done)
        done += size
        stalled += prefill_seconds(size, done, rate, weights) - (0.0 if first else overhead) + step > target_s
        first = False
    return float(stalled * decodes)


def decode_steps_per_s(decodes: Sequence[View], pd: PDConfig) -> float:
    """Decode steps (one per running decode per engine step) the pool makes per second at its
    booked load (a decode step priced at 0 s counts as 1 us: a pool that steps for free has
    an unbounded share to spend)."""
    return sum(d.load.requests / max(decode_step_seconds(d, pd, measured=False), 1e-6) for d in decodes if d.load.requests > 0)


class StallLedger:
    """The stalls booked in the last ``window_s`` (request id -> (when, decode steps)), oldest first."""

    def __init__(self, window_s: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._window = window_s
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._total = 0.0

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            rid, (at, steps) = next(iter(entries.items()))
            if now - at <= self._window and len(entries) <= self._max:
                break
            del entries[rid]
            self._total -= steps
        if not entries:
            self._total = 0.0  # no float drift survives an empty window

    def spent(self) -> float:
        """Decode steps stalled by what was booked within the window."""
        self._expire(self._clock())
        return self._total

    def book(self, request_id: str, steps: float) -> None:
        """Record the stall of ``request_id``'s route (replacing any earlier decision for it)."""
        self.forget(request_id)
        if steps <= 0:
            return
        self._entries[request_id] = (self._clock(), steps)
        self._total += steps
        self._expire(self._clock())

    def forget(self, request_id: str) -> None:
        old = self._entries.pop(request_id, None)
        if old is not None:
            self._total -= old[1]

    def __len__(self) -> int:
        return len(self._entries)


class StallBudget:
    """The objective applied to one decision: which decode-alone routes it may take, and
    what the chosen one spends (``routes`` prices, ``settle`` books)."""

    def __init__(self, objective: TBTObjective, weights: TTFTWeights, pd: PDConfig, clock: Callable[[], float]) -> None:
        self._share = 1.0 - objective.quantile
        self._target = objective.target_s if objective.target_s is not None else pd.tbt_target_s
        self._window = objective.window_s
        self._w = weights
        self._pd = pd
        self.ledger = StallLedger(objective.window_s, objective.max_entries, clock)

    def allowance(self, decodes: Sequence[View]) -> float:
        """Decode steps still free to stall in the window: (1 - q) x the pool's decode steps
        in a window at its current rate, less what the window has spent."""
        return self._share * decode_steps_per_s(decodes, self._pd) * self._window - self.ledger.spent()

    def worth(self, stall: float, allowance: float, saved_s: float) -> bool:
        """Whether a route stalling ``stall`` decode steps is worth the TTFT it saves
        (``saved_s``, against the best pair), with ``allowance`` steps left in the window.
        The share is scarce: spent first come first served, long prompts early in a burst
        would use it up and leave the prompts that save most per stalled step (short ones,
        queued behind the burst on the prefill pool) to pay seconds of TTFT. So a stalled
        step has a price that rises with the share in use once this one is booked, z: free
        while the window is empty, ``target_s`` of TTFT per stalled step at half, unbounded at
        the whole (the hard cap). The unit is the objective's own: a stalled step delays a
        token by at least the target."""
        cap = allowance + self.ledger.spent()
        if stall > allowance or cap <= 0:
            return False
        z = 1.0 - (allowance - stall) / cap
        return z < 1.0 and saved_s >= self._target * z / (1.0 - z) * stall

    def price(self, req: RouteRequest, d: View) -> float:
        """Decode steps the prefill of ``req`` on ``d`` would stall."""
        return stall_steps(req, d, self._w, self._pd, self._target)
