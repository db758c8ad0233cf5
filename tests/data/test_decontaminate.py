"""Held out means held out: the data stage drops documents that share a 13-token window with an evaluation file."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
from datagen import make_cfg, random_doc, write_jsonl

from pipeline_lib.config.identity import stage_hash
from pipeline_lib.data.decontaminate import EvalNgrams, build_eval_ngrams, ngram_hashes
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.text import dedup_form, shingles, tokens
from pipeline_lib.data.tokenhash import token_arrays
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths

REF = Path(__file__).resolve().parents[2] / "configs" / "eval" / "general_zh.jsonl"
PROMPTS = Path(__file__).resolve().parents[2] / "configs" / "eval" / "domain_qa.jsonl"
CHOICE = Path(__file__).resolve().parents[2] / "configs" / "eval" / "domain_choice.jsonl"  # a shipped evaluate.tasks file


def _cjk(text: str) -> str:
    return "".join(ch for ch in text if "\u4e00" <= ch <= "\u9fff")


def _ref_sentence(i: int) -> str:
    return json.loads(REF.read_text(encoding="utf-8").splitlines()[i])["text"]


def _span(text: str, n: int) -> str:
    """The shortest prefix of `text` holding n CJK characters (its punctuation kept)."""
    count = 0
    for end, ch in enumerate(text, 1):
        count += "\u4e00" <= ch <= "\u9fff"
        if count == n:
            return text[:end]
    raise AssertionError(f"{text!r} has fewer than {n} CJK characters")


def _inside(rng: random.Random, span: str) -> str:
    """A random Chinese document (one the filters keep) with `span` in its middle."""
    doc = random_doc(rng, zh=True)
    cut = len(doc) // 2
    return doc[:cut] + "。" + span + "。" + doc[cut:]


@pytest.fixture(scope="module")
def contaminated_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("decontam")
    rng = random.Random(3)
    task = root / "eval" / "en_task.jsonl"
    question = ("which of the following statements best describes the purpose of a transformer "
                "checkpoint saved during continued pretraining")
    task.parent.mkdir()
    task.write_text(json.dumps({"id": "t1", "question": question, "choices": ["resume", "export"], "answer": 0}) + "\n")
    planted = {
        "ref13": _inside(rng, _span(_ref_sentence(0), 13)),            # 13 CJK characters of the reference set
        "ref_full": _inside(rng, _ref_sentence(5)),                     # a whole reference sentence
        "ref_punct": _inside(rng, _span(_ref_sentence(7), 13).replace("，", ",")),  # other punctuation
        "prompt": _inside(rng, json.loads(PROMPTS.read_text(encoding="utf-8").splitlines()[0])["prompt"]),
        "task_shipped": _inside(rng, json.loads(CHOICE.read_text(encoding="utf-8").splitlines()[1])["question"]),
        "task_en": " ".join(random_doc(rng, zh=False).split()[:60]) + " " + question + " " +
                   " ".join(random_doc(rng, zh=False).split()[:60]),
        "task_fullwidth": " ".join(random_doc(rng, zh=False).split()[:60]) + " " +  # ｗｈｉｃｈ ｏｆ ...: NFKC
                          question.translate({c: c + 0xFEE0 for c in range(0x61, 0x7B)}),
        "ref12": _inside(rng, _span(_ref_sentence(9), 12)),             # 12: kept
        "task12": " ".join(random_doc(rng, zh=False).split()[:80]) + " " +
                  " ".join(question.split()[:12]) + " " + " ".join(random_doc(rng, zh=False).split()[:80]),
    }
    texts = [random_doc(rng, zh=i % 3 != 0) for i in range(120)]
    lines = {}
    for name, text in planted.items():
        lines[name] = len(texts) + 1
        texts.append(text)
    corpus = write_jsonl(root / "raw" / "corpus.jsonl", texts)
    cfg = make_cfg(root, inputs=[str(corpus)], decontamination={"files": [str(task)]})
    cfg.tokenizer.vocab_size, cfg.model.vocab_size = 3200, 4096  # random text over 2,500 CJK characters
    digests = {p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
               for p in [*cfg.evaluate.reference_sets, *cfg.evaluate.tasks, *cfg.evaluate.prompt_files, str(task)]}
    manifest = run_stage(cfg, RunPaths(cfg.run.output_root, "r1"), "data", workers=1)[0]
    return cfg, manifest, lines, digests, task


def _folder(cfg) -> Path:
    return Path(cfg.run.output_root) / "r1" / "data"


def test_documents_sharing_13_tokens_with_an_evaluation_file_are_excluded_naming_the_file(contaminated_run):
    cfg, manifest, lines, _, task = contaminated_run
    folder = _folder(cfg)
    excluded = {x["origin"]: x for x in map(json.loads, (folder / "excluded.jsonl").read_text().splitlines())}
    expect = {"ref13": cfg.evaluate.reference_sets[0], "ref_full": cfg.evaluate.reference_sets[0],
              "ref_punct": cfg.evaluate.reference_sets[0], "prompt": str(PROMPTS), "task_en": str(task),
              "task_fullwidth": str(task), "task_shipped": str(CHOICE)}
    for name, file in expect.items():
        rec = excluded[f"corpus.jsonl:{lines[name]}"]
        assert (rec["filter"], rec["reason"], rec["overlaps"]) == ("decontamination", "contamination", file), name
        assert len(rec["overlap"].split()) == 13
    assert excluded[f"corpus.jsonl:{lines['ref13']}"]["overlap"] == " ".join(_cjk(_span(_ref_sentence(0), 13)))
    stats = json.loads((folder / "stats.json").read_text())
    total = stats["total"]
    assert total["filtered"]["contamination"] == 7 == manifest.metrics["contaminated"] and stats["balanced"]
    assert total["contaminated_by"] == {cfg.evaluate.reference_sets[0]: 3, str(PROMPTS): 1, str(task): 2,
                                       str(CHOICE): 1}
    held = {f["file"]: f for f in stats["decontamination"]["files"]}
    assert stats["decontamination"]["ngram"] == 13 and held[str(task)]["field"] == "data.decontamination.files[0]"
    assert held[str(CHOICE)]["field"] == "evaluate.tasks[0]"
    assert held[cfg.evaluate.reference_sets[0]]["documents_excluded"] == 3 and held[str(task)]["ngrams"] > 0


def test_shorter_overlaps_are_kept_and_trained_on(contaminated_run):
    cfg, _, lines, _, _ = contaminated_run
    import gzip

    kept = set()
    for part in (_folder(cfg) / "cleaned").glob("part-*.jsonl.gz"):
        kept |= {json.loads(x)["origin"] for x in gzip.decompress(part.read_bytes()).decode().splitlines()}
    for name in ("ref12", "task12"):
        assert f"corpus.jsonl:{lines[name]}" in kept, name
    assert not {f"corpus.jsonl:{lines[n]}" for n in ("ref13", "ref_full", "prompt", "task_en")} & kept


def test_the_evaluation_files_themselves_are_unchanged(contaminated_run):
    *_, digests, _ = contaminated_run
    assert {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in digests} == digests


def test_window_lookup_agrees_with_the_shingles_of_text_tokens():
    """The vectorized 64-bit windows find exactly the documents whose text.tokens 13-grams meet the evaluation
    texts' (a Python set reference), on mixed Chinese/English texts with planted spans of 11-15 tokens."""
    rng = random.Random(11)
    evals = [random_doc(rng, zh=i % 2 == 0)[:rng.randint(20, 200)] for i in range(40)]
    docs = []
    for i in range(300):
        doc = random_doc(rng, zh=i % 2 == 0)
        if i % 3 == 0:
            src = tokens(evals[rng.randrange(len(evals))])
            k = rng.randint(11, 15)
            at = rng.randrange(max(len(src) - k, 1))
            doc = doc[:50] + (" " if i % 2 else "") + " ".join(src[at:at + k]) + " " + doc[50:]
        docs.append(doc)
    hashes, _ = ngram_hashes(evals, 13)
    table = EvalNgrams(13, np.unique(hashes), np.zeros(len(np.unique(hashes)), np.int64), ["e"])
    found, _ = table.find(token_arrays([dedup_form(d) for d in docs]), len(docs))
    ref = {s for e in evals for s in shingles(tokens(dedup_form(e)), 13) if len(s.split()) == 13}
    expected = [bool(ref & {s for s in shingles(tokens(dedup_form(d)), 13) if len(s.split()) == 13}) for d in docs]
    assert list(found >= 0) == expected and 20 < sum(expected) < 150


