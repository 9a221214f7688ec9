"""Observation and action spaces as fastrl stores them: what gymnasium / envpool declare, turned
into fixed-size rows the arena, the replay and the networks share.

Observations. A plain ``Box`` is stored as it comes (one arena array of its shape and dtype). Any
other space (``Dict``, ``Tuple``, nested, ``Discrete``, ``MultiBinary``, ``MultiDiscrete``) is
flattened into *leaves*, and one step's leaves are packed into one row of bytes, each leaf at an
8-byte aligned offset in its own dtype: uint8 stays uint8, float64 becomes float32, integers and
``Discrete`` become int32, bool becomes uint8. One row per step keeps every copy on the hot path
(worker -> arena, arena -> batcher, arena -> learner, replay) a single row copy, whatever the
space; the network unpacks the row into typed leaves on its own device (:meth:`ObsLayout.unpack`,
a zero-copy view). Declared bounds are never trusted (envpool declares float64 or nonsense
bounds for many tasks): only dtypes and shapes are.

A :class:`CodeGrid` (a ``Box`` subclass an env or fastrl's backend declares) is a uint8 image whose
values are codes, not intensities (MiniGrid's object / colour / state per cell): the network reads
it one-hot rather than scaled to [0, 1], where the codes of two objects would differ by 1/255.

A top-level ``Dict`` key named ``action_mask`` (the gymnasium / PettingZoo convention) is the
action mask: one flag per action (per component for ``MultiDiscrete``), not fed to the encoders.

Inside fastrl every value is flat and zero-based, whatever the space declares: a ``Discrete`` /
``MultiDiscrete`` value is stored as ``value - start`` (one-hot index, category), and a
multi-dimensional action as one row. The conversions happen in one place each way:
:meth:`ObsLayout.pack` subtracts the observations' ``start`` on the way in, and
:meth:`ActionLayout.to_env` adds the actions' ``start`` and restores their declared shape and
dtype on the way out (the env backends call it as actions leave for the env).

Actions. ``Discrete`` -> int64 ``[]``; ``Box`` -> float32 ``[d]`` (d = its number of elements);
``MultiDiscrete`` -> int64 ``[k]`` (k = its number of components); ``MultiBinary`` -> int64 ``[n]``;
``Tuple`` of those -> float32 ``[sum of widths]`` (integers are exact in float32 up to 2^24).
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

MASK_KEY = "action_mask"
_ALIGN = 8


class CodeGrid(spaces.Box):
    """A uint8 grid ``[H, W, C]`` whose channel ``c`` holds codes ``0 .. levels[c] - 1``."""

    def __init__(self, shape: tuple, levels: tuple, seed=None):
        if len(shape) != 3 or len(levels) != shape[-1] or min(levels) < 1 or max(levels) > 256:
            raise ValueError(f"CodeGrid needs shape [H, W, C] and C levels in 1..256; got {shape}, {levels}")
        high = np.broadcast_to((np.asarray(levels) - 1).astype(np.uint8), shape)
        super().__init__(0, high, shape, np.uint8, seed=seed)
        self.levels = tuple(int(n) for n in levels)

    def __repr__(self) -> str:
        return f"CodeGrid({self.shape}, levels={self.levels})"


class UnsupportedSpace(ValueError):
    """A space fastrl cannot store or act in; the message names it and its key path."""


@dataclass(frozen=True)
class ObsLeaf:
    """One array of an observation: ``name`` is its key path joined by '.', ``shape`` / ``dtype``
    how it is stored, ``kind`` how the network reads it (image | codes | bytes | vector | discrete | mask),
    ``size`` the number of values of a ``Discrete`` leaf or of a ``codes`` leaf's codes (their
    one-hot width: the most levels of any channel), ``start`` its first value (stored as 0),
    ``offset`` its first byte in a packed row."""

    name: str
    path: tuple
    shape: tuple
    dtype: np.dtype
    kind: str
    size: int
    start: int
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _stored_dtype(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.dtype(np.uint8)
    if dtype.kind == "f":
        return np.dtype(np.float32)
    if dtype.kind in "iu" and dtype != np.uint8:
        return np.dtype(np.int32)
    return dtype


def _leaf_kind(shape: tuple) -> str:
    return "image" if len(shape) == 3 and min(image_hw(shape)) >= 7 else "vector"


def image_hw(shape: tuple) -> tuple[int, int]:
    """(height, width) of a 3-D image leaf, HWC or CHW (see :func:`is_channels_last`)."""
    return (shape[0], shape[1]) if is_channels_last(shape) else (shape[1], shape[2])


def is_channels_last(shape: tuple) -> bool:
    """HWC when the last axis looks like channels (at most 4) and the first does not: (84, 84, 3),
    (7, 7, 3); CHW otherwise: (4, 84, 84), (3, 64, 64)."""
    return len(shape) == 3 and shape[-1] <= 4 < shape[0]


def leaf_name(path: tuple) -> str:
    """The name of the observation leaf at key path ``path``: its keys joined by '.', "obs" for the
    whole observation."""
    return ".".join(str(p) for p in path) or "obs"


def _flatten(space: gymnasium.Space, path: tuple, out: list) -> None:
    name = leaf_name(path)
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _flatten(sub, path + (key,), out)
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _flatten(sub, path + (i,), out)
    elif isinstance(space, CodeGrid):
        out.append((name, path, tuple(space.shape), np.dtype(np.uint8), "codes", max(space.levels), 0))
    elif isinstance(space, spaces.Box):
        shape = tuple(int(s) for s in space.shape)
        kind = "mask" if path == (MASK_KEY,) else _leaf_kind(shape)
        if kind == "vector" and space.dtype == np.uint8 and np.all(space.high == 255):
            kind = "bytes"  # the dtype's whole range, as pixels (envpool MiniGrid's mission text)
        out.append((name, path, shape, _stored_dtype(space.dtype), kind, 0, 0))
    elif isinstance(space, spaces.MultiBinary):
        shape = tuple(int(s) for s in np.atleast_1d(space.n))
        kind = "mask" if path == (MASK_KEY,) else _leaf_kind(shape)
        out.append((name, path, shape, np.dtype(np.uint8), kind, 0, 0))
    elif isinstance(space, spaces.Discrete):
        out.append((name, path, (), np.dtype(np.int32), "discrete", int(space.n), int(space.start)))
    elif isinstance(space, spaces.MultiDiscrete):
        # Each component a Discrete leaf of its own: one-hot widths differ per component.
        nvec, start = np.asarray(space.nvec).reshape(-1), np.asarray(space.start).reshape(-1)
        for i, (n, first) in enumerate(zip(nvec, start)):
            out.append((f"{name}[{i}]", path + (("component", i),), (), np.dtype(np.int32), "discrete", int(n),
                        int(first)))
    else:
        where = f" at key path {name!r}" if path else ""
        raise UnsupportedSpace(
            f"observation space {type(space).__name__}{where} is not supported: fastrl stores Box, Discrete, "
            f"MultiDiscrete, MultiBinary and Dict / Tuple of them; wrap the env to turn {space} into one of these")


class ObsLayout:
    """How observations of ``space`` are stored: ``storage_shape`` / ``storage_dtype`` of one
    step in the arena and the replay, and the leaves of a packed row."""

    def __init__(self, space: gymnasium.Space):
        self.space = space
        # A grid of codes alone is a leaf too: only the leaf encoder reads codes one-hot.
        self.packed = not isinstance(space, spaces.Box) or isinstance(space, CodeGrid)
        raw: list = []
        _flatten(space, (), raw)
        leaves, offset = [], 0
        for name, path, shape, dtype, kind, size, start in raw:
            leaf = ObsLeaf(name, path, shape, dtype, kind, size, start, offset)
            leaves.append(leaf)
            offset += -(-leaf.nbytes // _ALIGN) * _ALIGN
        self.leaves: tuple[ObsLeaf, ...] = tuple(leaves)
        self.row_bytes = max(offset, _ALIGN)
        self.mask = next((leaf for leaf in leaves if leaf.kind == "mask"), None)
        if self.mask is not None and not self.packed:
            self.mask = None
        if self.packed:
            self.storage_shape, self.storage_dtype = (self.row_bytes,), np.dtype(np.uint8)
        else:
            self.storage_shape, self.storage_dtype = tuple(space.shape), np.dtype(space.dtype)

    def pack(self, obs, batch_size: int) -> np.ndarray:
        """``batch_size`` observations (arrays with a leading batch axis, nested as the space:
        dicts, tuples / namedtuples) -> ``[batch_size, *storage_shape]``, each ``Discrete`` value
        less its space's ``start``. A plain Box is returned as is."""
        if not self.packed:
            return obs
        rows = np.zeros((batch_size, self.row_bytes), dtype=np.uint8)
        values = self.leaf_values(obs, batch_size, np.asarray)
        for leaf in self.leaves:
            typed = np.ascontiguousarray(values[leaf.name]).reshape(batch_size, -1)
            rows[:, leaf.offset:leaf.offset + leaf.nbytes] = typed.view(np.uint8)
        return rows

    def leaf_values(self, obs, batch_size: int, convert) -> dict:
        """``batch_size`` observations (nested as the space, with a leading batch axis) ->
        ``{leaf name: [batch_size, *leaf.shape]}`` in each leaf's stored dtype, each ``Discrete``
        value less its space's ``start``: what :meth:`unpack` gives of their packed rows.
        ``convert(value, dtype=None)`` makes a value an array (of numpy ``dtype`` if given):
        ``np.asarray`` for numpy arrays; fastrl.evaluation.export passes torch's, to trace the same steps."""
        out = {}
        for leaf in self.leaves:
            value = convert(_lookup(obs, leaf.path, convert))
            try:
                value = value.reshape(batch_size, *leaf.shape)
            except (ValueError, RuntimeError):
                raise ValueError(f"observation leaf {leaf.name!r} came as {list(value.shape)} for {batch_size} envs; "
                                 f"the space declares {list(leaf.shape)} per env") from None
            if leaf.start:
                value = value - leaf.start
            out[leaf.name] = convert(value, leaf.dtype)
        return out

    def env_leaves(self) -> list[tuple[str, tuple]]:
        """(name, key path) of each array of an observation as the env gives it, in leaf order:
        the leaves, a MultiDiscrete's components taken together as one."""
        paths = dict.fromkeys(leaf.path[:-1] if _is_component(leaf.path[-1:]) else leaf.path for leaf in self.leaves)
        return [(leaf_name(path), path) for path in paths]

    def unpack(self, rows):
        """Packed rows ``[..., row_bytes]`` (uint8 torch tensor) -> ``{leaf name: [..., *shape]}`` views in
        each leaf's stored dtype; leaves already in that form (:meth:`leaf_values`) are returned as
        they are. Not packed: ``{"obs": rows}``."""
        if isinstance(rows, dict):
            return rows
        if not self.packed:
            return {"obs": rows}
        import torch  # here, not at the top: the rollout workers import this module and never torch

        lead = rows.shape[:-1]
        rows = rows.contiguous()
        out = {}
        for leaf in self.leaves:
            part = rows[..., leaf.offset:leaf.offset + leaf.nbytes]
            typed = part.view(_TORCH_DTYPES[leaf.dtype.str](torch)) if leaf.dtype.itemsize > 1 else part
            out[leaf.name] = typed.reshape(*lead, *leaf.shape)
        return out

    def sample(self, batch_size: int) -> np.ndarray:
        """``batch_size`` random observations of the space, stored as the arena stores them."""
        samples = [self.space.sample() for _ in range(batch_size)]
        if not self.packed:
            return np.stack(samples)
        return self.pack(_stack_nested(samples), batch_size)


