"""Screen worker: `python -m pipeline_lib.nightly.screen_worker --request r.json --result out.json`.

Launched by nightly.screen (runtime.worker.run_worker, as the evaluate stage launches its worker); imports MindSpore.
Scores documents with one model on the forward path evaluate uses (model.llama build_llama + logits_fn,
decoding.fixed_batch, perplexity.token_nll): each document is encoded as pretraining encodes it (BOS + its tokens +
EOS), cut into windows of model.seq_length + 1 tokens that share one token (every target scored once, a document
longer than a window is scored in full), the windows of all documents batched together. Returned per document: its
total NLL in nats over its scored targets, the target count and its length in characters; the screen divides by the
characters, so tokenisations of different granularity compare (a tokenizer of few, long pieces has few targets, each
expensive).

Request: config (resolved PipelineConfig as json), tokenizer (tokenizer.model), checkpoint (a .ckpt or a parallel
run's folder, model.checkpoints.CheckpointRef; with "hf": true a Hugging Face folder), texts_file (a jsonl of {"text"}), work_dir, target, batch_size.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..runtime.worker import progress, worker_main


def windows(ids: list[int], seq_length: int, pad_id: int) -> list[np.ndarray]:
    """Rows of seq_length + 1 tokens covering `ids`, consecutive rows sharing one token (the last target of a row is
    the first input of the next), the last row padded with pad_id (padding is never a target: token_nll skips it)."""
    step, out = seq_length, []
    for start in range(0, max(len(ids) - 1, 1), step):
        row = np.full(seq_length + 1, pad_id, dtype=np.int32)
        part = ids[start:start + seq_length + 1]
        row[:len(part)] = part
        out.append(row)
    return out


def score_rows(fn, rows: list[np.ndarray], owner: list[int], n_docs: int, batch_size: int, pad_id: int,
               seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sum, target count) per document from its rows (owner[i]: the document of row i)."""
    from ..evaluate.perplexity import token_nll

    nll, count = np.zeros(n_docs), np.zeros(n_docs, dtype=np.int64)
    for start in range(0, len(rows), batch_size):
        chunk = np.stack(rows[start:start + batch_size])
        logits = np.asarray(fn(chunk[:, :seq_length]))
        for i in range(len(chunk)):
            total, k = token_nll(logits[i:i + 1], chunk[i:i + 1, 1:], pad_id)
            doc = owner[start + i]
            nll[doc] += total
            count[doc] += k
        if (start // batch_size) % 50 == 49:
            progress(f"screen: {min(start + batch_size, len(rows))}/{len(rows)} windows scored")
    return nll, count


def _params(req: dict, cfg, work_dir: Path) -> dict:
    """The weights to score with: a Hugging Face folder (model.hf_checkpoint, the first night of a lineage that
    starts from one) converted as the pretrain stage converts it, else a checkpoint of this pipeline."""
    if req.get("hf"):
        from ..model.hf import hf_to_mindformers, load_hf_tensors

        return hf_to_mindformers(load_hf_tensors(req["checkpoint"]), cfg.model)
    from ..model.checkpoints import CheckpointRef, resolve_params

    return resolve_params(CheckpointRef.parse(req["checkpoint"]), cfg, work_dir / "scratch", name="screen").params


def run(req: dict) -> dict:
    from ..config.load import config_from_dict
    from ..evaluate.decoding import fixed_batch
    from ..evaluate.textcodec import TextCodec
    from ..model.llama import build_llama, load_into, logits_fn, prepare_env, set_context

    work_dir = Path(req["work_dir"])
    prepare_env(work_dir / "logs")
    cfg = config_from_dict(req["config"])
    target, batch_size, seq = req["target"], int(req["batch_size"]), cfg.model.seq_length
    set_context(target)
    codec = TextCodec.load(req["tokenizer"], cfg.tokenizer, cfg.sft.template)
    if codec.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                         f"{codec.vocab_size} pieces; screen with the tokenizer the model was trained with")
    texts = [json.loads(line)["text"] for line in Path(req["texts_file"]).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    t0 = time.time()
    rows, owner = [], []
    for doc, toks in enumerate(codec.tok.encode_batch(texts)):
        for row in windows([codec.bos_id, *toks, codec.eos_id], seq, codec.pad_id):
            rows.append(row)
            owner.append(doc)
    net = build_llama(cfg, batch_size=batch_size, seq_length=seq, target=target, token_ids=codec.ids)
    load_into(net, _params(req, cfg, work_dir), f"screen model {req['checkpoint']!r}")
    progress(f"screen: {len(texts)} documents, {len(rows)} windows of {seq + 1} tokens, batch {batch_size}")
    fn = fixed_batch(logits_fn(net), batch_size, codec.pad_id)
    nll, count = score_rows(fn, rows, owner, len(texts), batch_size, codec.pad_id, seq)
    return {"nll": nll.tolist(), "targets": count.tolist(), "chars": [len(t) for t in texts],
            "windows": len(rows), "seconds": round(time.time() - t0, 2), "device": target}


if __name__ == "__main__":
    raise SystemExit(worker_main(run))
