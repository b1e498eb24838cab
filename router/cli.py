"""Command line: ``pd-router serve | emulate | demo | replay``.

Each subcommand lives in its own module and registers itself through a
``register(subparsers)`` function, so this file stays a thin dispatcher: the
composition root, the one module that sees both the product and the tools.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias

from router.config import cli as config_cli
from router.gateway import serve
from router.scheduling import check_config
from router.tools import demo
from router.tools.emulator import cli as emulate
from router.tools.replay import cli as replay

# Generic only in typeshed, hence the string.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

# Each ``register`` adds a parser whose ``func`` default returns an exit code.
_COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    serve.register, lambda sub: config_cli.register(sub, check_config), emulate.register, demo.register, replay.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-router", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in _COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
