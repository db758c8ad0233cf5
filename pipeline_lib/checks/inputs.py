"""Checks of a config's input files: what `validate` can find out without training.

`check_inputs(cfg, stages)` runs the input checks the stage table names for those stages
(`StageSpec.checks`, each `check(c: InputChecks)`, each run once) and returns (errors, warnings),
both lists of ConfigIssue naming the field the user set (data.inputs[1], sft.inputs[0],
evaluate.prompt_files[2] ...):
- local inputs are listed with the lister the stages use (`storage.input_files.list_inputs`), prompt sets
  and task files (evaluate.tasks) are parsed with the evaluate stage's readers, a tokenizer.path is loaded and checked as the data
  stage checks it, an hf_checkpoint folder is checked as the pretrain stage checks it (config.json and
  tensor headers), checkpoints must exist;
- s3:// entries are listed only when asked (`check_remote`: `run`, `validate --check-remote`; a plain `validate`
  opens no connection to whatever run.s3_endpoint_url names) and the endpoint answers a TCP connect within
  S3_CONNECT_TIMEOUT_S; otherwise (or without credentials) they are a warning, and the stage checks them when it runs;
- files are read with the stages' bounded reader (storage.bounded: a line over data.max_line_bytes is read past);
- a tokenizer to train gets a warning when a bounded sample of the local data.inputs already has
  more characters than tokenizer.vocab_size can hold (sentencepiece refuses that: CJK corpora).
Kept out of config/ (whose rules are pure, so configs built in memory never touch files): these read
files and call the stages' own readers. Raises nothing for a bad input: every finding is an issue.
"""
from __future__ import annotations

import json
import os
import socket
import unicodedata
from collections import Counter
from typing import Iterable
from urllib.parse import urlparse

from ..config.errors import ConfigIssue
from ..config.schema import PipelineConfig
from ..stages import stage_checks
from ..storage import LongLine, store_for
from ..storage.bounded import DEFAULT_MAX_LINE, bounded_lines
from ..storage.input_files import NoInputFiles, kind_of, list_inputs, open_arrow

S3_CONNECT_TIMEOUT_S = 2.0
SAMPLE_BYTES = 2 << 20      # characters are counted on about this much text ...
SAMPLE_RECORDS = 5000       # ... or this many records, whichever comes first


def _s3_reachable(endpoint_url: str | None) -> tuple[bool, str]:
    url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=S3_CONNECT_TIMEOUT_S).close()
        return True, url
    except OSError:
        return False, url


