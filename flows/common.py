"""Config resolution shared by every flow: a path or an already resolved dict, then the sections given
as values (the run form's), then the overrides (pipeline_lib/config/load.py states the precedence)."""
from __future__ import annotations

import datetime as dt
import uuid

from pipeline_lib.config import PipelineConfig, apply_overrides, config_from_dict, load_config, validate
from pipeline_lib.config.load import merge_sections


def resolve_config(config: str | dict, overrides: list[str] | None = None,
                   sections: dict | None = None) -> PipelineConfig:
    if isinstance(config, dict):
        cfg = config_from_dict(apply_overrides(merge_sections(config, sections), overrides or []))
    else:
        cfg = load_config(config, overrides or [], sections)
    return validate(cfg)


def new_run_id(prefix: str = "run") -> str:
    now = dt.datetime.now()
    return f"{prefix}-{now:%Y-%m-%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
