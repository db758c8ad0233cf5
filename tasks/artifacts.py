"""What the Prefect UI shows for each stage: progress, tables, the loss curve, links to outputs.

Stages put what they want shown into their manifest's `metrics`:
  metrics["tables"] = {"key": {"description": str, "rows": [dict, ...]}}
  metrics["images"] = {"key": "relative/path.png"}   (files in the stage folder)
  metrics["markdown"] = {"key": "markdown text"}
and a stage's row in the stage table may name tables read from its folder (`StageSpec.tables`), so this
module stays generic and the engine stays free of Prefect.
"""
from __future__ import annotations

import base64
import re
import time

from prefect.artifacts import (create_link_artifact, create_markdown_artifact, create_progress_artifact,
                               create_table_artifact, update_progress_artifact)

from pipeline_lib.markdown import md_code
from pipeline_lib.stages import stage_tables
from pipeline_lib.storage import join

from tasks import terminal


def _key(*parts: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]


class ProgressReporter:
    """progress(step, done, total[, detail]) callback -> one progress artifact, updated at most every 2 s;
    `detail` (e.g. the shards not done yet) follows the count in its description."""

    def __init__(self, stage: str, min_interval: float = 2.0):
        self.stage = stage
        self.min_interval = min_interval
        self.artifact_id = None
        self.last = 0.0
        self.last_pct = 0.0

    def __call__(self, step: str, done: int, total: int, detail: str = "") -> None:
        terminal.progress(self.stage, step, done, total)  # the CLI's progress bar, when it has one
        pct = 100.0 * done / total if total else 0.0
        description = f"{self.stage}: {step} {done}/{total}" + (f"; {detail}" if detail else "")
        now = time.time()
        try:
            if self.artifact_id is None:
                self.artifact_id = create_progress_artifact(
                    progress=pct, key=_key(self.stage, "progress"), description=description)
                self.last = now
            elif now - self.last >= self.min_interval or done >= total:
                update_progress_artifact(self.artifact_id, progress=pct, description=description)
                self.last = now
            self.last_pct = pct
        except Exception:  # the UI is a view; never fail a stage because an artifact could not be written
            pass

    def finish(self) -> None:
        if self.artifact_id is not None and self.last_pct < 100:
            try:
                update_progress_artifact(self.artifact_id, progress=100.0, description=f"{self.stage}: done")
            except Exception:
                pass


def readable_row(row: dict, digits: int = 4) -> dict:
    """Floats to `digits` significant digits for the UI tables (the manifest keeps the exact values)."""
    return {k: float(f"{v:.{digits}g}") if isinstance(v, float) and v == v and abs(v) != float("inf") else v
            for k, v in row.items()}


def _image_markdown(stage_uri: str, rel: str, store) -> str:
    uri = join(stage_uri, rel)
    data = store.get_bytes(uri)
    # Inline the PNG so the image shows without the UI reaching the run store.
    return f"![{rel}](data:image/png;base64,{base64.b64encode(data).decode()})\n\n`{uri}`"


def publish_stage_artifacts(cfg, paths, stage: str, manifest) -> None:
    metrics = dict(manifest.metrics or {})
    stage_uri = paths.stage_uri(stage)
    store = paths.store()
    metrics["tables"] = {**stage_tables(stage, stage_uri, store), **(metrics.get("tables") or {})}
    for name, table in (metrics.get("tables") or {}).items():
        create_table_artifact([readable_row(r) for r in table["rows"]], key=_key(stage, name),
                              description=table.get("description", name))
    for name, rel in (metrics.get("images") or {}).items():
        create_markdown_artifact(_image_markdown(stage_uri, rel, store), key=_key(stage, name),
                                 description=f"{stage}: {name}")
    for name, text in (metrics.get("markdown") or {}).items():
        create_markdown_artifact(text, key=_key(stage, name), description=f"{stage}: {name}")
    lines = ["| output | size |", "|---|---|"]
    lines += [f"| {md_code(o['path'])} | {o['size']:,} |" for o in manifest.outputs[:200]]
    create_markdown_artifact(f"**{stage}** outputs in `{stage_uri}`\n\n" + "\n".join(lines),
                             key=_key(stage, "outputs"), description=f"{stage}: outputs")
    # A link only where a browser can open it (a presigned URL of an S3 store); browsers refuse file://
    # links from a page, so a local folder is the path text in the outputs artifact above.
    url = store.share_url(join(stage_uri, "manifest.json"))
    if url:
        create_link_artifact(url, link_text=f"{stage} manifest ({stage_uri})", key=_key(stage, "folder"))
