"""The cluster's own topology: an HCCL rank table (RANK_TABLE_FILE), per-node device lists, tensor-parallel groups.

- `parse_rank_table(data)` / `load_rank_table(path)`: the HCCL rank table JSON (version 1.0: `server_list`, each with
  `server_id` and `device` = [{device_id, device_ip, rank_id}], strings as HCCL writes them; format in
  docs/mindformers-facts.md) as a RankTable; ValueError naming the JSON field for a malformed file.
- `tp_groups(devices, model_parallel)`: the global ranks of each tensor-parallel group. MindSpore's semi-auto layout
  makes the pipeline stage the outermost rank dimension and model_parallel the innermost (mindformers' Llama
  strategies shard (dp, mp) with mp last), so a group is model_parallel consecutive ranks.
- `rank_table_issues(cfg, table)`: ConfigIssues when the table does not match the layout: rank count, rank ids,
  devices per server, and each tensor-parallel group inside one server's fast interconnect group (devices
  `device_id // fast_group_size` of one server).
- `node_device_issues(cfg)`: the same group check for parallel.node_devices without a rank table.
- `rank_env(table, node, rank_table_file)`: per local device the variables a rank-table launch sets (RANK_TABLE_FILE,
  RANK_ID, DEVICE_ID, RANK_SIZE), the route mindformers' scripts/run_distribute.sh takes.
- `visible_devices(cfg, node)`: the ASCEND_RT_VISIBLE_DEVICES value of node `node` (parallel.node_devices).
Pure (the one file read is `load_rank_table`); no MindSpore import.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import ConfigIssue


@dataclass(frozen=True)
class Device:
    device_id: int
    device_ip: str
    rank_id: int


@dataclass(frozen=True)
class Server:
    server_id: str
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class RankTable:
    servers: tuple[Server, ...]

    @property
    def rank_size(self) -> int:
        return sum(len(s.devices) for s in self.servers)

    def where(self) -> dict[int, tuple[int, Device]]:
        """rank_id -> (server index, device)."""
        return {d.rank_id: (i, d) for i, s in enumerate(self.servers) for d in s.devices}


def _int(value, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"rank table {field}={value!r}: not an integer (HCCL writes it as a string of digits, "
                         "e.g. \"0\")") from None


def parse_rank_table(data: dict) -> RankTable:
    if not isinstance(data, dict) or not isinstance(data.get("server_list"), list) or not data["server_list"]:
        raise ValueError("rank table: no server_list (expected the HCCL format: {\"version\": \"1.0\", "
                         "\"server_count\": \"1\", \"server_list\": [{\"server_id\": ..., \"device\": [{\"device_id\": "
                         "\"0\", \"device_ip\": ..., \"rank_id\": \"0\"}, ...]}], \"status\": \"completed\"})")
    if data.get("status", "completed") != "completed":
        raise ValueError(f"rank table status={data.get('status')!r}: HCCL uses a table only when it is "
                         "\"completed\"; regenerate it (hccl_tools) or wait for the scheduler to finish it")
    servers = []
    for i, srv in enumerate(data["server_list"]):
        devs = srv.get("device") if isinstance(srv, dict) else None
        if not isinstance(devs, list) or not devs:
            raise ValueError(f"rank table server_list[{i}].device: missing or empty")
        servers.append(Server(str(srv.get("server_id", i)), tuple(
            Device(_int(d.get("device_id"), f"server_list[{i}].device[{j}].device_id"), str(d.get("device_ip", "")),
                   _int(d.get("rank_id"), f"server_list[{i}].device[{j}].rank_id"))
            for j, d in enumerate(devs))))
    count = data.get("server_count")
    if count is not None and _int(count, "server_count") != len(servers):
        raise ValueError(f"rank table server_count={count!r} but server_list has {len(servers)} servers")
    return RankTable(tuple(servers))


def load_rank_table(path: str | Path) -> RankTable:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"parallel.rank_table_file={str(path)!r}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"parallel.rank_table_file={str(path)!r}: not JSON ({err.msg} at line {err.lineno})") from None
    return parse_rank_table(data)


def tp_groups(devices: int, model_parallel: int) -> list[list[int]]:
    return [list(range(start, start + model_parallel)) for start in range(0, devices, model_parallel)]


def fast_group_size(cfg) -> int:
    p = cfg.parallel
    return p.fast_group_size or p.devices_per_node


def _group_issue(cfg, group: list[int], places: list[tuple[int, int]], source: str) -> ConfigIssue | None:
    """places: (node, device_id) of each rank in `group`; one issue when they are not one fast group."""
    size = fast_group_size(cfg)
    if len({(node, dev // size) for node, dev in places}) == 1:
        return None
    shown = ", ".join(f"rank {r} -> node {n} device {d}" for r, (n, d) in zip(group, places))
    return ConfigIssue("parallel.model_parallel", cfg.parallel.model_parallel,
                       f"tensor-parallel group {group} leaves one fast interconnect group of {size} devices "
                       f"({source}: {shown}); every layer would all-reduce over the slower link",
                       f"keep each group of {cfg.parallel.model_parallel} consecutive ranks on one node's devices "
                       f"d with the same d // {size} (reorder the devices or the rank ids), or lower model_parallel "
                       "and use pipeline_stage / data_parallel across the groups")


def rank_table_issues(cfg, table: RankTable) -> list[ConfigIssue]:
    p, field = cfg.parallel, "parallel.rank_table_file"
    issues = []
    if table.rank_size != p.devices:
        issues.append(ConfigIssue(field, p.rank_table_file, f"the table lists {table.rank_size} devices but "
                                  f"parallel.devices={p.devices}", f"set parallel.devices={table.rank_size} (and the "
                                  "degrees to match) or use the rank table of this job's devices"))
    ranks = sorted(d.rank_id for s in table.servers for d in s.devices)
    if ranks != list(range(len(ranks))):
        issues.append(ConfigIssue(field, p.rank_table_file, f"rank_id values {ranks} are not 0..{len(ranks) - 1}, "
                                  "each once", "number the devices' rank_id 0..N-1 without gaps or repeats"))
        return issues
    sizes = {len(s.devices) for s in table.servers}
    if sizes != {p.devices_per_node}:
        issues.append(ConfigIssue("parallel.devices_per_node", p.devices_per_node,
                                  f"the rank table's servers hold {sorted(sizes)} devices each",
                                  f"set parallel.devices_per_node={max(sizes)} (every server must hold the same "
                                  "number of devices)"))
    for i, srv in enumerate(table.servers):
        want = list(range(i * p.devices_per_node, (i + 1) * p.devices_per_node))
        if sorted(d.rank_id for d in srv.devices) != want and len(srv.devices) == p.devices_per_node:
            issues.append(ConfigIssue(field, p.rank_table_file, f"server_list[{i}] ({srv.server_id}) holds ranks "
                                      f"{sorted(d.rank_id for d in srv.devices)}, not {want}: node {i} of this "
                                      "pipeline (its hang watchdog, checkpoint merge and node reports) runs those",
                                      "number each server's devices with consecutive rank_id, server by server"))
            break
    if table.rank_size == p.devices:
        where = table.where()
        for group in tp_groups(p.devices, p.model_parallel):
            places = [(where[r][0], where[r][1].device_id) for r in group]
            issue = _group_issue(cfg, group, places, "rank table")
            if issue:
                issues.append(issue)
                break  # one example names the fix; the rest repeat it
    return issues


def node_device_issues(cfg) -> list[ConfigIssue]:
    """parallel.node_devices: one list per node of devices_per_node distinct ids; each TP group in one fast group."""
    p = cfg.parallel
    if p.node_devices is None:
        return []
    field, issues = "parallel.node_devices", []
    if len(p.node_devices) != p.num_nodes:
        issues.append(ConfigIssue(field, p.node_devices, f"{len(p.node_devices)} device lists for {p.num_nodes} "
                                  f"node(s) (parallel.devices={p.devices} / devices_per_node={p.devices_per_node})",
                                  "give one list per node, in node-rank order"))
    for n, devs in enumerate(p.node_devices):
        if len(devs) != p.devices_per_node or len(set(devs)) != len(devs):
            issues.append(ConfigIssue(f"{field}[{n}]", devs, f"must list {p.devices_per_node} distinct device ids "
                                      "(parallel.devices_per_node)", f"list the {p.devices_per_node} devices node {n} "
                                      "runs on, each once"))
    if issues:
        return issues
    for group in tp_groups(p.devices, p.model_parallel):
        places = [(r // p.devices_per_node, p.node_devices[r // p.devices_per_node][r % p.devices_per_node])
                  for r in group]
        issue = _group_issue(cfg, group, places, "parallel.node_devices")
        if issue:
            return [issue]
    return []


def rank_env(table: RankTable, node: int, rank_table_file: str | Path) -> list[dict[str, str]]:
    """The environment of each process a rank-table launch starts on server `node` (one per device)."""
    if not 0 <= node < len(table.servers):
        raise ValueError(f"node={node}: the rank table has {len(table.servers)} servers (0..{len(table.servers) - 1})")
    return [{"RANK_TABLE_FILE": str(Path(rank_table_file).resolve()), "RANK_ID": str(d.rank_id),
             "DEVICE_ID": str(d.device_id), "RANK_SIZE": str(table.rank_size)}
            for d in sorted(table.servers[node].devices, key=lambda d: d.rank_id)]


def visible_devices(cfg, node: int) -> str | None:
    """ASCEND_RT_VISIBLE_DEVICES for node `node`, or None when parallel.node_devices is not set."""
    devs = cfg.parallel.node_devices
    if devs is None:
        return None
    if not 0 <= node < len(devs):
        raise ValueError(f"node={node}: parallel.node_devices has {len(devs)} node lists")
    return ",".join(str(d) for d in devs[node])
