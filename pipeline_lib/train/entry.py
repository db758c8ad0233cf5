"""Training entry point that runs inside the trainer process (one per rank under msrun).

What: reads a yaml written by `pipeline_lib.train.mindformers_yaml`, points mindformers' and
MindSpore's logs/dumps into the run's output_dir (before importing them), registers the Python stack dump on
SIGUSR1 (train.heartbeat: the hang watchdog's stacks), imports the CPU wrapper
shim, the pipeline's callbacks (StopAtStep, SaveWeightsAtStep, PipelineMetrics, LossGuard) and LR schedule
(LineageWSDLR), then does what mindformers' run_mindformer.py does:
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

The collector is off while mindformers imports and everything is frozen before the exit (runtime.lean_process:
~1.2 s less per trainer launch on CPU).
Prints `PIPELINE_TIMING {json}` lines to stdout: import_s/setup_s before training, train_s after.
Exit code 0 on success; any exception propagates (non-zero exit) with mindformers' message.
Raises ValueError for `run_mode: finetune` without `load_checkpoint`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

import yaml

from pipeline_lib.runtime import deferred_imports, lean_process


def _prepare_env(output_dir: str) -> None:
    """Logs and compile dumps go under output_dir unless the caller chose otherwise."""
    os.environ.setdefault("LOG_MF_PATH", os.path.join(output_dir, "log"))
    os.environ.setdefault("MS_OM_PATH", os.path.join(output_dir, "om"))
    os.environ.setdefault("GLOG_v", "3")


# mindformers imports every model it ships when it is imported; the PyNative trainers of DeepseekV3 and Qwen3
# (models/deepseek3/modeling_deepseek_v3.py, models/qwen3/modeling_qwen3.py) need the `hyper_parallel` package,
# which this stack does not install and the Llama we train does not use: each import warns, in every trainer.
UNUSED_MODEL_IMPORT = re.compile(r"^Import PyNative\w+ForCausalLM failed: No module named 'hyper_parallel'")


class _UnusedModelImports(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not UNUSED_MODEL_IMPORT.match(str(record.msg))


def quiet_unused_model_imports() -> None:
    """Drop those two warnings at their source: mindformers' logger is `logging.getLogger("mindformers" +
    LOG_MF_PATH)` (tools/logger.py get_logger, the path as tools/utils.py get_log_path expands it), so the logger
    made here first, with the filter, is the one mindformers then configures and logs to. Every other warning of
    mindformers stays. Call it after LOG_MF_PATH is set and before mindformers is imported."""
    name = "mindformers" + os.path.expanduser(os.environ["LOG_MF_PATH"])
    logger = logging.getLogger(name)
    if not any(isinstance(f, _UnusedModelImports) for f in logger.filters):
        logger.addFilter(_UnusedModelImports())


def run(yaml_path: str) -> None:
    """Train with the run config at `yaml_path` (see the module docstring)."""
    t0 = time.time()
    lean_process.importing()
    raw = yaml.safe_load(Path(yaml_path).read_text(encoding="utf-8"))
    _prepare_env(raw.get("output_dir") or "./output")
    quiet_unused_model_imports()
    from pipeline_lib.train.heartbeat import register_stack_dump

    register_stack_dump(raw.get("output_dir") or "./output")
    deferred_imports.import_mindformers()
    from mindformers import MindFormerConfig, Trainer, build_context  # noqa: E402 (env must be set first)

    import pipeline_lib.train.callbacks  # noqa: F401  (registers PipelineMetrics and LossGuard)
    import pipeline_lib.train.cpu_wrappers  # noqa: F401  (registers CPUTrainOneStepCell)
    import pipeline_lib.train.mf_callbacks  # noqa: F401  (registers StopAtStep, SaveWeightsAtStep)
    import pipeline_lib.train.mf_lr  # noqa: F401  (registers LineageWSDLR)
    from pipeline_lib.killpoints import arm_checkpoint_writes

    arm_checkpoint_writes()  # the reliability suite's checkpoint.mid_write point; a no-op otherwise

    lean_process.imports_done()
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
    lean_process.exiting()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--yaml", required=True, help="mindformers run yaml written by mindformers_yaml")
    args = parser.parse_args(argv)
    run(args.yaml)
    return 0


if __name__ == "__main__":
    sys.exit(main())
