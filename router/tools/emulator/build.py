"""Build the engine parts an EmulatorConfig describes.

One place turns a config into (profile, engine limits, tokenizer, sampler,
engine), so the HTTP server, the demo and the virtual-time replay construct
byte-for-byte the same engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.engine import Engine, EngineConfig
from router.tools.emulator.perf import PerfProfile, get_profile
from router.tools.emulator.sampler import OutputSampler
from router.tools.emulator.tokenizer import Tokenizer


@dataclass
class EngineParts:
    """What a driver needs besides the engine itself."""

    profile: PerfProfile
    engine: Engine
    tokenizer: Tokenizer
    sampler: OutputSampler
    max_model_len: int
    kv_bandwidth_gbps: float


def engine_config(config: EmulatorConfig, profile: PerfProfile) -> EngineConfig:
    """Scheduler limits from the config, falling back to the profile's defaults."""
    cache_tokens = config.cache_tokens if config.cache_tokens is not None \
        else profile.default_cache_tokens
    return EngineConfig(
        num_blocks=max(1, cache_tokens // config.block_size),
        block_size=config.block_size,
        max_batched_tokens=config.max_batched_tokens or profile.max_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        hash_salt=config.served_model,
        time_multiplier=config.faults.slowdown,
    )


def build_engine(config: EmulatorConfig) -> EngineParts:
    """Validate ``config`` and construct its engine and helpers."""
    config.validate()
    profile = get_profile(config.profile)
    tokenizer = Tokenizer()
    sampler = OutputSampler(tokenizer, config.seed)
    engine = Engine(engine_config(config, profile), profile, sampler.token)
    return EngineParts(
        profile=profile,
        engine=engine,
        tokenizer=tokenizer,
        sampler=sampler,
        max_model_len=config.max_model_len or profile.max_model_len,
        kv_bandwidth_gbps=config.kv_bandwidth_gbps or profile.link_gbps,
    )
