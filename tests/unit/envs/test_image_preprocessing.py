"""Image preprocessing of gymnasium envs (fastrl/envs/wrappers/image_preprocessing.py) against a brute-force
reference on tests/support/image_envs.py, whose frames encode their episode and step."""
import sys

import cv2
import numpy as np
import pytest

from fastrl.config import ConfigError, build_config, weights_mismatch
from fastrl.envs import ImageOptions, make_vec_env
from fastrl.envs.wrappers.image_preprocessing import PreprocessedEnv
from tests.support.image_envs import StepImageEnv, SteppedPastTheEnd, frame

IMAGE_ENV = "tests.support.image_envs:make_step_image_env"


def reference(raw: np.ndarray, grayscale: bool, resize: tuple) -> np.ndarray:
    """One processed frame, written for clarity: uint8 [H, W, C] -> [C', H', W'] by cv2's own calls."""
    if grayscale and raw.shape[2] > 1:
        raw = cv2.cvtColor(raw, cv2.COLOR_RGB2GRAY if raw.shape[2] == 3 else cv2.COLOR_RGBA2GRAY)[..., None]
    if resize:
        raw = cv2.resize(raw, (resize[1], resize[0]), interpolation=cv2.INTER_AREA).reshape(*resize, -1)
    return raw.transpose(2, 0, 1)


def reference_stack(episode: int, steps: list[int], n: int, grayscale: bool, resize: tuple, **shape) -> np.ndarray:
    """The stack after the frames of ``steps`` (the episode's step indices so far, its reset's 0
    first): the last n, the reset frame repeated before them."""
    chosen = [steps[max(0, len(steps) - n + j)] for j in range(n)]
    return np.concatenate([reference(frame(episode, t, **shape), grayscale, resize) for t in chosen])


@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
@pytest.mark.parametrize("frame_skip", [1, 3, 4, 7, 9])
def test_action_repeat_sums_rewards_and_never_steps_past_an_episode_end(frame_skip, truncate):
    length = 7
    env = PreprocessedEnv(StepImageEnv(length=length, truncate=truncate), ImageOptions(frame_skip=frame_skip),
                          IMAGE_ENV)
    for episode in range(2):
        obs, _ = env.reset()
        np.testing.assert_array_equal(obs, frame(episode, 0))
        chunks = [list(range(t + 1, min(t + frame_skip, length) + 1)) for t in range(0, length, frame_skip)]
        for i, chunk in enumerate(chunks):
            obs, reward, terminated, truncated, _ = env.step(0)
            last = i == len(chunks) - 1
            assert reward == sum(chunk)
            assert (terminated, truncated) == (last and not truncate, last and truncate)
            np.testing.assert_array_equal(obs, frame(episode, chunk[-1]))
        assert env.unwrapped.raw_steps == length * (episode + 1)
    with pytest.raises(SteppedPastTheEnd):  # the env does refuse a step past its end
        env.step(0)


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("grayscale, resize", [(True, ()), (False, (7, 9)), (True, (7, 9)), (False, (12, 16)),
                                               (False, (24, 20)), (True, (24, 20))],
                         ids=["gray", "down", "gray-down", "same-size", "up", "gray-up"])
def test_images_are_cv2s_grayscale_and_inter_area_resize_in_chw(channels, grayscale, resize):
    env = PreprocessedEnv(StepImageEnv(channels=channels), ImageOptions(resize=resize, grayscale=grayscale), IMAGE_ENV)
    out_channels = 1 if grayscale else channels
    assert env.observation_space.shape == (out_channels, *(resize or (12, 16)))
    obs, _ = env.reset()
    observed = [obs.copy()] + [env.step(0)[0].copy() for _ in range(3)]
    for t, obs in enumerate(observed):
        expected = reference(frame(0, t, channels=channels), grayscale, resize)
        assert obs.dtype == np.uint8
        np.testing.assert_array_equal(obs, expected)
    if grayscale and channels > 1:  # the reference does convert: a luminance plane, not a copied channel
        assert not any(np.array_equal(observed[0][0], frame(0, 0, channels=channels)[..., c]) for c in range(channels))


