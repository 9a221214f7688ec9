"""scripts/benchmarks/options.py: every layout of scripts/layouts/ is a valid config of its profile,
a layout file is read as a profile is (sections as tables), and a bad one fails in one line."""
import pytest

from fastrl.config import ConfigError, build_config
from tests.scripts import load_benchmark

options = load_benchmark("options")


@pytest.mark.parametrize("name", options.layout_names())
def test_every_layout_builds_a_valid_config_of_its_profile(name):
    layout = options.load_layout(name)
    cfg = build_config(layout.profile, layout.overrides)
    assert cfg.device == "cpu"


def test_a_layout_file_holds_a_profile_and_its_overrides_by_section(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('profile = "cartpole-appo"\nseed = 3\n[env]\nnum_workers = 1\nkwargs = {length = 4}\n'
                    '[learner]\nlr = 0.01\n')
    layout = options.load_layout(str(path))
    assert layout == options.Layout("cartpole-appo", {"seed": 3, "env.num_workers": 1, "env.kwargs": {"length": 4},
                                                      "learner.lr": 0.01})
    assert options.load_layout("pong-cpu") == options.Layout("atari-appo", {
        "device": "cpu", "env.num_workers": 2, "env.envs_per_worker": 16, "learner.rollout": 32,
        "learner.batch_size": 512})


@pytest.mark.parametrize("text,message", [
    ("seed = 3\n", "names no profile: add profile = \"NAME\""),
    ("profile = \n", "is not valid TOML"),
])
def test_a_bad_layout_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        options.load_layout(str(path))
    with pytest.raises(ConfigError, match="unknown layout 'nope': available: cartpole-earlier, memory-appo"):
        options.load_layout("nope")
