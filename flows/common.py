"""Config resolution shared by every flow: a path (+ overrides) or an already resolved dict."""
from __future__ import annotations

import datetime as dt
import uuid

from pipeline_lib.config import PipelineConfig, config_from_dict, load_config, validate


def resolve_config(config: str | dict, overrides: list[str] | None = None) -> PipelineConfig:
    cfg = config_from_dict(config) if isinstance(config, dict) else load_config(config, overrides or [])
    return validate(cfg)


def new_run_id(prefix: str = "run") -> str:
    now = dt.datetime.now()
    return f"{prefix}-{now:%Y-%m-%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
