"""Create the work pools and concurrency limits (idempotent: rerunning changes nothing).

- one process pool per pool the stage table names (pipeline_lib.stages SPECS `pool`) plus the
  driver's: `cpu` (data stage, the end-to-end driver, the nightly job), `ascend` (training,
  evaluation, export); a pool's job variables carry its environment (deployments.POOL_ENV: on
  ascend the device environment, ASCEND_RT_VISIBLE_DEVICES and HCCL timeouts) every run inherits;
- a global concurrency limit `ascend-node-<host>` of 1 per Ascend node: the training task holds a
  slot of its node's limit for its whole run, so a node never runs two trainings at once.
"""
from __future__ import annotations

import argparse
import copy

from deployments import POOL_ENV, pool_names
from tasks.stage_task import node_limit_name


def process_template(env_defaults: dict | None = None) -> dict:
    from prefect.workers.process import ProcessWorker

    template = copy.deepcopy(ProcessWorker.get_default_base_job_template())
    if env_defaults:
        template["variables"]["properties"]["env"]["default"] = dict(env_defaults)
    return template


def ensure_pools(ascend_hosts: list[str]) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    done = []
    with get_client(sync_client=True) as client:
        for name in pool_names():
            try:
                client.read_work_pool(name)
                done.append(f"pool {name}: exists")
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process",
                                                       base_job_template=process_template(POOL_ENV.get(name))))
                done.append(f"pool {name}: created")
        for host in ascend_hosts:
            limit = node_limit_name(host)
            try:
                client.read_global_concurrency_limit_by_name(limit)
                done.append(f"limit {limit}: exists")
            except ObjectNotFound:
                try:
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))
                    done.append(f"limit {limit}: created (1 training at a time)")
                except ObjectAlreadyExists:
                    done.append(f"limit {limit}: exists")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llm-pipeline pools", description=__doc__.splitlines()[0])
    ap.add_argument("--ascend-hosts", default="", help="comma-separated Ascend node host names")
    args = ap.parse_args(argv)
    hosts = [h.strip() for h in args.ascend_hosts.split(",") if h.strip()]
    for line in ensure_pools(hosts):
        print(line)
    return 0
