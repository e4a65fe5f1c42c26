"""Policies: what samples the agent's turns.

``protocol`` (``RolloutPolicy``, the interface every backend implements) and ``sampling``
(``SamplingParams``, ``Generation``); the backends: ``hf`` (transformers in-process: a plain
reference sampler and the KV-cache engine), ``vllm_engine`` (vLLM in-process), ``http`` (any
OpenAI-compatible server), ``served`` and ``routing`` (several servers, session-affine);
``server`` (the OpenAI-compatible server of a checkpoint, ``python -m turnrl serve-policy``) and
``weights`` (the learner's weights as an engine loads them)."""
