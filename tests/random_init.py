"""Random-init checkpoints (mindformers' Llama names) and a tiny tokenizer: smoke tests of the serving path.

What: `random_llama_params` fills the parameters of shapes.llama_param_shapes (checked by loading
them strictly into the built model)
(embeddings N(0, 0.5), matrices N(0, 0.2), norms 1) and `random_lora_params` adds LoRA factors
with a NON-zero B (a freshly initialised adapter has B = 0, which would make any merge look right).
`save_params` writes a .ckpt (imports MindSpore). `tiny_tokenizer` trains a small sentencepiece BPE
with the pipeline's id conventions (pad 0 as a control piece, unk/bos/eos from TokenizerConfig).

Limits: float32 only; for tests and for checking an export/serving chain without a trained model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline_lib.model.lora_merge import LORA_A, LORA_B
from pipeline_lib.model.shapes import llama_param_shapes


def random_llama_params(m, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in llama_param_shapes(m).items():
        if name.endswith("norm.weight") or name.endswith("norm_out.weight"):
            out[name] = np.ones(shape, np.float32)
        else:
            std = 0.5 if "embedding" in name else 0.2
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def random_lora_params(base: dict[str, np.ndarray], target_modules: list[str], rank: int, seed: int = 1,
                       std: float = 0.1) -> dict[str, np.ndarray]:
    """lora_a [rank, in] and lora_b [out, rank] (both non-zero) for every base `<...>.<target>.weight`."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, w in sorted(base.items()):
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix is None or prefix.rsplit(".", 1)[-1] not in target_modules or w.ndim != 2:
            continue
        out[prefix + LORA_A] = (rng.standard_normal((rank, w.shape[1])) * std).astype(np.float32)
        out[prefix + LORA_B] = (rng.standard_normal((w.shape[0], rank)) * std).astype(np.float32)
    return out


def save_params(params: dict[str, np.ndarray], path: str | Path) -> Path:
    import mindspore as ms

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in params.items()], str(path))
    return path


def tiny_tokenizer(texts: list[str], out_dir: str | Path, tokenizer_cfg, vocab_size: int = 600) -> Path:
    """Train `<out_dir>/tokenizer.model` on `texts` (byte fallback, the config's ids and special tokens)."""
    import io

    import sentencepiece as spm

    from pipeline_lib.model.token_ids import trained_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t for t in texts if t.strip()]), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, hard_vocab_limit=False, byte_fallback=True, character_coverage=1.0,
        user_defined_symbols=list(tokenizer_cfg.special_tokens), pad_piece="<pad>",
        normalization_rule_name="identity", remove_extra_whitespaces=False, minloglevel=2, num_threads=1,
        **trained_ids(tokenizer_cfg))
    path = out_dir / "tokenizer.model"
    path.write_bytes(model.getvalue())
    return path
