"""Load a pipeline YAML, apply `key=value` dotted overrides, return a typed PipelineConfig.

Precedence, lowest first: the config file, then sections given as values (the run form's typed
fields, `sections`), then the `key=value` overrides (applied last, so they win over both).
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from .errors import ConfigError, ConfigIssue
from .schema import PipelineConfig
from .secrets import SECRET_FIELDS, redacted


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError([ConfigIssue(item, item, "an override must look like section.field=value",
                                       "write e.g. training.steps=100")])
    key, raw = item.split("=", 1)
    if not all(part.strip() for part in key.split(".")):  # "", ".", "training..steps": no field to name
        raise ConfigError([ConfigIssue(key.strip() or item, raw, "not a field path (an empty name between dots)",
                                       "write section.field=value, e.g. training.steps=100")])
    # YAML parsing gives ints, floats, bools, null and lists ([a,b]) the way users expect.
    try:
        value = yaml.load(raw, Loader=_NoAliasLoader) if raw.strip() else ""
    except yaml.YAMLError as err:  # e.g. `training.steps=[` or an unquoted `a: b`: the user's value, named
        secret = tuple(part.strip() for part in key.split("."))[:2] in SECRET_FIELDS
        # PyYAML's message quotes the line it failed on: for a secret field that is the secret
        problem = "the value is a secret: not shown" if secret else " ".join(str(err).split())[:200]
        raise ConfigError([ConfigIssue(key.strip(), _shown(raw) if secret else raw, f"not a YAML value ({problem})",
                                       f"write a number, true/false, [a, b], or quote text: {key.strip()}=\"'...'\"")]) \
            from None
    return [part.strip() for part in key.split(".")], value


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    out = copy.deepcopy(raw)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError([ConfigIssue(".".join(path), value, f"'{part}' is not a section",
                                               "override a leaf field, e.g. training.steps=100")])
            node = nxt
        node[path[-1]] = value
    return out


def _shown(value) -> str:
    """A secret field's value as an error may show it; never raises (this runs while the validation error, which
    holds the whole value, is being handled: a raise here would chain it into the log)."""
    try:
        return redacted(value)
    except Exception:  # noqa: BLE001
        return "(a secret: not shown)"


def _pydantic_issues(err: ValidationError) -> list[ConfigIssue]:
    issues = []
    for e in err.errors():
        # a key that is blank or holds control characters is shown quoted ('', ' ', '\x1b'): what was written
        field = ".".join(str(p) if str(p).strip() and str(p).isprintable() else repr(p) for p in e["loc"]) or "(config)"
        fix = "remove it or check its spelling against `llm-pipeline validate --explain`" \
            if e["type"] == "extra_forbidden" else "see the field's description in `llm-pipeline validate --explain`"
        value = _shown(e.get("input")) if tuple(map(str, e["loc"][:2])) in SECRET_FIELDS else e.get("input")
        issues.append(ConfigIssue(field, value, e["msg"], fix))
    return issues


def is_utf8_text(text: str) -> bool:
    """False for a str holding a lone surrogate (from a \\udXXX escape): it cannot be written as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _yaml_spelling(key) -> str:
    """A non-string key as YAML writes it (None -> null, True -> true): pydantic would show Python's None/True, a
    name the user never wrote."""
    return yaml.safe_dump(key, default_flow_style=True).splitlines()[0]


def _key_kind(key) -> str:
    if key is None:
        return "null (YAML reads a `?` line, `~:` and `null:` as a null key)"
    if isinstance(key, (bool, int, float)):
        return "a number or a boolean (YAML reads an unquoted 1, 1.5 or true as one)"
    return f"a {type(key).__name__} (YAML reads an unquoted value of that form as one)"


def _unnamed_keys(node: dict, prefix: str = "") -> list[ConfigIssue]:
    """Keys pydantic can name no field for: not text (YAML's null key `?`, `~:` or `null:`; a number; a boolean; a
    date), or text holding a lone surrogate (a YAML "\\udXXX" escape)."""
    issues = []
    for key, value in node.items():
        if not isinstance(key, str):
            issues.append(ConfigIssue(prefix + _yaml_spelling(key), value, f"the key is {_key_kind(key)}, not a name",
                                      "write the section or field name before the colon (quoted if it is a number "
                                      "or true/false), or remove the entry"))
        elif not is_utf8_text(key):
            issues.append(ConfigIssue(prefix + repr(key), key, "the key is not Unicode text (a lone \\udXXX escape)",
                                      "remove the escape from the key"))
        elif isinstance(value, dict):
            issues += _unnamed_keys(value, prefix + key + ".")
    return issues


