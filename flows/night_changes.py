"""The `nightly-changes` artifact: what changed tonight against the promoted run (pipeline_lib/run_diff.py).

`publish_night_changes(cfg, promoted_run_id, run_id)` renders the diff of the run promoted before tonight (A) and
tonight's run (B), writes it beside the night's stages as `<run>/changes.md` (the store's atomic write) and as a
markdown artifact of the night's flow run. A first night (nothing promoted) says so. Never raises: the night has
been decided and committed when it runs, so a diff that cannot be made is a warning in the log, not a failed night.
"""
from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from pipeline_lib.run_diff import diff_runs
from pipeline_lib.storage import RunPaths, store_for

KEY = "nightly-changes"


def publish_night_changes(cfg, promoted_run_id: str | None, run_id: str, verdict: dict | None = None) -> str | None:
    """The markdown published (None when it could not be made); `verdict`: the gate's (Verdict.to_json), shown
    first, as the night is published before the state records it."""
    log = get_run_logger()
    try:
        if not promoted_run_id or promoted_run_id == run_id:
            text = f"# What changed tonight: {run_id}\n\nNothing promoted before this night: no run to compare with.\n"
        else:
            text = diff_runs(cfg, promoted_run_id, run_id, verdict).markdown(
                f"What changed tonight: {run_id} against the promoted {promoted_run_id}")
        paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
        uri = f"{paths.run_uri}/changes.md"
        store_for(uri, cfg.run.s3_endpoint_url).put_bytes(uri, text.encode("utf-8"))
        create_markdown_artifact(key=KEY, markdown=text, description=f"{run_id} against {promoted_run_id or 'nothing'}")
        return text
    except Exception as err:  # the night is already decided: report, do not fail it
        log.warning(f"{run_id}: the what-changed artifact could not be made ({type(err).__name__}: {err})")
        return None