_TORCH_DTYPES = {"<f4": lambda t: t.float32, "<i4": lambda t: t.int32, "<i8": lambda t: t.int64,
                 "<f2": lambda t: t.float16, "<i2": lambda t: t.int16, "<u2": lambda t: t.uint16,
                 "|i1": lambda t: t.int8}


def _is_component(keys: tuple) -> bool:
    """Whether a key path's last key (``keys``, a 1-tuple, or () for none) names a MultiDiscrete's component."""
    return bool(keys) and isinstance(keys[0], tuple) and keys[0][0] == "component"


def _lookup(obs, path: tuple, convert=np.asarray):
    for key in path:
        if _is_component((key,)):
            obs = convert(obs)
            obs = obs.reshape(obs.shape[0], -1)[:, key[1]]
        else:
            obs = obs[key]
    return obs


def _stack_nested(samples: list):
    first = samples[0]
    if isinstance(first, dict):
        return {key: _stack_nested([s[key] for s in samples]) for key in first}
    if isinstance(first, tuple):
        return tuple(_stack_nested([s[i] for s in samples]) for i in range(len(first)))
    return np.stack([np.asarray(s) for s in samples])


# ---------------------------------------------------------------------------------------------
# Actions


@dataclass(frozen=True)
class ActionPart:
    """One component of an action: ``kind`` categorical | gaussian | bernoulli, ``n`` its
    categories (categorical) or dimensions, ``param_slice`` / ``action_slice`` where it sits in
    the network's params and in the stored action row."""

    kind: str
    n: int
    param_slice: slice
    action_slice: slice