def config_from_dict(raw: dict) -> PipelineConfig:
    issues = _unnamed_keys(raw) if isinstance(raw, dict) else []
    if issues:
        raise ConfigError(issues)
    try:
        return PipelineConfig.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(_pydantic_issues(err)) from None


class _NoAliasLoader(yaml.SafeLoader):
    """A config has no use for YAML anchors and aliases, and a few nested aliases expand a 435-byte file into
    gigabytes (and the error message with them): refused at the first alias."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"YAML alias *{event.anchor} at line {event.start_mark.line + 1}: aliases are not "
                                 "allowed in a pipeline config (write the values out)")
        return super().compose_node(parent, index)


def read_config_file(path: str | Path) -> dict:
    """The YAML of a pipeline config as written (nothing resolved, nothing validated)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError([ConfigIssue("CONFIG", str(path), "file not found",
                                       "pass a pipeline yaml such as configs/pipelines/tiny-cpu.yaml")])
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_NoAliasLoader) or {}
    except UnicodeDecodeError as err:
        raise ConfigError([ConfigIssue("CONFIG", str(path), f"not UTF-8 text ({err})", "save the file as UTF-8")]) \
            from None
    except yaml.YAMLError as err:
        raise ConfigError([ConfigIssue("CONFIG", str(path), f"not valid YAML ({err})", "fix the YAML syntax")]) \
            from None
    if not isinstance(raw, dict):
        raise ConfigError([ConfigIssue("CONFIG", str(path), "top level must be a mapping of sections",
                                       "start the file with sections such as run:, data:, model:")])
    return raw


def is_secret(field) -> bool:
    """A field marked schema.SECRET: never shown as a form default, kept from the file when the form leaves it empty."""
    return isinstance(field.json_schema_extra, dict) and bool(field.json_schema_extra.get("secret"))


def _section_type(field) -> type[BaseModel] | None:
    kind = field.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _merge_section(model: type[BaseModel], base: dict, given: dict) -> dict:
    out = dict(base)
    for key, value in given.items():
        field = model.model_fields.get(key)
        sub = _section_type(field) if field is not None else None
        if sub is not None and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge_section(sub, out[key], value)
        elif field is not None and is_secret(field) and value in (None, "") and key in out:
            continue  # an empty secret in the form keeps the file's (secrets are never form defaults)
        else:
            out[key] = value  # a leaf (list and dict values included) is replaced as a whole
    return out


def merge_sections(raw: dict, sections: dict | None) -> dict:
    """`raw` with `sections` ({section: {field: value}}, e.g. the run form's) applied over it: field by
    field within a section and its sub-sections, a leaf replaced as a whole; None sections are ignored."""
    out = copy.deepcopy(raw)
    for name, given in (sections or {}).items():
        if given is None:
            continue
        if isinstance(given, BaseModel):
            given = given.model_dump(mode="json", exclude_unset=True)
        field = PipelineConfig.model_fields.get(name)
        if field is None or not isinstance(given, dict):
            raise ConfigError([ConfigIssue(name, given, "not a section of the pipeline config",
                                           f"give one of {list(PipelineConfig.model_fields)} as a mapping of fields")])
        base = out.get(name) if isinstance(out.get(name), dict) else {}
        out[name] = _merge_section(_section_type(field), base, given)
    return out


def load_config(path: str | Path, overrides: Iterable[str] = (), sections: dict | None = None) -> PipelineConfig:
    """The file, then `sections` over it, then `overrides` last (see the module docstring)."""
    raw = merge_sections(read_config_file(path), sections)
    return config_from_dict(apply_overrides(raw, overrides))


def config_hash(obj: Any) -> str:
    """Stable short hash of (part of) a config: what names a stage's identity."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
