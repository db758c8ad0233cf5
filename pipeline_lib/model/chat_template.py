"""The chat templates of the pipeline (sft.template): conversations -> token ids + which tokens are trained.

`chat_markers` (ChatTemplate, below) uses special-token markers a tokenizer trained by the data stage
has; `llama2` (Llama2Template, at the end) writes its markers as plain text, so a base model's own
tokenizer (tokenizer.path, e.g. Llama-2's) works as it is. Both train exactly the answer tokens and
their EOS; `template_for(name, tok, special_tokens)` picks one. A conversation is a list of
`Turn(role, content)`. Used by SFT (training rows) and evaluate (chat prompts).

chat_markers:

Layout of an encoded conversation (ids; `enc(x)` is the tokenizer's encoding of the text alone):

    BOS  <|system|> enc(system) <|end|>                  (when there is a system turn)
         <|user|> enc(user) <|end|>
         <|assistant|> enc(answer) EOS                   trained: enc(answer) and its EOS
         <|user|> ... <|end|>  <|assistant|> ... EOS     (further turns)

Role markers and `<|end|>` are user-defined symbols of the tokenizer (one id each, never split, never
produced from ordinary text: SFT's `train.instructions.to_turns` refuses text holding them), BOS/EOS are its
control ids, so every turn boundary is unambiguous. Each content is encoded on its own, exactly as a
pretraining document is, so the encoding of an answer does not depend on what precedes it.

Config: the markers are the first four `tokenizer.special_tokens`, in the order system, user,
assistant, end (default `<|system|> <|user|> <|assistant|> <|end|>`); BOS/EOS/pad ids come from the
tokenizer; `sft.system_prompt` is applied by `train.instructions.to_turns`.

`prompt_ids(...)` gives what a model must see to answer (ends with the `<|assistant|>` marker); decode
until EOS. `prompt_text(...)` is the same prompt as text for string-based callers (e.g. an evaluate
'{prompt}' template): BOS + its encoding equals `prompt_ids` for the pipeline's own tokenizer (trained
without sentencepiece's dummy word-start prefix, and pieces never cross a user-defined symbol); with a
loaded tokenizer that adds the prefix, use `prompt_ids`.
Labels and the truncation policy live here too, because they follow from the layout: `labels_for`
gives the id of each trained token and -100 elsewhere; `fit_to_row` (sft.truncation) makes a sample
fit a row of `row_len` tokens:
- `drop`: the sample is dropped (reason `too_long`);
- `truncate_prompt`: tokens are cut from the left of everything before the last answer (BOS kept);
  when the last answer with its marker and BOS alone does not fit, it is dropped (`response_too_long`);
- `truncate_end`: the first row_len tokens are kept; without a trained token left (position 0 never
  counts, the model shifts) it is dropped (`no_trained_tokens`).
A sample is never kept without a trained token; callers count every drop by its reason.
Raises ChatTemplateError naming tokenizer.special_tokens when the tokenizer lacks a marker, ValueError
naming sft.truncation for an unknown policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol, Sequence

from ..storage.errors import PicklableError

MARKER_ROLES = ("system", "user", "assistant", "end")
IGNORE = -100
POLICIES = ("drop", "truncate_prompt", "truncate_end")


class Turn(NamedTuple):
    """One turn of a conversation: role (system, user or assistant) and its text."""

    role: str
    content: str


class ChatTemplateError(PicklableError, ValueError):
    """The tokenizer cannot express the chat template: a config problem (no retry), naming the field."""

    def __init__(self, field: str, value: object, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


class _Tokenizer(Protocol):
    bos_id: int
    eos_id: int
    pad_id: int

    def piece_id(self, piece: str) -> int: ...
    def encode_batch(self, texts: list[str], threads: int = 2) -> list[list[int]]: ...


@dataclass(frozen=True)
class ChatTemplate:
    """Marker strings and ids, plus BOS/EOS/pad ids (see the module docstring)."""

    markers: dict[str, str]
    marker_ids: dict[str, int]
    bos_id: int
    eos_id: int
    pad_id: int

    @classmethod
    def from_tokenizer(cls, tok: _Tokenizer, special_tokens: Sequence[str]) -> "ChatTemplate":
        """Markers = the first four `special_tokens` (tokenizer.special_tokens), looked up in `tok`."""
        if len(special_tokens) < 4:
            raise ChatTemplateError(
                "tokenizer.special_tokens", list(special_tokens),
                "the chat template needs four markers (system, user, assistant, end)",
                "list e.g. ['<|system|>', '<|user|>', '<|assistant|>', '<|end|>'] and retrain the tokenizer")
        markers = dict(zip(MARKER_ROLES, special_tokens[:4]))
        ids = {}
        for role, piece in markers.items():
            try:
                ids[role] = tok.piece_id(piece)
            except KeyError:
                raise ChatTemplateError(
                    "tokenizer.special_tokens", list(special_tokens),
                    f"the tokenizer has no piece {piece!r} (the {role} marker)",
                    "train the tokenizer with these special tokens (data stage), or keep a base model's tokenizer "
                    "and set sft.template=llama2 (markers as plain text)") from None
        control = {tok.bos_id, tok.eos_id, tok.pad_id}
        if len(set(ids.values())) != 4 or control & set(ids.values()):
            raise ChatTemplateError("tokenizer.special_tokens", list(special_tokens),
                                    f"markers map to ids {ids}, which repeat or collide with BOS/EOS/pad",
                                    "use four distinct user-defined symbols")
        return cls(markers, ids, int(tok.bos_id), int(tok.eos_id), int(tok.pad_id))

    @property
    def forbidden_text(self) -> tuple[str, ...]:
        """Strings a content must not hold (the tokenizer would read them as markers)."""
        return tuple(self.markers.values())

    def assemble(self, turns: Sequence[Turn], encoded: Sequence[Sequence[int]]) -> tuple[list[int], list[bool]]:
        """Ids and a per-token `trained` flag for `turns`, given each turn's content ids."""
        if len(turns) != len(encoded):
            raise ValueError(f"{len(turns)} turns but {len(encoded)} encoded contents")
        ids, trained = [self.bos_id], [False]
        for turn, content in zip(turns, encoded):
            is_answer = turn.role == "assistant"
            ids.append(self.marker_ids[turn.role])
            trained.append(False)
            ids.extend(int(i) for i in content)
            trained.extend([is_answer] * len(content))
            ids.append(self.eos_id if is_answer else self.marker_ids["end"])
            trained.append(is_answer)
        return ids, trained

    def encode(self, tok: _Tokenizer, conversations: Sequence[Sequence[Turn]],
               threads: int = 2) -> list[tuple[list[int], list[bool]]]:
        """`assemble` for many conversations, encoding all their contents in one batch."""
        return encode_grouped(tok, [[t.content for t in conv] for conv in conversations],
                              [partial(self.assemble, conv) for conv in conversations], threads)

    def prompt_ids(self, tok: _Tokenizer, history: Sequence[Turn]) -> list[int]:
        """Ids a model continues to answer: `history` (ending with a user turn) + `<|assistant|>`."""
        if not history or history[-1].role != "user":
            raise ValueError("prompt_ids needs a history that ends with a user turn")
        ids, _ = self.assemble(history, tok.encode_batch([t.content for t in history]))
        return ids + [self.marker_ids["assistant"]]

    def prompt_text(self, user: str, system: str | None = None) -> str:
        """The single-turn prompt as text (no BOS; callers add it), e.g. for a '{prompt}' template."""
        m = self.markers
        head = f"{m['system']}{system.strip()}{m['end']}" if system else ""
        return f"{head}{m['user']}{user.strip()}{m['end']}{m['assistant']}"

    def render(self, turns: Sequence[Turn]) -> str:
        """Human-readable text of a conversation (quarantine files, debugging); not for training."""
        m = self.markers
        return "".join(f"{m[t.role]}{t.content}" + ("</s>" if t.role == "assistant" else m["end"])
                       for t in turns)


