"""SFT data, pure Python: shapes -> turns, chat template ids, label masks, truncation, packing, accounting.

A 600-piece sentencepiece model with the chat markers is trained once per module on the bundled
instruction texts (well under a second); nothing here imports MindSpore.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline_lib.config.schema import PipelineConfig, TokenizerConfig
from pipeline_lib.data.tokenizer import train_tokenizer
from pipeline_lib.model.chat_template import IGNORE, ChatTemplate, Turn, fit_to_row, labels_for
from pipeline_lib.train.instructions import REASONS, iter_instruction_records, to_turns
from pipeline_lib.train.sft_data import build_sft_rows, pack

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "configs" / "data" / "tiny_sft.jsonl"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    texts = [t.content for r in iter_instruction_records([str(BUNDLED)]) if r.obj
             for t in (to_turns(r.obj)[0] or [])]
    return train_tokenizer(texts * 4, TokenizerConfig(vocab_size=600), tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tpl(tok):
    return ChatTemplate.from_tokenizer(tok, TokenizerConfig().special_tokens)


def encode_one(tpl, tok, obj, **kw):
    turns, reason = to_turns(obj, forbidden=tpl.forbidden_text, **kw)
    assert reason is None, reason
    ids, trained = tpl.encode(tok, [turns])[0]
    return turns, ids, labels_for(ids, trained)


def answer_spans(tpl, ids):
    """(start, end) of each answer's content + EOS, found from the marker ids alone."""
    spans, start = [], None
    for i, t in enumerate(ids):
        if t == tpl.marker_ids["assistant"]:
            start = i + 1
        elif t == tpl.eos_id and start is not None:
            spans.append((start, i + 1))
            start = None
    return spans


@pytest.mark.parametrize("obj", [
    {"prompt": "断路器多久检查一次？", "response": "断路器每年做一次机械特性测试。"},
    {"instruction": "Answer briefly.", "input": "How often is the breaker tested?", "output": "Once a year."},
    {"messages": [{"role": "user", "content": "主变压器油温过高怎么办？"},
                  {"role": "assistant", "content": "检查冷却风扇。"}]},
])
def test_single_turn_shapes_label_only_the_answer_and_its_eos(tpl, tok, obj):
    turns, ids, labels = encode_one(tpl, tok, obj)
    answer = tok.encode(turns[-1].content)
    assert len(ids) == len(labels)
    assert ids[0] == tok.bos_id and ids[1] == tpl.marker_ids["user"]
    assert ids[-len(answer) - 2:] == [tpl.marker_ids["assistant"], *answer, tok.eos_id]
    trained = [i for i, lab in enumerate(labels) if lab != IGNORE]
    assert trained == list(range(len(ids) - len(answer) - 1, len(ids)))  # answer tokens + EOS, nothing else
    assert [labels[i] for i in trained] == [*answer, tok.eos_id]
    user = tok.encode(turns[-2].content)
    assert ids[2:2 + len(user)] == user and all(lab == IGNORE for lab in labels[:2 + len(user) + 2])


def test_alpaca_joins_instruction_and_input_and_keeps_a_system_turn(tpl, tok):
    obj = {"instruction": "Translate.", "input": "开关柜每季度清扫一次。", "output": "Cleaned every quarter.",
           "system": "Be brief."}
    turns, ids, labels = encode_one(tpl, tok, obj)
    assert turns == [Turn("system", "Be brief."), Turn("user", "Translate.\n\n开关柜每季度清扫一次。"),
                     Turn("assistant", "Cleaned every quarter.")]
    assert ids[1] == tpl.marker_ids["system"] and tpl.marker_ids["end"] in ids
    assert to_turns({"instruction": "Do it.", "input": "", "output": "Done."})[0][0] == Turn("user", "Do it.")


