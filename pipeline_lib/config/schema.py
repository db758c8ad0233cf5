"""Typed pipeline config: one YAML file describes one pipeline.

Every field has a default that works for the tiny CPU run, and a description that is the
documentation (``llm-pipeline validate --explain`` prints it). Path fields (InputPath,
OutputPath) are made absolute when a config is built (paths.py). Single-field checks live here
(pydantic refuses them at load time); rules that relate several fields live in ``validate.py``
so that all of them are reported together.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ..storage.names import MAX_NAME, NAME_PATTERN, TEXT_NAME_PATTERN
from ..storage.store import is_remote
from .paths import resolve_input, resolve_output

# Local paths are made absolute when a config is built (see paths.py): workers run elsewhere.
InputPath = Annotated[str, AfterValidator(resolve_input)]
OutputPath = Annotated[str, AfterValidator(resolve_output)]


# Stage identity is marked here, next to each field: `identity("pretrain", "sft")` puts the field in
# those stages' identity (pipeline_lib.stages hashes exactly the marked fields: change one and the
# stages named rerun); `NO_OUTPUT_EFFECT` marks what only changes how or where the work runs, never
# its outputs. A marker on a section field covers every field below it unless one has its own. A
# test (tests/config/test_schema.py) refuses any field left unmarked.
def identity(*stages: str, by: Literal["value", "contents", "device"] = "value") -> dict:
    """json_schema_extra of a field that defines `stages`' outputs. by: the value as set, the files'
    contents (paths: the same files in another folder keep the identity), or the device it resolves to."""
    return {"identity": {"stages": list(stages), "by": by}}


NO_OUTPUT_EFFECT = {"identity": {"stages": [], "by": "value"}}
# A secret (a token-bearing URL, a password): the run form never shows it as a default (config/form.py)
# and an empty value in the form keeps the config file's (config/load.py merge_sections).
SECRET = {"secret": True}


# Where each section class sits in a config ("training", "data.dedup"), filled once PipelineConfig is defined. The
# run form titles a field by its dotted path (`training.steps`, `sft.steps`): a plain "Steps" twice in one form gets
# the wrong one edited. A class used in two places (GuardConfig: training.guard, sft.guard) is titled by its field
# name, its group in the form says which.
_SECTION_PATHS: dict[type, str] = {}


def _dotted_titles(schema: dict, cls) -> None:
    prefix = _SECTION_PATHS.get(cls)
    for name, prop in (schema.get("properties") or {}).items() if prefix else ():
        prop["title"] = f"{prefix}.{name}"


class _Section(BaseModel):
    # Unknown keys are typos until proven otherwise: refuse them instead of ignoring them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_dotted_titles)


def _endpoint_url(value: str | None) -> str | None:
    """An S3 endpoint as boto3 takes it: http(s)://host[:port] with a port from 1 to 65535 (urllib raises only when
    the port is read: at the first request, deep in a stage)."""
    import urllib.parse

    from .secrets import url_port_problem

    if not value:
        return value
    try:
        parts = urllib.parse.urlsplit(value)
        host = parts.hostname
    except ValueError:
        host = None  # an unclosed [ of an IPv6 host
    if host is None or parts.scheme.lower() not in ("http", "https"):
        raise ValueError("not an http(s) URL with a host; write e.g. http://127.0.0.1:9000")
    problem = url_port_problem(parts)
    if problem:
        raise ValueError(problem)
    return value


class RunConfig(_Section):
    name: str = Field("tiny-cpu", json_schema_extra=NO_OUTPUT_EFFECT, pattern=TEXT_NAME_PATTERN, max_length=MAX_NAME,
                      description="Pipeline name; used in flow-run names, the TensorBoard folder "
                      "(`<output_root>/_tensorboard/<run.name>`) and, unless data.dedup.lineage is set, the dedup "
                      "lineage. A name in any language (电力语料): a letter or digit first, then letters, digits, "
                      "'.', '_', '-'; never a path. A name that is not ASCII gets the lineage `<its ASCII part or "
                      "name>-<12 hex digits of its sha256>`, so two such names never share a dedup index.")
    output_root: OutputPath = Field(
        "runs", json_schema_extra=NO_OUTPUT_EFFECT, validate_default=True,
        description="Where runs are written: a local path (relative to the directory the command runs from) "
        "or s3://bucket/prefix. Each run lands in `<output_root>/<run_id>/<stage>/`.",
    )
    s3_endpoint_url: Annotated[str | None, AfterValidator(_endpoint_url)] = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Endpoint of an S3-compatible store (MinIO, OBS); None means AWS."
    )
    device_target: Literal["auto", "CPU", "Ascend"] = Field(
        "auto", json_schema_extra=identity("pretrain", "sft", by="device"),
        description="auto picks Ascend when an NPU is visible, else CPU (with the CPU overrides)."
    )
    seed: int = Field(1234, json_schema_extra=identity("pretrain", "sft"),
                      description="Seed for data splits, init and sampling.")


class FilterSpec(_Section):
    name: str = Field(description="Filter name, see pipeline_lib.data.filters.FILTERS.")
    params: dict = Field(default_factory=dict, description="Keyword arguments of the filter.")


def _default_filters() -> list[FilterSpec]:
    return [
        FilterSpec(name="width"),  # not nfkc: that folds CJK punctuation (，-> ,)
        FilterSpec(name="strip_control"),
        FilterSpec(name="normalize_whitespace"),
        FilterSpec(name="length", params={"min_chars": 20, "max_chars": 100_000}),
        FilterSpec(name="duplicate_lines", params={"max_dup_line_frac": 0.3}),
        FilterSpec(name="top_ngram", params={"n": 2, "max_frac": 0.2}),
        FilterSpec(name="char_ratio", params={"min_text_frac": 0.5}),
        FilterSpec(name="url_heavy", params={"max_url_frac": 0.3}),
    ]


class DedupConfig(_Section):
    exact: bool = Field(True, description="Drop documents whose normalized text hash was seen before.")
    near: bool = Field(True, description="Drop near duplicates found with MinHash LSH.")
    ngram: int = Field(5, ge=1, description="Shingle size: characters for CJK, words for space-separated text.")
    num_perm: int = Field(128, ge=16, le=1024, description="MinHash permutations (at most 1024: each costs 4 bytes "
                          "per document in memory and in the dedup index).")
    threshold: float = Field(0.8, gt=0, lt=1, description="Jaccard threshold; bands x rows are chosen for it.")
    partitions: int = Field(
        0, ge=0, le=4096, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Partitions of the dedup step (0: one per 100,000 documents the plan may hold, at least 2). "
        "Each shard writes its exact and LSH band keys by partition (key mod partitions); each partition is a task "
        "that finds and verifies its candidate pairs with memory for its share of the keys only, and resumes on "
        "its own. More partitions: less memory per task, more files. Decisions do not depend on it.")
    incremental: bool = Field(
        True,
        description="Deduplicate against the earlier successful runs of this lineage (their kept documents' "
        "exact hashes and MinHash signatures persist in the index) and add this run's to it. Rule: a run is "
        "not deduplicated against an earlier run that read exactly the same input files (same URI, size and "
        "content hash) or a subset of them: that is a rerun of the same data (running a config twice gives the "
        "same dataset twice), not data seen before. New files (the nightly's) are deduplicated against "
        "everything earlier. A run left with no new document fails at dedup, naming the counts and the ways out.",
    )
    defer_publish: bool = Field(
        False, description="Keep this run's segment of the dedup index in <run>/data/segment/ instead of publishing "
        "it when the data stage succeeds (its documents are not 'seen before' for later runs until it is published). "
        "The nightly sets it: a night's documents enter the index only when the night is promoted.")
    lineage: str | None = Field(
        None, pattern=NAME_PATTERN,
        description="Name of the dedup index this run reads and extends; default run.name. Runs of one lineage "
        "are deduplicated against each other; a fresh name starts from nothing.",
    )
    index_uri: OutputPath | None = Field(
        None, description="Where the lineage's dedup index lives; default <output_root>/_dedup_index/<lineage>. "
        "List or clear it with `llm-pipeline dedup-index list|clear CONFIG`."
    )


class PackingConfig(_Section):
    document_mask: bool = Field(
        False, json_schema_extra=identity("data", "pretrain"),
        description="Stop attention at document boundaries in packed rows: each row gets an attention_mask column "
        "(a query attends only to earlier tokens of its own document, a document ending with its EOS) and the "
        "pretrain yaml passes it to mindformers' Llama. Off: every token attends to the whole row, across the EOS "
        "between documents. Works on mindformers 1.9's attention path without flash attention and with float32 "
        "compute (CPU; validate refuses flash attention and 16-bit compute, see docs/mindformers-facts.md). Costs "
        "4 x seq_length^2 bytes per row in the MindRecord files (16 KiB at seq 64, 1 MiB at seq 512). Position ids "
        "are not reset: mindformers' Llama ignores them in training and its rotary embedding is relative.")


class DecontaminationConfig(_Section):
    enabled: bool = Field(
        True, description="Drop every training document that shares a window of `ngram` consecutive tokens with an "
        "evaluation file (evaluate.reference_sets, evaluate.tasks, evaluate.prompt_files, and `files`): counted in "
        "stats.json as filtered, reason `contamination`, per evaluation file under `contaminated_by`; each one is in "
        "excluded.jsonl naming the file it overlaps (`overlaps`) and the window (`overlap`). Without it, a night whose "
        "scraper picked up the evaluation text would look like progress.")
    ngram: int = Field(
        13, ge=5, le=1000,
        description="Window length in tokens: one token per CJK character, one per word or number of other text "
        "(punctuation and spaces are not tokens; both sides NFKC-folded and lowercased). 13 = 13 CJK characters or "
        "13 English words. Shorter spans shared with a longer evaluation text are kept; a record's strings are also "
        "joined (a question and its choices) and matched as one text.")
    min_tokens: int = Field(
        8, ge=1, le=1000,
        description="An evaluation text shorter than `ngram` tokens but at least this long (a short question or "
        "answer) is matched whole: a document holding its tokens in a row is contaminated (a record's joined strings or its "
        "only string, not one choice of several). Shorter texts (a one-word "
        "answer) are not matched: they occur in ordinary text. At least `ngram`: no text is matched whole.")
    files: list[InputPath] = Field(
        default_factory=list, validate_default=True, json_schema_extra=identity("data", by="contents"),
        description="More evaluation files to hold out (jsonl; every string value of a record but `id` is "
        "evaluation text), e.g. a benchmark run elsewhere. The evaluate stage's files are always held out.")


class ReplayConfig(_Section):
    fraction: float = Field(
        0.0, ge=0, lt=1,
        description="Share of tonight's training tokens (packed train rows) replayed from what the lineage trained "
        "on before, against forgetting: 0.3 = 30% of the train split's rows are replay. 0: off. Replay rows bypass "
        "the dedup index and are never added to it; stats.json `replay` and the manifest's `token_mix` give the mix.")
    runs: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list,
        description="Run ids (under run.output_root) whose packed training rows are replayed, as written (already "
        "tokenized: same tokenizer and model.seq_length required). The nightly sets it to its promoted nights; a "
        "held night's rows are never replayed.")
    sources: list[InputPath] = Field(
        default_factory=list, validate_default=True,
        description="General corpora replayed too (jsonl / jsonl.gz with a data.text_field per line, local or "
        "s3://): tokenized once with the run's tokenizer and cached under `<output_root>/_replay_cache/`; not "
        "cleaned or deduplicated, but decontaminated. Rows are drawn uniformly from runs and sources together.")
    seed: int | None = Field(None, description="Seed of the replay sample; null: run.seed.")


class DataConfig(_Section):
    inputs: list[InputPath] = Field(
        default_factory=lambda: ["configs/data/tiny_corpus.jsonl"], validate_default=True,
        description="Local globs or s3:// prefixes of raw jsonl(.gz) / parquet files (relative paths: from the "
        "directory the command runs from, else the repository's bundled files).",
    )
    text_field: str = Field("text", description="Name of the text field in each record.")
    id_field: str = Field(
        "id", description="Field (or parquet column) holding each record's own id in the source system; every "
        "output record names it as `id` (any JSON value, kept as is; ids need not be unique). A record without it "
        "gets its location `<file>:<line>` (jsonl line 1-based, parquet row 0-based) as id.")
    keep_fields: list[str] = Field(
        default_factory=lambda: ["lang", "url", "source", "date"],
        description="Metadata fields (or parquet columns) carried into cleaned/part-*.jsonl.gz under `meta`, "
        "when a record has them (absent or null ones are left out).")
    read_batch_size: int = Field(1000, json_schema_extra=NO_OUTPUT_EFFECT,
                                 ge=1, description="Records per streamed batch.")
    shard_mb: float = Field(
        64, gt=0, description="Size of a processing shard (the unit of work), in MB of uncompressed input: plain "
        "jsonl is cut into line-aligned byte ranges, parquet into runs of row groups, and a .jsonl.gz file larger "
        "than this is decompressed once into chunks of this size. Outputs do not depend on it (but for the number "
        "of cleaned/part files).")
    docs_per_shard: int | None = Field(None, ge=1, description="Optional cap on the records of a shard (it ends "
                                       "at shard_mb or at this many records, whichever comes first); null: none.")
    num_workers: int = Field(2, json_schema_extra=NO_OUTPUT_EFFECT, ge=1, le=512,
                             description="Parallel shard workers (output does not depend on it; at most 512: "
                             "each is a process).")
    executor: Literal["prefect", "local", "dask"] = Field(
        "prefect", json_schema_extra=NO_OUTPUT_EFFECT,
        description="prefect: a task run per step (prep, dedup, tokenizer, tokenize, mindrecord, finalize), each "
        "spreading its shards over a process pool of data.num_workers, the shards not done yet named in the stage's "
        "progress artifact; local: one task runs the stage with its own process pool; dask: the same step tasks, "
        "their shards run on Dask workers (data.dask_address, or a local cluster started while the inputs are "
        "listed).")
    dask_address: str | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT,
        description="With data.executor=dask: address of an existing Dask scheduler (tcp://host:8786); its "
        "workers need this package installed and run.output_root reachable (s3:// across machines). null: a "
        "local cluster of data.num_workers worker processes, started for the stage and closed after it.")
    dask_dashboard: bool = Field(
        False, json_schema_extra=NO_OUTPUT_EFFECT,
        description="With data.executor=dask and a local cluster: serve Dask's dashboard pages and JSON (on "
        "127.0.0.1, a free port). Off by default: every local account can reach 127.0.0.1, and the pages show the "
        "run's tasks and its workers' logs; the scheduler's HTTP server then answers its health check only.")
    filters: list[FilterSpec] = Field(default_factory=_default_filters, description="Ordered cleaning filters.")
    exclude_from: list[InputPath] = Field(
        default_factory=list, json_schema_extra=identity("data", by="contents"),
        description="guard_diagnosis.json files of earlier pretrain runs (written when the loss guard tripped): the "
        "source documents packed in their bad batches are dropped before the filters (matched by origin, "
        "`<file>:<line>`), written to excluded.jsonl and counted in stats.json as filtered with reason `guard`.")
    exclude_ids: list[InputPath] = Field(
        default_factory=list, json_schema_extra=identity("data", by="contents"),
        description="Text files of source ids (data.id_field values) to drop, one per line, each a JSON value "
        "(\"doc-17\", 17) or else a string; dropped and counted as for exclude_from (reason `guard`).")
    max_line_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 31,
        description="Longest jsonl line read, in bytes (default 64 MiB; no document is that long). A longer line is "
        "streamed past, never held: quarantined with reason line_too_long (its first data.max_copy_bytes only) "
        "and counted.")
    max_copy_bytes: int = Field(
        64 << 10, ge=256, le=64 << 20,
        description="At most this many bytes of a record are copied into quarantine.jsonl (its raw field) or "
        "excluded.jsonl (its text field), default 64 KiB: enough to see why; the record's origin (file:line) leads "
        "to the whole record. A longer copy is cut and says so (raw_bytes / text_chars: the whole record's size).")
    max_records_written_per_reason: int = Field(
        1000, ge=0, le=10**9,
        description="Per input file and reason, at most this many quarantined or excluded records are written to "
        "quarantine.jsonl / excluded.jsonl (the first ones, in file order); the rest are counted, not written "
        "(stats.json: `rejected` / `filtered` count them all, `not_written` the ones beyond this cap). Bounds what "
        "a small hostile input (1 KB of gzip holding a million newlines) can write.")
    follow_symlinks: bool = Field(
        False, description="Follow symbolic links found in input folders and globs (a path named in data.inputs "
        "itself is always followed). Off by default: a link in a shared folder may point anywhere (another "
        "user's files); a folder reached twice (a link loop) is listed once either way.")
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    heldout_fraction: float = Field(
        0.05, ge=0, lt=1, description="Share of documents (chosen by hash) held out for perplexity."
    )
    mindrecord_file_mb: float = Field(
        64, gt=0, description="Target size of one MindRecord file, in MB of packed rows (4 bytes a token): the "
        "rows per file are this // (4 * (model.seq_length + 1)). A file is the MindRecord step's unit of work "
        "(its writer holds ~0.7 GB + 4x the file) and of resume; much smaller files each cost a header and a task.")
    rows_per_mindrecord_shard: int | None = Field(
        None, ge=1, description="Fixed packed rows per MindRecord file instead of mindrecord_file_mb (small "
        "files for tests); null: sized by mindrecord_file_mb.")
    remainder: Literal["drop", "pad"] = Field(
        "pad", description="Last partial row: drop it, or pad it with pad tokens excluded from the loss."
    )
    packing: PackingConfig = Field(default_factory=PackingConfig)


class TokenizerConfig(_Section):
    path: InputPath | None = Field(
        None,
        description="An existing sentencepiece tokenizer.model to load instead of training one "
        "(continued pretraining must keep the base model's tokenizer).",
    )
    model_type: Literal["bpe", "unigram"] = Field("bpe", description="sentencepiece model type.")
    vocab_size: int = Field(2000, ge=100, description="Vocabulary size to train; a CJK corpus needs at least its "
                            "distinct characters (at character_coverage) + special and byte pieces.")
    byte_fallback: bool = Field(True, description="Unknown characters become byte tokens, never `<unk>`.")
    character_coverage: float = Field(0.9995, gt=0, le=1, description="sentencepiece character_coverage.")
    sample_lines: int = Field(
        300_000, ge=101, description="Lines (paragraphs, cut at 2000 characters) of the kept training documents "
        "that sentencepiece trains on: a uniform, reproducible sample; counts in stats.json under tokenizer.sample.")
    sample_chars: int = Field(
        16_000_000, ge=10_000, description="Upper bound on that sample's characters (~46 bytes of trainer memory "
        "each: docs/data-workers.md).")
    special_tokens: list[str] = Field(
        default_factory=lambda: ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        json_schema_extra=identity("data", "sft"),
        description="User-defined symbols of a trained tokenizer (never split); sft.template=chat_markers uses "
        "the first four as its system, user, assistant, end markers (a loaded tokenizer must have them then).",
    )
    # None = from the tokenizer: a loaded model's own ids (pad = its pad piece, else unk, as Llama-2), or
    # our layout pad 0 / unk 1 / bos 2 / eos 3 for a trained one. A value set must agree with a loaded model.
    pad_id: int | None = Field(None, description="Pad id (None: the tokenizer's; trained 0, a loaded model's pad "
                               "piece, else its unk as in Llama-2). Padding is excluded from the loss.")
    unk_id: int | None = Field(None, description="Unknown-token id (None: the tokenizer's; trained 1).")
    bos_id: int | None = Field(None, description="Begin-of-sequence id (None: the tokenizer's; trained 2).")
    eos_id: int | None = Field(None, description="End-of-sequence id, joins packed documents (None: the "
                               "tokenizer's; trained 3).")
    encode_threads: int = Field(2, json_schema_extra=NO_OUTPUT_EFFECT,
                                ge=1, description="Threads for batch encoding.")


Dtype = Literal["float32", "float16", "bfloat16"]
Precision = Literal["fp32", "bf16", "fp16"]
DTYPE_FIELDS = ("compute_dtype", "param_init_type", "layernorm_compute_type", "softmax_compute_type", "rotary_dtype")


def precision_dtypes(precision: str) -> dict[str, str]:
    """The model dtypes a precision means (mindformers practice: half-precision matmuls, fp32 master
    weights, fp32 norm/softmax/RoPE for range)."""
    compute = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
    return {"compute_dtype": compute, "param_init_type": "float32", "layernorm_compute_type": "float32",
            "softmax_compute_type": "float32", "rotary_dtype": "float32"}


def precision_loss_scale(precision: str) -> str:
    """fp16 needs a dynamic loss scale (its 5-bit exponent underflows small gradients); bf16/fp32 none."""
    return "dynamic" if precision == "fp16" else "none"


class ModelConfig(_Section):
    name: str = Field("tiny_llama", pattern=NAME_PATTERN, max_length=MAX_NAME, description="Model config name registered with mindformers; unique per run.")
    seq_length: int = Field(64, json_schema_extra=identity("data", "pretrain", "sft", "evaluate"),
                            ge=8, description="Training sequence length (rows hold seq_length + 1 tokens).")
    vocab_size: int = Field(2048, json_schema_extra=identity("data", "pretrain", "sft"),
                            ge=8, description="Embedding rows; must be >= the tokenizer vocabulary.")
    hidden_size: int = Field(64, ge=8, description="Model width.")
    num_layers: int = Field(2, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads.")
    n_kv_heads: int | None = Field(None, description="KV heads for grouped-query attention; None means num_heads.")
    intermediate_size: int = Field(176, ge=8, description="SwiGLU FFN width (three matrices of hidden x this).")
    rms_norm_eps: float = Field(1e-5, gt=0, description="RMSNorm epsilon.")
    tie_word_embeddings: bool = Field(False, description="Share the embedding with the output head.")
    # Dtypes left empty (None) follow training.precision (see PRECISION_DTYPES); an explicit value
    # is kept and checked against the precision by validate.py.
    compute_dtype: Dtype | None = Field(None, description="Matmul dtype; None = from training.precision "
                                        "(fp32 float32, bf16 bfloat16, fp16 float16).")
    param_init_type: Dtype | None = Field(None, description="Parameter (master weight) dtype; None = float32 "
                                          "(mixed precision keeps fp32 master weights).")
    layernorm_compute_type: Dtype | None = Field(None, description="RMSNorm dtype; None = float32.")
    softmax_compute_type: Dtype | None = Field(None, description="Attention softmax dtype; None = float32.")
    rotary_dtype: Dtype | None = Field(None, description="RoPE dtype; None = float32.")
    use_flash_attention: bool = Field(False, description="Flash attention (Ascend only; forced off on CPU).")
    recompute: Literal["none", "selective", "attention", "ffn", "full"] = Field(
        "none", description="Activation recompute granularity (mindformers recompute_config): none; selective = "
        "mindformers' select_recompute default (the SwiGLU FFN's silu and mul outputs are rebuilt in backward); "
        "attention = the attention block (select_recompute {attention: ...}); ffn = the whole feed-forward block "
        "(select_recompute {feed_forward: ...}); full = the whole layer (recompute). `llm-pipeline plan` prints the "
        "activation memory of each (docs/planner.md).")
    recompute_layers: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Layers per pipeline stage that get model.recompute, counted from each stage's first layer "
        "(mindformers' per-stage list, e.g. [8, 4] with pipeline_stage 2); None = every layer. The other layers keep "
        "all activations. One entry per parallel.pipeline_stage.")
    recompute_slice_activation: bool = Field(
        False, description="With recompute=full: slice the kept layer input across the tensor-parallel group "
        "(mindformers recompute_slice_activation): the layer input held per layer shrinks by model_parallel.")
    comm_recompute: bool = Field(
        False, description="Communication recompute: rebuild the norm outputs' all-gathers under sequence parallel "
        "(select_comm_recompute) and the optimizer-sharding weight all-gathers (parallel_optimizer_comm_recompute) "
        "in backward instead of keeping their outputs; less memory, one more all-gather each in backward. "
        "mindformers' mp_comm_recompute stays on (its default).")
    base_checkpoint: InputPath | None = Field(None, json_schema_extra=identity("pretrain", "sft", "evaluate"),
                                              description="mindformers .ckpt to continue pretraining from.")
    hf_checkpoint: InputPath | None = Field(
        None, description="Folder with a Hugging Face Llama model.safetensors + config.json to import."
    )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.num_heads


def headroom_gb(device_memory_gb: float, explicit: float | None = None) -> float:
    """Headroom for a card of `device_memory_gb`: `explicit`, else 5 GB on >= 32 GB cards, else 8% of the card."""
    if explicit is not None:
        return explicit
    return 5.0 if device_memory_gb >= 32 else round(0.08 * device_memory_gb, 3)


class ParallelConfig(_Section):
    devices: int = Field(1, ge=1, description="Devices (cards, or CPU processes) the run uses in total.")
    data_parallel: int = Field(1, ge=1, description="Data-parallel degree.")
    model_parallel: int = Field(1, ge=1, description="Tensor-parallel degree (kept inside one node).")
    pipeline_stage: int = Field(1, ge=1, description="Pipeline stages.")
    micro_batch_num: int = Field(1, ge=1, description="Micro batches per step in pipeline parallel.")
    optimizer_shard: bool = Field(False, description="Shard optimizer states across the data-parallel group.")
    devices_per_node: int = Field(1, ge=1, description="Devices on one node.")
    mode: Literal["semi_auto", "auto"] = Field(
        "semi_auto", description="MindSpore parallel mode on Ascend: semi_auto (parallel_mode 1: the layout below, "
        "mindformers' sharding strategies) or auto (parallel_mode 2 with search_mode sharding_propagation: MindSpore "
        "propagates strategies from the annotated operators; for a topology not known in advance). The planner "
        "prices auto as the semi_auto layout of the same degrees: it cannot predict the strategies auto picks.")
    use_seq_parallel: bool = Field(
        False, description="Sequence parallel inside the tensor-parallel group (parallel_config.use_seq_parallel): "
        "norms and the layer inputs are split along the sequence, so their activations shrink by model_parallel "
        "(Korthikanti et al. 2022, 4.2.2). Needs model_parallel > 1 to do anything.")
    pipeline_offset: int | list[int] | list[list[int]] = Field(
        0, description="Layers moved between pipeline stages (mindformers model_config.offset): stage i holds "
        "num_layers // (pipeline_stage x pp_interleave_num) + offset[i] layers; the offsets sum to the remainder of "
        "that division, so the stages' layers sum to model.num_layers. One entry per stage (a list per interleave "
        "chunk with pp_interleave_num > 1); 0 = even split.")
    pp_interleave_num: int = Field(
        1, ge=1, description="Pipeline interleave (virtual stages per device, model_config.pp_interleave_num with "
        "parallel.pipeline_config.pipeline_interleave): the 1F1B bubble shrinks by this factor at the cost of more "
        "pipeline send/receives. 1 = off.")
    fast_group_size: int | None = Field(
        None, ge=1, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Devices joined by the fast intra-node interconnect (HCCS): 8 on Atlas 800T A2, 4 on Atlas 800 "
        "model 9000 (devices 0-3 and 4-7); None = devices_per_node. A tensor-parallel group must stay inside one.")
    rank_table_file: InputPath | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT,
        description="HCCL rank table (RANK_TABLE_FILE JSON: server_list / device / rank_id / device_ip): launch one "
        "process per device with RANK_TABLE_FILE, RANK_ID, DEVICE_ID instead of msrun; the nodes, their devices and "
        "each rank's node are read from it (and checked against the layout). None = msrun.")
    node_devices: list[list[Annotated[int, Field(ge=0)]]] | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Per node (in node-rank order) the device ids it runs on, exported as ASCEND_RT_VISIBLE_DEVICES "
        "on that node, e.g. [[0,1,2,3],[4,5,6,7]]; None = devices 0..devices_per_node-1 everywhere.")
    device_memory_gb: float = Field(16.0, gt=0, description="Memory of one device (the card's size), GB (1e9 bytes).")
    device_memory_headroom_gb: float | None = Field(
        None, ge=0, description="Memory left to the runtime outside MindSpore's pool, GB; None = 5 on cards of "
        ">= 32 GB (mindformers' 64 GB reference layouts set max_device_memory 59GB), else 8% of the card. "
        "context.max_device_memory and the planner's budget are device_memory_gb minus this.")
    master_addr: str = Field("127.0.0.1", description="msrun master address (node 0).")
    master_port: int = Field(8118, ge=1, le=65535, description="msrun master port.")

    @property
    def num_nodes(self) -> int:
        return -(-self.devices // self.devices_per_node)

    @property
    def headroom_gb(self) -> float:
        return headroom_gb(self.device_memory_gb, self.device_memory_headroom_gb)

    @property
    def usable_memory_gb(self) -> float:
        """What the run may use per device: the card minus the headroom (context.max_device_memory)."""
        return self.device_memory_gb - self.headroom_gb


class OptimizerConfig(_Section):
    type: Literal["AdamW"] = Field("AdamW", description="Optimizer.")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.1, ge=0, description="Decoupled weight decay.")


class LossScaleConfig(_Section):
    type: Literal["none", "static", "dynamic"] | None = Field(
        None, description="none, static (fixed value) or dynamic (grows and backs off); None = from "
        "training.precision (fp16: dynamic, bf16/fp32: none)."
    )
    init_value: float = Field(65536.0, gt=0, description="Initial (or static) loss scale.")
    factor: float = Field(2.0, gt=1, description="Dynamic scale multiply/divide factor.")
    window: int = Field(1000, ge=1, description="Dynamic: good steps before the scale grows.")


class GuardConfig(_Section):
    spike_factor: float = Field(
        5.0, gt=1, description="Stop when loss > spike_factor x the running mean of the last `window` losses."
    )
    window: int = Field(20, ge=2, description="Steps in the running mean.")
    on_failure: Literal["stop", "rollback"] = Field(
        "stop", description="stop, or roll back to the last good checkpoint and skip the bad data window."
    )
    max_rollbacks: int = Field(2, ge=0, description="Rollbacks allowed before stopping.")


ProfileRecord = Literal["memory", "communication", "stack"]


class ProfileConfig(_Section):
    """training.profile: which steps the MindSpore profiler records and what (mindformers' profile_* keys)."""

    enabled: bool = Field(False, description="Run the profiler over steps start_step..stop_step and summarise "
                          "them (step time split into compute / data wait / communication) in the stage report.")
    start_step: int = Field(2, ge=1, description="First profiled step (counted from 1 in each trainer launch; step 1 "
                            "includes graph compilation).")
    stop_step: int = Field(6, ge=1, description="Last profiled step; start_step < stop_step <= training.steps.")
    record: list[ProfileRecord] = Field(
        default_factory=lambda: ["memory"],
        description="What the profiler records besides op times: memory (tensor memory), communication "
        "(collective ops; multi-device), stack (Python call stacks).")
    level: Literal[0, 1, 2] = Field(
        1, description="mindformers profiler_level: 0 op times only, 1 + AscendCL/AICORE and small "
        "communication ops, 2 + graph-compile and runtime detail (Ascend). communication needs >= 1.")

    @model_validator(mode="before")
    @classmethod
    def _bool_shorthand(cls, value):
        # `training.profile: true` (the old bare switch) = enabled with the default window
        return {"enabled": value} if isinstance(value, bool) else value
    # start_step < stop_step <= training.steps: config/validate.py profile_issues (the stage checks it too)


class TrainingConfig(_Section):
    micro_batch_size: int = Field(4, ge=1, description="Samples per device per micro step.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro steps accumulated per optimizer step.")
    global_batch_size: int | None = Field(
        None, ge=1, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Optional check, never used as a value: samples per optimizer step are derived "
        "(micro_batch_size x gradient_accumulation_steps x parallel.data_parallel, schema.global_batch); "
        "when set, validate refuses a config whose product differs.")
    steps: int | None = Field(60, ge=1, le=10**9, description="Optimizer steps; if None, `epochs` decides.")
    epochs: int = Field(1, ge=1, le=10**6, description="Epochs over the packed data when steps is None.")
    optimizer: OptimizerConfig = Field(json_schema_extra=identity("pretrain", "sft"), default_factory=OptimizerConfig)
    learning_rate: float = Field(3e-3, gt=0, description="Peak learning rate (validate warns when it is far from "
                                 "what models of this size usually take: docs/training-schedule.md).")
    warmup_steps: int = Field(5, ge=0, description="Linear warmup steps (from 0 to learning_rate).")
    min_lr: float = Field(1e-5, ge=0, description="Floor of the decay (cosine: the last step's rate; wsd: where the "
                          "final decay ends); at most learning_rate.")
    lr_schedule: Literal["cosine", "wsd"] = Field(
        "cosine", description="cosine: warm up, then one cosine decay from learning_rate to min_lr over the rest of "
        "the run. wsd (warmup-stable-decay): warm up, hold learning_rate, and decay to min_lr over the last "
        "decay_steps (or decay_fraction) of the run; a run can be continued from its stable phase "
        "(keep_stable_weights), which the nightly's lineage schedule does (nightly.lr_schedule). "
        "docs/training-schedule.md.")
    decay_fraction: float = Field(
        0.2, gt=0, le=1, description="wsd: share of the run's steps spent in the final decay (0.2 = the last 20%, "
        "at least one step); decay_steps, when set, wins.")
    decay_steps: int | None = Field(
        None, ge=1, description="wsd: steps of the final decay; null: round(decay_fraction x training.steps).")
    decay_shape: Literal["linear", "cosine"] = Field(
        "linear", description="wsd: shape of the final decay to min_lr: linear, or a half cosine.")
    lineage_steps: int = Field(
        0, ge=0, description="wsd: optimizer steps the lineage trained at the held (pre-decay) rates before this run: "
        "the warm-up continues from there instead of from 0. The nightly's lineage schedule sets it from its "
        "state; 0 for a run of its own.")
    keep_stable_weights: bool = Field(
        False, description="wsd: also write the model's weights as they are when the decay starts (`checkpoint/merged/"
        "<name>-stable-weights.ckpt`, the manifest's `stable_checkpoint`): what the next run of the lineage continues "
        "from. Set by the nightly's lineage schedule.")
    stable_checkpoint: InputPath | None = Field(
        None, description="Weights the pretrain stage starts from instead of model.base_checkpoint, which stays the "
        "model evaluated as `base` (the nightly's lineage schedule: the promoted night's stable-phase weights, "
        "while its decayed weights are the promoted model). null: model.base_checkpoint.")
    precision: Precision = Field(
        "fp32", json_schema_extra=identity("pretrain", "sft"),
        description="Training precision: drives the model dtypes and the loss scale left empty "
        "(fp16: float16 matmuls + dynamic loss scale; bf16: bfloat16 matmuls, no scale; fp32).")
    loss_scale: LossScaleConfig = Field(json_schema_extra=identity("pretrain", "sft"),
                                        default_factory=LossScaleConfig)
    grad_clip: float = Field(1.0, json_schema_extra=identity("pretrain", "sft"),
                             gt=0, description="Global-norm gradient clipping.")
    shuffle: bool = Field(
        True, json_schema_extra=identity("pretrain", "sft"),
        description="Shuffle the packed rows each epoch (MindDataset global shuffle seeded with run.seed: "
        "the same seed gives the same order, and a resumed run skips exactly the consumed batches). Off: file "
        "order, and the loss guard can name the exact rows of a bad batch.")
    dataset_workers: int | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT,
        ge=1, description="Dataset pipeline workers per rank; None = 8 on Ascend (mindformers reference "
        "configs), 2 on CPU.")
    prefetch_size: int = Field(1, json_schema_extra=NO_OUTPUT_EFFECT,
                               ge=1, description="Batches the dataset pipeline prefetches per worker queue.")
    profile: ProfileConfig = Field(
        default_factory=ProfileConfig, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Profile a window of steps (`true`/`false` is shorthand for enabled with the default window).")
    planner_alert_factor: float = Field(
        2.0, json_schema_extra=NO_OUTPUT_EFFECT, gt=1,
        description="Warn (stage log, report) when the measured median step time or peak memory per device is more "
        "than this factor above or below the planner's prediction.")
    planner_tflops: float | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT, gt=0,
        description="Achieved TFLOP/s per device behind the planner's absolute step-time prediction; None = the "
        "platform's figure (Ascend: the planner's 150, CPU: calibrated on the tiny run, config/platform.py).")
    peak_tflops: float | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT, gt=0,
        description="Dense 16-bit peak TFLOP/s of one device, the denominator of MFU in planner_check.json; None = "
        "planner.readings.PEAK_TFLOPS by the device name npu-smi reports (Huawei-published figures only; no MFU "
        "for a card not listed). Give the vendor's figure for your exact SKU.")
    save_steps: int = Field(20, json_schema_extra=identity("pretrain", "sft"),
                            ge=1, description="Checkpoint every N steps.")
    keep_checkpoint_max: int = Field(3, json_schema_extra=identity("pretrain", "sft"),
                                     ge=1, description="Checkpoints kept.")
    checkpoint_format: Literal["ckpt", "safetensors"] = Field(
        "ckpt", json_schema_extra=identity("pretrain", "sft"),
        description="Training checkpoints: `ckpt` (mindformers 1.9's legacy format, one .ckpt per rank with the "
        "optimizer state) or `safetensors` (Checkpoint 2.0, mindformers' `use_legacy_format: False`: "
        "checkpoint/iteration_N/ with per-rank model and optimizer safetensors, common.json, metadata.json; "
        "resharded online at load). docs/checkpoints.md 'Checkpoint formats'.")
    async_save: bool = Field(
        False, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Write checkpoints in a background thread while training continues (Checkpoint 2.0 only: "
        "needs training.checkpoint_format=safetensors; the step is published in the tracker file once every rank "
        "finished, and training waits for the last save at its end).")
    preflight_steps: int = Field(10, json_schema_extra=NO_OUTPUT_EFFECT,
                                 ge=0, description="Steps of the preflight run (>= 3: it judges the loss "
                                 "trend by thirds); 0 disables it.")
    guard: GuardConfig = Field(default_factory=GuardConfig)
    timeout_seconds: int = Field(3600, json_schema_extra=NO_OUTPUT_EFFECT,
                                 ge=1, description="Launcher timeout; the whole process group is killed.")
    hang_timeout_s: float | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT, ge=0,
        description="Hang watchdog: a rank that finishes no training step for this many seconds is a hang (every "
        "rank's stacks are dumped, the trainer tree is killed, training resumes from the last verified checkpoint; "
        "a second hang at the same step fails the stage). Empty: 10 x the median step time, at least 600 s; before "
        "a launch's first step (graph compile) at least 1800 s. 0 turns the watchdog off.")
    upload_checkpoints: bool | None = Field(
        None, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Copy finished checkpoints to the run store (S3), so a retry on another machine resumes from the "
        "last uploaded one. Empty: on exactly when run.output_root is remote (s3://).")

    @model_validator(mode="after")
    def _warmup_inside_steps(self):
        # the warm-up left to this run: a lineage (wsd) may have done part of it in earlier runs
        left = max(0, self.warmup_steps - self.lineage_steps)
        if self.steps is not None and left > self.steps:
            done = f" (of which training.lineage_steps={self.lineage_steps} are done)" if self.lineage_steps else ""
            raise ValueError(
                f"training.warmup_steps={self.warmup_steps}{done} exceeds training.steps={self.steps}; "
                "lower warmup_steps or raise steps"
            )
        return self


