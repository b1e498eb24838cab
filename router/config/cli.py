"""``pd-router config schema | defaults | check``: the config model, printed from pydantic.

``defaults`` prints every field with its default and, as a comment, its description, so
the output is a starting config file; ``schema`` is the JSON schema (for editors and
values.schema.json); ``check`` validates a file the way ``serve`` would.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
import sys
from typing import Any

import yaml
from pydantic import BaseModel

from router.config.model import ConfigError, RouterConfig, load_config


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], deep_check: Callable[[RouterConfig], None] | None = None) -> None:
    """``deep_check`` is what ``serve`` checks beyond the model (plugin names and parameters,
    which only the scheduling layer knows); the composition root passes it in."""
    p = subparsers.add_parser("config", help="print the config schema or defaults, or check a file")
    sub = p.add_subparsers(dest="config_command", required=True)
    sub.add_parser("schema", help="JSON schema of the config file").set_defaults(func=print_schema)
    sub.add_parser("defaults", help="every field with its default and description (YAML)").set_defaults(func=print_defaults)
    check = sub.add_parser("check", help="validate a config file (environment PD_ROUTER_* applies)")
    check.add_argument("path")
    check.set_defaults(func=check_file, deep_check=deep_check)


def print_schema(args: argparse.Namespace) -> int:
    print(json.dumps(RouterConfig.model_json_schema(), indent=2))
    return 0


def print_defaults(args: argparse.Namespace) -> int:
    # model_construct fills in the defaults without reading any PD_ROUTER_* variable.
    print("\n".join(commented_yaml(RouterConfig.model_construct())))
    return 0


def check_file(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.path)
        if args.deep_check is not None:
            args.deep_check(config)
    except ConfigError as exc:
        print(f"pd-router: {exc}", file=sys.stderr)
        return 2
    print(f"{args.path}: valid")
    return 0


def commented_yaml(model: BaseModel, indent: int = 0) -> list[str]:
    """YAML lines for ``model``: a ``# description`` line above every field."""
    pad = " " * indent
    lines: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if field.description:
            lines.append(f"{pad}# {field.description}")
        if isinstance(value, BaseModel):
            lines.append(f"{pad}{name}:")
            lines.extend(commented_yaml(value, indent + 2))
        else:
            lines.append(f"{pad}{name}: {_scalar(value)}")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()
