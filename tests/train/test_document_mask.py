"""data.packing.document_mask end to end on CPU: the real data stage writes the mask, mindformers trains on it,
and in mindformers' Llama the mask stops attention at document boundaries.

One data stage (the bundled corpus, document_mask on, ~10 s) and one 3-step pretraining through the entry module
with the generated yaml (~30 s), from random weights we wrote (so the first step's loss can be recomputed here).
The in-process forwards run in PyNative (no compile); the previous execution mode is restored.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_fixtures import TINY, merge  # noqa: E402
from test_train import finish, start  # noqa: E402

from pipeline_lib.model.packing import document_attention_mask  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.train]

SEQ = TINY["model"]["seq_length"]
MASK_ON = {"data": {"packing": {"document_mask": True}}}


@pytest.fixture(scope="module")
def masked_data(tmp_path_factory):
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    root = tmp_path_factory.mktemp("doc_mask_data")
    cfg = config_from_dict(merge(merge(TINY, MASK_ON), {"run": {"output_root": str(root / "runs")}}))
    paths = RunPaths(str(root / "runs"), "data-run")
    run_stage(cfg, paths, "data", workers=1)
    data_dir = Path(paths.stage_uri("data"))
    ids = json.loads((data_dir / "tokenizer" / "tokenizer_config.json").read_text())
    return cfg, data_dir / "mindrecord" / "train", ids


def _columns(folder: Path) -> dict[str, np.ndarray]:
    from pipeline_lib.storage.mindrecord import read_mindrecord_columns

    return read_mindrecord_columns(sorted(folder.glob("*.mindrecord")), ["input_ids", "attention_mask"])


def test_data_stage_writes_the_mask_of_each_row(masked_data):
    _, train, ids = masked_data
    cols = _columns(train)
    rows, mask = cols["input_ids"], cols["attention_mask"]
    assert rows.shape[1] == SEQ + 1 and mask.shape == (len(rows), 1, SEQ, SEQ)
    np.testing.assert_array_equal(mask, document_attention_mask(rows, ids["eos_id"]))
    # the corpus' documents are short: most rows hold a boundary, i.e. the mask is not just causal
    causal = np.tril(np.full((SEQ, SEQ), 255, np.int32))
    assert np.mean([not np.array_equal(m[0], causal) for m in mask]) > 0.5


@pytest.fixture(scope="module")
def trained(masked_data, tmp_path_factory):
    """3 steps from random weights on the masked rows, in file order (no shuffle)."""
    from random_init import random_llama_params, save_params

    cfg, train, _ = masked_data
    tmp = tmp_path_factory.mktemp("doc_mask_train")
    init = random_llama_params(cfg.model, seed=3)
    base = save_params(init, tmp / "init.ckpt")
    overrides = {**MASK_ON, "model": TINY["model"], "training": {"steps": 3, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
                                         "global_batch_size": 4, "shuffle": False, "save_steps": 3}}
    run = finish(start(tmp, "pretrain", "pretrain", train, overrides, load_checkpoint=str(base)))
    return run, init


def _llama(cfg, batch: int, params: dict):
    import mindspore as ms
    from mindformers import LlamaConfig, LlamaForCausalLM

    from pipeline_lib.model.llama import llama_kwargs

    net = LlamaForCausalLM(LlamaConfig(**llama_kwargs(cfg, batch_size=batch, seq_length=SEQ, target="CPU")))
    missing, _ = ms.load_param_into_net(net, {n: ms.Parameter(ms.Tensor(v), name=n) for n, v in params.items()})
    assert not missing
    return net


def _pynative(fn):
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    try:
        return fn()
    finally:
        ms.set_context(mode=mode)


def test_training_uses_the_mask(masked_data, trained):
    """The logged loss of step 1 (the random weights, the first 4 rows) is the masked loss recomputed here, and
    differs from the loss of the same rows without the mask: the column reaches LlamaForCausalLM's attention."""
    import mindspore as ms

    cfg, train, _ = masked_data
    run, init = trained
    assert sorted(run.losses) == [1, 2, 3] and all(np.isfinite(v) for v in run.losses.values())
    cols = _columns(train)
    ids, mask = ms.Tensor(cols["input_ids"][:4]), ms.Tensor(cols["attention_mask"][:4])

    def losses():
        net = _llama(cfg, 4, init)
        net.set_train(True)
        return float(net(ids, attention_mask=mask).asnumpy().item()), float(net(ids).asnumpy().item())

    masked, unmasked = _pynative(losses)
    assert abs(run.losses[1] - masked) < 1e-4, (run.losses[1], masked, unmasked)
    assert abs(masked - unmasked) > 1e-3, (masked, unmasked)


def test_mask_stops_attention_at_the_document_boundary(masked_data, trained):
    """With the trained weights: on a packed row of the corpus, changing the first document's tokens leaves the
    logits after its EOS unchanged with the mask and changes them without; and the second document's logits
    equal those of the same tokens at the start of a row (no position reset needed: rotary is relative)."""
    import mindspore as ms

    cfg, train, ids_ = masked_data
    run, _ = trained
    params = {n: p.asnumpy() for n, p in ms.load_checkpoint(str(run.checkpoint)).items()}
    eos = ids_["eos_id"]
    rows = _columns(train)["input_ids"]
    # a row whose first EOS sits in its first half: document 1 = [0, b) (the EOS at b - 1), the rest from b
    row = next(r for r in rows if 4 < np.argmax(r[:SEQ] == eos) < SEQ // 2)
    b = int(np.argmax(row[:SEQ] == eos)) + 1
    changed = row.copy()
    changed[:b - 1] = (changed[:b - 1] + 17 - 4) % (cfg.model.vocab_size - 4) + 4  # doc 1's tokens, EOS kept
    alone = np.full_like(row, ids_["pad_id"])
    alone[:SEQ + 1 - b] = row[b:]  # document 2 onwards, at the start of a row

    def logits():
        net = _llama(cfg, 1, params)
        net.set_train(False)

        def fwd(r, masked):
            x = ms.Tensor(r[None, :SEQ])
            m = ms.Tensor(document_attention_mask(r[None], eos)) if masked else None
            return net(x, attention_mask=m)[0].asnumpy().reshape(SEQ, -1)
        return {(name, masked): fwd(r, masked) for name, r in (("row", row), ("changed", changed), ("alone", alone))
                for masked in (True, False)}

    out = _pynative(logits)
    after = slice(b, SEQ)
    on = float(np.abs(out["row", True][after] - out["changed", True][after]).max())
    off = float(np.abs(out["row", False][after] - out["changed", False][after]).max())
    assert on == 0.0, on
    assert off > 1e-3, off
    shifted = float(np.abs(out["row", True][after] - out["alone", True][:SEQ - b]).max())
    assert shifted < 1e-3, shifted
    # document 1 itself: the mask is causal attention there
    np.testing.assert_allclose(out["row", True][:b], out["row", False][:b], atol=1e-4)