class InputChecks:
    """What a stage's input check is given: the config and helpers that record issues by field."""

    def __init__(self, cfg: PipelineConfig, check_remote: bool = True):
        self.cfg, self.endpoint, self.check_remote = cfg, cfg.run.s3_endpoint_url, check_remote
        self.errors: list[ConfigIssue] = []
        self.warnings: list[ConfigIssue] = []
        self._s3: tuple[bool, str] | None = None

    def s3_ok(self, field: str, uri: str) -> bool:
        """True when s3 can be asked; else records a warning for this entry."""
        if not self.check_remote:
            self.warnings.append(ConfigIssue(field, uri, "not checked: s3:// entries are checked with `validate "
                                             "--check-remote` (it connects to the endpoint) and when the stage runs",
                                             "run `llm-pipeline validate --check-remote CONFIG` to check it now"))
            return False
        if self._s3 is None:
            self._s3 = _s3_reachable(self.endpoint)
        if not self._s3[0]:
            self.warnings.append(ConfigIssue(field, uri, f"not checked: the S3 endpoint {self._s3[1]} did not answer "
                                             f"within {S3_CONNECT_TIMEOUT_S:g} s (the stage checks it when it runs)",
                                             "set run.s3_endpoint_url (or AWS_ENDPOINT_URL) to a reachable endpoint"))
        return self._s3[0]

    def s3_failed(self, field: str, uri: str, err: Exception) -> None:
        self.warnings.append(ConfigIssue(field, uri, f"not checked: S3 refused the listing ({type(err).__name__}: "
                                         f"{err})", "check the S3 credentials (AWS_ACCESS_KEY_ID ...) and the bucket"))

    def listed(self, field: str, entries: list[str], follow_symlinks: bool = False) -> None:
        for i, entry in enumerate(entries):
            name = f"{field}[{i}]"
            if entry.startswith("s3://") and not self.s3_ok(name, entry):
                continue
            try:
                list_inputs([entry], self.endpoint, field=field, follow_symlinks=follow_symlinks)
            except NoInputFiles as err:
                self.errors.append(ConfigIssue(name, entry, err.problem, err.fix))
            except Exception as err:  # botocore: credentials, access denied, no such bucket
                self.s3_failed(name, entry, err)

    def exists(self, field: str, uri: str | None, *, folder: bool = False, what: str = "file",
               otherwise: str = "set it to null") -> bool:
        if not uri:
            return False
        if uri.startswith("s3://"):
            if self.s3_ok(field, uri):
                try:
                    if not store_for(uri, self.endpoint).exists(uri):
                        self.errors.append(ConfigIssue(field, uri, "no such object or prefix on the store",
                                                       f"point {field} at an existing {what} or {otherwise}"))
                except Exception as err:
                    self.s3_failed(field, uri, err)
            return False
        ok = os.path.isdir(uri) if folder else os.path.isfile(uri)
        if not ok:
            self.errors.append(ConfigIssue(field, uri, f"no such {'folder' if folder else 'file'}",
                                           f"point {field} at an existing {what} (relative paths start at the "
                                           f"directory you run from) or {otherwise}"))
        return ok

    def prompts(self) -> None:
        from ..evaluate.prompts import PromptSetError, load_prompt_file

        for i, path in enumerate(self.cfg.evaluate.prompt_files):
            field = f"evaluate.prompt_files[{i}]"
            if self.exists(field, path, what="prompt jsonl such as configs/eval/domain_qa.jsonl",
                           otherwise="remove it from the list"):
                try:
                    load_prompt_file(path)
                except PromptSetError as err:  # its message names the line and what to write there
                    self.errors.append(ConfigIssue(field, path, str(err), "correct that line of the prompt file"))

    def tasks(self) -> None:
        from ..evaluate.loglik_tasks import TaskSetError, load_task_file

        names: dict[str, int] = {}
        for i, path in enumerate(self.cfg.evaluate.tasks):
            field = f"evaluate.tasks[{i}]"
            if not self.exists(field, path, what="task jsonl such as configs/eval/domain_choice.jsonl",
                               otherwise="remove it from the list"):
                continue
            try:
                task = load_task_file(path)
            except TaskSetError as err:  # its message names the line, the field and what to write there
                self.errors.append(ConfigIssue(field, path, str(err), "correct that line of the task file"))
                continue
            if task.name in names:
                self.errors.append(ConfigIssue(field, path, f"task name {task.name!r} is also evaluate.tasks"
                                               f"[{names[task.name]}]'s", "rename one file or give it a header 'name'"))
            names.setdefault(task.name, i)

    def tokenizer(self) -> None:
        t = self.cfg.tokenizer
        if self.exists("tokenizer.path", t.path, what="sentencepiece tokenizer.model"):
            from ..data.errors import DataStageError
            from ..data.tokenizer import check_loaded, load_base

            try:  # the data stage's own load and check (encode.build_tokenizer)
                check_loaded(load_base(t.path, t, self.cfg.sft.template), t, self.cfg.model.vocab_size)
            except DataStageError as err:
                self.errors.append(ConfigIssue(err.field, err.value, err.problem, err.fix))
            except (OSError, RuntimeError) as err:
                self.errors.append(ConfigIssue("tokenizer.path", t.path, f"not a sentencepiece model ({err})",
                                               "point tokenizer.path at a tokenizer.model"))
        elif t.path is None:
            self.vocab_vs_characters()

    def hf_folder(self) -> None:
        """The pretrain stage's own fast check (config.json against model.*, tensor names and shapes)."""
        from ..model.hf import HFImportError, check_hf_folder

        try:
            check_hf_folder(self.cfg.model.hf_checkpoint, self.cfg.model)
        except HFImportError as err:  # its message names each mismatch and the model.* value to set
            self.errors.append(ConfigIssue("model.hf_checkpoint", self.cfg.model.hf_checkpoint, str(err),
                                           "set the model.* fields the message names, or point "
                                           "model.hf_checkpoint at the checkpoint of this model"))

    def vocab_vs_characters(self) -> None:
        t = self.cfg.tokenizer
        texts = sample_texts(self.cfg.data.inputs, self.cfg.data.text_field, self.cfg.data.max_line_bytes)
        if any(f.name == "nfkc" for f in self.cfg.data.filters):  # the tokenizer trains on cleaned text
            texts = [unicodedata.normalize("NFKC", s) for s in texts]
        need = vocab_floor(required_chars(texts, t.character_coverage), t) if texts else 0
        if need > t.vocab_size:
            self.warnings.append(ConfigIssue(
                "tokenizer.vocab_size", t.vocab_size,
                f"a sample of data.inputs already needs {need} pieces (its distinct characters at "
                f"character_coverage={t.character_coverage:g}, plus the special and byte pieces): sentencepiece "
                "will refuse to train (the whole corpus may need more)",
                f"raise tokenizer.vocab_size to at least {need} (and model.vocab_size with it), "
                "or lower tokenizer.character_coverage (e.g. 0.995)"))


