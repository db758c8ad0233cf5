"""Run by test_loglik_tasks.py in its own process (MindSpore stays out of the pytest process).

On the tiny mindformers Llama (CPU) with the session's tokenizer:
1. the batched scorer (tasks.sequence_logliks: several sequences per forward, right-padded, a fixed batch) gives for
   every (item, candidate) the same log-likelihood as a direct computation: that one sequence alone in row 0 of a
   forward whose other positions hold random real tokens (not padding), log-softmax read at each candidate token;
2. after training the network (mindformers' own loss, MindSpore's TrainOneStepCell and Adam) on each classification
   item followed by its own label (the two items have different labels), the trained label wins for both items.
Prints one JSON line.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np


def direct_loglik(fn, seq, seq_length: int, batch: int, vocab: int, rng) -> float:
    ids = rng.integers(4, vocab, size=(batch, seq_length)).astype(np.int32)  # junk, not padding
    ids[0, :len(seq.ids)] = seq.ids
    logits = fn(ids)[0].astype(np.float64)
    total = 0.0
    for t in range(seq.start, len(seq.ids)):
        row = logits[t - 1] - logits[t - 1].max()
        total += row[seq.ids[t]] - math.log(np.exp(row).sum())
    return total


def train(net, seqs, pad_id: int, seq_length: int, batch: int, steps: int) -> list[float]:
    """mindformers' own training loss (LlamaForCausalLM in train mode: rows of seq_length + 1 tokens, pad masked,
    as pretraining computes it) on the given sequences, Adam, graph mode."""
    import mindspore as ms
    from mindspore import nn

    rows = np.full((batch, seq_length + 1), pad_id, np.int32)
    for r, s in enumerate(seqs):
        rows[r, :len(s.ids)] = s.ids
    model = net.network  # the LlamaForCausalLM inside the logits cell
    model.set_train(True)
    step = nn.TrainOneStepCell(model, nn.Adam(model.trainable_params(), learning_rate=1e-2))
    losses = [float(step(ms.Tensor(rows)).asnumpy()) for _ in range(steps)]
    net.set_train(False)
    return losses


def main(cfg_path: str, ckpt: str, tokenizer: str, task_file: str) -> None:
    from pipeline_lib.config.load import config_from_dict
    from pipeline_lib.evaluate.decoding import fixed_batch
    from pipeline_lib.evaluate.loglik_tasks import encode_task, load_task_file, score_task, sequence_logliks
    from pipeline_lib.evaluate.textcodec import TextCodec
    from pipeline_lib.model.llama import build_llama, load_into, logits_fn, read_checkpoint, set_context

    cfg = config_from_dict(json.loads(open(cfg_path, encoding="utf-8").read()))
    set_context("CPU")
    seq, vocab, batch = cfg.model.seq_length, cfg.model.vocab_size, 3
    codec = TextCodec.load(tokenizer, cfg.tokenizer)
    net = build_llama(cfg, batch_size=batch, seq_length=seq, target="CPU", token_ids=codec.ids)
    load_into(net, read_checkpoint(ckpt)[0], "tiny")
    fn = fixed_batch(logits_fn(net), batch, codec.pad_id)
    rng = np.random.default_rng(0)

    choice = load_task_file(cfg.evaluate.tasks[0])
    seqs = encode_task(choice, codec, "raw", seq)
    batched = sequence_logliks(fn, seqs, seq, codec.pad_id, batch).tolist()
    direct = [direct_loglik(fn, s, seq, batch, vocab, rng) for s in seqs]
    result, _ = score_task(choice, seqs, np.asarray(batched))

    cls = load_task_file(task_file)
    cls_seqs = encode_task(cls, codec, "raw", seq)
    trained_on = [s for s in cls_seqs if s.candidate == cls.items[s.item].answer]
    before, _ = score_task(cls, cls_seqs, sequence_logliks(fn, cls_seqs, seq, codec.pad_id, batch))
    losses = train(net, trained_on, codec.pad_id, seq, batch, steps=60)
    after, records = score_task(cls, cls_seqs, sequence_logliks(fn, cls_seqs, seq, codec.pad_id, batch))
    print(json.dumps({"batched": batched, "direct": direct, "sequences": len(seqs),
                      "candidate_tokens": [len(s.ids) - s.start for s in seqs], "choice_result": result,
                      "before": before, "after": after, "records": records, "losses": [losses[0], losses[-1]]},
                     ensure_ascii=False))


if __name__ == "__main__":
    main(*sys.argv[1:5])
