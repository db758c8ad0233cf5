"""One tokenizer per lineage: which tokenizer a checkpoint was trained with, and the refusal to mix them.

Token ids mean pieces of one sentencepiece model. Weights trained with one tokenizer and continued with
another train on garbage, and nothing else would notice: the shapes agree. So a checkpoint carries its
tokenizer:
- the pretrain stage writes `tokenizer.model` and `tokenizer_config.json` into its `checkpoint/` folder,
  beside every rank's weights, and records {uri, sha256, vocab_size} in its manifest
  (`metrics.tokenizer`);
- `tokenizer_beside(ref)` finds that file for any reference to such weights: a `.ckpt` in
  `checkpoint/rank_N/`, the merged copy `checkpoint/merged/<key>-weights.ckpt`, the `checkpoint/` folder, a
  Hugging Face folder, or any `.ckpt` with a `tokenizer.model` in its own folder (how to hand a base of
  your own to the pipeline);
- `lineage_tokenizer(cfg)` is the tokenizer a run must use: `tokenizer.path`, else the base
  checkpoint's; a run that continues weights with no known tokenizer is refused (it would train one);
- `require_same_tokenizer(ref, tokenizer, ...)` is what every stage that loads weights calls first.

Identity is the sha256 of the tokenizer.model bytes; the vocabulary size is reported beside it (two
tokenizers of one size are still different tokenizers). Storage only: no MindSpore, no sentencepiece
unless a tokenizer_config.json is missing.
Raises LineageRefused / its TokenizerMismatch (ValueErrors with field, value, problem and fix).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from ..storage import join, store_for
from ..storage.errors import PicklableError
from .token_ids import CONFIG_NAME

MODEL_NAME = "tokenizer.model"
_NESTED = re.compile(r"^(rank_\d+|merged|iteration_\d{8})$")  # folders under checkpoint/ that hold weights
_WEIGHT_FILES = (".ckpt", ".safetensors")  # training.checkpoint_format


class LineageRefused(PicklableError, ValueError):
    """A run cannot know which tokenizer its weights need (a config problem: no retry)."""

    def __init__(self, field: str, value, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


class TokenizerMismatch(LineageRefused):
    """Weights would be loaded with a tokenizer they were not trained with."""


@dataclass(frozen=True)
class TokenizerPrint:
    """What identifies a tokenizer: its file's sha256, and its vocabulary size for the message."""

    uri: str
    sha256: str
    vocab_size: int

    @classmethod
    def of(cls, uri: str, endpoint_url: str | None = None) -> "TokenizerPrint":
        store = store_for(uri, endpoint_url)
        data = store.get_bytes(uri)
        meta_uri = _sibling(uri, CONFIG_NAME)
        vocab = None
        if store.exists(meta_uri):
            vocab = json.loads(store.get_bytes(meta_uri)).get("vocab_size")
        if vocab is None:
            import sentencepiece as spm

            vocab = spm.SentencePieceProcessor(model_proto=data).get_piece_size()
        return cls(uri, hashlib.sha256(data).hexdigest(), int(vocab))

    def describe(self) -> str:
        return f"{self.uri} (sha256 {self.sha256[:16]}, {self.vocab_size} pieces)"

    def to_json(self) -> dict:
        return {"uri": self.uri, "sha256": self.sha256, "vocab_size": self.vocab_size}


def _sibling(uri: str, name: str) -> str:
    return uri.rsplit("/", 1)[0] + "/" + name if "/" in uri else name


