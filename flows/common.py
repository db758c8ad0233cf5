"""Config resolution shared by every flow: a path or an already resolved dict, then the sections given
as values (the run form's), then the overrides (pipeline_lib/config/load.py states the precedence)."""
from __future__ import annotations

import datetime as dt
import uuid

from pipeline_lib.config import PipelineConfig, apply_overrides, config_from_dict, load_config, validate
from pipeline_lib.config.load import merge_sections


def resolve_config(config: str | dict, overrides: list[str] | None = None,
                   sections: dict | None = None, stages: list[str] | None = None) -> PipelineConfig:
    """The config, checked for the stages the flow runs (None: every stage)."""
    if isinstance(config, dict):
        cfg = config_from_dict(apply_overrides(merge_sections(config, sections), overrides or []))
    else:
        cfg = load_config(config, overrides or [], sections)
    return validate(cfg, stages=stages)


def untouched_form_sections(config, sections: dict, deployment_parameters: dict) -> list[str]:
    """The sections a deployment run inherited unchanged from the deployment's form defaults while its
    `config` names another file: those defaults describe the deployment's file, not this one, so they are
    not applied (a run of llm-pipeline/default given the 7B config must not get the tiny model's sections)."""
    default_config = deployment_parameters.get("config")
    if default_config is None or config == default_config:
        return []
    return [name for name, given in sections.items()
            if given is not None and _plain(given) == deployment_parameters.get(name)]


def _plain(section):
    return section.model_dump(mode="json", exclude_unset=True) if hasattr(section, "model_dump") else section


def deployment_parameters() -> dict:
    """The default parameters of the deployment this flow run belongs to ({} outside a deployment run)."""
    from prefect import get_client
    from prefect.runtime import deployment

    if deployment.id is None:
        return {}
    with get_client(sync_client=True) as client:
        return dict(client.read_deployment(deployment.id).parameters or {})


def with_form_defaults(deployed: dict) -> dict:
    """A deployment's parameters with the sections its folded run form opens at (flows/run_form.py: the deployment
    leaves them None, its schema holds the config file's values): what untouched_form_sections and the overview's
    changed settings compare a run with. As given when the deployment's config does not load here."""
    from pathlib import Path

    from pipeline_lib.config.form import form_defaults

    config = deployed.get("config")
    if not isinstance(config, str):
        return deployed
    path = Path(config) if Path(config).is_absolute() else Path(__file__).resolve().parents[1] / config
    try:
        sections = form_defaults(path)
    except Exception:  # noqa: BLE001 (a view and a guard: the run itself reads its own config)
        return deployed
    return {**deployed, **{k: v for k, v in sections.items() if deployed.get(k) is None}}


def new_run_id(prefix: str = "run") -> str:
    now = dt.datetime.now()
    return f"{prefix}-{now:%Y-%m-%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
