"""storage.list_matching: the one input lister (files, folders, s3:// prefixes, local and s3:// globs)."""
import gzip
from pathlib import Path

import boto3
import pytest
import yaml

from pipeline_lib.storage import list_matching
from pipeline_lib.storage.store import split_s3
from pipeline_lib.storage.store import glob_regex  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["domain/a.jsonl.gz", "domain/b.jsonl.gz", "domain/notes.txt", "domain/sub/c.jsonl.gz",
        "domain/sub/deep/d1.jsonl.gz", "domain/.tmp-e.jsonl.gz.1234", "domainx/f.jsonl.gz", "other/g.jsonl"]


def shipped_s3_patterns() -> list[str]:
    out = []
    for path in sorted((ROOT / "configs" / "pipelines").glob("*.yaml")):
        out += [p for p in (yaml.safe_load(path.read_text()).get("data") or {}).get("inputs", []) if p.startswith("s3://")]
    assert out, "the shipped configs read s3:// globs; this test reads them"
    return sorted(set(out))


@pytest.fixture
def s3_tree(s3_bucket):
    bucket, endpoint = s3_bucket
    client = boto3.client("s3", endpoint_url=endpoint)
    for key in KEYS:
        client.put_object(Bucket=split_s3(bucket + "/")[0], Key=key, Body=gzip.compress(b'{"text": "x"}\n'))
    return bucket, endpoint


def uris(bucket, *keys):
    return sorted(f"{bucket}/{k}" for k in keys)


@pytest.mark.parametrize("pattern", shipped_s3_patterns())
def test_shipped_config_s3_glob_matches_the_files(s3_tree, pattern):
    bucket, endpoint = s3_tree
    _, key = split_s3(pattern)  # the shipped key pattern, in this test's bucket
    assert key == "domain/*.jsonl.gz"
    assert list_matching(f"{bucket}/{key}", endpoint) == uris(bucket, "domain/a.jsonl.gz", "domain/b.jsonl.gz")


@pytest.mark.parametrize("key, expected", [
    ("domain/**/*.jsonl.gz", ["domain/a.jsonl.gz", "domain/b.jsonl.gz", "domain/sub/c.jsonl.gz",
                              "domain/sub/deep/d1.jsonl.gz"]),
    ("domain/**", ["domain/a.jsonl.gz", "domain/b.jsonl.gz", "domain/notes.txt", "domain/sub/c.jsonl.gz",
                   "domain/sub/deep/d1.jsonl.gz"]),
    ("domain/sub/**/d?.jsonl.gz", ["domain/sub/deep/d1.jsonl.gz"]),
    ("domain/[ab].jsonl.gz", ["domain/a.jsonl.gz", "domain/b.jsonl.gz"]),
    ("domain/[!a].jsonl.gz", ["domain/b.jsonl.gz"]),
    ("domain*/*.jsonl.gz", ["domain/a.jsonl.gz", "domain/b.jsonl.gz", "domainx/f.jsonl.gz"]),
    ("domain", ["domain/a.jsonl.gz", "domain/b.jsonl.gz", "domain/notes.txt", "domain/sub/c.jsonl.gz",
                "domain/sub/deep/d1.jsonl.gz"]),  # a prefix is a folder: domainx/ is not in it
    ("domain/sub/", ["domain/sub/c.jsonl.gz", "domain/sub/deep/d1.jsonl.gz"]),
    ("other/g.jsonl", ["other/g.jsonl"]),
    ("missing/*.jsonl", []),
    ("missing", []),
])
def test_s3_patterns(s3_tree, key, expected):
    bucket, endpoint = s3_tree
    assert list_matching(f"{bucket}/{key}", endpoint) == uris(bucket, *expected)


def test_local_patterns_agree_with_s3(tmp_path):
    for key in KEYS:
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(b"x")
    local = lambda *ks: sorted(str(tmp_path / k) for k in ks)  # noqa: E731
    assert list_matching(str(tmp_path / "domain/*.jsonl.gz")) == local("domain/a.jsonl.gz", "domain/b.jsonl.gz")
    assert list_matching(str(tmp_path / "domain/**/*.jsonl.gz")) == local(
        "domain/a.jsonl.gz", "domain/b.jsonl.gz", "domain/sub/c.jsonl.gz", "domain/sub/deep/d1.jsonl.gz")
    assert list_matching(str(tmp_path / "domain/sub")) == local("domain/sub/c.jsonl.gz", "domain/sub/deep/d1.jsonl.gz")
    assert list_matching("file://" + str(tmp_path / "other/g.jsonl")) == local("other/g.jsonl")
    assert list_matching(str(tmp_path / "missing")) == []


def test_glob_regex_segments():
    assert glob_regex("a/*.gz").match("a/x.gz") and not glob_regex("a/*.gz").match("a/b/x.gz")
    assert glob_regex("a/**/x.gz").match("a/x.gz") and glob_regex("a/**/x.gz").match("a/b/c/x.gz")
    assert glob_regex("a/?.gz").match("a/1.gz") and not glob_regex("a/?.gz").match("a/12.gz")
    assert glob_regex("a/[]x].gz").match("a/].gz")
