"""Only sampled tokens receive loss: observations, tool results, prompts and template text
never do. Checked on scripted-expert episodes (which call the calculator tool) and on
trajectories collected from the policy."""

import numpy as np
import pytest

from turnrl.rollout.scripted import scripted_episode
from turnrl.envs import CalcMathEnv, GuessNumberEnv
from turnrl.rollout import Trajectory

END = "<|im_end|>\n"


def runs(traj: Trajectory, tokenizer):
    """Maximal runs of equal loss-mask value: ``(tok_start, tok_end, char_start, char_end, mask)``.

    Runs are decoded separately; their texts concatenate to the full decode (checked), so
    the char ranges are exact even where sampled bytes are not valid UTF-8 on their own.
    """
    out, start, char = [], 0, 0
    mask = traj.loss_mask
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            text = tokenizer.decode(traj.token_ids[start:i], skip_special_tokens=False)
            out.append((start, i, char, char + len(text), mask[start]))
            start, char = i, char + len(text)
    assert char == len(tokenizer.decode(traj.token_ids, skip_special_tokens=False))
    return out


def content_spans(messages, tokenizer, tools=None):
    """Char span of each message's content in the template render of ``messages`` (and ``tools``)."""
    spans = []
    for i, message in enumerate(messages):
        rendered = tokenizer.apply_chat_template(messages[: i + 1], tools=tools or None, tokenize=False)
        suffix = "\n</tool_response>" + END if message["role"] == "tool" else END  # a tool result's block
        end = len(rendered) - len(suffix)
        assert rendered[end:] == suffix
        # the content ends its block; a system message's content comes before the tools block, if any
        start = rendered.rfind(message["content"], 0, end) if message["content"] else end
        assert start >= 0 and (message["role"] == "system" or start + len(message["content"]) == end)
        spans.append((start, start + len(message["content"])))
    return spans


def assert_loss_only_on_sampled_tokens(traj: Trajectory, tokenizer):
    n = len(traj.token_ids)
    assert set(traj.loss_mask) <= {0, 1}
    # turn spans: ordered, disjoint, non-empty, and loss_mask is 1 exactly on them
    in_span = np.zeros(n, dtype=int)
    previous_end = 0
    for start, end in traj.turn_spans:
        assert previous_end < start < end <= n  # a turn always follows a template header
        in_span[start:end] = 1
        previous_end = end
    assert traj.loss_mask == in_span.tolist()
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)

    text = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert traj.segment_starts == [0]  # the tiny template preserves its prefix: one segment
    assert text == tokenizer.apply_chat_template(traj.messages, tools=traj.tools or None, tokenize=False)
    spans = content_spans(traj.messages, tokenizer, traj.tools)
    mask_runs = runs(traj, tokenizer)
    sampled_runs = [r for r in mask_runs if r[4] == 1]
    assert [(r[0], r[1]) for r in sampled_runs] == [tuple(s) for s in traj.turn_spans]  # turns never touch
    turn = 0
    for message, (c0, c1) in zip(traj.messages, spans):
        touching = [r for r in mask_runs if r[2] < c1 and c0 < r[3]]  # runs holding any of its chars
        if message["role"] == "assistant":
            # its content is the text of exactly its own turn's sampled ids
            run = sampled_runs[turn]
            assert run[2] <= c0 and c1 <= run[3]
            assert all(r[4] == 1 for r in touching)
            turn += 1
        else:
            assert message["role"] in ("system", "user", "tool")
            assert all(r[4] == 0 for r in touching), f"{message['role']} message tokens get loss: {message}"
            # and at token level: every token overlapping the content is unmasked
            for t0, t1, r0, r1, _ in touching:
                char = r0  # observation/template text is ASCII: tokens decode one by one exactly
                for tok in range(t0, t1):
                    piece = tokenizer.decode([traj.token_ids[tok]], skip_special_tokens=False)
                    if char < c1 and c0 < char + len(piece):
                        assert traj.loss_mask[tok] == 0
                    char += len(piece)
                assert char == r1
    assert turn == traj.num_turns


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_calc_math_expert_episode_tool_results_never_get_loss(seed, renderer, tokenizer):
    env = CalcMathEnv(num_ops=2)
    traj = scripted_episode(env, seed, renderer, player="expert")
    assert traj.success and traj.termination == "terminated"
    assert traj.num_turns == 3  # two calculator calls, then the answer
    roles = [m["role"] for m in traj.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert_loss_only_on_sampled_tokens(traj, tokenizer)
    assert all(lp == 0.0 for lp in traj.logprobs)  # scripted turns carry logprob 0
    # each turn is the expert's text followed by the end-of-turn id
    for (start, end), message in zip(traj.turn_spans, [m for m in traj.messages if m["role"] == "assistant"]):
        assert traj.token_ids[end - 1] == tokenizer.eos_token_id
        assert tokenizer.decode(traj.token_ids[start:end - 1], skip_special_tokens=False) == message["content"]


def test_guess_number_weak_episode_user_hints_never_get_loss(renderer, tokenizer):
    traj = scripted_episode(GuessNumberEnv(), 5, renderer, player="weak", rng=np.random.default_rng(0))
    assert traj.num_turns >= 2
    assert_loss_only_on_sampled_tokens(traj, tokenizer)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("env_name", ["guess_number", "calc_math"])
def test_collected_trajectories_observation_tokens_never_get_loss(rollouts, tokenizer, env_name, temperature):
    trajectories, _ = rollouts(env_name, temperature)
    for traj in trajectories:
        assert_loss_only_on_sampled_tokens(traj, tokenizer)
        assert any(lp != 0.0 for lp in traj.logprobs)  # sampled tokens do carry logprobs
