"""Layer: config (the bottom layer). The router's settings as pydantic models, loaded from
YAML with environment overrides and validated before anything starts.

May import: the standard library and pydantic only; every other layer imports this one.
"""

from router.config.model import ConfigError, RouterConfig, load_config

__all__ = ["ConfigError", "RouterConfig", "load_config"]
