"""The stage graph and each stage's identity.

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
from typing import Callable

from .config.load import config_hash
from .config.platform import device_target
from .config.schema import STAGES, PipelineConfig
from .runtime.contract import StageOutput, StageRun
from .storage import Manifest, RunPaths, invalidate, manifest_matches, read_manifest, write_manifest


class StageUnavailable(RuntimeError):
    """The stage's engine is not part of this build (yet)."""


class TransientError(RuntimeError):
    """A failure worth retrying: storage/network hiccup, a lost worker. Config/data errors are not."""


@dataclass(frozen=True)
class StageSpec:
    name: str
    upstream: tuple[str, ...]   # must be complete before this stage runs
    fields: Callable[[PipelineConfig], dict]
    runner: str  # "module:function" taking (cfg, paths, log=..., progress=...) -> Manifest
    pool: str    # work pool it is dispatched to: cpu or ascend
    optional: tuple[str, ...] = ()  # read when present (e.g. evaluate compares whatever exists)


def _data_fields(c: PipelineConfig) -> dict:
    # How the work is spread (workers, executor) does not change the output.
    return {"data": c.data.model_dump(mode="json", exclude={"num_workers", "executor", "read_batch_size"}),
            "tokenizer": c.tokenizer.model_dump(mode="json", exclude={"encode_threads"}),
            "seq_length": c.model.seq_length, "vocab_size": c.model.vocab_size}


def _pretrain_fields(c: PipelineConfig) -> dict:
    training = c.training.model_dump(mode="json")
    for knob in ("timeout_seconds", "upload_checkpoints", "preflight_steps",  # do not change the weights
                 "dataset_workers", "prefetch_size", "profile"):
        training.pop(knob)
    return {"model": c.model.model_dump(mode="json"), "parallel": c.parallel.model_dump(mode="json"),
            "training": training, "seed": c.run.seed, "device": device_target(c)}


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        return None


def _contents(paths: list[str]) -> list[list]:
    """[name, digest] of each file, so the same files reached from another folder or clone keep the
    identity (config paths are absolute); [path, None] for what is not a local file (s3, a glob)."""
    out = []
    for p in paths:
        digest = _file_digest(p)
        out.append([p.rsplit("/", 1)[-1], digest] if digest else [p, None])
    return out


def _sft_fields(c: PipelineConfig) -> dict:
    # SFT has its own schedule, batch and guard (sft.*); it shares these `training` knobs, and its data
    # files' contents matter.
    reused = c.training.model_dump(mode="json", include={"optimizer", "precision", "loss_scale", "grad_clip",
                                                         "save_steps", "keep_checkpoint_max", "shuffle"})
    return {"sft": c.sft.model_dump(mode="json", exclude={"inputs", "allow_demo_data"}),
            "model": c.model.model_dump(mode="json"), "training": reused,
            "special_tokens": c.tokenizer.special_tokens, "seed": c.run.seed, "device": device_target(c),
            "inputs": _contents(c.sft.inputs)}


def _evaluate_fields(c: PipelineConfig) -> dict:
    # The prompt files' contents are part of the identity: editing a prompt set re-runs evaluation.
    return {"evaluate": c.evaluate.model_dump(mode="json", exclude={"prompt_files"}),
            "seq_length": c.model.seq_length, "prompts": _contents(c.evaluate.prompt_files),
            "base": c.model.base_checkpoint}


def _export_fields(c: PipelineConfig) -> dict:
    return {"export": c.export.model_dump(mode="json"),
            "lora": {k: getattr(c.sft, k) for k in ("lora_rank", "lora_alpha", "target_modules")}}


SPECS: dict[str, StageSpec] = {
    "data": StageSpec("data", (), _data_fields, "pipeline_lib.data.stage:run_data_stage", "cpu"),
    "pretrain": StageSpec("pretrain", ("data",), _pretrain_fields,
                          "pipeline_lib.train.stage:run_pretrain_stage", "ascend"),
    "sft": StageSpec("sft", ("data", "pretrain"), _sft_fields, "pipeline_lib.train.sft_stage:run_sft_stage", "ascend"),
    "evaluate": StageSpec("evaluate", ("data",), _evaluate_fields,
                          "pipeline_lib.evaluate.stage:run_evaluate_stage", "ascend", optional=("pretrain", "sft")),
    "export": StageSpec("export", ("data", "sft"), _export_fields, "pipeline_lib.export.stage:run_export_stage",
                        "ascend", optional=("pretrain",)),
}
assert tuple(SPECS) == STAGES


