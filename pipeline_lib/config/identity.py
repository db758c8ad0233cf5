"""A stage's config identity, read from the schema's markers (schema.py `identity` / NO_OUTPUT_EFFECT).

`schema_fields()` lists every leaf field with its marker; `identity_fields(cfg, stage)` is the part of
the config that defines `stage`'s outputs; `stage_hash(cfg, stage)` hashes it. Every hash of "the
config this work depends on" (the registry's manifests, the data stage's completion markers) is this
one, so a field marked as not affecting outputs (workers, executor, timeouts) never reruns work.
Does not look at upstream manifests (the registry adds their fingerprints).
"""
from __future__ import annotations

import hashlib

from pydantic import BaseModel

from .load import config_hash
from .platform import device_target
from .schema import PipelineConfig


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        return None


def _contents(paths: list[str]) -> list[list]:
    """[name, digest] of each file, so the same files reached from another folder or clone keep the
    identity (config paths are absolute); [path, None] for what is not a local file (s3, a glob)."""
    out = []
    for p in paths:
        digest = _file_digest(p)
        out.append([p.rsplit("/", 1)[-1], digest] if digest else [p, None])
    return out


def schema_fields(section: type[BaseModel] = PipelineConfig, inherited: dict | None = None, prefix: str = ""):
    """(dotted name, identity marker) of every leaf field of the config schema; the marker is the
    field's own (config/schema.py `identity` / NO_OUTPUT_EFFECT), else the nearest section's above
    it, else None: a field nobody classified."""
    for name, field in section.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        marker = extra.get("identity", inherited)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from schema_fields(ann, marker, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", marker


def identity_fields(cfg: PipelineConfig, stage: str) -> dict:
    """The part of the config that defines `stage`'s outputs: every field whose marker names the
    stage, nested as in the config."""
    values, out = cfg.model_dump(mode="json"), {}
    for dotted, marker in schema_fields():
        if marker and stage in marker["stages"]:
            *sections, name = dotted.split(".")
            src, dst = values, out
            for section in sections:
                src, dst = src[section], dst.setdefault(section, {})
            dst[name] = _RESOLVE[marker["by"]](cfg, src[name])
    return out


_RESOLVE = {  # how a marked field enters the identity (schema.identity's `by`)
    "value": lambda cfg, value: value,
    "contents": lambda cfg, paths: _contents(paths),
    "device": lambda cfg, value: device_target(cfg),  # "auto" is the device it resolves to
}


def stage_hash(cfg: PipelineConfig, stage: str) -> str:
    """Hash of identity_fields(cfg, stage)."""
    return config_hash(identity_fields(cfg, stage))
