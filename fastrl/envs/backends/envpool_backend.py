"""envpool backend: C++ thread pools stepping envs outside the GIL.

Two modes (both `env_type="gymnasium"`, NEXT_STEP autoreset):
- sync (`EnvpoolSplitVecEnv`): `num_envs // batch_size` envpool instances of `batch_size` envs each;
  `send()` hands one split to its pool and returns, so a split steps while the worker computes
  the actions of another.
- async (`EnvpoolAsync`): one envpool instance with `num_envs` envs whose `recv()` returns the
  first `batch_size` envs to finish, in any order (EnvPool paper, Weng et al. 2022).

Env i of a group is seeded `seed + i` (mod 2^31) in both modes (envpool seeds env j of a pool
`seed + j`).

Both modes step through `DirectPoolIO` where a pool's layout allows: envpool's compiled
`_send`/`_recv` without its Python wrapper around them.

Multi-player tasks (pgx's board games, highway's IntersectionMultiAgent) make every player a row:
see fastrl/envs/multiagent/envpool_players.py.
"""

from __future__ import annotations

import warnings
from typing import Any

import envpool
import gymnasium
import numpy as np
from envpool.registration import registry

from fastrl.envs.base import Batch, SplitVecEnv, VecEnv, as_batch, check_whole_games
from fastrl.envs.game_return import GameReturns
from fastrl.envs.multiagent.envpool_players import EnvpoolTurns, PlayerRows, is_turn_based
from fastrl.envs.multiagent.turns import check_turn_groups
from fastrl.envs.spaces import CodeGrid