def test_evaluation_files_are_part_of_the_data_identity_and_a_broken_one_is_refused(tmp_path):
    cfg = make_cfg(tmp_path)
    ref = write_jsonl(tmp_path / "ref.jsonl", ["一二三四五六七八九十甲乙丙丁"])
    cfg.evaluate.reference_sets = [str(ref)]
    before = stage_hash(cfg, "data")
    write_jsonl(ref, ["一二三四五六七八九十甲乙丙戊"])
    assert stage_hash(cfg, "data") != before
    ref.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DataStageError, match=r"evaluate.reference_sets\[0\].*line 2 is not JSON"):
        build_eval_ngrams(cfg, None)
    cfg.evaluate.reference_sets = [str(tmp_path / "missing.jsonl")]
    with pytest.raises(DataStageError, match=r"evaluate.reference_sets\[0\].*cannot read"):
        build_eval_ngrams(cfg, None)
    cfg.data.decontamination.enabled = False
    assert build_eval_ngrams(cfg, None)[1] == []


def test_an_evaluation_line_100k_brackets_deep_or_over_max_line_bytes_is_refused_naming_the_line(tmp_path):
    """Issue 45 items 3 and 10: a RecursionError traceback; a file read whole however large."""
    cfg = make_cfg(tmp_path, max_line_bytes=1 << 20)
    ref = tmp_path / "ref.jsonl"
    ref.write_text('{"text": "ok"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    cfg.evaluate.reference_sets = [str(ref)]
    with pytest.raises(DataStageError, match=r"evaluate.reference_sets\[0\].*line 2 is JSON nested deeper"):
        build_eval_ngrams(cfg, None)
    ref.write_text('{"text": "ok"}\n{"text": "' + "x" * (2 << 20) + '"}\n')
    with pytest.raises(DataStageError, match=r"line 2 is 2,097,164 bytes, over data.max_line_bytes=1,048,576"):
        build_eval_ngrams(cfg, None)
    deep = {"text": "一二三四五六七八九十甲乙丙丁"}
    for _ in range(900):  # parsed by json, then walked: 900 levels were past the recursion limit of the walk
        deep = {"next": deep}
    ref.write_text(json.dumps(deep) + "\n")
    assert build_eval_ngrams(cfg, None)[1][0]["texts"] == 1


def test_short_items_are_held_out_joined_or_whole_and_a_lone_choice_or_short_answer_is_not(tmp_path):
    """Evaluation texts under the 13-token window were never protected. Known answers on one multiple-choice item
    (a 10-character question, three choices of 4-9 characters) and a 9-token English prompt:
    - question then choices, as a benchmark page prints them: contaminated (the joined record's windows);
    - the 9-token prompt alone, inside a document: contaminated (matched whole, >= min_tokens=8);
    - 7 of its 9 tokens, one choice alone (a domain phrase), a 2-token answer: kept."""
    task = write_jsonl(tmp_path / "task.jsonl", [])
    task.write_text(json.dumps({"id": "q1", "lang": "zh", "question": "接头过热最好用什么检测？",
                                "choices": ["红外测温仪器", "清扫积尘", "设备已停电并挂接地线"], "answer": 0},
                               ensure_ascii=False) + "\n", encoding="utf-8")
    prompt = tmp_path / "prompts.jsonl"
    prompt.write_text(json.dumps({"prompt": "how often should the relay protection settings be checked"}) + "\n")
    cfg = make_cfg(tmp_path)
    cfg.evaluate.reference_sets, cfg.evaluate.prompt_files = [], [str(prompt)]
    cfg.data.decontamination.files = [str(task)]
    evals, summary = build_eval_ngrams(cfg, None)
    assert sorted(evals.short) == [9] and summary[-1]["short_texts"] == 0  # the prompt (9 tokens) is matched whole
    rng = random.Random(5)
    docs = {
        "page": _inside(rng, "接头过热最好用什么检测？红外测温仪器、清扫积尘、设备已停电并挂接地线"),
        "prompt": random_doc(rng, zh=False) + " How often should the relay-protection settings be checked? ",
        "seven": random_doc(rng, zh=False) + " the relay protection settings be checked often ",
        "choice": _inside(rng, "检修前确认设备已停电并挂接地线"),
        "answer": _inside(rng, "红外测温"),
    }
    path = tmp_path / "ngrams.npz"
    evals.save(path)
    for table in (evals, EvalNgrams.load(path)):  # what every shard worker loads
        found, _ = table.find(token_arrays([dedup_form(d) for d in docs.values()]), len(docs))
        got = {name: table.files[f] if f >= 0 else None for name, f in zip(docs, found)}
        assert got == {"page": str(task), "prompt": str(prompt), "seven": None, "choice": None, "answer": None}
    cfg.data.decontamination.min_tokens = 13  # at least ngram: nothing matched whole
    assert build_eval_ngrams(cfg, None)[0].short == {}
