"""What to change for each failure category, with numbers from our planner and the run's config when we have it.

`remedies_for(diagnosis, cfg)` -> [{"why": str, "overrides": ["section.key=value", ...]}], best first. Overrides are
the dotted keys of our pipeline config (the ones `llm-pipeline run CONFIG key=value` takes), never mindformers yaml
keys. Without a config the remedies name the knobs but give no numbers (pass the config for those).
Device OOM: the planner's predicted peak of the config's layout against the usable memory (card minus headroom),
then the best layouts that need less (planner.advisor.plan, ranked as `llm-pipeline plan` ranks them).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from .patterns import BARE_KILLED

_SHAPE = re.compile(r"For 'load_param_into_net', (\S+) in the argument 'net' should have the same shape as .*?"
                    r"its shape \(([^)]*)\) in the argument 'net' and shape \(([^)]*)\) in the argument "
                    r"'parameter_dict'")
_CLASH = re.compile(r"'([^']+)' is already used by a (\w+) (config|model)")
_KERNEL = re.compile(r"The kernel (\w+) unregistered|Unsupported op \[(\w+)\]|Not registered \w+ kernel: op\[(\w+)\]"
                     r"|Operator\[(\w+)\]|Op (\w+) does not has any binary|Operator \((\w+)\) does not have kernel"
                     r"|No registered '(\w+)' OpKernel|Could not run '([^']+)'|\"(\w+)\" not implemented for")
MODEL_DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "kv_heads", "seq_length")


def _r(why: str, overrides: list[str] | None = None) -> dict:
    return {"why": why, "overrides": overrides or []}


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _patch_overrides(patch: dict, cfg) -> list[str]:
    """config_patch (planner.report) entries that differ from the config, as key=value overrides."""
    out = []
    for section, fields in patch.items():
        current = getattr(cfg, section)
        for key, value in fields.items():
            if getattr(current, key) != value:
                out.append(f"{section}.{key}={_fmt(value)}")
    return out


def _plan(cfg):
    from ..planner.advisor import PlanRequest, plan

    p = cfg.parallel
    req = PlanRequest(devices=p.devices, devices_per_node=p.devices_per_node, device_memory_gb=p.device_memory_gb,
                      headroom_gb=p.device_memory_headroom_gb)
    return plan(cfg, req)


def layout_remedies(cfg, *, limit: int = 3, what: str = "device memory") -> list[dict]:
    """The config's predicted peak vs usable memory, then up to `limit` layouts that need less and fit."""
    from dataclasses import replace

    from ..planner.advisor import evaluate
    from ..planner.memory import GB
    from ..planner.report import best_per_family, config_patch, layout_text

    result = _plan(cfg)
    cur, usable = result.current, result.request.usable_gb
    peak = cur.memory.total / GB
    top = sorted(((k, v) for k, v in cur.memory.gb().items() if k != "total"), key=lambda kv: -kv[1])[:3]
    terms = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in top)
    verdict = ("more than" if peak > usable else
               "within (the estimate leaves out fragmentation and some framework buffers; leave more headroom)")
    out = [_r(f"predicted peak {peak:.1f} GB per device, {verdict} the {usable:g} GB usable of {what} "
              f"(parallel.device_memory_gb={cfg.parallel.device_memory_gb:g} minus "
              f"{cfg.parallel.headroom_gb:g} GB headroom); largest terms: {terms} GB; layout {layout_text(cur)}")]
    smaller = [c for _, c in best_per_family(result.ranked) if c.memory.total < cur.memory.total]
    if cur.layout.recompute != "full":  # the same layout with full recompute: the smallest change to the config
        full = evaluate(result.config, replace(cur.layout, recompute="full"), result.request)
        if full.ok and full.memory.total < cur.memory.total:
            smaller = [full] + [c for c in smaller if c.layout != full.layout]
    for c in smaller[:limit]:
        overrides = _patch_overrides(config_patch(result, c), cfg)
        if overrides:
            out.append(_r(f"{c.layout.family_name()}, recompute {c.layout.recompute}, micro batch "
                          f"{c.layout.micro_batch_size}: {c.memory.total / GB:.1f} GB of {usable:g} GB "
                          f"(step time x{c.cost.relative:.2f})", overrides))
    if len(out) == 1:
        out.append(_r(f"the planner knows no layout of {cfg.parallel.devices} device(s) that needs less: use more "
                      "devices (parallel.devices) or a shorter model.seq_length; `llm-pipeline plan --model CONFIG "
                      "--devices N` lists what fits"))
    return out


