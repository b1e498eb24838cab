"""The README's configuration and metrics reference must not drift from the code."""

import re
from pathlib import Path

from pydantic import BaseModel

from router.config.model import InstanceConfig, RouterConfig
from router.core.metrics import Metrics

README = (Path(__file__).parent.parent / "README.md").read_text()


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += field_paths(ann, f"{prefix}{name}.")
        elif name == "instances":
            out += field_paths(InstanceConfig, "instances[].")
        else:
            out.append(prefix + name)
    return out


def test_every_config_field_is_documented():
    missing = [p for p in field_paths(RouterConfig) if f"`{p}`" not in README]
    assert not missing, f"README config reference lacks {missing}"


def test_every_metric_is_documented():
    names = {m.name for m in Metrics().registry.collect()} | {"pd_router_state_round_trips", "pd_router_state_corrections",
                                                               "pd_router_state_revisions"}
    for name in names:
        assert re.search(rf"`{name}(_total)?`", README), name
