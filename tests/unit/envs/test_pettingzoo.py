"""PettingZoo ParallelEnvs, every agent a row of its worker's batch under one shared policy
(fastrl/envs/multiagent/pettingzoo_backend.py)."""
import collections
import contextlib
import io
import sys

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.cli import train_main
from fastrl.config import build_config
from fastrl.envs import make_episode_env, make_vec_env, probe_env
from fastrl.envs.multiagent.pettingzoo_backend import PettingZooSplitVecEnv
from fastrl.envs.spaces import ObsLayout, UnsupportedSpace
from fastrl.learner import VTraceLearner, gather_trajectories
from fastrl.models.networks import build_model
from tests.support import user_modules
from tests.support.pettingzoo_envs import CueGame
from tests.unit.sampling.test_rollout_worker import run_worker

CUE_GAME = "pettingzoo:tests.support.pettingzoo_envs"


def cue_config(**overrides):
    settings = {"env.id": CUE_GAME, "env.kwargs": {"num_agents": 3, "length": 4}, "env.num_workers": 1,
                "env.envs_per_worker": 12, "env.num_splits": 2, "learner.rollout": 5, "learner.batch_size": 60,
                "slots_per_env": 3, "learner.reward_scale": 1.0, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def first_reset_seed(cfg, game):
    """The seed of worker 0's game ``game``, which the cue game shows as observation[3]."""
    n = cfg.env.kwargs["num_agents"]
    return np.float32((cfg.seed * 1_000_003) % 2**31 + game * n)


def test_each_agent_is_a_row_whose_trajectory_holds_only_its_own_observations():
    cfg = cue_config()
    arena, full = run_worker(cfg, steps_per_env=10)
    assert len(full) == 2 * 12  # two slots of 5 steps for each of the 12 rows (4 games of 3 agents)
    assert sorted(arena.slot_env[full].tolist()) == sorted(list(range(12)) * 2)
    for slot in full:
        row = int(arena.slot_env[slot])
        obs = arena.obs[slot]  # [T + 1, 4]: agent, step, cue, game
        np.testing.assert_array_equal(obs[:, 0], row % 3)
        np.testing.assert_array_equal(obs[:, 3], first_reset_seed(cfg, row // 3))
        # 4 steps, truncated on the last one, then the game's reset observation (an invalid step).
        np.testing.assert_array_equal(obs[:, 1], [0, 1, 2, 3, 4, 0])
        np.testing.assert_array_equal(arena.truncated[slot], [0, 0, 0, 1, 0])
        np.testing.assert_array_equal(arena.valid[slot], [1, 1, 1, 1, 0])
    assert arena.episode_count[0] == 2 * 12  # an episode per agent row and game played
    np.testing.assert_array_equal(arena.episode_length[0, :24], 4)


def leaving_config(**overrides):
    return cue_config(**{"env.kwargs": {"num_agents": 3, "length": 5, "leave_at": {"agent_1": 2}},
                         "env.envs_per_worker": 6, "env.num_splits": 1, "learner.rollout": 6,
                         "learner.batch_size": 36, **overrides})


def test_an_agent_that_leaves_early_is_absent_until_its_game_resets():
    cfg = leaving_config()
    arena, full = run_worker(cfg, steps_per_env=12)
    for slot in full:
        row = int(arena.slot_env[slot])
        obs = arena.obs[slot]
        np.testing.assert_array_equal(obs[:, 0], row % 3)
        if row % 3 == 1:
            # Terminated at step 2; its last observation and flags stay until the reset, and every
            # step after the one it left on is invalid: never trained on, never bootstrapped through.
            np.testing.assert_array_equal(obs[:, 1], [0, 1, 2, 2, 2, 2, 0])
            np.testing.assert_array_equal(arena.terminated[slot], [0, 1, 1, 1, 1, 0])
            np.testing.assert_array_equal(arena.valid[slot], [1, 1, 0, 0, 0, 0])
            np.testing.assert_array_equal(arena.rewards[slot, 2:], 0)
        else:
            np.testing.assert_array_equal(obs[:, 1], [0, 1, 2, 3, 4, 5, 0])
            np.testing.assert_array_equal(arena.truncated[slot], [0, 0, 0, 0, 1, 0])
            np.testing.assert_array_equal(arena.valid[slot], [1, 1, 1, 1, 1, 0])
    # Two games x two episodes x three agents, the absent steps' repeated dones not among them.
    assert arena.episode_count[0] == 12
    lengths = collections.Counter(arena.episode_length[0, :12].tolist())
    assert lengths == {2: 4, 5: 8}
    batch = gather_trajectories(arena, np.array(full))
    np.testing.assert_array_equal(batch.valid.numpy(), arena.valid[full].T.astype(bool))


def trained_weights(cfg, spec, batch):
    torch.manual_seed(0)
    learner = VTraceLearner(cfg, spec.observation_space, spec.action_space)
    learner.train(batch)
    return torch.cat([p.detach().flatten() for p in learner.model.parameters()])


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_the_learner_never_trains_on_an_absent_agent(algo):
    cfg = leaving_config(**{"learner.algo": algo})
    spec = probe_env(cfg)
    arena, full = run_worker(cfg, steps_per_env=12)
    batch = gather_trajectories(arena, np.array(full))
    leaver = torch.from_numpy(arena.slot_env[full] % 3 == 1)  # [B] columns of agent_1
    absent = ~batch.valid & leaver[None]  # [T, B] its absent steps (and the reset step)
    # Observations that only absent steps act on: not the final one of the step it left on.
    absent_inputs = torch.zeros_like(batch.valid)
    absent_inputs[1:] = absent[1:] & absent[:-1]

    def perturbed(steps, inputs):
        changed = gather_trajectories(arena, np.array(full))
        changed.rewards[steps] += 100.0
        changed.actions[steps] = (changed.actions[steps] + 1) % 3
        changed.behaviour_logp[steps] -= 1.0
        changed.obs[:-1][inputs] += 1000.0
        return changed

    reference = trained_weights(cfg, spec, batch)
    torch.testing.assert_close(trained_weights(cfg, spec, perturbed(absent, absent_inputs)), reference,
                               rtol=0, atol=0)
    # The same change on the steps agent_1 played does train the policy: the check above can fail.
    played = batch.valid & leaver[None]
    assert not torch.equal(trained_weights(cfg, spec, perturbed(played, played)), reference)


class LateAgentGame(CueGame):
    """agent_2 joins only after the reset (``late``), or stays among the agents when it leaves."""

    def __init__(self, late: bool):
        super().__init__(num_agents=3, length=5, leave_at={"agent_2": 1})
        self.late = late

    def reset(self, seed=None, options=None):
        observations, infos = super().reset(seed, options)
        if self.late:
            self.agents.remove("agent_2")
        return observations, infos

    def step(self, actions):
        out = super().step(actions)
        self.agents = list(self.possible_agents[:len(self.agents) + 1])
        return out


@pytest.mark.parametrize("late, message", [(True, "every agent must play from the reset"),
                                           (False, "'agent_2' left the game .* but is among its agents again")])
def test_agents_that_join_late_or_come_back_are_refused(late, message):
    env = PettingZooSplitVecEnv("pettingzoo:late", lambda: LateAgentGame(late), 1, 1, 0, LateAgentGame(late))
    env.async_reset()
    with pytest.raises(RuntimeError, match=message):
        for _ in range(3):
            obs, rewards, terminated, truncated, ids = env.recv()
            env.send(np.zeros(len(ids), np.int64), ids)
    env.close()


def test_vector_observations_of_different_lengths_are_padded_to_one_row_space():
    env = make_vec_env(CUE_GAME, num_envs=6, batch_size=3, seed=0, env_kwargs={"uneven": True})
    assert env.observation_space.shape == (5,)
    assert [space.shape for space in env.agent_observation_spaces] == [(5,), (4,), (4,)]
    np.testing.assert_array_equal(env.observation_space.low, np.full(5, -1e6, np.float32))
    assert env.observation_space.high[4] == 1e6  # agent_0's own value; the others' padding 0 lies inside
    env.async_reset()
    obs, _, _, _, ids = env.recv()
    for row, observation in zip(ids, obs):
        own = env.agent_observation(int(row))  # as the game gave it, for scripted opponents
        assert own.shape == ((5,) if row % 3 == 0 else (4,))
        np.testing.assert_array_equal(observation[:len(own)], own)
        np.testing.assert_array_equal(observation[len(own):], 0)
    env.close()
    spec = probe_env(cue_config(**{"env.kwargs": {"num_agents": 3, "length": 4, "uneven": True}}))
    assert spec.observation_space.shape == (5,) and len(spec.agent_spaces) == 3


class TwoActionSpacesGame(CueGame):
    """agent_0 has one action more than the others."""

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(5 if agent == "agent_0" else 4)


def test_spaces_no_padding_can_join_are_refused_in_one_line():
    with pytest.raises(UnsupportedSpace, match="agent_0: Discrete.*agent_1, agent_2: Discrete.*pad_action_space"):
        PettingZooSplitVecEnv("pettingzoo:two-actions", TwoActionSpacesGame, 1, 1, 0, TwoActionSpacesGame())
    with pytest.raises(UnsupportedSpace) as error:  # Dict observations of different sizes: not 1-D Boxes
        make_vec_env(CUE_GAME, num_envs=3, batch_size=3, seed=0, env_kwargs={"uneven": True, "masked": True})
    message = str(error.value)
    assert "\n" not in message and "agent_0: Dict" in message and "agent_1, agent_2: Dict" in message
    assert "not all 1-D Boxes" in message


@pytest.mark.parametrize("env_id, kwargs, message", [
    (CUE_GAME, {"colour": 1}, "takes no argument 'colour'"),
    ("pettingzoo:no_such_module_here", {}, "cannot import 'no_such_module_here'"),
    ("pettingzoo:json", {}, "not a PettingZoo env module"),
])
def test_bad_env_ids_and_kwargs_are_one_line(env_id, kwargs, message):
    cfg = cue_config(**{"env.id": env_id, "env.kwargs": kwargs})
    with pytest.raises(ValueError, match=message) as error:
        probe_env(cfg)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("run_dir_given", [True, False])
def test_without_pettingzoo_fastrl_train_names_the_extra_and_leaves_no_run_dir(tmp_path, monkeypatch, run_dir_given):
    for name in ("pettingzoo", "pettingzoo.utils", "pettingzoo.utils.env"):
        monkeypatch.setitem(sys.modules, name, None)  # import pettingzoo... raises ImportError
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    argv = ["--env", "pettingzoo:pettingzoo.classic.tic_tac_toe_v3", "--set", "device=cpu"]
    with contextlib.redirect_stderr(err):
        code = train_main(argv + (["--run-dir", str(tmp_path / "new" / "run")] if run_dir_given else []))
    assert code == 2
    assert err.getvalue() == ("fastrl-train: error: --env pettingzoo:pettingzoo.classic.tic_tac_toe_v3 needs "
                              "PettingZoo, which is not installed: pip install 'fastrl[multiagent]'\n")
    assert not (tmp_path / "new").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("module, message", user_modules.BROKEN)
def test_a_game_module_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, module, message):
    user_modules.install(tmp_path, monkeypatch)
    cfg = cue_config(**{"env.id": f"pettingzoo:{module}"})
    with pytest.raises(ValueError) as error:
        probe_env(cfg)
    text = str(error.value)
    assert text.startswith(f"env.id 'pettingzoo:{module}': ") and message in text and "\n" not in text, text


def test_a_split_must_hold_whole_games():
    cfg = cue_config(**{"env.envs_per_worker": 8, "env.num_splits": 2, "learner.batch_size": 40})
    with pytest.raises(ValueError, match=r"split of .* = 4 rows must hold whole games: make env.envs_per_worker a "
                                         r"multiple of 3 x env.num_splits"):
        probe_env(cfg)


def test_action_masks_come_per_agent_and_evaluation_counts_each_agent_once():
    cfg = cue_config(**{"env.kwargs": {"num_agents": 3, "length": 4, "masked": True,
                                       "leave_at": {"agent_2": 1}}})
    spec = probe_env(cfg)
    layout = ObsLayout(spec.observation_space)
    assert layout.mask is not None
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo="appo")
    from fastrl.evaluation.episodes import evaluate_policy

    env = make_episode_env(cfg, 7, seed=3)
    assert env.num_envs == 9  # three games: the fewest that hold 7 agent rows
    env.close()
    # The cue game refuses an action its mask forbids, and an action for agent_2 after it left.
    # Two episodes for each of the 9 rows: agent_2 plays 1 step of each
    # game, the others 4; its absent steps' dones are no episodes of length 0.
    result = evaluate_policy(cfg, model, episodes=18, seed=3)
    assert result["episodes"] == 18
    assert result["episode_length_mean"] == (12 * 4 + 6 * 1) / 18
