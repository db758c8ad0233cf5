"""The pipeline's tokenizer, data-stage side: training one, and checking a base model's (tokenizer.path).

The loaded model (`Tokenizer`: encode, decode, special ids) is pipeline_lib.model.tokenizer, what SFT,
evaluate and export use.

Ids (the tokenizer contract): the ids are the tokenizer's own. A trained model gets our layout
(`TRAINED_IDS`: pad 0, unk 1, bos 2, eos 3, or the tokenizer.*_id fields set), pad as a *control*
piece that `encode` never emits. A loaded model (tokenizer.path) keeps its layout: unk/bos/eos as the
model has them, pad = its pad piece, or unk when it has none (Llama-2: unk 0, bos 1, eos 2, pad = unk
= 0, as in mindformers' own Llama-2 configs). tokenizer.*_id fields set by the user must agree with
the model (`id_mismatches`). `tokenizer_config.json` records the ids actually used; every later stage
reads them from there (`TokenIds.read`), never from the config. The id conventions themselves
(TokenIds, trained_ids, configured_ids, id_mismatches) are pipeline_lib.model.token_ids: the model is
built with them too.
Loss masking: SFT rows mask padding by position (labels -100). Pretraining rows have no labels column:
mindformers masks every position whose *input* id equals pad_token_id, so with pad == unk a real
<unk> input is masked too; with byte fallback the tokenizer practically never emits <unk>.
The special tokens of the SFT chat format are user-defined symbols: never split, one id each.
`tokenizer_config.json` next to the model records the ids and the special tokens.

Training (`train_tokenizer`) takes an iterable of documents, cuts them into lines of at most
MAX_PIECE_CHARS characters (sentencepiece skips longer sentences), trains on a uniform
sample of `sample_lines` of them drawn with a fixed seed (`sample_lines`: sentencepiece's own sampler draws a
new sample in every process, measured: three runs, three models) (counts in tokenizer_config.json under
"sample", hence in stats.json), and uses the identity normalization and no dummy-prefix space (the cleaning filters already normalized the text;
decode gives the text back exactly; a chat template starts with its special token).
Loading an existing model (continued pretraining keeps the base model's tokenizer) checks that
its unk/bos/eos ids are the configured ones, that pad is never emitted, and that the special
tokens exist.
Raises: DataStageError naming the tokenizer.* field to change.
"""
from __future__ import annotations

import io
import json
import random
import re
from pathlib import Path
from typing import Iterable

import sentencepiece as spm

from ..model.token_ids import CONFIG_NAME, id_mismatches, model_ids, trained_ids
from ..model.tokenizer import Tokenizer
from ..storage.store import LocalStore
from .errors import DataStageError

MAX_PIECE_CHARS = 2000
TRAIN_THREADS = 4  # fixed: the trained model depends on the thread count (BPE too: 1, 2, 4, 16 give 4 models)


SAMPLE_SEED = 20240531  # any fixed value: the same lines give the same sample, hence the same model


def sample_lines(lines: Iterable[str], k: int, seed: int = SAMPLE_SEED) -> list[str]:
    """A uniform sample of `k` of `lines` (all of them when fewer), in input order; the same for the same lines."""
    rng, kept = random.Random(seed), []
    for n, line in enumerate(lines):
        if n < k:
            kept.append((n, line))
        elif (j := rng.randrange(n + 1)) < k:
            kept[j] = (n, line)
    return [line for _, line in sorted(kept, key=lambda t: t[0])]


def _lines(texts: Iterable[str], seen: dict) -> Iterable[str]:
    """Non-blank lines of `texts`, cut at MAX_PIECE_CHARS; counts documents and lines into `seen`."""
    for text in texts:
        seen["docs"] += 1
        for line in text.split("\n"):
            for i in range(0, len(line), MAX_PIECE_CHARS):
                if line[i:i + MAX_PIECE_CHARS].strip():
                    seen["lines"] += 1
                    yield line[i:i + MAX_PIECE_CHARS]


def _write_whole(path: Path, data: bytes) -> None:
    """`data` at `path`, never partial under that name (a full disk fails the temp file's write)."""
    LocalStore().put_bytes(str(path), data)


def write_config(tok: Tokenizer, source: str, **extra) -> None:
    meta = {**tok.describe(), "special_tokens": tok.special_tokens, "source": source, **extra}
    _write_whole(Path(tok.model_file).with_name(CONFIG_NAME), json.dumps(meta, indent=2, ensure_ascii=False).encode())


def train_tokenizer(texts: Iterable[str], cfg, out_dir: str | Path) -> Tokenizer:
    """Train a sentencepiece model (TokenizerConfig `cfg`) into out_dir/tokenizer.model.

    The same texts give a byte-identical model on any machine: the trainer's thread count is
    fixed (unigram and BPE results depend on it) and no output path is recorded in the model."""
    seen = {"docs": 0, "lines": 0}
    # our own sample: sentencepiece's reservoir (input_sentence_size) is reseeded on every run and
    # spm.set_random_generator_seed does not reach it (0.2.x), so the same corpus gave a new model each time
    sample = sample_lines(_lines(texts, seen), cfg.sample_lines)
    return train_on_sample(sample, seen, cfg, out_dir)


