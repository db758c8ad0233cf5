"""data.sources lists inputs through storage.list_matching: the shipped s3:// globs work, and the
nightly job sees exactly the files the data stage reads."""
import gzip
from pathlib import Path

import boto3
import pytest
import yaml

from pipeline_lib.config import load_config
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.sources import list_inputs
from pipeline_lib.nightly import list_raw_files
from pipeline_lib.storage.store import split_s3

ROOT = Path(__file__).resolve().parents[2]
ASCEND = sorted(p for p in (ROOT / "configs" / "pipelines").glob("*.yaml")
                if any(i.startswith("s3://") for i in yaml.safe_load(p.read_text())["data"]["inputs"]))


@pytest.mark.parametrize("config", ASCEND, ids=lambda p: p.name)
def test_shipped_s3_glob_is_read_by_the_data_stage_and_the_nightly_alike(s3_bucket, tmp_path, config):
    bucket, endpoint = s3_bucket
    shipped = load_config(str(config), []).data.inputs
    client = boto3.client("s3", endpoint_url=endpoint)
    name = split_s3(bucket + "/")[0]
    inputs = []
    for pattern in shipped:
        _, key = split_s3(pattern)
        head = key.rsplit("/", 1)[0]
        for rel in ("part-0.jsonl.gz", "part-1.jsonl.gz", "README.md", "old/part-9.jsonl.gz"):
            client.put_object(Bucket=name, Key=f"{head}/{rel}", Body=gzip.compress(b'{"text": "hello"}\n'))
        inputs.append(f"{bucket}/{key}")
    expected = [f"{bucket}/domain/part-0.jsonl.gz", f"{bucket}/domain/part-1.jsonl.gz"]
    assert [u for u, _ in list_inputs(inputs, endpoint)] == expected
    cfg = load_config(str(config), [f"run.output_root={tmp_path}", f"run.s3_endpoint_url={endpoint}"])
    cfg.data.inputs = inputs
    assert list(list_raw_files(cfg)) == expected
    # `**` and a plain prefix take the sub-folder too
    deep = [f"{bucket}/domain/old/part-9.jsonl.gz"]
    assert [u for u, _ in list_inputs([f"{bucket}/domain/**/*.jsonl.gz"], endpoint)] == sorted(expected + deep)
    assert [u for u, _ in list_inputs([f"{bucket}/domain"], endpoint)] == sorted(expected + deep)


def test_no_match_names_the_field(tmp_path):
    with pytest.raises(DataStageError) as err:
        list_inputs([str(tmp_path / "*.jsonl")], field="sft.inputs")
    assert "sft.inputs[0]" in str(err.value)


def test_nightly_lists_local_folders_like_the_data_stage(tmp_path):
    (tmp_path / "raw" / "sub").mkdir(parents=True)
    for rel in ("a.jsonl", "sub/b.jsonl.gz", "notes.txt"):
        (tmp_path / "raw" / rel).write_bytes(b'{"text": "x"}\n')
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path / 'runs'}"])
    cfg.data.inputs = [str(tmp_path / "raw")]
    assert list(list_raw_files(cfg)) == [u for u, _ in list_inputs(cfg.data.inputs)]
