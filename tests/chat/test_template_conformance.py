"""Conformance of the renderer with every model family's real chat template.

For each family (``turnrl.chat.families``): an episode with a tool call (written by the
family's formatter, ``turnrl.tools.format_call``), a tool result, a second user message,
thinking blocks for thinking families, Unicode and trailing whitespace, run through
``ChatRenderer`` turn by turn with fixed "sampled" ids. Checks: every segment's decoded ids
are the template's render of the conversation at that point; every sampled id sequence appears
verbatim at its turn span, with ``loss_mask`` 1 exactly there; and the number of segments is
what the family's ``ChatFormat.notes`` claim (``ONE segment`` or ``SEGMENTS``).
"""

from __future__ import annotations

import pytest

from turnrl.chat import renderer as renderer_module
from turnrl.chat.formats import get_format
from turnrl.chat.families import FAMILIES, family_tokenizer
from turnrl.tools import format_call
from turnrl.tools.parsers import ToolCall

pytestmark = pytest.mark.skipif(not hasattr(renderer_module.Conversation(), "segment_starts"),
                                reason="needs the segment-aware renderer")

NAMES = sorted(FAMILIES)
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "the expression"}},
                   "required": ["expression"]}}}]
CALL = ToolCall("calculator", {"expression": "2+3"})
TRIMS = "trims message content"


def one_segment(name: str) -> bool:
    return get_format(name).notes.startswith("ONE segment")


def sampled_text(fmt, prompt: str, body: str, reasoning: str | None, call: bool) -> str:
    """What a model of ``fmt``'s family writes after ``prompt``: an optional thought, ``body``, an
    optional call of calculator, and the token that ends the turn."""
    if fmt.tool_parser == "harmony":  # gpt-oss: channels; a call ends with <|call|>, an answer with <|return|>
        text = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
        if call:
            return text + format_call(CALL, "harmony").removeprefix("<|start|>assistant")
        return text + f"<|channel|>final<|message|>{body}<|return|>"
    text = ""
    if fmt.name == "glm4moe":  # GLM writes its (possibly empty) thought right after <|assistant|>
        text = f"\n<think>{reasoning or ''}</think>\n"
    elif reasoning and fmt.thinking:
        open_tag, close_tag = fmt.thinking
        if prompt.endswith(f"{open_tag}\n"):  # the prompt opened the thought
            text = f"{reasoning}\n{close_tag}\n\n"
        else:
            text = f"{open_tag}\n{reasoning}\n{close_tag}\n\n"
    if call:
        if fmt.name != "gemma4":  # gemma4 writes a call turn's text after its results: none before the call
            text += body
        text += format_call(CALL, fmt.tool_parser)
        # the turn ends with the family's stop token for a call where it has one
        stop = {"gemma4": "<|tool_response>", "glm4moe": "<|observation|>"}.get(fmt.name, fmt.end_of_turn[0])
        return text + stop
    return text + body + fmt.end_of_turn[0]


def run_episode(name: str, *, thinking: bool, trailing: str, template_kwargs=None):
    tok = family_tokenizer(name)
    fmt = get_format(name)
    r = renderer_module.ChatRenderer(tok, fmt, template_kwargs=template_kwargs, on_rewrite="segment")
    eot_ids = {tok.convert_tokens_to_ids(t) for t in fmt.end_of_turn}
    steps = [("call", "Let me compute. é\n", "I add 2 and 3."),
             ("tool", "5 (中文 🙂)", None),
             ("answer", f"The answer is 5 🙂.{trailing}", "Got 5."),
             ("user", "Now 3*4? Ångström", None),
             ("answer", f"12.{trailing}", "3 times 4.")]
    conv = r.start([{"role": "system", "content": "You are helpful."},
                    {"role": "user", "content": "What is 2+3? é 中文 🙂"}], tools=TOOLS)
    sampled: list[list[int]] = []

    def check_segment(gen: bool):
        seg = conv.token_ids[conv.segment_starts[-1]:]
        assert tok.decode(seg, skip_special_tokens=False) == conv.text
        assert conv.text == r.render(conv.messages, add_generation_prompt=gen, tools=TOOLS)

    check_segment(True)
    for kind, text, reasoning in steps:
        if kind in ("call", "answer"):
            sample = sampled_text(fmt, conv.text, text, reasoning if thinking else None, kind == "call")
            ids = tok(sample, add_special_tokens=False)["input_ids"]
            assert ids[-1] in eot_ids, (name, sample)
            before = conv.text
            r.add_sampled(conv, ids, [-0.5 - i / 100 for i in range(len(ids))])
            sampled.append(ids)
            assert conv.text == before + sample
        else:
            role = "tool" if kind == "tool" else "user"
            before = len(conv.segment_starts)
            r.add_observation(conv, [{"role": role, "content": text}], add_generation_prompt=True)
            check_segment(True)
            if role == "tool" and "tool results stay in one segment" in fmt.notes:
                assert len(conv.segment_starts) == before, f"{name}: a tool result started a segment"
    r.add_observation(conv, [], add_generation_prompt=False)
    # trajectory ids: sampled ids verbatim at their spans, loss_mask 1 exactly there
    assert [conv.token_ids[s:e] for s, e in conv.turn_spans] == sampled
    in_span = [0] * len(conv.token_ids)
    for (s, e), ids in zip(conv.turn_spans, sampled):
        in_span[s:e] = [1] * (e - s)
        assert conv.logprobs[s:e] == [-0.5 - i / 100 for i in range(len(ids))]
    assert conv.loss_mask == in_span
    assert len(conv.token_ids) == len(conv.loss_mask) == len(conv.logprobs)
    # every segment decodes to a render the template gives of its conversation: check the seams
    bounds = [*conv.segment_starts, len(conv.token_ids)]
    for a, b in zip(bounds, bounds[1:]):
        assert conv.loss_mask[a] == 0, "a segment opens with its prompt, not sampled ids"
        assert not any(s < a < e for s, e in conv.turn_spans), "a segment boundary cuts a sampled turn"
    return tok, fmt, conv