def _device_oom(diag, cfg) -> list[dict]:
    phase = ("while the graph was compiled and its memory laid out (or the weights loaded), before the first step"
             if diag.category == "device_oom_compile" else "during a training step")
    if cfg is None:
        return [_r(f"device memory ran out {phase}; pass the run's config (--config) for the predicted peak and "
                   "the layouts that fit", ["model.recompute=full"])]
    remedies = layout_remedies(cfg)
    remedies[0]["why"] = f"device memory ran out {phase}: " + remedies[0]["why"]
    return remedies + phase_remedies(cfg, compile_phase=diag.category == "device_oom_compile")


def phase_remedies(cfg, *, compile_phase: bool) -> list[dict]:
    """The field report's order (planner.oom): at initialization shard the model; in a step recompute first, then the
    accumulation settings. Each with the planner's predicted peak for this config."""
    from ..planner.oom import PHASE_TITLES, oom_remedies

    order = ("initialization", "forward", "backward") if compile_phase else ("forward", "backward", "initialization")
    found = oom_remedies(cfg, per_phase=2)
    return [_r(f"{PHASE_TITLES[ph]}: {r.change}: {r.peak_gb:.1f} GB per device of "
               f"{cfg.parallel.usable_memory_gb:g} GB usable, step time x{r.step_x:.2f}", list(r.overrides))
            for ph in order for r in found[ph] if r.fits]  # an override that still does not fit is no remedy


# The evidence sentences that make a SIGKILL an OOM kill (runtime/memory_evidence.py verdict, the kernel's lines)
_OOM_KILL_EVIDENCE = re.compile(r"oom_kill count rose|last sampled RSS, .* of the|[Oo]ut of memory: Kill"
                                r"|invoked oom-killer|oom-kill:constraint=")


def _decided(diag) -> list[dict]:
    """The evidence that made a kill an OOM kill, first: the doctor says what decided."""
    line = next((ln for ln in diag.evidence if _OOM_KILL_EVIDENCE.search(ln)), None)
    return [_r(f"an OOM kill, decided by: {line}")] if line else []


def _host_oom(diag, cfg) -> list[dict]:
    decided = _decided(diag)
    if cfg is None:
        return decided + [_r("the host ran out of RAM (on a CPU device target the model's memory is host RAM); pass "
                             "the run's config (--config) for the predicted memory", ["training.dataset_workers=1"])]
    from ..config.platform import device_target
    from ..planner.memory import GB
    from ..planner.report import best_per_family, config_patch

    out = []
    if device_target(cfg) == "CPU":
        result = _plan(cfg)
        cur = result.current
        workers = min(cfg.parallel.devices, cfg.parallel.devices_per_node)
        out.append(_r(f"on CPU the trainer's memory is host RAM: predicted {cur.memory.total / GB:.2f} GB per "
                      f"worker x {workers} worker(s) on this node, plus the dataset pipeline"))
        for _, c in best_per_family(result.ranked):
            if c.memory.total < cur.memory.total:
                overrides = _patch_overrides(config_patch(result, c), cfg)
                if overrides:
                    out.append(_r(f"a layout that needs {c.memory.total / GB:.2f} GB per worker", overrides))
                    break
    else:
        out.append(_r("the host ran out of RAM (not device memory): checkpoint loading/transform, the dataset "
                      "pipeline and the workers of this node share it"))
    t = cfg.training
    workers = t.dataset_workers
    out.append(_r(f"a smaller dataset pipeline (training.dataset_workers={workers if workers is not None else 'auto'}"
                  f", training.prefetch_size={t.prefetch_size})",
                  ["training.dataset_workers=1", "training.prefetch_size=1"]))
    return decided + out