def test_multi_turn_trains_every_answer_and_no_user_or_system_token(tpl, tok):
    obj = {"messages": [{"role": "system", "content": "你是运维助手。"},
                        {"role": "user", "content": "避雷器有什么作用？"},
                        {"role": "assistant", "content": "限制过电压。"},
                        {"role": "user", "content": "多久检测一次？"},
                        {"role": "assistant", "content": "每半年一次。"}]}
    turns, ids, labels = encode_one(tpl, tok, obj)
    spans = answer_spans(tpl, ids)
    assert len(spans) == 2
    for (start, end), answer in zip(spans, ("限制过电压。", "每半年一次。")):
        assert ids[start:end] == [*tok.encode(answer), tok.eos_id]
        assert labels[start:end] == ids[start:end]
    in_answer = {i for s, e in spans for i in range(s, e)}
    assert all(lab == IGNORE for i, lab in enumerate(labels) if i not in in_answer)
    # each user/system turn is closed by <|end|>, each answer by EOS: boundaries are unambiguous
    assert ids.count(tpl.marker_ids["end"]) == 3 and ids.count(tok.eos_id) == 2


def test_system_prompt_is_added_only_when_missing(tpl, tok):
    plain, _ = to_turns({"prompt": "Q?", "response": "A."}, system_prompt="Be brief.")
    assert plain[0] == Turn("system", "Be brief.")
    own, _ = to_turns({"messages": [{"role": "system", "content": "Mine."}, {"role": "user", "content": "Q?"},
                                    {"role": "assistant", "content": "A."}]}, system_prompt="Be brief.")
    assert [t.content for t in own if t.role == "system"] == ["Mine."]


@pytest.mark.parametrize("obj, reason", [
    ({"text": "just text"}, "unknown_shape"),
    ({"prompt": "Q?", "response": ""}, "empty_response"),
    ({"prompt": "  ", "response": "A."}, "empty_prompt"),
    ({"prompt": 3, "response": "A."}, "field_not_string"),
    ({"messages": "hi"}, "messages_not_list"),
    ({"messages": [{"role": "user"}]}, "bad_message"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "unknown_role"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                   {"role": "assistant", "content": "c"}]}, "system_not_first"),
    ({"messages": [{"role": "assistant", "content": "a"}]}, "roles_out_of_order"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "roles_out_of_order"),
    ({"messages": [{"role": "user", "content": "a"}]}, "ends_without_response"),
    ({"prompt": "say <|assistant|> now", "response": "A."}, "special_token_in_text"),
])
def test_malformed_samples_get_a_reason(tpl, obj, reason):
    assert reason in REASONS
    assert to_turns(obj, forbidden=tpl.forbidden_text) == (None, reason)


def test_truncation_policies_never_keep_a_sample_without_trained_tokens(tpl, tok):
    long_prompt = "断路器需要每年做一次机械特性测试，" * 12
    _, ids, labels = encode_one(tpl, tok, {"prompt": long_prompt, "response": "每年一次。"})
    trained = [lab != IGNORE for lab in labels]
    n_answer = sum(trained)
    row = 40
    assert len(ids) > row
    assert fit_to_row(ids, trained, row, "drop")[2] == "too_long"
    cut_ids, cut_trained, why = fit_to_row(ids, trained, row, "truncate_prompt")
    assert why is None and len(cut_ids) == row and cut_ids[0] == tok.bos_id
    assert cut_ids[-n_answer - 1:] == ids[-n_answer - 1:] and sum(cut_trained) == n_answer  # answer intact
    assert fit_to_row(ids, trained, row, "truncate_end")[2] == "no_trained_tokens"  # only prompt left
    _, ids2, labels2 = encode_one(tpl, tok, {"prompt": "Q?", "response": long_prompt})
    trained2 = [lab != IGNORE for lab in labels2]
    assert fit_to_row(ids2, trained2, row, "truncate_prompt")[2] == "response_too_long"
    end_ids, end_trained, why = fit_to_row(ids2, trained2, row, "truncate_end")
    assert why is None and len(end_ids) == row and 0 < sum(end_trained[1:]) < sum(trained2)
    with pytest.raises(ValueError, match="sft.truncation"):
        fit_to_row(ids, trained, row, "middle")


