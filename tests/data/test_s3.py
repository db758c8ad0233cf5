"""The data stage reading its inputs from s3:// and writing its stage folder to s3:// (moto server)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from datagen import TINY, make_cfg

from pipeline_lib.stages import record_stage, run_stage
from pipeline_lib.data.packing import read_mindrecord
from pipeline_lib.data.workspace import Workspace
from pipeline_lib.storage import RunPaths, join, read_manifest, store_for


def test_stage_streams_s3_inputs_and_writes_the_stage_to_s3(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    store = store_for(bucket, endpoint)
    store.put_file(TINY, join(bucket, "raw", "tiny_corpus.jsonl"))
    texts = [f"第{i}份巡检报告：变压器油温正常，冷却风扇运行良好，未发现渗漏油现象，记录人签字确认。" * 2 for i in range(30)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "extra.parquet", row_group_size=10)
    store.put_file(tmp_path / "extra.parquet", join(bucket, "raw", "extra.parquet"))

    cfg = make_cfg(tmp_path, inputs=[join(bucket, "raw") + "/"], docs_per_shard=150)
    cfg.run.output_root, cfg.run.s3_endpoint_url = join(bucket, "runs"), endpoint
    paths = RunPaths(cfg.run.output_root, "s3run", endpoint)
    manifest, _ = run_stage(cfg, paths, "data", workers=1)

    stage = paths.stage_uri("data")
    assert read_manifest(stage, endpoint).outputs == manifest.outputs
    stats = json.loads(store.get_bytes(join(stage, "stats.json")))
    assert stats["balanced"] and set(stats["files"]) == {"tiny_corpus.jsonl", "extra.parquet"}
    assert stats["files"]["extra.parquet"]["read"] == 30 and stats["files"]["tiny_corpus.jsonl"]["read"] == 438
    assert stats["files"]["extra.parquet"]["near_duplicates"] + stats["files"]["extra.parquet"]["kept"] == 30
    shards = [o["path"] for o in manifest.outputs if o["path"].endswith(".mindrecord")]
    local = []
    for rel in shards:
        for suffix in ("", ".db"):
            local.append(store.get_file(join(stage, rel + suffix), tmp_path / "dl" / (rel + suffix)))
    rows = read_mindrecord([p for p in local if p.suffix == ".mindrecord" and "train" in str(p)])
    assert len(rows) == stats["total"]["rows_train"]
    assert store.list(join(bucket, "runs", "_dedup_index", "tiny-cpu", "segments", "s3run") + "/")
    assert not store.list(join(stage, "shards") + "/")            # work files removed
    assert not Workspace(cfg, paths).root.exists() or not any(Workspace(cfg, paths).root.iterdir())


def test_step_functions_share_their_work_through_s3(s3_bucket, tmp_path):
    """What a Prefect flow does: each step in its own call (possibly another machine), work files
    and markers on S3; the result equals the one-process run."""
    import shutil

    from pipeline_lib.data.encode import build_tokenizer, plan_mindrecord, tokenize_shard, write_mindrecord_shard
    from pipeline_lib.data.prep import dedup_stage, plan_data_stage, prep_shard
    from pipeline_lib.data.stage import finalize_data_stage

    bucket, endpoint = s3_bucket
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"\n".join(TINY.read_bytes().split(b"\n")[:200]) + b"\n")
    cfg = make_cfg(tmp_path, inputs=[str(small)], docs_per_shard=100)
    cfg.run.output_root, cfg.run.s3_endpoint_url = join(bucket, "runs"), endpoint
    paths = RunPaths(cfg.run.output_root, "mapped", endpoint)
    ws = Workspace(cfg, paths)
    shards = plan_data_stage(cfg, paths)
    for k in range(len(shards)):
        prep_shard(cfg, paths, k)
    store = store_for(bucket, endpoint)
    assert store.exists(join(paths.stage_uri("data"), "shards", "00001.prep.done"))
    shutil.rmtree(ws.root)  # "another machine": nothing local survives between steps
    dedup_stage(cfg, paths)
    build_tokenizer(cfg, paths)
    shutil.rmtree(ws.root)
    for k in range(len(shards)):
        tokenize_shard(cfg, paths, k)
    for split, j in plan_mindrecord(cfg, paths):
        write_mindrecord_shard(cfg, paths, split, j)
    shutil.rmtree(ws.root)
    manifest = record_stage(cfg, paths, "data", finalize_data_stage(cfg, paths))
    local = make_cfg(tmp_path / "local", inputs=[str(small)], docs_per_shard=100)
    assert run_stage(local, RunPaths(local.run.output_root, "mapped"), "data", workers=1)[0].outputs == manifest.outputs


def test_each_shard_reads_only_its_byte_range_of_an_s3_object(s3_bucket, tmp_path):
    """Every S3 GetObject is recorded through a boto3 event hook: after planning, a shard of a plain
    object is one ranged GET of exactly its bytes; a big gzip object is streamed once, by the planner,
    into chunks on the shared stage folder, and its shards read ranges of those chunks, never the object."""
    import gzip
    import shutil

    from pipeline_lib.data.prep import plan_data_stage, prep_shard

    bucket, endpoint = s3_bucket
    store = store_for(bucket, endpoint)
    store.put_file(TINY, join(bucket, "raw", "plain.jsonl"))
    store.put_bytes(join(bucket, "raw", "packed.jsonl.gz"), gzip.compress(TINY.read_bytes(), mtime=0))
    cfg = make_cfg(tmp_path, inputs=[join(bucket, "raw") + "/"], docs_per_shard=None, shard_mb=0.05)
    cfg.run.output_root, cfg.run.s3_endpoint_url = join(bucket, "runs"), endpoint
    paths = RunPaths(cfg.run.output_root, "ranged", endpoint)
    gets = []
    hook = lambda params, **_: gets.append((params["Key"], params.get("Range")))  # noqa: E731
    store.client.meta.events.register("before-parameter-build.s3.GetObject", hook)
    try:
        shards = plan_data_stage(cfg, paths)
        planned, gets[:] = list(gets), []
        by_key = {"plain.jsonl": [], "packed.jsonl.gz": []}
        for k, spec in enumerate(shards):
            shutil.rmtree(Workspace(cfg, paths).root, ignore_errors=True)  # as on another machine
            prep_shard(cfg, paths, k)
            reads = [(key, rng) for key, rng in gets if key.endswith((".jsonl", ".gz")) and "/raw/" in "/" + key
                     or "/gunzip/" in key]
            gets[:] = []
            by_key[spec["label"]].append(reads)
            source = spec["source"] or spec["uri"]
            assert reads == [(source.split("/", 3)[3], f"bytes={spec['start']}-{spec['end'] - 1}")], (k, reads)
    finally:
        store.client.meta.events.unregister("before-parameter-build.s3.GetObject", hook)
    raw_reads = [(key, rng) for key, rng in planned if key.startswith("raw/")]
    # planning: one streamed pass per input object (line numbering / the one decompression), none per shard
    assert sorted(raw_reads) == [("raw/packed.jsonl.gz", None), ("raw/plain.jsonl", None)]
    size = TINY.stat().st_size
    assert len(by_key["plain.jsonl"]) == len(by_key["packed.jsonl.gz"]) == -(-size // int(0.05 * (1 << 20))) >= 5
    assert all("/shards/gunzip/" in r[0][0] for r in by_key["packed.jsonl.gz"])


def test_a_split_gzip_input_with_the_stage_on_s3_in_one_process(s3_bucket, tmp_path):
    """run_stage with an s3:// stage folder keeps the work files (and the decompressed chunks) on this
    machine: the gzip input is split, read from the local chunks, and the outputs equal a local run's."""
    import gzip

    bucket, endpoint = s3_bucket
    store = store_for(bucket, endpoint)
    store.put_bytes(join(bucket, "raw", "packed.jsonl.gz"), gzip.compress(TINY.read_bytes(), mtime=0))
    cfg = make_cfg(tmp_path, inputs=[join(bucket, "raw", "packed.jsonl.gz")], docs_per_shard=None, shard_mb=0.03)
    cfg.run.output_root, cfg.run.s3_endpoint_url = join(bucket, "runs"), endpoint
    manifest, _ = run_stage(cfg, RunPaths(cfg.run.output_root, "gz", endpoint), "data", workers=1)
    stats = json.loads(store.get_bytes(join(cfg.run.output_root, "gz", "data", "stats.json")))
    assert stats["shards"] >= 8 and stats["files"]["packed.jsonl.gz"]["read"] == 438
    assert not store.list(join(cfg.run.output_root, "gz", "data", "shards") + "/")  # chunks never uploaded

    local_gz = tmp_path / "local" / "packed.jsonl.gz"
    local_gz.parent.mkdir()
    local_gz.write_bytes(gzip.compress(TINY.read_bytes(), mtime=0))
    local = make_cfg(tmp_path / "local", inputs=[str(local_gz)], docs_per_shard=None, shard_mb=64)  # one shard
    want = run_stage(local, RunPaths(local.run.output_root, "gz"), "data", workers=1)[0]
    mindrecords = lambda m: {o["path"]: o["sha256"] for o in m.outputs if o["path"].endswith(".mindrecord")}  # noqa: E731
    assert mindrecords(manifest) == mindrecords(want) and mindrecords(want)