def stage_hash(cfg: PipelineConfig, stage: str) -> str:
    return config_hash(SPECS[stage].fields(cfg))


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
        return list(STAGES)
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SPECS]
    if unknown:
        raise ValueError(f"--stages: unknown stage(s) {unknown}; choose from {','.join(STAGES)}")
    return [s for s in STAGES if s in wanted]


def runner(stage: str) -> Callable[..., Manifest]:
    module, _, func = SPECS[stage].runner.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and (err.name == module or module.startswith(err.name + ".")):
            raise StageUnavailable(f"stage '{stage}' is not implemented in this build ({module} missing)") from None
        raise
    fn = getattr(mod, func, None)
    if fn is None:
        raise StageUnavailable(f"stage '{stage}' is not implemented in this build ({SPECS[stage].runner} missing)")
    return fn


def available(stage: str) -> bool:
    try:
        runner(stage)
        return True
    except StageUnavailable:
        return False


def upstream_manifests(paths: RunPaths, stage: str) -> dict[str, Manifest]:
    """The manifests a stage reads: every required upstream, and the optional ones that are done."""
    spec = SPECS[stage]
    found = {up: read_manifest(paths.stage_uri(up), paths.endpoint_url) for up in spec.upstream + spec.optional}
    return {up: m for up, m in found.items() if m is not None}


def run_stage(cfg: PipelineConfig, paths: RunPaths, stage: str, *, log=print, progress=None,
              force: bool = False, **options) -> tuple[Manifest, bool]:
    """Run one stage unless its manifest already matches. Returns (manifest, skipped).
    options go to the stage function as keyword arguments (e.g. data's workers=1)."""
    done, why = stage_done(cfg, paths, stage)
    if done and not force:
        log(f"{stage}: cached, manifest complete, not redone ({paths.stage_uri(stage)})")
        return read_manifest(paths.stage_uri(stage), paths.endpoint_url), True
    missing = [u for u, fp in stage_inputs(paths, stage).items() if fp is None]
    if missing:
        raise StageUnavailable(f"stage '{stage}' needs {missing} first: run with --stages "
                               f"{','.join([*missing, stage])} or the whole pipeline")
    log(f"{stage}: running ({why})")
    fn = runner(stage)
    invalidate(paths.stage_uri(stage), paths.endpoint_url)  # a stage being redone is never seen as done
    if _takes_stage_run(fn):
        run = StageRun(stage, cfg, paths, upstream_manifests(paths, stage), log=log, progress=progress,
                       identity=config_hash({"stage": stage_hash(cfg, stage), "inputs": stage_inputs(paths, stage)}))
        return record_stage(cfg, paths, stage, fn(run, **options)), False
    manifest = fn(cfg, paths, log=log, progress=progress)
    return record_stage(cfg, paths, stage, StageOutput(manifest.outputs, manifest.metrics)), False


def _takes_stage_run(fn) -> bool:
    # transition: stages move one by one from (cfg, paths, log=, progress=) -> Manifest to the contract
    import inspect

    return next(iter(inspect.signature(fn).parameters)) == "run"


def record_stage(cfg: PipelineConfig, paths: RunPaths, stage: str, output: StageOutput) -> Manifest:
    """Write a finished stage's manifest: the one writer of manifest.json. The identity (this
    module's hash of the stage's config fields and the upstream fingerprints) is computed here, so
    the skip rule and the stage's record can never disagree."""
    manifest = Manifest(stage=stage, run_id=paths.run_id, config_hash=stage_hash(cfg, stage),
                        inputs=json.loads(json.dumps(stage_inputs(paths, stage), sort_keys=True)),
                        outputs=output.outputs, metrics=output.metrics)
    write_manifest(paths.stage_uri(stage), manifest, paths.endpoint_url)
    return manifest
