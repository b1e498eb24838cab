"""``pd-router serve``: load the config, build the app, run it under uvicorn."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys

from router.config import ConfigError, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run the router")
    p.add_argument("--config", help="YAML config file (environment PD_ROUTER_* overrides it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"pd-router: {exc}", file=sys.stderr)
        return 2
    if not config.instances:
        print("pd-router: invalid configuration:\n  instances: at least one instance is required", file=sys.stderr)
        return 2
    import uvicorn

    from router.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(config),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        access_log=False,
    )
    return 0
