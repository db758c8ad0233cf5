"""Storage layer on local paths and on a real S3 endpoint (moto server over HTTP)."""
import os

import pytest

from pipeline_lib.storage import (Manifest, RunPaths, describe_outputs, invalidate, join, manifest_matches,
                                  read_manifest, store_for, write_manifest)
from pipeline_lib.storage.store import TMP_PREFIX, LocalStore


def roundtrip(root, endpoint=None):
    store = store_for(root, endpoint)
    uri = join(root, "a", "b.txt")
    assert not store.exists(uri)
    store.put_bytes(uri, b"hello")
    assert store.exists(uri) and store.get_bytes(uri) == b"hello" and store.size(uri) == 5
    store.put_bytes(join(root, "a", "c.txt"), b"x")
    assert store.list(join(root, "a")) == [join(root, "a", "b.txt"), join(root, "a", "c.txt")]
    with store.open_read(uri) as fh:
        assert fh.read() == b"hello"
    store.delete(join(root, "a"))
    assert store.list(join(root, "a")) == []


def test_local_roundtrip(tmp_path):
    roundtrip(str(tmp_path / "root"))


def test_s3_roundtrip(s3_bucket):
    bucket, endpoint = s3_bucket
    roundtrip(bucket + "/prefix", endpoint)


def test_s3_put_file_and_get_file(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 << 20))
    store = store_for(bucket, endpoint)
    store.put_file(src, join(bucket, "x/big.bin"))
    assert [u for u in store.list(bucket) if TMP_PREFIX in u] == []
    got = store.get_file(join(bucket, "x/big.bin"), tmp_path / "back.bin")
    assert got.read_bytes() == src.read_bytes()


