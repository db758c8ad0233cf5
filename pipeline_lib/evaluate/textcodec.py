"""Text <-> token ids for evaluation: the run's sentencepiece tokenizer, its ids, and the chat format.

What: `TextCodec.load(path, tokenizer_cfg)` opens the tokenizer.model the data stage trained (or
tokenizer.path) through pipeline_lib.model.tokenizer.Tokenizer, checks that its special ids are the
ones the config (and so the model) uses, and encodes prompts in one of two formats:
- "raw": BOS + the prompt's tokens, as pretraining text is encoded (the model continues the text);
- "chat": the SFT chat template of pipeline_lib.model.chat_template (BOS, optional system turn,
  `<|user|> prompt <|end|>`, then the `<|assistant|>` marker the answer follows), exactly what the
  SFT stage trained on.
`decode(ids)` drops pad/BOS/EOS and ids past the tokenizer (model.vocab_size may be larger).

Limits: sentencepiece models only. Raises ValueError naming tokenizer.<field> when ids disagree,
FileNotFoundError for a missing file, ValueError for an unknown prompt format.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

FORMATS = ("raw", "chat")


@dataclass
class TextCodec:
    tok: object            # pipeline_lib.model.tokenizer.Tokenizer
    bos_id: int
    eos_id: int
    pad_id: int
    special_tokens: tuple
    path: str
    template: str = "chat_markers"  # sft.template: how "chat" prompts are laid out

    @classmethod
    def load(cls, path: str | Path, tokenizer_cfg, template: str = "chat_markers") -> "TextCodec":
        from ..model.tokenizer import Tokenizer
        from ..model.token_ids import TokenIds, id_mismatches

        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer {str(path)!r} not found; pass the data stage's tokenizer.model "
                                    "(or set tokenizer.path)")
        # the ids the model was trained with: the data stage's tokenizer_config.json (else the model's own)
        ids = TokenIds.read(p)
        for field, value, problem, fix in id_mismatches(tokenizer_cfg, ids.as_dict(), p.name):
            raise ValueError(f"{field}={value} but {problem}; {fix}")
        tok = Tokenizer(p, pad_id=ids.pad_id, special_tokens=list(tokenizer_cfg.special_tokens))
        return cls(tok=tok, bos_id=ids.bos_id, eos_id=ids.eos_id, pad_id=ids.pad_id,
                   special_tokens=tuple(tokenizer_cfg.special_tokens), path=str(p), template=template)

    @property
    def ids(self):
        from ..model.token_ids import TokenIds

        return TokenIds(pad_id=self.pad_id, unk_id=int(self.tok.unk_id), bos_id=self.bos_id, eos_id=self.eos_id)

    @property
    def vocab_size(self) -> int:
        return int(self.tok.vocab_size)

    def encode_prompts(self, texts: Sequence[str], fmt: str = "raw", system_prompt: str | None = None
                       ) -> list[list[int]]:
        """Token ids of each prompt in format `fmt` ("raw" or "chat"); both start with BOS."""
        if fmt == "raw":
            return [[self.bos_id] + list(row) for row in self.tok.encode_batch(list(texts))]
        if fmt == "chat":
            from ..model.chat_template import Turn, template_for

            template = template_for(self.template, self.tok, self.special_tokens)
            head = [Turn("system", system_prompt)] if system_prompt else []
            return [template.prompt_ids(self.tok, head + [Turn("user", t)]) for t in texts]
        raise ValueError(f"prompt format {fmt!r}: use one of {FORMATS}")

    def decode(self, ids: Sequence[int]) -> str:
        n = self.vocab_size
        keep = [int(t) for t in ids if int(t) not in (self.pad_id, self.bos_id, self.eos_id) and 0 <= int(t) < n]
        return self.tok.decode(keep)
