"""``turnrl.policies.server_check`` on the answers servers give (the same checks run against
real vLLM servers in tests/policies/test_http_policy_vllm.py)."""

import pytest

from turnrl.policies.server_check import (ServedModel, context_problem, logprobs_mode, pick_model, request_problem,
                                          served_models, top_logprob)

URL = "http://h:8000/v1"


def test_the_models_list_is_read_and_hostile_entries_are_skipped():
    payload = {"data": [{"id": "a", "max_model_len": 4096}, {"id": "b"}, {"id": ""}, "junk", {"id": 3},
                        {"id": "c", "max_model_len": True}, {"id": "d", "max_model_len": -5}]}
    assert served_models(payload, URL) == [ServedModel("a", 4096), ServedModel("b", None), ServedModel("c", None),
                                           ServedModel("d", None)]
    for empty in ({"data": []}, {}, [], None, {"data": "x"}):
        with pytest.raises(ValueError, match="lists no model"):
            served_models(empty, URL)


def test_the_model_is_the_named_one_or_the_only_one():
    one, two = [ServedModel("a", 10)], [ServedModel("a", 10), ServedModel("b", 20)]
    assert pick_model(one, None, URL) == one[0] and pick_model(two, "b", URL) == two[1]
    with pytest.raises(ValueError, match=r"serves 2 models \['a', 'b'\]: name one \(agent.http.model=NAME\)"):
        pick_model(two, None, URL, key="agent.http.model")
    with pytest.raises(ValueError, match="does not serve a model named 'z'.*--served-model-name z"):
        pick_model(two, "z", URL)


def test_context_limits():
    model = ServedModel("a", 512)
    assert context_problem(model, 512, URL) is None and context_problem(ServedModel("a", None), 10**6, URL) is None
    assert "agent.max_context_tokens=1024 is above" in context_problem(model, 1024, URL)
    assert "set agent.max_context_tokens=512, or start the server with --max-model-len 1024" in \
        context_problem(model, 1024, URL)
    assert request_problem(model, 500, 12, URL) is None
    assert "a prompt of 501 tokens plus max_new_tokens=12 does not fit" in request_problem(model, 501, 12, URL)


def test_the_logprobs_mode_from_the_top_logprobs_at_two_temperatures():
    def answer(*values):
        return {"choices": [{"logprobs": {"top_logprobs": [{f"token_id:{i}": v for i, v in enumerate(values)}]}}]}

    assert top_logprob(answer(-0.5, -2.0, -3.0)) == -0.5
    assert top_logprob(answer(-0.5)) is None  # only the sampled token's (serve-policy): cannot tell
    assert top_logprob({"choices": []}) is None and top_logprob(None) is None
    assert logprobs_mode(-0.9, -0.3) == "processed"  # sharper at T=0.5
    assert logprobs_mode(-0.9, -0.9) == "raw"
    assert logprobs_mode(-1e-6, -1e-7) == "unknown"  # a certain top token moves at no temperature
    assert logprobs_mode(None, -0.3) == "unknown"
