"""Videos and fastrl-eval --best: frames in step with the episodes, an MP4 that decodes to them,
the best weights, and one-line errors for what a user can get wrong."""
import importlib.util
import itertools
import json
import os
import sys

import numpy as np
import pytest

from fastrl.cli import eval_main
from fastrl.config import build_config
from fastrl.envs import probe_env
from fastrl.evaluation import video as video_module
from fastrl.evaluation.video import VideoError, record_frames, write_video
from fastrl.files.checkpoint import best_checkpoint_path, write_checkpoint_file
from fastrl.models.networks import build_model
from tests.support.runs import LENGTH, toy_config

needs_imageio = pytest.mark.skipif(importlib.util.find_spec("imageio_ffmpeg") is None,
                                   reason="the [video] extra (imageio, imageio-ffmpeg) is not installed")




def untrained_model(cfg):
    spec = probe_env(cfg)
    return build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)


def expected_grey_levels(episodes):
    """PaintedCountdownEnv's frame t is grey 255 * t / LENGTH: t = 0..LENGTH in every episode."""
    return np.tile(np.round(255 * np.arange(LENGTH + 1) / LENGTH), episodes)


def test_frames_follow_the_steps_of_each_episode():
    cfg = toy_config()
    frames, result = record_frames(cfg, untrained_model(cfg), episodes=3, max_frames=1000)
    assert frames.shape == (3 * (LENGTH + 1), 32, 48, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames.reshape(len(frames), -1).mean(axis=1), expected_grey_levels(3))
    assert result["episodes"] == 3 and result["episode_length_mean"] == LENGTH
    clipped, _ = record_frames(cfg, untrained_model(cfg), episodes=2, max_frames=5)
    assert len(clipped) == 5


@needs_imageio
def test_a_video_has_one_frame_per_step_and_per_episode_start(tmp_path):
    import imageio

    cfg = toy_config()
    path = tmp_path / "nested" / "episodes.mp4"  # a missing directory is made
    result = write_video(cfg, untrained_model(cfg), path, episodes=4, fps=25)
    assert result["video"] == str(path) and result["video_frames"] == 4 * (LENGTH + 1)
    reader = imageio.get_reader(path)
    try:
        assert reader.get_meta_data()["codec"] == "h264" and reader.get_meta_data()["fps"] == 25
        decoded = np.stack([frame for frame in reader.iter_data()])
    finally:
        reader.close()
    assert decoded.shape == (4 * (LENGTH + 1), 32, 48, 3)
    # H.264 is lossy: each frame's grey level comes back within a few steps of 255.
    np.testing.assert_allclose(decoded.reshape(len(decoded), -1).mean(axis=1), expected_grey_levels(4), atol=4)


OLD_VIDEO = b"the video of an earlier run"


@needs_imageio
@pytest.mark.parametrize("failure, raised", [(RuntimeError("the renderer crashed"), VideoError),
                                             (KeyboardInterrupt(), KeyboardInterrupt)])
def test_a_failed_video_leaves_the_file_it_would_replace_as_it_was(tmp_path, monkeypatch, failure, raised):
    path = tmp_path / "episodes.mp4"
    path.write_bytes(OLD_VIDEO)
    opened = video_module.open_rendered_env

    def fails_at_the_fourth_frame(cfg, seed):
        env, render = opened(cfg, seed)
        count = itertools.count()

        def render_or_fail():
            if next(count) == 3:
                raise failure
            return render()

        return env, render_or_fail

    monkeypatch.setattr(video_module, "open_rendered_env", fails_at_the_fourth_frame)
    cfg = toy_config()
    with pytest.raises(raised):
        write_video(cfg, untrained_model(cfg), path, episodes=2)
    assert path.read_bytes() == OLD_VIDEO
    assert os.listdir(tmp_path) == ["episodes.mp4"]  # the unfinished video is gone
    monkeypatch.undo()
    write_video(cfg, untrained_model(cfg), path, episodes=1)  # a complete video replaces it
    assert path.read_bytes()[4:8] == b"ftyp" and os.listdir(tmp_path) == ["episodes.mp4"]


