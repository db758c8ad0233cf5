"""Evaluation tasks (pipeline_lib/evaluate/tasks.py): the file format's checks (file, line, field, fix; also through
`validate`'s pre-run checks), the shipped task set, and scoring on the real tiny mindformers Llama: the batched
log-likelihood equals a direct computation from one forward's logits, and a label the model was trained on wins
(task_scoring_check.py, in its own process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.checks.inputs import check_inputs
from pipeline_lib.config import load_config
from pipeline_lib.evaluate.loglik_tasks import (CLASSIFICATION, MULTIPLE_CHOICE, TaskSetError, candidate_tokens,
                                         load_task_file, load_task_sets)

ROOT = Path(__file__).resolve().parents[2]
HEADER = {"type": "classification", "prompt": "记录：{text}\n类别：", "labels": ["过热", "锈蚀"]}


def write(path: Path, *records) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records) + "\n",
                    encoding="utf-8")
    return path


def test_the_shipped_task_set_loads_and_the_shipped_configs_use_it():
    tasks = load_task_sets(["configs/eval/domain_choice.jsonl", "configs/eval/domain_classify.jsonl"])
    assert [(t.name, t.type) for t in tasks] == [("domain_choice", MULTIPLE_CHOICE), ("domain_classify", CLASSIFICATION)]
    assert len(tasks[0].items) >= 20 and len(tasks[1].items) >= 16
    assert tasks[1].labels == ("过热", "渗漏油", "放电", "锈蚀")
    assert {it.candidates[it.answer] for it in tasks[1].items} == set(tasks[1].labels)  # every label is an answer
    mc = tasks[0].items[4]  # "answer": "缩短" given as the choice's text
    assert mc.candidates[mc.answer] == "缩短" and mc.context.startswith("问：") and mc.context.endswith("\n答：")
    for name in ("tiny-cpu", "llama-1.5b-lite", "llama2-7b-4x64gb"):
        cfg = load_config(f"configs/pipelines/{name}.yaml")
        assert [Path(t).name for t in cfg.evaluate.tasks] == ["domain_choice.jsonl", "domain_classify.jsonl"]
        assert cfg.evaluate.task_batch_size > cfg.training.micro_batch_size


def test_a_header_less_file_is_multiple_choice_with_default_ids(tmp_path):
    task = load_task_file(write(tmp_path / "quiz.jsonl", {"question": "Q1", "choices": ["a", "b"], "answer": 1},
                                "", {"question": "Q2", "choices": ["x", "y", "z"], "answer": "z", "src": "k"}))
    assert task.name == "quiz" and task.type == MULTIPLE_CHOICE
    assert [(it.id, it.context, it.answer, it.line) for it in task.items] == [("quiz-1", "Q1\n", 1, 1),
                                                                            ("quiz-3", "Q2\n", 2, 3)]
    assert task.items[1].meta == {"src": "k"}


@pytest.mark.parametrize("records, line, field, fix", [
    ([{"question": "Q", "choices": ["a", "b"], "answer": 2}], 1, "'answer'=2", "0-based index from 0 to 1"),
    ([{"question": "Q", "choices": ["a", "b"], "answer": "c"}], 1, "'answer'='c'", "text of one choice"),
    ([{"question": "Q", "choices": ["a"], "answer": 0}], 1, "'choices'", "at least two"),
    ([{"question": "Q", "choices": ["a", "a"], "answer": 0}], 1, "'choices'", "every one of the choices once"),
    ([{"question": "", "choices": ["a", "b"], "answer": 0}], 1, "'question'", "write the question"),
    ([{"question": "Q", "choices": ["a", "b"], "answer": True}], 1, "'answer'=True", "e.g. \"answer\": 0"),
    (['{"question": "Q", '], 1, "not valid JSON", "one JSON object per line"),
    ([{"text": "t", "label": "过热"}], 1, "without a header", "\"labels\": [...]"),
    ([HEADER, {"text": "t", "label": "放电"}], 2, "'label'='放电'", "add it to the header's 'labels'"),
    ([HEADER, {"text": "t"}], 2, "'label'=None", "use one of the header's labels"),
    ([HEADER, {"question": "Q", "choices": ["a", "b"], "answer": 0}], 2, "'question'/'choices'", "own file"),
    ([{**HEADER, "labels": ["过热"]}, {"text": "t", "label": "过热"}], 1, "'labels'", "declare the label set"),
    ([{**HEADER, "labels": ["过热", "过热"]}, {"text": "t", "label": "过热"}], 1, "'labels'", "labels once"),
    ([{**HEADER, "prompt": "no slot"}], 1, "'prompt'='no slot'", "{text}"),
    ([{**HEADER, "type": "regression"}], 1, "'type'='regression'", "\"classification\""),
    ([{"question": "Q", "choices": ["a", "b"], "answer": 0}, HEADER], 2, "header", "first line"),
    ([{"id": "x", "question": "Q", "choices": ["a", "b"], "answer": 0},
      {"id": "x", "question": "R", "choices": ["a", "b"], "answer": 1}], 2, "'id'='x'", "its own id"),
])
def test_a_bad_task_file_names_the_file_line_field_and_fix(tmp_path, records, line, field, fix):
    path = write(tmp_path / "bad.jsonl", *records)
    with pytest.raises(TaskSetError) as err:
        load_task_file(path)
    assert f"{path}:{line}: " in str(err.value) and field in str(err.value) and fix in str(err.value), str(err.value)


def test_validate_refuses_a_bad_task_file_before_anything_runs(tmp_path):
    bad = write(tmp_path / "bad.jsonl", HEADER, {"text": "t", "label": "放电"})
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"evaluate.tasks=[{bad}, {tmp_path / 'absent.jsonl'}]"])
    errors, _ = check_inputs(cfg, ["evaluate"])
    by_field = {e.field: e for e in errors}
    assert "bad.jsonl:2" in str(by_field["evaluate.tasks[0]"]) and "'label'='放电'" in str(by_field["evaluate.tasks[0]"])
    assert "no such file" in str(by_field["evaluate.tasks[1]"])
    assert check_inputs(cfg, ["data"])[0] == []  # only the evaluate stage reads them
    twice = load_config("configs/pipelines/tiny-cpu.yaml", [f"evaluate.tasks=[{ROOT}/configs/eval/domain_choice.jsonl,"
                                                              f" {ROOT}/configs/eval/domain_choice.jsonl]"])
    assert "evaluate.tasks[1]" in {e.field for e in check_inputs(twice, ["evaluate"])[0]}


def test_a_candidate_starts_after_the_common_prefix_and_always_has_a_token():
    assert candidate_tokens([2, 10, 11], [2, 10, 11, 12, 13]) == 3
    assert candidate_tokens([2, 10, 11], [2, 10, 14, 13]) == 2  # the boundary merged: the merged token is scored
    assert candidate_tokens([2, 10, 11], [2, 10, 11]) == 2


@pytest.mark.slow
def test_scoring_on_the_tiny_llama_matches_the_logits_and_a_trained_label_wins(tiny, tmp_path):
    cls_file = write(tmp_path / "faults.jsonl", {"type": "classification", "prompt": "{text}\n类别：",
                                                 "labels": ["过热", "锈蚀"]},
                     {"id": "hot", "text": "The quick brown fox", "label": "过热"},
                     {"id": "rust", "text": "我们每天晚上", "label": "锈蚀"})
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(tiny.cfg.model_dump(mode="json")))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", "LOG_MF_PATH": str(tmp_path / "mf")}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("task_scoring_check.py")), str(cfg_file),
                           str(tiny.base), str(tiny.tokenizer), str(cls_file)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # every (item, choice) of the shipped multiple-choice task, 3 per forward, equals it scored alone
    assert out["sequences"] == sum(len(it.candidates) for it in load_task_file(tiny.cfg.evaluate.tasks[0]).items)
    assert out["batched"] == pytest.approx(out["direct"], rel=1e-9, abs=1e-9)  # measured: equal to ~3e-14
    assert all(n >= 1 for n in out["candidate_tokens"]) and all(v < 0 for v in out["batched"])
    assert 0 <= out["choice_result"]["accuracy"] <= 1 and out["choice_result"]["items"] == 20
    # trained on each text followed by its own label (two different labels): both trained labels win
    assert out["losses"][1] < out["losses"][0] / 4, out["losses"]
    assert out["before"]["correct"] < 2  # the random-init model did not answer both (it got one of two)
    assert out["after"]["accuracy"] == 1.0 and out["after"]["correct"] == 2, out["records"]
    assert {r["id"]: r["predicted"] for r in out["records"]} == {"hot": "过热", "rust": "锈蚀"}
