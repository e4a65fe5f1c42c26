"""Episode records from real rollouts and a real update: every per-token figure is the one the
learner computed, on the tokens it trained, and nothing elsewhere."""

import copy
import dataclasses
import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from turnrl.algorithms import ADVANTAGES, collate
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.learner.learner import Learner, TokenView
from turnrl.runs import EpisodeRecord
from turnrl.runs.keep import Pieces, episode_records, whole_groups


@pytest.fixture
def credited_step(rollouts, policy_model, tokenizer):
    """Real rollouts with outcomes set 0/1 by sample (so GRPO's advantages are not 0), collated,
    credited by GRPO and trained on once with TIS on, with a view."""
    trajectories, _ = rollouts("guess_number", 1.0)
    trajectories = [dataclasses.replace(t, turn_rewards=t.turn_rewards[:-1] + [float(i % 2)])
                    for i, t in enumerate(trajectories)]
    batch = collate(trajectories, tokenizer.pad_token_id)
    advantages = ADVANTAGES["grpo"](batch)
    learner = Learner(copy.deepcopy(policy_model), LossConfig(tis="token"), OptimConfig(lr=1e-2, micro_batch_size=1))
    before = learner.logprobs(batch)
    view = TokenView.empty(batch)
    learner.update(batch, advantages, view=view)
    assert not torch.equal(learner.logprobs(batch), before)  # the update moved the policy
    return trajectories, batch, advantages, before, view


def test_records_hold_the_figures_the_update_computed(credited_step, tokenizer):
    trajectories, batch, advantages, before, view = credited_step
    records = episode_records(trajectories, kind="train", step=7, pieces=Pieces(tokenizer), advantages=advantages,
                              learner_logprobs=view.learner_logprobs, entropy=view.entropy,
                              importance_weights=view.importance_weights, loss_mask=batch.loss_mask)
    assert [r.index for r in records] == list(range(len(trajectories)))
    assert any(a is not None and a != 0 for r in records for a in r.tokens.advantage)
    for row, (t, r) in enumerate(zip(trajectories, records)):
        tk = r.tokens
        assert (r.kind, r.step, r.group_id, r.task_id, r.reward) == ("train", 7, t.group_id, t.task_id, t.reward)
        assert tk.ids == t.token_ids and tk.total == len(t.token_ids)
        assert tk.sampled == [bool(m) for m in t.loss_mask]
        assert r.turn_spans == [list(s) for s in t.turn_spans] and r.messages == t.messages
        for j, sampled in enumerate(tk.sampled):
            figures = (tk.sampler_logprob[j], tk.learner_logprob[j], tk.advantage[j], tk.importance_weight[j],
                       tk.entropy[j])
            if not sampled:
                assert figures == (None,) * 5 and tk.turn[j] == -1
                continue
            assert tk.turn[j] >= 0 and t.turn_spans[tk.turn[j]][0] <= j < t.turn_spans[tk.turn[j]][1]
            assert tk.advantage[j] == pytest.approx(float(advantages[row, j]), abs=1e-6)
            assert tk.sampler_logprob[j] == pytest.approx(t.logprobs[j], abs=1e-6)
            # the first pass's logprobs are the policy's before the update (one minibatch)
            assert tk.learner_logprob[j] == pytest.approx(float(before[row, j]), abs=1e-6)
            assert tk.learner_logprob[j] == pytest.approx(t.logprobs[j], abs=1e-4)  # sampler == learner
            assert tk.importance_weight[j] == pytest.approx(1.0, abs=1e-3)  # on-policy: weight 1
            assert tk.entropy[j] > 0