def make_envpool_vec_env(
    env_id: str,
    num_envs: int,
    batch_size: int,
    seed: int,
    async_mode: bool = False,
    num_threads: int = 0,
    thread_affinity: bool = False,
    env_kwargs: dict[str, Any] | None = None,
) -> VecEnv:
    """`EnvpoolAsync` over one pool, or `EnvpoolSplitVecEnv` over `num_envs // batch_size` pools; for a
    multi-player task (fastrl/envs/multiagent/envpool_players.py), every player a row: `num_envs` and
    `batch_size` count rows, and the games are `EnvpoolTurns` (turn-based, `async_mode` ignored)
    or `PlayerRows` of those."""
    env_kwargs = env_kwargs or {}

    def make_pool(pool_envs: int, pool_batch: int, pool_seed: int) -> Any:
        return envpool.make(
            env_id,
            env_type="gymnasium",
            num_envs=pool_envs,
            batch_size=pool_batch,
            seed=pool_seed % 2**31,  # envpool takes an int32 seed
            num_threads=num_threads,
            # Pinning helps Atari and hurts CartPole (docs/results.md#per-batch-costs): a setting.
            thread_affinity_offset=0 if thread_affinity else -1,
            **env_kwargs,
        )

    players, turn_based = task_players(env_id, env_kwargs)
    if turn_based:
        check_turn_groups(env_id, players, num_envs, batch_size)
        pool = make_pool(num_envs // players, 1, seed)
        return EnvpoolTurns(env_id, pool, batch_size, *_spaces([pool]))
    check_whole_games(env_id, players, batch_size)
    games, games_per_batch = num_envs // players, batch_size // players
    first = make_pool(games if async_mode else games_per_batch, games_per_batch, seed)
    atari = _is_atari(env_id)
    if async_mode:
        env = EnvpoolAsync(first, _frame_skip(env_id, first), atari)
    else:
        pools = [first] + [make_pool(games_per_batch, games_per_batch, seed + start)
                           for start in range(games_per_batch, games, games_per_batch)]
        env = EnvpoolSplitVecEnv(pools, _frame_skip(env_id, first), atari)
    return PlayerRows(env, players) if players > 1 else env


def task_players(env_id: str, env_kwargs: dict[str, Any]) -> tuple[int, bool]:
    """(players of one game of envpool task ``env_id``, whether they take turns), from its spec."""
    spec = envpool.make_spec(env_id, **env_kwargs)
    players = int(spec.config.max_num_players)
    return players, players > 1 and is_turn_based(spec)


def task_options(env_id: str) -> tuple[str, ...]:
    """The option names envpool task ``env_id`` takes (its config's fields: "frame_skip", ...)."""
    return tuple(envpool.make_spec(env_id).config._fields)


def episode_layout(env_id: str, env_kwargs: dict[str, Any], min_rows: int) -> tuple[int, int]:
    """(num_envs, batch_size) of the fewest games of ``env_id`` that hold ``min_rows`` rows, all in
    one batch (for a turn-based task, one group: a row of each game), to play whole episodes."""
    players, turn_based = task_players(env_id, env_kwargs)
    games = -(-min_rows // players)
    return games * players, games if turn_based else games * players


def _spaces(pools: list[Any]) -> tuple[Any, Any]:
    """The pools' (observation space, action space), read from the first.

    envpool builds float32 Boxes from float64 bounds on a pool's first access to its spaces (its
    first recv() at the latest), and gymnasium warns about the cast for each pool of every worker
    of every run; the bounds are envpool's own, so the warning tells the user nothing they can act
    on. Reading every pool's spaces here caches them with the warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered", category=UserWarning)
        spaces = [(pool.observation_space, pool.action_space) for pool in pools]
    observation_space, action_space = spaces[0]
    if type(pools[0]).__name__.startswith("MiniGrid"):
        observation_space = _minigrid_codes(observation_space)
    return observation_space, _integer_box_as_multidiscrete(action_space)


MINIGRID_LEVELS = (11, 6, 3)  # MiniGrid's object, colour and door-state codes per cell


def _minigrid_codes(space: gymnasium.spaces.Dict) -> gymnasium.spaces.Dict:
    """MiniGrid's ``image`` as the :class:`~fastrl.envs.spaces.CodeGrid` it is: envpool declares it
    0-255 pixels, which would scale a key (5) and a ball (6) to 0.020 and 0.024."""
    leaves = dict(space.spaces)
    leaves["image"] = CodeGrid(leaves["image"].shape, MINIGRID_LEVELS)
    return gymnasium.spaces.Dict(leaves)


def _integer_box_as_multidiscrete(space: Any) -> Any:
    """An integer Box from 0 (envpool's form of jumanji's multi-component discrete actions:
    Connector's Box(0, 4, (10,), int32), BinPack's Box(0, [39 19], (2,), int32)) as the
    MultiDiscrete(high + 1) it is, so fastrl acts with one categorical per component (and can
    apply a per-component action_mask) instead of a Gaussian cast to integers. envpool takes the
    int64 actions as they are."""
    if (isinstance(space, gymnasium.spaces.Box) and space.dtype.kind in "iu" and np.all(space.low == 0)
            and np.all(space.high >= 0)):
        return gymnasium.spaces.MultiDiscrete(np.asarray(space.high, dtype=np.int64) + 1)
    return space


def _is_atari(env_id: str) -> bool:
    return registry.specs[env_id][0] == "envpool.atari"


def _frame_skip(env_id: str, pool: Any) -> int:
    # Only Atari's frame_skip counts emulator frames; MuJoCo's counts physics substeps.
    return int(pool.config["frame_skip"]) if _is_atari(env_id) else 1


class DirectPoolIO:
    """One pool's `send`/`recv` through envpool's compiled `_send`/`_recv`, skipping the Python
    wrapper around them (envpool 1.2: optree, dict building, a copy of the env ids and a
    `config` dict rebuilt on every `send`).

    Why: a CartPole batch of 512 envs spent 32 us of the worker's CPU in `recv` and 36 us in
    `send`; through this path 10-12 and 20-23 us (one thread, the step done before `recv`).
    The worker's main thread does that once per batch, in sampling and
    in the raw env measurement alike.

    `of(pool)` returns None where the pool's layout is not the one read here (one "obs" array,
    actions keyed env_id / players.env_id / action): those pools keep envpool's public calls.
    The first `send` goes through the public call, which checks the actions' dtype and shape
    once; the arrays sent afterwards come from the same code, batch after batch.
    """

    STATE_KEYS = ("info:env_id", "obs", "reward", "done", "trunc")
    ACTION_KEYS = ["env_id", "players.env_id", "action"]
    # Atari's game over (a lost life ends no game) and its unclipped reward: read where a pool has them.
    GAME_KEYS = ("info:terminated", "info:reward")

    def __init__(self, pool: Any, state_index: list[int], action_dtype: np.dtype,
                 game_index: list[int] | None = None) -> None:
        self._pool = pool
        self._state_index = state_index
        self._action_dtype = action_dtype
        self._game_index = game_index
        self._checked = False
        self.last_game: tuple[np.ndarray, np.ndarray] | None = None  # (game over, raw reward) of the last recv

    @classmethod
    def of(cls, pool: Any) -> DirectPoolIO | None:
        try:
            state_keys = list(pool._state_keys)
            action_keys = list(pool._spec._action_keys)
            action_dtype = np.dtype(pool.spec.action_array_spec["action"].dtype)
            compiled = callable(pool._send) and callable(pool._recv)
        except (AttributeError, KeyError, TypeError):
            return None
        if not compiled or action_keys != cls.ACTION_KEYS or not set(cls.STATE_KEYS) <= set(state_keys):
            return None
        game_index = [state_keys.index(key) for key in cls.GAME_KEYS] if set(cls.GAME_KEYS) <= set(state_keys) \
            else None
        return cls(pool, [state_keys.index(key) for key in cls.STATE_KEYS], action_dtype, game_index)

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        if not self._checked:
            self._pool.send(actions, env_ids)
            self._checked = True
            return
        env_ids = np.ascontiguousarray(env_ids, dtype=np.int32)
        self._pool._send([env_ids, env_ids, np.ascontiguousarray(actions, dtype=self._action_dtype)])

    def recv(self) -> Batch:
        """(obs, rewards, terminated, truncated, env_ids) as the gymnasium `recv` returns them."""
        state = self._pool._recv()
        env_ids, obs, rewards, done, truncated = (state[i] for i in self._state_index)
        if self._game_index is not None:
            self.last_game = (state[self._game_index[0]], state[self._game_index[1]])
        return obs, rewards, done & ~truncated, truncated, env_ids


class _PublicPoolIO:
    """envpool's public calls, for pools `DirectPoolIO` does not read."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.last_game: tuple[np.ndarray, np.ndarray] | None = None  # as DirectPoolIO's

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        self._pool.send(actions, env_ids)

    def recv(self) -> Batch:
        obs, rewards, terminated, truncated, info = self._pool.recv()
        if "terminated" in info and "reward" in info:
            self.last_game = (info["terminated"], info["reward"])
        return obs, rewards, terminated, truncated, info["env_id"]


class _PlayersPoolIO(_PublicPoolIO):
    """A simultaneous multi-player pool's public calls: the players' observations and rewards of a
    batch of games, ``players`` per game in the games' order (what PlayerRows reads), checked."""

    def __init__(self, pool: Any, players: int) -> None:
        super().__init__(pool)
        self._players = players

    def recv(self) -> Batch:
        obs, rewards, terminated, truncated, info = self._pool.recv()
        env_ids = info["env_id"]
        if not np.array_equal(info["players"]["env_id"], np.repeat(env_ids, self._players)):
            raise RuntimeError(f"envpool returned players of games {info['players']['env_id'].tolist()} for games "
                               f"{env_ids.tolist()}, not {self._players} per game in the games' order")
        return obs, rewards, terminated, truncated, env_ids


def pool_io(pool: Any) -> DirectPoolIO | _PublicPoolIO:
    players = int(pool.config.get("max_num_players", 1))
    if players > 1:
        return _PlayersPoolIO(pool, players)
    return DirectPoolIO.of(pool) or _PublicPoolIO(pool)


class EnvpoolSplitVecEnv(SplitVecEnv):
    """Sync mode: one envpool instance per split; split s holds envs [s*B, (s+1)*B).

    `recv()` returns fresh arrays from envpool; with ``atari``, ``last_info`` holds the game scores
    (fastrl.envs.game_return).
    """

    def __init__(self, pools: list[Any], frame_skip: int, atari: bool = False) -> None:
        batch_size = pools[0].config["num_envs"]
        super().__init__(batch_size * len(pools), batch_size)
        self._pools = pools
        self._io = [pool_io(pool) for pool in pools]
        self.observation_space, self.action_space = _spaces(pools)
        self.frame_skip = frame_skip
        self._games = GameReturns(self.num_envs) if atari else None

    def _reset_split(self, split: int) -> None:
        self._pools[split].async_reset()

    def _send_split(self, split: int, actions: np.ndarray, local_ids: np.ndarray) -> None:
        self._io[split].send(self._env_actions(actions), local_ids)

    def _recv_split(self, split: int) -> Batch:
        io = self._io[split]
        batch = io.recv()
        if self._games is not None:
            self.last_info = self._games.read(io, batch[4] + split * self.batch_size, batch[3])
        return batch

    def render_game(self, env: int = 0) -> np.ndarray:
        """Env ``env``'s frame (made with ``render_mode="rgb_array"``: uint8 [H, W, 3])."""
        split, local = divmod(env, self.batch_size)
        return self._pools[split].render(env_ids=np.array([local], dtype=np.int32))[0]

    def close(self) -> None:
        for pool in self._pools:
            pool.close()
        self._pools = []
        self._io = []


class EnvpoolAsync(VecEnv):
    """Async mode: one envpool instance; each `recv()` returns the first `batch_size` envs done.

    Any subset of the envs returned by `recv()` may be sent at a time. `recv()` returns fresh
    arrays from envpool; with ``atari``, ``last_info`` holds the game scores
    (fastrl.envs.game_return).
    """

    def __init__(self, pool: Any, frame_skip: int, atari: bool = False) -> None:
        self.num_envs = pool.config["num_envs"]
        self.batch_size = pool.config["batch_size"]
        self._pool = pool
        self._io = pool_io(pool)
        self.observation_space, self.action_space = _spaces([pool])
        self.frame_skip = frame_skip
        self._games = GameReturns(self.num_envs) if atari else None
        self._awaiting = np.zeros(self.num_envs, dtype=bool)  # returned by recv, not yet sent
        self._in_flight = 0  # envs reset or sent and not yet returned

    def async_reset(self) -> None:
        self._pool.async_reset()
        self._awaiting[:] = False
        self._in_flight = self.num_envs

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        env_ids = np.asarray(env_ids, dtype=np.int32)
        if not self._awaiting[env_ids].all():
            raise RuntimeError(
                "send() for envs that are not waiting for an action: send each env id "
                "returned by recv() exactly once"
            )
        self._io.send(self._env_actions(actions), env_ids)
        self._awaiting[env_ids] = False
        self._in_flight += len(env_ids)

    def recv(self) -> Batch:
        if self._in_flight < self.batch_size:
            raise RuntimeError(
                f"recv() with only {self._in_flight} envs in flight, fewer than batch_size "
                f"{self.batch_size}: call async_reset() first and send() actions before receiving"
            )
        obs, rewards, terminated, truncated, env_ids = self._io.recv()
        self._in_flight -= self.batch_size
        self._awaiting[env_ids] = True
        if self._games is not None:
            self.last_info = self._games.read(self._io, env_ids, truncated)
        return as_batch(obs, rewards, terminated, truncated, env_ids)

    def render_game(self, env: int = 0) -> np.ndarray:
        """Env ``env``'s frame (made with ``render_mode="rgb_array"``: uint8 [H, W, 3])."""
        return self._pool.render(env_ids=np.array([env], dtype=np.int32))[0]

    def close(self) -> None:
        self._pool.close()