_BARE_KILLED = re.compile(BARE_KILLED)  # patterns.py's shell 'Killed' line
CONFIRM_OOM = ("confirm it in the kernel log: `dmesg -T | grep -iE 'out of memory|oom-kill|killed process'` (or "
               "`journalctl -k`; a line 'Killed process <pid> (python)' at that time is the OOM killer), and for a "
               "container or a job's cgroup `cat /sys/fs/cgroup/<its group>/memory.events` (a nonzero oom_kill; "
               "cgroup v1: memory.oom_control)")


def _killed(diag, cfg) -> list[dict]:
    measured = next((ln for ln in diag.evidence if ln.startswith("no memory pressure") or "no memory evidence" in ln
                     and not ln.startswith("exit code")), None)
    if measured is None and any(_BARE_KILLED.match(ln) for ln in diag.evidence):
        # a pasted log: the shell's bare 'Killed' and nothing else. The Linux OOM killer writes its own lines to the
        # kernel log only, so this is its usual trace in the process's log; a lost node or kill -9 leaves the same.
        return ([_r("a bare 'Killed' with no other evidence: most often the Linux OOM killer (host RAM ran out: the "
                    "trainer, its dataset workers and a checkpoint load or transform share it); " + CONFIRM_OOM)]
                + _host_oom(diag, cfg)[-1:]
                + [_r("if the kernel log shows no OOM kill: a lost node, a preempted job or an operator's kill -9; a "
                      "rerun with the same --run-id resumes from the last verified checkpoint")])
    why = measured or "no evidence of memory pressure"
    return [_r(f"killed by SIGKILL without an OOM kill ({why}): a lost node, a preempted job or an operator's kill "
               "-9. Nothing in the config needs to change: a retry or a rerun with the same --run-id resumes from the "
               "last verified checkpoint; if it keeps happening, look at the node (dmesg, the scheduler's events)")]


def _nan(diag, cfg) -> list[dict]:
    if cfg is None:
        return [_r("the loss became NaN/inf or spiked: lower the learning rate or the clipping norm, or skip the "
                   "bad window", ["training.guard.on_failure=rollback"])]
    sft = diag.stage == "sft"
    lr_key = "sft.learning_rate" if sft else "training.learning_rate"
    lr = cfg.sft.learning_rate if sft else cfg.training.learning_rate
    out = [_r(f"the loss became NaN/inf or spiked: halve the peak learning rate ({lr_key}={lr:g})",
              [f"{lr_key}={lr / 2:g}"]),
           _r(f"clip gradients harder (training.grad_clip={cfg.training.grad_clip:g})",
              [f"training.grad_clip={cfg.training.grad_clip / 2:g}"])]
    if not sft and cfg.training.guard.on_failure != "rollback":
        out.append(_r("or keep the config and let the guard roll back to the last good checkpoint, skipping the "
                      "batches that blew up", ["training.guard.on_failure=rollback"]))
    if cfg.training.precision == "fp16":
        out.append(_r("fp16 overflows where bf16 does not (same exponent range as fp32)", ["training.precision=bf16"]))
    return out


