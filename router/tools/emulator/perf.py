"""Roofline performance model of one GPU engine step. Pure functions, no I/O.

Why a model at all: the emulator must produce plausible *relative* timings
(prefix hits shorten TTFT, queues lengthen it, big batches slow each decode
step, KV transfers cost bytes/bandwidth) so that routing decisions have
measurable consequences without a GPU.

The model. One engine step runs a batch made of prefill chunks (``n_new``
tokens on top of ``context`` already-cached tokens each) and decodes (one token
per running sequence). Its duration is

    t = overhead + max(t_compute, t_memory)

    t_compute = (2 * P * T  +  4 * L * H * d * A) / (F * mfu)
    t_memory  = (W  +  kv * R) / (B * mem_eff)

with P parameters, T tokens in the batch, L layers, H query heads, d head dim,
A the number of (query, key) pairs attended in the batch, F the peak dense
FLOP/s, W weight bytes, kv the KV bytes per token, R the KV tokens read or
written, B the HBM bandwidth. The linear layers cost 2 FLOPs per parameter
per token; attention costs QK^T plus AV = 4 FLOPs per (query, key, channel).
A prefill chunk of ``n`` tokens after ``c`` cached ones attends to
``n*c + n*(n+1)/2`` pairs, so a pure prefill is ``c0 + n*(a + b*context)``;
a decode step is memory-bound: the weights are read once per step and every
sequence's KV once per step, so it grows with batch size only through KV.

All numbers are per *engine* (for tensor parallelism the GPUs add up); the
efficiency factors absorb kernel efficiency and TP communication.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class ModelShape:
    """The few architecture numbers the roofline needs."""

    name: str
    params: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: layers x 2 x kv_heads x head_dim x bytes."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs for one query attending one key across all layers and heads."""
        return 4 * self.layers * self.heads * self.head_dim


@dataclass(frozen=True)
class Hardware:
    """An engine's accelerators (``num_gpus`` of one kind, tensor parallel)."""

    name: str
    num_gpus: int
    peak_flops: float
    """Dense bf16 FLOP/s per GPU."""
    hbm_bandwidth: float
    """HBM bytes/s per GPU."""
    hbm_bytes: float
    """HBM capacity per GPU."""


