"""The transformers backend, in process.

``reference`` is the plain sampler a reader can follow (one forward per token with the model's own
cache); ``policy`` (``TransformersPolicy``) is the engine used in training, with a KV cache kept
across a conversation's turns (``row_cache``, ``prefix_cache``, ``kv_buffer``) and a fused decoder
(``fast_decode``, ``gqa_attention``); tests hold the engine equal to the reference sampler."""
