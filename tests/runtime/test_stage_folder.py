"""The stage folder: a local working copy published to S3 (or the local stage folder itself),
described with size + sha256, and no manifest written by it."""
from __future__ import annotations

import hashlib

import pytest

from pipeline_lib.runtime.stage_folder import StageFolder, files_under
from pipeline_lib.runtime.upstream import localize
from pipeline_lib.storage import RunPaths, read_manifest, store_for


def test_stage_folder_on_s3(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    paths = RunPaths(bucket + "/runs", "r1", endpoint)
    with StageFolder(paths, "evaluate") as folder:
        assert folder.remote and folder.local.is_dir()
        (folder.local / "a").mkdir()
        (folder.local / "a" / "generations.jsonl").write_text("{}\n")
        (folder.local / "report.md").write_text("# r\n")
        outputs = folder.publish(files_under(folder.local))
    assert not folder.local.exists()
    store = store_for(bucket, endpoint)
    assert store.get_bytes(f"{bucket}/runs/r1/evaluate/a/generations.jsonl") == b"{}\n"
    assert [o["path"] for o in outputs] == ["a/generations.jsonl", "report.md"]
    assert outputs[1] == {"path": "report.md", "size": 4, "sha256": hashlib.sha256(b"# r\n").hexdigest()}
    assert read_manifest(paths.stage_uri("evaluate"), endpoint) is None  # the registry writes it, not the stage
    local = localize(f"{bucket}/runs/r1/evaluate/report.md", tmp_path, endpoint)
    assert open(local).read() == "# r\n"


def test_local_stage_folder_starts_empty_and_scratch_of_a_failed_stage_is_removed(tmp_path):
    paths = RunPaths(str(tmp_path), "r1")
    stale = tmp_path / "r1" / "export" / "old" / "merged.ckpt"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run")
    with StageFolder(paths, "export") as folder:
        assert not folder.remote and folder.local == tmp_path / "r1" / "export"
        assert files_under(folder.local) == []
        (folder.local / "checks.json").write_text("{}")
        (folder.local / ".tmp-x").write_text("half written")
        assert folder.publish(files_under(folder.local))[0]["path"] == "checks.json"
    assert (tmp_path / "r1" / "export" / "checks.json").exists()  # local: the folder is the output


def test_remote_scratch_is_removed_when_the_stage_fails(s3_bucket):
    bucket, endpoint = s3_bucket
    with pytest.raises(RuntimeError):
        with StageFolder(RunPaths(bucket + "/runs", "r2", endpoint), "export") as folder:
            (folder.local / "half.ckpt").write_text("x")
            raise RuntimeError("worker failed")
    assert not folder.local.exists()
