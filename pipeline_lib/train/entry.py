"""Training entry point that runs inside the trainer process (one per rank under msrun).

What: reads a yaml written by `pipeline_lib.train.mindformers_yaml`, points mindformers' and
MindSpore's logs/dumps into the run's output_dir (before importing them), registers the Python stack dump on
SIGUSR1 (train.heartbeat: the hang watchdog's stacks), imports the CPU wrapper
shim and the pipeline's callbacks (StopAtStep, PipelineMetrics, LossGuard), then does what mindformers' run_mindformer.py does:
`MindFormerConfig(yaml)` -> `build_context(cfg)` -> `Trainer(cfg).train()`.
The LoRA finetune also goes through `train()`: the yaml carries `run_mode: finetune` and
`load_checkpoint: <base.ckpt>`, which `train()` loads (`finetune()` without an explicit checkpoint
would silently start from random weights).

Commands:
    python -m pipeline_lib.train.entry --yaml RUN/pretrain.yaml
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=RUN/msrun \
        --join=True python -m pipeline_lib.train.entry --yaml RUN/pretrain.yaml
msrun starts each worker as the literal `python` found on PATH (anything else is taken for a script
name and run as `python <it>`), so the venv's bin folder must come first on PATH.
Run it from a scratch working directory: under msrun an empty ./output/strategy still appears there.

Prints `PIPELINE_TIMING {json}` lines to stdout: import_s/setup_s before training, train_s after.
Exit code 0 on success; any exception propagates (non-zero exit) with mindformers' message.
Raises ValueError for `run_mode: finetune` without `load_checkpoint`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml


def _prepare_env(output_dir: str) -> None:
    """Logs and compile dumps go under output_dir unless the caller chose otherwise."""
    os.environ.setdefault("LOG_MF_PATH", os.path.join(output_dir, "log"))
    os.environ.setdefault("MS_OM_PATH", os.path.join(output_dir, "om"))
    os.environ.setdefault("GLOG_v", "3")


def run(yaml_path: str) -> None:
    """Train with the run config at `yaml_path` (see the module docstring)."""
    t0 = time.time()
    raw = yaml.safe_load(Path(yaml_path).read_text(encoding="utf-8"))
    _prepare_env(raw.get("output_dir") or "./output")
    from pipeline_lib.train.heartbeat import register_stack_dump

    register_stack_dump(raw.get("output_dir") or "./output")
    from mindformers import MindFormerConfig, Trainer, build_context  # noqa: E402 (env must be set first)

    import pipeline_lib.train.callbacks  # noqa: F401  (registers PipelineMetrics and LossGuard)
    import pipeline_lib.train.cpu_wrappers  # noqa: F401  (registers CPUTrainOneStepCell)
    import pipeline_lib.train.mf_callbacks  # noqa: F401  (registers StopAtStep)
    from pipeline_lib.killpoints import arm_checkpoint_writes

    arm_checkpoint_writes()  # the reliability suite's checkpoint.mid_write point; a no-op otherwise

    t_import = time.time()
    cfg = MindFormerConfig(os.path.realpath(yaml_path))
    if cfg.run_mode == "finetune" and not cfg.load_checkpoint:
        raise ValueError(f"{yaml_path}: run_mode finetune without load_checkpoint would finetune a randomly "
                         "initialised model; set load_checkpoint to the base checkpoint")
    build_context(cfg)
    trainer = Trainer(cfg)
    t_setup = time.time()
    print("PIPELINE_TIMING " + json.dumps({"import_s": round(t_import - t0, 2),
                                           "setup_s": round(t_setup - t_import, 2)}), flush=True)
    trainer.train()
    print("PIPELINE_TIMING " + json.dumps({"train_s": round(time.time() - t_setup, 2)}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--yaml", required=True, help="mindformers run yaml written by mindformers_yaml")
    args = parser.parse_args(argv)
    run(args.yaml)
    return 0


if __name__ == "__main__":
    sys.exit(main())
