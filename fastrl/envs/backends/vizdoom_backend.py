"""ViZDoom's gymnasium ids (``VizdoomBasic-v1``, ``VizdoomHealthGatheringSupreme-v1``, ...), made
small and skipped in the engine.

``vizdoom.gymnasium_wrapper`` registers the ids when imported; fastrl imports it when an id asks
(`register_ids`). An env returns a Dict observation: ``screen`` uint8 [H, W, 3] and, where the
scenario declares game variables, ``gamevariables`` float32 [n]; the generic image preprocessing
(env.resize, env.grayscale, env.frame_stack) reads ``screen`` as the image leaf and passes
``gamevariables`` on.

Two of the [env] image keys are cheaper in the engine than in Python:

  env.resize = [H, W]   the engine renders at the smallest ``ScreenResolution`` of at least H x W
                        (`engine_resolution`: RES_160X120 for [72, 128], Sample Factory's doom
                        setting), which the preprocessing then resizes to H x W. Rendering costs
                        about in proportion to its pixels.
  env.frame_skip = k    the wrapper's ``frame_skip``: the engine advances k tics per action and
                        renders only the last (``make_action(action, k)``), rewards summed, never
                        past the episode's end; ~2.9x as many frames/s as repeating the action
                        one rendered tic at a time (see docs/results.md#images).

A scenario's episode timeout (``episode_timeout`` in its .cfg) ends an episode truncated, not
terminated: the wrapper sets both flags there, and the value would then be cut off at a step the
agent cannot tell from any other. A truncated step bootstraps from the value of its final
observation, and ViZDoom has no state to show at an episode's end (its wrapper returns zeros): an
all-black screen the value head never trains on, whose arbitrary value would enter the targets at
every timeout. The final observation is therefore the last screen the engine rendered
(`EpisodeEnds`).
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable
from typing import Any

import gymnasium

from fastrl.user_code import first_line

ID_PREFIX = "Vizdoom"
VIZDOOM_EXTRA = "pip install 'fastrl[vizdoom]'"
_RESOLUTION_NAME = re.compile(r"RES_(\d+)X(\d+)")


def is_vizdoom_id(env_id: str) -> bool:
    """True for ids ViZDoom's gymnasium wrapper registers ("VizdoomBasic-v1", ...)."""
    return env_id.startswith(ID_PREFIX) and ":" not in env_id


def register_ids() -> None:
    """Import ``vizdoom.gymnasium_wrapper``, which registers the ``Vizdoom*`` gymnasium ids;
    ValueError (one line naming the extra) when vizdoom is not installed."""
    try:
        import vizdoom.gymnasium_wrapper  # noqa: F401  (registers the ids with gymnasium)
    except ImportError as exc:
        raise ValueError(f"ViZDoom ids need the vizdoom package ({exc}): {VIZDOOM_EXTRA}") from None


def engine_resolution(height: int, width: int) -> str:
    """The name of the smallest (fewest pixels) ViZDoom ``ScreenResolution`` at least ``height`` x
    ``width``, e.g. "RES_160X120" for (72, 128); ValueError (one line) when none is that large."""
    import vizdoom

    sizes = []
    for name in vizdoom.ScreenResolution.__members__:
        match = _RESOLUTION_NAME.fullmatch(name)
        if match:
            res_width, res_height = int(match.group(1)), int(match.group(2))
            if res_width >= width and res_height >= height:
                sizes.append((res_width * res_height, name))
    if not sizes:
        raise ValueError(f"env.resize [{height}, {width}] is larger than any ViZDoom screen resolution "
                         f"(the largest is 1920x1080): choose a smaller env.resize")
    return min(sizes)[1]


def vizdoom_env_fn(env_id: str, env_kwargs: dict[str, Any], frame_skip: int,
                   resize: list[int] | tuple[int, ...]) -> Callable[[], gymnasium.Env]:
    """A zero-argument constructor of one env of ``env_id`` whose engine skips ``frame_skip`` tics
    per action and renders at `engine_resolution` of ``resize`` ([] keeps the scenario's).

    ``env_kwargs`` go to the wrapper: its own arguments (``max_buttons_pressed``, ...) and any
    DoomGame config key (``doom_skill``, ...); a ``screen_resolution`` there wins over ``resize``'s,
    and its ``frame_skip`` may not be set beside env.frame_skip."""
    register_ids()
    if "frame_skip" in env_kwargs:
        raise ValueError(f"{env_id!r}: set the frame skip as env.frame_skip, not env.kwargs.frame_skip (fastrl "
                         f"passes env.frame_skip to the ViZDoom engine and counts frames by it)")
    check_keys(env_id, env_kwargs)
    kwargs = {"frame_skip": frame_skip, **env_kwargs}
    if resize:
        kwargs.setdefault("screen_resolution", engine_resolution(*resize))

    def make() -> gymnasium.Env:
        try:
            env = gymnasium.make(env_id, **kwargs)
            # Started here rather than at the first reset, so that a scenario or WAD file that is
            # missing fails where the env is first made (the probe, before any worker starts).
            env.unwrapped.game.init()
        except Exception as exc:  # the engine's, about the scenario and env.kwargs it was given
            raise ValueError(f"{env_id!r}: the ViZDoom engine cannot start with env.kwargs {env_kwargs} "
                             f"({first_line(exc)}); correct the file paths and values there") from None
        return EpisodeEnds(env)

    return make


def check_keys(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """ValueError (one line, with close matches) for a key of ``env_kwargs`` that neither
    gymnasium.make, ViZDoom's wrapper nor a DoomGame config key takes: the engine would print a
    warning and ignore it (a misspelt ``doom_skil`` would leave the scenario's difficulty)."""
    import vizdoom
    from vizdoom.gymnasium_wrapper.gymnasium_env_defns import VizdoomScenarioEnv

    known = {*inspect.signature(gymnasium.make).parameters, *inspect.signature(VizdoomScenarioEnv).parameters,
             *(name[len("set_"):] for name in dir(vizdoom.DoomGame) if name.startswith("set_"))}
    known -= {"id", "kwargs", "frame_skip", "config", "action", "seed"}  # not keys of a scenario's config
    for name in env_kwargs:
        if name.lower() not in known:
            matches = difflib.get_close_matches(name.lower(), sorted(known), n=3)
            hint = f" (did you mean {', '.join(matches)}?)" if matches else ""
            raise ValueError(f"env.kwargs: {env_id!r} takes no argument {name!r}{hint}: neither ViZDoom's wrapper "
                             f"nor a DoomGame config key; remove it or correct its name")


class EpisodeEnds(gymnasium.Wrapper):
    """An episode the scenario's timeout ends is truncated only (the wrapper also flags it
    terminated), and the final observation of an episode the engine ended is its last rendered
    one (the wrapper returns zeros there: the engine keeps no state past the end). A TimeLimit
    inside (``env.kwargs.max_episode_steps``) truncates on a real observation, which stays; a
    death or a goal on the TimeLimit's last step is terminated: the episode's own end wins, and
    nothing bootstraps from it."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self._last_obs = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._last_obs = obs
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not terminated:
            self._last_obs = obs
            return obs, reward, False, truncated, info
        # The engine's episode is over (its timeout too): the wrapper returns zeros. Both flags
        # also come from a TimeLimit truncating the step on which the episode ended for real, so
        # only the engine says whether its timeout ended it.
        game = self.env.unwrapped.game
        timed_out = truncated and game.is_episode_timeout_reached() and not game.is_player_dead()
        return self._last_obs, reward, not timed_out, timed_out, info
