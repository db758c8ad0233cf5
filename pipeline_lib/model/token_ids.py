"""The special token ids a model is trained with: the contract between the tokenizer and the model.

`TokenIds` (pad, unk, bos, eos) as `tokenizer_config.json` records them next to tokenizer.model
(`TokenIds.read`; else the sentencepiece model's own ids) and as the LlamaConfig takes them
(`model_config()`). `trained_ids(cfg)`: the layout a tokenizer the data stage trains gets
(TRAINED_IDS: pad 0, unk 1, bos 2, eos 3, or the tokenizer.*_id fields set). `configured_ids(cfg)`:
the ids implied by TokenizerConfig alone, for callers without a data stage. `id_mismatches`: the
tokenizer.*_id fields a loaded model contradicts, each with its fix. The loaded tokenizer (encoding)
is pipeline_lib.model.tokenizer; training one is pipeline_lib.data.tokenizer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

CONFIG_NAME = "tokenizer_config.json"
ID_FIELDS = ("pad_id", "unk_id", "bos_id", "eos_id")
TRAINED_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
"""Layout of a tokenizer the data stage trains, for tokenizer.*_id fields left unset (None)."""


@dataclass(frozen=True)
class TokenIds:
    """The special ids a model is trained with (what tokenizer_config.json records)."""

    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int

    @classmethod
    def from_meta(cls, meta: dict) -> "TokenIds":
        return cls(**{f: int(meta[f]) for f in ID_FIELDS})

    @classmethod
    def read(cls, model_file: str | Path) -> "TokenIds":
        """The ids of a tokenizer.model: its tokenizer_config.json when present, else the model's own."""
        meta = Path(model_file).with_name(CONFIG_NAME)
        if meta.is_file():
            return cls.from_meta(json.loads(meta.read_text(encoding="utf-8")))
        return cls.from_meta(model_ids(spm.SentencePieceProcessor(model_file=str(model_file))))

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in ID_FIELDS}

    def model_config(self) -> dict:
        """The LlamaConfig fields (mindformers masks input positions equal to pad_token_id out of the loss)."""
        return {"bos_token_id": self.bos_id, "eos_token_id": self.eos_id, "pad_token_id": self.pad_id}


def model_ids(sp) -> dict:
    """A sentencepiece model's own ids; pad is its pad piece, else unk (a model without a pad piece)."""
    pad = sp.pad_id() if sp.pad_id() >= 0 else sp.unk_id()
    return {"pad_id": pad, "unk_id": sp.unk_id(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id()}


def trained_ids(cfg) -> dict:
    """Ids a trained tokenizer gets: the tokenizer.*_id fields, TRAINED_IDS where they are unset."""
    return {f: TRAINED_IDS[f] if getattr(cfg, f) is None else getattr(cfg, f) for f in ID_FIELDS}


def configured_ids(cfg) -> TokenIds:
    """Ids implied by TokenizerConfig alone, for callers without a data stage: a local tokenizer.path's own
    (pad overridden when tokenizer.pad_id is set), else `trained_ids`. Stages read tokenizer_config.json."""
    if cfg.path and not cfg.path.startswith("s3://") and Path(cfg.path).expanduser().is_file():
        have = model_ids(spm.SentencePieceProcessor(model_file=str(Path(cfg.path).expanduser())))
        return TokenIds.from_meta({**have, **({} if cfg.pad_id is None else {"pad_id": cfg.pad_id})})
    return TokenIds.from_meta(trained_ids(cfg))


def id_mismatches(cfg, have: dict, model_file: str) -> list[tuple[str, int, str, str]]:
    """(field, value, problem, fix) for each tokenizer.*_id set in `cfg` that the loaded model contradicts."""
    out = []
    for field in ("unk_id", "bos_id", "eos_id"):
        want = getattr(cfg, field)
        if want is not None and want != have[field]:
            out.append((f"tokenizer.{field}", want, f"{model_file} has {field}={have[field]}",
                        f"remove tokenizer.{field} (the ids come from the tokenizer) or set it to {have[field]}"))
    return out