_ACTION_LEAVES = (spaces.Discrete, spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)


class _ActionLeaf:
    """One declared action space (a whole non-Tuple space, or one part of a Tuple) and its
    ``columns`` in the stored row: the conversion between its flat, zero-based stored values and
    the values its env takes."""

    def __init__(self, space: gymnasium.Space, columns: slice):
        self.space, self.columns = space, columns
        self.dtype = np.dtype(space.dtype)
        if isinstance(space, spaces.Box):
            self.env_shape = tuple(space.shape)
            self.low, self.high = box_bounds(space)
            start = 0
        elif isinstance(space, spaces.MultiBinary):
            self.env_shape, start = tuple(int(s) for s in np.atleast_1d(space.n)), 0
        else:  # Discrete (shape ()) or MultiDiscrete (the shape of its nvec)
            self.env_shape, start = tuple(space.shape), np.asarray(space.start, dtype=self.dtype)
        self.start = start if np.any(start) else None  # None: stored values are the env's

    def to_env(self, values: np.ndarray) -> np.ndarray:
        """Stored values ``[B, ...]`` (``B * width`` values in all) -> ``[B, *env_shape]`` in the
        space's dtype: Box clipped to its bounds, Discrete / MultiDiscrete shifted by ``start``."""
        values = values.reshape(len(values), *self.env_shape)
        if isinstance(self.space, spaces.Box):
            # Declared bounds that are placeholders (envpool's [2.2e-308, 1.8e308]) do not clip.
            return np.clip(values, self.low, self.high).astype(self.dtype, copy=False)
        values = values.astype(self.dtype, copy=False)
        return values if self.start is None else values + self.start

    def encode(self, value) -> np.ndarray:
        """One value as ``space.sample()`` gives it -> its stored values, flat float64 ``[width]``."""
        value = np.asarray(value, dtype=np.float64)
        return (value if self.start is None else value - self.start).reshape(-1)


