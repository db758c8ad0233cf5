"""The data stage: readers, cleaning filters, exact + MinHash-LSH dedup, tokenizer, packing, MindRecord.

Entry points (see stage.py for the step-by-step API a Prefect flow maps over shards):
    run_data_stage(run: StageRun, *, workers=None) -> StageOutput   (through pipeline_lib.stages.run_stage)
    Tokenizer.load(uri).encode_batch(texts, threads) / decode(ids) / special_ids()   (pipeline_lib.model.tokenizer)
    table_rows(stats) -> rows for a table artifact (stats = json of <stage>/stats.json)
Names are imported lazily, so `from pipeline_lib.data import Tokenizer` does not load the rest.
"""
from importlib import import_module

_WHERE = {
    "run_data_stage": "stage", "finalize_data_stage": "stage",
    "plan_data_stage": "prep", "prep_shard": "prep", "dedup_stage": "prep",
    "build_tokenizer": "encode", "tokenize_shard": "encode", "plan_mindrecord": "encode",
    "write_mindrecord_shard": "encode", "write_mindrecord_files": "encode", "Tokenizer": "tokenizer", "train_tokenizer": "tokenizer",
    "table_rows": "stats", "FILTERS": "filters", "Doc": "filters", "build_filters": "filters",
    "DataStageError": "errors", "ConservationError": "errors",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline_lib.data' has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)
