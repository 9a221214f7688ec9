"""scripts/benchmarks/options.py: every setup of scripts/benchmarks/setups/ is a valid config of its
profile, a setup file is read as a profile is (sections as tables), and a bad one fails in one line."""
import pytest

from fastrl.config import ConfigError, build_config
from tests.support.scripts import load_benchmark

options = load_benchmark("options")


@pytest.mark.parametrize("name", options.setup_names())
def test_every_setup_builds_a_valid_config_of_its_profile(name):
    setup = options.load_setup(name)
    cfg = build_config(setup.profile, setup.overrides)
    assert cfg.device == "cpu"


def test_a_setup_file_holds_a_profile_and_its_overrides_by_section(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('profile = "cartpole-appo"\nseed = 3\n[env]\nnum_workers = 1\nkwargs = {length = 4}\n'
                    '[learner]\nlr = 0.01\n')
    setup = options.load_setup(str(path))
    assert setup == options.Setup("cartpole-appo", {"seed": 3, "env.num_workers": 1, "env.kwargs": {"length": 4},
                                                      "learner.lr": 0.01})
    assert options.load_setup("pong-cpu") == options.Setup("atari-appo", {
        "device": "cpu", "env.num_workers": 2, "env.envs_per_worker": 16, "learner.rollout": 32,
        "learner.batch_size": 512, "learner.num_epochs": 1, "learner.num_minibatches": 2})


@pytest.mark.parametrize("text,message", [
    ("seed = 3\n", "names no profile: add profile = \"NAME\""),
    ("profile = \n", "is not valid TOML"),
])
def test_a_bad_setup_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        options.load_setup(str(path))
    with pytest.raises(ConfigError, match="unknown setup 'nope': available: cartpole-earlier, memory-appo"):
        options.load_setup("nope")
