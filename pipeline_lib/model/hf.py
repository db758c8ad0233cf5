"""Hugging Face Llama safetensors <-> mindformers 1.9 Llama checkpoints, without torch.

What:
- `check_hf_folder(folder, model_cfg)`: reads config.json and the safetensors headers only (no tensor data) and
  refuses, before anything is launched, a checkpoint that does not fit `model.*`: each message names the tensor or
  config.json key, both values/shapes and the config field to change.
- `hf_to_mindformers(tensors, model_cfg)` / `mindformers_to_hf(params, model_cfg)`: pure numpy name mapping with
  shape checks; a round trip gives the same tensors. `convert_hf_to_mindformers(folder, out.ckpt, model_cfg)` and
  `export_mindformers_to_hf(ckpt, out_folder, model_cfg)` do the file I/O (the MindSpore part in a subprocess: the
  orchestrating process never holds MindSpore state). Tensors are read with `safetensors.numpy` (BF16, which numpy
  lacks, is widened to float32 from the raw bytes) and written in model.param_init_type.

Names (mindformers 1.9 `LlamaForCausalLM.get_parameters()`, listed on a tiny model; the test checks them again):
    model.embed_tokens.weight                    -> model.tok_embeddings.embedding_weight
    model.layers.N.self_attn.{q,k,v,o}_proj.weight -> model.layers.N.attention.w{q,k,v,o}.weight
    model.layers.N.mlp.{gate,down,up}_proj.weight  -> model.layers.N.feed_forward.w{1,2,3}.weight
    model.layers.N.input_layernorm.weight        -> model.layers.N.attention_norm.weight
    model.layers.N.post_attention_layernorm.weight -> model.layers.N.ffn_norm.weight
    model.norm.weight                            -> model.norm_out.weight
    lm_head.weight                               -> lm_head.weight   (absent on both sides when tied)
Linear weights are [out, in] on both sides (mindformers' Linear uses transpose_b), so they are copied as they are.

Rotary layout (why wq/wk are NOT permuted for HF checkpoints): mindformers' RotaryEmbedding builds
cos/sin from concat(freqs, freqs) and rotates with a swap matrix [[0, I], [-I, 0]] (or `slice_half`, the
`use_rope_slice` path the CPU runs), i.e. x -> concat(-x2, x1) over the two HALVES of each head: the same
"half-split" layout as transformers' `rotate_half`. Meta's original checkpoints pair interleaved dimensions
(2i, 2i+1); transformers' converter permutes wq/wk once into the half-split layout, and mindformers' Meta
converter applies the same permutation. So HF -> mindformers is the identity on wq/wk; `rope_layout="interleaved"`
(a Meta-layout checkpoint stored under HF names) applies `interleaved_to_half`. The test proves it numerically:
mindformers logits of a converted random checkpoint equal a numpy transcription of transformers' Llama forward.

Limits: plain Llama (no attention/MLP bias, rope_theta 10000 without rope_scaling: the generated yaml keeps
mindformers' default theta, hidden_act silu). Raises HFImportError (a ValueError) with the fix.
"""
from __future__ import annotations

import json
import os
import re
import struct
import sys
from pathlib import Path
from typing import Literal

import numpy as np

from . import shapes as llama_shapes
from ..runtime.launcher import launch_module

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# per-layer HF suffix -> mindformers suffix
_LAYER_MAP = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_TOP_MAP = {
    "model.embed_tokens.weight": "model.tok_embeddings.embedding_weight",
    "model.norm.weight": "model.norm_out.weight",
    "lm_head.weight": "lm_head.weight",
}
_REVERSE_LAYER = {v: k for k, v in _LAYER_MAP.items()}
_REVERSE_TOP = {v: k for k, v in _TOP_MAP.items()}


class HFImportError(ValueError):
    """A Hugging Face checkpoint that does not fit the pipeline's model config (the message says what to change)."""


# ---------------------------------------------------------------- names

def hf_to_mf_name(name: str) -> str | None:
    """mindformers name of an HF Llama tensor; None for buffers that are not weights (rotary inv_freq)."""
    if _IGNORED.match(name):
        return None
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _LAYER_MAP:
        return f"model.layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    raise HFImportError(f"tensor {name!r} is not part of a plain Llama (no bias, no extra modules): this importer "
                        "maps embed_tokens, self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, the two layer norms, "
                        "norm and lm_head")


