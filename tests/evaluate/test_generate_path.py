"""The `generate` path (used where mindformers' generate kernels exist, i.e. Ascend), with fakes:
its output is cut like the forward path's, it agrees with the forward path on the same model, and
when generate raises (as on CPU) the worker falls back to the forward path."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
from test_decoding import BOS, EOS, PAD, BigramModel

from pipeline_lib.config.load import config_from_dict
from pipeline_lib.evaluate.decoding import decode
from pipeline_lib.model.llama import generate_greedy
from pipeline_lib.evaluate.worker import _decode_checkpoint


class FakeGenerateModel:
    """mindformers-like generate: rows of prompt + new tokens, EOS included, right-padded."""

    def __init__(self, fail: bool = False):
        self.fail, self.calls = fail, []

    def generate(self, input_ids, do_sample, max_new_tokens, eos_token_id, pad_token_id):
        self.calls.append(do_sample)
        if self.fail:
            raise RuntimeError("Unsupported op [ArgMaxExt] on CPU")
        table, out = BigramModel().table, []
        for p in input_ids:
            seq = list(p)
            for _ in range(max_new_tokens):
                seq.append(int(np.argmax(table[seq[-1]])))
                if seq[-1] == eos_token_id:
                    break
            out.append(np.array(seq + [pad_token_id] * 3))
        return out


def test_generate_output_is_cut_like_the_forward_path():
    net = SimpleNamespace(network=FakeGenerateModel())
    prompts = [[BOS], [BOS, 6]]
    got = generate_greedy(net, prompts, eos_id=EOS, pad_id=PAD, max_new_tokens=4)
    forward = decode(BigramModel(), prompts, EOS, PAD, 16, 4)
    assert got == [g.tokens for g in forward] == [[4, 5], [7, 6, 7, 6]]
    assert net.network.calls == [False]  # greedy only: do_sample=False


class FakeCodec:
    eos_id, pad_id = EOS, PAD

    def encode_prompts(self, texts, fmt="raw", system_prompt=None):
        return [[BOS] + [6] * (len(t) - 1) for t in texts]

    def decode(self, ids):
        return " ".join(map(str, ids))


def test_worker_falls_back_to_the_forward_path_when_generate_fails(tmp_path):
    cfg = config_from_dict({"model": {"seq_length": 16}, "evaluate": {"batch_size": 2, "max_new_tokens": 4}})
    prompts = [{"id": "a", "set": "s", "prompt": "x", "keywords": ["7"]},
               {"id": "b", "set": "s", "prompt": "xy", "keywords": []}]
    for fail, path in ((False, "generate"), (True, "forward")):
        state = {"use_generate": True}
        net = SimpleNamespace(network=FakeGenerateModel(fail=fail))
        out = tmp_path / f"{path}.jsonl"
        res = _decode_checkpoint(net, BigramModel(), prompts, FakeCodec(), cfg, {"check_generate": True}, "ck",
                                 "raw", out, state)
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["decode_path"] for r in recs] == [path, path]
        assert [r["tokens"] for r in recs] == [[4, 5], [7, 6, 7, 6]] and res["keyword_hits"] == 0
        assert state["use_generate"] is (not fail)
        if fail:
            assert "ArgMaxExt" in state["generate_error"]
        else:
            assert state["generate_match"] == 1.0  # both paths gave the same greedy tokens
