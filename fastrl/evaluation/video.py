"""Videos of a policy's episodes: one env rendered as RGB frames, written as an H.264 MP4.

The frames are the env's own render, not its observations: an Atari agent sees 84x84 grey
stacks, a person wants the 210x160 colour screen. envpool renders its tasks itself
(``render_mode="rgb_array"`` and ``render()``, envpool >= 1.0); gymnasium envs, Atari through
ale-py, ``module:callable`` factories and PettingZoo games get ``render_mode="rgb_array"`` and
their ``render()`` (a game is one env of as many rows as agents, its episodes those of its agents).
Either way the observations the policy acts on are the ones it was trained on.

A frame is taken after every ``recv()`` of the one env: an episode of L steps gives L + 1
frames, its first observation and one per step (the last shows the end, before the reset).
Encoding needs imageio with its ffmpeg plugin (a bundled ffmpeg binary): the ``[video]`` extra.
"""
from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..config import Config
from ..envs import resolve_backend
from ..envs.base import VecEnv
from ..multiagent.opponents import find_opponent
from .episodes import (
    check_every_seat_playable,
    evaluate_against,
    evaluate_policy,
    load_run_model,
    policy_seats,
    seated_spec,
)

VIDEO_EXTRA = "pip install 'fastrl[video]'"
# A frame per agent step: CartPole steps at 50 Hz and Atari (frame skip 4) at 15 Hz, so 30 fps
# plays both near real time without a per-env table.
DEFAULT_FPS = 30
PARTIAL_SUFFIX = ".partial.mp4"  # a video being written, beside the path it will replace


class VideoError(RuntimeError):
    """A video cannot be recorded or written; the message says what to do."""


def require_video_extra() -> None:
    """VideoError naming the pip command when imageio or its ffmpeg plugin is missing."""
    _imageio()


def check_video_output(path: str | Path) -> Path:
    """Fail early, in one line, if a video cannot be written to ``path``: the ``[video]`` extra is
    missing, the name does not end in .mp4, or its directory cannot be written (made if missing)."""
    _imageio()
    path = Path(path)
    if path.suffix.lower() != ".mp4":
        raise VideoError(f"a video is written as MP4: give a path ending in .mp4, not '{path}'")
    if path.is_dir():
        raise VideoError(f"'{path}' is a directory: give a file name ending in .mp4")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=path.parent, prefix=".fastrl-write-test-").close()
    except (FileExistsError, NotADirectoryError):
        raise VideoError(f"cannot write the video '{path}': a part of its directory is a file; pick another "
                         f"path") from None
    except OSError as exc:
        raise VideoError(f"cannot write the video '{path}' ({exc.strerror or exc}): pick a path in a "
                         f"writable directory") from None
    return path


def write_video(cfg: Config, model: torch.nn.Module, path: str | Path, episodes: int, deterministic: bool = False,
                device: str = "cpu", seed: int = 12345, fps: int | None = None, max_frames: int | None = None,
                keep_going=None, opponent=None, seats: tuple[str, ...] = ()) -> dict:
    """Play ``episodes`` episodes with ``model`` on one rendered env of ``cfg.env`` (against
    ``opponent`` in a multi-agent game, if given, the model in ``seats`` if any) and write them
    (their first ``max_frames`` frames, if given) to ``path`` as H.264 at ``fps`` (default
    DEFAULT_FPS). Returns
    evaluate_policy's result (evaluate_against's with an opponent) with ``video`` (the path) and
    ``video_frames``. Raises VideoError (one line).

    The frames go to a hidden file beside ``path`` that replaces it only once the video is
    complete: whatever stops the recording (an error, Ctrl-C, SIGTERM raised as an exception)
    removes that file and leaves a file already at ``path`` as it was."""
    path = check_video_output(path)
    partial = _new_partial_file(path)
    try:
        writer = _imageio().get_writer(partial, format="FFMPEG", mode="I", fps=fps or DEFAULT_FPS,
                                       codec="libx264", pixelformat="yuv420p", ffmpeg_log_level="error",
                                       # H.264 needs even sides; the default 16 would rescale CartPole's 600x400.
                                       macro_block_size=2)
        frames = 0

        def add_frame(frame: np.ndarray) -> None:
            nonlocal frames
            if max_frames is None or frames < max_frames:
                writer.append_data(frame)
                frames += 1

        try:
            result = play_rendered(cfg, model, episodes, add_frame, deterministic, device, seed, keep_going, opponent,
                                   seats)
            writer.close()
        except BaseException:
            _close_quietly(writer)
            raise
        os.replace(partial, path)
    except OSError as exc:  # ffmpeg could not write (a full disk, say), or the rename failed
        partial.unlink(missing_ok=True)
        raise VideoError(f"cannot write the video '{path}' ({exc.strerror or exc})") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return {**result, "video": str(path), "video_frames": frames}


