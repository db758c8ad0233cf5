"""The end-to-end `llm-pipeline` flow: the stages of the stage table in order (data -> pretrain ->
sft -> evaluate -> export).

Two modes:
- local (default, what `llm-pipeline run` and `make demo` use): each stage runs as a subflow in
  this process (its heavy work still runs in its own subprocess);
- dispatch: each stage is sent to its deployment on its work pool with `run_deployment`; the
  child's final state is checked (run_deployment does not raise), a failed child fails this flow
  with the child's message, and outputs are read back from the stage manifest on the run store.
Rerunning with the same run_id does not redo a stage whose manifest matches: it is Cached (resume).
A resume is a new flow run named `llm-pipeline/<run_id> (resume N)` (flows/run_history.py).
The parent run carries the run overview artifact (tasks/overview.py).
"""
from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.states import Completed

from pipeline_lib.config.schema import (EvaluateConfig, ExportConfig, ModelConfig, NightlyConfig, OrchestrationConfig,
                                        ParallelConfig, RunConfig, SFTConfig, TokenizerConfig, TrainingConfig)
from pipeline_lib.config.form import changed_settings, form_sections
from pipeline_lib.config.secrets import public_config
from pipeline_lib.nightly.night_ids import refuse_redo_in_decided_night
from pipeline_lib.nightly.retention import retention_note
from pipeline_lib.stages import SPECS, UpstreamMissing, parse_stages, stage_done, unmet_upstream
from pipeline_lib.storage import RunPaths, read_manifest

from flows.common import deployment_parameters, resolve_config, untouched_form_sections, with_form_defaults
from flows.dispatch import dispatch_stage
from flows.form_types import DataConfig
from flows.heartbeats import beating
from flows.notify import notify_failure
from flows.same_child import failed_child, rerun_subflow
from flows.run_history import earlier_flow_runs, finished_in, flow_run_name, task_run_link, ui_link
from flows.stage_flows import stage_flow
from tasks.error_log import stage_failure
from tasks.overview import RunOverview, tensorboard_command
from tasks.stage_task import cached_stage
from tasks.terminal import SHOW


class StageFailed(RuntimeError):
    """Names the failed stage first, so the UI, the CLI summary and the webhook can all say which."""

    log_without_traceback = True  # our one-line message: the engine's traceback of this frame says nothing more


# validate_parameters=False: the sections arrive as the form sent them (only the fields given) and are
# checked as one config by resolve_config, whose errors name the field and the fix.
@flow(name="llm-pipeline", flow_run_name=flow_run_name, log_prints=True, persist_result=True,
      validate_parameters=False, on_failure=[notify_failure], on_crashed=[notify_failure])
