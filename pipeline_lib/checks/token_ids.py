"""The tokenizer's special ids against the config: the rules that need the model's id code or read the
tokenizer file named by tokenizer.path.

`token_id_issues(cfg)` returns ConfigIssues (field, value, problem, fix) for: a tokenizer to train with
ids sentencepiece refuses, a model.vocab_size smaller than the tokenizer, tokenizer.*_id fields that
contradict a loaded tokenizer's own ids, a pad id that is a real token, an id outside the vocabulary,
and chat markers missing from a loaded tokenizer. A tokenizer.path on s3:// or not a sentencepiece
model is left to the input checks (checks/inputs.py) and the data stage. Raises nothing.
"""
from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

from ..config.errors import ConfigIssue
from ..config.schema import PipelineConfig
from ..model.token_ids import ID_FIELDS, id_mismatches, model_ids, trained_ids


def _special_ids(tok) -> list[ConfigIssue]:
    """A tokenizer to train (TokenizerConfig) needs four distinct special ids >= 0 (sentencepiece)."""
    ids = trained_ids(tok)
    if len(set(ids.values())) != 4 or min(ids.values()) < 0:
        return [ConfigIssue("tokenizer.pad_id/unk_id/bos_id/eos_id", ids,
                            "a trained tokenizer needs four distinct ids >= 0", "use e.g. pad 0, unk 1, bos 2, eos 3")]
    return []


def token_id_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    """Special ids: a trained tokenizer gets tokenizer.*_id (or our layout); a loaded one (tokenizer.path, read
    here when it is a local file) keeps its own, which the fields set must agree with. pad == unk is allowed
    only for a loaded model (Llama-2: pad = unk = 0, never emitted with byte fallback)."""
    tok, m = cfg.tokenizer, cfg.model
    issues = _special_ids(tok) if tok.path is None else []
    if tok.path is None and tok.vocab_size > m.vocab_size:
        issues.append(ConfigIssue("model.vocab_size", m.vocab_size,
                                  f"smaller than tokenizer.vocab_size={tok.vocab_size}: token ids would index "
                                  "past the embedding", f"set model.vocab_size >= {tok.vocab_size}"))
    sp = _local_sentencepiece(tok.path)
    if tok.path is None:
        ids = trained_ids(tok)
    elif sp is not None:
        have = model_ids(sp)
        issues += [ConfigIssue(*mismatch) for mismatch in id_mismatches(tok, have, tok.path)]
        ids = {**have, "pad_id": have["pad_id"] if tok.pad_id is None else tok.pad_id}
        if sp.get_piece_size() > m.vocab_size:
            issues.append(ConfigIssue("model.vocab_size", m.vocab_size,
                                      f"smaller than the {sp.get_piece_size()} pieces of tokenizer.path={tok.path}",
                                      f"set model.vocab_size >= {sp.get_piece_size()}"))
        issues += _markers(cfg, sp)
    else:  # a remote tokenizer: the data stage checks it; check the fields set here
        ids = {f: getattr(tok, f) for f in ID_FIELDS if getattr(tok, f) is not None}
    for name, value in ids.items():
        others = [n for n, v in ids.items() if v == value and n != name]
        allowed = {"unk_id"} if tok.path is not None else set()  # Llama-2 layout
        if name == "pad_id" and set(others) - allowed:
            issues.append(ConfigIssue("tokenizer.pad_id", value,
                                      f"pad is also {', '.join(others)}: mindformers masks pad out of the "
                                      "loss, so that real token would never be learned",
                                      "remove tokenizer.pad_id (the tokenizer's own is used) or give pad an id "
                                      "the tokenizer never emits"))
        if not 0 <= value < m.vocab_size:
            issues.append(ConfigIssue(f"tokenizer.{name}", value, f"outside [0, model.vocab_size={m.vocab_size})",
                                      "use an id below model.vocab_size"))
    return issues


def _local_sentencepiece(path: str | None):
    """The sentencepiece model at a local tokenizer.path (None for no path, s3:// or a missing file)."""
    if not path or path.startswith("s3://") or not Path(path).expanduser().is_file():
        return None
    try:
        return spm.SentencePieceProcessor(model_file=str(Path(path).expanduser()))
    except (OSError, RuntimeError):
        return None  # not a sentencepiece model: the data stage reports it


def _markers(cfg: PipelineConfig, sp) -> list[ConfigIssue]:
    """sft.template=chat_markers needs its four marker pieces in a loaded tokenizer (a base model lacks them)."""
    if cfg.sft.template != "chat_markers":
        return []
    wanted = list(cfg.tokenizer.special_tokens[:4])
    missing = [t for t in wanted if sp.piece_to_id(t) == sp.unk_id() and t != sp.id_to_piece(sp.unk_id())]
    if not missing and len(wanted) == 4:
        return []
    return [ConfigIssue("sft.template", cfg.sft.template,
                        f"the chat_markers template needs the pieces {wanted} as single tokens; tokenizer.path="
                        f"{cfg.tokenizer.path} lacks {missing or 'four markers'} (a base model's tokenizer has none)",
                        "use sft.template=llama2 (markers as plain text, works with any tokenizer), or train a "
                        "tokenizer with the markers (tokenizer.path=null)")]