def wsd_decay_steps(t: "TrainingConfig", steps: int | None = None) -> int:
    """Steps of a wsd run's final decay: training.decay_steps, else round(decay_fraction x steps), at least 1.
    `steps`: the run's step budget (default training.steps)."""
    steps = t.steps if steps is None else steps
    if t.decay_steps is not None:
        return t.decay_steps
    return max(1, round(t.decay_fraction * (steps or 0)))


class SFTConfig(_Section):
    inputs: list[InputPath] = Field(
        default_factory=lambda: ["configs/data/tiny_sft.jsonl"], json_schema_extra=identity("sft", by="contents"),
        validate_default=True,
        description="Instruction data: prompt/response, alpaca or messages jsonl/parquet.",
    )
    system_prompt: str | None = Field(None, description="System message added when a sample has none.")
    template: Literal["chat_markers", "llama2"] = Field(
        "chat_markers", description="Chat template. chat_markers: `<s><|system|>..<|end|><|user|>..<|end|>"
        "<|assistant|>..</s>` with the tokenizer.special_tokens markers (a tokenizer trained by the data stage). "
        "llama2: `<s>[INST] <<SYS>>\\n..\\n<</SYS>>\\n\\nuser [/INST] answer </s><s>[INST] ..`, markers as plain "
        "text, for a base model's own tokenizer (tokenizer.path).")
    truncation: Literal["drop", "truncate_prompt", "truncate_end"] = Field(
        "truncate_prompt", description="Samples longer than seq_length: drop, cut the prompt from the left, or cut the end."
    )
    packing: bool = Field(False, description="Pack several samples per row (labels stay per sample).")
    lora_rank: int = Field(8, json_schema_extra=identity("sft", "export"), ge=1, description="LoRA rank r.")
    lora_alpha: float = Field(16.0, json_schema_extra=identity("sft", "export"),
                              gt=0, description="LoRA alpha; the update is scaled by alpha / r.")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["wq", "wk", "wv", "wo"], json_schema_extra=identity("sft", "export"),
        description="Projections that get adapters."
    )
    model_name: str | None = Field(None, pattern=NAME_PATTERN, max_length=MAX_NAME, description="Name of the LoRA model config; None means `<model.name>_lora`.")
    # SFT's own optimizer schedule, batch and guard: a LoRA finetune wants a different learning rate,
    # warm-up and step budget than the pretraining run it starts from (AdamW betas, precision, loss
    # scale, clipping and checkpoint cadence are shared with `training`).
    steps: int = Field(60, ge=1, le=10**9, description="SFT optimizer steps.")
    learning_rate: float = Field(5e-3, gt=0, description="SFT peak learning rate (the default suits the tiny "
                                 "demo; LoRA on a 7B base typically uses 1e-4 to 3e-4).")
    warmup_steps: int = Field(6, ge=0, description="SFT linear warm-up steps; must be < sft.steps.")
    min_lr: float = Field(1e-5, ge=0, description="SFT cosine schedule floor; at most sft.learning_rate.")
    micro_batch_size: int = Field(4, ge=1, description="SFT samples per device per micro step.")
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, description="SFT micro steps per optimizer step; None = 1, or parallel.micro_batch_num under "
        "pipeline parallel (there they are the pipeline's micro batches: a multiple of parallel.pipeline_stage).")
    global_batch_size: int | None = Field(
        None, ge=1, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Optional check, never used as a value: SFT samples per optimizer step are derived "
        "(sft.micro_batch_size x sft gradient accumulation x parallel.data_parallel, schema.global_batch); "
        "when set, validate refuses a config whose product differs.")
    guard: GuardConfig = Field(default_factory=GuardConfig,
                               description="SFT loss guard (stop on NaN/spike; rollback is not applied to SFT).")
    allow_demo_data: bool = Field(
        False, json_schema_extra=NO_OUTPUT_EFFECT,
        description="Allow the bundled demo file configs/data/tiny_sft.jsonl as SFT data outside the tiny "
        "CPU run (validate refuses it otherwise).")


