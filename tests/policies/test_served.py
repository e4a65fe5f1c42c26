"""``ServedPolicy``'s checks and bookkeeping (its pushes to real servers are tested end to end in
tests/train/test_http_train.py, against two ``turnrl serve-policy`` servers and a vLLM server)."""

import pytest

from turnrl.policies.http import OpenAIPolicy
from turnrl.policies.served import ServedPolicy


def test_it_refuses_no_servers_and_servers_that_are_not_token_exact(tokenizer, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="at least one server"):
        ServedPolicy([], tmp_path, tiny_model.config)
    text = OpenAIPolicy("http://127.0.0.1:9", "m", mode="text", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="not token-exact"):
        ServedPolicy([text], tmp_path, tiny_model.config)


def test_push_numbering_goes_on_after_a_resumed_runs_last_push(tiny_model, tmp_path):
    (tmp_path / "push-000007").mkdir()
    served = ServedPolicy([OpenAIPolicy("http://127.0.0.1:9", "m")], tmp_path, tiny_model.config)
    assert served.pushes == 7 and served._current == tmp_path / "push-000007"
    assert served.rng_state() == {}
    served.set_rng_state({})
    with pytest.raises(ValueError, match="another agent.backend"):
        served.set_rng_state({"bit_generator": "PCG64"})
