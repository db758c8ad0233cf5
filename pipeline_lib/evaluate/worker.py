"""Evaluation worker: `python -m pipeline_lib.evaluate.worker --request r.json --result out.json`.

Launched by stage.run_evaluate_stage (runtime.worker.run_worker); imports MindSpore. One network is built
(batch = evaluate.batch_size, length = model.seq_length) and every checkpoint's weights are loaded
into it in turn, so the graph compiles once. Per checkpoint it writes `<label>/generations.jsonl`
(one line per prompt: prompt id, checkpoint, text, tokens, time, stop reason, keyword hits),
computes held-out perplexity and scores the tasks of evaluate.tasks by log-likelihood (loglik_tasks.py; the
same network called at evaluate.task_batch_size rows: a second compiled graph, the weights shared),
one record per item in `<label>/tasks.jsonl`, and per perplexity row (held-out split, each reference set, each
reference_heldout split) its NLL sum and scored-token count in `<label>/perplexity_rows.json` (perplexity.ROWS_FILE:
what a paired comparison of two checkpoints on the same rows needs, the nightly gate's bootstrap). A checkpoint
with a LoRA adapter (instruction-tuned) is prompted with the SFT chat template, the others with BOS + the raw prompt (request "formats" overrides per label);
prompts too long for max_new_tokens keep BOS and their tail (decoding.truncate_prompt).

Decoding path: greedy on a device where mindformers `generate` runs (Ascend) uses `generate`
(do_sample=False); on CPU, or when `generate` raises, and for sampling everywhere, the forward path
(decoding.decode over the logits of one forward per step; seeded per prompt so a sample does not
depend on its batch). With `check_generate` the first greedy batch is decoded both ways and the
agreement is reported. `time_s` of a generation is its batch's wall time divided by the prompts in it.
"""
from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

from .. import killpoints
from ..runtime.worker import progress, worker_main


def _prompt_seed(run_seed: int, prompt_id: str) -> int:
    return (int(run_seed) * 1_000_003 + zlib.crc32(prompt_id.encode("utf-8"))) % (2 ** 32)


def _greedy_generate(net, batch_ids, codec, max_new):
    from ..model.llama import generate_greedy

    return generate_greedy(net, batch_ids, eos_id=codec.eos_id, pad_id=codec.pad_id, max_new_tokens=max_new)


