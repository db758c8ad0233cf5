"""What the stages and the planner need to know about the model, in one place.

- `shapes`: the Llama parameter table (names, shapes, the config field behind each dimension);
- `llama`: build the pipeline's Llama in mindformers for inference, read/write/load checkpoints
  (imports MindSpore inside its functions: worker processes only);
- `checkpoints`: checkpoint references (a .ckpt, a parallel run's folder, + a LoRA adapter) and
  `resolve_params`, the plain-model parameters of one;
- `lora_merge` (numpy) and `shard_merge` (MindSpore transform_checkpoints);
- the text interface: `token_ids` (pad/unk/bos/eos), `tokenizer` (a loaded sentencepiece model) and
  `chat_template` (conversations -> ids and trained tokens, what SFT trains on and evaluate prompts with).
Importing this package imports nothing heavy; modules are imported by name.
"""
