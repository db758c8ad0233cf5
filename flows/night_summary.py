"""The nightly run's own summary artifact (`nightly-summary`): what the night read, what it trained, what was
decided and where the pipeline run is, on the nightly flow run itself (the stages' details stay on the child
`llm-pipeline/nightly-<date>` run and its overview)."""
from __future__ import annotations

from pipeline_lib.markdown import md_code, md_text
from pipeline_lib.nightly.gate import table_lines
from pipeline_lib.stages import key_figures
from pipeline_lib.storage import RunPaths, read_manifest

from flows.run_history import flow_runs_of, ui_link

FILES_SHOWN = 20  # a night of thousands of files lists the first ones and the count


def _md(text) -> str:
    return md_text(text)


def _child_link(run_id: str) -> str:
    """The night's pipeline run (`llm-pipeline/<run_id>`, its last flow run) as a link, its name without a UI."""
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            runs = flow_runs_of(run_id, client)
    except Exception:  # a view only
        runs = []
    if not runs:
        return f"`llm-pipeline/{run_id}`"
    url = ui_link(runs[-1].id)
    return f"[{_md(runs[-1].name)}]({url})" if url else f"`{runs[-1].name}`"


def render(cfg, run_id: str | None, run_date: str, name: str, message: str, data: dict) -> str:
    orch = cfg.orchestration
    lines = [f"# Night {run_date}: {name}", "",
             f"Date in the schedule's zone {orch.timezone} (`{orch.nightly_cron}`, orchestration.timezone).", "",
             _md(message or ""), "", "| | |", "|---|---|"]
    files = data.get("files") or []
    if "new_files" in data or files:
        lines.append(f"| read | {data.get('new_files', len(files))} new file(s) |")
    stages = ((data.get("summary") or {}).get("stages") or {})
    if run_id and stages:
        paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
        for stage, entry in stages.items():
            manifest = read_manifest(paths.stage_uri(stage), paths.endpoint_url)
            figures = key_figures(stage, manifest.metrics if manifest else {})
            lines.append(f"| {stage} | {_md(entry.get('state', ''))}: {_md('; '.join(figures)) or ' '} |")
    if data.get("checkpoint"):
        lines.append(f"| checkpoint | {md_code(data['checkpoint'])} |")
    if data.get("decision"):
        by = data.get("decided_by") or {}
        lines.append(f"| decision | {_md(data['decision'])}" + (f" by {_md(by.get('who'))}: {_md(by.get('reason'))}"
                                                                 if by else " (the gate)") + " |")
    if run_id and (stages or name == "Failed"):  # a night that ran its pipeline (Skipped and Busy ran none)
        lines.append(f"| pipeline run | {_child_link(run_id)} |")
    if (data.get("verdict") or {}).get("rows"):  # every metric the gate read: both values, interval, why
        lines += ["", f"Gate: {_md(data['verdict'].get('outcome', ''))} ({_md(data['verdict'].get('reason', ''))})",
                  "", *table_lines(data["verdict"])]
    if files:
        lines += ["", "Files read:", "", *[f"- {md_code(f)}" for f in files[:FILES_SHOWN]]]
        if len(files) > FILES_SHOWN:
            lines.append(f"- ... and {len(files) - FILES_SHOWN} more")
    return "\n".join(lines) + "\n"


def publish_night_summary(cfg, run_id: str | None, run_date: str, name: str, message: str, data: dict | None) -> None:
    from prefect.artifacts import create_markdown_artifact

    data = data or {}
    try:
        create_markdown_artifact(render(cfg, data.get("run_id") or run_id, run_date, name, message, data),
                                 key="nightly-summary", description=f"Night {run_date}: {name}. {message or ''}"[:500])
    except Exception as err:  # the UI is a view: a night's outcome never depends on its artifact
        from prefect import get_run_logger

        get_run_logger().warning(f"nightly summary artifact not written: {type(err).__name__}: {err}")
