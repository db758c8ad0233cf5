"""The data stage: readers, cleaning filters, exact + MinHash-LSH dedup, tokenizer, packing, MindRecord.

Entry points (import them from their modules; this package re-exports nothing):
    stage.run_data_stage(run: StageRun, *, workers=None) -> StageOutput   (through pipeline_lib.stages.run_stage)
    prep / encode / stage: the step functions a Prefect flow maps over shards (tasks/data_tasks.py)
    stats.table_rows(stats) -> rows for a table artifact (stats = json of <stage>/stats.json)
The loaded tokenizer is pipeline_lib.model.tokenizer.Tokenizer.
"""