def test_envpool_renders_its_rgb_screen_not_the_observation():
    cfg = build_config("cartpole-appo", {"env.id": "CartPole-v1", "env.backend": "envpool", "device": "cpu"})
    frames, _ = record_frames(cfg, untrained_model(cfg), episodes=1, max_frames=3)
    assert frames.shape == (3, 400, 600, 3) and frames.dtype == np.uint8 and frames.std() > 0


def test_a_factory_without_render_mode_is_one_line():
    cfg = toy_config("fastrl.envs.toy:make_countdown", {"length": 3})
    with pytest.raises(VideoError, match="takes no render_mode"):
        record_frames(cfg, untrained_model(cfg))


def write_best(run_dir, latest, env_steps):
    write_checkpoint_file(best_checkpoint_path(run_dir), {
        "learner": {"model": latest["learner"]["model"]}, "counters": {"env_steps": env_steps, "weights_version": 3},
        "config": latest["config"], "eval": {"eval_return_mean": float(LENGTH)}})


def run_eval(capsys, *args):
    code = eval_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out.strip().splitlines(), err.strip().splitlines()


def test_eval_best_without_best_pt_says_why_in_one_line(trained_run, capsys):
    run_dir, _ = trained_run
    best_checkpoint_path(run_dir).unlink(missing_ok=True)
    code, out, err = run_eval(capsys, run_dir, "--best")
    assert code == 2 and out == [] and len(err) == 1
    assert "--set eval.every_s=60" in err[0] and "drop --best" in err[0]


@needs_imageio
def test_eval_best_evaluates_and_films_best_pt(trained_run, capsys, tmp_path):
    run_dir, latest = trained_run
    write_best(run_dir, latest, env_steps=1_234)
    try:
        code, out, err = run_eval(capsys, run_dir, "--best", "--episodes", 2, "--video", tmp_path / "best.mp4")
    finally:
        best_checkpoint_path(run_dir).unlink()
    assert code == 0, err
    result = json.loads(out[0])
    assert len(out) == 1 and result["checkpoint"] == str(best_checkpoint_path(run_dir))
    assert result["env_steps"] == 1_234 and result["episodes"] == 2
    assert result["video_frames"] == 2 * (LENGTH + 1) and (tmp_path / "best.mp4").stat().st_size > 0


def test_eval_best_with_a_corrupt_best_pt_is_one_line(trained_run, capsys):
    run_dir, _ = trained_run
    best_checkpoint_path(run_dir).write_bytes(b"not a checkpoint")
    try:
        code, out, err = run_eval(capsys, run_dir, "--best")
    finally:
        best_checkpoint_path(run_dir).unlink()
    assert code == 2 and len(err) == 1 and "best.pt" in err[0] and "corrupt" in err[0]


def test_video_without_the_extra_names_the_pip_command(trained_run, capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "imageio", None)  # as if the extra were not installed
    code, out, err = run_eval(capsys, trained_run[0], "--video", tmp_path / "a.mp4")
    assert code == 2 and out == [] and len(err) == 1
    assert "pip install 'fastrl[video]'" in err[0]
    assert not (tmp_path / "a.mp4").exists()


@needs_imageio
@pytest.mark.parametrize("name, says", [("a-file/x.mp4", "a part of its directory is a file"),
                                        ("clip.avi", "ending in .mp4"), ("folder.mp4", "is a directory")])
def test_video_to_a_path_it_cannot_write_is_one_line(trained_run, capsys, tmp_path, name, says):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "folder.mp4").mkdir()
    code, out, err = run_eval(capsys, trained_run[0], "--video", tmp_path / name)
    assert code == 2 and out == [] and len(err) == 1 and says in err[0], err
