"""How the router prices and books the KV handoff between prefill and decode instances.

Kept apart from the PD pairing knobs because each field is one axis of the handoff:
overlap (what of the transfer hides behind the prefill), isolation (booking bytes per
link so transfers do not saturate a NIC the decode steps share, and how much of the
decode TBT tail prefills on decode instances may spend: ``tbt_objective``). (Compression
needs no knob: bytes per token follow each instance's kv_dtype.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TBTObjective(BaseModel):
    """pd.handoff.tbt_objective: the decode TBT the service promises, as a quantile over a
    window. With isolation ``objective`` it sets how many decode steps prefills on decode
    instances may stall: a share 1 - quantile of the steps in the window."""

    model_config = ConfigDict(extra="forbid")

    quantile: float = Field(default=0.99, ge=0.5, lt=1.0, description="the TBT quantile the objective bounds: "
                            "at most 1 - quantile of the decode steps (one per running decode per engine step) "
                            "in a window may last longer than target_s")
    target_s: float | None = Field(default=None, gt=0, description="the time between tokens that quantile must "
                                   "stay under; None = pd.tbt_target_s")
    window_s: float = Field(default=10.0, gt=0, description="seconds the share is counted over: stalls the router "
                            "booked in the last window_s against the decode steps the pool makes in window_s at "
                            "its current rate (per router process)")
    max_entries: int = Field(default=4096, ge=1, description="bound on the stalls remembered within the window "
                             "(the oldest forgotten first)")


class HandoffConfig(BaseModel):
    """pd.handoff: how the KV transfer of a (P, D) pair is priced and booked."""

    model_config = ConfigDict(extra="forbid")

    overlap_chunk_tokens: int = Field(default=8192, ge=1, description="SGLang streams KV per prefill chunk of this "
                                      "many tokens, so only the last chunk's transfer adds to TTFT (vLLM pulls after the prefill)")
    transfer_interference: float = Field(default=0.1, ge=0, description="engine steps slow by this fraction while "
                                         "the engine's NIC moves KV (an assumption until measured, as in the emulator): "
                                         "SGLang prefill instances stream KV through their prefill, so their queue and "
                                         "prefill are priced this much slower")
    link_aware: bool = Field(default=False, description="isolation: book KV bytes in flight per instance NIC and price "
                             "waiting for them, and (isolation: auto) let a decode instance with decodes running "
                             "take at most one prefill at a time whose chunks would stall them past pd.tbt_target_s")
    isolation: Literal["auto", "off", "strict", "budget", "objective"] = Field(
        default="auto", description="which prefills a decode instance with decodes running may take alone when "
        "selective disaggregation sends them there: off = any; strict = none whose chunk plus a decode step would "
        "pass pd.tbt_target_s; budget = such a prefill only while none is queued there already, so its decodes "
        "see one stalled run at a time; objective = such a prefill only while the decode steps it stalls, with "
        "those stalled in the window already, stay within the share tbt_objective allows and the TTFT it saves "
        "pays for them (a price per stalled step rising with the share in use); auto = budget with link_aware, "
        "off without")
    tbt_objective: TBTObjective = Field(default_factory=TBTObjective, description="the decode TBT quantile, "
                                        "target and window that isolation objective spends")
    nic_gbps: float | None = Field(default=None, gt=0, description="each instance's NIC, Gbit/s; None = the topology link")
    max_link_backlog_s: float = Field(default=0.05, ge=0, description="with link_aware: pairs whose NIC (either end) "
                                      "already has more booked bytes than this many seconds of its bandwidth are "
                                      "avoided while another pair is under it (bandwidth reservation)")