def _disk(diag, cfg) -> list[dict]:
    if diag.stage is not None and diag.stage not in ("pretrain", "sft"):  # no checkpoints: the stage's own files
        return [_r(f"the {diag.stage} stage's files did not fit (the error names the path and the bytes): free "
                   "space there or write the run to a filesystem with room (run.output_root; s3:// runs work in "
                   "$TMPDIR and $LLM_PIPELINE_WORK_DIR), then rerun with the same --run-id")]
    if cfg is None:
        return [_r("the filesystem being written filled up (usually while saving a checkpoint): free space or "
                   "keep fewer checkpoints", ["training.keep_checkpoint_max=1"])]
    import shutil

    from ..planner.disk import checkpoint_disk
    from ..planner.memory import GB
    from ..runtime.nodes import node_rank
    from ..train.runner import local_ranks

    need = checkpoint_disk(cfg, local_ranks(cfg, node_rank(cfg)))
    keep = cfg.training.keep_checkpoint_max
    why = f"checkpoints on this node need {need.total / GB:.2f} GB: {need.explain()}"
    probe = Path(cfg.run.output_root).resolve() if not cfg.run.output_root.startswith("s3://") else None
    while probe is not None and not probe.exists():
        probe = probe.parent
    out = []
    if probe is not None:
        free = shutil.disk_usage(probe).free
        why += f"; {free / GB:.2f} GB free now on the filesystem of {probe} (run.output_root)"
        fits = int(free // max(1, need.per_checkpoint)) - 1  # kept copies + the one being written
        out.append(_r(why))
        if 1 <= fits < keep:
            out.append(_r(f"keep {fits} checkpoint(s) instead of {keep}: what fits in the free space now",
                          [f"training.keep_checkpoint_max={fits}"]))
        elif fits < 1:
            out.append(_r(f"not even one checkpoint of {need.per_checkpoint / GB:.2f} GB fits: free space first"))
    else:
        out.append(_r(why))
    if keep > 1 and not any(r["overrides"] for r in out):
        out.append(_r(f"keep fewer checkpoints than {keep}", ["training.keep_checkpoint_max=1"]))
    out.append(_r("or write the run to a filesystem with room (run.output_root; s3:// runs train in "
                  "$LLM_PIPELINE_WORK_DIR)"))
    return out


def _clash(diag, cfg) -> list[dict]:
    # the last match: a traceback also quotes the raising source line, `'{key}' is already used ...`
    found = next((m for m in map(_CLASH.search, reversed(diag.evidence)) if m), None)
    name = f"'{found.group(1)}'" if found else "the name"
    owner = found.group(2) if found else "transformers/mindformers"
    return [_r(f"code in this process registers a model type {name} that {owner} already has (AutoConfig/AutoModel"
               ".register): rename the custom model type. pipeline_lib and mindformers 1.9 register no transformers "
               "config, and model.name is only a label and checkpoint prefix, so no override of ours causes it")]


def _kernel(diag, cfg) -> list[dict]:
    found = next((m for m in map(_KERNEL.search, diag.evidence) if m), None)
    op = found.group(found.lastindex) if found else "an op"  # one group per wording: the one that matched
    target = ""
    if cfg is not None:
        from ..config.platform import device_target

        target = f" ({device_target(cfg)})"
    out = [_r(f"{op} has no kernel on this device target{target}: run the stage on Ascend (its work pool) or use a "
              "code path without it (on CPU evaluation decodes from forward logits, not model.generate)")]
    if any("does not has any binary" in line for line in diag.evidence):
        out.insert(0, _r("the CANN kernel binaries of this chip are not installed: install the Ascend-cann-kernels "
                         "package matching the chip and the CANN toolkit, then rerun"))
    if cfg is not None and cfg.model.use_flash_attention:
        out.append(_r("flash attention is an Ascend kernel", ["model.use_flash_attention=false"]))
    return out


def _schema(diag, cfg) -> list[dict]:
    return [_r("the MindRecord files do not hold the columns the trainer reads: rebuild them with this pipeline's "
               "data stage (`llm-pipeline run CONFIG --stages data`) rather than pointing the trainer at files "
               "written by another tool or another version")]


def _shape(diag, cfg) -> list[dict]:
    found = next((m for m in map(_SHAPE.search, diag.evidence) if m), None)
    if found is None:
        return [_r("a checkpoint parameter's shape differs from the network the config builds: model.* must "
                   "describe the checkpoint's model")]
    name, net, ckpt = found.group(1), found.group(2), found.group(3)
    out = [_r(f"parameter {name}: the network has shape ({net}), the checkpoint ({ckpt}); model.* must describe "
              "the checkpoint's model (model.base_checkpoint / model.hf_checkpoint)")]
    if cfg is not None:
        net_dims = [int(x) for x in net.replace(",", " ").split()]
        ckpt_dims = [int(x) for x in ckpt.replace(",", " ").split()]
        overrides = []
        for a, b in zip(net_dims, ckpt_dims):
            if a == b:
                continue
            for key in MODEL_DIMS:
                if getattr(cfg.model, key, None) == a:
                    overrides.append(f"model.{key}={b}")
                    break
        if overrides:
            out.insert(0, _r(f"parameter {name}: the network has ({net}) from the config, the checkpoint ({ckpt})",
                             overrides))
    return out


def _collective(diag, cfg) -> list[dict]:
    return [_r("a collective (HCCL) waited longer than its timeout: usually another rank failed or stalled first; "
               "read every rank's log (msrun/worker_N.log) for the first error. A network hiccup is transient: "
               "the stage is retried. Slow-starting ranks: raise HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT "
               "(environment)")]


_HANG_FIRST = re.compile(r"stopped first: (rank\(s\) [\d, ]+ on host \S+ after step \d+)")
_HANG_STACKS = re.compile(r"Python stacks of every rank: (\S+)")


def _hang(diag, cfg) -> list[dict]:
    first = next((m.group(1) for m in map(_HANG_FIRST.search, diag.evidence) if m), None)
    if first is None:  # not our watchdog's line: a device task, a peer or a collective that never finished
        return [_r("a rank stopped making progress (a device task or stream that never finished, a dead peer, a stuck "
                   "collective, or the watchdog's no-new-step timeout; the evidence names the rank or node): the stage "
                   "is retried and resumes from the last verified checkpoint, and a second hang at the same step is "
                   "not retried. Read that rank's log and stack dump (msrun/worker_N.log) for what it waited on; on "
                   "Ascend check the card (npu-smi info) and the collective timeout in force (HCCL_EXEC_TIMEOUT)")]
    stacks = next((m.group(1) for m in map(_HANG_STACKS.search, diag.evidence) if m), "hang/stacks_N.txt")
    out = [_r(f"{first} stopped making progress: read its stack in {stacks} (a collective, the dataset pipeline, a "
              "stopped or dead process) and that rank's msrun/worker_N.log. The stage resumes from the last "
              "verified checkpoint; a second hang at the same step is not retried")]
    if cfg is not None and cfg.training.hang_timeout_s:
        out.append(_r(f"if that step is only slow (a long checkpoint save, a slow data source), raise the hang limit "
                      f"training.hang_timeout_s={cfg.training.hang_timeout_s:g} or leave it empty (derived from the "
                      "median step time)", ["training.hang_timeout_s=null"]))
    return out


def _stall(diag, cfg) -> list[dict]:
    why = ("the input pipeline did not deliver a batch in time (the device's GetNext waited on an empty data queue, "
           "or a loader worker timed out): the dataset workers are too few or too slow for the step, or the shards "
           "are read from slow storage")
    if cfg is None:
        return [_r(why + "; pass the run's config (--config) for the numbers: more training.dataset_workers, a "
                   "larger training.prefetch_size")]
    from ..config.platform import device_target
    from ..train.mindformers_yaml import dataset_workers

    t = cfg.training
    workers = dataset_workers(cfg, on_cpu=device_target(cfg) == "CPU")
    return [_r(f"{why}: raise the workers per rank from {workers} and the prefetch from {t.prefetch_size}",
               [f"training.dataset_workers={workers * 2}", f"training.prefetch_size={t.prefetch_size * 2}"]),
            _r("and keep the MindRecord shards on local disk (run.output_root) rather than a network filesystem; a "
               "stall on one rank shows on the others as a collective timeout, so read the first rank that waited")]


_PEAK = re.compile(r"peak host memory ([\d.]+) GB exceeds the limit ([\d.]+) GB")


def _preflight(diag, cfg) -> list[dict]:
    """One remedy per problem the verdict lists (its evidence lines), with the stage's own keys (training.* or sft.*):
    a loss that rose and one that stayed flat need opposite learning-rate changes."""
    text = "\n".join(diag.evidence)
    sft = diag.stage == "sft" or "sft preflight failed" in text or "sft.learning_rate" in text
    section = "sft" if sft else "training"
    knobs = cfg.sft if (cfg is not None and sft) else (cfg.training if cfg is not None else None)
    lr_key, warmup_key, batch_key = (f"{section}.{k}" for k in ("learning_rate", "warmup_steps", "micro_batch_size"))
    out = []
    for problem, what in (("loss rose", "the loss climbed over the preflight's steps"),
                          ("gradients not finite in", "gradients overflowed at loss scale 1 in the preflight's steps "
                                                      "(their updates were skipped)")):
        if problem in text:
            why = f"{what}: the learning rate is too high for this start"
            out.append(_r(f"{why} ({lr_key}={knobs.learning_rate:g}): a tenth of it, and a longer warm-up",
                          [f"{lr_key}={knobs.learning_rate / 10:g}", f"{warmup_key}={max(2 * knobs.warmup_steps, 1)}"])
                       if knobs else _r(f"{why}: lower {lr_key} (a tenth is a first try), lengthen {warmup_key}"))
    if "loss did not fall" in text:
        why = "the loss stayed flat over the preflight's steps: the learning rate is too low, or the steps too few to see it fall"
        steps = cfg.training.preflight_steps if cfg is not None else None
        out.append(_r(f"{why} ({lr_key}={knobs.learning_rate:g}, training.preflight_steps={steps})",
                      [f"{lr_key}={knobs.learning_rate * 3:g}", f"training.preflight_steps={2 * steps}"])
                   if knobs else _r(f"{why}: raise {lr_key} or training.preflight_steps; check that rows are not "
                                    "mostly pad tokens"))
    if "loss is not finite" in text:
        out.extend(_nan(diag, cfg))
    peak = _PEAK.search(text)
    if peak:
        measured, limit = float(peak.group(1)), float(peak.group(2))
        why = (f"the trainer's peak host memory {measured:g} GB is over the preflight's limit {limit:g} GB "
               "(parallel.device_memory_gb per device; on CPU the devices are processes on this host)")
        if knobs is not None and knobs.micro_batch_size > 1:
            out.append(_r(f"{why}: halve the micro batch", [f"{batch_key}={knobs.micro_batch_size // 2}"]))
        if cfg is None:
            out.append(_r(f"{why}: recompute activations (model.recompute=full), or, if the machine has the memory, "
                          "raise parallel.device_memory_gb"))
        else:  # the limit scales with device_memory_gb: the measured peak, plus a quarter of headroom
            enough = math.ceil(cfg.parallel.device_memory_gb * measured / limit * 1.25 * 10) / 10
            recompute = ["model.recompute=full"] if cfg.model.recompute != "full" else []
            out.append(_r(f"{why}: {'recompute activations, or, ' if recompute else ''}if the machine has the "
                          "memory, say so", [*recompute, f"parallel.device_memory_gb={enough:g}"]))
    if "too few to judge" in text:
        out.append(_r("the preflight needs at least 3 steps to judge the loss trend", ["training.preflight_steps=3"]))
    if not out:  # a crash within its steps, or no steps recorded: the log's error is the cause
        out.append(_r("the trainer did not finish the preflight's steps: its error is in the evidence and the log "
                      "tail; fix that, then rerun with the same --run-id (the run starts afresh and preflights again)"))
    return out


_BY_CATEGORY = {"device_oom_compile": _device_oom, "device_oom_step": _device_oom, "host_oom": _host_oom,
                "nan_or_overflow": _nan, "disk_full": _disk, "config_name_clash": _clash,
                "missing_kernel": _kernel, "dataset_schema": _schema, "checkpoint_shape_mismatch": _shape,
                "collective_timeout": _collective, "killed": _killed, "hang": _hang, "dataloader_stall": _stall,
                "preflight": _preflight}


def remedies_for(diag, cfg=None) -> list[dict]:
    fn = _BY_CATEGORY.get(diag.category)
    if fn is None:
        return []
    return fn(diag, cfg)
