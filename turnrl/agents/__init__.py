"""Policy backends, the chat renderer that keeps token ids exact, and the default model."""

from turnrl.agents.hf_policy import TransformersPolicy
from turnrl.agents.model import TinyModelConfig, build_tiny_model, load_pretrained
from turnrl.agents.renderer import ChatRenderer, Conversation, TemplateMismatchError
from turnrl.agents.sampling import Generation, SamplingParams
from turnrl.agents.tokenizer import build_tokenizer

__all__ = [
    "ChatRenderer",
    "Conversation",
    "Generation",
    "SamplingParams",
    "TemplateMismatchError",
    "TinyModelConfig",
    "TransformersPolicy",
    "build_tiny_model",
    "build_tokenizer",
    "load_pretrained",
]
