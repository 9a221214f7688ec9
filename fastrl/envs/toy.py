"""Tiny deterministic gymnasium envs whose right answers are known (returns, a memory task, every
space fastrl takes): a quick check of a learner or a setup, and the tests' envs. Factories are usable
as "module:callable" (e.g. `make_vec_env("fastrl.envs.toy:make_countdown", ..., env_kwargs={"length":
5})`), so spawned worker processes can build them by name. AgreementGames, a multi-agent VecEnv
stepped in numpy, is given as "module:Class" and makes a worker's whole group of rows itself.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

from fastrl.envs.base import Batch, SplitVecEnv, check_whole_games


class CountdownEnv(gymnasium.Env):
    """Step index as observation, reward 1 per step, a known episode end.

    reset -> obs t=0. Step k (k = 1, 2, ...) -> obs t=k, reward 1, and
    terminated = (k == length), truncated = (k == time_limit < length). So with discount gamma
    the return from t=0 is sum_{k<length} gamma^k when terminated; after a truncation the value
    target must bootstrap from V(obs t=time_limit).

    Observation: float32 [1] holding t, or with `one_hot` float32 [length + 1] with a 1 at t.
    Actions: Discrete(num_actions), ignored.
    """

    def __init__(
        self,
        length: int = 5,
        time_limit: int | None = None,
        one_hot: bool = False,
        num_actions: int = 2,
    ) -> None:
        if length < 1 or (time_limit is not None and not 1 <= time_limit < length):
            raise ValueError(
                f"need length >= 1 and 1 <= time_limit < length, got {length=}, {time_limit=}"
            )
        self.length = length
        self.time_limit = time_limit
        self.one_hot = one_hot
        size = length + 1 if one_hot else 1
        self.observation_space = spaces.Box(0.0, float(length), (size,), np.float32)
        self.action_space = spaces.Discrete(num_actions)
        self._t = 0

    def _obs(self) -> np.ndarray:
        if self.one_hot:
            obs = np.zeros(self.length + 1, dtype=np.float32)
            obs[self._t] = 1.0
            return obs
        return np.array([self._t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple:
        self._t += 1
        terminated = self._t == self.length
        truncated = not terminated and self._t == self.time_limit
        return self._obs(), 1.0, terminated, truncated, {}


class TargetEnv(gymnasium.Env):
    """Continuous actions: reward = -sum((a - target)^2), target shown as the observation.

    The target is drawn uniformly from [-target_scale, target_scale]^action_dim at each reset;
    episodes last `length` steps (terminated). Actions: Box [-1, 1]^action_dim, float32, so a
    clipped action a' gives reward -sum((a' - target)^2) with |target| <= target_scale < 1.
    """

    def __init__(self, action_dim: int = 1, length: int = 10, target_scale: float = 0.5) -> None:
        self.length = length
        self.target_scale = target_scale
        self.observation_space = spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self._target = np.zeros(action_dim, dtype=np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        self._target = self.np_random.uniform(
            -self.target_scale, self.target_scale, self._target.shape
        ).astype(np.float32)
        return self._target.copy(), {}

    def step(self, action: np.ndarray) -> tuple:
        self._t += 1
        reward = -float(np.sum((np.asarray(action, dtype=np.float32) - self._target) ** 2))
        return self._target.copy(), reward, self._t == self.length, False, {}


def make_countdown(
    length: int = 5, time_limit: int | None = None, one_hot: bool = False, num_actions: int = 2
) -> CountdownEnv:
    return CountdownEnv(length, time_limit, one_hot, num_actions)


def make_target(action_dim: int = 1, length: int = 10, target_scale: float = 0.5) -> TargetEnv:
    return TargetEnv(action_dim, length, target_scale)


class MemoryEnv(gymnasium.Env):
    """A cue shown only on the first step, to be acted on ``length`` steps later: needs memory.

    Observation float32 [3]: (cue, is the decision step, t / length). The cue is +1 or -1 on the
    first observation and 0 afterwards. Actions Discrete(2); only the action on the decision step
    (the observation at t = length - 1) counts: reward +1 if it names the cue (0 for -1, 1 for +1),
    else -1, and the episode terminates. A feed-forward policy sees no cue there: its expected
    return is 0; a policy that remembers the cue gets 1.

    ``sides=True`` is MiniGrid Memory's split: the decision step's first entry shows a side, +1 or
    -1 at random, where the cue's match lies, and the right action is 1 where the side equals the
    cue, else 0. Then neither the cue alone nor the side alone says anything: the policy must
    combine what it remembers with what it sees (an exclusive or).
    """

    def __init__(self, length: int = 8, sides: bool = False) -> None:
        if length < 2:
            raise ValueError(f"MemoryEnv needs length >= 2, got {length}")
        self.length = length
        self.sides = sides
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0
        self._cue = 1
        self._side = 1

    def _obs(self) -> np.ndarray:
        decision = self._t == self.length - 1
        first = 0.0
        if self._t == 0:
            first = float(self._cue)
        elif self.sides and decision:
            first = float(self._side)
        return np.array([first, float(decision), self._t / self.length], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        self._cue = 1 if self.np_random.random() < 0.5 else -1
        if self.sides:
            self._side = 1 if self.np_random.random() < 0.5 else -1
        return self._obs(), {}

    def step(self, action: int) -> tuple:
        if self._t == self.length - 1:
            named = self._cue * self._side if self.sides else self._cue
            reward = 1.0 if int(action) == (1 if named > 0 else 0) else -1.0
            self._t += 1
            return self._obs(), reward, True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


def make_memory(length: int = 8, sides: bool = False) -> MemoryEnv:
    return MemoryEnv(length, sides)


# ---------------------------------------------------------------------------------------------
# Composite observation and action spaces (fastrl.envs.spaces): a grid world with a Dict observation
# and an action mask, envs for each action space, observation forms, and broken masks for the
# error paths. They raise IllegalAction when an action outside their action space, or one their
# action_mask forbade, reaches them.


class IllegalAction(RuntimeError):
    """An env received an action outside its action space, or one its own action_mask forbade."""


def _check_action(env: gymnasium.Env, action) -> None:
    if not env.action_space.contains(action):
        raise IllegalAction(f"{type(env).__name__}: action {action!r} is not in {env.action_space}")


def _random_legal(rng: np.random.Generator, n: int, must: int) -> np.ndarray:
    """uint8 [n]: each choice legal with probability 1/2, ``must`` always legal."""
    legal = (rng.random(n) < 0.5).astype(np.uint8)
    legal[must] = 1
    return legal


class DictGridEnv(gymnasium.Env):
    """A ``size`` x ``size`` room inside walls; agent and goal start in random distinct cells.

    Observation Dict: "image" uint8 ``(2 size - 1, 2 size - 1, 3)`` HWC, an egocentric view of
    the whole room (the agent in the centre), 255 where channel 0 a wall (or outside the room),
    1 the goal, 2 the agent is; "position" Discrete(size * size) the agent's cell (row * size +
    column); "action_mask" MultiBinary(4), moves into a wall are illegal. Actions Discrete(4):
    up, right, down, left. Reaching the goal terminates with reward ``1 - 0.9 * t / time_limit``
    (t steps taken, as in MiniGrid); ``time_limit`` steps truncate with 0. At size 5 the best
    policy scores about 0.85 (3.3 steps to the goal on average), a uniformly random legal one
    about 0.25. A masked move raises IllegalAction.
    """

    MOVES = np.array([(-1, 0), (0, 1), (1, 0), (0, -1)])

    def __init__(self, size: int = 5, time_limit: int = 20) -> None:
        self.size = size
        self.time_limit = time_limit
        view = 2 * size - 1
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (view, view, 3), np.uint8),
            "position": spaces.Discrete(size * size),
            "action_mask": spaces.MultiBinary(4),
        })
        self.action_space = spaces.Discrete(4)
        # The room with walls around it, padded with walls so that any view window fits.
        self._walls = np.full((3 * size, 3 * size), 255, np.uint8)
        self._walls[size:2 * size, size:2 * size] = 0
        self._agent = np.zeros(2, np.int64)  # cell in _walls coordinates
        self._goal = np.zeros(2, np.int64)
        self._t = 0

    def _mask(self) -> np.ndarray:
        targets = self._agent + self.MOVES
        return (self._walls[targets[:, 0], targets[:, 1]] == 0).astype(np.uint8)

    def _obs(self) -> dict:
        r, c = self._agent - (self.size - 1)
        view = 2 * self.size - 1
        image = np.zeros((view, view, 3), np.uint8)
        image[..., 0] = self._walls[r:r + view, c:c + view]
        goal_r, goal_c = self._goal - (r, c)
        image[goal_r, goal_c, 1] = 255
        image[self.size - 1, self.size - 1, 2] = 255
        position = (self._agent[0] - self.size) * self.size + self._agent[1] - self.size
        return {"image": image, "position": int(position), "action_mask": self._mask()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size * self.size, 2, replace=False)
        self._agent = np.array(divmod(int(cells[0]), self.size)) + self.size
        self._goal = np.array(divmod(int(cells[1]), self.size)) + self.size
        self._t = 0
        return self._obs(), {}

    def step(self, action) -> tuple:
        _check_action(self, action)
        action = int(action)
        if not self._mask()[action]:
            raise IllegalAction(f"DictGridEnv: move {action} into a wall from {(self._agent - self.size).tolist()} "
                                f"was masked")
        self._t += 1
        self._agent = self._agent + self.MOVES[action]
        if np.array_equal(self._agent, self._goal):
            return self._obs(), 1.0 - 0.9 * self._t / self.time_limit, True, False, {}
        return self._obs(), 0.0, False, self._t >= self.time_limit, {}


class _NewTargetEachStep(gymnasium.Env):
    """Episodes of ``length`` steps (terminated). Each observation shows a new target
    (``_obs``); the action taken on it is scored by ``_reward``, which raises IllegalAction for
    a masked one. An action outside the action space raises IllegalAction too."""

    length: int
    _t: int = 0

    def _obs(self):
        raise NotImplementedError

    def _reward(self, action) -> float:
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action) -> tuple:
        _check_action(self, action)
        reward = self._reward(action)
        self._t += 1
        return self._obs(), reward, self._t == self.length, False, {}


class CueEnv(_NewTargetEachStep):
    """Name the cue: each step shows a cue k in [0, num_actions); action k scores 1, others 0.

    ``form`` picks how the cue is observed: "discrete" Discrete(num_actions); "tuple"
    Tuple(Discrete(num_actions), Box float32 [2] of noise); "float64" Dict {"cue": float64
    one-hot with bounds (-inf, inf), "noise": float64 [2] with bounds of the whole float64
    range}, bounds as envpool declares them; "image" Dict {"screen": uint8 [16, 8 num_actions, 3],
    dark but for a bright 8-pixel-wide bar in column block k, "step": float32 [1] the step index},
    an image env's observation as ViZDoom's (screen and game variables). Episodes last ``length``
    steps.
    """

    FORMS = ("discrete", "tuple", "float64", "image")

    def __init__(self, num_actions: int = 3, length: int = 8, form: str = "discrete") -> None:
        if form not in self.FORMS:
            raise ValueError(f"CueEnv form must be one of {self.FORMS}, got {form!r}")
        self.num_actions = num_actions
        self.length = length
        self.form = form
        if form == "discrete":
            self.observation_space = spaces.Discrete(num_actions)
        elif form == "tuple":
            self.observation_space = spaces.Tuple((spaces.Discrete(num_actions),
                                                   spaces.Box(-1.0, 1.0, (2,), np.float32)))
        elif form == "image":
            self.observation_space = spaces.Dict({
                "screen": spaces.Box(0, 255, (16, 8 * num_actions, 3), np.uint8),
                "step": spaces.Box(-np.inf, np.inf, (1,), np.float32),
            })
        else:
            big = np.finfo(np.float64).max
            self.observation_space = spaces.Dict({
                "cue": spaces.Box(-np.inf, np.inf, (num_actions,), np.float64),
                "noise": spaces.Box(-big, big, (2,), np.float64),
            })
        self.action_space = spaces.Discrete(num_actions)
        self._cue = 0

    def _obs(self):
        self._cue = int(self.np_random.integers(self.num_actions))
        if self.form == "discrete":
            return self._cue
        if self.form == "image":
            screen = np.full((16, 8 * self.num_actions, 3), 40, np.uint8)
            screen[4:12, 8 * self._cue:8 * (self._cue + 1)] = 220
            return {"screen": screen, "step": np.array([self._t], np.float32)}
        noise = self.np_random.uniform(-1.0, 1.0, 2)
        if self.form == "tuple":
            return self._cue, noise.astype(np.float32)
        return {"cue": np.eye(self.num_actions)[self._cue], "noise": noise}

    def _reward(self, action) -> float:
        return float(int(action) == self._cue)


class MaskedCueEnv(_NewTargetEachStep):
    """Name the cue, among legal actions that change every step.

    Observation Dict {"cue": Discrete(num_actions), "action_mask": MultiBinary(mask_size)}: each
    step a random subset of the actions is legal (each with probability 1/2, the cue always);
    the legal action named by the cue scores 1, other legal ones 0, a masked one raises
    IllegalAction. Episodes last ``length`` steps. Broken on purpose, for the error paths:
    ``empty_mask_at`` = t > 0 shows an all-zero mask at step t of every episode; ``mask_size``
    other than ``num_actions`` gives a mask of the wrong shape.
    """

    def __init__(self, num_actions: int = 6, length: int = 8, empty_mask_at: int = 0,
                 mask_size: int | None = None) -> None:
        self.num_actions = num_actions
        self.length = length
        self.empty_mask_at = empty_mask_at
        self.observation_space = spaces.Dict({
            "cue": spaces.Discrete(num_actions),
            "action_mask": spaces.MultiBinary(num_actions if mask_size is None else mask_size),
        })
        self.action_space = spaces.Discrete(num_actions)
        self._cue = 0
        self._legal = np.ones(num_actions, np.uint8)

    def _obs(self) -> dict:
        self._cue = int(self.np_random.integers(self.num_actions))
        self._legal = _random_legal(self.np_random, self.num_actions, self._cue)
        if self._t == self.empty_mask_at > 0:
            self._legal[:] = 0
        mask = np.zeros(self.observation_space["action_mask"].n, np.uint8)
        mask[:self.num_actions] = self._legal[:len(mask)]
        return {"cue": self._cue, "action_mask": mask}

    def _reward(self, action) -> float:
        if not self._legal[int(action)]:
            raise IllegalAction(f"MaskedCueEnv: action {action} was masked (legal: {np.flatnonzero(self._legal)})")
        return float(int(action) == self._cue)


class MatchComponentsEnv(_NewTargetEachStep):
    """MultiDiscrete actions: match each component to a target shown in the observation.

    Observation Dict {"target": MultiDiscrete(nvec)} (plus "action_mask" MultiBinary(sum(nvec))
    with ``masked``: each value of each component legal with probability 1/2, the target's
    always; a masked value raises IllegalAction). Actions MultiDiscrete(nvec); reward = the
    fraction of components equal to the target's. Episodes last ``length`` steps.
    """

    def __init__(self, nvec: tuple = (3, 4, 2), length: int = 8, masked: bool = False) -> None:
        self.nvec = np.asarray(nvec, np.int64)
        self.length = length
        self.masked = masked
        obs = {"target": spaces.MultiDiscrete(self.nvec)}
        if masked:
            obs["action_mask"] = spaces.MultiBinary(int(self.nvec.sum()))
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.MultiDiscrete(self.nvec)
        self._starts = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])  # each component's first flag
        self._target = np.zeros(len(self.nvec), np.int64)
        self._legal = np.ones(int(self.nvec.sum()), np.uint8)

    def _obs(self) -> dict:
        self._target = self.np_random.integers(self.nvec)
        if not self.masked:
            return {"target": self._target.copy()}
        self._legal = np.concatenate([_random_legal(self.np_random, int(n), int(k))
                                      for n, k in zip(self.nvec, self._target)])
        return {"target": self._target.copy(), "action_mask": self._legal.copy()}

    def _reward(self, action) -> float:
        action = np.asarray(action, np.int64)
        if not self._legal[self._starts + action].all():
            raise IllegalAction(f"MatchComponentsEnv: action {action.tolist()} has a masked component")
        return float(np.mean(action == self._target))


class MatchBitsEnv(_NewTargetEachStep):
    """MultiBinary actions: copy the ``n`` target bits of a MultiBinary(n) observation; reward =
    the fraction of bits copied. Episodes last ``length`` steps."""

    def __init__(self, n: int = 4, length: int = 8) -> None:
        self.n = n
        self.length = length
        self.observation_space = spaces.MultiBinary(n)
        self.action_space = spaces.MultiBinary(n)
        self._target = np.zeros(n, np.int8)

    def _obs(self) -> np.ndarray:
        self._target = self.np_random.integers(0, 2, self.n).astype(np.int8)
        return self._target.copy()

    def _reward(self, action) -> float:
        return float(np.mean(np.asarray(action) == self._target))


class TupleActionEnv(_NewTargetEachStep):
    """Tuple(Discrete, Box) actions: pick a category and a point.

    Observation Tuple(Discrete(num_categories), Box float32 [1] in [-0.5, 0.5]): the target
    category and point. Actions Tuple(Discrete(num_categories), Box [-1, 1]^1 float32); reward =
    [category right] - (point - target)^2. Episodes last ``length`` steps.
    """

    def __init__(self, num_categories: int = 3, length: int = 8) -> None:
        self.num_categories = num_categories
        self.length = length
        self.observation_space = spaces.Tuple((spaces.Discrete(num_categories),
                                               spaces.Box(-0.5, 0.5, (1,), np.float32)))
        self.action_space = spaces.Tuple((spaces.Discrete(num_categories),
                                          spaces.Box(-1.0, 1.0, (1,), np.float32)))
        self._category = 0
        self._point = np.zeros(1, np.float32)

    def _obs(self) -> tuple:
        self._category = int(self.np_random.integers(self.num_categories))
        self._point = self.np_random.uniform(-0.5, 0.5, 1).astype(np.float32)
        return self._category, self._point.copy()

    def _reward(self, action) -> float:
        category, point = action
        return float(int(category) == self._category) - float(np.sum((point - self._point) ** 2))


def make_dict_grid(size: int = 5, time_limit: int = 20) -> DictGridEnv:
    return DictGridEnv(size, time_limit)


def make_cue(num_actions: int = 3, length: int = 8, form: str = "discrete") -> CueEnv:
    return CueEnv(num_actions, length, form)


def make_masked_cue(num_actions: int = 6, length: int = 8, empty_mask_at: int = 0,
                    mask_size: int | None = None) -> MaskedCueEnv:
    return MaskedCueEnv(num_actions, length, empty_mask_at, mask_size)


def make_match_components(nvec: tuple = (3, 4, 2), length: int = 8, masked: bool = False) -> MatchComponentsEnv:
    return MatchComponentsEnv(tuple(nvec), length, masked)


def make_match_bits(n: int = 4, length: int = 8) -> MatchBitsEnv:
    return MatchBitsEnv(n, length)


def make_tuple_action(num_categories: int = 3, length: int = 8) -> TupleActionEnv:
    return TupleActionEnv(num_categories, length)


class PaintedCountdownEnv(CountdownEnv):
    """A countdown env that renders (``render_mode="rgb_array"``), for video tests.

    Frame at step t: uint8 [height, width, 3], every pixel ``round(255 * t / length)``: grey
    levels survive lossy video encoding, so a decoded frame still tells its step.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, length: int = 5, render_mode: str | None = None, height: int = 32, width: int = 48) -> None:
        super().__init__(length)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"PaintedCountdownEnv renders rgb_array only, got render_mode={render_mode!r}")
        self.render_mode = render_mode
        self.height = height
        self.width = width

    def render(self) -> np.ndarray:
        return np.full((self.height, self.width, 3), round(255 * self._t / self.length), np.uint8)