def sft_accumulation(cfg: "PipelineConfig") -> int:
    """sft.gradient_accumulation_steps, else 1 (pipeline parallel: parallel.micro_batch_num)."""
    p = cfg.parallel
    return cfg.sft.gradient_accumulation_steps or (p.micro_batch_num if p.pipeline_stage > 1 else 1)


def global_batch(cfg: "PipelineConfig", stage: Literal["pretrain", "sft"] = "pretrain") -> int:
    """Samples per optimizer step of `stage`: micro batch x gradient accumulation x parallel.data_parallel
    (training.* for pretrain, sft.* with sft_accumulation for sft). The one place it is computed; a
    `global_batch_size` stated in the config is only checked against it (validate.py)."""
    if stage == "sft":
        return cfg.sft.micro_batch_size * sft_accumulation(cfg) * cfg.parallel.data_parallel
    t = cfg.training
    return t.micro_batch_size * t.gradient_accumulation_steps * cfg.parallel.data_parallel


class EvaluateConfig(_Section):
    prompt_files: list[InputPath] = Field(
        default_factory=lambda: ["configs/eval/domain_qa.jsonl", "configs/eval/open_chat.jsonl",
                                 "configs/eval/instruction_following.jsonl"],
        json_schema_extra=identity("evaluate", "data", by="contents"),
                                 validate_default=True,
        description="Fixed prompt sets (jsonl with id, prompt, optional keywords); held out from training "
        "(data.decontamination).",
    )
    max_new_tokens: int = Field(24, ge=1, description="Tokens generated per prompt.")
    decoding: Literal["greedy", "sample"] = Field("greedy", description="Decoding strategy.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_k: int = Field(0, ge=0, description="Sampling top-k (0 = off).")
    top_p: float = Field(1.0, gt=0, le=1, description="Sampling nucleus top-p.")
    batch_size: int = Field(4, ge=1, description="Prompts decoded together.")
    perplexity_max_rows: int = Field(64, ge=1, description="Held-out rows used for perplexity.")
    reference_sets: list[InputPath] = Field(
        default_factory=lambda: ["configs/eval/general_zh.jsonl"],
        json_schema_extra=identity("evaluate", "data", by="contents"), validate_default=True,
        description="Reference text held out from all training (jsonl, a `text` field per line; the data stage drops "
        "documents that overlap it: data.decontamination), tokenized with "
        "the run's tokenizer; perplexity per checkpoint on each, beside the domain held-out perplexity: the "
        "measure of forgetting the nightly gate reads (nightly.gate).")
    reference_max_rows: int = Field(32, ge=1, le=100_000, description="Packed rows of each reference set scored.")
    reference_heldout: list[str] = Field(
        default_factory=list, json_schema_extra=identity("evaluate"),
        description="Held-out splits of earlier runs of this lineage (their data/mindrecord/heldout folder, local "
        "or s3://), scored like reference sets and reported as heldout@RUN_ID. The rows were tokenized by that "
        "run, so its tokenizer must be the run's (checked). The nightly sets it to the held-out split of its "
        "lineage's first promoted night: rows that do not move from night to night, in the lineage's own domain, "
        "so a night that forgets the domain (trained on garbage) is caught by the gate.")
    tasks: list[InputPath] = Field(
        default_factory=lambda: ["configs/eval/domain_choice.jsonl", "configs/eval/domain_classify.jsonl"],
        json_schema_extra=identity("evaluate", "data", by="contents"), validate_default=True,
        description="Task files scored by log-likelihood for every evaluated checkpoint (jsonl, docs/evaluation.md; "
        "held out from training: data.decontamination): "
        "multiple choice (question, choices, answer) or classification (text, label, over the labels its header "
        "declares). Each candidate's log-likelihood after the prompt is summed from one forward; the highest is the "
        "model's answer; accuracy per task (the nightly gate's nightly.gate.max_task_drop reads it).")
    task_batch_size: int = Field(
        16, ge=1, le=4096, description="Sequences (item x candidate, model.seq_length tokens each) per forward when "
        "scoring evaluate.tasks: no gradients, so larger than training's micro batch; it costs activation memory "
        "only (the weights are shared with the decoding graph).")
    compare_checkpoints: dict[str, InputPath] = Field(
        default_factory=dict,
        description="Extra checkpoints (label -> .ckpt path) shown side by side, e.g. last night's.")


class ExportConfig(_Section):
    batch_size: int = Field(1, ge=1, description="Fixed batch of the exported graph.")
    seq_length: int | None = Field(None, description="Fixed input length; None means model.seq_length.")
    rtol: float = Field(1e-4, gt=0, description="Relative tolerance of the logits check.")
    atol: float = Field(1e-4, gt=0, description="Absolute tolerance of the logits check.")


def _webhook_url(value: str | None) -> str | None:
    from .secrets import webhook_problem

    problem = webhook_problem(value) if value else None
    if problem:
        raise ValueError(problem)
    return value or None


class OrchestrationConfig(_Section):
    nightly_cron: str = Field("0 2 * * *", description="Cron of the nightly continued-pretraining deployment.")
    timezone: str = Field("Asia/Shanghai", description="IANA time zone of nightly_cron (the deployment's schedule; "
                          "shown by `llm-pipeline deploy` and in the deployment description).")
    failure_webhook_url: Annotated[str | None, AfterValidator(_webhook_url)] = Field(
        None, json_schema_extra=SECRET, description="POSTed on a failed run (off when None): an http(s) URL, or "
        "env:LLM_PIPELINE_SECRET_NAME naming the variable that holds it (a URL carries its token: a secret).")
    webhook_format: Literal["auto", "json", "feishu", "dingtalk", "wecom"] = Field(
        "auto", description="The body failure_webhook_url gets (and the Prefect notification block `llm-pipeline "
        "deploy` makes from it): feishu, dingtalk or wecom a text message their group robots accept, json the "
        "pipeline's own object (flow, run_id, state, name, message); auto tells the three by the URL's host, else "
        "json (docs/nightly.md, Alerts).")
    task_retries: int = Field(2, ge=0, description="Retries of a task on transient errors.")
    retry_delay_seconds: float = Field(2.0, ge=0, description="Base of the exponential backoff.")


class GateConfig(_Section):
    max_perplexity_increase: float = Field(
        0.05, ge=0, le=10, description="The budget of a night: its candidate may raise the perplexity of the domain "
        "held-out split, of each evaluate.reference_sets file and of each evaluate.reference_heldout split (the "
        "lineage's fixed held-out rows) by at most this fraction over the promoted model's, measured on the same "
        "rows in the same evaluate run (0.05 = 5%). A set regresses only when the ratio's point estimate and the "
        "lower bound of its paired-bootstrap interval (`confidence`) are both over it; the point alone over it is "
        "ambiguous (investigate).")
    max_task_drop: float = Field(0.02, ge=0, le=1, description="Largest accepted drop of a task's accuracy "
                                 "(absolute, per task) against the promoted model. A task regresses only when its "
                                 "drop is over this and a one-sided paired test on the same items (McNemar mid-p on "
                                 "the items one model got right and the other wrong) puts it beyond noise at "
                                 "1 - `confidence`; a drop over this that the test does not confirm is ambiguous.")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Confidence of the gate's intervals (perplexity: the "
                              "two-sided paired-bootstrap interval of the candidate/promoted ratio; tasks: the "
                              "one-sided test's alpha = 1 - confidence).")
    bootstrap_samples: int = Field(2000, ge=100, le=100_000, description="Resamples of the paired bootstrap over "
                                   "rows (seeded by run.seed and the set's name: the same night judges the same).")
    uniform_fraction: float = Field(
        0.8, gt=0, le=10, description="A perplexity set whose promoted-model perplexity is above this fraction of "
        "the tokenizer's vocabulary size (the perplexity of a uniform guess over its pieces) carries no signal for "
        "this lineage: it is reported as uninformative and does not decide. At the tiny default (2,000 pieces) "
        "general_zh sits at ~2,000 (uninformative) while the lineage's fixed held-out split is ~1,200 after one "
        "night and still shows a night of garbage (+16%).")
    on_regression: Literal["hold", "ask"] = Field(
        "hold", description="A clear regression (or an ambiguous night): hold (latest stays, the candidate is kept "
        "under `held` in the nightly state, the night ends Completed `Held`; an ambiguous night follows "
        "`on_investigate`) or ask (the night waits for a person in the Prefect UI: approve promotes, reject or "
        "timeout holds).")
    on_investigate: Literal["promote", "hold"] = Field(
        "promote", description="What an ambiguous night does when nobody is asked (on_regression: hold): a metric "
        "over budget whose interval or test does not confirm it, or no informative metric at all. Recorded in the "
        "history as decided by this default, with the reason; the night's message says it was ambiguous.")
    ask_timeout_hours: float = Field(12, gt=0, le=168, description="How long an `ask` night waits before it holds.")


