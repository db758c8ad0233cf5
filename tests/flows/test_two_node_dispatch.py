"""Two-node training dispatch for real: a real Prefect server, `llm-pipeline pools` + `llm-pipeline deploy`, one real
process worker on the `ascend` pool (2 flow runs at once), the pipeline flow dispatching pretrain as two child flow
runs (node_rank 0 and 1), each starting msrun --worker_num=2 --local_worker_num=1 --node_rank=N: CPU data parallel,
one process per node.

Two hosts on one machine: msrun starts the scheduler on every node whose `ip -j addr` lists master_addr. A shim `ip`
(first on the worker's PATH) lists 127.0.0.2 for node rank 0 only, so node 0 holds the scheduler on 127.0.0.2 and
node 1 joins it, as on two machines. Everything else (msrun, MindSpore's CPU collectives, Prefect) is real.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from prefect import get_client
from prefect.client.schemas.objects import StateType
from process_groups import stop_worker

from pipeline_lib import stages
from pipeline_lib.config import load_config
from pipeline_lib.storage import RunPaths, read_manifest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.e2e]

SHIM = """#!/bin/sh
# node rank 0's "host" owns 127.0.0.2: msrun starts the scheduler where master_addr is a local address
if [ "$LLM_PIPELINE_NODE_RANK" = "0" ] && [ "$1 $2" = "-j addr" ]; then
  echo '[{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.2","prefixlen":8}]}]'
else
  exec /usr/sbin/ip "$@"
fi
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args):
    env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT))
    res = subprocess.run([str(BIN / "llm-pipeline"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


@pytest.fixture(scope="module")
def ascend_worker(prefect_server, tmp_path_factory):
    """Pools and deployments made by our CLI, one process worker on the ascend pool running 2 flow runs at once."""
    _cli("pools")
    _cli("deploy")
    home = tmp_path_factory.mktemp("two_node")
    shim = home / "shim"
    shim.mkdir()
    (shim / "ip").write_text(SHIM)
    (shim / "ip").chmod(0o755)
    env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT), PREFECT_WORKER_QUERY_SECONDS="1",
               PATH=f"{shim}:{os.environ['PATH']}", LLM_PIPELINE_WORK_DIR=str(home / "work"))
    log = home / "worker.log"
    proc = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "ascend", "--type", "process",
                             "--limit", "2"], cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    yield home, log
    stop_worker(proc)


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    """The data stage of a tiny run, done once in this process (not under test here)."""
    root = tmp_path_factory.mktemp("two_node_runs")
    overrides = [f"run.output_root={root}", "data.executor=local"]
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", overrides)
    stages.run_stage(cfg, RunPaths(cfg.run.output_root, "seed"), "data", log=lambda line: None)
    return root, overrides


def _two_nodes(port: int, steps: int) -> list[str]:
    return ["parallel.devices=2", "parallel.data_parallel=2", "parallel.devices_per_node=1",
            "parallel.master_addr=127.0.0.2", f"parallel.master_port={port}", "training.micro_batch_size=2",
            f"training.steps={steps}", f"training.save_steps={steps}", "training.preflight_steps=0",
            "training.warmup_steps=1",
            "orchestration.task_retries=0", "training.timeout_seconds=600"]


def _copy_data(root: Path, run_id: str) -> None:
    import shutil

    shutil.copytree(root / "seed" / "data", root / run_id / "data")


def _weights(path: str) -> dict:
    import mindspore as ms

    return {n: p.asnumpy() for n, p in ms.load_checkpoint(path).items()
            if "." in n and not n.startswith(("adam_m.", "adam_v.", "accu_grads"))}


def _children(run_id: str) -> dict:
    with get_client(sync_client=True) as client:
        return {r.name: r for r in client.read_flow_runs() if r.name.startswith(f"pretrain/{run_id}/node-")}


