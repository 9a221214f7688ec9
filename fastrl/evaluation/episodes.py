"""Evaluation: complete episodes with a trained policy, alone or against a scripted opponent."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import (
    GAME_RETURN_KEY,
    OPPONENT_ACTIONS,
    Q_LEARNERS,
    Config,
    ConfigError,
    is_device_name,
    load_run_config,
    weights_mismatch,
)
from ..envs import make_episode_env, probe_env
from ..envs.multiagent.pettingzoo_backend import is_pettingzoo_id
from ..envs.multiagent.pettingzoo_games import PettingZooGamesMixin
from ..envs.spaces import ObsLayout
from ..files.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    best_checkpoint_path,
    load_checkpoint,
    load_latest_checkpoint,
    load_model_state,
)
from ..models.networks import action_head, build_model, keys_it_ignores, map_leaves
from ..multiagent.opponents import checked_action, find_opponent, make_opponent, opponent_name
from ..multiagent.policy_map import policy_map


class PolicyActions:
    """A model's actions for rows of one VecEnv of ``num_envs`` rows, each row with its own
    recurrent state. A dqn policy always acts greedily on its Q-values (they are not logits to
    sample from)."""

    def __init__(self, cfg: Config, model: torch.nn.Module, env, deterministic: bool, device: str):
        self.model = model.to(device).eval()
        self.device = device
        self.deterministic = acts_deterministically(cfg, deterministic)
        self.head = action_head(env.action_space, cfg.learner.algo)
        self.layout = ObsLayout(env.observation_space)
        self.recurrent = getattr(model, "is_recurrent", False)
        self.state = model.initial_state(env.num_envs, device) if self.recurrent else None

    @torch.no_grad()
    def __call__(self, obs: np.ndarray, ids: np.ndarray, episode_start: np.ndarray, final: np.ndarray) -> np.ndarray:
        """Actions ``[k, *action shape]`` for rows ``ids`` (int ``[k]``) observing ``obs`` (``[k,
        *storage_shape]``, packed by ``self.layout.pack``). ``episode_start`` (bool ``[k]``)
        restarts a row's recurrent state; ``final`` (bool ``[k]``) marks an episode's final
        observation, whose action is discarded and whose mask may allow nothing."""
        obs = torch.as_tensor(obs).to(self.device)
        if self.layout.mask is not None:
            self.model.check_mask(obs, torch.as_tensor(final))
        if not self.recurrent:
            return policy_step(self.model, self.head, obs, self.deterministic)[0].cpu().numpy()
        rows = torch.as_tensor(ids, device=self.device)
        starts = torch.as_tensor(episode_start, device=self.device)
        actions, self.state[rows] = policy_step(self.model, self.head, obs, self.deterministic, self.state[rows],
                                                starts)
        return actions.cpu().numpy()


def acts_deterministically(cfg: Config, deterministic: bool) -> bool:
    """Whether a policy of ``cfg``'s run asked to act ``deterministic``ally does: a Q-learner's
    always does (its Q-values are not logits to sample from)."""
    return deterministic or cfg.learner.algo in Q_LEARNERS


def policy_step(model: torch.nn.Module, head, obs, deterministic: bool, state: torch.Tensor | None = None,
                episode_start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step of ``model`` acting through ``head`` (fastrl.models.heads.action_head): ``obs`` ``[B,
    *storage_shape]`` (or its typed leaves, fastrl.models.networks) -> (actions ``[B, *action shape]`` as
    fastrl stores them, the new recurrent state ``[B, state_size]``). A recurrent model starts from
    ``state`` ``[B, state_size]``, zeroed first where ``episode_start`` (bool ``[B]``) is set; a
    feed-forward one takes no state and returns None for it."""
    if state is None:
        return head.sample(model(obs)[0], deterministic=deterministic), None
    params, _, new_state = model(map_leaves(obs, lambda x: x[None]), state, episode_start[None])
    return head.sample(params[0], deterministic=deterministic), new_state


