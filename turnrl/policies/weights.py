"""The learner's weights as an inference engine loads them: LoRA merged, DDP unwrapped, written
as a ``model.safetensors`` checkpoint folder. Shared by the in-process vLLM engine
(``vllm_engine``) and the weight pushes to rollout servers (``http``, ``served``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["merged_state_dict", "save_weights", "unwrap_model"]


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP / DataParallel wrapper."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights under its checkpoint names, with LoRA adapters merged.

    A plain model gives its ``state_dict()``. A model with peft LoRA adapters injected in
    place (``Learner`` with ``lora_rank > 0``) gives, for each adapted layer, ``base weight +
    delta`` under the base layer's own name (``...q_proj.weight``), and no ``lora_`` entries:
    what an engine serving the base architecture loads.
    """
    state = {name: t.detach() for name, t in model.state_dict().items()}
    adapted = {name: module for name, module in model.named_modules()
               if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")}
    if not adapted:
        return state
    out = {name: t for name, t in state.items() if "lora_" not in name and ".base_layer." not in name}
    for name, module in adapted.items():
        base = module.base_layer
        weight = base.weight.detach().clone()
        for adapter in getattr(module, "active_adapters", []):
            if adapter in getattr(module, "lora_A", {}):
                weight += module.get_delta_weight(adapter).detach().to(weight.dtype)
        out[f"{name}.weight"] = weight
        if getattr(base, "bias", None) is not None:
            out[f"{name}.bias"] = base.bias.detach()
    return out


def save_weights(state_dict: Mapping[str, torch.Tensor], config, path: str | os.PathLike,
                 generation_config=None) -> Path:
    """Write a checkpoint folder: ``config.json`` (and ``generation_config.json`` when given) and
    ``model.safetensors`` holding every tensor of ``state_dict`` (tensors that share memory,
    e.g. tied embeddings, are stored as copies). The file is written under a temporary name and
    renamed, so a reader never sees half of it; the folder loads with ``from_pretrained``.

    Returns:
        The folder, resolved.
    """
    from safetensors.torch import save_file

    folder = Path(path).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    state, seen = {}, set()
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu().contiguous()
        if tensor.data_ptr() in seen:  # tied: safetensors stores no shared tensors
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        state[name] = tensor
    partial = folder / "model.safetensors.partial"
    save_file(state, str(partial), metadata={"format": "pt"})
    os.replace(partial, folder / "model.safetensors")
    return folder