@pytest.mark.parametrize("image_keys", [(), ("screen",)], ids=["every-image", "screen-only"])
def test_stacks_hold_the_newest_frames_and_restart_at_every_episode_start(image_keys):
    # Envs of different lengths (vary: 3, 4, 5 steps) in splits, frame skip 2, autoresets: each
    # row's stack is checked against its own episode's frames, read back from its untouched clock.
    n, resize, skip = 3, (7, 9), 2
    options = ImageOptions(frame_skip=skip, resize=resize, grayscale=True, frame_stack=n, image_keys=image_keys)
    env = make_vec_env(IMAGE_ENV, num_envs=6, batch_size=3, seed=0,
                       env_kwargs={"length": 3, "vary": 3, "dict_obs": True}, preprocessing=options)
    lengths = [3 + i % 3 for i in range(6)]
    assert env.frame_skip == skip
    assert env.observation_space["screen"].shape == (n, *resize)
    history = [[] for _ in range(6)]  # per env: (episode, [its steps so far])
    expected_clock = [None] * 6
    episodes_done = np.zeros(6, int)
    env.async_reset()
    try:
        for _ in range(40):
            obs, rewards, terminated, truncated, ids = env.recv()
            for row, env_id in enumerate(ids):
                episode, t = obs["clock"][row]
                if expected_clock[env_id] is not None:
                    assert (episode, t) == expected_clock[env_id]
                if t == 0:
                    history[env_id] = (episode, [0])
                else:
                    history[env_id][1].append(t)
                    assert rewards[row] == sum(range(history[env_id][1][-2] + 1, t + 1))
                ended = t == lengths[env_id]
                assert terminated[row] == ended and not truncated[row]
                episodes_done[env_id] += ended
                expected_clock[env_id] = (episode + 1, 0) if ended else (episode, min(t + skip, lengths[env_id]))
                np.testing.assert_array_equal(obs["screen"][row], reference_stack(*history[env_id], n, True, resize))
                np.testing.assert_array_equal(obs["grid"][row], np.full((4, 4), t, np.uint8))
                minimap = reference_stack(episode, [s + 1 for s in history[env_id][1]], n, True, resize,
                                          height=8, width=8)
                if image_keys:
                    np.testing.assert_array_equal(obs["minimap"][row], frame(episode, t + 1, 8, 8, 3))
                else:
                    np.testing.assert_array_equal(obs["minimap"][row], minimap)
            env.send(np.zeros(len(ids), np.int64), ids)
    finally:
        env.close()
    assert (episodes_done >= 3).all()