class ActionLayout:
    """How actions of ``space`` are stored (``shape``, ``dtype``: one flat, zero-based row, see the
    module docstring), decomposed into parts, and converted for the env (:meth:`to_env`)."""

    def __init__(self, space: gymnasium.Space):
        self.space = space
        self.parts: list[ActionPart] = []
        self._params = self._width = 0
        self._leaves: list[_ActionLeaf] = []
        if isinstance(space, spaces.Tuple):
            for i, sub in enumerate(space.spaces):
                if not isinstance(sub, _ACTION_LEAVES):
                    raise UnsupportedSpace(f"action space Tuple part {i} ({sub}) is not supported: parts must be "
                                           f"Discrete, Box, MultiDiscrete or MultiBinary")
                self._add_leaf(sub)
            self.shape, self.dtype = (self._width,), np.dtype(np.float32)
        elif isinstance(space, _ACTION_LEAVES):
            self._add_leaf(space)
            self.shape = () if isinstance(space, spaces.Discrete) else (self._width,)
            self.dtype = np.dtype(np.float32 if isinstance(space, spaces.Box) else np.int64)
        else:
            raise UnsupportedSpace(f"action space {space} is not supported: fastrl acts in Discrete, Box, "
                                   f"MultiDiscrete, MultiBinary and Tuple of them")
        # Discrete / 1-D MultiDiscrete from 0 (most envs): the stored rows are the env's actions.
        # Passed through, a worker's batch skips a conversion (1.6 us against 0.1 for 512 envs).
        self._unchanged = (not isinstance(space, (spaces.Box, spaces.Tuple)) and self._leaves[0].start is None
                           and self._leaves[0].dtype == self.dtype and self._leaves[0].env_shape == self.shape)

    def _add_leaf(self, space: gymnasium.Space) -> None:
        first = self._width
        if isinstance(space, spaces.Discrete):
            self._add("categorical", int(space.n), 1)
        elif isinstance(space, spaces.Box):
            dim = int(np.prod(space.shape))
            self._add("gaussian", dim, dim)
        elif isinstance(space, spaces.MultiDiscrete):
            for n in np.asarray(space.nvec).reshape(-1):
                self._add("categorical", int(n), 1)
        else:
            n = int(np.prod(space.n))
            self._add("bernoulli", n, n)
        self._leaves.append(_ActionLeaf(space, slice(first, self._width)))

    def _add(self, kind: str, n: int, width: int) -> None:
        params = 2 * n if kind == "gaussian" else n
        self.parts.append(ActionPart(kind, n, slice(self._params, self._params + params),
                                     slice(self._width, self._width + width)))
        self._params += params
        self._width += width

    @property
    def leaves(self) -> tuple[_ActionLeaf, ...]:
        """The declared spaces an action is made of (one, or a Tuple's parts), each with its columns."""
        return tuple(self._leaves)

    @property
    def num_params(self) -> int:
        """Width of the network's action parameters (logits, or mean and log-std)."""
        return self._params

    @property
    def num_logits(self) -> int:
        """Flags an action mask needs: one per category of every categorical part."""
        return sum(p.n for p in self.parts if p.kind == "categorical")

    def encode(self, action) -> np.ndarray:
        """One action as ``space.sample()`` gives it -> its stored row ``[*shape]``: the inverse of
        :meth:`to_env`."""
        values = action if isinstance(self.space, spaces.Tuple) else (action,)
        row = np.concatenate([leaf.encode(value) for leaf, value in zip(self._leaves, values)])
        return row.astype(self.dtype).reshape(self.shape)

    def to_env(self, actions: np.ndarray):
        """Stored actions ``[B, *shape]`` -> what ``env.step`` of a vector env takes: ``[B, *space.shape]``
        in the space's dtype, Discrete / MultiDiscrete values shifted by their ``start``, Box values
        clipped to its bounds; for a Tuple space a tuple of such arrays, one per part."""
        actions = np.asarray(actions)
        if self._unchanged:
            return actions
        if not isinstance(self.space, spaces.Tuple):
            return self._leaves[0].to_env(actions)
        return tuple(leaf.to_env(actions[:, leaf.columns]) for leaf in self._leaves)


