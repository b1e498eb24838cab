"""Load/metrics endpoints routers poll, in each engine flavour's shape.

vLLM: Prometheus ``/metrics`` with ``vllm:`` names. SGLang: ``sglang:``
metrics plus the JSON ``/server_info``, ``/model_info`` and ``/get_load``.
``/model_info`` and ``/server_info`` deliberately omit ``model_path`` and
``tokenizer_path``: peers that see them try to download a tokenizer.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router import __version__
from router.tools.emulator.metrics import CONTENT_TYPE
from router.tools.emulator.runtime import EmulatorRuntime


def _runtime(request: Request) -> EmulatorRuntime:
    runtime: EmulatorRuntime = request.app.state.runtime
    return runtime


async def metrics(request: Request) -> Response:
    return Response(_runtime(request).metrics.render(), media_type=CONTENT_TYPE)


def _load(rt: EmulatorRuntime) -> dict[str, int]:
    e = rt.engine
    used = e.kv.used_blocks * e.kv.block_size
    return {"dp_rank": 0, "num_reqs": e.num_running + e.num_waiting,
            "num_waiting_reqs": e.num_waiting, "num_tokens": used + e.waiting_tokens()}


async def get_load(request: Request) -> Response:
    """SGLang: one object per data-parallel rank (the emulator has one)."""
    return JSONResponse([_load(_runtime(request))])


async def model_info(request: Request) -> Response:
    rt = _runtime(request)
    return JSONResponse({"is_generation": True, "served_model_name": rt.model,
                         "preferred_sampling_params": None, "weight_version": "default",
                         "has_image_understanding": False,
                         "has_audio_understanding": False})


async def server_info(request: Request) -> Response:
    rt = _runtime(request)
    cfg = rt.config
    e = rt.engine
    mode = "null" if cfg.role == "mixed" else cfg.role
    return JSONResponse({
        "served_model_name": rt.model,
        "version": f"emulator-{__version__}",
        "host": cfg.host,
        "port": cfg.port,
        "disaggregation_mode": mode,
        "disaggregation_bootstrap_port": rt.bootstrap_port or cfg.bootstrap_port,
        "disaggregation_transfer_backend": "emulator",
        "page_size": e.kv.block_size,
        "max_total_num_tokens": e.kv.num_blocks * e.kv.block_size,
        "kv_cache_dtype": "auto",
        "chunked_prefill_size": e.config.max_batched_tokens,
        "max_running_requests": e.config.max_num_seqs,
        "context_length": rt.max_model_len,
        "tp_size": rt.profile.hardware.num_gpus,
        "dp_size": 1,
        "enable_prefix_caching": True,
        "emulator": {"engine_id": rt.engine_id, "profile": rt.profile.name},
        "internal_states": [{**_load(rt), "last_gen_throughput": 0.0}],
    })


def routes(flavor: str) -> list[Route]:
    out = [Route("/metrics", metrics, methods=["GET"])]
    if flavor == "sglang":
        out += [
            Route("/get_load", get_load, methods=["GET"]),
            Route("/server_info", server_info, methods=["GET"]),
            Route("/get_server_info", server_info, methods=["GET"]),
            Route("/model_info", model_info, methods=["GET"]),
            Route("/get_model_info", model_info, methods=["GET"]),
            Route("/health_generate", _health_generate, methods=["GET"]),
        ]
    return out


async def _health_generate(request: Request) -> Response:
    rt = _runtime(request)
    return Response(status_code=503 if rt.faults.config.unhealthy else 200)