def write_run_video(run_dir: Path, path: str | Path, episodes: int, deterministic: bool = False, device: str = "cpu",
                    seed: int = 12345, best: bool = False, fps: int | None = None, opponent=None,
                    policy: str | None = None) -> dict:
    """fastrl-eval --video: write_video with a run's latest (or ``best``) weights of ``policy``
    (the first by default), against ``opponent`` if given; the result also says which checkpoint
    and policy (policy_eval.load_run_model)."""
    path = check_video_output(path)  # before the slow part: a bad path or a missing extra fails at once
    if opponent is not None:
        find_opponent(opponent)
    cfg, model, source = load_run_model(run_dir, best, policy)
    spec = seated_spec(cfg)
    if opponent is None:
        check_every_seat_playable(cfg, spec, "fastrl-eval --video without --opponent",
                                  "film a policy in its own seats with --policy NAME --opponent random")
    seats = policy_seats(cfg, spec, source["policy"]) if opponent is not None else ()
    return {**write_video(cfg, model, path, episodes, deterministic, device, seed, fps, opponent=opponent,
                          seats=seats), **source}


def record_frames(cfg: Config, model: torch.nn.Module, episodes: int = 1, max_frames: int = 1000,
                  deterministic: bool = True, device: str = "cpu", seed: int = 12345) -> tuple[np.ndarray, dict]:
    """A clip in memory, for TensorBoard or W&B during training: uint8 [T, H, W, 3], the first
    ``max_frames`` frames of ``episodes`` episodes (played to their end all the same: the result,
    evaluate_policy's, is about complete episodes)."""
    frames: list[np.ndarray] = []

    def keep(frame: np.ndarray) -> None:
        if len(frames) < max_frames:
            frames.append(frame.copy())  # a backend may hand out a buffer it reuses

    result = play_rendered(cfg, model, episodes, keep, deterministic, device, seed)
    return np.stack(frames), result


def play_rendered(cfg: Config, model: torch.nn.Module, episodes: int, on_frame: Callable[[np.ndarray], None],
                  deterministic: bool = False, device: str = "cpu", seed: int = 12345, keep_going=None,
                  opponent=None, seats: tuple[str, ...] = ()) -> dict:
    """evaluate_policy (evaluate_against, given an ``opponent``, the model in ``seats`` if any) on
    one rendered env, handing every frame (uint8 [H, W, 3]) to ``on_frame``."""
    env, render = open_rendered_env(cfg, seed)

    def grab() -> None:
        try:
            frame = render()
        except Exception as exc:  # a backend or env without rgb_array rendering, a missing renderer package
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise VideoError(f"cannot render {cfg.env.id!r} ({type(exc).__name__}: {first_line})") from None
        on_frame(_checked_frame(frame, cfg.env.id))

    if opponent is not None:
        return evaluate_against(cfg, model, opponent, episodes, deterministic, device, seed, env=env,
                                after_recv=grab, keep_going=keep_going, seats=seats)
    return evaluate_policy(cfg, model, episodes, deterministic, device, seed, env=env, after_recv=grab,
                           keep_going=keep_going)


