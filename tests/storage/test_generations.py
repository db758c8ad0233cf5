"""storage.generations: a value several processes update at once, on local disk and on S3 (moto)."""
import json
import multiprocessing
import time

import pytest

from pipeline_lib.storage import generations, join, store_for


def add_items(root: str, endpoint: str | None, who: str, n: int) -> None:
    """Append n items to a JSON list, one update each (spawned: two of these run at once)."""
    store = store_for(root, endpoint)
    for i in range(n):
        def write_next(current, out, i=i):
            items = json.loads(store.get_bytes(current)) if current else []
            time.sleep(0.01)  # widen the read-modify-write window: the writers do collide
            out.write_text(json.dumps(items + [f"{who}{i}"]))
        generations.update(store, join(root, "value"), write_next, suffix=".json")


def race(root: str, endpoint: str | None, n: int = 15) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=add_items, args=(root, endpoint, who, n)) for who in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    return json.loads(generations.read_bytes(store_for(root, endpoint), join(root, "value")))


def test_two_processes_updating_one_value_lose_nothing_local(tmp_path):
    items = race(str(tmp_path), None)
    assert sorted(items) == sorted([f"a{i}" for i in range(15)] + [f"b{i}" for i in range(15)])
    assert len(generations.list_generations(store_for(str(tmp_path)), join(str(tmp_path), "value"))) <= 3


def test_two_processes_updating_one_value_lose_nothing_s3(s3_bucket):
    bucket, endpoint = s3_bucket
    items = race(bucket, endpoint, n=8)
    assert sorted(items) == sorted([f"a{i}" for i in range(8)] + [f"b{i}" for i in range(8)])


def test_a_writer_that_always_loses_gives_up_naming_the_value(tmp_path):
    store = store_for(str(tmp_path))
    folder = join(str(tmp_path), "value")

    def someone_else_writes_first():
        gen, _ = generations.latest(store, folder)
        store.put_new(generations.gen_uri(folder, gen + 1), b"theirs")

    with pytest.raises(generations.CommitConflict, match=f"{folder}: 3 attempts.*Fix: run it again"):
        generations.update(store, folder, lambda cur, out: out.write_bytes(b"mine"), attempts=3,
                           after_read=someone_else_writes_first)
    assert generations.read_bytes(store, folder) == b"theirs"
