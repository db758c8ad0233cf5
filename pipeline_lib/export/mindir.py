"""MindIR export of the merged model, its reload, and the logits comparisons the export stage gates on.

What: `fixed_inputs` (deterministic right-padded token rows, pad never used as a real token),
`compare_logits` (max abs / rel difference under rtol/atol, raising LogitsMismatch when over),
`export_mindir` (mindspore.export of the LogitsCell with one fixed [batch, seq_length] int32 input;
output: float32 logits [batch, seq_length, vocab]) and `reload_logits` (mindspore.load +
nn.GraphCell, the way a serving side runs it). `serving_spec` is the json a serving side reads.

Limits: one fixed input shape (no dynamic batch or length), no KV cache: a server decodes by
re-running the whole window and reading the logits at each row's last real position (as
pipeline_lib.evaluate.decoding does). Only MindSpore-importing processes (the export worker) call
export_mindir / reload_logits.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

MINDIR_NAME = "model.mindir"
SERVING_JSON = "serving.json"


class LogitsMismatch(RuntimeError):
    """Two models that must agree give different logits on the same inputs."""


@dataclass
class LogitsDiff:
    what: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool
    same_argmax: float  # share of positions with the same argmax token

    def to_json(self) -> dict:
        return dict(self.__dict__)


def fixed_inputs(batch_size: int, seq_length: int, vocab_size: int, pad_id: int, seed: int = 0) -> np.ndarray:
    """Rows of random real tokens (ids != pad_id, < vocab_size), right-padded to different lengths."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch_size, seq_length), pad_id, dtype=np.int32)
    real = np.array([t for t in range(vocab_size) if t != pad_id], dtype=np.int32)
    for i in range(batch_size):
        n = seq_length if i == 0 else int(rng.integers(max(1, seq_length // 4), seq_length + 1))
        ids[i, :n] = rng.choice(real, size=n)
    return ids


def compare_logits(expected: np.ndarray, got: np.ndarray, *, rtol: float, atol: float, what: str,
                   raise_on_mismatch: bool = True) -> LogitsDiff:
    """Element-wise |got - expected| <= atol + rtol * |expected| everywhere, numpy.allclose style."""
    expected = np.asarray(expected, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if expected.shape != got.shape:
        raise LogitsMismatch(f"{what}: logits shapes differ, {expected.shape} vs {got.shape}")
    diff = np.abs(got - expected)
    finite = bool(np.isfinite(got).all() and np.isfinite(expected).all())
    ok = finite and bool(np.all(diff <= atol + rtol * np.abs(expected)))
    res = LogitsDiff(what=what, max_abs=float(diff.max()), max_rel=float((diff / (np.abs(expected) + 1e-12)).max()),
                     rtol=rtol, atol=atol, ok=ok,
                     same_argmax=float(np.mean(expected.argmax(-1) == got.argmax(-1))))
    if not ok and raise_on_mismatch:
        raise LogitsMismatch(f"{what}: logits differ beyond rtol={rtol} atol={atol} (max abs diff "
                             f"{res.max_abs:.3g}, finite={finite}, same argmax {res.same_argmax:.1%}); "
                             "the stage stops here (tolerances: export.rtol / export.atol)")
    return res


def export_mindir(net, inputs: np.ndarray, out_dir: str | Path) -> Path:
    """mindspore.export(net, inputs) as MINDIR -> <out_dir>/model.mindir."""
    import mindspore as ms

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / Path(MINDIR_NAME).stem
    ms.export(net, ms.Tensor(np.asarray(inputs, dtype=np.int32)), file_name=str(stem), file_format="MINDIR")
    path = out_dir / MINDIR_NAME
    if not path.is_file():
        raise RuntimeError(f"mindspore.export wrote no {path}; see the MindSpore log under MS_OM_PATH")
    return path


def reload_logits(mindir_path: str | Path, inputs: np.ndarray) -> np.ndarray:
    """Run the exported graph the way a serving side does: mindspore.load + nn.GraphCell."""
    import mindspore as ms
    from mindspore import nn

    cell = nn.GraphCell(ms.load(str(mindir_path)))
    out = cell(ms.Tensor(np.asarray(inputs, dtype=np.int32)))
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.asnumpy()


def serving_spec(cfg, *, batch_size: int, seq_length: int, tokenizer_file: str | None, checks: dict,
                 sources: dict, token_ids=None) -> dict:
    """What a serving side needs: shapes, dtypes, special ids, how to decode, and where it came from.

    `token_ids` (model.token_ids.TokenIds): the tokenizer's ids; None means configured_ids(cfg.tokenizer)."""
    from ..model.token_ids import configured_ids

    m, tok = cfg.model, token_ids or configured_ids(cfg.tokenizer)
    return {
        "format": "MINDIR",
        "file": MINDIR_NAME,
        "inputs": [{"name": "input_ids", "dtype": "int32", "shape": [batch_size, seq_length],
                    "padding": "right", "pad_id": tok.pad_id}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [batch_size, seq_length, m.vocab_size]}],
        "batch_size": batch_size,
        "seq_length": seq_length,
        "vocab_size": m.vocab_size,
        "special_ids": {"pad": tok.pad_id, "unk": tok.unk_id, "bos": tok.bos_id, "eos": tok.eos_id},
        "tokenizer": tokenizer_file,
        "decoding": "feed [batch_size, seq_length] right-padded ids; the next token of a row comes from the "
                    "logits at its last real position; no KV cache (the whole window is re-run each step)",
        "model": {k: getattr(m, k) for k in ("name", "hidden_size", "num_layers", "num_heads", "n_kv_heads",
                                             "intermediate_size", "compute_dtype", "param_init_type")},
        "checks": checks,
        "sources": sources,
    }
