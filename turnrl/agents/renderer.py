"""The chat renderer: turns a growing conversation into token ids without ever re-tokenizing
what the model sampled.

Contract: for a conversation that alternates observations and sampled assistant turns,
``tokenizer.decode(conv.token_ids) == conv.text`` and ``conv.text`` is a prefix of (at the
end, equal to) ``tokenizer.apply_chat_template(conv.messages, tokenize=False)``. Sampled ids
are appended verbatim; only the template text *between* sampled turns (role headers,
end markers, observations) is tokenized, as the string delta of the full template render.
This works for any HF chat template whose render of a conversation extends the render of
its prefix (true of Qwen2/2.5, Llama 3, Mistral and the tiny model's template).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class TemplateMismatchError(RuntimeError):
    """The chat template rewrote text that was already rendered (e.g. it strips content)."""


@dataclass
class Conversation:
    """One episode's conversation as messages, text and exact token ids.

    Attributes:
        messages: chat messages so far (``{"role", "content"}``).
        token_ids: ``[T]`` ids; sampled assistant ids appear exactly as sampled.
        loss_mask: ``[T]`` 1 on sampled ids, 0 on template/observation ids.
        logprobs: ``[T]`` the sampler's logprob of each sampled id, 0.0 elsewhere.
        text: ``decode(token_ids)``, kept incrementally.
        turn_spans: ``(start, end)`` token index span of each assistant turn's sampled ids.
    """

    messages: list[dict] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    turn_spans: list[tuple[int, int]] = field(default_factory=list)


class ChatRenderer:
    """Renders observations with the tokenizer's chat template and appends sampled ids."""

    def __init__(self, tokenizer):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat_template; set one before rendering")
        self.tokenizer = tokenizer

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (no BOS/EOS added)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def start(self, messages: list[dict]) -> Conversation:
        """A conversation holding the first observation, ready for the assistant's turn."""
        conv = Conversation()
        self.add_observation(conv, messages, add_generation_prompt=True)
        return conv

    def add_sampled(self, conv: Conversation, ids: list[int], logprobs: list[float]) -> str:
        """Append one assistant turn's sampled ids verbatim; return its message content.

        The content is the decoded text without a trailing end-of-turn token.
        """
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
        start = len(conv.token_ids)
        conv.token_ids.extend(ids)
        conv.loss_mask.extend([1] * len(ids))
        conv.logprobs.extend(float(lp) for lp in logprobs)
        conv.turn_spans.append((start, start + len(ids)))
        conv.text += self.tokenizer.decode(ids, skip_special_tokens=False)
        body = ids[:-1] if ids and ids[-1] == self.tokenizer.eos_token_id else ids
        content = self.tokenizer.decode(body, skip_special_tokens=False)
        conv.messages.append({"role": "assistant", "content": content})
        return content

    def add_observation(
        self, conv: Conversation, messages: list[dict], add_generation_prompt: bool
    ) -> None:
        """Append observation messages (and the next generation prompt) as template ids.

        Call with ``messages=[]`` and ``add_generation_prompt=False`` to close the last
        assistant turn at the end of an episode.
        """
        conv.messages.extend(dict(m) for m in messages)
        full = self.render(conv.messages, add_generation_prompt=add_generation_prompt)
        if not full.startswith(conv.text):
            raise TemplateMismatchError(
                "the chat template's render of the conversation does not extend the text "
                "already tokenized; token ids cannot be kept exact with this template. "
                f"Already rendered ends with {conv.text[-80:]!r}, template gives "
                f"{full[max(0, len(conv.text) - 80):len(conv.text)]!r}."
            )
        delta = self.encode(full[len(conv.text):])
        conv.token_ids.extend(delta)
        conv.loss_mask.extend([0] * len(delta))
        conv.logprobs.extend([0.0] * len(delta))
        conv.text = full
