"""Instruction data for SFT: read jsonl / parquet records and turn each into a checked conversation.

What: `iter_instruction_records(inputs)` streams every record of `sft.inputs` (local globs, folders,
s3:// prefixes; .jsonl, .jsonl.gz, .parquet; file listing as in the data stage, `storage.input_files.list_inputs`)
as `RawRecord(id, uri, line, obj, reason, raw)`. `to_turns(obj, ...)` recognises three shapes and
returns a list of `Turn(role, content)` or a quarantine reason:

    {"prompt": ..., "response": ..., ["system": ...]}                      prompt/response
    {"instruction": ..., "input": ..., "output": ..., ["system": ...]}      alpaca (input may be empty)
    {"messages": [{"role": "system|user|assistant", "content": ...}, ...]}  multi-turn

A conversation is: an optional system turn first, then user and assistant turns alternating,
starting with user and ending with assistant. Alpaca's `input` is appended to the instruction after a
blank line. Contents are stripped of surrounding whitespace. `system_prompt` (sft.system_prompt) is
added when a sample has no system turn.

Limits: shapes are detected by non-null keys (messages, then instruction/output, then prompt/response);
other keys are ignored. Text holding a special token of the chat template (e.g. "<|user|>") is refused,
because the tokenizer would read it as a turn boundary; so is text holding a lone surrogate (a `\\udXXX`
escape without its pair: valid JSON, but no text a tokenizer or a UTF-8 file can take), and JSON nested
deeper than Python's parser goes (bad_json). A jsonl line longer than data.max_line_bytes is read past, never held
(line_too_long, its first 64 KiB as raw; storage.bounded). `offending_field(obj, reason)` names the field a refused
record has wrong (e.g. `prompt`, `messages[2].role`), for the quarantine file.
Raises SftDataError only for an input entry that matches no file; malformed records come back
with one of `REASONS` for the quarantine file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..config.load import is_utf8_text
from ..model.chat_template import Turn
from ..storage import LongLine
from ..storage.bounded import DEFAULT_MAX_LINE, bounded_lines
from ..storage.input_files import NoInputFiles, kind_of, list_inputs, open_arrow, open_parquet

ROLES = ("system", "user", "assistant")
REASONS = ("empty_line", "bad_utf8", "bad_json", "not_an_object", "unknown_shape", "field_not_string",
           "empty_prompt", "empty_response", "messages_not_list", "bad_message", "unknown_role",
           "system_not_first", "roles_out_of_order", "ends_without_response", "special_token_in_text",
           "lone_surrogate", "line_too_long")


class SftDataError(ValueError):
    """SFT data a user must fix (sft.inputs, model.seq_length ...): names the field, the value and the fix;
    a ValueError, so the stage fails at once instead of retrying."""

    def __init__(self, field: str, value: object, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


@dataclass
class RawRecord:
    """One input record: `obj` is the parsed dict, or None with `reason` (and the `raw` text) set."""

    id: str
    uri: str
    line: int
    obj: dict | None
    reason: str | None = None
    raw: str | None = None


def _parse_jsonl_line(raw: bytes) -> tuple[dict | None, str | None]:
    if not raw.strip():
        return None, "empty_line"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "bad_utf8"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None, "bad_json"
    return (obj, None) if isinstance(obj, dict) else (None, "not_an_object")


def _iter_file(uri: str, label: str, endpoint_url: str | None, max_line: int) -> Iterator[RawRecord]:
    kind = kind_of(uri)
    if kind in ("parquet", "arrow"):
        batches = open_parquet(uri, endpoint_url).iter_batches(batch_size=1000) if kind == "parquet" else \
            open_arrow(uri, endpoint_url)[1]
        row = 0
        for batch in batches:
            for obj in batch.to_pylist():  # list<struct> columns come back as lists of dicts
                yield RawRecord(f"{label}:{row}", uri, row, obj)
                row += 1
        return
    for i, raw in enumerate(bounded_lines(uri, endpoint_url, field="sft.inputs", max_line=max_line), start=1):
        if isinstance(raw, LongLine):  # read past, never held: its head only (a 2 GB sparse file took 3.2 GB)
            yield RawRecord(f"{label}:{i}", uri, i, None, "line_too_long",
                            raw.head.decode("utf-8", errors="backslashreplace") + f"... ({raw.size:,} bytes)")
        else:
            obj, reason = _parse_jsonl_line(raw)
            text = raw.decode("utf-8", errors="backslashreplace") if reason else None
            yield RawRecord(f"{label}:{i}", uri, i, obj, reason, text)


def iter_instruction_records(inputs: list[str], endpoint_url: str | None = None,
                             field: str = "sft.inputs", max_line: int = DEFAULT_MAX_LINE) -> Iterator[RawRecord]:
    """Every record of every input file, in config order (see the module docstring); a missing
    input is reported as `field`[i]; a jsonl line over `max_line` bytes is line_too_long (read past)."""
    try:
        files = list_inputs(inputs, endpoint_url, field=field)
    except NoInputFiles as err:
        raise SftDataError(err.field, err.value, err.problem, err.fix) from None
    for uri, label in files:
        yield from _iter_file(uri, label, endpoint_url, max_line)


def _text(obj: dict, key: str) -> tuple[str | None, str | None]:
    """(stripped text, None), ("", None) when absent/None, or (None, reason) when not a string."""
    value = obj.get(key)
    if value is None:
        return "", None
    if not isinstance(value, str):
        return None, "field_not_string"
    return value.strip(), None


def _from_messages(messages) -> tuple[list[Turn] | None, str | None]:
    if not isinstance(messages, list):
        return None, "messages_not_list"
    turns = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            return None, "bad_message"
        role, content = m["role"], m["content"]
        if not isinstance(role, str) or not isinstance(content, str):
            return None, "field_not_string"
        role = role.strip().lower()
        if role not in ROLES:
            return None, "unknown_role"
        if role != "system" or content.strip():  # an empty system turn says nothing: left out
            turns.append(Turn(role, content.strip()))
    return turns, None


def _flat(obj: dict, prompt_keys: tuple[str, ...], response_key: str) -> tuple[list[Turn] | None, str | None]:
    parts = []
    for key in (*prompt_keys, response_key, "system"):
        text, reason = _text(obj, key)
        if reason:
            return None, reason
        parts.append(text)
    *prompt_parts, response, system = parts
    prompt = "\n\n".join(p for p in prompt_parts if p)
    turns = [Turn("system", system)] if system else []
    return turns + [Turn("user", prompt), Turn("assistant", response)], None


def check_turns(turns: list[Turn]) -> str | None:
    """None for a valid conversation (see the module docstring), else the quarantine reason."""
    body = turns[1:] if turns and turns[0].role == "system" else turns
    if any(t.role == "system" for t in body):
        return "system_not_first"
    if not body:
        return "ends_without_response"
    for i, t in enumerate(body):
        if t.role != ("user" if i % 2 == 0 else "assistant"):
            return "roles_out_of_order"
        if not t.content:
            return "empty_prompt" if t.role == "user" else "empty_response"
    if body[-1].role != "assistant":
        return "ends_without_response"
    return None


def to_turns(obj: dict, *, system_prompt: str | None = None,
             forbidden: Iterable[str] = ()) -> tuple[list[Turn] | None, str | None]:
    """(turns, None) for a good record, (None, reason) for a malformed one."""
    shape = shape_of(obj)
    if shape == "messages":
        turns, reason = _from_messages(obj["messages"])
    elif shape == "alpaca":
        turns, reason = _flat(obj, ("instruction", "input"), "output")
    elif shape == "prompt_response":
        turns, reason = _flat(obj, ("prompt",), "response")
    else:
        return None, "unknown_shape"
    if reason:
        return None, reason
    reason = check_turns(turns)
    if reason:
        return None, reason
    if turns[0].role != "system" and system_prompt and system_prompt.strip():
        turns = [Turn("system", system_prompt.strip()), *turns]
    forbidden = [f for f in forbidden if f]
    if any(f in t.content for t in turns for f in forbidden):
        return None, "special_token_in_text"
    if not all(is_utf8_text(t.content) for t in turns):
        return None, "lone_surrogate"
    return turns, None


_FLAT_KEYS = {"alpaca": (("instruction", "input"), "output"), "prompt_response": (("prompt",), "response")}
SHAPES = "messages, instruction + output, or prompt + response"  # the keys of the shapes to_turns knows


def shape_keys(obj) -> str | None:
    """For a record of no known shape (unknown_shape): the keys it has (non-null, the first ten) and the ones a
    shape needs, e.g. "keys: question, text; expected messages, instruction + output, or prompt + response"."""
    if not isinstance(obj, dict) or shape_of(obj) != "unknown":
        return None
    found = ", ".join(sorted(str(k) for k in obj if obj[k] is not None)[:10]) or "none"
    return f"keys: {found}; expected {SHAPES}"


def offending_field(obj: dict | None, reason: str, forbidden: Iterable[str] = ()) -> str | None:
    """The field of a record `to_turns` refused with `reason` (e.g. "response", "messages[1].content"), or
    None when the reason is about the whole line or record (bad_json, unknown_shape ...)."""
    if not isinstance(obj, dict):
        return None
    shape = shape_of(obj)
    if shape in _FLAT_KEYS:
        prompts, response = _FLAT_KEYS[shape]
        keys = (*prompts, response, "system")
        if reason == "field_not_string":
            return next((k for k in keys if obj.get(k) is not None and not isinstance(obj[k], str)), None)
        if reason == "empty_prompt":
            return prompts[0]
        if reason in ("empty_response", "ends_without_response"):
            return response
        bad = [f for f in forbidden if f] if reason == "special_token_in_text" else None
        for k in keys:
            value = obj.get(k)
            if isinstance(value, str) and (any(f in value for f in bad) if bad is not None else not is_utf8_text(value)):
                return k
        return None
    if shape != "messages":
        return None
    messages = obj["messages"]
    if not isinstance(messages, list) or reason in ("messages_not_list", "ends_without_response", "system_not_first",
                                                    "roles_out_of_order", "empty_prompt", "empty_response"):
        return "messages"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            return f"messages[{i}]"
        for key in ("role", "content"):
            value = m[key]
            if not isinstance(value, str) or (key == "role" and value.strip().lower() not in ROLES) or \
                    (key == "content" and (not is_utf8_text(value) or any(f and f in value for f in forbidden))):
                return f"messages[{i}].{key}"
    return "messages"


def shape_of(obj: dict) -> str:
    """'messages', 'alpaca', 'prompt_response' or 'unknown'. A key holding null does not count, so one
    parquet file (one schema, null where a row lacks a column) can mix the shapes."""
    def has(*keys):
        return all(obj.get(k) is not None for k in keys)

    if has("messages"):
        return "messages"
    if has("instruction", "output"):
        return "alpaca"
    if has("prompt", "response"):
        return "prompt_response"
    return "unknown"
