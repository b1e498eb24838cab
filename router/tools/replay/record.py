"""What a replay observes, kept as flat numbers so a 12k-request run stays small.

Per request: arrival, client first token, finish, prompt / cached / moved tokens, mode
and placement. Per instance: prefill tokens computed per time bucket. Per cluster: the
time-between-tokens distribution as a histogram of decode step durations weighted by the
sequences they advanced: an engine with running requests steps back to back, so every
decode token's gap since the previous token of its request is exactly the duration of
the step that produced it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from router.tools.emulator.perf import StepShape
from router.scheduling.framework import Decision

TBT_BIN_S = 1e-5


@dataclass
class Recorder:
    n: int
    node_ids: list[str]
    bucket_s: float
    arrival: list[float] = field(init=False)
    first_token: list[float] = field(init=False)
    finish: list[float] = field(init=False)
    prompt: list[int] = field(init=False)
    cached: list[int] = field(init=False)  # prompt tokens the prefilling engine served from its cache
    loaded: list[int] = field(init=False)  # prompt tokens it loaded from the shared KV store
    predicted: list[int] = field(init=False)  # prompt tokens the router's residency said it held there
    moved: list[int] = field(init=False)  # KV tokens sent P -> D
    output: list[int] = field(init=False)
    mode: list[str] = field(init=False)
    instance: list[str] = field(init=False)
    prefill: list[str | None] = field(init=False)
    estimate: list[float] = field(init=False)  # the policy's predicted TTFT, NaN when it has none
    transfer_estimate: list[float] = field(init=False)  # the route's priced transfer term (PD), NaN otherwise
    handoff: list[float] = field(init=False)  # measured: prefill finished -> KV arrived on D (PD), NaN otherwise
    # PD only, by term (loadtests/estimate_terms.py): the priced terms of the chosen route and the instants
    # that measure them: P first schedules the request, P finishes its prefill, the KV is on D, D schedules it
    priced: dict[int, tuple[float, float, float, float, float]] = field(default_factory=dict)
    milestones: dict[int, list[float]] = field(default_factory=dict)
    finishes: list[int] = field(init=False)  # times each request finished (must end at 1)
    rejected: list[int] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    tbt_hist: Counter[int] = field(default_factory=Counter)
    prefill_series: list[defaultdict[int, int]] = field(init=False)  # per node: bucket -> tokens
    hit_series: defaultdict[int, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    steps: int = 0

    def __post_init__(self) -> None:
        nan = math.nan
        self.arrival = [nan] * self.n
        self.first_token = [nan] * self.n
        self.finish = [nan] * self.n
        self.prompt = [0] * self.n
        self.cached = [0] * self.n
        self.loaded = [0] * self.n
        self.predicted = [0] * self.n
        self.moved = [0] * self.n
        self.output = [0] * self.n
        self.mode = [""] * self.n
        self.instance = [""] * self.n
        self.prefill = [None] * self.n
        self.estimate = [nan] * self.n
        self.transfer_estimate = [nan] * self.n
        self.handoff = [nan] * self.n
        self.finishes = [0] * self.n
        self.prefill_series = [defaultdict(int) for _ in self.node_ids]

    def routed(self, i: int, arrival: float, prompt: int, output: int, decision: Decision, predicted: int = 0) -> None:
        self.arrival[i], self.prompt[i], self.output[i] = arrival, prompt, output
        self.predicted[i] = predicted
        self.mode[i], self.instance[i], self.prefill[i] = decision.mode, decision.instance, decision.prefill
        if decision.estimate_s is not None:
            self.estimate[i] = decision.estimate_s
        if decision.prefill is not None:
            terms = decision.terms.get(f"{decision.instance}<-{decision.prefill}")
            if terms is not None and "transfer_s" in terms:
                self.transfer_estimate[i] = terms["transfer_s"]
                self.priced[i] = (terms["queue_s"], terms["prefill_s"], terms["transfer_s"], terms["admission_s"],
                                  terms["decode_step_s"])
        self.reasons[decision.reason] += 1

    def prefilled(self, i: int, cached: int, loaded: int = 0) -> None:
        """The prefilling engine admitted the request with ``cached`` tokens from its cache
        and ``loaded`` from the shared store (both count as hits: neither is computed)."""
        self.cached[i] = cached
        self.loaded[i] = loaded
        bucket = self.hit_series[int(self.arrival[i] // self.bucket_s)]
        bucket[0] += cached + loaded
        bucket[1] += self.prompt[i]

    def milestone(self, i: int, which: int, t: float) -> None:
        """A PD request's ``which``-th instant (0: P schedules it, 1: P's prefill ends, 2: KV on D,
        3: D schedules it); NaN until seen."""
        self.milestones.setdefault(i, [math.nan] * 4)[which] = t

    def step(self, node: int, now: float, duration: float, shape: StepShape) -> None:
        self.steps += 1
        if shape.decode_seqs:
            self.tbt_hist[round(duration / TBT_BIN_S)] += shape.decode_seqs
        if shape.prefill_tokens:
            self.prefill_series[node][int(now // self.bucket_s)] += shape.prefill_tokens

    def check_conservation(self) -> None:
        """Every arrival finished exactly once or was rejected; raise otherwise."""
        rejected = set(self.rejected)
        bad = [i for i, count in enumerate(self.finishes) if count != (0 if i in rejected else 1)]
        if bad:
            i = bad[0]
            raise AssertionError(f"{len(bad)} requests not finished exactly once, e.g. r{i} finished {self.finishes[i]} times")
