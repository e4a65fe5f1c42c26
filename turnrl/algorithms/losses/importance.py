"""Rollout/learner logprob mismatch: its measurement and the truncated importance-sampling fix.

The sampler (vLLM, a batched KV-cache loop, another precision) and the learner's forward
pass do not give bit-identical logprobs for the same tokens, so "on-policy" data is slightly
off-policy. With ``pi_l`` the learner's and ``pi_s`` the sampler's probability of a sampled
token, truncated importance sampling (TIS, Yao et al., 2025) weighs each token's loss by
``min(pi_l / pi_s, cap)`` (token level) or each trajectory's by ``min(prod_t pi_l / pi_s,
cap)`` (sequence level); the weight carries no gradient.
"""

from __future__ import annotations

import torch

LEVELS = ("none", "token", "sequence")


def logprob_mismatch(learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """Sums over sampled tokens, for the caller to divide by the token count.

    Returns:
        ``mismatch_abs``: sum of ``|log pi_l - log pi_s|``; ``mismatch_kl``: sum of the k3
        estimate of KL(pi_s || pi_l) under the sampler's tokens; ``mismatch_max``: the largest
        absolute difference (not a sum).
    """
    d = ((learner_logprobs - sampler_logprobs) * mask).clamp(-20.0, 20.0)
    return {
        "mismatch_abs": d.abs().sum(),
        "mismatch_kl": ((torch.expm1(d) - d) * mask).sum(),
        "mismatch_max": d.abs().max() if d.numel() else d.new_tensor(0.0),
    }


def truncated_is_weights(learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                         level: str = "token", cap: float = 2.0) -> torch.Tensor:
    """Per-token weights ``[N, T]`` (0 off the mask, no gradient).

    Args:
        learner_logprobs / sampler_logprobs: ``[N, T]``.
        mask: ``[N, T]`` loss mask.
        level: ``"token"`` (each token's own ratio), ``"sequence"`` (the product over the
            trajectory's sampled tokens, one weight per row) or ``"none"`` (all ones).
        cap: upper truncation of the ratio, > 0.
    """
    if level not in LEVELS:
        raise ValueError(f"TIS level must be one of {LEVELS}, got {level!r}")
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    with torch.no_grad():
        if level == "none":
            return mask.clone()
        log_ratio = (learner_logprobs - sampler_logprobs) * mask
        if level == "sequence":
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
        return log_ratio.clamp(max=20.0).exp().clamp(max=cap) * mask
