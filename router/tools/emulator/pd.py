"""Pick the PD leg a generation request plays on this engine.

vLLM flavour: ``kv_transfer_params`` decides (``do_remote_decode`` = prefill
leg, ``do_remote_prefill`` = decode leg). SGLang flavour: the engine's role
decides, and prefill/decode engines require the bootstrap fields, because a
real SGLang PD engine cannot serve a request without its partner.
"""

from __future__ import annotations

from typing import Protocol

from router.tools.emulator.openai_schema import GenerationRequest, bad_request
from router.tools.emulator.pd_common import Leg
from router.tools.emulator.pd_sglang import SglangDecodeLeg, SglangHost, SglangPrefillLeg
from router.tools.emulator.pd_vllm import VllmDecodeLeg, VllmHost, VllmPrefillLeg


class LegHost(SglangHost, VllmHost, Protocol):
    """An engine that can play any leg (the emulator's runtime)."""


def plan_leg(runtime: LegHost, request: GenerationRequest) -> Leg:
    config = runtime.config
    if config.flavor == "vllm":
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode"):
            return VllmPrefillLeg(runtime)
        if params.get("do_remote_prefill"):
            return VllmDecodeLeg(runtime, params)
        return Leg(runtime)
    if config.role == "mixed":
        return Leg(runtime)
    if request.bootstrap is None:
        raise bad_request(f"this SGLang {config.role} engine needs bootstrap_host, "
                          "bootstrap_port and bootstrap_room", "bootstrap_room")
    if config.role == "prefill":
        return SglangPrefillLeg(runtime, request.bootstrap)
    return SglangDecodeLeg(runtime, request.bootstrap)
