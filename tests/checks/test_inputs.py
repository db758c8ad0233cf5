"""Input-file checks of `validate`: every missing input is an error naming the field the user set."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.checks.inputs import check_inputs
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def by_field(issues) -> dict:
    return {i.field: i for i in issues}


def test_the_bundled_defaults_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the bundled files are found from anywhere
    assert check_inputs(config_from_dict({})) == ([], [])


def test_each_missing_input_is_named_by_its_own_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.jsonl").write_text('{"text": "hello"}\n')
    cfg = config_from_dict({
        "data": {"inputs": ["ok.jsonl", "raw/*.jsonl"]},
        "sft": {"inputs": ["missing_sft.jsonl"]},
        "evaluate": {"prompt_files": ["configs/eval/domain_qa.jsonl", "my_prompts.jsonl"],
                     "compare_checkpoints": {"last": "night/last.ckpt"}},
        "tokenizer": {"path": "tok/tokenizer.model"},
        "model": {"base_checkpoint": "base.ckpt"}})
    errors, _ = check_inputs(cfg)
    found = by_field(errors)
    assert set(found) == {"data.inputs[1]", "sft.inputs[0]", "evaluate.prompt_files[1]", "tokenizer.path",
                          "model.base_checkpoint", "evaluate.compare_checkpoints.last"}
    assert found["data.inputs[1]"].value == str(tmp_path / "raw" / "*.jsonl")
    assert "remove it from the list" in found["evaluate.prompt_files[1]"].fix
    assert "set it to null" in found["model.base_checkpoint"].fix
    # `run --stages data` checks only what the data stage reads (the weights live on the Ascend host)
    assert set(by_field(check_inputs(cfg, ["data"])[0])) == {"data.inputs[1]", "tokenizer.path"}
    assert set(by_field(check_inputs(cfg, ["pretrain"])[0])) == {"model.base_checkpoint"}


def test_a_broken_prompt_file_names_its_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\nnot json\n')
    errors, _ = check_inputs(config_from_dict({"evaluate": {"prompt_files": [str(bad)]}}))
    assert ":2" in by_field(errors)["evaluate.prompt_files[0]"].problem


def test_a_tokenizer_path_is_loaded_and_checked_against_the_model(tmp_path):
    from pipeline_lib.config.schema import TokenizerConfig

    texts = [line for line in (ROOT / "configs/data/tiny_corpus.jsonl").read_text(errors="replace").splitlines()][:300]
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=600), tmp_path)
    cfg = config_from_dict({"tokenizer": {"path": tok.model_file}, "model": {"vocab_size": 512}})
    found = by_field(check_inputs(cfg)[0])
    assert "model.vocab_size >= 600" in found["model.vocab_size"].fix


def test_s3_inputs_are_listed_when_the_store_answers(s3_bucket):
    bucket, endpoint = s3_bucket
    import boto3

    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket[5:], Key="raw/a.jsonl", Body=b'{"text":"x"}\n')
    cfg = config_from_dict({"run": {"s3_endpoint_url": endpoint},
                            "data": {"inputs": [f"{bucket}/raw/", f"{bucket}/nothing/"]},
                            "model": {"base_checkpoint": f"{bucket}/base.ckpt"}})
    errors, warnings = check_inputs(cfg)
    assert set(by_field(errors)) == {"data.inputs[1]", "model.base_checkpoint"} and warnings == []


def test_an_unreachable_s3_endpoint_is_a_quick_warning(free_port_url):
    cfg = config_from_dict({"run": {"s3_endpoint_url": free_port_url},
                            "sft": {"inputs": ["s3://bucket/sft/"]}})
    started = time.time()
    errors, warnings = check_inputs(cfg)
    assert errors == [] and "did not answer" in by_field(warnings)["sft.inputs[0]"].problem
    assert time.time() - started < 10


@pytest.fixture
def free_port_url():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def cjk_corpus(path: Path, distinct: int = 3000) -> Path:
    import random

    rng = random.Random(0)
    chars = [chr(0x4E00 + i) for i in range(distinct)]
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(400):
            fh.write(json.dumps({"text": "".join(rng.choice(chars) for _ in range(200))}, ensure_ascii=False) + "\n")
    return path


def test_cjk_corpus_beyond_the_vocabulary_warns_with_the_number_sentencepiece_needs(tmp_path):
    from pipeline_lib.config.schema import TokenizerConfig

    corpus = cjk_corpus(tmp_path / "zh.jsonl")
    cfg = config_from_dict({"data": {"inputs": [str(corpus)], "filters": []}})
    errors, warnings = check_inputs(cfg)
    warning = by_field(warnings)["tokenizer.vocab_size"]
    assert errors == [] and "raise tokenizer.vocab_size to at least" in warning.fix
    need = int(warning.fix.split("at least ")[1].split()[0])
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    with pytest.raises(DataStageError, match=f"at least {need} "):  # sentencepiece's own count agrees
        train_tokenizer(texts, TokenizerConfig(vocab_size=2000), tmp_path / "tok")
    bigger = config_from_dict({"data": {"inputs": [str(corpus)], "filters": []},
                               "tokenizer": {"vocab_size": need}, "model": {"vocab_size": need}})
    assert check_inputs(bigger) == ([], [])


def test_an_hf_folder_is_checked_against_model_like_the_pretrain_stage_does(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 128, "num_hidden_layers": 2,
                                                    "num_attention_heads": 4, "num_key_value_heads": 4}))
    errors, _ = check_inputs(config_from_dict({"model": {"hf_checkpoint": str(folder)}}))
    issue = by_field(errors)["model.hf_checkpoint"]
    assert "hidden_size=128 but model.hidden_size=64: set model.hidden_size: 128" in issue.problem


def test_sft_records_are_parsed_malformed_ones_counted_per_reason(tmp_path):
    """validate reads the SFT records as the stage does (not tokenized): too few usable ones is an error naming each
    reason's count and its first record; a few bad ones among enough good ones a warning."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "response": ""}\nnot json\n{"messages": [{"role": "user", "content": "a"}, '
                   '{"role": "bot", "content": "b"}]}\n{"prompt": "a", "response": "b"}\n', encoding="utf-8")
    errors, _ = check_inputs(config_from_dict({"sft": {"inputs": [str(bad)]}}), ["sft"])
    text = str(by_field(errors)["sft.inputs"])
    assert "3 of 4 records are malformed (" in text and "leaving 1 usable, fewer than one batch" in text
    assert f"empty_response at {bad}:1 (field response)" in text and f"bad_json at {bad}:2;" in text
    assert f"unknown_role at {bad}:3 (field messages[1].role)" in text
    assert "quarantine.jsonl" not in text and "in the files named (file:line)" in text  # refused: the stage never ran
    (tmp_path / "shape.jsonl").write_text('{"question": "q", "answer": "a", "id": null}\n', encoding="utf-8")
    errors, _ = check_inputs(config_from_dict({"sft": {"inputs": [str(tmp_path / "shape.jsonl")]}}), ["sft"])
    assert (f"unknown_shape at {tmp_path / 'shape.jsonl'}:1 (keys: answer, question; expected messages, "
            "instruction + output, or prompt + response)") in str(by_field(errors)["sft.inputs"])
    half_bad = tmp_path / "half.jsonl"
    half_bad.write_text(bad.read_text(encoding="utf-8") * 2 + '{"prompt": "c", "response": "d"}\n' * 2, encoding="utf-8")
    errors, warnings = check_inputs(config_from_dict({"sft": {"inputs": [str(half_bad)]}}), ["sft"])
    assert errors == [] and "6 of 10 records are malformed" in str(by_field(warnings)["sft.inputs"])
    assert "trains on the 4 others" in str(by_field(warnings)["sft.inputs"])
    mostly_good = tmp_path / "ok.jsonl"
    mostly_good.write_text(bad.read_text(encoding="utf-8") + '{"prompt": "c", "response": "d"}\n' * 8, encoding="utf-8")
    assert check_inputs(config_from_dict({"sft": {"inputs": [str(mostly_good)]}}), ["sft"]) == ([], [])