class EpisodeSteps:
    """The batches of a VecEnv under next-step autoreset, as episodes: which rows end a step and
    which begin an episode, and each row's return and length so far. ``keep_going()`` is called
    before, and ``after_recv()`` after, every ``recv()``."""

    def __init__(self, env, keep_going=None, after_recv=None):
        self.env = env
        self.keep_going = keep_going
        self.after_recv = after_recv
        self.started = np.zeros(env.num_envs, dtype=bool)
        self.after_done = np.zeros(env.num_envs, dtype=bool)
        self.returns = np.zeros(env.num_envs)
        self.lengths = np.zeros(env.num_envs, dtype=np.int64)

    def next_batch(self) -> tuple:
        """The env's next batch, its rewards added to its rows' returns: ``(obs, ids, done,
        stepped)``, ``stepped`` bool ``[k]`` the rows whose observation ends a step, not a reset
        observation (nor, in a multi-agent env, an agent that left its game before and still
        reports it)."""
        if self.keep_going is not None:
            self.keep_going()
        obs, rewards, terminated, truncated, ids = self.env.recv()
        if self.after_recv is not None:
            self.after_recv()
        ids = np.asarray(ids)
        stepped = self.started[ids] & ~self.after_done[ids]
        self.returns[ids] += np.where(stepped, rewards, 0.0)
        self.lengths[ids] += stepped
        return obs, ids, np.logical_or(terminated, truncated), stepped

    def advance(self, ids: np.ndarray, done: np.ndarray, closed: np.ndarray | None = None) -> np.ndarray:
        """Close the episodes of rows ``ids[done]`` (read their returns before); bool ``[k]``:
        the rows whose observation begins an episode (after an autoreset step, or the first).
        ``closed`` (bool ``[k]``, within ``done``): the rows whose return and length start again
        from zero, where an evaluation counts whole games of several episodes; default ``done``."""
        closed = done if closed is None else closed
        self.returns[ids[closed]] = 0.0
        self.lengths[ids[closed]] = 0
        episode_start = self.after_done[ids] | ~self.started[ids]
        self.started[ids] = True
        self.after_done[ids] = done
        return episode_start


