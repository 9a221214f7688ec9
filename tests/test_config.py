import tomllib

import pytest

from fastrl.config import ConfigError, available_profiles, build_config, load_profile, set_key, to_toml


def test_every_profile_loads_and_states_its_expected_result():
    names = available_profiles()
    assert {"cartpole-appo", "atari-appo", "atari-impala", "mujoco-appo"} <= set(names)
    for name in names:
        cfg = build_config(name)
        assert cfg.expected


def test_set_parses_by_declared_type():
    cfg = load_profile("cartpole-appo")
    set_key(cfg, "learner.lr", "1e-3")
    set_key(cfg, "env.num_workers", "3")
    set_key(cfg, "model.hidden_sizes", "[32, 16]")
    set_key(cfg, "model.normalize_obs", "true")
    set_key(cfg, "device", "cpu")
    set_key(cfg, "env.kwargs", "{max_episode_steps = 100}")
    assert cfg.learner.lr == 1e-3 and cfg.env.num_workers == 3
    assert cfg.model.hidden_sizes == [32, 16] and cfg.model.normalize_obs is True
    assert cfg.device == "cpu" and cfg.env.kwargs == {"max_episode_steps": 100}


@pytest.mark.parametrize("key, value, message", [
    ("learner.lrr", "1", "did you mean learner.lr"),
    ("learner.lr", "fast", "expects float"),
    ("env.num_workers", "2.5", "expects int"),
    ("model.normalize_obs", "maybe", "expects bool"),
    ("nosection.key", "1", "unknown config key"),
])
def test_bad_keys_and_values_name_the_fix(key, value, message):
    cfg = load_profile("cartpole-appo")
    with pytest.raises(ConfigError, match=message):
        set_key(cfg, key, value)


@pytest.mark.parametrize("overrides, message", [
    ({"env.num_splits": 3}, "divisible by env.num_splits"),
    ({"learner.batch_size": 1000}, "multiple of learner.rollout"),
    ({"learner.batch_size": 32 * 100000}, "lower learner.batch_size"),
    ({"learner.algo": "ppo2"}, "must be one of appo, impala"),
    ({"device": "tpu"}, "auto, cpu, cuda"),
    ({"learner.gamma": 1.5}, r"\[0, 1\]"),
    ({"train_for_env_steps": 0, "train_for_seconds": 0}, "never end"),
])
def test_impossible_combinations_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config("cartpole-appo", overrides)


def test_unknown_profile_lists_close_matches():
    with pytest.raises(ConfigError, match="did you mean cartpole-appo"):
        load_profile("cartpol-appo")


def test_resolved_config_round_trips_through_toml():
    cfg = build_config("mujoco-appo", {"env.kwargs": {"max_episode_steps": 100}})
    data = tomllib.loads(to_toml(cfg))
    assert data["learner"]["lr"] == cfg.learner.lr
    assert data["model"]["hidden_sizes"] == cfg.model.hidden_sizes
    assert data["env"]["kwargs"] == {"max_episode_steps": 100}
    assert data["device"] == cfg.device