class RetentionConfig(_Section):
    keep_promoted: int = Field(
        3, ge=1, le=1000, description="Weights-only checkpoints kept of the newest promoted nights (`latest` "
        "always among them): the nights a person can go back to. An older promoted night keeps its logs, metrics, "
        "manifests, evaluation and tokenizer; its weights are removed (docs/nightly.md, 'Disk: retention and gc').")
    held_days: float = Field(
        7, ge=0, le=3650, description="Days a held candidate's weights are kept after its night ended, so a person "
        "can still promote it (`llm-pipeline nightly promote`); then its weights are removed and it leaves `held` "
        "in the nightly state (it can no longer be promoted).")
    replay_nights: int | None = Field(
        None, ge=1, le=10000, description="With data.replay.fraction > 0: the packed rows (MindRecord) and cleaned "
        "text of the newest N promoted nights are kept and replayed; older nights' are removed and no longer "
        "replayed. null: every promoted night's (replay reads them all, so data disk grows with the lineage). "
        "With replay off no night's rows are kept, except the lineage's fixed held-out split "
        "(`reference_heldout`), which is never removed.")
    gc_after_night: bool = Field(
        True, description="Run the retention pass (what `llm-pipeline gc CONFIG` does) after each night's decision; "
        "a failed pass is a warning, never a failed night. Off: disk grows until `llm-pipeline gc` runs.")