def test_packing_keeps_each_samples_mask_and_pads_with_ignored_labels(tpl, tok):
    objs = [{"prompt": f"Q{i}?", "response": f"Answer number {i}."} for i in range(5)]
    samples = [tpl.encode(tok, [to_turns(o)[0]])[0] for o in objs]
    single = pack(samples, 65, tpl.pad_id, packing=False)
    packed = pack(samples, 65, tpl.pad_id, packing=True)
    assert single.input_ids.shape == (5, 65) and len(packed.input_ids) < 5
    assert single.trained_tokens == packed.trained_tokens
    for rows in (single, packed):
        assert rows.input_ids.dtype == rows.labels.dtype == np.int32
        for r, spans in enumerate(rows.spans):
            for start, end in spans:  # each sample starts with BOS, its BOS is never a target
                assert rows.input_ids[r, start] == tok.bos_id and rows.labels[r, start] == IGNORE
            tail = spans[-1][1]
            assert (rows.input_ids[r, tail:] == tpl.pad_id).all() and (rows.labels[r, tail:] == IGNORE).all()
        kept = rows.labels != IGNORE
        assert (rows.labels[kept] == rows.input_ids[kept]).all()
    flat = [t for r, spans in enumerate(packed.spans) for s, e in spans for t in packed.input_ids[r, s:e]]
    assert flat == [t for ids, _ in samples for t in ids]  # input order, nothing lost


def test_bundled_file_is_accounted_for_with_reasons(tpl, tok):
    cfg = PipelineConfig()
    q, x = io.StringIO(), io.StringIO()
    rows, stats = build_sft_rows(iter_instruction_records([str(BUNDLED)]), tpl, tok,
                                 row_len=cfg.model.seq_length + 1, truncation="truncate_prompt", packing=False,
                                 quarantine=q, excluded=x)
    t = stats["total"]
    assert stats["balanced"] and t["read"] == t["rejected_total"] + t["dropped_total"] + t["kept"]
    assert 40 <= t["read"] <= 80
    assert t["rejected"] == {"bad_json": 1, "empty_response": 1, "ends_without_response": 1}
    assert set(t["shapes"]) == {"prompt_response", "alpaca", "messages"}
    quarantined = [json.loads(line) for line in q.getvalue().splitlines()]
    assert sorted(r["reason"] for r in quarantined) == sorted(t["rejected"])
    assert all(r["raw"] and r["id"].startswith("tiny_sft.jsonl:") for r in quarantined)
    assert rows.input_ids.shape == (t["kept"], 65) and t["row_trained_tokens"] == t["trained_tokens"]
    zh = sum(any("\u4e00" <= ch <= "\u9fff" for ch in tok.decode(r)) for r in rows.input_ids)
    assert 0 < zh < len(rows.input_ids)  # Chinese and English samples


def test_prompt_ids_end_where_the_answer_starts(tpl, tok):
    history = [Turn("user", "断路器多久检查一次？")]
    prompt = tpl.prompt_ids(tok, history)
    full, _ = tpl.encode(tok, [[*history, Turn("assistant", "每年一次。")]])[0]
    assert full[:len(prompt)] == prompt and prompt[-1] == tpl.marker_ids["assistant"]
    for q, system in (("断路器多久检查一次？", None), ("How often is the breaker tested?", "Be brief.")):
        text = tpl.prompt_text(q, system=system)
        assert text.startswith("<|system|>" if system else "<|user|>") and text.endswith("<|end|><|assistant|>")
        turns = [Turn("system", system)] * bool(system) + [Turn("user", q)]
        assert [tok.bos_id, *tok.encode(text)] == tpl.prompt_ids(tok, turns)  # the text form encodes the same


