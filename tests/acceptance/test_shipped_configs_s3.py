"""The shipped Ascend configs' data stage, run as a user runs it, on a real S3 endpoint.

Their `data.inputs` are `s3://.../*.jsonl.gz` globs and their tokenizer is the base model's
(Llama-2 layout: the session's `llama2_tokenizer`). The test uploads gzip'd jsonl files under exactly those patterns (plus files
the glob must not match), gives a Llama-2-layout tokenizer trained here, shrinks the model by
overrides, and runs `llm-pipeline run <shipped config> --stages data` from a fresh copy of the
repository with a relative config path. Every matching file must be read, no other.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

pytestmark = pytest.mark.slow
CONFIGS = sorted(p.name for p in (ROOT / "configs" / "pipelines").glob("*.yaml")
                 if any(str(i).startswith("s3://") for i in
                        (yaml.safe_load(p.read_text()).get("data") or {}).get("inputs", [])))
SHRINK = ["model.seq_length=64", "model.hidden_size=64", "model.num_layers=4", "model.num_heads=4",
          "model.n_kv_heads=null", "model.intermediate_size=176", "model.vocab_size=1000",
          "data.num_workers=2", "data.docs_per_shard=200", "data.rows_per_mindrecord_shard=100",
          "training.steps=10", "training.warmup_steps=2"]


def glob_parts(pattern: str) -> tuple[str, str, str]:
    """s3://bucket/prefix/*.jsonl.gz -> (bucket, 'prefix/', '.jsonl.gz')."""
    bucket, key = re.match(r"s3://([^/]+)/(.*)", pattern).groups()
    head, _, tail = key.partition("*")
    assert "*" not in tail and "?" not in tail, f"test expects one '*' in {pattern}"
    return bucket, head, tail


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """One Prefect home (~/.prefect) for the configs' runs, as one user's: the embedded API creates and migrates its
    database on the first run only (~5 s of the CLI's wait on a fresh home); what this file checks is the S3 glob."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.mark.parametrize("config", CONFIGS)
def test_shipped_config_data_stage_reads_its_s3_glob(config, user_repo, s3_endpoint, llama2_tokenizer, prefect_home):
    import boto3

    spec = yaml.safe_load((user_repo.path / "configs/pipelines" / config).read_text())
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    lines = (ROOT / "configs/data/tiny_corpus.jsonl").read_bytes().rstrip(b"\n").split(b"\n")
    matching = []
    for pattern in spec["data"]["inputs"]:
        bucket, head, tail = glob_parts(pattern)
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        # the configs share their raw prefix: start from an empty one (the endpoint lives for the session)
        for obj in client.list_objects_v2(Bucket=bucket, Prefix=head).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
        for k, part in enumerate((lines[:200], lines[200:])):
            key = f"{head}{Path(config).stem}-part{k}{tail}"
            client.put_object(Bucket=bucket, Key=key, Body=gzip.compress(b"\n".join(part) + b"\n"))
            matching.append((f"s3://{bucket}/{key}", len(part)))
        # Not matched by the glob: another suffix, and a file in a sub-folder (`*` stops at '/').
        client.put_object(Bucket=bucket, Key=f"{head}README.txt", Body=b"not data")
        client.put_object(Bucket=bucket, Key=f"{head}old/skip{tail}", Body=gzip.compress(lines[0]))
    # a config that names its base model's tokenizer gets a Llama-2-layout one; the others train theirs
    given = (spec.get("tokenizer") or {}).get("path")
    tokenizer = [f"tokenizer.path={llama2_tokenizer}"] if given else ["tokenizer.vocab_size=1000"]
    out = f"s3://{glob_parts(spec['data']['inputs'][0])[0]}/runs-{Path(config).stem}"
    proc = user_repo.run(["./.venv/bin/llm-pipeline", "run", f"configs/pipelines/{config}", "--stages", "data",
                          "--run-id", "accept-s3", f"run.output_root={out}", f"run.s3_endpoint_url={s3_endpoint}",
                          *tokenizer, *SHRINK],
                         env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                              "AWS_DEFAULT_REGION": "us-east-1", "PREFECT_HOME": str(prefect_home)}, timeout=900)
    bucket, _, prefix = out[len("s3://"):].partition("/")
    stats = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/accept-s3/data/stats.json")["Body"].read())
    read_per_file = {f["uri"]: f["read"] for f in stats["files"].values()}
    assert read_per_file == dict(matching), proc.stdout[-3000:]
    assert stats["total"]["kept"] > 0 and stats["total"]["rows_train"] > 0
    tok_cfg = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/accept-s3/data/tokenizer/"
                                           "tokenizer_config.json")["Body"].read())
    if given:  # the base tokenizer's own ids, not our training layout
        assert (tok_cfg.get("bos_id"), tok_cfg.get("eos_id"), tok_cfg.get("unk_id")) == (1, 2, 0), tok_cfg