def _time_of_day(value):
    import re

    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 24 * 60:
        value = f"{value // 60:02d}:{value % 60:02d}"  # YAML 1.1 reads an unquoted 7:30 as 450 (minutes)
    if value is not None and not isinstance(value, str):
        raise ValueError("not a time of day. Fix: HH:MM on a 24-hour clock in orchestration.timezone, in quotes, "
                         "e.g. '07:00', or leave it empty for no deadline")
    if value is not None and not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", value):
        raise ValueError("not a time of day. Fix: HH:MM on a 24-hour clock in orchestration.timezone, e.g. '07:00', "
                         "or leave it empty for no deadline")
    return value or None


class ScreenConfig(_Section):
    """The data screen (pipeline_lib/nightly/screen.py, docs/nightly.md "The data screen"): before tonight's data
    stage the promoted model and the lineage's character n-gram model score tonight's new documents in nats per
    character; a document far above the lineage's own accepted documents (scored the same way tonight) is excluded
    with reason `lineage_perplexity`."""

    enabled: bool = Field(True, description="Screen tonight's new documents before the data stage (false: every "
                          "document goes on to cleaning as before).")
    k: float = Field(
        12.0, gt=0, le=1000, description="How far outside is too far: a document is excluded when its score (nats per "
        "character) is above median + k * spread of the calibration documents (the lineage's accepted held-out "
        "documents scored by the same scorer tonight; spread = 1.4826 * their median absolute deviation, at least "
        "min_spread). Each scorer has its own threshold; either one excludes. At the tiny default good documents "
        "lie within about 8 spreads of the median, garbage beyond 25 (docs/nightly.md).")
    min_spread: float = Field(
        0.1, gt=0, le=10, description="Smallest spread (nats per character) a threshold uses, so a calibration set "
        "of near-identical scores does not put the threshold a hair above them: with k=12 a document must cost at "
        "least 1.2 nats a character more than the lineage's median.")
    quarantine_file_share: float = Field(
        0.5, gt=0, le=1, description="A file with more than this share of its screened documents excluded is "
        "quarantined as a whole: left out of tonight's inputs, consumed, and named in the night's message.")
    ngram_order: int = Field(
        5, ge=0, le=8, description="Order of the lineage's character n-gram model (the second scorer: characters in "
        "their order, which a model a few steps old does not know yet); 0 turns it off.")
    model: bool = Field(True, description="Score with the promoted model (the lineage's `latest`; on the first "
                        "night model.base_checkpoint when set). false: the n-gram model alone.")
    batch_size: int = Field(16, ge=1, le=4096, description="Windows of model.seq_length + 1 tokens per forward "
                            "of the screen's model.")
    max_chars_per_document: int = Field(
        2000, ge=64, description="A document is scored on its first this many characters (bounds the screen's time "
                                 "on very long documents; the score is per character either way).")
    sample_per_night: int = Field(
        300, ge=20, description="Accepted documents of each promoted night kept under <output_root>/_nightly/screen/ "
        "(chosen by hash): its held-out documents first (the calibration set: never trained on), then train-split "
        "ones (what the n-gram model is built from).")
    max_reference_documents: int = Field(
        3000, ge=20, description="At most this many kept documents are read per night, the newest nights first.")
    self_test_documents: int = Field(
        8, ge=0, le=200, description="Calibration documents whose characters are shuffled and scored beside "
        "tonight's each night: a scorer that lets any of them through has no power yet, and the night's message "
        "says so (0: no self-test).")