def test_parquet_and_gzip_inputs_mix_the_three_shapes(tmp_path, tpl, tok):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "断路器多久检查一次？", "response": "每年一次。"},
            {"instruction": "Answer.", "input": "", "output": "Once a year."},
            {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]},
            {"prompt": None, "response": None}]
    keys = ["prompt", "response", "instruction", "input", "output", "messages"]
    table = pa.table({k: [r.get(k) for r in rows] for k in keys})  # one schema: nulls where a row lacks a column
    pq.write_table(table, tmp_path / "mixed.parquet")
    with gzip.open(tmp_path / "more.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(rows[0], ensure_ascii=False) + "\nnot json\n")
    records = list(iter_instruction_records([str(tmp_path / "mixed.parquet"), str(tmp_path / "more.jsonl.gz")]))
    assert [r.id for r in records] == ["mixed.parquet:0", "mixed.parquet:1", "mixed.parquet:2", "mixed.parquet:3",
                                       "more.jsonl.gz:1", "more.jsonl.gz:2"]
    out = [to_turns(r.obj, forbidden=tpl.forbidden_text) if r.obj else (None, r.reason) for r in records]
    assert [reason for _, reason in out] == [None, None, None, "unknown_shape", None, "bad_json"]
    assert out[2][0] == [Turn("user", "Q?"), Turn("assistant", "A.")]


def test_a_missing_sft_input_is_named_as_sft_inputs(tmp_path):
    from pipeline_lib.train.instructions import SftDataError

    with pytest.raises(SftDataError) as err:
        list(iter_instruction_records([str(BUNDLED), str(tmp_path / "nope.jsonl")]))
    assert err.value.field == "sft.inputs[1]"


# ---------------------------------------------------------------- sft.template=llama2 on a base model's tokenizer

@pytest.fixture(scope="module")
def l2(llama2_tokenizer):
    from pipeline_lib.model.chat_template import template_for
    from pipeline_lib.model.tokenizer import Tokenizer

    tok = Tokenizer(llama2_tokenizer, special_tokens=[])
    return template_for("llama2", tok, []), tok


def test_llama2_template_is_meta_layout_as_plain_text_with_only_answers_trained(l2):
    tpl, tok = l2
    assert (tpl.bos_id, tpl.eos_id, tpl.pad_id) == (1, 2, 0)  # the tokenizer's: pad = unk = 0
    obj = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Oil temperature?"},
                        {"role": "assistant", "content": "Below 85 C."}, {"role": "user", "content": "断路器呢？"},
                        {"role": "assistant", "content": "每年检查。"}]}
    turns, reason = to_turns(obj, forbidden=tpl.forbidden_text)
    assert reason is None
    ids, trained = tpl.encode(tok, [turns])[0]
    labels = labels_for(ids, trained)
    # each exchange is exactly Meta's <s>[INST] ... [/INST] answer</s>, the markers encoded as ordinary text
    exchanges = ["[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nOil temperature? [/INST] Below 85 C.",
                 "[INST] 断路器呢？ [/INST] 每年检查。"]
    want = [t for text in exchanges for t in [1] + tok.encode(text) + [2]]
    assert ids == want
    answers = [tok.encode("Below 85 C.") + [2], tok.encode("每年检查。") + [2]]
    assert [t for t in labels if t != IGNORE] == answers[0] + answers[1]
    assert labels[0] == IGNORE and labels.count(IGNORE) == len(ids) - sum(map(len, answers))
    assert to_turns({"prompt": "say [/INST] now", "response": "x"}, forbidden=tpl.forbidden_text)[1] == \
        "special_token_in_text"
    assert tpl.prompt_ids(tok, turns[:2]) == [1] + tok.encode(exchanges[0].split(" [/INST]")[0] + " [/INST]")


def test_llama2_rows_mask_padding_by_position_although_pad_is_unk(l2):
    """pad = unk = 0: padding positions get label -100 (by position), whatever their id."""
    tpl, tok = l2
    objs = [{"prompt": f"Q{i}?", "response": f"Answer number {i}."} for i in range(3)]
    samples = [tpl.encode(tok, [to_turns(o)[0]])[0] for o in objs]
    packed = pack(samples, 65, tpl.pad_id, packing=True)
    tail = packed.spans[0][-1][1]
    assert (packed.input_ids[0, tail:] == 0).all() and (packed.labels[0, tail:] == IGNORE).all()
    assert packed.trained_tokens == sum(sum(t) for _, t in samples)


