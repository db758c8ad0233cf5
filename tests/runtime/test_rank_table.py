"""The rank-table route: HCCL rank table parsing, its checks against the layout, the per-process launch."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.runtime.rank_table import (load_rank_table, parse_rank_table, rank_env, rank_table_issues,
                                             tp_groups, visible_devices)
from pipeline_lib.train.launch import build_command

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
from llama2_configs import LLAMA2_7B_4X64GB  # noqa: E402


def table(servers: list[list[int]], ranks: list[list[int]] | None = None) -> dict:
    """An HCCL rank table (version 1.0) of `servers` device-id lists; ranks default to 0..N-1 in order."""
    n, server_list = 0, []
    for i, devs in enumerate(servers):
        rows = []
        for j, d in enumerate(devs):
            rank = ranks[i][j] if ranks else n
            rows.append({"device_id": str(d), "device_ip": f"192.98.{i}.{10 + d}", "rank_id": str(rank)})
            n += 1
        server_list.append({"server_id": f"10.0.0.{i + 1}", "device": rows, "host_nic_ip": "reserve"})
    return {"version": "1.0", "server_count": str(len(servers)), "server_list": server_list, "status": "completed"}


def cfg(**parallel):
    raw = copy.deepcopy(LLAMA2_7B_4X64GB)
    raw["parallel"].update(parallel)
    return config_from_dict(raw)


def test_parse_reads_devices_and_ranks():
    t = parse_rank_table(table([[0, 1, 2, 3], [0, 1, 2, 3]]))
    assert t.rank_size == 8 and t.servers[1].server_id == "10.0.0.2"
    assert t.where()[5] == (1, t.servers[1].devices[1])
    with pytest.raises(ValueError, match="server_list"):
        parse_rank_table({"version": "1.0"})
    with pytest.raises(ValueError, match="status"):
        parse_rank_table({**table([[0]]), "status": "initializing"})
    with pytest.raises(ValueError, match=r"device\[0\].rank_id='x'"):
        bad = table([[0]])
        bad["server_list"][0]["device"][0]["rank_id"] = "x"
        parse_rank_table(bad)


def test_tp_groups_are_consecutive_ranks():
    assert tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_matching_table_has_no_issue():
    assert rank_table_issues(cfg(), parse_rank_table(table([[0, 1, 2, 3]]))) == []


def test_a_tp_group_across_servers_is_refused_with_the_fix():
    # 2 servers x 2 devices with model_parallel 2 is fine; ranks 1 and 2 swapped puts group [0, 1] on two servers
    c = cfg(devices=4, data_parallel=2, model_parallel=2, pipeline_stage=1, micro_batch_num=1, devices_per_node=2)
    assert rank_table_issues(c, parse_rank_table(table([[0, 1], [0, 1]]))) == []
    found = rank_table_issues(c, parse_rank_table(table([[0, 1], [0, 1]], ranks=[[0, 2], [1, 3]])))
    assert [i.field for i in found] == ["parallel.rank_table_file", "parallel.model_parallel"]
    assert "holds ranks [0, 2], not [0, 1]" in found[0].problem
    assert "rank 0 -> node 0 device 0, rank 1 -> node 1 device 0" in found[1].problem
    assert "consecutive ranks on one node" in found[1].fix


def test_table_size_rank_ids_and_server_sizes_are_checked():
    c = cfg()
    found = rank_table_issues(c, parse_rank_table(table([[0, 1, 2, 3, 4, 5, 6, 7]])))
    assert {i.field for i in found} == {"parallel.rank_table_file", "parallel.devices_per_node"}
    found = rank_table_issues(c, parse_rank_table(table([[0, 1, 2, 3]], ranks=[[0, 1, 1, 3]])))
    assert "not 0..3" in found[0].problem
    # a fast group of 2 (read from the config): devices 1 and 2 of one server are two groups
    found = rank_table_issues(cfg(fast_group_size=2), parse_rank_table(table([[1, 2, 3, 4]])))
    assert found and found[0].field == "parallel.model_parallel"


def test_rank_env_and_visible_devices(tmp_path):
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(table([[0, 1, 2, 3], [4, 5, 6, 7]])))
    envs = rank_env(load_rank_table(path), 1, path)
    assert [e["RANK_ID"] for e in envs] == ["4", "5", "6", "7"]
    assert [e["DEVICE_ID"] for e in envs] == ["4", "5", "6", "7"]
    assert {e["RANK_SIZE"] for e in envs} == {"8"} and envs[0]["RANK_TABLE_FILE"] == str(path.resolve())
    c = cfg(devices=8, data_parallel=2, devices_per_node=4, node_devices=[[0, 1, 2, 3], [4, 5, 6, 7]])
    assert visible_devices(c, 1) == "4,5,6,7" and visible_devices(cfg(), 0) is None
    with pytest.raises(ValueError, match="cannot read"):
        load_rank_table(tmp_path / "missing.json")


def test_the_rank_table_route_starts_one_process_per_device_with_hccl_variables(tmp_path):
    """build_command picks the rank-table launcher; it runs each rank with the table's variables and logs
    worker_<rank>.log as msrun does (the entry here prints its environment instead of training)."""
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(table([[0, 1], [2, 3]])))
    c = cfg(devices=4, data_parallel=2, model_parallel=2, pipeline_stage=1, micro_batch_num=1, devices_per_node=2,
            rank_table_file=str(path))
    probe = tmp_path / "probe_entry.py"
    probe.write_text("import os, sys\nprint('ENV', os.environ['RANK_ID'], os.environ['DEVICE_ID'], "
                     "os.environ['RANK_SIZE'], sys.argv[1:])\n")
    command = build_command(c.parallel, tmp_path / "run.yaml", node_rank=1, log_dir=tmp_path / "logs",
                            entry_module="probe_entry")
    assert command[1:3] == ["-m", "pipeline_lib.train.rank_table_launch"] and "--node=1" in command
    import os
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("worker_*.log")}
    assert sorted(logs) == ["worker_2.log", "worker_3.log"]
    assert "ENV 2 2 4 ['--yaml'" in logs["worker_2.log"] and "ENV 3 3 4" in logs["worker_3.log"]


def test_a_run_reads_and_checks_the_rank_table_before_training(tmp_path):
    from pipeline_lib.checks import _rank_table_issues

    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(table([[0, 1, 2, 3, 4, 5, 6, 7]])))
    found = _rank_table_issues(cfg(rank_table_file=str(path)))
    assert found and found[0].field == "parallel.rank_table_file" and "8 devices" in found[0].problem
    path.write_text("{not json")
    assert "not JSON" in _rank_table_issues(cfg(rank_table_file=str(path)))[0].problem
