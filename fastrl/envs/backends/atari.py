"""Atari through gymnasium + ale-py, preprocessed like envpool's Atari defaults.

So that a run on the gymnasium backend sees the same observations, rewards and episode ends as
one on envpool, `make_atari_env` takes envpool's Atari config keys (`ENVPOOL_ATARI_DEFAULTS`,
checked against `envpool.make_spec("Pong-v5").config` by the tests) and maps them:

  envpool key (default)            here
  frame_skip (4)                   AtariPreprocessing(frame_skip) over an ALE env with frameskip=1;
                                   max-pool of the last two frames, as envpool
  img_height, img_width (84, 84)   AtariPreprocessing(screen_size), cv2 INTER_AREA resize
  gray_scale (True)                AtariPreprocessing(grayscale_obs=True); only True is supported
  use_inter_area_resize (True)     AtariPreprocessing always uses INTER_AREA; only True is supported
  stack_num (4)                    FrameStackObservation(stack_num) -> obs [stack_num, 84, 84] uint8
  noop_max (30), use_fire_reset    _NoopFireReset: envpool's reset, U{1..noop_max} no-ops, or
  (True)                           U{0..noop_max-1} no-ops then FIRE in games that have FIRE
  repeat_action_probability (0.0)  ALE env argument (gymnasium's v5 default is 0.25: overridden)
  full_action_space (False)        ALE env argument
  max_episode_steps (27000)        _EnvpoolEpisode: truncated=True after that many agent steps
                                   (108,000 frames); ALE's own frame limit is switched off
  episodic_life (False)            _EnvpoolEpisode: terminated on a lost life; the next reset
                                   continues the game (no-ops and FIRE only)
  reward_clip (False)              _EnvpoolEpisode: reward = sign(reward)

As on envpool, the step that ends a game (its last life lost, or the time limit) has the game's
unclipped score in ``info["game_return"]`` (fastrl.envs.game_return).

Known difference: after a lost life with episodic_life=True envpool keeps the older stacked
frames, while FrameStackObservation refills the stack with the first frame of the new life.
Other keyword arguments go to `ale_py.AtariEnv` (e.g. mode, difficulty).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from fastrl.envs.game_return import GAME_RETURN_KEY

ALE_ENTRY_POINT = "ale_py.env:AtariEnv"

ENVPOOL_ATARI_DEFAULTS: dict[str, Any] = {
    "frame_skip": 4,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "use_inter_area_resize": True,
    "stack_num": 4,
    "noop_max": 30,
    "use_fire_reset": True,
    "repeat_action_probability": 0.0,
    "full_action_space": False,
    "max_episode_steps": 27000,
    "episodic_life": False,
    "reward_clip": False,
}

# Reset option that _EnvpoolEpisode passes down to _NoopFireReset: continue after a lost life.
_LIFE_RESET = "fastrl_life_reset"


def is_atari_id(env_id: str) -> bool:
    """True for gymnasium ids served by ale-py ("ALE/Pong-v5", "PongNoFrameskip-v4", ...)."""
    spec = gymnasium.registry.get(env_id)
    return spec is not None and spec.entry_point == ALE_ENTRY_POINT


def atari_config(env_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split `env_kwargs` into (envpool-style config with defaults filled in, ALE env kwargs)."""
    config = dict(ENVPOOL_ATARI_DEFAULTS)
    ale_kwargs = {}
    for key, value in env_kwargs.items():
        if key in config:
            config[key] = value
        else:
            ale_kwargs[key] = value
    if not (config["gray_scale"] and config["use_inter_area_resize"]):
        raise ValueError(
            "Atari on the gymnasium backend supports only gray_scale=True and "
            "use_inter_area_resize=True; use the envpool backend for other settings"
        )
    if config["noop_max"] < 1:
        raise ValueError(f"noop_max must be >= 1 (as in envpool), got {config['noop_max']}")
    return config, ale_kwargs