@dataclass(frozen=True)
class PerfProfile:
    """A named (model, hardware, efficiency) triple plus engine defaults."""

    name: str
    model: ModelShape
    hardware: Hardware
    mfu: float
    """Achieved fraction of peak FLOP/s on compute-bound steps."""
    mem_efficiency: float
    """Achieved fraction of HBM bandwidth on memory-bound steps."""
    step_overhead_s: float
    """Per-step fixed cost: scheduling, sampling, launches, TP syncs."""
    gpu_memory_utilization: float
    activation_reserve_bytes: float
    """Per-GPU memory kept for activations / CUDA graphs, not KV."""
    max_batched_tokens: int
    max_model_len: int
    link_gbps: float
    """Default PD link bandwidth (Gbit/s, effective) for KV transfers."""

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def effective_flops(self) -> float:
        return self.hardware.num_gpus * self.hardware.peak_flops * self.mfu

    @property
    def effective_bandwidth(self) -> float:
        return self.hardware.num_gpus * self.hardware.hbm_bandwidth * self.mem_efficiency

    @property
    def default_cache_tokens(self) -> int:
        """KV capacity the way vLLM sizes it: usable HBM minus weights minus reserve."""
        hw = self.hardware
        usable = hw.num_gpus * (hw.hbm_bytes * self.gpu_memory_utilization
                                - self.activation_reserve_bytes)
        return max(0, int((usable - self.model.weight_bytes) // self.kv_bytes_per_token))


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one engine step computes, aggregated over its batch."""

    prefill_tokens: int = 0
    """New prompt tokens computed this step (all chunks)."""
    prefill_pairs: int = 0
    """(query, key) pairs attended by those tokens."""
    prefill_context: int = 0
    """Already-cached context tokens whose KV the prefill chunks read."""
    decode_seqs: int = 0
    """Sequences generating one token this step."""
    decode_context: int = 0
    """Sum of the decode sequences' lengths (KV tokens read)."""


def attention_pairs(n_new: int, context: int) -> int:
    """(query, key) pairs of a causal chunk of ``n_new`` after ``context``."""
    return n_new * context + n_new * (n_new + 1) // 2


def step_time(profile: PerfProfile, shape: StepShape) -> float:
    """Model seconds for one step; 0 for an empty step."""
    tokens = shape.prefill_tokens + shape.decode_seqs
    if tokens == 0:
        return 0.0
    model = profile.model
    pairs = shape.prefill_pairs + shape.decode_context
    flops = 2.0 * model.params * tokens + model.attn_flops_per_pair * pairs
    kv_tokens = shape.prefill_tokens + shape.prefill_context + shape.decode_context
    nbytes = model.weight_bytes + model.kv_bytes_per_token * kv_tokens
    compute = flops / profile.effective_flops
    memory = nbytes / profile.effective_bandwidth
    return profile.step_overhead_s + max(compute, memory)


def prefill_time(profile: PerfProfile, n_new: int, context: int = 0) -> float:
    """Model seconds to prefill ``n_new`` tokens in one step after ``context``."""
    return step_time(profile, StepShape(
        prefill_tokens=n_new, prefill_pairs=attention_pairs(n_new, context),
        prefill_context=context))


def decode_step_time(profile: PerfProfile, batch: int, total_context: int) -> float:
    """Model seconds of a pure decode step of ``batch`` sequences."""
    return step_time(profile, StepShape(decode_seqs=batch, decode_context=total_context))


def kv_transfer_time(profile: PerfProfile, tokens: int, link_gbps: float | None = None,
                     latency_s: float = 0.0) -> float:
    """Model seconds to move ``tokens`` tokens of KV across the PD link."""
    if tokens <= 0:
        return 0.0
    gbps = link_gbps if link_gbps is not None else profile.link_gbps
    return latency_s + tokens * profile.kv_bytes_per_token * 8.0 / (gbps * 1e9)


# --- profiles -------------------------------------------------------------

H100_SXM = Hardware(name="H100-SXM-80GB", num_gpus=1, peak_flops=989.4e12,
                    hbm_bandwidth=3.35e12, hbm_bytes=80e9)
"""NVIDIA datasheet: 989.4 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB."""

LLAMA3_8B = ModelShape(name="Llama-3.1-8B", params=8.03e9, layers=32, heads=32,
                       kv_heads=8, head_dim=128)
"""GQA 32q/8kv heads x 128 -> KV = 32*2*8*128*2 B = 128 KiB per token."""

LLAMA3_70B = ModelShape(name="Llama-3.1-70B", params=70.6e9, layers=80, heads=64,
                        kv_heads=8, head_dim=128)
"""GQA 64q/8kv heads x 128 -> KV = 80*2*8*128*2 B = 320 KiB per token."""

LLAMA3_8B_H100 = PerfProfile(
    name="llama3-8b-h100", model=LLAMA3_8B, hardware=H100_SXM,
    mfu=0.45, mem_efficiency=0.85, step_overhead_s=0.001,
    gpu_memory_utilization=0.9, activation_reserve_bytes=4e9,
    max_batched_tokens=8192, max_model_len=131072, link_gbps=200.0)
"""Llama-3.1-8B BF16 on one H100 SXM.

* Compute: 45% MFU -> 445 TFLOP/s effective; a 2x8.03e9 FLOP/token linear
  cost gives ~28k prefill tokens/s at short context, in line with published
  vLLM prefill throughput for 8B on H100 (20-30k tok/s).
* Memory: 85% of 3.35 TB/s; 16.06 GB of weights -> 5.6 ms + 1 ms overhead
  = ~6.6 ms per decode step at batch 1 (~150 tok/s single stream).
* KV capacity: 0.9 x 80 GB - 16.06 GB weights - 4 GB activations
  = 51.9 GB / 128 KiB = ~396k tokens (~24.7k blocks of 16).
* PD link: one 400 Gb/s NIC at ~50% achieved -> 200 Gb/s.
"""

LLAMA3_70B_H100X4 = PerfProfile(
    name="llama3-70b-h100x4", model=LLAMA3_70B,
    hardware=Hardware(name="4x H100-SXM-80GB (TP4)", num_gpus=4,
                      peak_flops=H100_SXM.peak_flops,
                      hbm_bandwidth=H100_SXM.hbm_bandwidth, hbm_bytes=H100_SXM.hbm_bytes),
    mfu=0.35, mem_efficiency=0.75, step_overhead_s=0.0025,
    gpu_memory_utilization=0.9, activation_reserve_bytes=3e9,
    max_batched_tokens=8192, max_model_len=131072, link_gbps=800.0)
"""Llama-3.1-70B BF16, tensor parallel over 4 H100 SXM.

* Compute: 35% MFU (TP all-reduces eat into the 45% of one GPU)
  -> 1.39 PFLOP/s effective -> ~9.8k prefill tokens/s at short context.
* Memory: 75% of 4 x 3.35 TB/s; 141 GB of weights -> 14.0 ms + 2.5 ms
  overhead = ~16.5 ms per decode step at batch 1 (~60 tok/s).
* KV capacity: 4 x (0.9 x 80 GB - 3 GB) - 141.2 GB = 134.8 GB / 320 KiB
  = ~411k tokens.
* PD link: four 400 Gb/s NICs at ~50% achieved -> 800 Gb/s.
"""

PROFILES: Mapping[str, PerfProfile] = MappingProxyType({
    p.name: p for p in (LLAMA3_8B_H100, LLAMA3_70B_H100X4)
})
"""Read-only registry of the built-in profiles."""


def get_profile(name: str) -> PerfProfile:
    """Look up a profile by name; ValueError lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None