def evaluate_policy(cfg: Config, model: torch.nn.Module, episodes: int, deterministic: bool = False,
                    device: str = "cpu", seed: int = 12345, num_envs: int = 8, keep_going=None, env=None,
                    after_recv=None) -> dict:
    """Mean and std of the return (and the mean length) over ``episodes`` complete episodes, and
    the env steps they took.

    Each of the ``n`` parallel envs (at most ``num_envs``) plays a fixed quota of episodes: taking
    the first episodes to finish across envs would favour short episodes. ``keep_going()`` is
    called every step; an evaluation inside a run raises from it to stop at once. Given ``env`` (a
    VecEnv of ``cfg.env``, closed here) the episodes are played on its envs, all at once, and
    ``after_recv()`` is called after every ``recv()``: fastrl.evaluation.video grabs its frames there.
    In a multi-agent env every agent is an env here (its episodes count one by one, a game that
    ended before its first turn too: VecEnv.last_unplayed) and whole games are played: the
    fewest that hold ``min(episodes, num_envs)`` agents, so ``n`` may exceed ``num_envs`` by less
    than a game. Under Atari's ``episodic_life`` an episode here is a whole game, every life of
    it: its return is the game's score (``info["game_return"]``, fastrl.envs.game_return), its
    length the agent steps of all its lives.
    """
    games = bool(cfg.env.kwargs.get("episodic_life"))
    if env is None:
        env = make_episode_env(cfg, min(episodes, num_envs), seed)
    n = env.num_envs
    lives = np.zeros(n, dtype=np.int64)  # episodes of each row's game so far (games only)
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    act = PolicyActions(cfg, model, env, deterministic, device)
    steps = EpisodeSteps(env, keep_going, after_recv)
    returns: list[float] = []
    lengths: list[int] = []
    env_steps = 0
    finished = np.zeros(n, dtype=np.int64)
    try:
        env.async_reset()
        while (finished < quota).any():
            obs, ids, done, stepped = steps.next_batch()
            env_steps += int(stepped.sum())
            # A done that ends no step is an agent that left its game before, still reporting it.
            closed = done & stepped
            if games:
                lives[ids[closed]] += 1
                closed &= game_ends(env.last_info, len(ids))
                lives[ids[closed]] = 0
                if lives.max() >= MAX_LIVES_PER_GAME:
                    raise ConfigError(f"env.kwargs episodic_life: {cfg.env.id!r} ended {MAX_LIVES_PER_GAME} episodes "
                                      f"without a game's end (info[{GAME_RETURN_KEY!r}]), so an evaluation of whole "
                                      f"games would never finish; drop episodic_life, or report the game's end")
            ended = ids[closed]
            scores = np.asarray(env.last_info[GAME_RETURN_KEY])[closed] if games and closed.any() \
                else steps.returns[ended]
            unplayed, unplayed_returns = env.last_unplayed
            for i, episode_return, length in zip([*ended, *unplayed], [*scores, *unplayed_returns],
                                                 [*steps.lengths[ended], *[0] * len(unplayed)]):
                if finished[i] < quota[i]:
                    returns.append(float(episode_return))
                    lengths.append(int(length))
                    finished[i] += 1
            episode_start = steps.advance(ids, done, closed if games else None)
            env.send(act(act.layout.pack(obs, len(ids)), ids, episode_start, done), ids)
    finally:
        env.close()
    return {"episode_return_mean": float(np.mean(returns)), "episode_return_std": float(np.std(returns)),
            "episode_length_mean": float(np.mean(lengths)), "episodes": len(returns), "env_steps_played": env_steps}


# An Atari game has at most a few lives; far more episodes without a game's end is an env that
# takes episodic_life but reports no games, and an evaluation counting games would never end.
MAX_LIVES_PER_GAME = 1000


def game_ends(info, rows: int) -> np.ndarray:
    """bool ``[rows]``: the rows of a batch whose step ended a whole game (the mask of
    ``info["game_return"]``); none where the env reports no games."""
    mask = info.get("_" + GAME_RETURN_KEY)
    return np.zeros(rows, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)


