"""What arrived: the raw files of data.inputs, and which of them no decided night has read yet."""
from __future__ import annotations

from ..config.schema import PipelineConfig
from ..storage import store_for
from ..storage.input_files import find_inputs

def list_raw_files(cfg: PipelineConfig) -> dict[str, int]:
    """Every raw input file of data.inputs with its size, listed exactly as the data stage lists
    them (storage.input_files.find_inputs); an entry matching nothing yet is not an error here."""
    found: dict[str, int] = {}
    for uris in find_inputs(cfg.data.inputs, cfg.run.s3_endpoint_url, cfg.data.follow_symlinks):
        for uri in uris:
            found[uri] = store_for(uri, cfg.run.s3_endpoint_url).size(uri)
    return dict(sorted(found.items()))


def new_files(cfg: PipelineConfig, state: dict) -> dict[str, int]:
    """Files not trained on yet; a file that grew since (appended) counts as new."""
    consumed = state.get("consumed", {})
    return {u: s for u, s in list_raw_files(cfg).items() if consumed.get(u) != s}