def test_records_survive_json_and_bounds_cut_the_tokens(credited_step, tokenizer):
    trajectories, batch, advantages, _, view = credited_step
    full = episode_records(trajectories, kind="train", step=1, pieces=Pieces(tokenizer), advantages=advantages,
                           learner_logprobs=view.learner_logprobs, entropy=view.entropy, loss_mask=batch.loss_mask)
    assert all(r.tokens.importance_weight == [None] * len(r.tokens.ids) for r in full)  # no TIS weights given
    for r in full:
        assert EpisodeRecord.from_json(r.to_json()) == r
    cut = episode_records(trajectories, kind="train", step=1, pieces=Pieces(tokenizer), advantages=advantages,
                          rows=[2, 3], max_tokens=40, loss_mask=batch.loss_mask)
    assert [r.group_id for r in cut] == [trajectories[2].group_id, trajectories[3].group_id]
    for r, t in zip(cut, trajectories[2:]):
        assert len(r.tokens.ids) == min(40, len(t.token_ids)) and r.tokens.total == len(t.token_ids)
        assert all(len(column) == len(r.tokens.ids) for column in vars(r.tokens).values() if isinstance(column, list))
        assert r.messages == t.messages  # messages are kept whole


def test_a_record_of_another_format_is_refused(credited_step, tokenizer):
    trajectories, *_ = credited_step
    record = episode_records(trajectories[:1], kind="eval", step=0, pieces=Pieces(tokenizer))[0].to_json()
    with pytest.raises(ValueError, match="format 2.*reads format 1"):
        EpisodeRecord.from_json({**record, "format": 2})
    with pytest.raises(ValueError, match="without.*task_id"):
        EpisodeRecord.from_json({k: v for k, v in record.items() if k != "task_id"})
    with pytest.raises(ValueError, match="kind"):
        episode_records(trajectories[:1], kind="test", step=0, pieces=Pieces(tokenizer))


def test_whole_groups_keeps_groups_whole_and_at_least_one(rollouts):
    trajectories, _ = rollouts("guess_number", 1.0)  # groups 0, 0, 1, 1
    assert whole_groups(trajectories, None) == whole_groups(trajectories, 9) == [0, 1, 2, 3]
    assert whole_groups(trajectories, 3) == whole_groups(trajectories, 2) == [0, 1]
    assert whole_groups(trajectories, 1) == [0, 1]  # one group, whole


def test_pieces_of_a_byte_level_tokenizer_rebuild_the_text(tokenizer):
    text = "guess 12: héllo 中文 🙂<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = Pieces(tokenizer)(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False) == text
    assert "中" in pieces and "🙂" in pieces and "<|im_end|>" in pieces  # whole characters, on their last byte
    assert "" in pieces and not any("\ufffd" in p for p in pieces)


def test_byte_level_fast_path_equals_the_tokenizers_decode(tokenizer):
    """The byte-level fast path (one UTF-8 decode over the tokens' bytes) against the
    tokenizer's own decode and the per-token path, on random id sequences: specials, characters
    split over tokens, invalid bytes."""
    fast, slow = Pieces(tokenizer), Pieces(tokenizer)
    assert fast.bytes_of is not None  # the tests' tokenizer is byte-level (Qwen2.5-style)
    slow.bytes_of = None
    rng = random.Random(0)
    multibyte = tokenizer.encode("é中🙂", add_special_tokens=False)
    specials = tokenizer.all_special_ids
    for _ in range(400):
        ids = [rng.choice((rng.randrange(len(tokenizer)), rng.choice(multibyte), rng.choice(specials)))
               for _ in range(rng.randrange(1, 30))]
        pieces = fast(ids)
        assert len(pieces) == len(ids)
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" not in "".join(pieces):  # valid text: both paths give each token the same piece
            assert pieces == slow(ids)
    beyond = [len(fast.bytes_of)]  # an id past the tokenizer's vocabulary (a padded model vocabulary)
    assert fast(beyond) == slow(beyond)


def test_pieces_keep_the_space_a_metaspace_tokenizer_drops_at_the_start():
    vocab = {"<unk>": 0, "▁a": 1, "▁hello": 2, "▁world": 3}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer, raw.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    ids = tok.encode("hello world", add_special_tokens=False)
    assert tok.decode(ids[:1]) == "hello"  # the tokenizer's own decode drops it
    assert Pieces(tok)(ids) == [" hello", " world"]
