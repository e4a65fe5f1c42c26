"""The warm start says so when the scripted player's turns are longer than the sampler may write
(``agent.max_new_tokens``): the model would learn turns RL always cuts."""

import logging

from turnrl.envs import GuessNumberEnv
from turnrl.train.warm_start import warm_start


def test_turns_longer_than_max_new_tokens_warn_once_naming_both_lengths(fresh_model, renderer, caplog):
    env = GuessNumberEnv(n=32, max_turns=4)
    with caplog.at_level(logging.WARNING, logger="turnrl.train.warm_start"):
        warm_start(fresh_model, renderer, env, steps=1, batch_size=2, lr=1e-4, progress=False, max_new_tokens=1)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "above agent.max_new_tokens=1" in warnings[0], warnings
    longest = int(warnings[0].split("turns reach ")[1].split(" tokens")[0])
    assert longest > 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="turnrl.train.warm_start"):
        warm_start(fresh_model, renderer, env, steps=1, batch_size=2, lr=1e-4, progress=False, max_new_tokens=longest)
    assert not caplog.records  # a cap the longest turn fits in: quiet