def train_on_sample(sample: list[str], seen: dict, cfg, out_dir: str | Path) -> Tokenizer:
    """Train on the lines `sample` (drawn already: train_tokenizer, or the shard workers' sample of
    tokenizer_sample.py); `seen` {"docs", "lines"}: what it was drawn from, recorded in tokenizer_config.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = trained_ids(cfg)
    if len(set(ids.values())) != 4 or min(ids.values()) < 0:
        raise DataStageError("tokenizer.pad_id/unk_id/bos_id/eos_id", ids, "the four ids must be distinct and >= 0",
                             "use e.g. pad 0, unk 1, bos 2, eos 3")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=model,
            input_sentence_size=0, shuffle_input_sentence=False,
            model_type=cfg.model_type, vocab_size=cfg.vocab_size, byte_fallback=cfg.byte_fallback,
            character_coverage=cfg.character_coverage, user_defined_symbols=list(cfg.special_tokens),
            pad_piece="<pad>", normalization_rule_name="identity", remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            split_digits=True, max_sentence_length=4 * MAX_PIECE_CHARS + 16, minloglevel=2,
            num_threads=TRAIN_THREADS, **ids)
    except RuntimeError as err:
        raise training_error(err, cfg) from None
    _write_whole(out_dir / "tokenizer.model", model.getvalue())
    tok = Tokenizer(out_dir / "tokenizer.model", pad_id=ids["pad_id"], special_tokens=list(cfg.special_tokens))
    write_config(tok, "trained", sample={"docs": seen["docs"], "lines": seen["lines"],
                                         "lines_trained": len(sample), "chars_trained": sum(map(len, sample))})
    return tok


_TOO_MANY_CHARS = re.compile(r"smaller than required_chars\. (\d+) vs (\d+)")


def training_error(err: RuntimeError, cfg) -> DataStageError:
    """The DataStageError for a failed sentencepiece training, with the fix that matches the cause."""
    too_many_chars = _TOO_MANY_CHARS.search(str(err))
    if too_many_chars:  # a CJK corpus: every kept character needs its own piece
        need = int(too_many_chars.group(2))
        return DataStageError(
            "tokenizer.vocab_size", cfg.vocab_size,
            f"the corpus needs {need} pieces (its characters at character_coverage={cfg.character_coverage:g}, "
            f"plus the special and byte pieces), more than vocab_size={cfg.vocab_size}",
            f"raise tokenizer.vocab_size to at least {need} (and model.vocab_size with it), "
            "or lower tokenizer.character_coverage (e.g. 0.995)")
    return DataStageError("tokenizer.vocab_size", cfg.vocab_size, f"sentencepiece could not train: {err}",
                          "lower tokenizer.vocab_size (the corpus is too small for it) or add data")


def lineage_tokenizer_checked(cfg) -> str | None:
    """model.tokenizer_lineage.lineage_tokenizer, its refusal as the data stage's own error."""
    from ..model.tokenizer_lineage import LineageRefused, lineage_tokenizer

    try:
        return lineage_tokenizer(cfg)
    except LineageRefused as err:
        raise DataStageError(err.field, err.value, err.problem, err.fix) from None


def load_base(model_file, cfg, template: str) -> Tokenizer:
    """A base model's tokenizer.model as the pipeline uses it: its own ids (pad: its pad piece, else unk;
    a tokenizer.*_id set must agree, see check_loaded) and, of tokenizer.special_tokens, only the pieces
    the model has, unless the SFT template is chat_markers (which needs all of its markers)."""
    tok = Tokenizer(model_file, pad_id=-1, special_tokens=[])
    tok.pad_id = cfg.pad_id if cfg.pad_id is not None else model_ids(tok.sp)["pad_id"]
    pieces = {tok.sp.id_to_piece(i) for i in range(tok.vocab_size)}
    tok.special_tokens = [x for x in cfg.special_tokens if template == "chat_markers" or x in pieces]
    return tok


def check_loaded(tok: Tokenizer, cfg, model_vocab_size: int) -> None:
    """Refuse a loaded tokenizer that contradicts a tokenizer.*_id set in TokenizerConfig, a pad id it can emit,
    missing special tokens, or more pieces than the model's embedding (`tok` has its pad already resolved)."""
    sp = tok.sp
    for field, value, problem, fix in id_mismatches(cfg, model_ids(sp), tok.model_file):
        raise DataStageError(field, value, problem, fix)
    # pad may equal unk (Llama-2): both are never emitted with byte fallback; a normal piece would be masked
    if not 0 <= tok.pad_id < tok.vocab_size or not (sp.is_control(tok.pad_id) or sp.is_unknown(tok.pad_id)):
        raise DataStageError("tokenizer.pad_id", tok.pad_id, f"{tok.model_file} can emit that id as a real token",
                             f"remove tokenizer.pad_id (the tokenizer's pad, else unk={sp.unk_id()}, is used) or set "
                             f"it to a control piece such as {model_ids(sp)['pad_id']}")
    missing = [t for t in tok.special_tokens if t not in {sp.id_to_piece(i) for i in range(tok.vocab_size)}]
    if missing:
        raise DataStageError("tokenizer.special_tokens", missing, f"{tok.model_file} has no such pieces",
                             "list only pieces the base tokenizer has (or []), or train a new one (tokenizer.path=null)")
    if tok.vocab_size > model_vocab_size:
        raise DataStageError("model.vocab_size", model_vocab_size, f"the tokenizer has {tok.vocab_size} pieces",
                             f"set model.vocab_size >= {tok.vocab_size}")
