"""``pd-router serve``: load the config, build the app, run it under uvicorn.

The router starts with no instance at all (discovery on, or nothing yet): ``/ready``
answers 503 until one can take requests. SIGHUP reloads the config file instead of
ending the process; with ``--workers N`` uvicorn's supervisor answers SIGHUP by replacing
the workers one by one, each of which loads the file afresh."""

from __future__ import annotations

import argparse
import importlib.util
import logging.config
import os
import sys

from router.config.model import ConfigError, RouterConfig, load_config
from router.core.exposition import prepare_multiprocess_dir
from router.core.logs import LOG_FORMATS, logging_config
from router.gateway.auth import load_keys
from router.kvevents import uses_bind
from router.scheduling import check_config


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("serve", help="run the router")
    p.add_argument("--config", help="YAML config file (environment PD_ROUTER_* overrides it)")
    p.add_argument("--host", default=os.environ.get("PDR_HOST", "127.0.0.1"), help="default $PDR_HOST or 127.0.0.1")
    p.add_argument("--port", type=int, default=os.environ.get("PDR_PORT", "8080"), help="default $PDR_PORT or 8080")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default=os.environ.get("PDR_LOG_FORMAT", "text"), choices=LOG_FORMATS,
                   help="json: one object per line with the request id (default $PDR_LOG_FORMAT or text)")
    p.add_argument("--shutdown-timeout", type=float, default=None,
                   help="on SIGTERM, seconds in-flight requests get to finish before they are cut (default: no limit)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes (> 1 needs state.backend: redis, so that they share one view)")
    p.set_defaults(func=serve)


# How ``serve --workers N`` tells its worker processes where the config is and how many
# they are (not config fields).
_CONFIG_ENV = "PDR_SERVE_CONFIG"
_WORKERS_ENV = "PDR_SERVE_WORKERS"


def app_factory():  # type: ignore[no-untyped-def]
    """Builds the app in a worker process started by ``serve --workers N``."""
    from router.gateway.app import create_app
    from router.gateway.live import LiveOptions
    from router.gateway.process import wrap

    path = os.environ.get(_CONFIG_ENV) or None
    options = LiveOptions(config_path=path, workers=int(os.environ.get(_WORKERS_ENV, "1")), sighup=True)
    return wrap(create_app(load_config(path), live=options))


def workers_problem(config: RouterConfig, workers: int) -> str | None:
    """Why ``config`` cannot be served by ``workers`` processes, or None."""
    if workers < 1 or (workers > 1 and config.state.backend != "redis"):
        return ("--workers N > 1 needs state.backend: redis: worker processes must share booked load "
                "and residency, or each would route blind to the others")
    if workers > 1 and uses_bind(config):
        return ("--workers N > 1 cannot use bound KV-event sockets (kv_events.bind, or a kv_events.sources entry "
                "without an endpoint): only one process can bind an address, so the other workers would get no "
                "events; let the engines' publishers bind (vLLM: endpoint tcp://*:PORT) so that every worker "
                "connects to them")
    return None


def serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        check_config(config)  # plugin names and parameters, against the registry
        load_keys(config)  # the API key file is readable and well formed
    except ConfigError as exc:
        print(f"pd-router: {exc}", file=sys.stderr)
        return 2
    problem = workers_problem(config, args.workers)
    if problem is not None:
        print(f"pd-router: {problem}", file=sys.stderr)
        return 2
    import uvicorn

    from router.gateway.app import create_app
    from router.gateway.connections import ConnectionLimits, GuardedProtocols, connection_cap
    from router.gateway.live import LiveOptions
    from router.gateway.process import wrap

    log_config = logging_config(args.log_level, args.log_format)
    logging.config.dictConfig(log_config)
    if args.workers > 1:
        # Python serves one core per process: more workers, one shared Redis view, and one
        # set of metric files that every worker writes and any worker's /metrics sums.
        os.environ[_CONFIG_ENV] = os.path.abspath(args.config) if args.config else ""
        os.environ[_WORKERS_ENV] = str(args.workers)
        prepare_multiprocess_dir()
        target: object = "router.gateway.serve:app_factory"
    else:
        path = os.path.abspath(args.config) if args.config else None
        target = wrap(create_app(config, live=LiveOptions(config_path=path, workers=1, sighup=True)))
    if not config.instances and not config.discovery.enabled:
        logging.getLogger("router").warning(
            "no instances configured and discovery is off: /ready answers 503 until one is added "
            "(config file, SIGHUP or POST /admin/instances)")
    uvicorn.run(
        target,  # type: ignore[arg-type]
        factory=args.workers > 1,
        workers=args.workers if args.workers > 1 else None,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=log_config,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http=GuardedProtocols(ConnectionLimits(  # type: ignore[arg-type]  # a protocol factory, as uvicorn calls it
            connection_cap(config.server.max_connections, config.proxy.max_connections), config.server.header_timeout_s,
            config.server.max_header_bytes)),
        timeout_keep_alive=config.server.keepalive_timeout_s,
        access_log=False,
        # uvicorn's X-Forwarded-For/-Proto rewriting of the scope's client and scheme: nothing
        # in the router reads either (logs carry the request id, never a client address), and
        # it wrapped every request in one more ASGI layer (~1% of its CPU)
        proxy_headers=False,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    return 0
