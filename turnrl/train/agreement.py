"""The start-up check that a separate sampler (a vLLM engine, rollout servers) and the learner
give the same logprobs to the same tokens: ``logprob_agreement``."""

from __future__ import annotations

import torch

from turnrl.algorithms.learner.scoring import token_logprobs
from turnrl.policies.sampling import SamplingParams

__all__ = ["logprob_agreement"]

@torch.no_grad()
def logprob_agreement(policy, model: torch.nn.Module, prompts: list[list[int]], params: SamplingParams,
                      micro_batch_size: int = 32) -> dict:
    """Generate with ``policy`` and score the same tokens with ``model`` by teacher forcing.

    The model scores at the sampling temperature (1 under greedy decoding), as the learner
    does. fp32 engine and fp32 model on CPU agree within ``LOGPROB_TOLERANCE`` (measured
    max ~1e-6).

    Returns:
        ``{"max_abs", "mean_abs", "tokens", "generations"}``: the largest and the mean
        ``|sampler logprob - model logprob|`` over all sampled tokens, their number, and the
        generations themselves.
    """
    gens = policy.generate(prompts, params)
    temperature = 1.0 if params.greedy else params.temperature
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    diffs: list[float] = []
    try:
        for start in range(0, len(prompts), micro_batch_size):
            rows = list(zip(prompts[start:start + micro_batch_size], gens[start:start + micro_batch_size]))
            width = max(len(p) + len(g.token_ids) for p, g in rows)
            ids = torch.zeros((len(rows), width), dtype=torch.long)
            attention = torch.zeros_like(ids)
            score = torch.zeros((len(rows), width), dtype=torch.float32)
            for r, (p, g) in enumerate(rows):
                n = len(p) + len(g.token_ids)
                ids[r, :n] = torch.tensor(list(p) + g.token_ids)
                attention[r, :n] = 1
                score[r, len(p):n] = 1
            lp, _, _ = token_logprobs(model, ids.to(device), attention.to(device), temperature,
                                   score_mask=score.to(device))
            lp = lp.float().cpu()
            for r, (p, g) in enumerate(rows):
                ref = lp[r, len(p):len(p) + len(g.token_ids)].tolist()
                diffs.extend(abs(a - b) for a, b in zip(g.logprobs, ref))
    finally:
        model.train(was_training)
    return {"max_abs": max(diffs, default=0.0), "mean_abs": sum(diffs) / len(diffs) if diffs else 0.0,
            "tokens": len(diffs), "generations": gens}
