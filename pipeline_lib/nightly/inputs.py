"""What arrived: the raw files of data.inputs, and which of them no decided night is done with yet (new ones, and
the ones a held night carried: ledger.py)."""
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
    """Tonight's files: the ones no decided night is done with (a file that grew since, appended, counts as new),
    and the carried ones (a held night's, nightly.on_hold: carry) even when data.inputs no longer lists them, as
    long as they are still there."""
    from .ledger import carried_files

    consumed = state.get("consumed", {})
    found = {u: s for u, s in list_raw_files(cfg).items() if consumed.get(u) != s}
    for uri in carried_files(state):
        if uri not in found:
            store = store_for(uri, cfg.run.s3_endpoint_url)
            if store.exists(uri):
                found[uri] = store.size(uri)
    return dict(sorted(found.items()))