def test_local_put_is_atomic_on_failure(tmp_path, monkeypatch):
    store = LocalStore()
    target = tmp_path / "out.bin"
    store.put_bytes(str(target), b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.put_bytes(str(target), b"new-half-written")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_list_hides_temp_files(tmp_path):
    (tmp_path / f"{TMP_PREFIX}part.bin.123").write_bytes(b"partial")
    (tmp_path / "done.bin").write_bytes(b"d")
    assert LocalStore().list(str(tmp_path)) == [str(tmp_path / "done.bin")]


def manifest_cycle(paths: RunPaths):
    stage = paths.stage_uri("data")
    store = paths.store()
    store.put_bytes(join(stage, "out/part-0.bin"), b"0123456789")
    outs = describe_outputs(stage, ["out/part-0.bin"], paths.endpoint_url)
    assert outs[0]["size"] == 10 and len(outs[0]["sha256"]) == 64
    assert manifest_matches(stage, "h1", endpoint_url=paths.endpoint_url) == (False, "no manifest")
    write_manifest(stage, Manifest("data", paths.run_id, "h1", {"raw": ["x"]}, outs), paths.endpoint_url)
    assert read_manifest(stage, paths.endpoint_url).outputs == outs
    assert manifest_matches(stage, "h1", {"raw": ["x"]}, paths.endpoint_url) == (True, "complete")
    assert manifest_matches(stage, "h2", endpoint_url=paths.endpoint_url)[1].startswith("config changed")
    assert manifest_matches(stage, "h1", {"raw": ["y"]}, paths.endpoint_url) == (False, "inputs changed")
    store.put_bytes(join(stage, "out/part-0.bin"), b"short")
    assert manifest_matches(stage, "h1", endpoint_url=paths.endpoint_url)[1] == "output size changed: out/part-0.bin"
    invalidate(stage, paths.endpoint_url)
    assert read_manifest(stage, paths.endpoint_url) is None


def test_manifest_local(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "run-1")
    manifest_cycle(paths)
    assert paths.stage_uri("data") == str(tmp_path / "runs" / "run-1" / "data")


def test_manifest_s3(s3_bucket):
    bucket, endpoint = s3_bucket
    paths = RunPaths(bucket + "/runs", "run-1", endpoint)
    manifest_cycle(paths)
    assert paths.stage_uri("sft") == f"{bucket}/runs/run-1/sft"


def test_checksum_verification_catches_same_size_change(tmp_path):
    paths = RunPaths(str(tmp_path), "r")
    stage = paths.stage_uri("s")
    store = paths.store()
    store.put_bytes(join(stage, "f"), b"aaaa")
    write_manifest(stage, Manifest("s", "r", "h", {}, describe_outputs(stage, ["f"])))
    store.put_bytes(join(stage, "f"), b"bbbb")
    assert manifest_matches(stage, "h")[0] is True
    assert manifest_matches(stage, "h", verify_checksums=True) == (False, "output checksum changed: f")


def ranged_reads(root, endpoint=None):
    store = store_for(root, endpoint)
    uri = join(root, "r.bin")
    data = bytes(range(256)) * 40
    store.put_bytes(uri, data)
    with store.open_range(uri, 10, 300) as fh:
        assert fh.read() == data[10:300]
    with store.open_range(uri, 5000) as fh:
        assert fh.read() == data[5000:]
    assert store.open_range(uri, 7, 7).read() == b""
    fh = store.open_seekable(uri)
    fh.seek(-16, 2)
    tail = fh.read()
    fh.seek(100)
    assert tail == data[-16:] and fh.read(50) == data[100:150] and fh.tell() == 150


def test_local_ranged_and_seekable_reads(tmp_path):
    ranged_reads(str(tmp_path))
    assert store_for(str(tmp_path)).remote is False


def test_s3_ranged_and_seekable_reads(s3_bucket):
    bucket, endpoint = s3_bucket
    ranged_reads(bucket + "/ranges", endpoint)
    assert store_for(bucket, endpoint).remote is True


@pytest.mark.parametrize("uri,absolute", [("s3://b/k", True), ("file:///x/y", True), ("/x/y", True),
                                          ("x/y", False), ("tokenizer.model", False)])
def test_is_absolute(uri, absolute):
    from pipeline_lib.storage import is_absolute

    assert is_absolute(uri) is absolute


def test_s3_share_url_opens_without_credentials(s3_bucket):
    import urllib.request

    root, endpoint = s3_bucket
    store = store_for(root, endpoint)
    store.put_bytes(join(root, "r/eval/report.html"), b"<h1>report</h1>")
    url = store.share_url(join(root, "r/eval/report.html"))
    assert url.startswith(endpoint + "/") and "Signature" in url  # moto serves plain http; real S3 https
    with urllib.request.urlopen(url) as resp:  # a browser's GET: no AWS credentials, only the URL
        assert resp.read() == b"<h1>report</h1>"


def test_local_share_url_is_none_so_the_path_is_shown_as_text(tmp_path):
    # browsers refuse file:// links from a page: a local store has no URL to share
    assert LocalStore().share_url(str(tmp_path / "x")) is None


def put_new_once(root, endpoint, tmp_path):
    store = store_for(root, endpoint)
    uri = join(root, "v", "g1")
    assert store.put_new(uri, b"first") is True
    src = tmp_path / "second"
    src.write_bytes(b"second")
    assert store.put_new(uri, b"second") is False and store.put_new(uri, src) is False
    assert store.get_bytes(uri) == b"first" and store.list(join(root, "v")) == [uri]  # no temp file left
    assert store.put_new(join(root, "v", "g2"), src) is True and store.get_bytes(join(root, "v", "g2")) == b"second"


def test_local_put_new_creates_only_if_absent(tmp_path):
    put_new_once(str(tmp_path / "root"), None, tmp_path)


def test_s3_put_new_creates_only_if_absent(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    put_new_once(bucket, endpoint, tmp_path)


def test_s3_client_takes_its_retries_and_timeouts_from_the_environment(s3_bucket, monkeypatch):
    from pipeline_lib.storage import store_for

    bucket, endpoint = s3_bucket
    default = store_for(bucket, endpoint).client.meta.config
    assert (default.retries["total_max_attempts"], default.retries["mode"]) == (8, "standard")
    assert (default.connect_timeout, default.read_timeout) == (10, 60)
    monkeypatch.setenv("LLM_PIPELINE_S3_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("LLM_PIPELINE_S3_READ_TIMEOUT", "2.5")
    monkeypatch.setenv("LLM_PIPELINE_S3_RETRY_MODE", "adaptive")
    tuned = store_for(bucket, endpoint)  # a changed setting gets its own client
    assert (tuned.client.meta.config.retries["total_max_attempts"], tuned.client.meta.config.retries["mode"],
            tuned.client.meta.config.read_timeout) == (3, "adaptive", 2.5)
    assert store_for(bucket, endpoint) is tuned


@pytest.mark.parametrize("name,value", [("LLM_PIPELINE_S3_MAX_ATTEMPTS", "many"), ("LLM_PIPELINE_S3_READ_TIMEOUT", "0"),
                                        ("LLM_PIPELINE_S3_RETRY_MODE", "eager")])
def test_a_bad_s3_setting_is_refused_by_name(name, value, monkeypatch):
    from pipeline_lib.storage.store import S3Settings

    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}={value!r}.*Fix:"):
        S3Settings.from_env()