# Beyond this a declared bound is a placeholder ("no bound"), not a limit the env means.
_BOUND_LIMIT = 1e30


def box_bounds(space: spaces.Box) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of a Box as limits fastrl can act on: a bound that is infinite, beyond 1e30 or
    a denormal-sized non-zero placeholder (envpool declares ViZDoom's and DeepMind Control's spaces
    as [2.2e-308, 1.8e308]: the smallest positive double stands for "no lower bound") becomes
    -inf / +inf, so clipping never pins an action to nonsense."""
    def sensible(bound: np.ndarray) -> np.ndarray:
        bound = np.asarray(bound, dtype=np.float64)
        return np.isfinite(bound) & (np.abs(bound) < _BOUND_LIMIT) & ~((bound != 0) & (np.abs(bound) < 1e-30))

    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    return np.where(sensible(low), low, -np.inf), np.where(sensible(high), high, np.inf)


def check_action_mask(obs_layout: ObsLayout, action_layout: ActionLayout) -> None:
    """An ``action_mask`` must have one flag per category of the (categorical) actions."""
    mask = obs_layout.mask
    if mask is None:
        return
    kinds = {p.kind for p in action_layout.parts}
    if kinds != {"categorical"}:
        raise UnsupportedSpace(f"an action_mask needs Discrete or MultiDiscrete actions; the action space is "
                               f"{action_layout.space}")
    size = int(np.prod(mask.shape))
    if size != action_layout.num_logits:
        raise UnsupportedSpace(
            f"action_mask has shape {mask.shape} ({size} flags) but the action space {action_layout.space} has "
            f"{action_layout.num_logits} choices: the mask needs one flag per action (per component value for "
            f"MultiDiscrete)")
