"""Prefect deployments of the pipeline, derived from the stage table (pipeline_lib.stages.SPECS).

deployments/prefect.yaml holds what is not a stage (the end-to-end chain, the nightly job, the pull
step); `llm-pipeline deploy` adds one deployment per stage of the table, on the work pool its row
names, and hands the whole file to `prefect deploy`; the chain's and the nightly's run forms are folded after it,
their sections opening at the config file's values (flows/run_form.py). setup_pools.py creates the same pools.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = ROOT / "deployments" / "prefect.yaml"

# The pool the chain and the nightly job run on (they only dispatch and wait).
DRIVER_POOL = "cpu"
# Environment every run on a pool inherits (the pool's job variables); a pool not named here is a
# plain process pool. Ascend: the cards a worker may use and HCCL's link timeout for multi-node jobs.
POOL_ENV = {"ascend": {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "HCCL_CONNECT_TIMEOUT": "1200"}}


def pool_names() -> list[str]:
    """Every work pool: the driver's, then each stage's pool in table order."""
    from pipeline_lib.stages import pools

    return list(dict.fromkeys([DRIVER_POOL, *pools()]))


def pool_needs(pool: str) -> str:
    """Why a deployment on `pool` shows Not Ready in the UI until a worker polls it, and what makes it Ready."""
    where = "on each Ascend node" if pool == "ascend" else "on a machine of that pool"
    return (f"Needs a worker on work pool `{pool}` (`prefect worker start --pool {pool}` {where}); Not Ready in the "
            "UI until one polls. Without one, run the chain without dispatch (every stage on the driver's worker).")


def unserved_pools(doc: dict, online: dict[str, int]) -> list[str]:
    """What `llm-pipeline deploy` says about pools no worker polls: their deployments show Not Ready, and why.
    `online`: pool -> workers online."""
    by_pool: dict[str, list[str]] = {}
    for dep in doc["deployments"]:
        pool = (dep.get("work_pool") or {}).get("name")
        if pool and not online.get(pool):
            func = dep["entrypoint"].rsplit(":", 1)[1]
            flow = {"llm_pipeline": "llm-pipeline", "nightly": "nightly-pretrain",
                    "nightly_decide": "nightly-decide"}.get(func, func.removesuffix("_flow"))
            by_pool.setdefault(pool, []).append(f"{flow}/{dep['name']}")
    return [f"{', '.join(names)}: Not Ready in the UI: no worker polls work pool '{pool}'. "
            f"{pool_needs(pool).split('; ', 1)[0].replace('Needs', 'Start')}." for pool, names in by_pool.items()]


def pools_without_workers(doc: dict, log=print) -> None:
    """Say which deployments show Not Ready because no worker polls their pool (read from the server)."""
    from prefect import get_client
    from prefect.client.schemas.objects import WorkerStatus

    online: dict[str, int] = {}
    with get_client(sync_client=True) as client:
        for pool in {(d.get("work_pool") or {}).get("name") for d in doc["deployments"]} - {None}:
            try:
                workers = client.read_workers_for_work_pool(pool)
            except Exception:  # noqa: BLE001 (a pool not made yet: no worker either)
                workers = []
            online[pool] = sum(1 for w in workers if w.status == WorkerStatus.ONLINE)
    for line in unserved_pools(doc, online):
        log(line)


def stage_deployments(parameters: dict) -> list[dict]:
    """One `default` deployment per stage of the table, on the stage's pool."""
    from pipeline_lib.stages import SPECS

    out = []
    for name, spec in SPECS.items():
        pool = {"name": spec.pool}
        if spec.pool in POOL_ENV:
            pool["job_variables"] = {"env": dict(POOL_ENV[spec.pool])}
        out.append({"name": "default", "description": f"The {name} stage (work pool {spec.pool}). {pool_needs(spec.pool)}",
                    "entrypoint": f"flows/stage_flows.py:{name}_flow", "parameters": dict(parameters),
                    "work_pool": pool, "tags": ["llm-pipeline", "stage", *(["training"] if spec.multi_node else [])]})
    return out


def nightly_schedule(config: str, overrides: list[str] | None = None) -> dict:
    """The nightly deployment's schedule from its config (orchestration.nightly_cron / .timezone): the time
    zone is explicit, so the UI and `llm-pipeline deploy` say when "2 am" is."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from pipeline_lib.config import load_config

    path = Path(config) if Path(config).is_absolute() else ROOT / config
    orch = load_config(str(path), overrides or []).orchestration
    try:
        ZoneInfo(orch.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"orchestration.timezone={orch.timezone!r} in {config} is not a time zone. Fix: an IANA "
                         "name such as Asia/Shanghai, Europe/Berlin or UTC") from None
    return {"cron": orch.nightly_cron, "timezone": orch.timezone, "active": True}


def deployed_config(path: str, cwd: str | Path | None = None) -> str:
    """`llm-pipeline deploy --config PATH`: the config file the chain, the nightly and the stage deployments
    run, as their workers read it (they run from the project root, LLM_PIPELINE_HOME): relative to the project
    root when the file is inside it, else absolute (then it must be at that path on every worker). Refused with
    the field, the value and the fix unless it is a pipeline config that loads and validates."""
    from pipeline_lib.config import ConfigError, load_config, validate
    from pipeline_lib.config.errors import ConfigIssue

    given = Path(path).expanduser()
    full = (given if given.is_absolute() else Path(cwd or Path.cwd()) / given).resolve()
    if not full.is_file():
        raise ConfigError([ConfigIssue("--config", path, "no such file" if not full.exists() else "not a file",
                                       "give the pipeline yaml the deployments run, e.g. "
                                       "--config configs/pipelines/tiny-cpu.yaml")])
    try:
        validate(load_config(str(full)))
    except ConfigError as err:
        raise ConfigError([ConfigIssue("--config", path, "is not a valid pipeline config (the issues below)",
                                       "fix them in the file, check with `llm-pipeline validate`"),
                           *err.issues]) from None
    try:
        return str(full.relative_to(ROOT))
    except ValueError:
        return str(full)


def render_prefect_file(config: str | None = None) -> dict:
    """deployments/prefect.yaml plus the stage deployments (same config file as the chain); the chain's
    and the nightly's sections stay empty (their folded run forms: flows/run_form.py, applied after `prefect
    deploy`); the nightly schedule
    comes from the nightly deployment's config. `config` (deployed_config's answer) replaces the file's
    config in every deployment."""
    import yaml

    doc = yaml.safe_load(PREFECT_FILE.read_text())
    if config is not None:
        for dep in doc["deployments"]:
            dep["parameters"] = {**(dep.get("parameters") or {}), "config": config}
    chain = next(d for d in doc["deployments"] if d["entrypoint"].endswith(":llm_pipeline"))
    defaults = {k: v for k, v in chain["parameters"].items() if k == "config"}
    doc["deployments"] += stage_deployments(defaults)
    for dep in doc["deployments"]:
        if dep["entrypoint"].endswith(":nightly"):
            params = dep.get("parameters") or {}
            sched = nightly_schedule(params["config"], params.get("overrides"))
            dep["schedules"] = [sched]
            dep["description"] = (f"{dep.get('description', '').rstrip()} Scheduled `{sched['cron']}` in "
                                  f"{sched['timezone']} (orchestration.nightly_cron, orchestration.timezone).")
            # The UI's schedule card says "At 02:00 AM every day" and shows the zone only in its tooltip; a tag is
            # on the deployment's page and on every run of it.
            dep["tags"] = [*dep.get("tags", []), f"tz:{sched['timezone']}"]
    return doc
