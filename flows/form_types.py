"""Types the run forms are built from where the config's own types are too loose for a form: `data.filters` is a
list of {name, params} with params any mapping (the config takes any filter and its keyword arguments), which the
Prefect UI can only show as raw JSON. Here each filter of pipeline_lib.data.filters is one item type, its
parameters typed fields with their defaults, read from the filter's own signature; the form offers the filters by
name. Only the form's schema changes: the flows take their sections as sent and check them as one config
(resolve_config), so a run behaves as with the config's own types."""
from __future__ import annotations

import inspect
from typing import Literal, Union

from pydantic import Field, create_model

from pipeline_lib.config import schema
from pipeline_lib.data.filters import FILTERS


def _filter_item(name: str, cls: type):
    signature = inspect.signature(cls.__init__)
    empty = inspect.Parameter.empty
    fields = {p.name: (float if p.annotation is empty else p.annotation, ... if p.default is empty else p.default)
              for p in signature.parameters.values() if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}
    params = create_model(f"{cls.__name__}Params", __config__={"title": f"{name} parameters"}, **fields)
    doc = (inspect.getdoc(cls) or "").split("\n\n", 1)[0].replace("\n", " ")
    return create_model(f"{cls.__name__}Filter", __config__={"title": name, "json_schema_extra": {"description": doc}},
                        name=(Literal[name], Field(name, description="The filter (one of pipeline_lib.data.filters).")),
                        params=(params, Field(default_factory=params, description=f"Keyword arguments of {name}.")))


def _filters_field():
    items = tuple(_filter_item(name, cls) for name, cls in FILTERS.items())
    described = schema.DataConfig.model_fields["filters"]
    return (list[Union[items]], Field(default_factory=schema._default_filters, description=described.description))


# The class name stays DataConfig: the form's group and its schema definition read as the config's section.
DataConfig = create_model("DataConfig", __base__=schema.DataConfig, __doc__=schema.DataConfig.__doc__,
                          filters=_filters_field())
schema._SECTION_PATHS[DataConfig] = "data"  # its fields titled data.<field>, as the config's section is
