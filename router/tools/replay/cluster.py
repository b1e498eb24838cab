"""The emulated cluster of a replay: engines built exactly as the HTTP emulator builds
them, and the ``Candidate`` facts the router would be configured with for each.

What the router is told is configuration, not tuning (and with ``told=False`` only what
a router given nothing but URLs learns by itself: each engine's cache size, which the live
router reads from the engine's ``vllm:cache_config_info`` (router/engines), and a prefill
rate that starts at the config default and is calibrated from measured TTFTs, as the live
router's calibration hook does (sim.py); ``router_cache_tokens`` still overrides the
size, to model a router told a wrong one): each candidate's cache size is its
engine's, its prefill rate and the TTFT model's attention and step terms are fitted to the
profile (``router.tools.localrun.profile_timing``, as for live emulated runs), its KV bytes per
token the model's at the cluster's KV dtype, and the PD links the replay's. Every instance is
its own node with one NIC of ``link_gbps``; instances are dealt round-robin over ``zones``
zones, and a transfer between zones also crosses both zones' uplinks (``uplink_gbps``).
Transfers share those links (router.tools.emulator.links).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.config.handoff import HandoffConfig
from router.config.kvstore import KVStoreConfig
from router.config.model import LinkConfig, PDConfig
from router.tools.emulator.build import engine_config
from router.tools.emulator.config import EmulatorConfig, FaultConfig
from router.tools.emulator.engine import Engine
from router.tools.emulator.perf import PerfProfile, get_profile
from router.tools.localrun import profile_timing
from router.core.instances import Candidate

ZONE = "replay"


@dataclass(frozen=True)
class ClusterSpec:
    prefill: int = 0
    decode: int = 0
    mixed: int = 0
    profile: str = "llama3-8b-h100"
    cache_tokens: int | None = None  # per engine; None = what the profile's HBM leaves
    link_gbps: float | None = None  # P -> D KV link; None = the profile's
    transfer_latency_s: float = 0.0005  # fixed cost per transfer (the emulator's default)
    max_num_seqs: int = 256
    router_cache_tokens: int | None = None  # the cache size the router is told; None = the engines' real one
    slowdown: float = 1.0  # every engine step takes this many times the profile's time (the emulator's fault)
    told: bool = True  # the router is told each engine's rates; False = defaults, calibrated (cache size: engine facts)
    flavor: str = "vllm"  # the PD protocol: vllm pulls after prefill, sglang streams during it
    kv_dtype: str = "auto"  # "fp8" halves the KV bytes per token
    transfer_interference: float = 0.1  # steps slow by this fraction while the engine's NIC moves KV
    zones: int = 1
    uplink_gbps: float | None = None  # per zone; None = 4 NICs' worth
    link_aware: bool = False  # the router books bytes in flight per link (pd.handoff.link_aware)
    isolation: str = "auto"  # which prefills a busy decode instance may take alone (pd.handoff.isolation)
    store_tokens: int | None = None  # a KV store every engine shares, of this many tokens; None = no store
    store_gbps: float = 100.0  # the store's read bandwidth, shared by concurrent loads
    store_aware: bool = True  # the router is told of the store (kv_store.enabled) and prices loads from it
    prefill_chunk_tokens: int = 0  # the engines' step budget the router is told (policy.ttft.prefill_chunk_tokens)
    max_batched_tokens: int | None = None  # the engines' step budget; None = the profile's
    decode_step_measured: bool = True  # the router reads each engine's inter-token latency (engines.decode_step)
    decode_steps_told: bool = True  # PD: the router is told the engines' decode step model; False = the config's
    # decode instances d0, d1, ... step this many times slower again (older GPUs, a degraded instance); never told
    decode_slowdowns: tuple[float, ...] = ()
    tbt_target_s: float | None = None  # pd.tbt_target_s the router is given; None = the config's default

    def __post_init__(self) -> None:
        if min(self.prefill, self.decode, self.mixed) < 0:
            raise ValueError("instance counts must be >= 0")
        if self.zones < 1:
            raise ValueError("zones must be >= 1")
        if self.decode + self.mixed == 0:
            raise ValueError("need at least one decode or mixed instance to answer requests")
        if self.slowdown <= 0:
            raise ValueError("slowdown must be > 0")
        if any(not s > 0 for s in self.decode_slowdowns):
            raise ValueError("decode_slowdowns must be > 0")
        if self.store_tokens is not None and (self.store_tokens < 16 or self.store_gbps <= 0):
            raise ValueError("a store needs at least one block and a bandwidth > 0")

    @property
    def disaggregated(self) -> bool:
        """A prefill pool exists, so the router runs its PD policies (as live)."""
        return self.prefill > 0

    def emulator_config(self) -> EmulatorConfig:
        return EmulatorConfig(profile=self.profile, cache_tokens=self.cache_tokens, max_num_seqs=self.max_num_seqs,
                              faults=FaultConfig(slowdown=self.slowdown), max_batched_tokens=self.max_batched_tokens,
                              flavor=self.flavor, kv_dtype=self.kv_dtype,  # type: ignore[arg-type]
                              kv_transfer_interference=self.transfer_interference)

    def kv_bytes_per_token(self) -> int:
        return self.emulator_config().kv_bytes_per_token(self.perf().kv_bytes_per_token)

    def kv_store_config(self) -> KVStoreConfig:
        """What the router is told of the store (disabled when there is none or it is not told)."""
        if self.store_tokens is None or not self.store_aware:
            return KVStoreConfig()
        return KVStoreConfig(enabled=True, bandwidth_gbps=self.store_gbps, capacity_tokens=self.store_tokens,
                             bytes_per_token=self.kv_bytes_per_token(), setup_s=self.transfer_latency_s)

    def uplink(self) -> float:
        return self.uplink_gbps if self.uplink_gbps is not None else 4 * self.link()

    def zone_of(self, index: int) -> str:
        return f"{ZONE}{index % self.zones}" if self.zones > 1 else ZONE

    def step_budget(self) -> int:
        """The engines' prefill tokens per step (chunked prefill; SGLang's KV chunk)."""
        return self.max_batched_tokens or self.perf().max_batched_tokens

    def perf(self) -> PerfProfile:
        return get_profile(self.profile)

    def link(self) -> float:
        return self.link_gbps if self.link_gbps is not None else self.perf().link_gbps

    def ttft_weights(self) -> dict[str, float]:
        """The router's colocated TTFT model fitted to the profile (as for live emulated runs);
        empty (the config's defaults) when the router is not told the engines' facts."""
        if not self.told:
            return {}
        t = profile_timing(self.perf(), self.slowdown)
        return {"prefill_tokens_per_s": t["prefill_tokens_per_s"], "attention_s_per_token2": t["attention_s_per_token2"],
                "request_overhead_s": t["request_overhead_s"], "decode_interference_s": t["decode_step_per_request_s"],
                "prefill_chunk_tokens": self.prefill_chunk_tokens,
                "decode_step_s": t["decode_step_base_s"]}

    def pd_config(self) -> PDConfig:
        """The router's PD settings describing this cluster (its link, KV size, decode steps)."""
        link = self.link()
        t = profile_timing(self.perf(), self.slowdown)
        if not self.decode_steps_told:
            default = PDConfig()
            t = {**t, "decode_step_base_s": default.decode_step_base_s,
                 "decode_step_per_request_s": default.decode_step_per_request_s,
                 "decode_step_per_kv_token_s": default.decode_step_per_kv_token_s}
        emu = self.emulator_config()
        return PDConfig(
            kv_bytes_per_token=self.kv_bytes_per_token(),
            links=LinkConfig(same_node_gbps=link, same_zone_gbps=link, cross_zone_gbps=min(link, self.uplink()),
                             setup_s=self.transfer_latency_s),
            handoff=HandoffConfig(overlap_chunk_tokens=emu.overlap_chunk_tokens or self.step_budget(),
                                  link_aware=self.link_aware, nic_gbps=link,
                                  isolation=self.isolation,  # type: ignore[arg-type]
                                  transfer_interference=self.transfer_interference),
            decode_step_base_s=t["decode_step_base_s"],
            decode_step_per_request_s=t["decode_step_per_request_s"],
            decode_step_per_kv_token_s=t["decode_step_per_kv_token_s"],
            tbt_target_s=self.tbt_target_s if self.tbt_target_s is not None else PDConfig().tbt_target_s,
        )


@dataclass(eq=False)
class Node:
    """One emulated instance: its engine, what the router knows of it, and whether a step
    is in flight (an engine runs one step at a time)."""

    index: int
    candidate: Candidate
    engine: Engine
    busy: bool = False
    kick_pending: bool = False

    @property
    def id(self) -> str:
        return self.candidate.id


def build_cluster(spec: ClusterSpec) -> list[Node]:
    """Prefill instances first (p0..), then decode (d0..), then mixed (m0..)."""
    profile = spec.perf()
    emu = spec.emulator_config()
    emu.validate()
    config = engine_config(emu, profile)
    rate = profile_timing(profile, spec.slowdown)["prefill_tokens_per_s"]  # linear part; attention is its own term
    compat = (emu.served_model, emu.kv_dtype, config.block_size, emu.flavor)
    nodes: list[Node] = []
    for role, prefix, count in (("prefill", "p", spec.prefill), ("decode", "d", spec.decode), ("mixed", "m", spec.mixed)):
        for i in range(count):
            candidate = Candidate(
                id=f"{prefix}{i}",
                cache_tokens=spec.router_cache_tokens or config.num_blocks * config.block_size,  # engine facts
                prefill_tokens_per_s=rate if spec.told else None,  # None: the default, calibrated
                role=role,
                compat=compat,
                node=f"n{len(nodes)}",
                zone=spec.zone_of(len(nodes)),
                kv_bytes_per_token=spec.kv_bytes_per_token(),
                standalone=not (emu.flavor == "sglang" and role == "decode"),
            )
            engine = Engine(config, profile)
            if role == "decode" and i < len(spec.decode_slowdowns):
                engine.time_multiplier *= spec.decode_slowdowns[i]
            nodes.append(Node(len(nodes), candidate, engine))
    return nodes
