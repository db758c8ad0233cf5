"""Fixed prompt sets: load and check them, and count expected keywords in an answer.

What: a prompt set is a jsonl file (configs/eval/*.jsonl), one object per line:
`{"id": "qa-zh-01", "prompt": "...", "keywords": ["...", ...]}`; `keywords` is optional, every
other key is kept as metadata (e.g. "lang"). The set's name is the file stem. Ids are unique over
all sets of a run, so a generation is named by its prompt id alone.

Keyword hits: a keyword hits when it occurs in the answer, case-insensitively after NFKC folding
(so full-width and half-width forms match). It is a cheap regression signal, not a quality metric.

Raises PromptSetError (a ValueError) naming the file, line and field: missing file, bad JSON,
missing or non-string id/prompt, keywords not a list of strings, duplicate ids.
"""
from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ..config.paths import resolve_input


class PromptSetError(ValueError):
    """A prompt file that cannot be used, with the file, line and fix in the message."""


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    set: str
    keywords: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict:
        return {"id": self.id, "prompt": self.prompt, "set": self.set, "keywords": list(self.keywords),
                **({"meta": self.meta} if self.meta else {})}


def resolve_prompt_file(path: str | Path) -> Path:
    """A prompt file as the config resolves it (the config's one resolver: cwd, else the repo root)."""
    return Path(resolve_input(str(path)))


def _parse_line(text: str, where: str, set_name: str) -> Prompt:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise PromptSetError(f"{where}: not valid JSON ({err.msg}); write one JSON object per line") from None
    if not isinstance(obj, dict):
        raise PromptSetError(f"{where}: expected a JSON object with 'id' and 'prompt'")
    for key in ("id", "prompt"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise PromptSetError(f"{where}: field '{key}'={obj.get(key)!r} must be a non-empty string")
    keywords = obj.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
        raise PromptSetError(f"{where}: field 'keywords'={keywords!r} must be a list of non-empty strings")
    meta = {k: v for k, v in obj.items() if k not in ("id", "prompt", "keywords")}
    return Prompt(id=obj["id"], prompt=obj["prompt"], set=set_name, keywords=tuple(keywords), meta=meta)


def load_prompt_file(path: str | Path) -> list[Prompt]:
    """Prompts of one jsonl file (blank lines skipped)."""
    p = resolve_prompt_file(path)
    if not p.is_file():
        raise PromptSetError(f"evaluate.prompt_files: {str(path)!r} not found (looked at {p}); "
                             "list existing jsonl files such as configs/eval/domain_qa.jsonl")
    prompts = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            prompts.append(_parse_line(line, f"{p}:{n}", p.stem))
    if not prompts:
        raise PromptSetError(f"{p}: no prompts; add lines like {{\"id\": \"x-01\", \"prompt\": \"...\"}}")
    return prompts


def load_prompt_sets(paths: Iterable[str | Path]) -> list[Prompt]:
    """Prompts of all files in order; ids must be unique across files."""
    out: list[Prompt] = []
    seen: dict[str, str] = {}
    for path in paths:
        for pr in load_prompt_file(path):
            if pr.id in seen:
                raise PromptSetError(f"prompt id {pr.id!r} appears in both set {seen[pr.id]!r} and set "
                                     f"{pr.set!r}; give every prompt a unique id")
            seen[pr.id] = pr.set
            out.append(pr)
    return out


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def keyword_hits(text: str, keywords: Sequence[str]) -> list[str]:
    """The keywords found in `text` (case-insensitive, NFKC-folded), in the order given."""
    folded = _fold(text)
    return [k for k in keywords if _fold(k) in folded]
