"""The run forms of the chain and the nightly deployments, folded: the fields a person sets per run at the top,
each config section one closed choice below them.

Prefect builds the form from the flow's parameter schema and opens every parameter that has a value: pre-filled with
its config file's eleven sections, the chain's form was ~250 fields and 33,000 px tall (the nightly's four: 19,500
px). So the deployment's parameters leave
the sections empty (None: the UI shows each as a closed "<Section>Config | None" choice), and the schema carries
the file's values as the defaults of the sections' fields instead: a person who opens a section sees the
deployment's config, changes a field and sends the section whole, which applies over the file field by field as a
pre-filled section did (flows/pipeline.py). `llm-pipeline deploy` rewrites the schema after `prefect deploy`
(fold_deployed_form): `prefect deploy` itself can only derive the schema from the flow's signature.
"""
from __future__ import annotations

import copy

# The per-run fields first, in this order; the sections and the rarely changed ones keep their order after them.
PER_RUN = ("config", "run_id", "stages", "overrides", "dispatch")
NIGHT_PER_RUN = ("config", "run_date", "overrides", "dispatch")  # the nightly's form (flows/nightly.py)
FOLDED_NOTE = "None: as in the config file."


def _ref_holder(prop: dict) -> dict | None:
    """The node of `prop` holding its definition's $ref (directly or as an anyOf choice), if it is a model."""
    if "$ref" in prop:
        return prop
    return next((alt for alt in prop.get("anyOf", []) if "$ref" in alt), None)


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[1]


def _fill(defs: dict, original: dict, owner: dict, holder: dict, values: dict, path: str) -> None:
    """Set `values` as the defaults of the fields of the definition `holder` refers to. A definition two sections
    share (GuardConfig: training.guard and sft.guard) gets a copy per path: each shows its own section's values."""
    name = base = _name(holder["$ref"])
    if owner.setdefault(name, path) != path:
        name = f"{base}_{path.replace('.', '_')}"
        defs[name] = copy.deepcopy(original[base])
        owner[name] = path
        holder["$ref"] = f"#/definitions/{name}"
    props = defs[name].get("properties", {})
    for field, value in values.items():
        prop = props.get(field)
        if prop is None:
            continue
        inner = _ref_holder(prop)
        if inner is not None and isinstance(value, dict):
            _fill(defs, original, owner, inner, value, f"{path}.{field}")
        else:
            prop["default"] = value


def folded_form_schema(schema: dict, defaults: dict[str, dict], per_run: tuple[str, ...] = PER_RUN) -> dict:
    """The flow's parameter schema with `defaults` ({section: {field: value}}, pipeline_lib/config/form.py
    form_defaults) as the defaults of each section's fields and the per-run fields first (see the module
    docstring)."""
    out = copy.deepcopy(schema)
    defs = out.setdefault("definitions", {})
    original, owner = copy.deepcopy(defs), {}
    props = out.get("properties", {})
    for section, values in defaults.items():
        holder = _ref_holder(props.get(section, {}))
        if holder is None:
            continue
        _fill(defs, original, owner, holder, values, section)
        described = props[section].get("description", "").rstrip()
        if FOLDED_NOTE not in described:
            props[section]["description"] = (f"{described} {FOLDED_NOTE} Choose {_name(holder['$ref'])} to change "
                                             "a field: its fields start at the deployment's config file.").strip()
    order = [k for k in per_run if k in props]
    order += sorted((k for k in props if k not in per_run), key=lambda k: props[k].get("position", 0))
    for position, key in enumerate(order):
        props[key]["position"] = position
    return out


def fold_deployed_form(deployment_name: str, defaults: dict[str, dict], per_run: tuple[str, ...] = PER_RUN) -> None:
    """Rewrite the parameter schema of the deployment `flow/name` on the server as folded_form_schema does."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment_name)
        client.update_deployment(dep.id, DeploymentUpdate(
            parameter_openapi_schema=folded_form_schema(dep.parameter_openapi_schema or {}, defaults, per_run)))
