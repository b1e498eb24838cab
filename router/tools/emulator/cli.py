"""``pd-router emulate`` / ``python -m router.tools.emulator``: serve one engine.

Every flag sets one field of the engine's EmulatorConfig.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import uvicorn

from router.tools.emulator.faults import install_log_filter
from router.tools.emulator.flags import add_arguments, config_from_args
from router.tools.emulator.launch import uvicorn_config
from router.tools.emulator.server import build_app
from router.tools.process import bind_socket


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the process exit code."""
    try:
        config = config_from_args(args)
        config.validate()
    except ValueError as exc:
        print(f"pd-router emulate: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        print(f"pd-router emulate: cannot bind {config.host}:{config.port}: {exc}",
              file=sys.stderr)
        return 1
    config = config.replace(port=sock.getsockname()[1])
    app = build_app(config)
    install_log_filter()
    server = uvicorn.Server(uvicorn_config(app, args.log_level, event_loop=True))
    print(f"emulator {config.flavor}/{config.role} listening on "
          f"http://{config.public_host}:{config.port}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "emulate", help="run an emulated vLLM/SGLang engine (no GPU needed)",
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router.tools.emulator", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))