@pytest.mark.parametrize("name", NAMES)
def test_episode_segments_match_the_template(name):
    tok, fmt, conv = run_episode(name, thinking=fmt_thinks(name), trailing="" if TRIMS in get_format(name).notes
                                 else "  \n")
    n = len(conv.segment_starts)
    if one_segment(name):
        assert n == 1, f"{name}: notes say ONE segment, the episode took {n}: {fmt.notes}"
    else:
        assert n >= 2, f"{name}: notes say SEGMENTS, the episode kept one: {fmt.notes}"


def fmt_thinks(name: str) -> bool:
    return get_format(name).thinking is not None and name != "gemma4"


@pytest.mark.parametrize("name", [n for n in NAMES if TRIMS in get_format(n).notes])
def test_trimming_templates_start_a_segment_after_trailing_whitespace(name):
    _, _, conv = run_episode(name, thinking=False, trailing="  \n")
    assert len(conv.segment_starts) >= 2


@pytest.mark.parametrize("name", [n for n in NAMES if get_format(n).thinking is not None])
def test_thinking_families_keep_exact_ids_with_thoughts(name):
    run_episode(name, thinking=True, trailing="")


def test_a_thinking_preserving_render_keeps_one_segment():
    """qwen3_6 drops earlier thoughts at a new user message; preserve_thinking=True keeps them."""
    _, _, dropping = run_episode("qwen3_6", thinking=True, trailing="")
    _, _, keeping = run_episode("qwen3_6", thinking=True, trailing="", template_kwargs={"preserve_thinking": True})
    assert len(dropping.segment_starts) >= 2 and keeping.segment_starts == [0]


@pytest.fixture(scope="module")
def family_rollouts():
    """``family_rollouts(name) -> (trajectories, tokenizer, model)``: a tiny random-init Qwen2 sized
    to the family's tokenizer samples 2 calc_math episodes through the real collector; the logits
    of the family's end-of-turn ids are raised so turns end at varied lengths."""
    import torch

    from turnrl.policies.sampling import SamplingParams
    from turnrl.models.causal_lm import TinyModelConfig, build_tiny_model
    from turnrl.policies.hf.policy import TransformersPolicy
    from turnrl.chat.formats import turn_end_ids
    from turnrl.envs import CalcMathEnv
    from turnrl.rollout import RolloutCollector, Task

    def run(name: str):
        tok = family_tokenizer(name)
        model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                 intermediate_size=64), tok, seed=0)
        stops = list(turn_end_ids(tok))

        def end_bias(module, inputs, logits):
            bias = torch.zeros(logits.shape[-1], dtype=logits.dtype)
            bias[stops] = 4.0
            return logits + bias

        model.lm_head.register_forward_hook(end_bias)
        renderer = renderer_module.ChatRenderer(tok, get_format(name))
        collector = RolloutCollector(lambda: CalcMathEnv(max_turns=3), TransformersPolicy(model, tok, seed=3), renderer,
                                     max_context_tokens=4096, env_workers=1)
        trajectories = collector.collect([Task(0)], group_size=2, params=SamplingParams(max_new_tokens=8))
        return trajectories, tok, model

    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_learner_logprobs_equal_the_samplers_on_each_familys_rollouts(family_rollouts, name):
    import torch

    from turnrl.algorithms import collate, token_logprobs
    from tests.tolerances import logprob_tol_for

    trajectories, tok, model = family_rollouts(name)
    assert all(t.termination in ("terminated", "truncated") for t in trajectories), [t.error for t in trajectories]
    assert sum(t.num_turns for t in trajectories) >= 3
    batch = collate(trajectories, tok.pad_token_id)
    with torch.no_grad():
        learner, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask,
                                    segments=batch.segment_index)
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) == sum(t.num_generated_tokens for t in trajectories)
    # rounding only (cached decode vs the learner's segmented forward): the model's logprob bound
    tol = logprob_tol_for(model, [t.token_ids for t in trajectories])
    assert float((learner - batch.old_logprobs).abs()[mask].max()) <= tol
    for traj in trajectories:  # every segment opens with a full render of the template (a prompt, not sampled ids)
        for start in traj.segment_starts:
            assert traj.loss_mask[start] == 0
