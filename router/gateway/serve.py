"""``pd-router serve``: load the config, build the app, run it under uvicorn."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys

from router.config.model import ConfigError, load_config
from router.scheduling import check_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run the router")
    p.add_argument("--config", help="YAML config file (environment PD_ROUTER_* overrides it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes (> 1 needs state.backend: redis, so that they share one view)")
    p.set_defaults(func=serve)


# How ``serve --workers N`` tells its worker processes where the config is (not a config field).
_CONFIG_ENV = "PDR_SERVE_CONFIG"


def app_factory():  # type: ignore[no-untyped-def]
    """Builds the app in a worker process started by ``serve --workers N``."""
    from router.gateway.app import create_app

    return create_app(load_config(os.environ.get(_CONFIG_ENV) or None))


def serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        check_config(config)  # plugin names and parameters, against the registry
    except ConfigError as exc:
        print(f"pd-router: {exc}", file=sys.stderr)
        return 2
    if not config.instances:
        print("pd-router: invalid configuration:\n  instances: at least one instance is required", file=sys.stderr)
        return 2
    if args.workers < 1 or (args.workers > 1 and config.state.backend != "redis"):
        print("pd-router: --workers N > 1 needs state.backend: redis: worker processes must share booked load "
              "and residency, or each would route blind to the others", file=sys.stderr)
        return 2
    import uvicorn

    from router.gateway.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every upstream request at INFO; the router's own per-request line says more.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.workers > 1:
        # Python serves one core per process: more workers, one shared Redis view.
        os.environ[_CONFIG_ENV] = os.path.abspath(args.config) if args.config else ""
        target: object = "router.gateway.serve:app_factory"
    else:
        target = create_app(config)
    uvicorn.run(
        target,  # type: ignore[arg-type]
        factory=args.workers > 1,
        workers=args.workers if args.workers > 1 else None,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        access_log=False,
    )
    return 0