def encode_grouped(tok: _Tokenizer, groups: list[list[str]], assemble: list, threads: int) -> list:
    """assemble[i](ids of groups[i]) for every group, encoding every text of every group in one batch."""
    texts = [text for group in groups for text in group]
    flat = tok.encode_batch(texts, threads=threads) if texts else []
    out, pos = [], 0
    for group, build in zip(groups, assemble):
        out.append(build(flat[pos:pos + len(group)]))
        pos += len(group)
    return out


def labels_for(ids: list[int], trained: list[bool]) -> list[int]:
    """The label of each token: its id when trained, else -100."""
    return [i if t else IGNORE for i, t in zip(ids, trained)]


def fit_to_row(ids: list[int], trained: list[bool], row_len: int,
               policy: str) -> tuple[list[int] | None, list[bool] | None, str | None]:
    """(ids, trained, None) fitting `row_len`, or (None, None, reason) for a dropped sample."""
    if policy not in POLICIES:
        raise ValueError(f"sft.truncation={policy!r}: must be one of {POLICIES}")
    if len(ids) > row_len and policy == "drop":
        return None, None, "too_long"
    if len(ids) > row_len and policy == "truncate_end":
        ids, trained = ids[:row_len], trained[:row_len]
    elif len(ids) > row_len and any(trained):
        start = max(i for i, t in enumerate(trained) if t)  # the final EOS; walk back over its answer
        while start > 0 and trained[start - 1]:
            start -= 1
        marker = start - 1  # the <|assistant|> of the last answer
        if 1 + len(ids) - marker > row_len:
            return None, None, "response_too_long"
        cut = len(ids) - row_len
        ids, trained = ids[:1] + ids[1 + cut:], trained[:1] + trained[1 + cut:]
    if not any(trained[1:]):
        return None, None, "no_trained_tokens"
    return ids, trained, None