# issue 45: validate's pre-checks read with the bounded reader, name a parquet's missing column, and connect to
# no S3 endpoint unless asked


def test_a_sparse_input_costs_the_pre_checks_bounded_memory(tmp_path):
    import tracemalloc

    from pipeline_lib.checks.inputs import sample_texts

    sparse = tmp_path / "sparse.jsonl"
    with open(sparse, "wb") as fh:
        fh.truncate(64 << 20)  # one line of NUL bytes: 2 GB took 4.3 GB (and SFT's 3.2 GB)
    tracemalloc.start()
    texts = sample_texts([str(sparse)], "text", max_line=1 << 20)
    cfg = config_from_dict({"data": {"inputs": [str(sparse)], "max_line_bytes": 1 << 20},
                            "sft": {"inputs": [str(sparse)]}})
    errors, _ = check_inputs(cfg, ["sft"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert texts == [] and peak < 16 << 20
    assert "line_too_long: 1" in by_field(errors)["sft.inputs"].problem


def test_a_parquet_input_without_the_text_column_is_an_error_naming_data_text_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["some text of the grid"] * 3}), tmp_path / "notext.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "numbers.parquet")
    cfg = config_from_dict({"data": {"inputs": [str(tmp_path / "notext.parquet")]}})
    errors, _ = check_inputs(cfg, ["data"])  # was an IndexError traceback (column 0 of no column)
    issue = by_field(errors)["data.text_field"]
    assert "no such column" in issue.problem and "body" in issue.problem and "data.text_field" in issue.fix
    cfg = config_from_dict({"data": {"inputs": [str(tmp_path / "numbers.parquet")]}})
    assert "not a string" in by_field(check_inputs(cfg, ["data"])[0])["data.text_field"].problem