@pytest.mark.parametrize("env_id, backend, kwargs, options, message", [
    ("CartPole-v1", "auto", {}, ImageOptions(resize=(8, 8)),
     "env.resize: envpool steps 'CartPole-v1' in C++, where fastrl cannot preprocess it: use a gymnasium id with "
     "env.backend=gymnasium, or unset it"),
    ("Pong-v5", "auto", {}, ImageOptions(frame_skip=2, resize=(84, 84), grayscale=True, frame_stack=3),
     "env.frame_skip, env.resize, env.grayscale, env.frame_stack: envpool preprocesses 'Pong-v5' itself: unset them "
     "and set its own options in env.kwargs (frame_skip, img_height, img_width, gray_scale, stack_num)"),
    ("CartPole-v1", "gymnasium", {}, ImageOptions(frame_stack=2),
     "env.resize, env.grayscale and env.frame_stack process images (uint8 [height, width, channels], channels 1, 3 "
     "or 4); 'CartPole-v1' observes float32 [4]: unset them"),
    ("fastrl.envs.toy:AgreementGames", "auto", {}, ImageOptions(frame_skip=2),
     "env.frame_skip: 'fastrl.envs.toy:AgreementGames' is a VecEnv class that makes its own rows: preprocess in it, "
     "or unset it"),
    ("pettingzoo:mpe2.simple_spread_v3", "auto", {}, ImageOptions(grayscale=True),
     "env.grayscale: 'pettingzoo:mpe2.simple_spread_v3' is a PettingZoo env, and preprocessing is for single-agent "
     "gymnasium envs: preprocess in the env, or unset it"),
    (IMAGE_ENV, "auto", {"dict_obs": True}, ImageOptions(resize=(8, 8), image_keys=("screen", "nope")),
     f"env.image_keys: {IMAGE_ENV!r} has no observation leaf 'nope'; its leaves: clock, grid, minimap, screen"),
    (IMAGE_ENV, "auto", {"dict_obs": True}, ImageOptions(frame_stack=2, image_keys=("grid",)),
     f"env.image_keys: leaf 'grid' of {IMAGE_ENV!r} is uint8 [4, 4], not an image (uint8 [height, width, channels], "
     f"channels 1, 3 or 4)"),
    (IMAGE_ENV, "auto", {}, ImageOptions(grayscale=True, image_keys=("screen",)),
     f"env.image_keys names leaves of a Dict observation; {IMAGE_ENV!r} observes uint8 [12, 16, 3]: unset "
     f"env.image_keys"),
    (IMAGE_ENV, "auto", {"dict_obs": True}, ImageOptions(frame_skip=4, image_keys=("screen",)),
     "env.image_keys chooses the images that env.resize, env.grayscale and env.frame_stack process: set one of them, "
     "or unset env.image_keys"),
], ids=["envpool", "envpool-atari", "no-image", "vector-class", "pettingzoo", "no-such-leaf", "leaf-no-image",
        "keys-of-a-box", "keys-alone"])
def test_options_that_cannot_apply_are_refused_in_one_line(env_id, backend, kwargs, options, message):
    with pytest.raises(ValueError) as caught:
        make_vec_env(env_id, num_envs=3, batch_size=3, seed=0, backend=backend, env_kwargs=kwargs,
                     preprocessing=options)
    assert str(caught.value) == message


def test_gymnasium_atari_names_its_envpool_options():
    pytest.importorskip("ale_py")
    with pytest.raises(ValueError, match=r"^env.frame_stack: fastrl's Atari \(as envpool\) preprocesses "
                                         r"'ALE/Pong-v5' itself: unset it and set its own options in env.kwargs "
                                         r"\(stack_num\)$"):
        make_vec_env("ALE/Pong-v5", 1, 1, 0, preprocessing=ImageOptions(frame_stack=2))


def test_without_opencv_the_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 raises ImportError
    with pytest.raises(ValueError, match="^image preprocessing .* needs OpenCV: pip install opencv-python-headless$"):
        PreprocessedEnv(StepImageEnv(), ImageOptions(resize=(8, 8)), IMAGE_ENV)
    # A frame stack alone is numpy's work: no OpenCV needed.
    assert PreprocessedEnv(StepImageEnv(), ImageOptions(frame_stack=2), IMAGE_ENV).reset()[0].shape == (6, 12, 16)


def test_resize_is_height_and_width():
    with pytest.raises(ConfigError,
                       match=r"^env.resize is \[height, width\] \(or \[\] to keep the size\), got \[72\]$"):
        build_config("cartpole-appo", {"env.resize": [72]})


def test_a_checkpoint_keeps_its_preprocessing_and_predates_it_by_the_defaults():
    cfg = build_config("cartpole-appo", {"env.resize": [72, 128]})
    saved = build_config("cartpole-appo").to_dict()
    assert weights_mismatch(saved, cfg) == "env.resize: [] -> [72, 128]"
    for key in ("frame_skip", "resize", "grayscale", "frame_stack", "image_keys"):
        del saved["env"][key]  # a run from before the keys existed had their defaults
    assert weights_mismatch(saved, build_config("cartpole-appo")) == ""
