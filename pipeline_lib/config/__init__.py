"""Typed pipeline config: load, override, validate; mindformers yaml generation."""
from .errors import ConfigError, ConfigIssue
from .load import apply_overrides, config_from_dict, config_hash, load_config
from .schema import PipelineConfig
from .validate import check, validate

__all__ = ["ConfigError", "ConfigIssue", "PipelineConfig", "apply_overrides", "check",
           "config_from_dict", "config_hash", "load_config", "validate"]