def make_painted_countdown(length: int = 5, render_mode: str | None = None, height: int = 32,
                           width: int = 48) -> PaintedCountdownEnv:
    return PaintedCountdownEnv(length, render_mode, height, width)


# ---------------------------------------------------------------------------------------------
# A vectorized multi-agent env: a whole group of games stepped in numpy, made by fastrl as
# `--env fastrl.envs.toy:AgreementGames` (a VecEnv subclass given as "module:Class").


class AgreementGames(SplitVecEnv):
    """Cooperative games of ``agents`` players, every game and agent of a split stepped at once in
    numpy: no Python per game or agent, so a benchmark sees the framework's cost per agent row.

    Rows follow the multi-agent conventions (docs/multiagent.md): agent k of game g is row
    ``g * agents + k``, a split (``batch_size`` rows) holds whole games, autoreset is next-step
    per game. With ``agents=1`` every row is a game of its own: the single-agent env with the same
    work per row. ``agents`` names them ``agent_0``, ``agent_1``, ... (none for one agent).

    Actions Discrete(num_actions). At step t = 1, 2, ... of a game, m is the mean action of the
    agents playing it; each of them gets reward ``1 - |a_k - m| / (num_actions - 1)`` (1 when all
    agree) and observes float32 [5] ``(t, k, g, a_k, m)`` (g: the game's index in the group); the
    reset observation is ``(0, k, g, -1, -1)``. Agent k plays ``length - k * stagger`` steps and
    is terminated on the last; from then until its game resets it is an absent row: no action of
    its counts, its observation stays, its reward is 0 and it reports terminated on every step.
    The game ends when agent 0 leaves, after ``length`` steps, and its next step is the reset
    (reward 0, no flags). The games are deterministic: ``seed`` is not used.
    """

    OBS_SIZE = 5
    DEFAULT_AGENTS = 2

    def __init__(self, num_envs: int, batch_size: int, seed: int, agents: int = DEFAULT_AGENTS, length: int = 32,
                 stagger: int = 0, num_actions: int = 4) -> None:
        if agents < 1 or num_actions < 2 or length - (agents - 1) * stagger < 1 or stagger < 0:
            raise ValueError(f"AgreementGames needs agents >= 1, num_actions >= 2, stagger >= 0 and every agent "
                             f"playing a step (length - (agents - 1) * stagger >= 1), got {agents=}, {length=}, "
                             f"{stagger=}, {num_actions=}")
        check_whole_games(f"{__name__}:{type(self).__name__}", agents, batch_size)
        super().__init__(num_envs, batch_size)
        self.agents = tuple(f"agent_{k}" for k in range(agents)) if agents > 1 else ()
        self.length = length
        self.num_actions = num_actions
        self.observation_space = spaces.Box(-1.0, np.inf, (self.OBS_SIZE,), np.float32)
        self.action_space = spaces.Discrete(num_actions)
        self.frame_skip = 1
        S, G, B = self.num_splits, batch_size // agents, batch_size
        self._games_per_split = G
        self._lifetime = length - stagger * np.arange(agents)  # [A] steps agent k plays
        self._t = np.zeros((S, G), np.int64)  # steps the game has played
        self._resets = np.ones((S, G), bool)  # the game resets at its next step
        self.episodes_begun = np.zeros(S * G, np.int64)
        self._begun = self.episodes_begun.reshape(S, G)  # a view: game g of split s is g + s * G
        self._actions = np.zeros((S, B), np.int64)
        self._obs = np.zeros((S, B, self.OBS_SIZE), np.float32)
        self._rewards = np.zeros((S, B), np.float32)
        self._terminated = np.zeros((S, B), bool)
        self._truncated = np.zeros((S, B), bool)  # no time limit: never set
        rows = np.arange(num_envs).reshape(S, B)
        self._reset_obs = np.stack([np.zeros((S, B)), rows % agents, rows // agents, np.full((S, B), -1.0),
                                    np.full((S, B), -1.0)], axis=-1).astype(np.float32)
        self._local_ids = np.arange(B, dtype=np.int32)

    @classmethod
    def game_rows(cls, agents: int = DEFAULT_AGENTS, **_) -> int:
        return agents

    def _reset_split(self, split: int) -> None:
        self._resets[split] = True

    def _send_split(self, split: int, actions: np.ndarray, local_ids: np.ndarray) -> None:
        self._actions[split][local_ids] = self._env_actions(actions)

    def _recv_split(self, split: int) -> Batch:
        G, A = self._games_per_split, self._lifetime.size
        t, resets = self._t[split], self._resets[split]
        obs = self._obs[split].reshape(G, A, self.OBS_SIZE)
        rewards = self._rewards[split].reshape(G, A)
        terminated = self._terminated[split].reshape(G, A)
        playing = (t[:, None] < self._lifetime) & ~resets[:, None]  # [G, A]: the agents this step moves
        actions = self._actions[split].reshape(G, A)
        t += 1
        t[resets] = 0
        self._begun[split] += resets
        mean = (actions * playing).sum(axis=1) / np.maximum(playing.sum(axis=1), 1)  # [G]
        np.multiply(1.0 - np.abs(actions - mean[:, None]) / (self.num_actions - 1), playing, out=rewards)
        np.copyto(obs[..., 0], t[:, None], where=playing)
        np.copyto(obs[..., 3], actions, where=playing)
        np.copyto(obs[..., 4], mean[:, None], where=playing)
        np.greater_equal(t[:, None], self._lifetime, out=terminated)  # left on this step or before
        obs[resets] = self._reset_obs[split].reshape(G, A, self.OBS_SIZE)[resets]
        np.greater_equal(t, self.length, out=resets)
        return self._obs[split], self._rewards[split], self._terminated[split], self._truncated[split], self._local_ids

    def close(self) -> None:
        """Nothing to release: the games are arrays."""
