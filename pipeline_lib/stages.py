"""The stage table (SPECS), each stage's identity, and the registry that runs a stage.

A stage is identified by (1) the hash of exactly the config fields that matter to it and
(2) the fingerprints of the manifests of the stages it reads. A stage whose manifest matches
both is done and is skipped; change a field it depends on (or redo an upstream stage) and it
reruns. That rule is what makes resume, retries and dispatch to another machine safe, and it
lives here so the CLI, the Prefect flows and the nightly job all apply the same one.
"""
from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from typing import Callable, Iterable

from .config.load import config_hash
from .config.identity import stage_hash
from .run_settings import stage_settings
from .config.schema import PipelineConfig
from .runtime.contract import StageOutput, StageRun, TransientError  # noqa: F401  (raised by stages)
from . import killpoints
from .runtime.nodes import clear_node_report, merge_node_outputs, node_rank, wait_node_reports, write_node_report
from .storage import Manifest, RunPaths, invalidate, manifest_matches, read_manifest, store_for, write_manifest
from .storage.disk_space import named_disk_full


class UpstreamMissing(RuntimeError):
    """A stage was asked to run before the upstream stages it reads are complete."""


@dataclass(frozen=True)
class StageSpec:
    """One row of the stage table: every fact that differs per stage. Everything that lists stages (the
    CLI's --stages and its pre-run checks, the Prefect stage flows and their deployments, the pools,
    dispatch, the nightly, the run overview, the UI artifacts, the kill points, the docs) reads SPECS;
    the config fields of a stage's identity are marked on the schema (config/schema.py `identity`).
    Functions are named "module:function" and imported when used, so reading the table stays cheap."""

    name: str
    runner: str  # "module:function" of the stage, run_<name>_stage(run: StageRun) -> StageOutput
    pool: str    # work pool its deployment runs on: cpu or ascend (`llm-pipeline pools` creates each one named)
    upstream: tuple[str, ...] = ()  # must be complete before this stage runs
    optional: tuple[str, ...] = ()  # read when present (e.g. evaluate compares whatever exists)
    multi_node: bool = False  # a training job: spans parallel.num_nodes when dispatched (one child per
                              # node rank) and holds its node's one-training-at-a-time slot
    nightly: bool = False     # part of the nightly continued-pretraining round
    checks: tuple[str, ...] = ()  # input checks run once before any flow: check(c: checks.inputs.InputChecks)
    figures: str | None = None    # the overview's key figures: figures(metrics: dict) -> list[str]
    key_files: tuple[str, ...] = ()  # outputs the overview links to (relative to the stage folder)
    tables: str | None = None     # UI tables read from the stage folder: tables(stage_uri, store) -> dict


SPECS: dict[str, StageSpec] = {}


def register(spec: StageSpec) -> StageSpec:
    """Add a row to the table (after the existing ones: pipeline order is table order) and its
    `<name>.before_manifest` kill point (record_stage reaches it). Its upstream stages must already be in
    the table, so the order is always one the pipeline can run."""
    unknown = [u for u in spec.upstream + spec.optional if u not in SPECS]
    if unknown:
        raise ValueError(f"stage '{spec.name}': upstream {unknown} not in the stage table {list(SPECS)}; "
                         "Fix: register those stages first")
    SPECS[spec.name] = spec
    killpoints.POINTS[f"{spec.name}.before_manifest"] = (f"{spec.name}: every output written, manifest.json "
                                                         "not yet (stages.record_stage)")
    return spec


_INPUTS, _FIGURES = "pipeline_lib.checks.inputs", "pipeline_lib.key_figures"
for _spec in (
    StageSpec("data", "pipeline_lib.data.stage:run_data_stage", "cpu", nightly=True,
              checks=(f"{_INPUTS}:data_inputs", f"{_INPUTS}:tokenizer"), figures=f"{_FIGURES}:data_figures",
              tables="pipeline_lib.data.stats:stats_tables"),
    StageSpec("pretrain", "pipeline_lib.train.stage:run_pretrain_stage", "ascend", ("data",),
              multi_node=True, nightly=True, checks=(f"{_INPUTS}:base_weights",),
              figures=f"{_FIGURES}:training_figures", key_files=("loss_curve.png",)),
    StageSpec("sft", "pipeline_lib.train.sft_stage:run_sft_stage", "ascend", ("data", "pretrain"), multi_node=True,
              checks=(f"{_INPUTS}:sft_inputs", f"{_INPUTS}:tokenizer"), figures=f"{_FIGURES}:training_figures",
              key_files=("loss.png",)),
    StageSpec("evaluate", "pipeline_lib.evaluate.stage:run_evaluate_stage", "ascend", ("data",),
              optional=("pretrain", "sft"), nightly=True,
              checks=(f"{_INPUTS}:prompt_files", f"{_INPUTS}:task_files", f"{_INPUTS}:tokenizer",
                      f"{_INPUTS}:compare_checkpoints", f"{_INPUTS}:reference_coverage"),
              figures=f"{_FIGURES}:evaluate_figures", key_files=("report.html", "report.md")),
    StageSpec("export", "pipeline_lib.export.stage:run_export_stage", "ascend", ("data", "sft"),
              optional=("pretrain",), checks=(f"{_INPUTS}:tokenizer",), figures=f"{_FIGURES}:export_figures",
              key_files=("serving/serving.json",)),
):
    register(_spec)


