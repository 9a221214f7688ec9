"""The actors (rollout workers, batcher) run below the learner, the evaluator below them."""

import pytest

from fastrl.config import ConfigError, build_config


@pytest.mark.parametrize("value", [-1, 20])
def test_actor_niceness_outside_linux_range_is_refused(value):
    with pytest.raises(ConfigError, match="actor_niceness"):
        build_config("cartpole-appo", {"actor_niceness": value})