def vocab_floor(required: int, tok) -> int:
    """The vocab_size sentencepiece needs for `required` characters: they, the special tokens, the
    four pad/unk/bos/eos pieces and (with byte_fallback) the 256 byte pieces."""
    return required + len(tok.special_tokens) + 4 + (256 if tok.byte_fallback else 0)


def required_chars(texts: list[str], coverage: float) -> int:
    """Characters sentencepiece keeps: the most frequent ones, until they cover `coverage` of all."""
    counts = Counter(ch for s in texts for ch in s if ch not in "\r\n")  # lines are split on newlines
    total, acc = sum(counts.values()), 0
    for n, (_, c) in enumerate(counts.most_common(), start=1):
        acc += c
        if acc / total >= coverage:
            return n
    return len(counts)


def sample_texts(entries: list[str], text_field: str, max_line: int = DEFAULT_MAX_LINE) -> list[str]:
    """Texts of the first records of the local input files (SAMPLE_BYTES / SAMPLE_RECORDS at most)."""
    texts, size = [], 0
    local = [e for e in entries if not e.startswith("s3://")]
    try:
        files = list_inputs(local) if local else []
    except ValueError:  # a missing input is already an error of its own
        return []
    for uri, _ in files:
        try:
            for text in _file_texts(uri, kind_of(uri), text_field, max_line):
                texts.append(text)
                size += len(text.encode("utf-8"))
                if size >= SAMPLE_BYTES or len(texts) >= SAMPLE_RECORDS:
                    return texts
        except (OSError, EOFError, ValueError):  # a damaged file is the data stage's to quarantine
            continue
    return texts


def _file_texts(path: str, kind: str | None, text_field: str, max_line: int):
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
            if text_field not in pf.schema_arrow.names:  # named by parquet_text_columns; no column 0 to read
                return
            for batch in pf.iter_batches(batch_size=1000, columns=[text_field]):
                yield from (v for v in batch.column(0).to_pylist() if isinstance(v, str))
        except (KeyError, ValueError, OSError, IndexError):
            return
        return
    if kind == "arrow":
        try:
            schema, batches = open_arrow(path)
            if text_field not in schema.names:  # named by parquet_text_columns
                return
            for batch in batches:
                yield from (v for v in batch.column(text_field).to_pylist() if isinstance(v, str))
        except (KeyError, ValueError, OSError, IndexError):
            return
        return
    for line in bounded_lines(path, field="data.inputs", max_line=max_line):
        if not isinstance(line, LongLine):  # a line over data.max_line_bytes: read past, as the stage does
            try:
                value = json.loads(line).get(text_field)
            except (ValueError, AttributeError, RecursionError):
                continue
            if isinstance(value, str):
                yield value


