"""Policy backends (transformers, OpenAI-compatible HTTP, several routed; ``RolloutPolicy`` is the
interface the rollout backends share), the chat renderer that
keeps token ids exact, and the default model. The OpenAI-compatible server of a checkpoint is
``turnrl.agents.policy_server`` (``python -m turnrl serve-policy``)."""

from turnrl.agents.hf_policy import TransformersPolicy
from turnrl.agents.http_policy import OpenAIPolicy, assert_trainable
from turnrl.agents.model import TinyModelConfig, build_tiny_model, load_pretrained
from turnrl.agents.protocol import RolloutPolicy
from turnrl.agents.renderer import ChatRenderer, Conversation, TemplateMismatchError
from turnrl.agents.routing import RoutedPolicy
from turnrl.agents.sampling import Generation, SamplingParams
from turnrl.agents.tokenizer import build_tokenizer

__all__ = [
    "ChatRenderer",
    "Conversation",
    "Generation",
    "OpenAIPolicy",
    "RolloutPolicy",
    "RoutedPolicy",
    "SamplingParams",
    "TemplateMismatchError",
    "TinyModelConfig",
    "TransformersPolicy",
    "assert_trainable",
    "build_tiny_model",
    "build_tokenizer",
    "load_pretrained",
]