@beating
def llm_pipeline(config: str | dict, run_id: str, stages: list[str] | None = None,
                 overrides: list[str] | None = None,
                 training: TrainingConfig | None = None, data: DataConfig | None = None,
                 sft: SFTConfig | None = None, evaluate: EvaluateConfig | None = None,
                 run: RunConfig | None = None, model: ModelConfig | None = None,
                 tokenizer: TokenizerConfig | None = None, parallel: ParallelConfig | None = None,
                 export: ExportConfig | None = None, orchestration: OrchestrationConfig | None = None,
                 nightly: NightlyConfig | None = None, dispatch: bool = False,
                 deployment_suffix: str = "default", notify: bool = True) -> dict:
    """Run the requested stages in order; returns per-stage state, seconds and stage folder.

    The sections (training ... nightly) are the run form's typed fields, the ones changed most often first: each one given is applied
    over the config file field by field, then the overrides last (pipeline_lib/config/load.py). The
    deployment's form shows them closed, opening at its config file's values (flows/run_form.py). A
    deployment run whose `config` is not the deployment's skips the sections left at the form's
    defaults (they are the deployment's file).

    Args:
        config: The pipeline config file (relative to the project root on the worker), or a resolved config.
        run_id: The run's folder under run.output_root; the same id resumes (finished stages are Cached).
        stages: Stages to run, in order; empty means all.
        overrides: Dotted `section.field=value` settings, applied last (they win over the sections below).
        training: Pretraining.
        data: Data stage: inputs, cleaning filters, dedup, packing.
        sft: LoRA supervised finetuning.
        evaluate: Prompt sets, decoding and perplexity.
        run: Run settings (output_root as typed: resolved on the worker).
        model: The model's shape and dtypes (empty dtypes follow training.precision).
        tokenizer: The sentencepiece tokenizer the data stage trains (or tokenizer.path).
        parallel: Devices and the parallel layout.
        export: The MindIR export and its logits check.
        orchestration: Retries and notifications (the webhook URL is never pre-filled: an empty one keeps
            the config file's).
        nightly: The nightly's promotion gate (what a night must not make worse to become tomorrow's base).
        dispatch: Send each stage to its own deployment on its work pool.
        deployment_suffix: Name of the stage deployments to dispatch to.
        notify: Send the failure webhook from this flow.
    """
    logger = get_run_logger()
    given = {"run": run, "data": data, "tokenizer": tokenizer, "model": model, "parallel": parallel,
             "training": training, "sft": sft, "evaluate": evaluate, "export": export, "orchestration": orchestration,
             "nightly": nightly}
    sent = any(v is not None for v in given.values())
    deployed = with_form_defaults(deployment_parameters())
    inherited = untouched_form_sections(config, given, deployed) if sent else []
    if inherited:
        logger.info(f"config {config} is not the deployment's: its unchanged form sections {inherited} are not "
                    "applied (they describe the deployment's config file)")
        given.update(dict.fromkeys(inherited))
    wanted = stages or parse_stages(None)
    cfg = resolve_config(config, overrides, given, stages=wanted)
    resolved = public_config(cfg)  # what child flows and dispatched runs get as parameters: no secret
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    summary = {"run_id": run_id, "run_uri": paths.run_uri, "stages": {}}
    # the parent run's artifact, updated as each stage ends; a resume links the run's earlier flow runs
    from prefect.runtime import flow_run

    earlier_runs = earlier_flow_runs(run_id, flow_run.id)
    earlier = [(r.name, r.state_name or "", ui_link(r.id)) for r in earlier_runs]
    overview = RunOverview(paths, list(wanted), earlier=earlier)
    overview.tensorboard = tensorboard_command(cfg, list(wanted))  # the loss curves, linked from the overview
    overview.settings = _changed_from_deployment(resolved, deployed)
    if overview.settings is not None:
        logger.info(overview.settings_line())
    _refuse_bad_sft_inputs(cfg, wanted, run_id, overview)
    unmet = unmet_upstream(paths, list(wanted))
    if unmet:
        raise UpstreamMissing(unmet)
    for stage in wanted:
        entry = summary["stages"].setdefault(stage, {"stage_uri": paths.stage_uri(stage)})
        started = time.time()
        if stage_done(cfg, paths, stage)[0]:
            # Finished in an earlier attempt (a UI Retry, a resume): not redone, and shown so. Not through the stage's
            # subflow: on a Retry Prefect hands back that subflow's old Completed state without running anything, so
            # no task run would say Cached. This task run is the stage's own record of this attempt.
            manifest = read_manifest(paths.stage_uri(stage), paths.endpoint_url)
            where = finished_in(manifest.created_at, flow_run.id, earlier_runs)
            record = cached_stage(stage, run_id, paths.stage_uri(stage), manifest.created_at, where, return_state=True)
            entry.update(state="cached", seconds=0.0, finished_at=manifest.created_at, finished_in=where)
            overview.cached(stage, manifest.__dict__, manifest.created_at, where,
                            link=task_run_link(record.state_details.task_run_id))
            logger.info(f"{stage}: cached (finished {manifest.created_at}{' in ' + where if where else ''}), "
                        f"not redone -> {entry['stage_uri']}")
            continue
        overview.running(stage)
        logger.info(f"{stage}: started", extra=SHOW)
        try:
            refuse_redo_in_decided_night(cfg, run_id, stage)  # latest's files, reference_heldout: never rewritten
            if dispatch:
                result = dispatch_stage(cfg, resolved, run_id, stage, deployment_suffix)
            else:
                # a Retry of this run: the stage's failed flow run of an earlier attempt runs again (same_child.py)
                earlier = failed_child(flow_run.id, stage) if flow_run.run_count > 1 else None
                child = (rerun_subflow(stage_flow(stage), earlier, {"config": resolved, "run_id": run_id}) if earlier
                         else stage_flow(stage)(config=resolved, run_id=run_id, return_state=True))
                overview.link(stage, ui_link(child.state_details.flow_run_id))
                result = child.result()  # raises the stage's own exception when it failed
            if isinstance(result, dict) and result.get("flow_run_id"):
                overview.link(stage, ui_link(result["flow_run_id"]))
            if isinstance(result, dict) and result.get("no_new_documents"):  # a night with nothing to train
                return _nothing_to_train(overview, list(wanted), stage, result.get("message", ""), summary, result)
        except Exception as err:
            message = stage_failure(stage, run_id, err)  # attempts counted, no cgroup paths (tasks/error_log.py)
            overview.failed(stage, round(time.time() - started, 1), message.split(": ", 1)[1])
            raise StageFailed(message) from err
        cached = bool(result.get("skipped")) if isinstance(result, dict) else False
        entry.update(state="cached" if cached else "completed", seconds=round(time.time() - started, 1))
        overview.finished(stage, entry["state"], entry["seconds"], result.get("manifest") if isinstance(result, dict)
                          else None)
        logger.info(f"{stage}: {entry['state']} in {entry['seconds']} s -> {entry['stage_uri']}", extra=SHOW)
    return summary


