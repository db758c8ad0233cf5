"""The run overview: one markdown artifact on the parent flow run (`llm-pipeline/<run_id>`).

Every requested stage with its state, duration, key figures (its stage table row's `figures`: tokens,
final loss, perplexity per checkpoint ...) and where its outputs are (links to its row's `key_files`);
rewritten in place as each stage ends, and on failure with the failed stage and its error. The words for states are the ones the CLI summary and the task
state names use: Completed, Cached (finished earlier, not redone), Failed, Not run, Running, Pending.

Links must open from a browser: for S3 run stores they are presigned HTTPS URLs (Store.share_url);
a local store has none, so its paths are shown as text to copy (never file:// links).
"""
from __future__ import annotations

import re
import time

from pipeline_lib.key_figures import fmt
from pipeline_lib.markdown import md_code, md_text
from pipeline_lib.nightly.night_ids import resume_hint
from pipeline_lib.stages import SPECS, key_figures

STATE_WORDS = {"completed": "Completed", "cached": "Cached", "failed": "Failed", "missing": "Not run",
               "running": "Running", "pending": "Pending"}
ERROR_CHARS = 2000


def _md(text: str) -> str:
    return md_text(text)


def _quote(line: str) -> str:
    """A line of an error as markdown text shown as written (no emphasis, no links, no HTML)."""
    text = re.sub(r"([\\`*_\[\]<|~])", r"\\\1", line.strip())
    return "\\" + text if text.startswith(("#", ">", "-", "+")) else text


def _code(text: str) -> str:
    return md_code(text)


