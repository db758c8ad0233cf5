"""The data stage's step tasks: shards fanned out to an executor, and the progress line a person reads."""
import concurrent.futures as cf
import time

import pytest

from tasks.data_tasks import fan_out, shard_ranges


def _slow_square(k: int) -> int:
    time.sleep(0.05 * (3 - k % 3))  # finishes out of order
    return k * k


def _fails_at(k: int, bad: int) -> int:
    if k == bad:
        raise ValueError(f"shard {k}")
    time.sleep(0.2)
    return k


def test_shard_ranges_reads_as_ranges():
    assert shard_ranges([9, 0, 1, 2, 3, 7, 10]) == "0-3, 7, 9-10"
    assert shard_ranges([4]) == "4"
    assert shard_ranges([]) == ""


@pytest.mark.parametrize("workers", [0, 2])
def test_fan_out_returns_in_item_order_and_names_the_shards_not_done(workers):
    heard = []
    items = [(k,) for k in range(6)]
    pool = cf.ProcessPoolExecutor(workers) if workers else None
    try:
        out = fan_out(pool, _slow_square, items, "prep", lambda *a: heard.append(a))
    finally:
        if pool:
            pool.shutdown()
    assert out == [k * k for k in range(6)]
    assert heard[0] == ("prep", 0, 6, "not done: shards 0-5")
    assert heard[-1] == ("prep", 6, 6, "all done")
    assert [h[1] for h in heard] == list(range(7))
    for _, done, _, detail in heard[1:-1]:  # every line names exactly the shards still running or waiting
        named = [int(x) for part in detail.removeprefix("not done: shards ").split(", ")
                 for x in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))]
        assert len(named) == 6 - done


def test_fan_out_raises_the_first_failure_without_waiting_for_the_rest():
    with cf.ThreadPoolExecutor(2) as pool:
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="shard 0"):
            fan_out(pool, _fails_at, [(k, 0) for k in range(8)], "tokenize", lambda *a: None)
        assert time.monotonic() - t0 < 0.2 * 8 / 2  # not every item ran: the queued ones were cancelled
