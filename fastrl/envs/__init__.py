"""Env backends behind one interface (`VecEnv`, see base.py), chosen by `make_vec_env`.

  backend     env_id                                   class
  envpool     an envpool task id ("CartPole-v1")        EnvpoolSplitVecEnv (sync) / EnvpoolAsync
              ... a multi-player one ("TicTacToe-v1")   EnvpoolTurns (turn-based) / PlayerRows of the
                                                        above: every player a row (envpool_players.py)
  gymnasium   a registered gymnasium id                 GymnasiumSplitVecEnv; Atari ids ("ALE/Pong-v5")
                                                        are preprocessed like envpool (atari.py);
                                                        ViZDoom ids ("VizdoomBasic-v1") render small
                                                        and skip frames in the engine (vizdoom_backend.py)
  factory     "module:callable" returning a gym.Env     GymnasiumSplitVecEnv
              ... or "module:Class", a VecEnv subclass   Class itself: a vectorized env that makes a
                                                        worker's whole group (fastrl.envs.toy.AgreementGames)
  pettingzoo  "pettingzoo:MODULE", a PettingZoo           PettingZooSplitVecEnv: every agent a row, games of
              ParallelEnv module (env.backend auto)     n agents in n consecutive rows
              ... or an AEC (turn-based) module         PettingZooTurnVecEnv: every seat a row, a batch the
                                                        seat to move of each game of a group
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium

from fastrl.envs.backends import atari, vizdoom_backend
from fastrl.envs.backends.gym_backend import GymnasiumSplitVecEnv
from fastrl.envs.base import Batch, SplitVecEnv, VecEnv
from fastrl.envs.multiagent.pettingzoo_backend import is_pettingzoo_id
from fastrl.envs.spaces import ActionLayout, ObsLayout, UnsupportedSpace, check_action_mask
from fastrl.envs.wrappers.action_subset import ActionSubset, action_subset_error
from fastrl.envs.wrappers.image_preprocessing import ImageOptions, check_applies, preprocessed
from fastrl.user_code import load_callable

BACKENDS = ("auto", "envpool", "gymnasium", "factory")

__all__ = ["BACKENDS", "Batch", "EnvSpec", "ImageOptions", "SplitVecEnv", "VecEnv", "make_episode_env", "make_vec_env",
           "probe_env", "resolve_backend"]


@dataclass
class EnvSpec:
    observation_space: object
    action_space: object
    frame_skip: int
    agents: tuple[str, ...] = ()  # a multi-agent env's agents of one game (VecEnv.agents)
    # Each agent's own observation space where they differ and rows are padded to one, else ().
    agent_spaces: tuple = ()


def probe_env(cfg) -> EnvSpec:
    """Spaces and frame skip of ``cfg.env`` (a fastrl.config.schema.Config), from a one-env instance.

    A multi-agent env is probed as a worker's rows in its batches, which must hold whole games; it
    makes one game (the others are made at their first reset); a VecEnv class makes one game."""
    num_envs, batch_size = 1, 1
    vector = vector_env_class(cfg.env.id, cfg.env.backend)
    if is_pettingzoo_id(cfg.env.id) or envpool_player_count(cfg.env.id, cfg.env.backend, cfg.env.kwargs) > 1:
        num_envs, batch_size = cfg.env.envs_per_worker, cfg.env.envs_per_worker // cfg.env.num_splits
    elif vector is not None:
        num_envs = batch_size = vector.game_rows(**cfg.env.kwargs)
    env = make_vec_env(cfg.env.id, num_envs=num_envs, batch_size=batch_size, seed=cfg.seed, backend=cfg.env.backend,
                       env_kwargs=cfg.env.kwargs, preprocessing=ImageOptions.from_config(cfg.env),
                       actions=cfg.env.actions)
    try:
        return EnvSpec(env.observation_space, env.action_space, env.frame_skip, tuple(env.agents),
                       tuple(getattr(env, "agent_observation_spaces", ())))
    finally:
        env.close()


def make_episode_env(cfg, num_envs: int, seed: int) -> VecEnv:
    """``num_envs`` envs of ``cfg.env`` in one batch, to play whole episodes (evaluation); for a
    multi-agent env, the fewest games that hold ``num_envs`` agent rows."""
    if is_pettingzoo_id(cfg.env.id):
        from fastrl.envs.multiagent.pettingzoo_backend import open_games

        with naming_unknown_kwargs(cfg.env.id, cfg.env.kwargs):
            return with_action_subset(open_games(cfg.env.id, num_envs, seed, cfg.env.kwargs), cfg.env.id,
                                      cfg.env.actions)
    vector = vector_env_class(cfg.env.id, cfg.env.backend)
    batch_size = num_envs
    if vector is not None:
        with naming_unknown_kwargs(cfg.env.id, cfg.env.kwargs):
            rows = vector.game_rows(**cfg.env.kwargs)
        num_envs = batch_size = -(-num_envs // rows) * rows
    elif resolve_backend(cfg.env.id, cfg.env.backend) == "envpool":
        from fastrl.envs.backends.envpool_backend import episode_layout

        with naming_unknown_kwargs(cfg.env.id, cfg.env.kwargs):
            num_envs, batch_size = episode_layout(cfg.env.id, cfg.env.kwargs, num_envs)
    return make_vec_env(cfg.env.id, num_envs=num_envs, batch_size=batch_size, seed=seed, backend=cfg.env.backend,
                        env_kwargs=cfg.env.kwargs, preprocessing=ImageOptions.from_config(cfg.env),
                        actions=cfg.env.actions)


def envpool_player_count(env_id: str, backend: str, env_kwargs: dict[str, Any]) -> int:
    """Players of one game of ``env_id`` if envpool serves it (envpool's multi-player tasks: every
    player a row, fastrl/envs/multiagent/envpool_players.py), else 1."""
    if resolve_backend(env_id, backend) != "envpool":
        return 1
    from fastrl.envs.backends.envpool_backend import task_players

    with naming_unknown_kwargs(env_id, env_kwargs):
        return task_players(env_id, env_kwargs)[0]


def make_vec_env(
    env_id: str,
    num_envs: int,
    batch_size: int,
    seed: int,
    backend: str = "auto",
    async_mode: bool = False,
    num_threads: int = 0,
    thread_affinity: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    preprocessing: ImageOptions | None = None,
    actions: Sequence[int] = (),
) -> VecEnv:
    """Make one group of `num_envs` envs, returned `batch_size` at a time by `recv()`.

    Args:
        env_id: envpool task id, gymnasium id, "module:callable" factory, "module:Class" of a VecEnv
            subclass (made as ``Class(num_envs, batch_size, seed, **env_kwargs)``), or "pettingzoo:MODULE".
        num_envs: envs in the group; a multiple of `batch_size`. For a multi-agent env these are
            agent rows: `batch_size` must be a multiple of the agents of a game.
        batch_size: envs per `recv()`.
        seed: env i of the group is seeded `seed + i`; give groups seeds `num_envs` apart.
        backend: "auto" picks envpool, then gymnasium, then factory (see `resolve_backend`).
        async_mode: envpool only: one pool returning whichever `batch_size` envs finish first;
            otherwise `num_envs // batch_size` sync splits. Ignored (sync) for gymnasium/factory.
        num_threads: envpool threads per pool (0 = envpool's default). Ignored for gymnasium.
        thread_affinity: envpool only: pin threads to cores from core 0.
        env_kwargs: passed to `envpool.make`, `gymnasium.make`, the factory or PettingZoo's
            `parallel_env`; for gymnasium Atari ids, envpool's Atari config keys are understood
            too (atari.py).
        preprocessing: action repeat and image preprocessing of gymnasium and factory envs
            (image_preprocessing.py); refused in one line for the other backends.
        actions: the Discrete env's actions the policy chooses among (action_subset.py); () = all.
    """
    if batch_size < 1 or num_envs < 1 or num_envs % batch_size:
        raise ValueError(
            f"num_envs ({num_envs}) must be a positive multiple of batch_size ({batch_size})"
        )
    env_kwargs = dict(env_kwargs or {})
    preprocessing = preprocessing or ImageOptions()
    backend = resolve_backend(env_id, backend)
    with naming_unknown_kwargs(env_id, env_kwargs):
        if backend == "envpool":
            # envpool is optional, and importing it loads every env family (seconds): only when used.
            from fastrl.envs.backends.envpool_backend import make_envpool_vec_env, task_options

            check_applies(preprocessing, env_id, "envpool", task_options(env_id) if preprocessing.asked() else ())
            env = make_envpool_vec_env(
                env_id, num_envs, batch_size, seed, async_mode, num_threads, thread_affinity, env_kwargs
            )
        elif backend == "pettingzoo":
            from fastrl.envs.multiagent.pettingzoo_backend import make_pettingzoo_vec_env  # pettingzoo is optional

            check_applies(preprocessing, env_id, "pettingzoo")
            env = make_pettingzoo_vec_env(env_id, num_envs, batch_size, seed, env_kwargs)
        elif (vector := vector_env_class(env_id, backend)) is not None:
            check_applies(preprocessing, env_id, "vector")
            env = vector(num_envs, batch_size, seed, **env_kwargs)
        else:
            env_fn, frame_skip = _gymnasium_env_fn(env_id, backend, env_kwargs, preprocessing)
            env = GymnasiumSplitVecEnv(env_fn, num_envs, batch_size, seed, frame_skip)
    _check_spaces(env, env_id)
    return with_action_subset(env, env_id, actions)


def with_action_subset(env: VecEnv, env_id: str, actions: Sequence[int]) -> VecEnv:
    """``env`` choosing among ``actions`` only (``env.actions``); ``env`` itself for ()."""
    if not actions:
        return env
    error = action_subset_error(env.action_space, actions, ObsLayout(env.observation_space).mask is not None)
    if error:
        env.close()
        raise ValueError(f"{env_id!r}: {error}")
    return ActionSubset(env, actions)


@contextlib.contextmanager
def naming_unknown_kwargs(env_id: str, env_kwargs: dict[str, Any]):
    """Making envs inside: a TypeError for a key of ``env_kwargs`` the constructor does not take
    becomes one ValueError line naming it."""
    try:
        yield
    except TypeError as exc:
        unknown = _unknown_kwarg(exc, env_kwargs)
        if unknown is None:
            raise
        raise ValueError(f"env.kwargs: {env_id!r} takes no argument {unknown!r}; remove it from env.kwargs or "
                         f"correct its name") from None


def _unknown_kwarg(exc: TypeError, env_kwargs: dict[str, Any]) -> str | None:
    """The key of ``env_kwargs`` that ``exc`` says a constructor does not take (envpool,
    gymnasium and a plain factory all raise Python's TypeError for it); None for any other
    TypeError, a fault of the env's own."""
    match = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
    return match.group(1) if match and match.group(1) in env_kwargs else None


def resolve_backend(env_id: str, backend: str = "auto") -> str:
    """The backend that serves `env_id`: "envpool", "gymnasium", "factory" or "pettingzoo".

    A "pettingzoo:MODULE" id is PettingZoo's (with backend "auto"). Otherwise "auto" tries, in
    order: an envpool task id, a registered gymnasium id, "module:callable". Raises ValueError
    (one line, with close matches) when nothing serves `env_id`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if is_pettingzoo_id(env_id):
        if backend != "auto":
            raise ValueError(f"{env_id!r} is a PettingZoo env, which the {backend} backend cannot make: leave "
                             f"env.backend at auto")
        return "pettingzoo"
    if vizdoom_backend.is_vizdoom_id(env_id) and backend in ("auto", "gymnasium"):
        vizdoom_backend.register_ids()
    if backend != "auto":
        if backend == "factory":
            _import_factory(env_id)
        elif env_id not in _registered_ids(backend):
            raise ValueError(_unknown_id_message(env_id, f"not a {backend} id"))
        return backend
    module_name, _, attr = env_id.partition(":")
    if attr.isidentifier() and module_name:
        # "module:callable" is checked first: loading the registries imports every envpool
        # family (3-5 s per process under load). Not importable that way, the
        # id may still be gymnasium's "module:Env" form.
        try:
            _import_factory(env_id)
            return "factory"
        except ValueError:
            pass
    for candidate in ("envpool", "gymnasium"):
        if env_id in _registered_ids(candidate):
            return candidate
    if ":" in env_id:
        _import_factory(env_id)
        return "factory"
    raise ValueError(_unknown_id_message(env_id, "not an envpool or gymnasium id"))


def vector_env_class(env_id: str, backend: str = "auto") -> type[VecEnv] | None:
    """The VecEnv subclass that ``env_id`` names as "module:Class" (a vectorized env that steps a
    worker's whole group of rows itself), or None for any other id."""
    if backend not in ("auto", "factory") or is_pettingzoo_id(env_id) or ":" not in env_id:
        return None
    try:
        named = _import_factory(env_id)
    except ValueError:
        return None
    return named if isinstance(named, type) and issubclass(named, VecEnv) else None


def _registered_ids(backend: str) -> Mapping[str, Any]:
    if backend == "envpool":
        from envpool.registration import registry  # optional, and seconds to load: only when asked

        return registry.specs
    try:
        import ale_py  # noqa: F401  (optional; importing it registers the ALE ids with gymnasium)
    except ImportError:
        pass
    return gymnasium.registry


def _unknown_id_message(env_id: str, reason: str) -> str:
    candidates = [*_registered_ids("envpool"), *_registered_ids("gymnasium")]
    matches = difflib.get_close_matches(env_id, list(dict.fromkeys(candidates)), n=5)
    hint = f" Did you mean: {', '.join(matches)}?" if matches else ""
    return (
        f"Unknown env id {env_id!r}: {reason}.{hint} For your own env pass a factory as "
        f"'package.module:callable' (a callable returning a gymnasium.Env)."
    )


def _import_factory(env_id: str) -> Callable[..., gymnasium.Env]:
    return load_callable(env_id, "env.id", "'package.module:callable', a callable returning a gymnasium.Env")


def _gymnasium_env_fn(
    env_id: str, backend: str, env_kwargs: dict[str, Any], preprocessing: ImageOptions | None = None
) -> tuple[Callable[[], gymnasium.Env], int]:
    """(a zero-argument env constructor, emulator frames per step) for the gymnasium backends,
    its envs preprocessed as ``preprocessing`` asks."""
    preprocessing = preprocessing or ImageOptions()
    if atari.is_atari_id(env_id) and backend != "factory":
        check_applies(preprocessing, env_id, "atari", atari.ENVPOOL_ATARI_DEFAULTS)
        config, _ = atari.atari_config(env_kwargs)
        return (lambda: atari.make_atari_env(env_id, **env_kwargs)), config["frame_skip"]
    if vizdoom_backend.is_vizdoom_id(env_id) and backend != "factory":
        make = vizdoom_backend.vizdoom_env_fn(env_id, env_kwargs, preprocessing.frame_skip, preprocessing.resize)
        # The engine repeats the action itself, rendering only the last tic.
        return preprocessed(make, replace(preprocessing, frame_skip=1), env_id), preprocessing.frame_skip
    if backend == "factory":
        factory = _import_factory(env_id)

        def make_checked() -> gymnasium.Env:
            env = factory(**env_kwargs)
            if not isinstance(env, gymnasium.Env):
                raise ValueError(f"Env factory {env_id!r} returned {type(env).__name__}, not a gymnasium.Env: "
                                 f"make it return the env (an instance of a gymnasium.Env subclass)")
            return env

        make = make_checked
    else:
        def make() -> gymnasium.Env:
            return gymnasium.make(env_id, **env_kwargs)
    return preprocessed(make, preprocessing, env_id), preprocessing.frame_skip


def _check_spaces(env: VecEnv, env_id: str) -> None:
    """Fail now, in one line naming the space (and its key path), if fastrl cannot store the
    observations or act in the action space (see fastrl.envs.spaces)."""
    try:
        check_action_mask(ObsLayout(env.observation_space), ActionLayout(env.action_space))
    except UnsupportedSpace as exc:
        env.close()
        raise UnsupportedSpace(f"{env_id!r}: {exc}") from None