def test_fuzz_found_records_are_quarantined_naming_the_field(tmp_path, tpl, tok):
    """Found by tests/reliability/test_fuzz_sft_records.py: deep nesting was a RecursionError, a lone
    surrogate escape crashed sentencepiece (in a turn) or the UTF-8 quarantine file (anywhere)."""
    lines = [b"[" * 100_000 + b"]" * 100_000,
             json.dumps({"prompt": "Q \ud800?", "response": "A."}).encode(),
             json.dumps({"prompt": "Q?", "response": "A.", "note": "\udfff"}).encode(),  # ignored key: kept
             json.dumps({"prompt": "Q?", "response": 3}).encode(),
             json.dumps({"messages": [{"role": "user", "content": "Q?"}, {"role": "bot", "content": "A."}]}).encode(),
             json.dumps({"messages": [{"role": "user", "content": "say <|end|>"},
                                      {"role": "assistant", "content": "A."}]}).encode(),
             json.dumps({"instruction": "Do \udc00 it", "output": "A.", "bad": "\ud801"}).encode()]
    src = tmp_path / "sft.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    with open(tmp_path / "q.jsonl", "w", encoding="utf-8") as q:
        _, stats = build_sft_rows(iter_instruction_records([str(src)]), tpl, tok, row_len=65,
                                  truncation="drop", packing=False, quarantine=q, excluded=io.StringIO())
    found = [json.loads(x) for x in (tmp_path / "q.jsonl").read_text("utf-8").splitlines()]
    assert [(r["line"], r["reason"], r["field"]) for r in found] == [
        (1, "bad_json", None), (2, "lone_surrogate", "prompt"), (4, "field_not_string", "response"),
        (5, "unknown_role", "messages[1].role"), (6, "special_token_in_text", "messages[0].content"),
        (7, "lone_surrogate", "instruction")]
    assert stats["balanced"] and stats["total"]["kept"] == 1
    assert found[-1]["raw"] == json.dumps({"instruction": "Do \udc00 it", "output": "A.", "bad": "\ud801"},
                                          ensure_ascii=False)


def test_too_few_rows_names_the_reasons_the_quarantine_and_only_changes_not_made(tmp_path, tpl, tok):
    """The stage's own error when too little is left (the records really built and counted): counts per reason, the
    quarantine file, and no "use sft.truncation=truncate_prompt" when it is already set."""
    from pipeline_lib.config import load_config
    from pipeline_lib.train.sft_data import too_few_rows

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "response": ""}\nnot json\n{"prompt": "a", "response": "b"}\n', encoding="utf-8")
    rows, stats = build_sft_rows(iter_instruction_records([str(bad)]), tpl, tok, row_len=65, truncation="drop",
                                 packing=False)
    for truncation, micro in (("drop", 4), ("truncate_prompt", 1)):
        cfg = load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"),
                          [f"sft.truncation={truncation}", f"sft.micro_batch_size={micro}"])
        text = str(too_few_rows(cfg, stats["total"], tmp_path / "sft"))
        assert "2 malformed (" in text and "bad_json: 1" in text and "empty_response: 1" in text
        assert f"in {tmp_path / 'sft' / 'quarantine.jsonl'}" in text and "Fix: correct the quarantined records" in text
        assert "truncation" not in text.split("Fix:")[1]  # nothing was too long: no truncation advice at all
        assert ("lower sft.micro_batch_size (now 4)" in text) is (micro == 4)


@pytest.mark.parametrize("store", ["local", "s3"])
def test_the_stages_refusal_names_the_keys_of_an_unknown_shape_and_a_quarantine_file_that_is_there(
        tmp_path, tok, store, request):
    """Issue 48 item 4: `unknown_shape` alone told nobody what to change, and on an s3:// run store the quarantine
    named was the worker's local work folder. The refusal names the keys found and the shapes' keys, and the
    quarantine in the stage folder of the run store, written there before the message."""
    from pipeline_lib.config import load_config
    from pipeline_lib.storage import join, store_for
    from pipeline_lib.train.instructions import SftDataError
    from pipeline_lib.train.sft_data import prepare_sft_data

    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"question": "Why?", "answer": "Because.", "id": 7, "note": null}\n'
                   '{"prompt": "hi", "response": ""}\n', encoding="utf-8")
    cfg = load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"), [f"sft.inputs=[{bad}]"])
    endpoint, stage_uri = None, None
    if store == "s3":
        bucket, endpoint = request.getfixturevalue("s3_bucket")
        stage_uri = f"{bucket}/runs/r1/sft"
    out = tmp_path / "work"
    with pytest.raises(SftDataError) as refused:
        prepare_sft_data(cfg, tok.model_file, out, endpoint, stage_uri=stage_uri)
    text = str(refused.value)
    assert (f"unknown_shape at {bad}:1 (keys: answer, id, question; expected messages, instruction + output, or "
            "prompt + response)") in text, text
    assert f"empty_response at {bad}:2 (field response)" in text, text
    named = text.split("each with its reason and field in ", 1)[1].split(")", 1)[0]
    assert named == join(stage_uri or str(out), "quarantine.jsonl")
    lines = store_for(named, endpoint).get_bytes(named).decode().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["unknown_shape", "empty_response"]