def _left(marker: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and p.pid != os.getpid():
            out.append(f"{p.pid}: {cmd[:200]}")
    return out


def test_two_node_ranks_train_the_same_weights_and_node_0_writes_one_manifest(ascend_worker, data_run):
    from flows.pipeline import llm_pipeline

    root, overrides = data_run
    _copy_data(root, "two-node-ok")
    started = time.time()
    summary = llm_pipeline(config="configs/pipelines/tiny-cpu.yaml", run_id="two-node-ok", stages=["pretrain"],
                           overrides=[*overrides, *_two_nodes(free_port(), 4)], dispatch=True)
    seconds = time.time() - started
    assert summary["stages"]["pretrain"]["state"] == "completed", summary
    children = _children("two-node-ok")
    assert sorted(children) == ["pretrain/two-node-ok/node-0", "pretrain/two-node-ok/node-1"]
    assert {r.work_pool_name for r in children.values()} == {"ascend"}
    assert all(r.state.type == StateType.COMPLETED for r in children.values())

    m = read_manifest(str(root / "two-node-ok" / "pretrain"))
    ckpts = m.metrics["checkpoints"]
    assert sorted(ckpts) == ["0", "1"] and sorted(m.metrics["checkpoint_layout"]["ranks"]) == ["0", "1"]
    assert sorted(m.metrics["nodes"]) == ["0", "1"] and m.metrics["nodes"]["1"]["ranks"] == [1]
    paths = {o["path"] for o in m.outputs}
    assert any(p.startswith("checkpoint/rank_0/") for p in paths) and any(p.startswith("checkpoint/rank_1/")
                                                                           for p in paths)
    a, b = _weights(ckpts["0"]), _weights(ckpts["1"])
    assert sorted(a) == sorted(b) and a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    print(f"two-node dispatch: {seconds:.0f} s, step time {m.metrics.get('step_time_ms')} ms, "
          f"steps {m.metrics.get('steps')}")


def test_a_failed_node_cancels_its_sibling_and_fails_the_parent_naming_it(ascend_worker, data_run):
    from flows.pipeline import StageFailed, llm_pipeline

    root, overrides = data_run
    _copy_data(root, "two-node-fail")
    port = free_port()
    killed = {}

    def kill_node_1_when_training():
        """SIGKILL node 1's msrun once node 0 logged a training step: a node lost mid-run."""
        deadline = time.time() + 400
        metrics = root / "two-node-fail" / "pretrain" / "metrics.jsonl"
        while time.time() < deadline and not killed:
            if metrics.exists() and metrics.stat().st_size:
                for p in psutil.process_iter(["cmdline"]):
                    cmd = " ".join(p.info["cmdline"] or [])
                    if "--node_rank=1" in cmd and f"--master_port={port}" in cmd:
                        p.kill()
                        killed["pid"] = p.pid
            time.sleep(0.5)

    killer = threading.Thread(target=kill_node_1_when_training, daemon=True)
    killer.start()
    with pytest.raises(StageFailed) as err:
        llm_pipeline(config="configs/pipelines/tiny-cpu.yaml", run_id="two-node-fail", stages=["pretrain"],
                     overrides=[*overrides, *_two_nodes(port, 2000)], dispatch=True)
    killer.join(5)
    assert killed, "node 1's msrun was never seen training"
    assert "pretrain/two-node-fail/node-1" in str(err.value), str(err.value)
    deadline = time.time() + 90
    while time.time() < deadline:
        states = {n: r.state.type for n, r in _children("two-node-fail").items()}
        if states.get("pretrain/two-node-fail/node-0") == StateType.CANCELLED and not _left(f"--master_port={port}") \
                and not _left(str(root / "two-node-fail")):
            break
        time.sleep(2)
    assert states["pretrain/two-node-fail/node-1"] == StateType.FAILED, states
    assert states["pretrain/two-node-fail/node-0"] == StateType.CANCELLED, states
    assert not _left(f"--master_port={port}") and not _left(str(root / "two-node-fail")), \
        _left(f"--master_port={port}") + _left(str(root / "two-node-fail"))
    assert read_manifest(str(root / "two-node-fail" / "pretrain")) is None
