"""Evaluation tasks scored by log-likelihood: multiple choice and classification, accuracy per task.

A task file is jsonl (format: docs/evaluation.md). Its first line may be a header, an object with a `type` key:
`{"type": "multiple_choice" | "classification", "name": ..., "prompt": "...{question}..." | "...{text}...",
"labels": [...]}`; classification needs one (its `labels` are the declared label set). Then one item per line:
- multiple choice: `{"id": ..., "question": "...", "choices": ["...", ...], "answer": 0 | "<a choice>"}`;
- classification: `{"id": ..., "text": "...", "label": "<one of labels>"}`.
Without a header a file is multiple choice with the prompt `{question}\\n`. `id` is optional (default
`<task>-<line>`); other keys are kept as metadata.

Scoring (what benchmark suites call `acc`): every candidate (a choice, or each declared label) is appended to the
item's prompt and the log-likelihood of the candidate's tokens given the prompt is summed from the logits of one
forward (the worker's forward-logits path, CPU and Ascend alike); the candidate with the highest sum is the
model's answer. `accuracy_norm` divides each sum by the candidate's characters first (`acc_norm`: choices of
different lengths). The candidate's tokens are those of the prompt and the candidate encoded together
(`candidate_tokens`: sentencepiece may merge across the boundary), so a candidate is scored as the model would
read it in running text.

`load_task_file` / `load_task_sets` check a file (TaskSetError, a ValueError naming the file, the line, the field
and the fix); `encode_task` turns a task into token sequences; `score_sequences` scores them in batches of a fixed
size through a logits function (pure numpy: the tests compare it with a direct computation).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..config.paths import resolve_input

MULTIPLE_CHOICE, CLASSIFICATION = "multiple_choice", "classification"
DEFAULT_PROMPT = {MULTIPLE_CHOICE: "{question}\n", CLASSIFICATION: "{text}\n"}
SLOT = {MULTIPLE_CHOICE: "question", CLASSIFICATION: "text"}
HEADER_KEYS = {"type", "name", "prompt", "labels"}


class TaskSetError(ValueError):
    """A task file that cannot be scored, with the file, line, field and fix in the message."""


@dataclass(frozen=True)
class TaskItem:
    id: str
    context: str          # the prompt the candidates follow
    candidates: tuple[str, ...]
    answer: int           # index into candidates
    line: int
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class Task:
    name: str
    type: str
    path: str
    prompt: str
    items: list[TaskItem]
    labels: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "path": self.path, "prompt": self.prompt,
                "labels": list(self.labels), "items": len(self.items)}


def _fail(where: str, problem: str, fix: str):
    raise TaskSetError(f"{where}: {problem}; {fix}")


def _nonempty(obj: dict, key: str, where: str, fix: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        _fail(where, f"field '{key}'={value!r} must be a non-empty string", fix)
    return value


def _distinct_strings(value, key: str, where: str, example: str) -> None:
    """Candidates (choices, labels): at least two non-empty strings, each once."""
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(x, str) and x.strip() for x in value):
        _fail(where, f"field '{key}'={value!r} must list at least two non-empty strings", example)
    if len(set(value)) != len(value):
        _fail(where, f"field '{key}'={value!r} repeats an entry", f"list every one of the {key} once")


def _header(obj: dict, where: str) -> tuple[str, str | None, str | None, tuple[str, ...]]:
    kind = obj.get("type")
    if kind not in (MULTIPLE_CHOICE, CLASSIFICATION):
        _fail(where, f"field 'type'={kind!r} is not a task type", f"write \"{MULTIPLE_CHOICE}\" or \"{CLASSIFICATION}\"")
    unknown = sorted(set(obj) - HEADER_KEYS)
    if unknown:
        _fail(where, f"unknown header field(s) {unknown}", f"a header holds only {sorted(HEADER_KEYS)}")
    name = obj.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        _fail(where, f"field 'name'={name!r} must be a non-empty string", "name the task or leave 'name' out")
    prompt = obj.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str) or "{" + SLOT[kind] + "}" not in prompt:
            _fail(where, f"field 'prompt'={prompt!r} must be a string holding {{{SLOT[kind]}}}",
                  f"e.g. \"问：{{{SLOT[kind]}}}\\n答：\" (the candidate follows the prompt)")
        try:
            prompt.format(**{SLOT[kind]: ""})
        except (KeyError, IndexError, ValueError) as err:
            _fail(where, f"field 'prompt'={prompt!r} has a placeholder other than {{{SLOT[kind]}}} ({err})",
                  "write literal braces as {{ and }}")
    labels = obj.get("labels")
    if kind == CLASSIFICATION:
        _distinct_strings(labels, "labels", where, "declare the label set, e.g. \"labels\": [\"正常\", \"异常\"]")
    elif labels is not None:
        _fail(where, "field 'labels' is only for classification tasks",
              f"remove it, or set \"type\": \"{CLASSIFICATION}\"")
    return kind, name, prompt, tuple(labels or ())


def _item(obj: dict, where: str, kind: str, prompt: str, labels: tuple[str, ...], task: str, line: int) -> TaskItem:
    item_id = obj.get("id", f"{task}-{line}")
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool) or not str(item_id).strip():
        _fail(where, f"field 'id'={item_id!r} must be a non-empty string or an integer", "give the item an id")
    meta = {k: v for k, v in obj.items() if k not in ("id", "question", "choices", "answer", "text", "label")}
    if kind == MULTIPLE_CHOICE:
        if "text" in obj or "label" in obj:
            _fail(where, "fields 'text'/'label' belong to classification tasks",
                  f"write question/choices/answer, or start the file with a header {{\"type\": \"{CLASSIFICATION}\", "
                  "\"labels\": [...]}")
        question = _nonempty(obj, "question", where, "write the question the choices answer")
        choices = obj.get("choices")
        _distinct_strings(choices, "choices", where, "e.g. \"choices\": [\"红外测温\", \"清扫积尘\"]")
        answer = obj.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, (int, str)):
            _fail(where, f"field 'answer'={answer!r} must be a choice's 0-based index or its text",
                  f"e.g. \"answer\": 0 or \"answer\": {json.dumps(choices[0], ensure_ascii=False)}")
        if isinstance(answer, int):
            if not 0 <= answer < len(choices):
                _fail(where, f"field 'answer'={answer} is out of range for {len(choices)} choices",
                      f"give a 0-based index from 0 to {len(choices) - 1}")
            index = answer
        elif answer in choices:
            index = choices.index(answer)
        else:
            _fail(where, f"field 'answer'={answer!r} is none of the choices {choices!r}",
                  "give the text of one choice exactly, or its 0-based index")
        return TaskItem(str(item_id), prompt.format(question=question), tuple(choices), index, line, meta)
    if "question" in obj or "choices" in obj:
        _fail(where, "fields 'question'/'choices' belong to multiple-choice tasks",
              "write text/label in a classification file, or put multiple-choice items in their own file")
    text = _nonempty(obj, "text", where, "write the text to classify")
    label = obj.get("label")
    if label not in labels:
        _fail(where, f"field 'label'={label!r} is not in the declared labels {list(labels)!r}",
              "use one of the header's labels, or add it to the header's 'labels'")
    return TaskItem(str(item_id), prompt.format(text=text), labels, labels.index(label), line, meta)


def load_task_file(path: str | Path, shown_as: str | None = None) -> Task:
    """One task file, checked line by line (see the module docstring). `shown_as`: the path the config gave, when
    `path` is a local copy of it (an s3:// file): the task's default name and the path it reports."""
    p = Path(resolve_input(str(path)))
    if not p.is_file():
        raise TaskSetError(f"evaluate.tasks: {str(path)!r} not found (looked at {p}); list existing task jsonl files "
                           "such as configs/eval/domain_choice.jsonl")
    stem = Path(shown_as or p).name.split(".")[0]
    kind, name, prompt, labels = MULTIPLE_CHOICE, None, None, ()
    items, seen, first = [], {}, True
    for n, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{p}:{n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            _fail(where, f"not valid JSON ({err.msg})", "write one JSON object per line")
        if not isinstance(obj, dict):
            _fail(where, "expected a JSON object", "write one object per line (a header, then one item per line)")
        if "type" in obj:
            if not first:
                _fail(where, "a header (an object with 'type') after the first line",
                      "put the header on the first line of the file, once")
            kind, name, prompt, labels = _header(obj, where)
            first = False
            continue
        if first and "text" in obj and "question" not in obj:
            _fail(where, "a classification item without a header declaring the labels",
                  f"start the file with {{\"type\": \"{CLASSIFICATION}\", \"labels\": [...]}}")
        first = False
        item = _item(obj, where, kind, prompt or DEFAULT_PROMPT[kind], labels, name or stem, n)
        if item.id in seen:
            _fail(where, f"field 'id'={item.id!r} is also the id of line {seen[item.id]}", "give every item its own id")
        seen[item.id] = n
        items.append(item)
    if not items:
        _fail(str(p), "no items", "add lines like {\"question\": \"...\", \"choices\": [\"...\", \"...\"], \"answer\": 0}")
    return Task(name=name or stem, type=kind, path=str(shown_as or path), prompt=prompt or DEFAULT_PROMPT[kind],
                items=items, labels=labels)


def load_task_sets(paths, shown_as=None) -> list[Task]:
    """Every task of evaluate.tasks in order; task names (a header's name, else the file stem) are unique."""
    tasks, seen = [], {}
    for i, path in enumerate(paths):
        task = load_task_file(path, shown_as[i] if shown_as else None)
        if task.name in seen:
            raise TaskSetError(f"evaluate.tasks[{i}]: {path} is task {task.name!r}, like evaluate.tasks[{seen[task.name]}]; "
                               "give one of them another file name or a header 'name'")
        seen[task.name] = i
        tasks.append(task)
    return tasks


@dataclass
class Sequence:
    """One (item, candidate) pair as tokens: the candidate's tokens are ids[start:]."""
    item: int
    candidate: int
    ids: list[int]
    start: int
    truncated: bool = False


def candidate_tokens(context_ids: list[int], full_ids: list[int]) -> int:
    """Where the candidate's tokens start in `full_ids` (prompt + candidate encoded together): after the longest
    common prefix with the prompt alone, at most at the last token (a candidate always has a token)."""
    n = 0
    for a, b in zip(context_ids, full_ids):
        if a != b:
            break
        n += 1
    return min(n, len(full_ids) - 1)


def encode_task(task: Task, codec, fmt: str, seq_length: int, system_prompt: str | None = None) -> list[Sequence]:
    """Token sequences of every (item, candidate) of a task, each at most seq_length tokens: a long prompt keeps
    its first token (BOS) and its tail; a candidate longer than seq_length - 2 tokens keeps its head (both counted
    as `truncated` in the task's result: the model saw less than the file says)."""
    contexts = codec.encode_prompts([it.context for it in task.items], fmt, system_prompt)
    flat = [(i, c) for i, it in enumerate(task.items) for c in range(len(it.candidates))]
    if fmt == "raw":  # prompt and candidate encoded together: the candidate as it reads in running text
        fulls = codec.encode_prompts([task.items[i].context + task.items[i].candidates[c] for i, c in flat], "raw")
    else:  # a chat prompt ends with the assistant marker; the answer's tokens follow it
        answers = codec.tok.encode_batch([task.items[i].candidates[c] for i, c in flat])
        fulls = [contexts[i] + list(a) for (i, _), a in zip(flat, answers)]
    out = []
    for (i, c), full in zip(flat, fulls):
        start = candidate_tokens(contexts[i], full)
        ids, truncated = list(full), False
        room = seq_length - 2  # BOS and at least one prompt token before the candidate
        if len(ids) - start > room:
            ids, truncated = ids[:start + room], True
        if len(ids) > seq_length:  # keep BOS and the prompt's tail
            cut = len(ids) - seq_length
            ids, start, truncated = ids[:1] + ids[1 + cut:], start - cut, True
        out.append(Sequence(i, c, ids, start, truncated))
    return out


def sequence_logliks(logits_fn: Callable[[np.ndarray], np.ndarray], seqs: list[Sequence], seq_length: int,
                     pad_id: int, batch_size: int) -> np.ndarray:
    """Sum of log p(candidate token | everything before it) of every sequence, float64, in batches of
    `batch_size` rows of seq_length tokens (right-padded: a causal model's earlier logits do not see the padding)."""
    out = np.zeros(len(seqs), np.float64)
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        batch = np.full((len(chunk), seq_length), pad_id, np.int32)
        for r, s in enumerate(chunk):
            batch[r, :len(s.ids)] = s.ids
        logits = np.asarray(logits_fn(batch))
        for r, s in enumerate(chunk):
            rows = logits[r, s.start - 1:len(s.ids) - 1].astype(np.float64)  # position t predicts token t + 1
            rows = rows - rows.max(axis=-1, keepdims=True)
            logz = np.log(np.exp(rows).sum(axis=-1))
            picked = rows[np.arange(len(rows)), np.asarray(s.ids[s.start:], np.int64)]
            out[start + r] = float((picked - logz).sum())
    return out


def score_task(task: Task, seqs: list[Sequence], logliks: np.ndarray) -> tuple[dict, list[dict]]:
    """(the task's result: accuracy, accuracy_norm, counts; one record per item: the log-likelihoods, the pick)."""
    per_item: dict[int, dict[int, float]] = {}
    truncated = set()
    for s, ll in zip(seqs, logliks):
        per_item.setdefault(s.item, {})[s.candidate] = float(ll)
        if s.truncated:
            truncated.add(s.item)
    records, correct, correct_norm = [], 0, 0
    for i, it in enumerate(task.items):
        lls = [per_item[i][c] for c in range(len(it.candidates))]
        norm = [ll / max(1, len(cand)) for ll, cand in zip(lls, it.candidates)]
        pick, pick_norm = int(np.argmax(lls)), int(np.argmax(norm))
        correct += pick == it.answer
        correct_norm += pick_norm == it.answer
        records.append({"task": task.name, "id": it.id, "answer": it.candidates[it.answer],
                        "predicted": it.candidates[pick], "correct": pick == it.answer,
                        "loglik": {cand: round(ll, 4) for cand, ll in zip(it.candidates, lls)},
                        "truncated": i in truncated})
    n = len(task.items)
    result = {"task": task.name, "type": task.type, "items": n, "correct": correct, "accuracy": correct / n,
              "accuracy_norm": correct_norm / n, "chance": _chance(task), "truncated": len(truncated)}
    return result, records


def _chance(task: Task) -> float:
    return sum(1 / len(it.candidates) for it in task.items) / len(task.items)