def mf_to_hf_name(name: str) -> str | None:
    """HF name of a mindformers Llama parameter; None for optimizer state and training bookkeeping."""
    if name in _REVERSE_TOP:
        return _REVERSE_TOP[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _REVERSE_LAYER:
        return f"model.layers.{m.group(1)}.{_REVERSE_LAYER[m.group(2)]}"
    return None


# ---------------------------------------------------------------- expected shapes

def _check_heads(model_cfg) -> None:
    m = model_cfg
    if m.hidden_size % m.num_heads:
        raise HFImportError(f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")


def expected_mf_shapes(model_cfg) -> dict[str, tuple[int, ...]]:
    """mindformers parameter name -> shape for model.* (lm_head only when embeddings are untied)."""
    return {name: shape for name, (shape, _) in _expected(model_cfg).items()}


def _expected(model_cfg) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """name -> (shape, the config field behind each dimension), from the one table in model.shapes."""
    _check_heads(model_cfg)
    d = llama_shapes.dims(model_cfg)
    return {name: (tuple(d[s] for s in symbols), tuple(llama_shapes.DIM_FIELDS[s] for s in symbols))
            for name, symbols in llama_shapes.symbolic_shapes(model_cfg).items()}


def _check_shape(name: str, hf_name: str, shape: tuple[int, ...], expected) -> None:
    want, fields = expected
    if tuple(shape) == want:
        return
    wrong = [f for i, f in enumerate(fields) if i >= len(shape) or shape[i] != want[i]] or list(fields)
    raise HFImportError(f"tensor {hf_name} (mindformers {name}) has shape {tuple(shape)} but model.* expects {want}: "
                        f"set {' and '.join(dict.fromkeys(wrong))} to match the checkpoint (or use a checkpoint of "
                        "this model's size)")


# ---------------------------------------------------------------- rotary layout

def interleaved_to_half(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a q/k projection from the interleaved rotary layout (pairs 2i, 2i+1) to the half-split layout."""
    out, cols = w.shape
    hd = out // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).transpose(0, 2, 1, 3).reshape(out, cols)


def half_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of interleaved_to_half."""
    out, cols = w.shape
    hd = out // n_heads
    return w.reshape(n_heads, 2, hd // 2, cols).transpose(0, 2, 1, 3).reshape(out, cols)


# ---------------------------------------------------------------- config.json

def read_hf_config(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise HFImportError(f"model.hf_checkpoint={str(folder)!r}: no {CONFIG_FILE} in it; point model.hf_checkpoint "
                            "at a Hugging Face Llama folder (config.json + model.safetensors)")
    try:
        if path.stat().st_size > 1 << 20:  # a config.json is a few KB
            raise ValueError("larger than 1 MiB")
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:
        raise HFImportError(f"model.hf_checkpoint={str(folder)!r}: its {CONFIG_FILE} is not a model config "
                            f"({type(err).__name__}: {str(err)[:200]}); re-download the checkpoint") from None
    if not isinstance(hf, dict):
        raise HFImportError(f"model.hf_checkpoint={str(folder)!r}: its {CONFIG_FILE} is not a JSON object; "
                            "re-download the checkpoint")
    return hf


def check_hf_config(hf: dict, model_cfg) -> None:
    """Refuse a config.json that describes another model than model.* (all mismatches in one message)."""
    m = model_cfg
    heads = hf.get("num_attention_heads")
    pairs = [("hidden_size", m.hidden_size, "model.hidden_size"),
             ("num_hidden_layers", m.num_layers, "model.num_layers"),
             ("num_attention_heads", m.num_heads, "model.num_heads"),
             ("num_key_value_heads", m.kv_heads, "model.n_kv_heads"),
             ("intermediate_size", m.intermediate_size, "model.intermediate_size"),
             ("vocab_size", m.vocab_size, "model.vocab_size"),
             ("tie_word_embeddings", m.tie_word_embeddings, "model.tie_word_embeddings")]
    defaults = {"num_key_value_heads": heads, "tie_word_embeddings": False}
    problems = []
    for key, ours, field in pairs:
        theirs = hf.get(key, defaults.get(key))
        if theirs != ours:
            problems.append(f"config.json {key}={theirs!r} but {field}={ours!r}: set {field}: {theirs!r}")
    eps = hf.get("rms_norm_eps", 1e-6)
    if not np.isclose(eps, m.rms_norm_eps, rtol=1e-6, atol=0):
        problems.append(f"config.json rms_norm_eps={eps!r} but model.rms_norm_eps={m.rms_norm_eps!r}: "
                        f"set model.rms_norm_eps: {eps!r}")
    theta = hf.get("rope_theta", 10000.0)
    if float(theta) != 10000.0 or hf.get("rope_scaling"):
        problems.append(f"config.json rope_theta={theta!r} rope_scaling={hf.get('rope_scaling')!r}: the generated "
                        "mindformers yaml uses theta 10000 without scaling; this checkpoint needs a model config with "
                        "its theta (not supported by this importer)")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            problems.append(f"config.json {key}=true: biases are not part of mindformers' Llama")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"config.json hidden_act={hf.get('hidden_act')!r}: mindformers' Llama uses silu (SwiGLU)")
    if hf.get("head_dim") not in (None, m.hidden_size // m.num_heads):
        problems.append(f"config.json head_dim={hf['head_dim']} differs from model.hidden_size / model.num_heads = "
                        f"{m.hidden_size // m.num_heads}: not supported")
    if problems:
        raise HFImportError("the Hugging Face checkpoint does not match model.*:\n- " + "\n- ".join(problems))


def hf_config_for(model_cfg, torch_dtype: str = "float32") -> dict:
    """A transformers LlamaConfig dict (config.json) describing model.*."""
    m = model_cfg
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
            "num_attention_heads": m.num_heads, "num_hidden_layers": m.num_layers,
            "num_key_value_heads": m.kv_heads, "vocab_size": m.vocab_size, "rms_norm_eps": m.rms_norm_eps,
            "tie_word_embeddings": m.tie_word_embeddings, "rope_theta": 10000.0, "rope_scaling": None,
            "max_position_embeddings": m.seq_length, "attention_bias": False, "mlp_bias": False,
            "torch_dtype": torch_dtype}


# ---------------------------------------------------------------- safetensors

def _files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [folder / n for n in names]
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise HFImportError(f"model.hf_checkpoint={str(folder)!r}: no {SINGLE_FILE}, {INDEX_FILE} or *.safetensors "
                            "in it")
    return found


MAX_HEADER = 100_000_000  # the safetensors format's own limit on its JSON header


def _header(path: Path) -> tuple[dict, int]:
    """The safetensors JSON header of `path` and the byte offset where tensor data starts; HFImportError naming the
    file for a header that is not one (a length of 2^62 was read whole: MemoryError)."""
    def bad(problem: str) -> HFImportError:
        return HFImportError(f"model.hf_checkpoint: {path}: not a safetensors file ({problem}); re-download or "
                             "re-export the checkpoint")

    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        first = fh.read(8)
        if len(first) < 8:
            raise bad("shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", first)
        if n > min(MAX_HEADER, size - 8):
            raise bad(f"its header length {n:,} is beyond the file ({size:,} bytes) or the format's "
                      f"{MAX_HEADER:,}-byte limit")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, RecursionError) as err:
            raise bad(f"its header is not JSON: {type(err).__name__}") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    header.pop("__metadata__", None)
    for name, info in header.items():
        if not (isinstance(info, dict) and isinstance(info.get("shape"), list) and isinstance(info.get("dtype"), str)
                and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2):
            raise bad(f"tensor {name[:100]!r} has no shape, dtype and data_offsets")
    return header, 8 + n


def read_hf_shapes(folder: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF tensor name -> (shape, safetensors dtype), from the file headers only."""
    out = {}
    for path in _files(Path(folder)):
        header, _ = _header(path)
        for name, info in header.items():
            out[name] = (tuple(info["shape"]), info["dtype"])
    return out


def load_hf_tensors(folder: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder as numpy (safetensors.numpy; BF16 widened to float32 from the raw bytes)."""
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for path in _files(Path(folder)):
        header, start = _header(path)
        if not any(info["dtype"] == "BF16" for info in header.values()):
            out.update(load_file(str(path)))
            continue
        with open(path, "rb") as fh:
            for name, info in header.items():
                begin, end = info["data_offsets"]
                fh.seek(start + begin)
                raw = fh.read(end - begin)
                if info["dtype"] == "BF16":
                    arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
                else:
                    from safetensors.numpy import _getdtype

                    arr = np.frombuffer(raw, _getdtype(info["dtype"]))
                out[name] = arr.reshape(info["shape"]).copy()
    return out


def check_hf_folder(folder: str | Path, model_cfg) -> dict:
    """Fast check (config.json + headers): raises HFImportError; returns a summary for the manifest."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HFImportError(f"model.hf_checkpoint={str(folder)!r}: no such folder; point it at a Hugging Face Llama "
                            "folder (config.json + model.safetensors) or set it to null")
    check_hf_config(read_hf_config(folder), model_cfg)
    shapes = read_hf_shapes(folder)
    _map_names({k: v[0] for k, v in shapes.items()}, model_cfg)
    return {"tensors": len(shapes), "dtypes": sorted({d for _, d in shapes.values()}),
            "files": [p.name for p in _files(folder)]}


# ---------------------------------------------------------------- mapping

def _map_names(shapes: dict[str, tuple[int, ...]], model_cfg) -> dict[str, str]:
    """HF name -> mindformers name for every weight, after checking names, tying and shapes."""
    expected = _expected(model_cfg)
    tied = model_cfg.tie_word_embeddings
    order = {name: i for i, name in enumerate(expected)}
    named = [(hf_to_mf_name(hf_name), hf_name, shape) for hf_name, shape in shapes.items()]
    # model order (embedding, layer 0 q k v o gate down up norms, ...): the first problem reported is stable
    named.sort(key=lambda x: (order.get(x[0], -1), x[1]))
    mapping = {}
    for mf, hf_name, shape in named:
        if mf is None:
            continue
        if mf == "lm_head.weight" and tied:
            continue  # a tied checkpoint may still carry the (shared) head; mindformers has none
        if mf not in expected:
            raise HFImportError(f"tensor {hf_name} (mindformers {mf}) does not exist in a model of "
                                f"model.num_layers={model_cfg.num_layers}: set model.num_layers to the checkpoint's")
        _check_shape(mf, hf_name, shape, expected[mf])
        mapping[hf_name] = mf
    missing = sorted(set(expected) - set(mapping.values()))
    if missing:
        hint = (" (the checkpoint has tied embeddings: set model.tie_word_embeddings: true)"
                if missing == ["lm_head.weight"] else "")
        raise HFImportError(f"the Hugging Face checkpoint lacks {len(missing)} tensor(s) of the mindformers model, "
                            f"e.g. {[mf_to_hf_name(n) or n for n in missing[:5]]}{hint}")
    return mapping


def hf_to_mindformers(tensors: dict[str, np.ndarray], model_cfg,
                      rope_layout: Literal["half", "interleaved"] = "half") -> dict[str, np.ndarray]:
    """mindformers parameters from HF tensors (shapes checked against model.*; see the module docstring)."""
    if rope_layout not in ("half", "interleaved"):
        raise HFImportError(f"rope_layout={rope_layout!r}: must be 'half' (Hugging Face) or 'interleaved' (Meta)")
    mapping = _map_names({k: tuple(v.shape) for k, v in tensors.items()}, model_cfg)
    out = {}
    for hf_name, mf in mapping.items():
        w = tensors[hf_name]
        if rope_layout == "interleaved" and mf.endswith(("attention.wq.weight", "attention.wk.weight")):
            heads = model_cfg.num_heads if mf.endswith("wq.weight") else model_cfg.kv_heads
            w = interleaved_to_half(w, heads)
        out[mf] = w
    return out


def mindformers_to_hf(params: dict[str, np.ndarray], model_cfg) -> dict[str, np.ndarray]:
    """HF tensors from mindformers parameters (optimizer state and bookkeeping are dropped; shapes checked)."""
    expected = _expected(model_cfg)
    out = {}
    for mf, value in params.items():
        hf_name = mf_to_hf_name(mf)
        if hf_name is None:
            continue
        if mf not in expected:
            raise HFImportError(f"parameter {mf} does not exist in a model of model.num_layers={model_cfg.num_layers}"
                                f"{' with tied embeddings' if model_cfg.tie_word_embeddings else ''}")
        _check_shape(mf, hf_name, tuple(value.shape), expected[mf])
        out[hf_name] = np.ascontiguousarray(value)
    missing = sorted(set(expected) - {hf_to_mf_name(n) for n in out})
    if missing:
        raise HFImportError(f"the mindformers checkpoint lacks {missing[:5]}: is it a checkpoint of this model.*?")
    return out


# ---------------------------------------------------------------- file conversion (MindSpore in a subprocess)

def _run_tool(args: list[str], workdir: Path) -> None:
    result = launch_module("pipeline_lib.model.hf", args, cwd=workdir, timeout_s=3600, log_dir=workdir / "log")
    if not result.ok:
        last = (result.tail or ["(no output)"])[-1]
        raise HFImportError(f"pipeline_lib.model.hf {args[0]} failed: {last}\n" + result.describe(args[0]))


def convert_hf_to_mindformers(folder: str | Path, out_ckpt: str | Path, model_cfg,
                              rope_layout: Literal["half", "interleaved"] = "half") -> Path:
    """Write the mindformers .ckpt of an HF Llama folder (checked first); returns its path."""
    check_hf_folder(folder, model_cfg)
    out_ckpt = Path(out_ckpt).resolve()
    out_ckpt.parent.mkdir(parents=True, exist_ok=True)
    _run_tool(["to-mindformers", str(Path(folder).resolve()), str(out_ckpt), model_cfg.model_dump_json(),
               rope_layout], out_ckpt.parent)
    return out_ckpt


def export_mindformers_to_hf(ckpt: str | Path, out_folder: str | Path, model_cfg,
                             dtype: Literal["float32", "float16"] = "float32") -> Path:
    """Write model.safetensors + config.json (HF names) of a mindformers checkpoint; returns the folder."""
    out_folder = Path(out_folder).resolve()
    out_folder.mkdir(parents=True, exist_ok=True)
    _run_tool(["to-hf", str(Path(ckpt).resolve()), str(out_folder), model_cfg.model_dump_json(), dtype], out_folder)
    return out_folder


def _model_cfg(text: str):
    from ..config.schema import ModelConfig

    return ModelConfig.model_validate_json(text)


def _to_mindformers_main(folder: str, out: str, model_json: str, rope_layout: str) -> None:
    import mindspore as ms

    cfg = _model_cfg(model_json)
    params = hf_to_mindformers(load_hf_tensors(folder), cfg, rope_layout)  # type: ignore[arg-type]
    dtype = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}[cfg.param_init_type]
    items = [{"name": n, "data": ms.Tensor(np.asarray(v, np.float32), dtype=dtype)} for n, v in params.items()]
    tmp = out + ".tmp.ckpt"
    ms.save_checkpoint(items, tmp)
    os.replace(tmp, out)
    print(f"wrote {len(items)} parameters to {out}", flush=True)


def write_hf_folder(params: dict[str, np.ndarray], folder: str | Path, model_cfg, dtype: str = "float32") -> Path:
    """model.safetensors + config.json (HF names) of mindformers-named numpy `params` (optimizer state and
    other non-model entries are ignored); the safetensors file appears complete or not at all."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = {n: np.asarray(v, np.float32) for n, v in params.items() if mf_to_hf_name(n) is not None}
    tensors = {k: v.astype(dtype) for k, v in mindformers_to_hf(params, model_cfg).items()}
    tmp = folder / (".tmp-" + SINGLE_FILE)
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / SINGLE_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config_for(model_cfg, dtype), indent=2), encoding="utf-8")
    return folder


def _to_hf_main(ckpt: str, folder: str, model_json: str, dtype: str) -> None:
    import mindspore as ms

    cfg = _model_cfg(model_json)
    raw = ms.load_checkpoint(ckpt)
    params = {n: ms.ops.cast(p, ms.float32).asnumpy() for n, p in raw.items() if mf_to_hf_name(n) is not None}
    write_hf_folder(params, folder, cfg, dtype)
    print(f"wrote {len(params)} tensors to {folder}", flush=True)


if __name__ == "__main__":
    usage = ("usage: python -m pipeline_lib.model.hf to-mindformers HF_DIR OUT.ckpt MODEL_JSON [half|interleaved]\n"
             "       python -m pipeline_lib.model.hf to-hf CKPT OUT_DIR MODEL_JSON [float32|float16]")
    if len(sys.argv) == 6 and sys.argv[1] == "to-mindformers":
        _to_mindformers_main(*sys.argv[2:6])
    elif len(sys.argv) == 6 and sys.argv[1] == "to-hf":
        _to_hf_main(*sys.argv[2:6])
    else:
        sys.exit(usage)