class RunOverview:
    """Collects what happened to each stage and publishes it as one artifact, updated in place."""

    def __init__(self, paths, stages: list[str], publish=None, earlier: list[tuple] | None = None):
        self.paths = paths
        self.earlier = earlier or []  # (flow run name, state name, UI URL or None) of earlier attempts
        self.rows = {s: {"state": "pending"} for s in stages}
        self.failure: tuple[str, str] | None = None
        self.started = time.time()
        self.settings: tuple[str, list] | None = None  # (deployment's config, [(key, value, default)]) of a deployment run
        self.artifact_id = None
        self.tensorboard: str | None = None  # the command that shows this run's loss curves (tensorboard_command)
        self._publish = publish or _publish_artifact
        _OPEN[paths.run_id] = self  # the stage's live card refreshes the Running row (live_progress)

    # -- what happened -------------------------------------------------------------------------
    def running(self, stage: str) -> None:
        self.rows[stage] = {"state": "running", "since": time.time()}
        self.publish()

    def live(self, stage: str, line: str, link: str | None) -> None:
        """The running stage's progress (step, loss, tokens seen, time left) and its live card, as the card updates."""
        row = self.rows.get(stage)
        if row is None or row["state"] != "running":
            return
        row.update(live=line, live_link=link)
        self.publish()

    def finished(self, stage: str, state: str, seconds: float | None, manifest: dict | None) -> None:
        self.rows[stage] = {"state": state, "seconds": seconds, "metrics": (manifest or {}).get("metrics") or {},
                            "link": self.rows[stage].get("link"),
                            "outputs": [o.get("path") for o in (manifest or {}).get("outputs") or []]}
        self.publish()

    def cached(self, stage: str, manifest: dict, finished_at: str, finished_in: str, link: str | None = None) -> None:
        """A stage finished in an earlier attempt, not redone: "Cached (finished <time> in attempt N)"."""
        self.rows[stage] = {"state": "cached", "metrics": manifest.get("metrics") or {}, "link": link,
                            "outputs": [o.get("path") for o in manifest.get("outputs") or []],
                            "finished": _when(finished_at) + (f" in {finished_in}" if finished_in else "")}
        self.publish()

    def link(self, stage: str, url: str | None) -> None:
        """The UI page of the stage's own run (its flow run, or the Cached task run): the row's name links it."""
        if url:
            self.rows[stage]["link"] = url
            self.publish()

    def not_run(self, stage: str, note: str) -> None:
        self.rows[stage] = {"state": "missing", "note": note}
        self.publish()

    def failed(self, stage: str, seconds: float | None, error: str) -> None:
        self.rows[stage] = {"state": "failed", "seconds": seconds, "link": self.rows[stage].get("link")}
        self.failure = (stage, error)
        for later, row in self.rows.items():
            if row["state"] == "pending":
                row.update(state="missing", note=f"after the failure of {stage}")
        self.publish()

    # -- what it looks like --------------------------------------------------------------------
    def _where(self, stage: str, row: dict) -> str:
        from pipeline_lib.storage import join

        uri = self.paths.stage_uri(stage)
        parts = [_code(uri)]
        if row["state"] not in ("completed", "cached"):
            return parts[0]
        store = self.paths.store()
        links = []
        for rel in ("manifest.json", *(SPECS[stage].key_files if stage in SPECS else ())):
            if rel != "manifest.json" and rel not in row.get("outputs", []):
                continue
            try:
                url = store.share_url(join(uri, rel))
            except Exception:  # a view: never fail the run over a link
                url = None
            if url:
                links.append(f"[{rel}]({url})")
        return " ".join(parts + links)

    def render(self) -> str:
        done = sum(r["state"] in ("completed", "cached") for r in self.rows.values())
        going = any(r["state"] in ("pending", "running") for r in self.rows.values())
        took = fmt(round(time.time() - self.started, 1))
        # while running, a duration "so far" goes stale between updates: the times it is counted from say more
        when = (f"started {_clock(self.started)}, updated {_clock(time.time())}" if going
                else f"{took} s in this attempt")
        head = (f"# Run {_code(self.paths.run_id)}\n\n"
                f"{done} of {len(self.rows)} stages done, {when}. "
                f"Run folder: {_code(self.paths.run_uri)}\n")
        if any(r["state"] == "cached" for r in self.rows.values()):
            head += ("\nCached: finished in an earlier attempt of this run with the same config and inputs, "
                     "not redone.\n")
        # the folders are listed under the table, not in a column: long paths made the table wider
        # than the artifact page (its last column cut off at a 1,600 px window)
        lines = ["| stage | state | time | key figures |", "|---|---|---|---|"]
        for stage, row in self.rows.items():
            secs = f"{fmt(row['seconds'], 3)} s" if row.get("seconds") is not None else ""
            figures = "<br>".join(_md(f) for f in key_figures(stage, row.get("metrics"))) or _md(row.get("note", ""))
            if row["state"] == "running":
                secs = f"since {_clock(row['since'])}" if row.get("since") else ""
                figures = _running_figures(stage, row)
            # a link's text plain: the UI's markdown shows the asterisks of **bold** inside a link as written
            name = f"[{stage}]({row['link']})" if row.get("link") else f"**{stage}**"
            word = STATE_WORDS.get(row["state"], row["state"])
            if row.get("finished"):
                word += f" (finished {_md(row['finished'])})"
            lines.append(f"| {name} | {word} | {secs} | {figures or ' '} |")
        where = "\n".join(f"- **{stage}**: {self._where(stage, row)}" for stage, row in self.rows.items())
        parts = [head, "\n".join(lines), "Outputs:\n\n" + where]
        if self.tensorboard:
            parts.append(f"Loss curves of this run and the earlier runs of its lineage: {_code(self.tensorboard)}")
        if self.settings is not None:
            parts.append(self._settings_table())
        if self.earlier:
            runs = [f"[{_md(name)}]({url})" if url else _code(name) for name, _, url in self.earlier]
            parts.append("Earlier flow runs of this run (this one resumes them): " + ", ".join(
                f"{r} ({STATE_WORDS.get(state.lower(), state) or '?'})" for r, (_, state, _) in zip(runs, self.earlier)))
        if self.failure:
            stage, error = self.failure
            text = error if len(error) <= ERROR_CHARS else error[:ERROR_CHARS] + " ..."
            # quoted text, not a code block: the UI does not wrap a code block, so its "Fix:" ran off-screen
            quoted = "\n>\n".join(f"> {_quote(line)}" for line in text.splitlines() if line.strip())
            parts.append(f"## Failed: {stage}\n\n{quoted}\n\n"
                         f"Resume: {resume_hint(self.paths.run_id)}; or Retry this flow run.")
        return "\n\n".join(parts) + "\n"

    def settings_line(self) -> str:
        """One log line (the run's description, first on its page): what this run changed from its deployment."""
        config, changed = self.settings
        if not changed:
            return f"settings: the deployment's defaults ({config}), unchanged"
        shown = "; ".join(f"{k}={_value(v)} (default {_value(d)})" for k, v, d in changed[:SETTINGS_SHOWN])
        more = f"; and {len(changed) - SETTINGS_SHOWN} more (run overview)" if len(changed) > SETTINGS_SHOWN else ""
        return f"settings changed from the deployment's defaults ({config}): {shown}{more}"

    def _settings_table(self) -> str:
        config, changed = self.settings
        if not changed:
            return f"Settings: the deployment's defaults ({_code(config)}), none changed."
        rows = [f"| {_code(k)} | {_md(_value(v))} | {_md(_value(d))} |" for k, v, d in changed[:SETTINGS_SHOWN]]
        more = [f"\n... and {len(changed) - SETTINGS_SHOWN} more"] if len(changed) > SETTINGS_SHOWN else []
        return "\n".join([f"Settings that differ from the deployment's defaults ({_code(config)}):", "",
                          "| setting | this run | default |", "|---|---|---|", *rows, *more])

    def publish(self) -> None:
        try:
            self.artifact_id = self._publish(self.artifact_id, self.render(), self.paths.run_id)
        except Exception:  # the UI is a view; never fail the run because an artifact could not be written
            pass