def _decode_checkpoint(net, fn, prompts, codec, cfg, req, label, fmt, out_path: Path, state: dict) -> dict:
    from .decoding import decode, truncate_prompt
    from .prompts import keyword_hits

    ev, seq = cfg.evaluate, cfg.model.seq_length
    encoded = codec.encode_prompts([p["prompt"] for p in prompts], fmt, cfg.sft.system_prompt)
    hits = total_kw = n_tokens = 0
    decode_time = 0.0
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        for start in range(0, len(prompts), ev.batch_size):
            chunk = prompts[start:start + ev.batch_size]
            ids = [truncate_prompt(e, seq, ev.max_new_tokens, keep_first=1)
                   for e in encoded[start:start + ev.batch_size]]
            t0 = time.time()
            path, gens = "forward", None
            if ev.decoding == "greedy" and state["use_generate"]:
                try:
                    new = _greedy_generate(net, ids, codec, ev.max_new_tokens)
                    path = "generate"
                except Exception as err:  # CPU kernels missing etc.: remember, use the forward path
                    state["use_generate"] = False
                    state["generate_error"] = f"{type(err).__name__}: {str(err)[:300]}"
                    progress(f"generate unavailable ({type(err).__name__}); using the forward path")
            if path == "forward":
                gens = decode(fn, ids, codec.eos_id, codec.pad_id, seq, ev.max_new_tokens, ev.decoding,
                              ev.temperature, ev.top_k, ev.top_p,
                              seed=[_prompt_seed(cfg.run.seed, p["id"]) for p in chunk])
                new = [g.tokens for g in gens]
            elapsed = time.time() - t0
            decode_time += elapsed
            if path == "generate" and req.get("check_generate") and "generate_match" not in state:
                ref = decode(fn, ids, codec.eos_id, codec.pad_id, seq, ev.max_new_tokens, "greedy")
                state["generate_match"] = sum(a == r.tokens for a, r in zip(new, ref)) / len(ref)
                progress(f"generate vs forward path: {state['generate_match']:.0%} of the first batch's prompts "
                         "got the same greedy tokens")
            for i, (p, toks) in enumerate(zip(chunk, new)):
                text = codec.decode(toks)
                found = keyword_hits(text, p.get("keywords", []))
                hits, total_kw = hits + len(found), total_kw + len(p.get("keywords", []))
                n_tokens += len(toks)
                stop = gens[i].stop_reason if gens else ("max_new_tokens" if len(toks) >= ev.max_new_tokens else
                                                         "seq_length" if len(ids[i]) + len(toks) >= seq else "eos")
                rec = {"prompt_id": p["id"], "set": p["set"], "checkpoint": label, "prompt": p["prompt"],
                       "text": text, "tokens": toks, "num_tokens": len(toks), "prompt_tokens": len(ids[i]),
                       "truncated": len(ids[i]) < len(encoded[start + i]), "stop_reason": stop,
                       "keywords": p.get("keywords", []), "keyword_hits": found,
                       "time_s": round(elapsed / len(chunk), 4), "batch_time_s": round(elapsed, 4),
                       "decode_path": path, "strategy": ev.decoding, "prompt_format": fmt}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            progress(f"{label}: {min(start + ev.batch_size, len(prompts))}/{len(prompts)} prompts")
    return {"keyword_hits": hits, "keywords_total": total_kw, "generated_tokens": n_tokens,
            "decode_seconds": round(decode_time, 3),
            "tokens_per_second": round(n_tokens / decode_time, 2) if decode_time else None}


def _score_tasks(task_fn, tasks, encoded: dict, codec, cfg, fmt: str, out_path: Path, label: str) -> dict:
    """Accuracy per task by log-likelihood (loglik_tasks.py); one record per item in `<label>/tasks.jsonl`."""
    from .loglik_tasks import encode_task, score_task, sequence_logliks

    seq = cfg.model.seq_length
    if fmt not in encoded:
        encoded[fmt] = [encode_task(t, codec, fmt, seq, cfg.sft.system_prompt) for t in tasks]
    results = {}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        for task, seqs in zip(tasks, encoded[fmt]):
            t0 = time.time()
            logliks = sequence_logliks(task_fn, seqs, seq, codec.pad_id, cfg.evaluate.task_batch_size)
            result, records = score_task(task, seqs, logliks)
            result["seconds"] = round(time.time() - t0, 3)
            results[task.name] = result
            for rec in records:
                fh.write(json.dumps({**rec, "checkpoint": label}, ensure_ascii=False) + "\n")
            progress(f"{label}: task {task.name} accuracy {result['accuracy']:.3f} ({result['correct']}/"
                     f"{result['items']}, {len(seqs)} sequences in {result['seconds']} s)")
    return results