def pools() -> list[str]:
    """The work pools the stages run on, in table order."""
    return list(dict.fromkeys(spec.pool for spec in SPECS.values()))


def manifest_fingerprint(m: Manifest) -> str:
    blob = json.dumps({"config_hash": m.config_hash, "outputs": m.outputs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stage_inputs(paths: RunPaths, stage: str) -> dict:
    """Fingerprints of the upstream manifests this stage reads (None where a required one is
    missing; optional ones appear only when present)."""
    out = {}
    spec = SPECS[stage]
    for up in spec.upstream + spec.optional:
        m = read_manifest(paths.stage_uri(up), paths.endpoint_url)
        if m is not None or up in spec.upstream:
            out[up] = manifest_fingerprint(m) if m else None
    return out


def stage_done(cfg: PipelineConfig, paths: RunPaths, stage: str) -> tuple[bool, str]:
    return manifest_matches(paths.stage_uri(stage), stage_hash(cfg, stage), stage_inputs(paths, stage),
                            paths.endpoint_url)


def parse_stages(text: str | None) -> list[str]:
    """'data,pretrain' -> ['data', 'pretrain'] in pipeline order; refuses unknown names."""
    if not text:
        return list(SPECS)
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SPECS]
    if unknown:
        raise ValueError(f"--stages: unknown stage(s) {unknown}; choose from {','.join(SPECS)}")
    return [s for s in SPECS if s in wanted]


def nightly_stages() -> list[str]:
    """The stages a night runs (the table's `nightly` column), in pipeline order."""
    return [s for s, spec in SPECS.items() if spec.nightly]


def _function(ref: str) -> Callable:
    """The function a table entry names as "module:function". Raises AttributeError naming the entry when the
    module has no such function (a missing module raises ModuleNotFoundError as an import does)."""
    module, _, func = ref.partition(":")
    fn = getattr(importlib.import_module(module), func, None)
    if fn is None:
        raise AttributeError(f"stage table entry {ref!r}: module {module} has no function {func!r}; "
                             "Fix: name an existing function as 'module:function' in its StageSpec")
    return fn


def runner(stage: str) -> Callable[..., StageOutput]:
    return _function(SPECS[stage].runner)


def stage_checks(stages: Iterable[str] | None = None) -> list[Callable]:
    """The input checks of `stages` (None: every stage), each once, in table order."""
    wanted = SPECS if stages is None else set(stages)
    refs = [ref for name, spec in SPECS.items() if name in wanted for ref in spec.checks]
    return [_function(ref) for ref in dict.fromkeys(refs)]


def key_figures(stage: str, metrics: dict | None) -> list[str]:
    """The few numbers that say how a stage went (its row's `figures`), from its manifest's metrics."""
    spec = SPECS.get(stage)
    return _function(spec.figures)(metrics or {}) if spec and spec.figures else []


def stage_tables(stage: str, stage_uri: str, store) -> dict:
    """The UI tables a stage's row reads from its folder (`tables`), besides its manifest's own."""
    spec = SPECS.get(stage)
    return _function(spec.tables)(stage_uri, store) if spec and spec.tables else {}


def upstream_manifests(paths: RunPaths, stage: str) -> dict[str, Manifest]:
    """The manifests a stage reads: every required upstream, and the optional ones that are done."""
    spec = SPECS[stage]
    found = {up: read_manifest(paths.stage_uri(up), paths.endpoint_url) for up in spec.upstream + spec.optional}
    return {up: m for up, m in found.items() if m is not None}


def unmet_upstream(paths: RunPaths, stages: list[str]) -> str | None:
    """Why `stages`, run in this order on this run, cannot all run: a stage whose required upstream is neither
    earlier in `stages` nor finished in the run (its manifest). None when every stage can run. Checked before
    anything runs, so that `--stages pretrain` on a run without data ends as an error, not as "done"."""
    earlier: list[str] = []
    for stage in stages:
        for up in SPECS[stage].upstream:
            if up in earlier or read_manifest(paths.stage_uri(up), paths.endpoint_url) is not None:
                continue
            return (f"--stages {','.join(stages)}: stage '{stage}' reads the '{up}' stage's output, and run "
                    f"{paths.run_id} has no finished '{up}' stage (no manifest in {paths.stage_uri(up)}). "
                    f"Fix: run it too (--stages {','.join(_with_upstream(stages))}), or give --run-id of a run "
                    f"whose '{up}' stage finished")
        earlier.append(stage)
    return None


def _with_upstream(stages: list[str]) -> list[str]:
    """`stages` and every stage they need, in the table's order."""
    need = set(stages)
    for name in reversed(list(SPECS)):
        if name in need:
            need.update(SPECS[name].upstream)
    return [name for name in SPECS if name in need]


def run_stage(cfg: PipelineConfig, paths: RunPaths, stage: str, *, log=print, progress=None,
              force: bool = False, work: Callable[[StageRun], StageOutput] | None = None,
              **options) -> tuple[Manifest, bool]:
    """Run one stage unless its manifest already matches. Returns (manifest, skipped).
    options go to the stage function as keyword arguments (e.g. data's workers=1); `work` replaces the
    row's runner with another way of doing the same steps (the data flow's shard tasks)."""
    done, why = stage_done(cfg, paths, stage)
    if done and not force:
        log(f"{stage}: cached, manifest complete, not redone ({paths.stage_uri(stage)})")
        return read_manifest(paths.stage_uri(stage), paths.endpoint_url), True
    missing = [u for u, fp in stage_inputs(paths, stage).items() if fp is None]
    if missing:
        raise UpstreamMissing(f"stage '{stage}' needs {missing} first: run with --stages "
                               f"{','.join([*missing, stage])} or the whole pipeline")
    log(f"{stage}: running ({why})")
    fn = work or runner(stage)
    nodes = cfg.parallel.num_nodes if SPECS[stage].multi_node else 1
    rank = node_rank(cfg) if nodes > 1 else 0
    uri = paths.stage_uri(stage)
    invalidate(uri, paths.endpoint_url)  # a stage being redone is never seen as done
    run = StageRun(stage, cfg, paths, upstream_manifests(paths, stage), log=log, progress=progress,
                   identity=config_hash({"stage": stage_hash(cfg, stage), "inputs": stage_inputs(paths, stage)}),
                   node_rank=rank)
    if rank > 0:  # one node of several: its files and a node report; node 0 writes the manifest (runtime/nodes.py)
        clear_node_report(uri, rank, paths.endpoint_url)
        with named_disk_full(written_folders(uri, paths.endpoint_url)):
            output = fn(run, **options)
        report = write_node_report(uri, rank, run.identity, output.outputs, output.metrics, paths.endpoint_url)
        log(f"{stage}: node rank {rank} done, its outputs reported at {report}; node 0 writes the manifest")
        return Manifest(stage=stage, run_id=paths.run_id, config_hash=stage_hash(cfg, stage),
                        inputs=stage_inputs(paths, stage), outputs=output.outputs,
                        metrics={**output.metrics, "node_report": report}), False
    with named_disk_full(written_folders(uri, paths.endpoint_url)):
        output = fn(run, **options)
    if nodes > 1:
        reports = wait_node_reports(uri, list(range(1, nodes)), run.identity, cfg.training.timeout_seconds,
                                    paths.endpoint_url, log=log)
        output = StageOutput(*merge_node_outputs(output.outputs, output.metrics, reports))
    return record_stage(cfg, paths, stage, output), False


def written_folders(stage_uri: str, endpoint_url: str | None = None) -> dict[str, str | None]:
    """Local folders a stage writes, by the setting that places them: where a full disk is looked for
    when the error names no path (storage/disk_space.py)."""
    import os
    import tempfile

    store = store_for(stage_uri, endpoint_url)
    return {"run.output_root": None if store.remote else str(store.local_path(stage_uri)),
            "$LLM_PIPELINE_WORK_DIR": os.environ.get("LLM_PIPELINE_WORK_DIR"),
            "$TMPDIR (the work folder of s3:// runs)": tempfile.gettempdir()}


def record_stage(cfg: PipelineConfig, paths: RunPaths, stage: str, output: StageOutput) -> Manifest:
    """Write a finished stage's manifest: the one writer of manifest.json. The identity (this
    module's hash of the stage's config fields and the upstream fingerprints) is computed here, so
    the skip rule and the stage's record can never disagree."""
    manifest = Manifest(stage=stage, run_id=paths.run_id, config_hash=stage_hash(cfg, stage),
                        inputs=json.loads(json.dumps(stage_inputs(paths, stage), sort_keys=True)),
                        outputs=output.outputs, metrics=output.metrics, settings=stage_settings(cfg, stage))
    killpoints.reached(f"{stage}.before_manifest")
    write_manifest(paths.stage_uri(stage), manifest, paths.endpoint_url)
    return manifest
