"""Small learners and the trajectories their tests feed them: the spaces, a DQN and a V-trace-replay
config of rollout T and E envs, ``[T, E]`` batches cut from one continuous stream per env, and the
brute-force n-step windows of trajectories (tests/unit/learner/test_dqn.py, test_learner.py, test_nstep.py, ...)."""
import gymnasium
import numpy as np
import torch

from fastrl.config import build_config
from fastrl.learner import DQNLearner, Trajectories
from tests.support.autoreset import nstep_episodes_reference

OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gymnasium.spaces.Discrete(2)
T, E = 8, 4  # rollout and envs of the small learner configs


def reference_windows(rewards, terminated, truncated, gamma, n):
    """Brute force over each env's episodes (tests.support.autoreset): the step after a done is the
    autoreset step (its action was discarded), with an empty window."""
    done = terminated | truncated
    valid = np.ones_like(done)
    valid[1:] = ~done[:-1]
    return nstep_episodes_reference(rewards, terminated, truncated, valid, gamma, n)


def stream_batches(num_batches, seed=0, p_terminate=0.1, p_truncate=0.05, obs_dim=4, num_actions=2):
    """``num_batches`` consecutive ``[T, B=E]`` batches cut from one continuous stream per env, each
    batch's columns in a different env order. ``valid`` follows NEXT_STEP autoreset (the step after
    a done is invalid), so a replay rebuilds exactly these columns. Returns [(batch, env_ids)]."""
    g = torch.Generator().manual_seed(seed)
    steps = num_batches * T
    obs = torch.randn(steps + 1, E, obs_dim, generator=g)
    actions = torch.randint(0, num_actions, (steps, E), generator=g)
    logp = -torch.rand(steps, E, generator=g)
    rewards = torch.randn(steps, E, generator=g)
    terminated = torch.rand(steps, E, generator=g) < p_terminate
    truncated = (torch.rand(steps, E, generator=g) < p_truncate) & ~terminated
    done = terminated | truncated
    valid = torch.ones(steps, E, dtype=torch.bool)
    valid[1:] = ~done[:-1]
    rng = np.random.default_rng(seed)
    out = []
    for k in range(num_batches):
        env_ids = rng.permutation(E)
        rows = slice(k * T, (k + 1) * T)
        cols = torch.from_numpy(env_ids)
        out.append((Trajectories(
            obs=obs[k * T:(k + 1) * T + 1][:, cols].clone(), actions=actions[rows][:, cols].clone(),
            behaviour_logp=logp[rows][:, cols].clone(), rewards=rewards[rows][:, cols].clone(),
            terminated=terminated[rows][:, cols].clone(), truncated=truncated[rows][:, cols].clone(),
            valid=valid[rows][:, cols].clone(), version=torch.full((T, E), k, dtype=torch.int64)), env_ids))
    return out


def dqn_config(**overrides):
    return build_config("cartpole-dqn", {
        "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1, "learner.rollout": T,
        "learner.batch_size": T * E, "replay.capacity": 64 * E, "replay.min_fill": 64, "replay.batch_size": 32,
        "replay.replay_ratio": 2.0, "learner.target_update_every": 3, **overrides})


def make_dqn(seed=0, **overrides):
    torch.manual_seed(seed)
    return DQNLearner(dqn_config(**overrides), OBS_SPACE, ACTION_SPACE)


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def perturb(module, scale=0.1, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def vtrace_replay_config(fraction, min_fill):
    return build_config("cartpole-appo", {
        "replay.vtrace_fraction": fraction, "replay.capacity": 64 * E, "replay.min_fill": min_fill,
        "env.num_workers": 1, "env.envs_per_worker": E, "env.num_splits": 1, "learner.rollout": T,
        "learner.batch_size": T * E})
