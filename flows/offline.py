"""Nothing the product starts calls out: Prefect's telemetry is off in every process it starts.

`telemetry_off()` sets, unless the environment already says otherwise, the settings that make Prefect send
nothing: the server's analytics heartbeat (to sens-o-matic.prefect.io, every server: the embedded API of a CLI run, a
server started with the README's command), the SDK's usage events (DO_NOT_TRACK, the standard opt-out Prefect
honours), Cloud's orchestration telemetry and resource metrics (exported only when an endpoint is configured).
Children inherit the environment: the embedded API server, stage subprocesses, trainers, Dask workers.
pyproject.toml's [tool.prefect.*] says the same to a Prefect process started from the project root by hand.
"""
from __future__ import annotations

import os

TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "PREFECT_TELEMETRY_ENABLE_RESOURCE_METRICS": "false",
}


def telemetry_off(env=None) -> None:
    env = os.environ if env is None else env
    for name, value in TELEMETRY_OFF.items():
        env.setdefault(name, value)