def open_rendered_env(cfg: Config, seed: int) -> tuple[VecEnv, Callable[[], np.ndarray]]:
    """One env of ``cfg.env`` (a VecEnv of num_envs = batch_size = 1, or one game's agent rows) and
    a function that renders its current frame."""
    from ..envs import with_action_subset

    env, render = _open_backend_rendered_env(cfg, seed)
    return with_action_subset(env, cfg.env.id, cfg.env.actions), render


def _open_backend_rendered_env(cfg: Config, seed: int) -> tuple[VecEnv, Callable[[], np.ndarray]]:
    env_id = cfg.env.id
    backend = resolve_backend(env_id, cfg.env.backend)
    kwargs = {**cfg.env.kwargs, "render_mode": "rgb_array"}
    if backend == "envpool":
        from ..envs.backends.envpool_backend import episode_layout, make_envpool_vec_env

        num_envs, batch_size = episode_layout(env_id, cfg.env.kwargs, 1)  # one env, or one game's player rows
        env = make_envpool_vec_env(env_id, num_envs, batch_size, seed, env_kwargs=kwargs)
        return env, env.render_game
    if backend == "pettingzoo":
        from ..envs.multiagent.pettingzoo_backend import open_games

        try:
            game = open_games(env_id, 1, seed, kwargs)  # one game: a row per agent, one frame for all
        except TypeError as exc:
            if "render_mode" not in str(exc):
                raise
            raise VideoError(f"{env_id!r} takes no render_mode: to record videos, its parallel_env() (or env()) "
                             f"must accept render_mode='rgb_array' and return RGB frames from render()") from None
        return game, game.render_game
    from ..envs import ImageOptions, _gymnasium_env_fn
    from ..envs.backends.gym_backend import GymnasiumSplitVecEnv

    make_env, _ = _gymnasium_env_fn(env_id, backend, kwargs, ImageOptions.from_config(cfg.env))
    made: list = []

    def make_and_keep():
        try:
            made.append(make_env())
        except TypeError as exc:
            if "render_mode" not in str(exc):
                raise
            raise VideoError(f"env factory {env_id!r} takes no render_mode: to record videos, accept "
                             f"render_mode='rgb_array' and return RGB frames from render()") from None
        return made[-1]

    return GymnasiumSplitVecEnv(make_and_keep, 1, 1, seed), lambda: made[0].render()


def _checked_frame(frame, env_id: str) -> np.ndarray:
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] == 3 and frame.dtype == np.uint8):
        got = f"{frame.dtype} {list(frame.shape)}" if isinstance(frame, np.ndarray) else type(frame).__name__
        raise VideoError(f"{env_id!r} rendered {got}, not an RGB frame (uint8 [height, width, 3])")
    return frame


def _imageio():
    try:
        import imageio
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary imageio's FFMPEG format runs)
    except ImportError:
        raise VideoError(f"writing a video needs imageio with its ffmpeg plugin: {VIDEO_EXTRA}") from None
    return imageio


def _new_partial_file(path: Path) -> Path:
    """A new hidden file beside ``path``, ending in its suffix (imageio and ffmpeg go by the
    suffix), made with O_EXCL: never an existing file or a link."""
    partial = path.with_name(f".{path.stem[:128]}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")  # within NAME_MAX
    try:
        partial.open("xb").close()
    except OSError as exc:
        raise VideoError(f"cannot write the video '{path}' ({exc.strerror or exc}): pick a path in a writable "
                         f"directory") from None
    return partial


def remove_partial_videos(directory: Path) -> None:
    """Remove the unfinished videos a killed process left in ``directory`` (SIGKILL leaves no
    chance to clean up); call it only where no other process is writing one."""
    for partial in Path(directory).glob(f".*{PARTIAL_SUFFIX}"):
        partial.unlink(missing_ok=True)


def _close_quietly(writer) -> None:
    """Close ``writer`` after a failure: ffmpeg may already be gone (it may be what failed)."""
    try:
        writer.close()
    except Exception:
        pass
