"""Keep the ``config`` part of the chart's values.schema.json equal to the router's own schema.

The chart writes ``config:`` verbatim to config.yaml, so its schema is RouterConfig's JSON
schema (pydantic), with the models it refers to under ``definitions``; the rest of the file
(the chart's own values) is written by hand. Run after changing router/config:

    python deploy/helm/schema.py           # rewrite values.schema.json
    python deploy/helm/schema.py --check   # exit 1 when it is stale (tests/deploy does this)

Draft-07 with ``definitions`` rather than 2020-12's ``$defs``: every Helm 3 and 4 release
validates it (older Helm 3 used a draft-07 validator).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).resolve().parent / "pd-router" / "values.schema.json"


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """RouterConfig's schema and the definitions it refers to."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from router.config.model import RouterConfig

    schema = RouterConfig.model_json_schema(ref_template="#/definitions/{model}")
    definitions = schema.pop("$defs", {})
    schema["description"] = "Router configuration, written to config.yaml (router/config/model.py)"
    return schema, definitions


def synced(values_schema: dict[str, Any]) -> dict[str, Any]:
    """``values_schema`` with its ``config`` property and ``definitions`` regenerated."""
    config, definitions = config_schema()
    out = dict(values_schema)
    out["properties"] = {**values_schema.get("properties", {}), "config": config}
    out["definitions"] = definitions
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if values.schema.json is stale")
    args = parser.parse_args(argv)
    current = SCHEMA.read_text()
    expected = render(synced(json.loads(current)))
    if args.check:
        if current != expected:
            print(f"{SCHEMA} is stale: run python deploy/helm/schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(expected)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