def _nothing_to_train(overview, wanted: list[str], stage: str, message: str, summary: dict, result: dict):
    """A night's data stage left nothing to train (flows/data_flow.py): this run ends Completed under the night's
    name (NoNewData, NoUsableData), not Failed: the nightly decides the night; the later stages did not run."""
    overview.finished(stage, "completed", 0.0, None)
    for later in wanted[wanted.index(stage) + 1:]:
        overview.not_run(later, f"not run: {message}")
    return Completed(name=result["no_new_documents"], message=message, data=summary)


def _changed_from_deployment(resolved: dict, deployed: dict) -> tuple[str, list] | None:
    """(the deployment's config file, the settings this run changed from what the deployment's form holds), for a
    run of a deployment; None for any other run, or when the deployment's own config does not resolve (a view)."""
    if not deployed.get("config"):
        return None
    try:
        sections = {k: deployed[k] for k in form_sections() if deployed.get(k) is not None}
        base = public_config(resolve_config(deployed["config"], deployed.get("overrides"), sections))
    except Exception:
        return None
    return deployed["config"], changed_settings(resolved, base)


class InputsRefused(RuntimeError):
    """An input the chain checks before its first stage is unusable: nothing ran."""

    log_without_traceback = True


def _refuse_bad_sft_inputs(cfg, wanted: list[str], run_id: str, overview: RunOverview) -> None:
    """The SFT records parsed (read, not tokenized: checks/inputs.py sft_records) before the first stage, also for a
    run started from the UI or a worker that never went through `validate`: a malformed SFT file fails in seconds,
    not after data and pretrain."""
    if "sft" not in wanted:
        return
    from pipeline_lib.checks.inputs import check_inputs

    errors, _ = check_inputs(cfg, ["sft"])
    if not errors:
        return
    text = "\n".join(f"- {issue}" for issue in errors)
    for stage in wanted[:wanted.index("sft")]:
        overview.not_run(stage, "not run: the sft inputs were refused first")
    overview.failed("sft", None, f"refused before any stage ran:\n{text}")
    raise InputsRefused(f"run {run_id}: sft inputs refused before any stage ran:\n{text}")


def stage_states(cfg, run_id: str) -> dict:
    """Per-stage done/not-done from the manifests (used for the summary after a failure)."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    out = {}
    for stage in SPECS:
        done, why = stage_done(cfg, paths, stage)
        removed = None if done else retention_note(cfg, run_id, stage, why)  # finished, thinned by nightly.retention
        out[stage] = {"state": "complete" if done or removed else "not complete", "note": removed or why,
                      "stage_uri": paths.stage_uri(stage)}
    return out
