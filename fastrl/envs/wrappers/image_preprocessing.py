"""Image preprocessing of gymnasium envs: action repeat, resize, grayscale and frame stack.

Configured under ``[env]`` (``frame_skip``, ``resize``, ``grayscale``, ``frame_stack``,
``image_keys``: :class:`ImageOptions`) and done by :class:`PreprocessedEnv` around each env of a
gymnasium or factory group, in the rollout worker, before the vector env batches the
observations: only the processed frames are copied on, never the env's full-size frame. The rules
(tests/unit/envs/test_image_preprocessing.py checks each against a numpy reference):

Action repeat (``frame_skip = k``)
    One env step sends its action to the env up to k times and returns the sum of the rewards,
    with the observation, flags and info of the last time. It stops at the first terminated or
    truncated: never a step past an episode's end. Reported frames are env steps x k.

Images
    An image is a uint8 ``[H, W, C]`` array with C = 1, 3 (RGB) or 4 (RGBA): a Box observation,
    or the leaves of a Dict observation that ``image_keys`` names (key paths joined by '.'; ``[]``:
    every such leaf). With ``resize``, ``grayscale`` or ``frame_stack`` set, each image becomes
    uint8 ``[n * C', H', W']`` (CHW, as the CNN encoders read it): ``C' = 1`` with grayscale
    (cv2 RGB2GRAY / RGBA2GRAY, done before the resize so that one channel is resized),
    ``(H', W') = resize`` (cv2 INTER_AREA), ``n = frame_stack`` frames, oldest first, each frame's
    channels in their order. Other leaves pass unchanged.

Frame stack
    Each step pushes the new frame and drops the oldest. A reset fills the stack with its first
    frame, as envpool's Atari does and as the replay rebuilds stacks (fastrl/replay/buffer.py): no frame
    crosses an episode start, autoresets included.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields

import gymnasium
import numpy as np
from gymnasium import spaces

from fastrl.envs.spaces import CodeGrid

# What each key does in envpool's image tasks' own options (Atari, ViZDoom), and in the envpool
# option names that fastrl's gymnasium Atari takes (fastrl/envs/backends/atari.py).
OWN_OPTIONS = {"frame_skip": ("frame_skip",), "resize": ("img_height", "img_width"), "grayscale": ("gray_scale",),
               "frame_stack": ("stack_num",)}
IMAGE_CHANNELS = (1, 3, 4)
OPENCV_MISSING = "image preprocessing (env.resize, env.grayscale) needs OpenCV: pip install opencv-python-headless"


@dataclass(frozen=True)
class ImageOptions:
    """The ``[env]`` preprocessing keys (fastrl.config.schema.EnvConfig declares them with their help)."""

    frame_skip: int = 1
    resize: tuple[int, ...] = ()
    grayscale: bool = False
    frame_stack: int = 1
    image_keys: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, env_cfg) -> ImageOptions:
        """The options of ``env_cfg`` (a fastrl.config.schema.EnvConfig)."""
        return cls(env_cfg.frame_skip, tuple(env_cfg.resize), env_cfg.grayscale, env_cfg.frame_stack,
                   tuple(env_cfg.image_keys))

    @property
    def transforms_images(self) -> bool:
        return bool(self.resize) or self.grayscale or self.frame_stack > 1

    def asked(self) -> list[str]:
        """The keys set away from their defaults, as ``env.<key>``."""
        return [f"env.{f.name}" for f in fields(self) if getattr(self, f.name) != f.default]


def check_applies(options: ImageOptions, env_id: str, kind: str, own_options: Collection[str] = ()) -> None:
    """ValueError (one line naming the fix) if any option is set for an env that preprocesses
    itself or is not a gymnasium env. ``kind``: "envpool", "atari" (a gymnasium Atari id, which takes
    envpool's Atari options), "pettingzoo" or "vector" (a VecEnv class); ``own_options``: the
    env's own option names (its envpool config)."""
    asked = options.asked()
    if not asked:
        return
    keys, them = ", ".join(asked), "them" if len(asked) > 1 else "it"
    own = [name for key in asked for name in OWN_OPTIONS.get(key[len("env."):], ()) if name in own_options]
    if kind in ("envpool", "atari") and own:
        who = "envpool" if kind == "envpool" else "fastrl's Atari (as envpool)"
        raise ValueError(f"{keys}: {who} preprocesses {env_id!r} itself: unset {them} and set its own options in "
                         f"env.kwargs ({', '.join(own)})")
    why = {"envpool": f"envpool steps {env_id!r} in C++, where fastrl cannot preprocess it: use a gymnasium id with "
                      f"env.backend=gymnasium",
           "atari": f"fastrl's Atari (as envpool) preprocesses {env_id!r} itself: use its options in env.kwargs",
           "pettingzoo": f"{env_id!r} is a PettingZoo env, and preprocessing is for single-agent gymnasium envs: "
                         f"preprocess in the env",
           "vector": f"{env_id!r} is a VecEnv class that makes its own rows: preprocess in it"}[kind]
    raise ValueError(f"{keys}: {why}, or unset {them}")


def preprocessed(env_fn: Callable[[], gymnasium.Env], options: ImageOptions,
                 env_id: str) -> Callable[[], gymnasium.Env]:
    """``env_fn`` whose envs are wrapped in :class:`PreprocessedEnv`; ``env_fn`` itself when no
    option is set."""
    if not options.asked():
        return env_fn
    return lambda: PreprocessedEnv(env_fn(), options, env_id)


class PreprocessedEnv(gymnasium.Wrapper):
    """One env with ``options`` applied (the module docstring states the rules).

    The observations it returns are its own frame-stack buffers: valid until its next step or
    reset (a vector env copies them into its batch at once)."""

    def __init__(self, env: gymnasium.Env, options: ImageOptions, env_id: str) -> None:
        super().__init__(env)
        self._repeat = options.frame_skip
        self._images: list[_FrameStack] = []
        if options.transforms_images:
            self._images = [_FrameStack(path, shape, options)
                            for path, shape in image_leaves(env.observation_space, options.image_keys, env_id)]
        elif options.image_keys:
            raise ValueError("env.image_keys chooses the images that env.resize, env.grayscale and env.frame_stack "
                             "process: set one of them, or unset env.image_keys")
        self.observation_space = _replaced(env.observation_space, {f.path: f.space for f in self._images})

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._observe(obs, first=True), info

    def step(self, action) -> tuple:
        total = 0.0
        for _ in range(self._repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return self._observe(obs, first=False), total, terminated, truncated, info

    def _observe(self, obs, first: bool):
        if not self._images:
            return obs
        return _replaced(obs, {f.path: f.push(_leaf(obs, f.path), first) for f in self._images})


def image_leaves(space: gymnasium.Space, image_keys: Collection[str], env_id: str) -> list[tuple[tuple, tuple]]:
    """(key path, [H, W, C]) of each image the options process in ``space``: the Box itself, or the
    Dict leaves ``image_keys`` names (every uint8 [H, W, C] leaf when empty). ValueError (one line)
    for a name that is no leaf, a leaf that is no image, or no image at all."""
    leaves = dict(_dict_leaves(space, ()))
    if isinstance(space, spaces.Dict) and image_keys:
        chosen = []
        for name in image_keys:
            path = tuple(name.split("."))
            if path not in leaves:
                raise ValueError(f"env.image_keys: {env_id!r} has no observation leaf {name!r}; its leaves: "
                                 f"{', '.join('.'.join(p) for p in leaves)}")
            if not _is_image(leaves[path]):
                raise ValueError(f"env.image_keys: leaf {name!r} of {env_id!r} is {_described(leaves[path])}, not "
                                 f"an image (uint8 [height, width, channels], channels 1, 3 or 4)")
            chosen.append(path)
    elif image_keys:
        raise ValueError(f"env.image_keys names leaves of a Dict observation; {env_id!r} observes "
                         f"{_described(space)}: unset env.image_keys")
    else:
        chosen = [path for path, leaf in leaves.items() if _is_image(leaf)]
    if not chosen:
        raise ValueError(f"env.resize, env.grayscale and env.frame_stack process images (uint8 [height, width, "
                         f"channels], channels 1, 3 or 4); {env_id!r} observes {_described(space)}: unset them")
    return [(path, tuple(int(s) for s in leaves[path].shape)) for path in chosen]


class _FrameStack:
    """One image leaf's processed frames: ``stack`` uint8 [n * C', H', W'] (module docstring)."""

    def __init__(self, path: tuple, shape: tuple, options: ImageOptions) -> None:
        self.path = path
        height, width, channels = shape
        out_hw = tuple(options.resize) or (height, width)
        self._size = (out_hw[1], out_hw[0]) if out_hw != (height, width) else None  # cv2 takes (width, height)
        gray = options.grayscale and channels > 1
        self._cv2 = cv2 = _opencv() if gray or self._size else None
        self._gray_code = (cv2.COLOR_RGB2GRAY if channels == 3 else cv2.COLOR_RGBA2GRAY) if gray else None
        self._channels = 1 if options.grayscale else channels
        # Scratch frames for the steps cv2 cannot write straight into the CHW stack.
        self._gray = np.empty((height, width), np.uint8) if self._gray_code is not None and self._size else None
        self._hwc = np.empty((*out_hw, self._channels), np.uint8) if self._channels > 1 and self._size else None
        self.stack = np.zeros((options.frame_stack * self._channels, *out_hw), np.uint8)
        self.space = spaces.Box(0, 255, self.stack.shape, np.uint8)

    def push(self, frame: np.ndarray, first: bool) -> np.ndarray:
        """Push ``frame`` (uint8 [H, W, C]); with ``first`` (a reset) it fills the whole stack."""
        stack, c = self.stack, self._channels
        frames = len(stack) // c
        if not first:
            for j in range(frames - 1):  # frame by frame: no overlapping copy, no temporary
                stack[j * c:(j + 1) * c] = stack[(j + 1) * c:(j + 2) * c]
        self._write(np.ascontiguousarray(frame), stack[-c:])
        if first:
            for j in range(frames - 1):
                stack[j * c:(j + 1) * c] = stack[-c:]
        return stack

    def _write(self, frame: np.ndarray, out: np.ndarray) -> None:
        """``frame`` [H, W, C] -> ``out`` [C', H', W']: cv2 writes a one-channel result straight
        into ``out``; a colour one goes through one [H', W', C] scratch frame to become CHW."""
        cv2, size = self._cv2, self._size
        if self._channels > 1:
            if size:
                frame = cv2.resize(frame, size, dst=self._hwc, interpolation=cv2.INTER_AREA)
            out[:] = frame.transpose(2, 0, 1)
            return
        target = out[0]
        if self._gray_code is None:
            plane = frame[..., 0]
        else:
            plane = cv2.cvtColor(frame, self._gray_code, dst=self._gray if size else target)
        if size:
            plane = cv2.resize(plane, size, dst=target, interpolation=cv2.INTER_AREA)
        if plane is not target:
            target[:] = plane


def _opencv():
    try:
        import cv2
    except ImportError:
        raise ValueError(OPENCV_MISSING) from None
    return cv2


def _is_image(space: gymnasium.Space) -> bool:
    # A grid of codes is no picture: averaging or graying its codes would make other codes.
    return (isinstance(space, spaces.Box) and not isinstance(space, CodeGrid) and space.dtype == np.uint8
            and len(space.shape) == 3 and space.shape[-1] in IMAGE_CHANNELS)


def _described(space: gymnasium.Space) -> str:
    if isinstance(space, spaces.Box):
        return f"{space.dtype} {list(space.shape)}"
    if isinstance(space, spaces.Dict):
        return "a Dict of " + ", ".join(f"{'.'.join(path)}: {_described(leaf)}"
                                        for path, leaf in _dict_leaves(space, ()))
    return type(space).__name__


def _dict_leaves(space: gymnasium.Space, path: tuple):
    """(key path, space) of every leaf of ``space`` reached through Dicts (a Box: path ())."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _dict_leaves(sub, path + (key,))
    else:
        yield path, space


def _leaf(obs, path: tuple):
    for key in path:
        obs = obs[key]
    return obs


def _replaced(tree, new: Mapping[tuple, object]):
    """``tree`` (a space or an observation: nested dicts, or one leaf at path ()) with the leaves at
    the paths of ``new`` replaced, the rest shared."""
    if () in new:
        return new[()]
    if not new:
        return tree
    children = {key: _replaced(sub, {path[1:]: value for path, value in new.items() if path[0] == key})
                for key, sub in tree.items()}
    return spaces.Dict(children) if isinstance(tree, spaces.Dict) else children