SETTINGS_SHOWN = 20
# The overviews of the runs this process is running, by run id: a stage's live card (tasks/live_training.py) in the
# same process refreshes the parent's Running row through live_progress; for a stage dispatched to a worker
# (dispatch=true) the parent reads the child's card while it waits and calls live_progress (flows/dispatch.py).
_OPEN: dict = {}


def live_progress(run_id: str, stage: str, line: str, link: str | None) -> None:
    overview = _OPEN.get(run_id)
    if overview is not None:
        overview.live(stage, line, link)


def _running_figures(stage: str, row: dict) -> str:
    card = f"{stage}-live"
    link = f"[live curve: {card}]({row['live_link']})" if row.get("live_link") else (
        f"live curve: artifact {_code(card)}" if row.get("live") else "")
    return "<br>".join(x for x in (_md(row.get("live", "")), link) if x)


def _clock(epoch: float) -> str:
    """A wall-clock time a person compares with their own: HH:MM:SS UTC."""
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%H:%M:%S UTC")
VALUE_CHARS = 60  # a long list (the filters) is cut: the table stays inside a 1,600 px window


def _value(value) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS] + " ..."


def _when(iso: str) -> str:
    """A manifest's created_at (ISO, UTC) as `YYYY-MM-DD HH:MM:SS UTC`; as written when it is not ISO."""
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(iso).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError):
        return str(iso)


def tensorboard_command(cfg, stages: list[str]) -> str | None:
    """`tensorboard --logdir <output_root>/_tensorboard/<run.name>` when a training stage of this run writes there (a
    local run store: mindformers writes its events locally only), else None."""
    from pipeline_lib.train.session import tensorboard_dir

    training = [s for s in stages if s in SPECS and SPECS[s].multi_node]
    folder = tensorboard_dir(cfg, "-", training[0]) if training else None
    return f"tensorboard --logdir {folder.parent.parent}" if folder else None


def overview_key(run_id: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"run-overview-{run_id}".lower()).strip("-")[:100]


def _publish_artifact(artifact_id, markdown: str, run_id: str):
    """Create the artifact once per flow run, then update its content in place. A Retry of the flow run (attempt
    2 of the same run) finds the one its first attempt made and updates that: one overview card per run. On
    creation the run's log gets the artifact's UI link (the Logs tab opens first on a run's page: one click)."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactUpdate

    if artifact_id is None:
        artifact_id = _existing_artifact(overview_key(run_id))
        if artifact_id is None:
            artifact_id = create_markdown_artifact(markdown, key=overview_key(run_id),
                                                   description="Run overview: stages, states, key figures, outputs")
            _log_link(artifact_id)
            return artifact_id
    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id, ArtifactUpdate(data=markdown))
    return artifact_id


def _existing_artifact(key: str):
    """The artifact `key` of the current flow run (made by an earlier attempt of it), or None."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return None
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
    return found[0].id if found else None


def artifact_link(artifact_id) -> str | None:
    """The UI page of an artifact, or None without a UI URL (the embedded server)."""
    from prefect.settings import get_current_settings

    ui = get_current_settings().ui_url
    return f"{str(ui).rstrip('/')}/artifacts/artifact/{artifact_id}" if ui else None


def _log_link(artifact_id) -> None:
    from prefect import get_run_logger

    if url := artifact_link(artifact_id):
        get_run_logger().info(f"Run overview (stages, states, key figures, outputs): {url}")