def _parent(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[0] if "/" in uri.rstrip("/") else "."


def weights_path(ref) -> str | None:
    """The base weights of a checkpoint reference: a path, or a dict with `ckpt` / `base` (an adapter on a
    base was trained with the base's tokenizer)."""
    if ref is None:
        return None
    if isinstance(ref, dict):
        ref = ref.get("ckpt") or ref.get("base")
    elif hasattr(ref, "ckpt"):  # model.checkpoints.CheckpointRef
        ref = ref.ckpt
    return str(ref) if ref else None


def tokenizer_beside(ref, endpoint_url: str | None = None) -> str | None:
    """The tokenizer.model recorded with the weights `ref` points at, else None (see the module docstring)."""
    path = weights_path(ref)
    if not path:
        return None
    path = path.rstrip("/")
    folder = _parent(path) if path.endswith(_WEIGHT_FILES) else path
    candidates = [folder]
    if path.endswith(_WEIGHT_FILES) and _NESTED.match(folder.rsplit("/", 1)[-1]):
        candidates.append(_parent(folder))  # checkpoint/rank_0/x.ckpt -> checkpoint/
    store = store_for(path, endpoint_url)
    for c in candidates:
        uri = join(c, MODEL_NAME)
        if store.exists(uri):
            return uri
    return None


def require_same_tokenizer(ref, tokenizer_uri: str | None, endpoint_url: str | None = None, *,
                           what: str = "model.base_checkpoint") -> TokenizerPrint | None:
    """Refuse to load the weights `ref` with `tokenizer_uri` when the weights carry another tokenizer.

    Returns the weights' tokenizer print (None when they carry none: nothing to compare; a base of your own
    is your own responsibility, `lineage_tokenizer` refuses to train a new one for it). `what` names the
    setting or upstream stage the weights come from, for the message."""
    beside = tokenizer_beside(ref, endpoint_url)
    if beside is None or tokenizer_uri is None:
        return None
    theirs = TokenizerPrint.of(beside, endpoint_url)
    ours = TokenizerPrint.of(tokenizer_uri, endpoint_url)
    if theirs.sha256 != ours.sha256:
        raise TokenizerMismatch(
            "tokenizer.path", tokenizer_uri,
            f"the weights {weights_path(ref)} ({what}) were trained with the tokenizer {theirs.describe()}, this "
            f"run's tokenizer is {ours.describe()}: the same token ids would mean other pieces",
            f"set tokenizer.path={beside} (the weights' own tokenizer) and rerun the data stage, or train a new "
            "lineage from scratch (model.base_checkpoint=null, model.hf_checkpoint=null)")
    return theirs


def base_weights(cfg) -> tuple[str | None, str]:
    """(the weights this run continues, the field that names them)."""
    if cfg.model.base_checkpoint:
        return cfg.model.base_checkpoint, "model.base_checkpoint"
    if cfg.model.hf_checkpoint:
        return cfg.model.hf_checkpoint, "model.hf_checkpoint"
    return None, ""


def lineage_tokenizer(cfg) -> str | None:
    """The tokenizer this run must load, or None: train one (a run from scratch).

    tokenizer.path when set (checked against the tokenizer the base weights carry, if any); else the base
    weights' own tokenizer; a run that continues weights that carry none is refused rather than given a new
    tokenizer."""
    base, field = base_weights(cfg)
    endpoint = cfg.run.s3_endpoint_url
    if cfg.tokenizer.path:
        if base:
            require_same_tokenizer(base, cfg.tokenizer.path, endpoint, what=field)
        return cfg.tokenizer.path
    if not base:
        return None
    store = store_for(base, endpoint)
    if not store.exists(base):
        raise LineageRefused(field, base, "no such file or folder",
                             f"point {field} at the weights to continue, or set it to null to train from scratch")
    beside = tokenizer_beside(base, endpoint)
    if beside is None:
        raise LineageRefused(
            "tokenizer.path", None,
            f"{field}={base!r} continues trained weights, and no {MODEL_NAME} is recorded beside them; training a "
            "new tokenizer would give every token id of those weights another meaning",
            f"set tokenizer.path to the {MODEL_NAME} those weights were trained with (or put it in their folder; "
            "a checkpoint of this pipeline carries it in its checkpoint/ folder)")
    return beside


def attach(tokenizer_local, folder) -> list:
    """Copy a local tokenizer.model and its tokenizer_config.json into the local `folder` (beside weights), each
    written whole or not at all (LocalStore.put_file); returns the paths written."""
    from pathlib import Path

    from ..storage import LocalStore

    src, folder = Path(tokenizer_local), Path(folder)
    written = []
    for name, source in ((MODEL_NAME, src), (CONFIG_NAME, src.with_name(CONFIG_NAME))):
        if source.exists():
            LocalStore().put_file(source, str(folder / name))
            written.append(folder / name)
    return written


def heldout_tokenizer(heldout_dir: str) -> str:
    """The tokenizer that wrote a data stage's held-out rows: <run>/data/mindrecord/heldout -> <run>/data/tokenizer."""
    return join(_parent(_parent(heldout_dir.rstrip("/"))), "tokenizer", MODEL_NAME)


def require_heldout_tokenizer(heldout_dir: str, tokenizer_uri: str, endpoint_url: str | None = None, *,
                              field: str = "evaluate.reference_heldout") -> TokenizerPrint:
    """Refuse packed held-out rows of another run unless that run's tokenizer is this run's: the ids would
    mean other pieces, and the perplexity a number about nothing."""
    theirs_uri = heldout_tokenizer(heldout_dir)
    if not store_for(theirs_uri, endpoint_url).exists(theirs_uri):
        raise LineageRefused(field, heldout_dir, f"no {theirs_uri}: it is not the data/mindrecord/heldout folder of a "
                             "run of this pipeline, so the tokenizer that wrote its rows is unknown",
                             "give the data/mindrecord/heldout folder of an earlier run of this lineage")
    theirs, ours = TokenizerPrint.of(theirs_uri, endpoint_url), TokenizerPrint.of(tokenizer_uri, endpoint_url)
    if theirs.sha256 != ours.sha256:
        raise TokenizerMismatch(field, heldout_dir, f"its rows were written by the tokenizer {theirs.describe()}, this "
                                f"run's tokenizer is {ours.describe()}",
                                "score only held-out splits of this lineage (the same tokenizer.path)")
    return theirs