class NightlyConfig(_Section):
    gate: GateConfig = Field(default_factory=GateConfig, description="What a night must not make worse to become "
                             "tomorrow's base: paired statistics of the candidate and the promoted model on the same "
                             "rows and items, three outcomes (promote, hold, investigate), uninformative metrics "
                             "reported but never deciding (docs/nightly.md).")
    lr_schedule: Literal["per_run", "lineage"] = Field(
        "per_run", description="per_run: every night trains with training.lr_schedule as a run of its own (warm-up "
        "and decay from the full rate each night). lineage: one warmup-stable-decay across the nights "
        "(training.lr_schedule=wsd is set for the night): the lineage warms up once (training.warmup_steps in its "
        "first night), each night trains at the stable rate from the promoted night's stable-phase weights and ends "
        "with a short decay (training.decay_steps / decay_fraction); the decayed weights are evaluated, gated and "
        "handed on, the stable ones are what the next night continues. A plain `llm-pipeline run` ignores it. "
        "docs/nightly.md, The lineage schedule.")
    retention: RetentionConfig = Field(default_factory=RetentionConfig, description="What the run folders of "
                                       "decided nights keep (bounded disk); `llm-pipeline gc CONFIG` applies it.")
    deadline: Annotated[str | None, BeforeValidator(_time_of_day)] = Field(
        None, description="HH:MM in orchestration.timezone by which the night must be done (empty: none). The night "
        "cuts training.steps to what fits, measured by the previous trained night (step time, other stages), never "
        "below training.preflight_steps + 1 (nor training.warmup_steps), and says so in its message; `llm-pipeline "
        "deploy` also makes a Prefect automation that notifies when the nightly has not ended by then "
        "(docs/nightly.md).")
    on_hold: Literal["carry", "drop"] = Field(
        "carry", description="What becomes of a held night's files. carry: the next night trains them again with "
        "its own new files, from the promoted model (their documents are not 'seen before': a night's documents "
        "enter the dedup index only when it is promoted); drop: they are done with, never trained into the promoted "
        "model. The state's ledger says per file what became of it (`llm-pipeline nightly status CONFIG`).")
    max_carries: int = Field(
        2, ge=0, description="How many times a held night's file is carried to the next night; held once more, it is "
        "quarantined (reason `carried N times, held every time`) and the night asks for a person (the webhook, "
        "the state's `attention`).")
    screen: ScreenConfig = Field(default_factory=ScreenConfig, description="Tonight's documents scored against the "
                                 "lineage before they train (the data screen).")


