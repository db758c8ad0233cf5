"""The run form's defaults: a pipeline config file as one value per field of each section.

The `llm-pipeline/default` deployment takes the config's sections as typed parameters (flows/
pipeline.py); Prefect builds its run form from their schema and pre-fills it with the deployment's
parameters, which `llm-pipeline deploy` sets to `form_defaults(<the deployment's config file>)`. So a
custom run starts from the shipped config and a user changes only what differs. The rules:

- every field has its value (a field left out would show empty, and an empty list is a value);
- paths stay as written in the file: they are resolved on the worker that runs the flow
  (config/paths.py), not on the machine that deployed;
- a field filled in by the config itself (the dtypes derived from training.precision) shows its
  own default (empty), so changing precision in the form re-derives it as an override would;
- secrets (schema.SECRET) are left out: the deployment's parameters are visible to every UI user.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from .load import config_from_dict, is_secret, read_config_file
from .paths import paths_as_typed
from .schema import PipelineConfig


def _values(model: BaseModel) -> dict:
    out = {}
    for name, field in type(model).model_fields.items():
        if is_secret(field):
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel):  # a section (FilterSpec items sit in a list: leaves)
            out[name] = _values(value)
        elif name not in model.model_fields_set and field.default_factory is None:
            # the declared default, not what the config derived into it (see the module docstring)
            out[name] = _dump(field.default)
        else:
            out[name] = _dump(value)
    return out


def _dump(value):
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def form_defaults(config_path: str | Path) -> dict[str, dict]:
    """{section: {field: value}} of the config file, every field filled (see the module docstring)."""
    with paths_as_typed():
        cfg = config_from_dict(read_config_file(config_path))
        return _values(cfg)


def form_sections() -> list[str]:
    """The sections, in the config's order (the flow's parameters of the same names)."""
    return list(PipelineConfig.model_fields)


def _flat(value, prefix: str = "") -> dict:
    """{dotted key: value} of a config dump; lists are values (a filter list is one setting)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def changed_settings(config: dict, defaults: dict) -> list[tuple[str, object, object]]:
    """(dotted key, this run's value, the default) of every setting a run changed from its deployment's defaults;
    both are resolved configs as dicts without their secrets (secrets.public_config)."""
    mine, base = _flat(config), _flat(defaults)
    return [(key, mine.get(key), base.get(key)) for key in sorted(set(mine) | set(base))
            if mine.get(key) != base.get(key)]
