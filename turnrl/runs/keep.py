"""Episode records (``turnrl.runs.rollouts``) made from a step's trajectories and what the
learner computed of them."""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence

import numpy as np
import torch

from turnrl.rollout.termination import is_infra_failure
from turnrl.rollout.trajectory import Trajectory
from turnrl.runs.rollouts import KINDS, EpisodeRecord, Tokens

DECIMALS = 6
"""Decimals kept of each per-token figure (logprobs, advantages, weights, entropies)."""

_REPLACEMENT = "\ufffd"


def whole_groups(trajectories: Sequence[Trajectory], limit: int | None) -> list[int]:
    """Indices of the trajectories kept under a bound of ``limit`` episodes (None: all): whole
    groups (the samples of a task, by ``group_id``) in the order they first appear, as many as
    fit, and at least the first group, so the members of a group can be compared."""
    if limit is None or limit >= len(trajectories):
        return list(range(len(trajectories)))
    members: dict[int, list[int]] = {}
    for i, t in enumerate(trajectories):
        members.setdefault(t.group_id, []).append(i)
    kept: list[int] = []
    for rows in members.values():
        if kept and len(kept) + len(rows) > limit:
            break
        kept += rows
    return sorted(kept)


class Pieces:
    """Each token's text for a tokenizer (a ``transformers`` tokenizer), cached per id.

    A token's piece is its text after some other token (so a tokenizer that drops a leading
    space at the start of a text keeps it); a token whose bytes end inside a character (a
    byte-level tokenizer splits characters into several tokens) gets "" and the token that
    completes the character gets the character. The pieces of a sequence join to the
    tokenizer's own decode of it.

    Byte-level BPE tokenizers (GPT-2, Qwen, Llama 3, DeepSeek: a ``ByteLevel`` decoder) take a
    fast path: each token's bytes are read once from its vocabulary string, and a sequence's
    pieces come from one incremental UTF-8 decode of its bytes (no tokenizer call per token);
    invalid bytes become U+FFFD as in the tokenizer's lossy decode. Other tokenizers decode
    each token after an anchor token, and again with the tokens before it while a character
    is incomplete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        anchor = tokenizer.encode("a", add_special_tokens=False)
        self.anchor = anchor[:1]
        self.anchor_text = self._decode(self.anchor)
        self.cache: dict[int, str] = {}
        self.bytes_of = _byte_level_table(tokenizer)  # id -> bytes, or None (not byte-level)
        self.text_of = None if self.bytes_of is None else [_whole_text(b) for b in self.bytes_of]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _piece(self, token: int) -> str:
        piece = self.cache.get(token)
        if piece is None:
            text = self._decode(self.anchor + [token])
            piece = text[len(self.anchor_text):] if text.startswith(self.anchor_text) else self._decode([token])
            self.cache[token] = piece
        return piece

    def __call__(self, ids: Sequence[int]) -> list[str]:
        """The pieces of ``ids`` (one per id)."""
        if self.bytes_of is not None and (not ids or (min(ids) >= 0 and max(ids) < len(self.bytes_of))):
            return self._byte_pieces(ids)
        out, pending = [], []  # pending: ids whose bytes end inside a character
        for token in ids:
            piece = self._piece(token)
            if not pending and not piece.endswith(_REPLACEMENT):
                out.append(piece)
                continue
            pending.append(token)
            text = self._decode(self.anchor + pending)[len(self.anchor_text):]
            if not text.endswith(_REPLACEMENT):  # the character is complete
                out += [""] * (len(pending) - 1) + [text]
            elif len(pending) == 4:  # no character takes more than 4 bytes: each its own piece
                out += [self._piece(t) for t in pending]
            else:
                continue
            pending = []
        return out + [self._piece(t) for t in pending]

    def _byte_pieces(self, ids: Sequence[int]) -> list[str]:
        """The byte-level fast path: each token's text where its bytes are whole characters and
        none are pending; else an incremental UTF-8 decode over the tokens' bytes until no byte
        is pending (bytes still incomplete at the end become U+FFFD on the last token)."""
        out, decoder = [], None
        for token in ids:
            if decoder is None:
                text = self.text_of[token]
                if text is not None:
                    out.append(text)
                    continue
                decoder = codecs.getincrementaldecoder("utf-8")("replace")
            out.append(decoder.decode(self.bytes_of[token]))
            if not decoder.getstate()[0]:  # no byte pending: the plain path again
                decoder = None
        if decoder is not None:
            out[-1] += decoder.decode(b"", final=True)
        return out


def _byte_level_table(tokenizer) -> list[bytes] | None:
    """Each id's bytes as a byte-level BPE tokenizer decodes it (a fast tokenizer whose decoder
    is ``ByteLevel``): the token's string mapped back through GPT-2's byte-to-character table,
    or its UTF-8 bytes when some character is not in that table (an added token such as
    ``<|im_end|>`` is plain ASCII, which the table maps to itself). The decoder then reads the
    whole sequence's bytes as one lossy UTF-8 text. None when the tokenizer is not byte-level."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return None
    if decoder.get("type") != "ByteLevel":
        return None
    byte_of = {char: byte for byte, char in _bytes_to_unicode().items()}
    table = []
    for token in range(backend.get_vocab_size(with_added_tokens=True)):
        text = backend.id_to_token(token)
        if text is None:  # a hole in the ids: leave such tokenizers to the slow path
            return None
        table.append(bytes(byte_of[c] for c in text) if all(c in byte_of for c in text) else text.encode("utf-8"))
    return table


