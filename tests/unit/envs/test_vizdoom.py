"""ViZDoom's gymnasium ids as a backend family (fastrl/envs/backends/vizdoom_backend.py): ids that resolve
with no factory, the engine resolution and frame skip chosen from env.resize and env.frame_skip,
observations through fastrl's Dict path, and the one-line error without the package."""

import importlib.util
import sys

import gymnasium
import numpy as np
import pytest

from fastrl.config import build_config
from fastrl.envs import ImageOptions, make_vec_env, probe_env, resolve_backend
from fastrl.envs.backends import vizdoom_backend

needs_vizdoom = pytest.mark.skipif(importlib.util.find_spec("vizdoom") is None,
                                   reason="vizdoom is not installed (pip install 'fastrl[vizdoom]')")


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the engine writes _vizdoom.ini and _vizdoom/ into the working directory


def test_missing_vizdoom_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vizdoom.gymnasium_wrapper", None)  # import fails as if not installed
    with pytest.raises(ValueError) as raised:
        resolve_backend("VizdoomBasic-v1")
    message = str(raised.value)
    assert "\n" not in message and "pip install 'fastrl[vizdoom]'" in message


def test_vizdoom_ids_only_by_their_prefix():
    assert vizdoom_backend.is_vizdoom_id("VizdoomHealthGatheringSupreme-v1")
    assert not vizdoom_backend.is_vizdoom_id("CartPole-v1")
    assert not vizdoom_backend.is_vizdoom_id("VizdoomLike:make")  # a user's factory


@needs_vizdoom
def test_vizdoom_id_resolves_with_no_factory():
    assert resolve_backend("VizdoomBasic-v1") == "gymnasium"
    assert resolve_backend("VizdoomDefendCenter-v1", "gymnasium") == "gymnasium"


@needs_vizdoom
@pytest.mark.parametrize(("resize", "expected"), [
    ((72, 128), "RES_160X120"),  # Sample Factory's doom setting
    ((120, 160), "RES_160X120"),
    ((121, 160), "RES_200X125"),
    ((84, 84), "RES_160X120"),
    ((144, 256), "RES_256X144"),
    ((240, 320), "RES_320X240"),
    ((7, 7), "RES_160X120"),
])
def test_engine_resolution_is_the_smallest_at_least_the_resize(resize, expected):
    assert vizdoom_backend.engine_resolution(*resize) == expected


@needs_vizdoom
def test_engine_resolution_larger_than_any_is_one_line():
    with pytest.raises(ValueError, match="choose a smaller env.resize"):
        vizdoom_backend.engine_resolution(2000, 3000)


@needs_vizdoom
def test_env_renders_at_the_engine_resolution_and_skips_in_the_engine():
    env = vizdoom_backend.vizdoom_env_fn("VizdoomBasic-v1", {}, frame_skip=4, resize=[72, 128])()
    try:
        obs, _ = env.reset(seed=0)
        assert obs["screen"].shape == (120, 160, 3) and obs["screen"].dtype == np.uint8
        assert obs["gamevariables"].shape == (1,)
        game = env.unwrapped.game
        start = game.get_episode_time()
        _, reward, _, _, _ = env.step(0)
        assert game.get_episode_time() - start == 4
        assert reward == pytest.approx(-4.0)  # basic.cfg: living reward -1 per tic, summed over the skip
    finally:
        env.close()


@needs_vizdoom
def test_a_resolution_in_env_kwargs_wins_and_its_frame_skip_is_refused():
    env = vizdoom_backend.vizdoom_env_fn("VizdoomBasic-v1", {"screen_resolution": "RES_320X240"}, frame_skip=1,
                                         resize=[72, 128])()
    try:
        assert env.observation_space["screen"].shape == (240, 320, 3)
    finally:
        env.close()
    with pytest.raises(ValueError, match="env.frame_skip, not env.kwargs.frame_skip"):
        vizdoom_backend.vizdoom_env_fn("VizdoomBasic-v1", {"frame_skip": 4}, frame_skip=1, resize=[])


@needs_vizdoom
@pytest.mark.parametrize(("env_kwargs", "message"), [
    ({"scenario_config_file": "no_such_scenario.cfg"}, "the ViZDoom engine cannot start with env.kwargs "
                                                       "{'scenario_config_file': 'no_such_scenario.cfg'} "
                                                       "(FileDoesNotExistException: "),
    ({"doom_scenario_path": "/no/such.wad"}, 'cannot start with env.kwargs {\'doom_scenario_path\': '
                                             '\'/no/such.wad\'} (FileDoesNotExistException: File "/no/such.wad" '
                                             'does not exist.); correct the file paths'),
    ({"max_buttons_pressed": -1}, "(RuntimeError: max_buttons_pressed=-1 < 0."),
    ({"doom_skil": 3}, "env.kwargs: 'VizdoomBasic-v1' takes no argument 'doom_skil' (did you mean doom_skill?)"),
    ({"config_file": "basic.cfg"}, "takes no argument 'config_file' (did you mean scenario_config_file?)"),
])
def test_a_scenario_or_engine_key_the_engine_refuses_is_one_line_when_the_env_is_probed(env_kwargs, message):
    cfg = build_config("vizdoom-basic", {"env.kwargs": env_kwargs})
    with pytest.raises(ValueError) as raised:
        probe_env(cfg)
    text = str(raised.value)
    assert "\n" not in text and message in text, text