def data_inputs(c: InputChecks) -> None:
    c.listed("data.inputs", c.cfg.data.inputs, c.cfg.data.follow_symlinks)  # as the data stage lists them
    parquet_text_columns(c)


def parquet_text_columns(c: InputChecks) -> None:
    """A local parquet input without a string column data.text_field is an error (the data stage refuses it; the
    pre-check read column 0 of a batch that had none: an IndexError traceback). Reads footers only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    field = c.cfg.data.text_field
    local = [e for e in c.cfg.data.inputs if not e.startswith("s3://")]
    try:
        files = list_inputs(local, follow_symlinks=c.cfg.data.follow_symlinks) if local else []
    except ValueError:  # a missing input is already an error of its own
        return
    for uri, _ in files:
        kind = kind_of(uri)
        if kind not in ("parquet", "arrow"):
            continue
        try:
            schema = pq.ParquetFile(uri).schema_arrow if kind == "parquet" else open_arrow(uri)[0]
        except (OSError, ValueError) as err:
            c.errors.append(ConfigIssue("data.inputs", uri, f"not a readable {kind} file ({type(err).__name__})",
                                        "re-create the file, or remove it from data.inputs"))
            continue
        if field not in schema.names:
            c.errors.append(ConfigIssue("data.text_field", field, f"{kind} file {uri} has no such column (columns: "
                                        f"{schema.names[:20]})", "set data.text_field to the column holding the text"))
        elif not (pa.types.is_string(schema.field(field).type) or pa.types.is_large_string(schema.field(field).type)):
            c.errors.append(ConfigIssue("data.text_field", field, f"column is {schema.field(field).type} in {uri}, "
                                        "not a string", "point data.text_field at a string column"))


def sft_inputs(c: InputChecks) -> None:
    c.listed("sft.inputs", c.cfg.sft.inputs)
    if not any(issue.field.startswith("sft.inputs") for issue in c.errors):
        sft_records(c)


SFT_EXAMPLES = 3  # records named per finding: the first of each reason
SFT_WARN_SHARE = 0.5  # more malformed records than this share is a warning (a few is what quarantine is for)


def _shape_keys(obj, reason: str) -> str | None:
    """For a record of no known shape: the keys it has and the ones a shape needs (as the sft stage says them)."""
    from ..train.instructions import shape_keys

    return shape_keys(obj) if reason == "unknown_shape" else None


def _detail(field: str) -> str:
    return f" ({field})" if field.startswith("keys: ") else f" (field {field})"


def sft_records(c: InputChecks) -> None:
    """Parse every local SFT record as the sft stage does (instructions.to_turns: read, not tokenized): malformed
    ones are counted per reason and the first of each is named by file:line and field; fewer usable records than
    one batch is an error (the stage would fail after data and pretrain ran), more than SFT_WARN_SHARE of them
    malformed a warning.
    s3:// inputs are parsed by the stage when it runs."""
    from collections import Counter

    from ..train.instructions import SftDataError, iter_instruction_records, offending_field, to_turns

    cfg = c.cfg
    local = [entry for entry in cfg.sft.inputs if not entry.startswith("s3://")]
    if not local:
        return
    read, rejected, first = 0, Counter(), {}
    try:
        for rec in iter_instruction_records(local, c.endpoint, max_line=cfg.data.max_line_bytes):
            read += 1
            reason = rec.reason if rec.obj is None else to_turns(rec.obj, system_prompt=cfg.sft.system_prompt)[1]
            if reason:
                rejected[reason] += 1
                first.setdefault(reason, (rec.uri, rec.line, offending_field(rec.obj, reason)
                                          or _shape_keys(rec.obj, reason)))
    except SftDataError:  # a listing problem: `listed` reported it
        return
    bad = sum(rejected.values())
    need = cfg.sft.micro_batch_size * cfg.parallel.data_parallel
    usable = read - bad
    if usable >= need and bad <= read * SFT_WARN_SHARE:
        return
    counts = ", ".join(f"{reason}: {n}" for reason, n in rejected.most_common())
    where = "; ".join(f"{reason} at {uri}:{line}" + (_detail(field) if field else "")
                      for reason, (uri, line, field) in list(first.items())[:SFT_EXAMPLES])
    problem = (f"{bad} of {read} records are malformed ({counts}; first: {where})" if bad else f"{read} records")
    # refused, the stage never runs: the records are in the input files (file:line above), no quarantine.jsonl yet
    fix = "correct or remove those records in the files named (file:line); `llm-pipeline validate CONFIG` lists them"
    if usable < need:
        c.errors.append(ConfigIssue("sft.inputs", list(cfg.sft.inputs),
                                    f"{problem}, leaving {usable} usable, fewer than one batch of "
                                    f"sft.micro_batch_size x parallel.data_parallel = {need}",
                                    f"{fix}, or add instruction data" if bad else "add instruction data"))
    else:
        c.warnings.append(ConfigIssue("sft.inputs", list(cfg.sft.inputs),
                                      f"{problem}: the sft stage quarantines them and trains on the {usable} others",
                                      "correct or remove those records (the sft stage writes each one, with its "
                                      "reason and field, to <run>/sft/quarantine.jsonl)"))


