"""The tensor-parallel laws (Megatron-style layers, vocab-parallel cross-entropy, the GPT block and model)."""
