"""Links in input folders (issue 26, item 7): not followed unless follow_symlinks, and a link loop cannot
make a `**` glob (or a folder listing) endless."""
from __future__ import annotations

import os
import threading

from pipeline_lib.storage import list_matching
from pipeline_lib.storage.input_files import list_inputs


def tree(tmp_path):
    inside, outside = tmp_path / "in", tmp_path / "secret"
    (inside / "sub").mkdir(parents=True)
    outside.mkdir()
    (inside / "a.jsonl").write_text("{}\n")
    (inside / "sub" / "b.jsonl").write_text("{}\n")
    (outside / "s.jsonl").write_text("{}\n")
    os.symlink(outside / "s.jsonl", inside / "link.jsonl")  # a file link leading out of the folder
    os.symlink(outside, inside / "linkdir")  # a folder link leading out
    for name in ("loop1", "loop2", "loop3"):  # several links back up: glob.glob walked 3**40 paths
        os.symlink(inside, inside / "sub" / name)
    return inside, outside


def in_time(fn, seconds=5.0):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"listing did not return within {seconds} s"
    return out[0]


def test_links_in_input_folders_and_globs_are_not_followed_by_default(tmp_path):
    inside, _ = tree(tmp_path)
    want = sorted([str(inside / "a.jsonl"), str(inside / "sub" / "b.jsonl")])
    for pattern in (inside, inside / "*.jsonl", inside / "**" / "*.jsonl", inside / "**", inside / "*"):
        got = in_time(lambda: list_matching(str(pattern)))
        assert set(got) <= set(want) and str(inside / "a.jsonl") in got, (pattern, got)
        assert not any(x in p[len(str(tmp_path)):] for p in got for x in ("secret", "link", "loop")), (pattern, got)
    assert [u for u, _ in list_inputs([str(inside)])] == want


def test_a_link_named_in_the_config_is_read(tmp_path):
    inside, outside = tree(tmp_path)
    assert list_matching(str(inside / "link.jsonl")) == [str(inside / "link.jsonl")]


def test_follow_symlinks_reads_links_and_a_loop_is_listed_once(tmp_path):
    inside, _ = tree(tmp_path)
    for pattern in (inside, inside / "**" / "*.jsonl"):
        got = in_time(lambda: list_matching(str(pattern), follow_symlinks=True))
        names = sorted(os.path.basename(p) for p in got)
        assert {"a.jsonl", "b.jsonl", "s.jsonl", "link.jsonl"} <= set(names), (pattern, got)
        assert len(got) < 20, got  # each real folder once, not once per path through the loops


def test_data_stage_listing_honours_data_follow_symlinks(tmp_path):
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.data.prep import plan_data_stage
    from pipeline_lib.storage import RunPaths

    inside, _ = tree(tmp_path)
    for follow, expect in ((False, {"a.jsonl", "b.jsonl"}), (True, {"a.jsonl", "b.jsonl", "s.jsonl", "link.jsonl"})):
        cfg = config_from_dict({"run": {"output_root": str(tmp_path / f"runs{follow}")},
                                "data": {"inputs": [str(inside / "**" / "*.jsonl")], "follow_symlinks": follow}})
        shards = plan_data_stage(cfg, RunPaths(cfg.run.output_root, "r"))
        assert {os.path.basename(s["uri"]) for s in shards} == expect
