"""Parameter count of a Llama-style decoder, by component.

What it counts: token embedding (vocab x hidden), per layer the attention projections with
grouped KV heads (wq, wo: hidden x hidden; wk, wv: hidden x kv_heads*head_dim), the SwiGLU FFN
(w1, w3: hidden x ffn; w2: ffn x hidden), two RMSNorm weights per layer, the final norm, and the
output head (vocab x hidden, absent when tied to the embedding).
The per-layer weights come from the one Llama parameter table, pipeline_lib.model.shapes.
Limits: no biases (Llama has none), no rotary parameters (RoPE has none), no LoRA adapters, no MoE.
Checked against the published shapes: Llama-2 7B = 6,738,415,616 and Llama-2 70B = 68,976,648,192.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config.schema import ModelConfig
from ..model.shapes import layer_numel


@dataclass(frozen=True)
class ModelShape:
    """The plain numbers the arithmetic needs; build it from a ModelConfig or by hand."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    kv_heads: int
    intermediate_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, model: ModelConfig) -> "ModelShape":
        return cls(model.vocab_size, model.hidden_size, model.num_layers, model.num_heads, model.kv_heads,
                   model.intermediate_size, model.tie_word_embeddings)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def attention_params(shape: ModelShape) -> int:
    """wq + wo are hidden x hidden; wk + wv shrink with grouped-query attention."""
    return layer_numel(shape, "attention.")


def ffn_params(shape: ModelShape) -> int:
    """SwiGLU: gate (w1), up (w3) and down (w2) projections."""
    return layer_numel(shape, "feed_forward.")


def layer_norm_params(shape: ModelShape) -> int:
    """RMSNorm before attention and before the FFN: one weight vector each, no bias."""
    return layer_numel(shape, "attention_norm.") + layer_numel(shape, "ffn_norm.")


def layer_params(shape: ModelShape) -> int:
    return attention_params(shape) + ffn_params(shape) + layer_norm_params(shape)


@dataclass(frozen=True)
class ParamCount:
    embedding: int
    attention: int
    ffn: int
    norms: int
    output_head: int
    per_layer: int

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.ffn + self.norms + self.output_head

    @property
    def matmul(self) -> int:
        """Parameters that take part in a matmul (everything but the lookup table and the norms).

        With tied embeddings the shared matrix still multiplies in the output head, so it counts.
        """
        head = self.output_head or self.embedding
        return self.attention + self.ffn + head

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def count_params(model: ModelShape | ModelConfig) -> ParamCount:
    shape = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
    emb = shape.vocab_size * shape.hidden_size
    return ParamCount(
        embedding=emb,
        attention=shape.num_layers * attention_params(shape),
        ffn=shape.num_layers * ffn_params(shape),
        # per-layer norms plus the final norm before the output head
        norms=shape.num_layers * layer_norm_params(shape) + shape.hidden_size,
        output_head=0 if shape.tie_word_embeddings else emb,
        per_layer=layer_params(shape),
    )


def largest_module_params(shape: ModelShape) -> int:
    """The largest single weight matrix: what DeepSpeed's ZeRO-3 estimate calls the largest layer."""
    h = shape.hidden_size
    return max(shape.vocab_size * h, h * shape.intermediate_size, h * h)


def stage_params(shape: ModelShape, *, pipeline_stage: int, model_parallel: int, stage: int, offset=0,
                 interleave: int = 1) -> int:
    """Parameters held by one device of pipeline stage `stage` (0-based).

    Layers are split as evenly as possible, the first stages taking the remainder. The embedding
    lives on the first stage and the output head + final norm on the last (with tied embeddings
    and pp > 1 both ends hold a copy, as Megatron does). Matmul weights and the embedding are
    split over the tensor-parallel group (vocab-parallel embedding); norm weights are replicated.
    """
    pp, t, h = pipeline_stage, model_parallel, shape.hidden_size
    layers = layers_on_stage(shape.num_layers, pp, stage, offset, interleave)
    matmul = layers * (attention_params(shape) + ffn_params(shape))
    norms = layers * layer_norm_params(shape)
    emb = shape.vocab_size * h
    first, last = stage == 0, stage == pp - 1
    if first:
        matmul += emb
    if last:
        norms += h
        if not shape.tie_word_embeddings or pp > 1:
            matmul += emb
    return -(-matmul // t) + norms


def layers_on_stage(num_layers: int, pipeline_stage: int, stage: int, offset=0, interleave: int = 1) -> int:
    """Layers of pipeline stage `stage`. offset 0: as even as possible, the first stages taking the remainder;
    else mindformers' rule (LayerSetting): num_layers // (pp x interleave) + offset per stage and chunk."""
    if offset == 0 or offset is None or pipeline_stage * interleave <= 1:
        base, extra = divmod(num_layers, pipeline_stage)
        return base + (1 if stage < extra else 0)
    return stage_layer_counts(num_layers, pipeline_stage, offset, interleave)[stage]


def offset_rows(offset, pipeline_stage: int, interleave: int = 1) -> list[list[int]]:
    """parallel.pipeline_offset as one row per interleave chunk (an int or one list is broadcast, as numpy does)."""
    if isinstance(offset, int):
        return [[offset] * pipeline_stage for _ in range(interleave)]
    if offset and isinstance(offset[0], list):
        return [list(row) for row in offset]
    return [list(offset) for _ in range(interleave)]


def stage_layer_counts(num_layers: int, pipeline_stage: int, offset=0, interleave: int = 1) -> list[int]:
    """Layers per pipeline stage (summed over its interleave chunks) under mindformers' offset rule."""
    base = num_layers // (pipeline_stage * interleave)
    rows = offset_rows(offset, pipeline_stage, interleave)
    return [sum(base + row[i] for row in rows) for i in range(pipeline_stage)]


def default_offset(num_layers: int, pipeline_stage: int, interleave: int = 1):
    """The offset mindformers needs when the layers do not split evenly: the remainder to the first stages
    (0 when they do); with interleave, to the first chunk."""
    extra = num_layers % (pipeline_stage * interleave)
    if not extra:
        return 0
    rows = [[0] * pipeline_stage for _ in range(interleave)]
    for k in range(extra):
        rows[k // pipeline_stage][k % pipeline_stage] += 1
    return rows[0] if interleave == 1 else rows