def prompt_files(c: InputChecks) -> None:
    c.prompts()


def task_files(c: InputChecks) -> None:
    c.tasks()


def tokenizer(c: InputChecks) -> None:
    c.tokenizer()


def base_weights(c: InputChecks) -> None:
    m = c.cfg.model
    c.exists("model.base_checkpoint", m.base_checkpoint, what="mindformers .ckpt")
    c.exists("training.stable_checkpoint", c.cfg.training.stable_checkpoint, what="mindformers .ckpt (a wsd lineage's "
             "stable-phase weights)")
    if c.exists("model.hf_checkpoint", m.hf_checkpoint, folder=True,
                what="folder with a Hugging Face config.json and model.safetensors"):
        c.hf_folder()


BYTE_FALLBACK_WARN = 0.2  # a reference set with this share of its characters outside the tokenizer's pieces


def reference_coverage(c: InputChecks) -> None:
    """With a known tokenizer (tokenizer.path): a reference set the tokenizer mostly writes as bytes carries no
    signal for the lineage (its perplexity sits near the uniform one); the nightly gate will call it uninformative."""
    t = c.cfg.tokenizer
    if not t.path or not os.path.isfile(t.path):
        return  # a tokenizer the data stage trains: known only after it (the first night's gate says it then)
    import sentencepiece as spm

    from ..evaluate.coverage import byte_fallback_share
    from ..evaluate.reference import load_reference_set

    try:
        sp = spm.SentencePieceProcessor(model_file=t.path)
    except (OSError, RuntimeError):
        return  # the tokenizer check reports it
    for i, path in enumerate(c.cfg.evaluate.reference_sets):
        try:
            share, chars = byte_fallback_share(sp, load_reference_set(path))
        except (OSError, ValueError):
            continue  # a missing or bad file is the evaluate stage's own refusal
        if share >= BYTE_FALLBACK_WARN:
            c.warnings.append(ConfigIssue(
                f"evaluate.reference_sets[{i}]", path,
                f"{share:.0%} of its {chars:,} characters have no piece in tokenizer.path (written as bytes): a model "
                f"of this tokenizer learns little there, its perplexity sits near the uniform {sp.get_piece_size():,} "
                "and the nightly gate will report the set as uninformative (it will not decide a night)",
                "give a reference set in the language the tokenizer covers, or a tokenizer that covers its characters"))


def compare_checkpoints(c: InputChecks) -> None:
    for label, path in c.cfg.evaluate.compare_checkpoints.items():
        c.exists(f"evaluate.compare_checkpoints.{label}", path, what=".ckpt", otherwise="remove that entry")


def check_inputs(cfg: PipelineConfig, stages: Iterable[str] | None = None, check_remote: bool = True
                 ) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """(errors, warnings) about the files the config names (see the module docstring); with `stages`,
    only the files those stages read (`run --stages data` on a CPU host need not see the base weights
    that the Ascend host's pretrain stage reads)."""
    c = InputChecks(cfg, check_remote)
    for check in stage_checks(stages):
        check(c)
    return c.errors, c.warnings