def run(req: dict) -> dict:
    from ..config.load import config_from_dict
    from ..model.llama import prepare_env

    out_dir, work_dir = Path(req["out_dir"]), Path(req["work_dir"])
    prepare_env(work_dir / "logs")
    cfg = config_from_dict(req["config"])
    target = req["target"]
    from ..model.checkpoints import CheckpointRef, resolve_params
    from .decoding import fixed_batch
    from ..model.llama import build_llama, load_into, logits_fn, set_context
    from .perplexity import ROWS_FILE, perplexity, read_heldout_rows
    from .textcodec import TextCodec

    set_context(target)
    codec = TextCodec.load(req["tokenizer"], cfg.tokenizer, cfg.sft.template)
    if codec.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                         f"{codec.vocab_size} pieces; use the tokenizer the model was trained with")
    rows = None
    if req.get("heldout_dir"):
        rows = read_heldout_rows(req["heldout_dir"], cfg.model.seq_length, cfg.evaluate.perplexity_max_rows)
    from .reference import heldout_name, load_reference_set, reference_rows, set_name

    references = {set_name(path): reference_rows(load_reference_set(path), codec, cfg.model.seq_length,
                                                 cfg.evaluate.reference_max_rows)
                  for path in req.get("reference_sets", [])}
    for name, folder in req.get("reference_heldout", {}).items():
        references[name] = read_heldout_rows(folder, cfg.model.seq_length, cfg.evaluate.reference_max_rows)
    t0 = time.time()
    net = build_llama(cfg, batch_size=cfg.evaluate.batch_size, seq_length=cfg.model.seq_length, target=target,
                      token_ids=codec.ids)
    fn = fixed_batch(logits_fn(net), cfg.evaluate.batch_size, codec.pad_id)
    from .loglik_tasks import load_task_sets

    tasks = load_task_sets(req.get("tasks", []), req.get("task_names"))
    # the same network at the tasks' own (larger) batch: a second compiled graph sharing the weights
    task_fn = fixed_batch(logits_fn(net), cfg.evaluate.task_batch_size, codec.pad_id)
    encoded_tasks: dict = {}  # prompt format -> sequences per task, encoded once
    state = {"use_generate": target != "CPU" and cfg.evaluate.decoding == "greedy"}
    results = []
    for item in req["checkpoints"]:
        label, ref = item["label"], CheckpointRef.parse(item["ref"])
        progress(f"{label}: loading {ref.ckpt}" + (f" + adapter {ref.adapter}" if ref.adapter else ""))
        resolved = resolve_params(ref, cfg, work_dir / "scratch", name=item["dir"])
        load_into(net, resolved.params, f"checkpoint {label!r} ({ref.ckpt})")
        started = time.time()
        # An instruction-tuned (LoRA) checkpoint is prompted with the SFT chat template, others raw.
        fmt = req.get("formats", {}).get(label) or ("chat" if resolved.report else "raw")
        entry = {"label": label, "dir": item["dir"], "ref": ref.to_json(), "prompt_format": fmt,
                 "lora_merged": resolved.report.to_json() if resolved.report else None}
        entry.update(_decode_checkpoint(net, fn, req["prompts"], codec, cfg, req, label, fmt,
                                        out_dir / item["dir"] / "generations.jsonl", state))
        heldout = perplexity(fn, rows, codec.pad_id, cfg.evaluate.batch_size) if rows is not None else None
        if heldout is not None:
            entry["perplexity"] = heldout.to_json()
            progress(f"{label}: perplexity {entry['perplexity']['perplexity']:.3f} on "
                     f"{entry['perplexity']['tokens']} tokens")
        scored = {name: perplexity(fn, ref_rows, codec.pad_id, cfg.evaluate.batch_size)
                  for name, ref_rows in references.items()}
        entry["reference"] = {name: result.to_json() for name, result in scored.items()}
        (out_dir / item["dir"] / ROWS_FILE).write_text(json.dumps({
            "checkpoint": label, "vocab_size": codec.vocab_size, "heldout": heldout.row_scores() if heldout else None,
            "reference": {name: result.row_scores() for name, result in scored.items()}}), encoding="utf-8")
        for name, result in entry["reference"].items():
            progress(f"{label}: reference {name} perplexity {result['perplexity']:.3f} on {result['tokens']} tokens")
        if tasks:
            entry["tasks"] = _score_tasks(task_fn, tasks, encoded_tasks, codec, cfg, fmt,
                                          out_dir / item["dir"] / "tasks.jsonl", label)
        entry["seconds"] = round(time.time() - started, 2)
        results.append(entry)
        killpoints.reached("evaluate.between_checkpoints")
    return {"device": target, "checkpoints": results, "seconds": round(time.time() - t0, 2),
            "vocab_size": codec.vocab_size,
            "decode_path": "generate" if state["use_generate"] else "forward",
            "generate_error": state.get("generate_error"), "generate_match": state.get("generate_match")}


if __name__ == "__main__":
    raise SystemExit(worker_main(run))