def _whole_text(raw: bytes) -> str | None:
    """``raw`` as text when it is whole UTF-8 characters, else None."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level table: every byte as a printable character (the byte itself for
    printable Latin-1, 256 + n for the others), as the ``ByteLevel`` pre-tokenizer writes tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _rounded(values: torch.Tensor | None, rows: Sequence[int]) -> dict[int, list[float]] | None:
    """``values[row]`` of each of ``rows``, rounded to ``DECIMALS``, as lists (one tensor op for
    all rows)."""
    if values is None or not len(rows):
        return None
    return dict(zip(rows, torch.round(values[list(rows)].double(), decimals=DECIMALS).tolist()))


def _column(values: list[float] | None, mask: list[bool], n: int) -> list[float | None]:
    """A row's figures on sampled tokens, None elsewhere."""
    if values is None:
        return [None] * n
    return [v if m else None for v, m in zip(values[:n], mask)]


def episode_records(trajectories: Sequence[Trajectory], *, kind: str, step: int, pieces: Pieces,
                    rows: Sequence[int] | None = None, advantages: torch.Tensor | None = None,
                    learner_logprobs: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
                    importance_weights: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None,
                    max_tokens: int | None = None) -> list[EpisodeRecord]:
    """The records of ``trajectories[rows]`` (default: all).

    Args:
        kind: ``"train"`` or ``"eval"``.
        step: the step they belong to.
        pieces: the tokenizer's ``Pieces``.
        advantages, learner_logprobs, entropy, importance_weights: ``[N, T]`` per-token
            figures of the step's batch (rows in ``trajectories``' order), or None where there
            are none (an evaluation).
        loss_mask: ``[N, T]`` the batch's loss mask (an excluded row has none); default: each
            trajectory's own.
        max_tokens: keep the per-token figures of the first this many tokens (None: all).

    Raises:
        ValueError: On an unknown ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rows = range(len(trajectories)) if rows is None else rows
    figures = {name: _rounded(values, rows) for name, values in (
        ("learner_logprob", learner_logprobs), ("advantage", advantages), ("importance_weight", importance_weights),
        ("entropy", entropy))}
    masks = None if loss_mask is None else dict(zip(rows, loss_mask[list(rows)].tolist())) if len(rows) else {}
    records = []
    for index, row in enumerate(rows):
        t = trajectories[row]
        total = len(t.token_ids)
        n = total if max_tokens is None else min(total, max_tokens)
        mask = t.loss_mask[:n] if masks is None else masks[row][:n]
        sampled = [bool(m) for m in mask]
        turn = [-1] * n
        for k, (start, end) in enumerate(t.turn_spans):
            for i in range(start, min(end, n)):
                turn[i] = k
        segment, starts = [], list(t.segment_starts) + [total]
        for s in range(len(starts) - 1):
            segment += [s] * max(0, min(starts[s + 1], n) - min(starts[s], n))
        row_of = (lambda x: None if x is None else x[row])  # noqa: E731
        sampler = np.round(np.asarray(t.logprobs[:n], dtype=np.float64), DECIMALS).tolist()
        tokens = Tokens(ids=list(t.token_ids[:n]), pieces=pieces(t.token_ids[:n]), sampled=sampled, turn=turn,
                        segment=segment,
                        sampler_logprob=_column(sampler, [bool(m) for m in t.loss_mask[:n]], n),
                        **{name: _column(row_of(values), sampled, n) for name, values in figures.items()},
                        total=total)
        records.append(EpisodeRecord(
            kind=kind, step=step, index=index, group_id=t.group_id, task_id=str(t.task_id), env_id=t.env_id,
            reward=float(t.reward), turn_rewards=[float(r) for r in t.turn_rewards], success=bool(t.success),
            termination=str(t.termination), error=t.error,
            excluded=kind == "train" and is_infra_failure(t.termination) and not any(sampled),
            messages=[dict(m) for m in t.messages], tool_names=[_tool_name(s) for s in t.tools],
            tool_calls=t.tool_calls, tool_errors=t.tool_errors, parse_errors=t.parse_errors,
            length_truncated_turns=t.length_truncated_turns, empty_actions=t.empty_actions, attempts=t.attempts,
            turn_spans=[[int(a), int(b)] for a, b in t.turn_spans], state_keys=[str(k) for k in t.state_keys],
            segment_starts=[int(s) for s in t.segment_starts], tokens=tokens))
    return records


def _tool_name(schema: dict) -> str:
    """A tool's name from its JSON schema (``{"type": "function", "function": {"name": ...}}``
    or ``{"name": ...}``)."""
    return str(schema.get("function", schema).get("name", "?"))
