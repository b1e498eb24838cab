"""The emulator's command-line flags, both ways: argv -> EmulatorConfig and back.

Why a module of its own: ``pd-router emulate`` parses them and the subprocess launcher
(``spawn_emulator``) renders a config into them; ``config_to_argv`` is the inverse of
``config_from_args``, so a config value starts an engine without a second source of truth,
and neither side has to import the other.
"""

from __future__ import annotations

import argparse

from router.tools.emulator.config import (
    FLAVORS,
    KV_DTYPES,
    PD_FALLBACKS,
    ROLES,
    EmulatorConfig,
    FaultConfig,
)
from router.tools.emulator.perf import PROFILES

_FAULT_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("error_rate", "--fault-error-rate", float, "fraction of requests answered 503"),
    ("stall_rate", "--fault-stall-rate", float,
     "fraction of requests that stall (default 1 if --fault-stall-seconds is given)"),
    ("stall_seconds", "--fault-stall-seconds", float,
     "stall length in seconds (<= 0: forever)"),
    ("die_after_tokens", "--fault-die-after-tokens", int,
     "drop the connection after N tokens (-1: never)"),
    ("slowdown", "--fault-slowdown", float, "multiply step durations"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = EmulatorConfig()
    a = parser.add_argument
    a("--host", default=d.host, help="bind address (default %(default)s)")
    a("--port", type=int, default=d.port, help="HTTP port; 0 picks a free one")
    a("--role", choices=ROLES, default=d.role)
    a("--flavor", choices=FLAVORS, default=d.flavor, help="which engine's API to mimic")
    a("--profile", choices=sorted(PROFILES), default=d.profile, help="performance model")
    a("--model", default=None, help="served model name (default emulated-<profile>)")
    a("--seed", type=int, default=d.seed)
    a("--time-scale", type=float, default=d.time_scale,
      help="wall seconds per model second (0.01 = 100x faster than real)")
    a("--cache-tokens", type=int, default=None, help="KV capacity in tokens")
    a("--block-size", type=int, default=d.block_size)
    a("--max-batched-tokens", type=int, default=None, help="per-step token budget")
    a("--max-num-seqs", type=int, default=d.max_num_seqs)
    a("--max-model-len", type=int, default=None)
    a("--default-max-tokens", type=int, default=d.default_max_tokens)
    a("--engine-id", default=None)
    a("--advertise-host", default=None, help="host PD peers should connect to")
    a("--bootstrap-port", type=int, default=d.bootstrap_port,
      help="SGLang prefill bootstrap port (0 picks a free one)")
    a("--bootstrap-timeout", type=float, default=d.bootstrap_timeout_s,
      help="seconds to wait for the PD partner")
    a("--kv-bandwidth-gbps", type=float, default=None, help="PD link Gbit/s")
    a("--kv-transfer-latency", type=float, default=d.kv_transfer_latency_s,
      help="fixed model seconds per KV transfer")
    a("--kv-dtype", choices=KV_DTYPES, default=d.kv_dtype,
      help="KV cache dtype: fp8 halves the bytes each KV transfer moves")
    a("--kv-transfer-interference", type=float, default=d.kv_transfer_interference,
      help="fraction by which steps slow while this engine's NIC moves KV")
    a("--overlap-chunk-tokens", type=int, default=None,
      help="SGLang: KV streams per prefill chunk of this many tokens (default max-batched-tokens)")
    a("--kv-hold-timeout", type=float, default=d.kv_hold_timeout_s,
      help="wall seconds a prefill keeps KV for its decode")
    a("--pd-fallback", choices=PD_FALLBACKS, default=d.pd_fallback,
      help="when remote KV is unavailable: fail (error) or prefill locally")
    a("--stats-history", type=int, default=d.stats_history)
    a("--kv-store-url", default=None, help="a shared KV store (python -m router.tools.emulator.store_server)")
    a("--kv-store-write-blocks", type=int, default=d.kv_store_write_blocks,
      help="a stream writes its generated blocks to the store every N blocks")
    a("--kv-events-endpoint", default=None,
      help="publish KV events on ZMQ (tcp://*:PORT binds, a named host connects)")
    a("--kv-events-topic", default=d.kv_events_topic)
    a("--kv-events-replay-endpoint", default=None, help="replay socket, e.g. tcp://*:0")
    a("--kv-events-positional", action="store_true", help="positional-array events (vLLM < 0.32)")
    for _field, flag, kind, text in _FAULT_FLAGS:
        a(flag, type=kind, default=None, help=text)
    a("--fault-crash-on-request", action="store_true", help="exit on the next request")
    a("--fault-unhealthy", action="store_true", help="answer /health with 503")
    a("--log-level", default="warning")


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    faults = FaultConfig(crash_on_request=args.fault_crash_on_request,
                         unhealthy=args.fault_unhealthy)
    for field, _flag, _kind, _text in _FAULT_FLAGS:
        value = getattr(args, "fault_" + field)
        if value is not None:
            setattr(faults, field, value)
    if args.fault_stall_seconds is not None and args.fault_stall_rate is None:
        faults.stall_rate = 1.0  # --fault-stall-seconds alone stalls every request
    return EmulatorConfig(
        flavor=args.flavor, role=args.role, profile=args.profile, model=args.model,
        host=args.host, port=args.port, advertise_host=args.advertise_host,
        engine_id=args.engine_id, seed=args.seed, time_scale=args.time_scale,
        cache_tokens=args.cache_tokens, block_size=args.block_size,
        max_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, default_max_tokens=args.default_max_tokens,
        kv_bandwidth_gbps=args.kv_bandwidth_gbps,
        kv_transfer_latency_s=args.kv_transfer_latency,
        kv_dtype=args.kv_dtype, kv_transfer_interference=args.kv_transfer_interference,
        overlap_chunk_tokens=args.overlap_chunk_tokens,
        kv_hold_timeout_s=args.kv_hold_timeout, pd_fallback=args.pd_fallback,
        bootstrap_port=args.bootstrap_port, bootstrap_timeout_s=args.bootstrap_timeout,
        stats_history=args.stats_history, kv_events_endpoint=args.kv_events_endpoint,
        kv_events_topic=args.kv_events_topic, kv_events_replay_endpoint=args.kv_events_replay_endpoint,
        kv_events_positional=args.kv_events_positional, kv_store_url=args.kv_store_url,
        kv_store_write_blocks=args.kv_store_write_blocks, faults=faults,
    )


def config_to_argv(config: EmulatorConfig) -> list[str]:
    """Command-line flags that rebuild ``config`` (inverse of config_from_args)."""
    c = config
    argv = ["--host", c.host, "--port", str(c.port), "--role", c.role,
            "--flavor", c.flavor, "--profile", c.profile, "--seed", str(c.seed),
            "--time-scale", repr(c.time_scale), "--block-size", str(c.block_size),
            "--max-num-seqs", str(c.max_num_seqs),
            "--default-max-tokens", str(c.default_max_tokens),
            "--bootstrap-port", str(c.bootstrap_port),
            "--bootstrap-timeout", repr(c.bootstrap_timeout_s),
            "--kv-transfer-latency", repr(c.kv_transfer_latency_s),
            "--kv-dtype", c.kv_dtype,
            "--kv-transfer-interference", repr(c.kv_transfer_interference),
            "--kv-hold-timeout", repr(c.kv_hold_timeout_s),
            "--pd-fallback", c.pd_fallback, "--stats-history", str(c.stats_history),
            "--kv-store-write-blocks", str(c.kv_store_write_blocks)]
    optional = (("--model", c.model), ("--engine-id", c.engine_id),
                ("--advertise-host", c.advertise_host), ("--cache-tokens", c.cache_tokens),
                ("--max-batched-tokens", c.max_batched_tokens),
                ("--max-model-len", c.max_model_len),
                ("--kv-bandwidth-gbps", c.kv_bandwidth_gbps),
                ("--kv-events-endpoint", c.kv_events_endpoint),
                ("--kv-events-replay-endpoint", c.kv_events_replay_endpoint),
                ("--overlap-chunk-tokens", c.overlap_chunk_tokens), ("--kv-store-url", c.kv_store_url))
    for flag, value in optional:
        if value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    f = c.faults
    for field, flag, _kind, _text in _FAULT_FLAGS:
        if getattr(f, field) != getattr(FaultConfig(), field) or (
                field == "stall_rate" and f.stall_seconds != 0):
            argv += [flag, repr(getattr(f, field))]
    if c.kv_events_topic:
        argv += ["--kv-events-topic", c.kv_events_topic]
    if c.kv_events_positional:
        argv.append("--kv-events-positional")
    if f.crash_on_request:
        argv.append("--fault-crash-on-request")
    if f.unhealthy:
        argv.append("--fault-unhealthy")
    return argv
