"""The settings a stage ran with, as its manifest records them (`settings`), and the ones that differ between two
runs (`llm-pipeline diff`, the `nightly-changes` artifact).

A stage's settings are its identity fields (config/identity.py: the config fields that define its outputs, files
as name and digest), flattened to dotted names; secret fields are left out (a manifest is read by anyone who reads
the run folder). A manifest written before `settings` existed has none: its stage says "not recorded".
"""
from __future__ import annotations

import json

from .config.identity import identity_fields, schema_fields


def _secret_fields() -> set[str]:
    from .config.schema import PipelineConfig

    out: set[str] = set()

    def walk(section, prefix: str) -> None:
        for name, field in section.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")
            elif isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("secret"):
                out.add(f"{prefix}{name}")

    walk(PipelineConfig, "")
    return out


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def stage_settings(cfg, stage: str) -> dict:
    """dotted field -> value of the fields that define `stage`'s outputs (no secret)."""
    secret = _secret_fields()
    return {k: v for k, v in flatten(identity_fields(cfg, stage)).items() if k not in secret}


MAX_SHOWN = 60  # a table cell a 1,600 px window shows beside two others


def _short(value):
    """A path as its last two parts (the run folders differ above them), recursively."""
    if isinstance(value, str) and "/" in value.rstrip("/") and len(value) > 30:
        return ".../" + "/".join(value.rstrip("/").split("/")[-2:])
    if isinstance(value, list):
        return [_short(v) for v in value]
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    return value


def shown(value) -> str:
    value = _short(value)
    text = (json.dumps(value, ensure_ascii=False, sort_keys=True) if isinstance(value, (dict, list))
            else "–" if value is None else str(value))
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


def differing(a: dict[str, dict | None], b: dict[str, dict | None]) -> list[dict]:
    """Rows {setting, a, b} of the fields whose values differ, per stage both runs ran (stage -> settings, None
    when the stage's manifest records none), in stage order; a stage recorded by one run only is one row."""
    rows, seen = [], set()
    for stage in [*a, *[s for s in b if s not in a]]:
        sa, sb = a.get(stage), b.get(stage)
        if stage not in a or stage not in b:
            continue
        if sa is None or sb is None:
            rows.append({"setting": f"({stage})", "a": "not recorded" if sa is None else "recorded",
                         "b": "not recorded" if sb is None else "recorded"})
            continue
        for key in sorted(set(sa) | set(sb)):
            if key in seen:  # a field several stages depend on: once
                continue
            if sa.get(key) != sb.get(key):
                seen.add(key)
                rows.append({"setting": key, "a": shown(sa.get(key)), "b": shown(sb.get(key))})
    return rows


__all__ = ["differing", "flatten", "schema_fields", "stage_settings"]
