"""Causal LMs: ``causal_lm`` (a small Qwen2 built from a config, or a Hugging Face checkpoint by path)
and ``tiny_checkpoints`` (random-init checkpoints of real architectures saved as ordinary folders)."""