class PipelineConfig(_Section):
    run: RunConfig = Field(default_factory=RunConfig)
    data: DataConfig = Field(json_schema_extra=identity("data"), default_factory=DataConfig)
    tokenizer: TokenizerConfig = Field(json_schema_extra=identity("data"), default_factory=TokenizerConfig)
    model: ModelConfig = Field(json_schema_extra=identity("pretrain", "sft"), default_factory=ModelConfig)
    parallel: ParallelConfig = Field(json_schema_extra=identity("pretrain"), default_factory=ParallelConfig)
    training: TrainingConfig = Field(json_schema_extra=identity("pretrain"), default_factory=TrainingConfig)
    sft: SFTConfig = Field(json_schema_extra=identity("sft"), default_factory=SFTConfig)
    evaluate: EvaluateConfig = Field(json_schema_extra=identity("evaluate"), default_factory=EvaluateConfig)
    export: ExportConfig = Field(json_schema_extra=identity("export"), default_factory=ExportConfig)
    orchestration: OrchestrationConfig = Field(json_schema_extra=NO_OUTPUT_EFFECT,
                                               default_factory=OrchestrationConfig)
    nightly: NightlyConfig = Field(json_schema_extra=NO_OUTPUT_EFFECT, default_factory=NightlyConfig)

    @model_validator(mode="after")
    def _derive_from_precision(self):
        # Fill what the user left empty from training.precision. Written past validation (into
        # __dict__) so the fields stay "not set": a later change of precision re-derives them, and
        # validate.py can tell a derived value from an explicit one.
        prec = self.training.precision
        derived = [(self.model, name, dtype) for name, dtype in precision_dtypes(prec).items()]
        derived.append((self.training.loss_scale, "type", precision_loss_scale(prec)))
        # a remote run store: another machine's retry finds the checkpoints only if they were uploaded
        derived.append((self.training, "upload_checkpoints", is_remote(self.run.output_root)))
        for section, name, value in derived:
            if name not in section.model_fields_set or getattr(section, name) is None:
                section.__dict__[name] = value
                section.model_fields_set.discard(name)
        return self



def _section_class(annotation):
    """The _Section class a field holds (directly, or as the items of a list), else None."""
    import typing

    for kind in (annotation, *typing.get_args(annotation)):
        if isinstance(kind, type) and issubclass(kind, _Section):
            return kind
    return None


def _record_paths(cls: type, path: str, seen: dict[type, set[str]]) -> None:
    for name, field in cls.model_fields.items():
        sub = _section_class(field.annotation)
        if sub is not None:
            seen.setdefault(sub, set()).add(f"{path}.{name}" if path else name)
            _record_paths(sub, f"{path}.{name}" if path else name, seen)


def _section_paths() -> dict[type, str]:
    seen: dict[type, set[str]] = {}
    _record_paths(PipelineConfig, "", seen)
    return {cls: next(iter(paths)) if len(paths) == 1 else sorted(paths)[0].rsplit(".", 1)[-1]
            for cls, paths in seen.items()}


_SECTION_PATHS.update(_section_paths())
