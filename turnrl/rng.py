"""The process's global RNG states (torch CPU and CUDA, numpy, python ``random``), saved and restored
whole: checkpoints keep them, and an in-process engine that reseeds them is undone with them."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["global_rng_state", "set_global_rng_state"]


def global_rng_state() -> dict:
    """The states of the global RNGs: torch (CPU and, when initialised, CUDA), numpy, python."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda, "numpy": (kind, key.tolist(), pos, has_gauss, gauss),
            "python": random.getstate()}


def set_global_rng_state(state: dict) -> None:
    """Restore what ``global_rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