def evaluate_against(cfg: Config, model: torch.nn.Module, opponent, episodes: int, deterministic: bool = False,
                     device: str = "cpu", seed: int = 12345, num_envs: int = 8, keep_going=None, env=None,
                     after_recv=None, seats: tuple[str, ...] = ()) -> dict:
    """``model`` playing one seat of ``cfg.env``'s multi-agent games and ``opponent`` every other
    seat (fastrl.multiagent.opponents: a built-in name, ``MODULE:CALLABLE`` or a callable ``fn(observation,
    agent) -> action``, called with each agent's observation as its game gave it): the model's
    seat's win, draw and loss rates and mean return over ``episodes`` episodes, overall and per
    seat (``seats``, by agent name).

    The outcome of an episode is the sign of the model's seat's return: > 0 a win, 0 a draw, < 0 a
    loss (PettingZoo's classic games are zero-sum, +1 / 0 / -1 at the end). The model's seat
    rotates so that every seat gets an equal share: of the ``G`` games played at once (the fewest
    that hold ``min(episodes, num_envs)`` agent rows), game g plays episodes ``j = g, g + G, g +
    2G, ...`` of the ``episodes``, the model in seat ``j % n`` of its ``n``. Given ``seats`` (the
    agents its policy plays in a run of several policies, :func:`policy_seats`), the model plays
    those seats of every game instead, and each of them counts one episode per game. Rows the
    opponent plays are never given to the model; it acts on a row's final observation for
    neither side. ``keep_going``, ``env`` and ``after_recv`` as for evaluate_policy.

    Also the std of those returns, their mean length and the env steps played (every seat's), as
    evaluate_policy gives them. Raises ConfigError for an env without several agents,
    OpponentError (one line) for an opponent that cannot be found or made, or plays an illegal
    action.
    """
    if cfg.env.actions:
        raise ConfigError(OPPONENT_ACTIONS.format(option="--opponent"))
    found = find_opponent(opponent)
    name = opponent_name(opponent)
    if env is None:
        env = make_episode_env(cfg, min(episodes, num_envs), seed)
    try:
        check_opponent_seats(cfg.env.id, len(getattr(env, "agents", ())), isinstance(env, PettingZooGamesMixin))
        play = make_opponent(found, env.observation_space, env.action_space, seed)
        n = len(env.agents)
        games = env.num_envs // n
        fixed = np.isin(np.arange(n), [env.agents.index(agent) for agent in seats]) if seats else None
        per_game = int(fixed.sum()) if seats else 1  # the model's episodes in one episode of a game
        game_episodes = -(-episodes // per_game)
        quota = -(-(game_episodes - np.arange(games)) // games)  # game episodes g, g + G, ... below those
        act = PolicyActions(cfg, model, env, deterministic, device)
        steps = EpisodeSteps(env, keep_going, after_recv)
        returns: list[list[float]] = [[] for _ in range(n)]  # the model's returns, by its seat
        counted = np.zeros(games, dtype=np.int64)
        lengths: list[int] = []  # of the model's episodes, in the order they ended
        env_steps = 0
        env.async_reset()
        first_episode = env.episodes_begun.copy()

        def model_plays(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """Whether the model plays each of ``rows`` in its game's episode now, and whether
            that episode is one of the quota's."""
            game = rows // n
            episode = env.episodes_begun[game] - first_episode[game] - 1
            mine = fixed[rows % n] if seats else rows % n == (game + episode * games) % n
            return mine, episode < quota[game]

        while (counted < quota * per_game).any():
            obs, ids, done, stepped = steps.next_batch()
            env_steps += int(stepped.sum())
            model_seat, in_quota = model_plays(ids)
            ended = ids[done & stepped & model_seat & in_quota]
            # A seat whose game ended before its first turn played it too: its episode counts.
            unplayed, unplayed_returns = env.last_unplayed
            unplayed_model, unplayed_in_quota = model_plays(unplayed)
            kept = unplayed_model & unplayed_in_quota
            for row, episode_return, length in zip([*ended, *unplayed[kept]],
                                                   [*steps.returns[ended], *unplayed_returns[kept]],
                                                   [*steps.lengths[ended], *[0] * int(kept.sum())]):
                returns[row % n].append(float(episode_return))
                lengths.append(int(length))
                counted[row // n] += 1
            seat = ids % n
            episode_start = steps.advance(ids, done)
            actions = np.zeros((len(ids), *env.action_layout.shape), dtype=env.action_layout.dtype)
            model_rows = model_seat & ~done
            if model_rows.any():
                packed = act.layout.pack(obs, len(ids))[model_rows]
                actions[model_rows] = act(packed, ids[model_rows], episode_start[model_rows], done[model_rows])
            for i in np.flatnonzero(~model_seat & ~done):
                agent, observation = env.agents[seat[i]], env.agent_observation(int(ids[i]))
                action = checked_action(name, play(observation, agent), observation, agent, env.action_space)
                actions[i] = env.action_layout.encode(action)
            env.send(actions, ids)
    finally:
        env.close()
    every = sum(returns, [])
    return {"opponent": name, **outcome_rates(every),
            "episode_return_std": float(np.std(every)) if every else None,
            "episode_length_mean": float(np.mean(lengths)) if lengths else None, "env_steps_played": env_steps,
            "seats": {agent: outcome_rates(returns[k]) for k, agent in enumerate(env.agents)}}


def check_opponent_seats(env_id: str, agents: int, pettingzoo: bool, option: str = "--opponent",
                         fix: str = "evaluate it without --opponent") -> None:
    """ConfigError (one line, naming the ``option`` that asks for an opponent and the ``fix``)
    unless ``env_id``'s games are PettingZoo's (``pettingzoo``) with several ``agents``: an
    opponent plays the seats the model does not, on each agent's observation as its game gave it."""
    if pettingzoo and agents > 1:
        return
    if agents > 1:
        raise ConfigError(f"{option} plays PettingZoo games (--env pettingzoo:MODULE), handing the opponent each "
                          f"agent's observation as the game gives it, and {env_id!r} is not one: {fix}")
    raise ConfigError(f"{option} plays the other seats of a multi-agent game, and {env_id!r} has one agent: "
                      f"{fix} (multi-agent envs: --env pettingzoo:MODULE, docs/multiagent.md)")


def outcome_rates(returns: list[float]) -> dict:
    """``returns`` of one side's episodes as win, draw and loss rates (the sign of each return)
    and their mean; rates and mean are None for no episodes."""
    signs = np.sign(returns)
    share = (lambda sign: float(np.mean(signs == sign))) if returns else (lambda sign: None)
    return {"episodes": len(returns), "win_rate": share(1), "draw_rate": share(0), "loss_rate": share(-1),
            "episode_return_mean": float(np.mean(returns)) if returns else None}


def load_run_model(run_dir: Path, best: bool = False,
                   policy: str | None = None) -> tuple[Config, torch.nn.Module, dict]:
    """The run's config, its model holding the weights of ``policy`` (one of the run's policies,
    the first by default) at the latest checkpoint (or with ``best``, those of
    ``checkpoints/best.pt``, the best evaluation during training, which are the first policy's),
    and where those weights come from: ``{"checkpoint": path, "env_steps": ..., "policy": name}``,
    as fastrl-eval prints them."""
    cfg = load_run_config(run_dir)
    spec = probe_env(cfg)
    names = policy_map(cfg, spec.agents).names
    name = chosen_policy(names, policy, best)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)

    def check(state: dict, path_hint: str = "the checkpoint") -> None:
        differs = weights_mismatch(state.get("config", {}), cfg, keys_it_ignores(model))
        if differs:
            raise CheckpointMismatch(f"'{Path(run_dir) / 'config.toml'}' differs from the config its checkpoints "
                                     f"were trained with ({differs}; checkpoint -> config.toml): put the "
                                     f"checkpoints' values back in config.toml to evaluate them")
        load_model_state(model, policy_state(state, names, name, path_hint), path_hint)

    if best:
        path = best_checkpoint_path(run_dir)
        if not path.is_file():
            raise CheckpointError(f"no '{path}': evaluation during training was off (train with --set "
                                  f"eval.every_s=60) or had not finished one yet; drop --best "
                                  f"for the latest checkpoint")
        state = load_checkpoint(path)
        check(state, path_hint=f"'{path}'")
    else:
        path, state = load_latest_checkpoint(run_dir, check=check)
    return cfg, model, {"checkpoint": str(path), "env_steps": state["counters"]["env_steps"], "policy": name}


def chosen_policy(names: tuple[str, ...], policy: str | None, best: bool) -> str:
    """The policy fastrl-eval's ``--policy`` picks among the run's ``names`` (the first when
    None); ConfigError (one line) for a name the run does not have, or another than the first
    with ``best`` (best.pt holds the weights evaluation during training chose: the first's)."""
    if policy is None:
        return names[0]
    if policy not in names:
        raise ConfigError(f"--policy {policy!r} is not a policy of this run; its policies: {', '.join(names)}")
    if best and policy != names[0]:
        raise ConfigError(f"--best: checkpoints/best.pt holds policy {names[0]!r}, the one evaluated during "
                          f"training; drop --best to evaluate {policy!r} at the latest checkpoint")
    return policy


def policy_state(state: dict, names: tuple[str, ...], name: str, path_hint: str = "the checkpoint") -> dict:
    """The part of checkpoint ``state`` that holds policy ``name``'s learner as the ``learner``
    entry (fastrl.learner.policy_set: the first policy's is the checkpoint's own ``learner``, the
    others' are under ``policies``); CheckpointMismatch if it has none."""
    if name == names[0]:
        return state
    saved = state.get("policies", {})
    if name not in saved:
        raise CheckpointMismatch(f"{path_hint} holds no weights of policy {name!r} (it holds "
                                 f"{', '.join(saved) or names[0]}): it was written by a run with other policies; "
                                 f"evaluate one of those with --policy")
    return saved[name]


def evaluation_device(name: str) -> str:
    """fastrl-eval's --device as torch takes it: auto (a GPU if one is visible), cpu, cuda or
    cuda:N; ConfigError (one line) for another name or a GPU torch cannot see."""
    if not is_device_name(name):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got '{name}'")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: torch sees no CUDA device; use --device cpu")
    count = torch.cuda.device_count()
    if torch.device(name).index is not None and torch.device(name).index >= count:
        raise ConfigError(f"--device {name}: {count} GPU(s) are visible (cuda:0 to cuda:{count - 1}); pick one of "
                          f"those, or check CUDA_VISIBLE_DEVICES")
    return name


def seated_spec(cfg: Config):
    """The env's probe where its seats and their spaces matter, PettingZoo games (those
    evaluate_against plays); None elsewhere, where a probe would only make an env."""
    return probe_env(cfg) if is_pettingzoo_id(cfg.env.id) else None


def policy_seats(cfg: Config, spec, policy: str | None = None) -> tuple[str, ...]:
    """The agents ``policy`` (the first by default) plays in a run of several policies (what
    evaluate_against seats it in); () for one policy, which plays every seat in turn, or no
    ``spec``."""
    if spec is None:
        return ()
    policies = policy_map(cfg, spec.agents)
    if policies.num_policies < 2 or policies.members:
        return ()
    return tuple(policies.agents_of(policies.names.index(policy) if policy is not None else 0))


def check_every_seat_playable(cfg: Config, spec, option: str, fix: str) -> None:
    """ConfigError (one line) where the agents' observation spaces differ (``spec``, a probe or
    None): evaluating one policy alone would play it in every seat, on vectors meant for another
    policy's network."""
    if spec is not None and spec.agent_spaces:
        raise ConfigError(f"{option} plays one policy in every seat, and {cfg.env.id!r}'s agents have different "
                          f"observation spaces, each kind its own policy: {fix}")


def evaluate_run(run_dir: Path, episodes: int, deterministic: bool = False, device: str = "cpu",
                 seed: int = 12345, best: bool = False, opponent=None, policy: str | None = None) -> dict:
    """fastrl-eval: evaluate a run's latest (or ``best``) weights of ``policy`` (the first by
    default); against ``opponent`` in a multi-agent game (evaluate_against, in the policy's own
    seats where the run has several policies) when given."""
    if opponent is not None:
        find_opponent(opponent)  # a missing opponent fails before the checkpoint loads
    cfg, model, source = load_run_model(run_dir, best, policy)
    spec = seated_spec(cfg)
    if opponent is not None:
        seats = policy_seats(cfg, spec, source["policy"])
        return {**evaluate_against(cfg, model, opponent, episodes, deterministic, device, seed, seats=seats),
                **source}
    check_every_seat_playable(cfg, spec, "fastrl-eval without --opponent",
                              "evaluate a policy in its own seats with --policy NAME --opponent random")
    return {**evaluate_policy(cfg, model, episodes, deterministic, device, seed), **source}
