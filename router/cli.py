"""Command line: ``pd-router serve | emulate | demo``.

Each subcommand lives in its own module and registers itself through a
``register(subparsers)`` function, so this file stays a thin dispatcher.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that contribute subcommands. Each exposes ``register(subparsers)``
# which adds a parser whose ``func`` default returns an exit code.
_COMMAND_MODULES = (
    "router.gateway.serve",
    "router.config.cli",
    "router.tools.emulator.cli",
    "router.tools.demo",
    "router.tools.replay.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-router", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a subcommand not built yet
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