LLAMA2_MARKERS = {"inst": "[INST]", "inst_end": "[/INST]", "sys": "<<SYS>>\n", "sys_end": "\n<</SYS>>\n\n"}


@dataclass(frozen=True)
class Llama2Template:
    """Llama-2 chat layout with markers as plain text, encoded by the tokenizer like any text:

        BOS enc("[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{user} [/INST]") enc(answer) EOS   trained: enc(answer) EOS
        BOS enc("[INST] {user} [/INST]") enc(answer) EOS                                   (further turns)

    The system text joins the first user turn (as Meta's reference code does). Each answer is encoded on
    its own: with sentencepiece's dummy prefix (Llama-2 has it) that equals the " answer" after "[/INST]".
    Contents holding a marker are refused (`forbidden_text`) so the trained span is unambiguous.
    """

    bos_id: int
    eos_id: int
    pad_id: int
    markers: dict = None  # the marker strings (for stats and reports)

    @classmethod
    def from_tokenizer(cls, tok: _Tokenizer) -> "Llama2Template":
        return cls(int(tok.bos_id), int(tok.eos_id), int(tok.pad_id), dict(LLAMA2_MARKERS))

    @property
    def forbidden_text(self) -> tuple[str, ...]:
        return ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>")

    @staticmethod
    def segments(turns: Sequence[Turn]) -> list[tuple[str, bool]]:
        """(text, is_answer) per segment: one prompt per user turn (system folded in), one per answer."""
        m, out, system = LLAMA2_MARKERS, [], None
        for turn in turns:
            if turn.role == "system":
                system = turn.content.strip()
            elif turn.role == "user":
                head = f"{m['sys']}{system}{m['sys_end']}" if system else ""
                out.append((f"{m['inst']} {head}{turn.content.strip()} {m['inst_end']}", False))
                system = None
            else:
                out.append((turn.content.strip(), True))
        return out

    def assemble_segments(self, segments: Sequence[tuple[str, bool]],
                          encoded: Sequence[Sequence[int]]) -> tuple[list[int], list[bool]]:
        ids, trained = [self.bos_id], [False]
        for (_, is_answer), content in zip(segments, encoded):
            if not is_answer and len(ids) > 1:  # a new exchange starts with its own BOS
                ids.append(self.bos_id)
                trained.append(False)
            ids.extend(int(i) for i in content)
            trained.extend([is_answer] * len(content))
            if is_answer:
                ids.append(self.eos_id)
                trained.append(True)
        return ids, trained

    def encode(self, tok: _Tokenizer, conversations: Sequence[Sequence[Turn]],
               threads: int = 2) -> list[tuple[list[int], list[bool]]]:
        segs = [self.segments(conv) for conv in conversations]
        return encode_grouped(tok, [[text for text, _ in conv] for conv in segs],
                              [partial(self.assemble_segments, conv) for conv in segs], threads)

    def prompt_ids(self, tok: _Tokenizer, history: Sequence[Turn]) -> list[int]:
        """Ids a model continues to answer: `history` (ending with a user turn), ending with "[/INST]"."""
        if not history or history[-1].role != "user":
            raise ValueError("prompt_ids needs a history that ends with a user turn")
        return self.encode(tok, [history])[0][0]

    def prompt_text(self, user: str, system: str | None = None) -> str:
        turns = ([Turn("system", system)] if system else []) + [Turn("user", user)]
        return self.segments(turns)[0][0]

    def render(self, turns: Sequence[Turn]) -> str:
        return " ".join(text + (" </s>" if answer else "") for text, answer in self.segments(turns))


def template_for(name: str, tok: _Tokenizer, special_tokens: Sequence[str]):
    """The template sft.template names: `chat_markers` (ChatTemplate) or `llama2` (Llama2Template)."""
    if name == "llama2":
        return Llama2Template.from_tokenizer(tok)
    if name == "chat_markers":
        return ChatTemplate.from_tokenizer(tok, special_tokens)
    raise ValueError(f"sft.template={name!r}: must be chat_markers or llama2")
