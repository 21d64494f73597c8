"""Typed recipe schema and loader (importable without torch or ray)."""

from rlinf.config.loader import DEFAULT_RECIPE, load_config, save_resolved_config
from rlinf.config.schema import Config
from rlinf.config.typed import ConfigError

__all__ = ["DEFAULT_RECIPE", "Config", "ConfigError", "load_config", "save_resolved_config"]
