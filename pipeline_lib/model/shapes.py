"""The parameters of the pipeline's Llama (mindformers 1.9 LlamaForCausalLM names): one table.

Every weight is written [out, in] (mindformers Linear, transpose_b=True). Shapes are given by the
symbolic dimensions below, each tied to the config field(s) that set it, so a check can name the
field to change. Users: the tests' random checkpoints (tests/random_init.py), model.hf (HF <-> mindformers
shape checks), train.adapter (LoRA factor shapes), planner.params (parameter counts).
`m` is anything with vocab_size, hidden_size, num_layers, num_heads, kv_heads, intermediate_size and
tie_word_embeddings (config.schema.ModelConfig, planner.params.ModelShape).
The order (per layer: norms, attention, FFN) is the order mindformers lists them and the order
random_init draws them in.
"""
from __future__ import annotations

DIM_FIELDS = {
    "vocab": "model.vocab_size",
    "hidden": "model.hidden_size",
    "q_out": "model.num_heads x head_dim (model.hidden_size / model.num_heads)",
    "kv_out": "model.n_kv_heads x head_dim (model.hidden_size / model.num_heads)",
    "inter": "model.intermediate_size",
}

EMBEDDING = "model.tok_embeddings.embedding_weight"
FINAL_NORM = "model.norm_out.weight"
LM_HEAD = "lm_head.weight"  # absent with tie_word_embeddings

# per layer, under model.layers.<i>.
LAYER = {
    "ffn_norm.weight": ("hidden",),
    "attention_norm.weight": ("hidden",),
    "attention.wq.weight": ("q_out", "hidden"),
    "attention.wk.weight": ("kv_out", "hidden"),
    "attention.wv.weight": ("kv_out", "hidden"),
    "attention.wo.weight": ("hidden", "q_out"),
    "feed_forward.w1.weight": ("inter", "hidden"),
    "feed_forward.w2.weight": ("hidden", "inter"),
    "feed_forward.w3.weight": ("inter", "hidden"),
}
TOP = {EMBEDDING: ("vocab", "hidden"), FINAL_NORM: ("hidden",), LM_HEAD: ("vocab", "hidden")}

# LoRA target name (sft.target_modules) -> module path inside a layer
PROJECTIONS = {k.split(".")[1]: k[: -len(".weight")] for k in LAYER if k.startswith(("attention.w", "feed_forward."))}


def dims(m) -> dict[str, int]:
    head_dim = m.hidden_size // m.num_heads
    return {"vocab": m.vocab_size, "hidden": m.hidden_size, "q_out": m.num_heads * head_dim,
            "kv_out": m.kv_heads * head_dim, "inter": m.intermediate_size}


def symbolic_shapes(m) -> dict[str, tuple[str, ...]]:
    """name -> dimension symbols of every parameter of the model `m`, in mindformers' order."""
    out = {EMBEDDING: TOP[EMBEDDING]}
    for i in range(m.num_layers):
        out.update({f"model.layers.{i}.{k}": v for k, v in LAYER.items()})
    out[FINAL_NORM] = TOP[FINAL_NORM]
    if not m.tie_word_embeddings:
        out[LM_HEAD] = TOP[LM_HEAD]
    return out


def llama_param_shapes(m) -> dict[str, tuple[int, ...]]:
    """name -> shape of every LlamaForCausalLM parameter of the model `m`."""
    d = dims(m)
    return {name: tuple(d[s] for s in symbols) for name, symbols in symbolic_shapes(m).items()}


def layer_numel(m, prefix: str) -> int:
    """Number of values in one layer's parameters whose name starts with `prefix` ("attention.", "feed_forward.", ...)."""
    d = dims(m)
    total = 0
    for name, symbols in LAYER.items():
        if name.startswith(prefix):
            n = 1
            for s in symbols:
                n *= d[s]
            total += n
    return total


def projection_dims(m, target: str) -> tuple[int, int] | None:
    """(in, out) features of the Llama projection `target` (wq, wk, wv, wo, w1, w2, w3); None if unknown."""
    if target not in PROJECTIONS:
        return None
    d = dims(m)
    out_sym, in_sym = LAYER[PROJECTIONS[target] + ".weight"]
    return d[in_sym], d[out_sym]