def make_atari_env(env_id: str, **env_kwargs: Any) -> gymnasium.Env:
    """One Atari env as envpool would make it: obs uint8 [stack_num, img_height, img_width].

    Args:
        env_id: an ale-py gymnasium id, e.g. "ALE/Pong-v5" or "PongNoFrameskip-v4".
        env_kwargs: envpool Atari config keys (see the module docstring) and ALE env arguments.
    """
    import ale_py

    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError as exc:
        raise ImportError(
            f"{env_id} on the gymnasium backend needs OpenCV: pip install "
            "opencv-python-headless, or use the envpool backend (e.g. 'Pong-v5')"
        ) from exc
    config, ale_kwargs = atari_config(env_kwargs)
    ale_kwargs = {
        **gymnasium.spec(env_id).kwargs,
        # Preprocessing does the frame skipping; grayscale base obs skip an unused RGB render.
        "frameskip": 1,
        "obs_type": "grayscale",
        "repeat_action_probability": config["repeat_action_probability"],
        "full_action_space": config["full_action_space"],
        "max_num_frames_per_episode": 0,  # no limit: _EnvpoolEpisode counts agent steps
        **ale_kwargs,
    }
    env = ale_py.AtariEnv(**ale_kwargs)
    env = _NoopFireReset(env, config["noop_max"], config["use_fire_reset"])
    env = AtariPreprocessing(
        env,
        noop_max=0,  # _NoopFireReset does envpool's no-ops
        frame_skip=config["frame_skip"],
        screen_size=(config["img_width"], config["img_height"]),
        terminal_on_life_loss=False,  # _EnvpoolEpisode does envpool's episodic life
        grayscale_obs=True,
    )
    env = FrameStackObservation(env, config["stack_num"])
    return _EnvpoolEpisode(
        env, config["max_episode_steps"], config["episodic_life"], config["reward_clip"]
    )


class _NoopFireReset(gymnasium.Wrapper):
    """envpool's Atari reset on single frames: no-ops, then FIRE in games that have it.

    With reset option `_LIFE_RESET` the game is not reset (episodic life: a life was lost).
    """

    def __init__(self, env: gymnasium.Env, noop_max: int, use_fire_reset: bool) -> None:
        super().__init__(env)
        self._noop_max = noop_max
        meanings = env.unwrapped.get_action_meanings()
        self._fire = meanings.index("FIRE") if use_fire_reset and "FIRE" in meanings else None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        if options and options.get(_LIFE_RESET):
            obs, info = None, {}
        else:
            obs, info = self.env.reset(seed=seed, options=options)
        noops = int(self.np_random.integers(self._noop_max)) + (1 if self._fire is None else 0)
        for _ in range(noops):
            obs, _, terminated, _, info = self.env.step(0)
            if terminated:
                obs, info = self.env.reset()
        if self._fire is not None:
            obs, _, _, _, info = self.env.step(self._fire)
        return obs, info


class _EnvpoolEpisode(gymnasium.Wrapper):
    """envpool's episode rules on agent steps: time limit, episodic life, reward clipping.

    As in envpool, reaching the time limit reports truncated=True (never terminated) even when
    the game ends on that same step, and the step counter restarts only when the game does. The
    step that ends the game carries its unclipped score in ``info[GAME_RETURN_KEY]``.
    """

    def __init__(
        self, env: gymnasium.Env, max_episode_steps: int, episodic_life: bool, reward_clip: bool
    ) -> None:
        super().__init__(env)
        self._max_episode_steps = max_episode_steps
        self._episodic_life = episodic_life
        self._reward_clip = reward_clip
        self._elapsed = max_episode_steps  # forces a full reset first
        self._lives = 0
        self._game_return = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        ale = self.unwrapped.ale
        full_reset = (
            not self._episodic_life
            or seed is not None
            or ale.game_over()
            or self._elapsed >= self._max_episode_steps
        )
        if full_reset:
            self._elapsed = 0
            self._game_return = 0.0
        else:
            options = {**(options or {}), _LIFE_RESET: True}
        obs, info = self.env.reset(seed=seed, options=options)
        self._lives = ale.lives()
        return obs, info

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._elapsed += 1
        lives = self.unwrapped.ale.lives()
        life_lost = self._episodic_life and 0 < lives < self._lives
        self._lives = lives
        time_up = self._elapsed >= self._max_episode_steps
        ended = terminated or life_lost
        self._game_return += float(reward)
        if terminated or truncated or time_up:
            info = {**info, GAME_RETURN_KEY: self._game_return}
        if self._reward_clip:
            reward = float(np.sign(reward))
        return obs, reward, ended and not time_up, time_up or (truncated and not ended), info