def test_validate_connects_to_the_s3_endpoint_only_with_check_remote(tmp_path):
    import socket

    from pipeline_lib.cli import validate_main

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    args = [str(ROOT / "configs/pipelines/tiny-cpu.yaml"), f"run.s3_endpoint_url={url}",
            "sft.inputs=[s3://bucket/sft/]", f"run.output_root={tmp_path}"]

    def connected() -> bool:
        try:
            server.accept()[0].close()
            return True
        except socket.timeout:
            return False

    import threading

    def validate(*flags) -> threading.Thread:  # a thread: a listing the server never answers must not hang the test
        thread = threading.Thread(target=validate_main, args=([*flags, *args],), daemon=True)
        thread.start()
        return thread

    try:
        plain = validate()
        plain.join(60)
        assert not connected()  # a plain validate opens no connection to whatever the config names
        # with --check-remote the reachability probe connects (the listing after it is refused: the server closes)
        remote = validate("--check-remote")
        assert connected()
    finally:
        server.close()
    remote.join(60)
    assert not remote.is_alive() and not plain.is_alive()


def test_a_reference_set_the_tokenizer_mostly_writes_as_bytes_warns_that_the_gate_will_ignore_it(tmp_path):
    from pipeline_lib.config.schema import TokenizerConfig

    texts = []
    for line in (ROOT / "configs/data/tiny_corpus.jsonl").read_text(errors="replace").splitlines():
        try:
            text = json.loads(line).get("text")
        except (ValueError, AttributeError):
            continue
        if isinstance(text, str):
            texts.append(text)
    tok = train_tokenizer(texts[:300], TokenizerConfig(vocab_size=1200), tmp_path / "tok")
    domain = tmp_path / "domain_ref.jsonl"
    domain.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts[300:340]),
                      encoding="utf-8")
    cfg = config_from_dict({"tokenizer": {"path": tok.model_file}, "model": {"vocab_size": 1280},
                            "evaluate": {"reference_sets": ["configs/eval/general_zh.jsonl", str(domain)]}})
    errors, warnings = check_inputs(cfg, ["evaluate"])
    found = by_field(warnings)
    assert errors == [] and set(found) == {"evaluate.reference_sets[0]"}, warnings  # the domain set is covered
    share = int(found["evaluate.reference_sets[0]"].problem.split("%")[0])
    assert share >= 20 and "uninformative" in found["evaluate.reference_sets[0]"].problem
