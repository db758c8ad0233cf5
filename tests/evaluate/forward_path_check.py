"""Run by test_forward_path.py in its own process (MindSpore stays out of the pytest process).

Builds the tiny mindformers Llama (random init from the given checkpoint), decodes a few prompts of
different lengths in one batch with decoding.decode over the forward path, and, independently, a
reference greedy per prompt: one prompt at a time in row 0, the rest of the row and the other rows
filled with random real tokens (not padding), argmax at the last real position. Also perplexity vs
a per-token loop. Prints one JSON line.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np


def main(cfg_path: str, ckpt: str) -> None:
    from pipeline_lib.config.load import config_from_dict
    from pipeline_lib.evaluate.decoding import decode
    from pipeline_lib.model.llama import build_llama, load_into, logits_fn, read_checkpoint, set_context
    from pipeline_lib.evaluate.perplexity import perplexity

    cfg = config_from_dict(json.loads(open(cfg_path, encoding="utf-8").read()))
    set_context("CPU")
    seq, batch, vocab = cfg.model.seq_length, 3, cfg.model.vocab_size
    from pipeline_lib.model.token_ids import configured_ids

    ids = configured_ids(cfg.tokenizer)  # a trained tokenizer's layout (no tokenizer.path here)
    eos, pad = ids.eos_id, ids.pad_id
    net = build_llama(cfg, batch_size=batch, seq_length=seq, target="CPU")
    load_into(net, read_checkpoint(ckpt)[0], "tiny")
    fn = logits_fn(net)
    rng = np.random.default_rng(0)
    prompts = [[2, 17], [2] + rng.integers(4, vocab, 12).tolist(), [2] + rng.integers(4, vocab, 25).tolist()]
    max_new = 8
    gens = decode(fn, prompts, eos, pad, seq, max_new)

    reference = []
    for p in prompts:
        cur = list(p)
        for _ in range(max_new):
            ids = rng.integers(4, vocab, size=(batch, seq)).astype(np.int32)  # junk, not padding
            ids[0, :len(cur)] = cur
            tok = int(np.argmax(fn(ids)[0, len(cur) - 1]))
            if tok == eos:
                break
            cur.append(tok)
            if len(cur) == seq:
                break
        reference.append(cur[len(p):])

    rows = rng.integers(4, vocab, size=(5, seq + 1)).astype(np.int32)
    rows[4, 20:] = pad
    ppl = perplexity(fn, rows, pad, batch)
    nll, n = 0.0, 0
    for r in rows:
        lg = fn(np.repeat(r[None, :seq], batch, axis=0))[0].astype(np.float64)
        for j in range(seq):
            if r[j + 1] != pad:
                z = lg[j] - lg[j].max()
                nll -= z[r[j + 1]] - math.log(np.exp(z).sum())
                n += 1
    print(json.dumps({"decoded": [g.tokens for g in gens], "stops": [g.stop_reason for g in gens],
                      "reference": reference, "ppl": ppl.perplexity, "ppl_tokens": ppl.tokens,
                      "ref_ppl": math.exp(nll / n), "ref_tokens": n}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
