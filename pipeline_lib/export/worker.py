"""Export worker: `python -m pipeline_lib.export.worker --request r.json --result out.json`.

Launched by stage.run_export_stage (runtime.worker.run_worker); imports MindSpore. In order, each step gating the next:
1. resolve the base (a .ckpt, or a parallel run's folder merged with its strategy: shard_merge);
2. with an adapter: fold LoRA in (W + alpha/rank * B @ A) and CHECK that the merged model's logits
   equal the base+adapter model's (mindformers' own LoRA graph, as trained) on fixed inputs;
3. write `merged.ckpt`: the network's parameters only (no LoRA, no optimizer state), dtypes kept, and the
   same model as a Hugging Face Llama folder `hf/` (model.safetensors + config.json, float32, read back and
   CHECKED equal; the tokenizer is copied beside it);
4. export the merged model to MindIR (fixed [batch, seq_length]), reload it with mindspore.load +
   nn.GraphCell and CHECK its logits against the checkpoint model's;
5. copy the tokenizer and write `serving/serving.json` next to `serving/model.mindir`.
Each check writes its numbers to `checks.json` before it can fail, so a failed export leaves them.
A failed check raises LogitsMismatch (tolerances export.rtol / export.atol).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from .. import killpoints
from ..runtime.worker import progress, worker_main

SERVING_DIR = "serving"
HF_DIR = "hf"


def lora_reference_logits(cfg, resolved, *, batch_size: int, seq_length: int, target: str, inputs):
    """Logits of the training graph: base weights + mindformers LoRA adapters (not merged)."""
    from ..model.llama import build_llama, load_into, logits_fn
    from ..model.lora_merge import LORA_MARK, adapter_config

    net = build_llama(cfg, batch_size=batch_size, seq_length=seq_length, target=target,
                      lora=adapter_config(resolved.report, cfg.sft.lora_alpha))
    lora_only = {k: v for k, v in resolved.adapter.items() if LORA_MARK in k}
    base_plain = {k: v for k, v in resolved.base.items() if LORA_MARK not in k}
    load_into(net, {**lora_only, **base_plain}, "base + adapter")
    return logits_fn(net)(inputs)


def _write_checks(out_dir: Path, checks: dict) -> None:
    (out_dir / "checks.json").write_text(json.dumps(checks, indent=1), encoding="utf-8")


def run(req: dict) -> dict:
    from ..config.load import config_from_dict
    from ..model.llama import prepare_env

    out_dir, work_dir = Path(req["out_dir"]), Path(req["work_dir"])
    prepare_env(work_dir / "logs")
    cfg = config_from_dict(req["config"])
    target = req["target"]
    from ..model.llama import build_llama, load_into, logits_fn, set_context, write_checkpoint
    from ..model.checkpoints import CheckpointRef, resolve_params
    from ..model.lora_merge import LORA_MARK
    from .mindir import compare_logits, export_mindir, fixed_inputs, reload_logits, serving_spec

    t = time.time()
    from ..runtime.deferred_imports import import_mindformers

    import_mindformers()  # timed on its own: ~4-7 s

    set_context(target)
    ex = cfg.export
    batch, seq = ex.batch_size, ex.seq_length or cfg.model.seq_length
    checks: dict = {"device": target, "batch_size": batch, "seq_length": seq, "rtol": ex.rtol, "atol": ex.atol,
                    "timings_s": {"import": round(time.time() - t, 3)}}
    t = time.time()
    ref = CheckpointRef(ckpt=req["base"], adapter=req.get("adapter"), strategy=req.get("base_strategy"),
                        adapter_strategy=req.get("adapter_strategy"))
    resolved = resolve_params(ref, cfg, work_dir / "scratch", name="base", lora_scale=req.get("lora_scale_override"))
    checks["timings_s"]["resolve"] = round(time.time() - t, 3)
    progress(f"resolved {ref.ckpt}" + (f" + adapter ({len(resolved.report.modules)} LoRA modules, "
                                       f"scale {resolved.report.scale:g})" if resolved.report else ""))
    from ..model.token_ids import TokenIds, configured_ids

    # the ids the model was trained with: the data stage's tokenizer_config.json beside the tokenizer
    ids = TokenIds.read(req["tokenizer"]) if req.get("tokenizer") else configured_ids(cfg.tokenizer)
    inputs = fixed_inputs(batch, seq, cfg.model.vocab_size, ids.pad_id, seed=cfg.run.seed)

    t = time.time()
    net = build_llama(cfg, batch_size=batch, seq_length=seq, target=target, token_ids=ids)
    load_into(net, resolved.params, "merged model")
    ckpt_logits = logits_fn(net)(inputs)
    checks["timings_s"]["checkpoint_forward"] = round(time.time() - t, 3)

    if resolved.report is not None:
        checks["lora"] = resolved.report.to_json()
        t = time.time()
        ref_logits = lora_reference_logits(cfg, resolved, batch_size=batch, seq_length=seq, target=target,
                                           inputs=inputs)
        diff = compare_logits(ref_logits, ckpt_logits, rtol=ex.rtol, atol=ex.atol,
                              what="LoRA merge (merged model vs base + adapter)", raise_on_mismatch=False)
        checks["lora_check"] = diff.to_json()
        checks["timings_s"]["lora_check"] = round(time.time() - t, 3)
        _write_checks(out_dir, checks)
        compare_logits(ref_logits, ckpt_logits, rtol=ex.rtol, atol=ex.atol,
                       what="LoRA merge (merged model vs base + adapter)")
        progress(f"LoRA merge check passed: max abs diff {diff.max_abs:.2e}")

    names = [p.name for p in net.get_parameters()]
    leftover = [n for n in names if LORA_MARK in n]
    if leftover:
        raise RuntimeError(f"merged network still has LoRA parameters {leftover[:3]}")
    write_checkpoint({n: resolved.params[n] for n in names}, out_dir / "merged.ckpt", resolved.dtypes)
    # the merged model as a Hugging Face Llama folder too (transformers-loadable, HF names, float32)
    from ..model.hf import load_hf_tensors, mindformers_to_hf, write_hf_folder

    hf_dir = write_hf_folder({n: resolved.params[n] for n in names}, out_dir / HF_DIR, cfg.model)
    back, want = load_hf_tensors(hf_dir), mindformers_to_hf({n: resolved.params[n] for n in names}, cfg.model)
    if sorted(back) != sorted(want) or any(not np.array_equal(back[k], want[k]) for k in want):
        raise RuntimeError(f"the Hugging Face export in {hf_dir} does not read back as the merged parameters")
    checks["hf_export"] = {"dir": HF_DIR, "tensors": len(back), "read_back_equal": True}

    serving = out_dir / SERVING_DIR
    t = time.time()
    mindir = export_mindir(net, inputs, serving)
    killpoints.reached("export.mid_mindir")
    checks["timings_s"]["export"] = round(time.time() - t, 3)
    t = time.time()
    reloaded = reload_logits(mindir, inputs)
    checks["timings_s"]["reload"] = round(time.time() - t, 3)
    t = time.time()
    diff = compare_logits(ckpt_logits, reloaded, rtol=ex.rtol, atol=ex.atol,
                          what="MindIR reload vs checkpoint model", raise_on_mismatch=False)
    checks["mindir_check"] = diff.to_json()
    checks["timings_s"]["logits_check"] = round(time.time() - t, 4)
    _write_checks(out_dir, checks)
    compare_logits(ckpt_logits, reloaded, rtol=ex.rtol, atol=ex.atol, what="MindIR reload vs checkpoint model")
    progress(f"MindIR reload check passed: max abs diff {diff.max_abs:.2e}")

    tok_name = None
    if req.get("tokenizer"):
        tok_name = Path(req["tokenizer"]).name
        shutil.copyfile(req["tokenizer"], serving / tok_name)
        shutil.copyfile(req["tokenizer"], out_dir / HF_DIR / tok_name)
        meta = Path(req["tokenizer"]).with_name("tokenizer_config.json")  # ids + special tokens (data stage)
        if meta.is_file():
            shutil.copyfile(meta, serving / meta.name)
            shutil.copyfile(meta, out_dir / HF_DIR / "pipeline_tokenizer_config.json")
    spec = serving_spec(cfg, batch_size=batch, seq_length=seq, tokenizer_file=tok_name, token_ids=ids,
                        checks={k: checks[k] for k in ("lora_check", "mindir_check") if k in checks},
                        sources={"base": req["base"], "adapter": req.get("adapter")})
    (serving / "serving.json").write_text(json.dumps(spec, indent=1, ensure_ascii=False), encoding="utf-8")
    return {"checks": checks}


if __name__ == "__main__":
    raise SystemExit(worker_main(run))