@needs_vizdoom
def test_engine_keys_in_any_case_and_gymnasiums_own_are_taken():
    env = vizdoom_backend.vizdoom_env_fn("VizdoomBasic-v1", {"doom_skill": 2, "Render_HUD": True,
                                                            "max_episode_steps": 5}, frame_skip=1, resize=[])()
    try:
        env.reset(seed=0)
        assert [env.step(0)[3] for _ in range(5)] == [False] * 4 + [True]
    finally:
        env.close()


@needs_vizdoom
def test_timeout_ends_an_episode_truncated_not_terminated():
    # basic.cfg's episode_timeout is 300 tics; standing still never kills the monster.
    env = vizdoom_backend.vizdoom_env_fn("VizdoomBasic-v1", {}, frame_skip=4, resize=[72, 128])()
    try:
        obs, _ = env.reset(seed=0)
        steps, terminated, truncated = 0, False, False
        while not (terminated or truncated):
            previous = obs
            obs, _, terminated, truncated, _ = env.step(0)
            steps += 1
        assert truncated and not terminated
        assert steps == 300 // 4
        # The truncated step bootstraps from its final observation: the last rendered screen,
        # not the wrapper's all-zero stand-in (the engine has no state past the end).
        assert obs["screen"].any()
        np.testing.assert_array_equal(obs["screen"], previous["screen"])
        np.testing.assert_array_equal(obs["gamevariables"], previous["gamevariables"])
    finally:
        env.close()


class EndsInZeros(gymnasium.Env):
    """ViZDoom's wrapper in miniature: zeros as the observation of an episode's last step, which
    the player's death (``terminate``) or else the scenario's timeout ends; ``game`` answers as the
    engine's DoomGame does."""

    observation_space = gymnasium.spaces.Box(0.0, 10.0, (1,))
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, length: int, terminate: bool) -> None:
        self.length, self.terminate, self.t = length, terminate, 0
        self.game = self

    def is_episode_timeout_reached(self) -> bool:
        return self.t == self.length and not self.terminate

    def is_player_dead(self) -> bool:
        return self.t == self.length and self.terminate

    def reset(self, **kwargs):
        self.t = 0
        return np.array([1.0]), {}

    def step(self, action):
        self.t += 1
        end = self.t == self.length
        obs = np.zeros(1) if end else np.array([self.t + 1.0])
        return obs, -1.0, end, end and not self.terminate, {}


@pytest.mark.parametrize("terminate", [False, True])
def test_an_episode_ends_on_its_last_rendered_observation(terminate):
    env = vizdoom_backend.EpisodeEnds(EndsInZeros(length=3, terminate=terminate))
    for _ in range(2):  # a second episode starts from its own reset
        obs, _ = env.reset()
        assert obs[0] == 1.0
        seen = [env.step(0) for _ in range(3)]
        assert [s[0][0] for s in seen] == [2.0, 3.0, 3.0]
        assert [(s[2], s[3]) for s in seen][-1] == ((True, False) if terminate else (False, True))


@pytest.mark.parametrize(("terminate", "limit", "ends"), [
    (True, 3, (True, False)),  # a death on the TimeLimit's last step: terminated wins
    (False, 3, (False, True)),  # the scenario's timeout on the TimeLimit's last step
    (True, 2, (False, True)),  # the TimeLimit alone
])
def test_an_episode_end_on_the_time_limits_last_step_is_the_episodes_own(terminate, limit, ends):
    inner = gymnasium.wrappers.TimeLimit(EndsInZeros(length=3, terminate=terminate), max_episode_steps=limit)
    env = vizdoom_backend.EpisodeEnds(inner)
    env.reset()
    seen = [env.step(0) for _ in range(limit)]
    assert [(s[2], s[3]) for s in seen] == [(False, False)] * (limit - 1) + [ends]
    assert [s[0][0] for s in seen] == [2.0, 3.0, 3.0][:limit]  # never the engine's zeros


@needs_vizdoom
def test_frame_skip_runs_in_the_engine():
    env = make_vec_env("VizdoomBasic-v1", num_envs=1, batch_size=1, seed=0,
                       preprocessing=ImageOptions(frame_skip=4, resize=(72, 128)))
    try:
        env.async_reset()
        _, _, _, _, ids = env.recv()
        doom = env._vecs[0].envs[0].unwrapped  # the one env of the only split
        game = doom.game
        assert doom.frame_skip == 4  # one make_action(action, 4) per step, not four one-tic steps
        start = game.get_episode_time()
        env.send(np.zeros(1, dtype=np.int64), ids)
        env.recv()
        assert game.get_episode_time() - start == 4
        assert (game.get_screen_height(), game.get_screen_width()) == (120, 160)
    finally:
        env.close()
