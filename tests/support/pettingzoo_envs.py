"""A tiny PettingZoo ParallelEnv for tests/unit/envs/test_pettingzoo.py, its agents stepped together in numpy,
made by id in spawned workers too: ``--env pettingzoo:tests.support.pettingzoo_envs`` (this module's
``parallel_env(**env.kwargs)``)."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

CUES = 3


class IllegalAction(RuntimeError):
    """An action for an agent not in the game, or one its mask forbids."""


class CueGame(ParallelEnv):
    """``num_agents`` agents play ``length`` steps together (then all are truncated).

    Agent k observes ``[k, step, cue, game]``: its own index, the step of the episode, its own cue
    in [0, CUES) drawn every step, and the seed of the game's first reset (which game this is).
    With ``tagged=False`` the step and the game show as 0, for learning: a value fitted on the step
    number and bootstrapped from the unplayed final step of the time limit grows without bound.
    Every agent present gets the team's reward: the fraction of present agents whose action is
    their cue (cooperative; a random policy scores 1 / CUES a step).

    ``leave_at``: ``{agent: step}``, that agent is terminated at that step and leaves; the others
    play on. ``uneven``: agent_0 observes one value more (spaces that differ). ``masked``:
    observations are ``{"observation": ..., "action_mask": ...}``, the mask allowing the cue and
    the next action only.
    """

    metadata = {"name": "cue_game_v0", "render_modes": ["rgb_array"]}

    def __init__(self, num_agents: int = 3, length: int = 5, leave_at: dict | None = None, uneven: bool = False,
                 masked: bool = False, tagged: bool = True, render_mode: str | None = None):
        self.possible_agents = [f"agent_{k}" for k in range(num_agents)]
        self.length = length
        self.leave_at = dict(leave_at or {})
        self.masked = masked
        self.tagged = tagged
        self.render_mode = render_mode
        self._observation_spaces = {
            agent: self._observation_space(4 + (uneven and k == 0)) for k, agent in enumerate(self.possible_agents)}
        self._action_space = spaces.Discrete(CUES)
        self.game = -1.0
        self.rng = np.random.default_rng()

    def _observation_space(self, size: int) -> spaces.Space:
        box = spaces.Box(-1e6, 1e6, (size,), np.float32)
        if not self.masked:
            return box
        return spaces.Dict({"observation": box, "action_mask": spaces.Box(0, 1, (CUES,), np.int8)})

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_space

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
            self.game = float(seed) if self.tagged else 0.0
        self.agents = list(self.possible_agents)
        self.step_count = 0
        self.playing = np.ones(len(self.possible_agents), bool)
        self.cues = self.rng.integers(0, CUES, len(self.possible_agents))
        return self._observations(), {agent: {} for agent in self.agents}

    def step(self, actions):
        if set(actions) != set(self.agents):
            raise IllegalAction(f"actions for {sorted(actions)}, but {sorted(self.agents)} play")
        playing = np.flatnonzero(self.playing)
        chosen = np.array([actions[self.possible_agents[k]] for k in playing])
        if self.masked and not self._legal(playing, chosen).all():
            raise IllegalAction(f"actions {chosen.tolist()} against cues {self.cues[playing].tolist()}")
        team_reward = float(np.mean(chosen == self.cues[playing]))
        self.step_count += 1
        rewards = {agent: team_reward for agent in self.agents}
        terminations = {agent: self.leave_at.get(agent) == self.step_count for agent in self.agents}
        truncations = {agent: self.step_count >= self.length for agent in self.agents}
        for agent in self.agents:
            if terminations[agent] or truncations[agent]:
                self.playing[self.possible_agents.index(agent)] = False
        self.cues = self.rng.integers(0, CUES, len(self.possible_agents))
        observations = self._observations(self.agents)
        self.agents = [agent for agent in self.agents if not (terminations[agent] or truncations[agent])]
        return observations, rewards, terminations, truncations, {agent: {} for agent in rewards}

    def _legal(self, agents: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        return (chosen == self.cues[agents]) | (chosen == (self.cues[agents] + 1) % CUES)

    def _observations(self, agents=None) -> dict:
        """Observations of ``agents`` (default: every agent)."""
        n = len(self.possible_agents)
        rows = np.stack([np.arange(n), np.full(n, self.step_count * self.tagged), self.cues, np.full(n, self.game)], 1)
        observations = {}
        for k, agent in enumerate(self.possible_agents):
            if agents is not None and agent not in agents:
                continue
            space = self._observation_spaces[agent]
            box = space["observation"] if self.masked else space
            row = np.zeros(box.shape, np.float32)
            row[:4] = rows[k]
            if self.masked:
                mask = np.zeros(CUES, np.int8)
                mask[[self.cues[k], (self.cues[k] + 1) % CUES]] = 1
                row = {"observation": row, "action_mask": mask}
            observations[agent] = row
        return observations

    def render(self):
        frame = np.zeros((8, 8 * len(self.possible_agents), 3), np.uint8)
        for k, cue in enumerate(self.cues):
            frame[:, 8 * k:8 * (k + 1), cue] = 255
        return frame


def parallel_env(**kwargs) -> CueGame:
    return CueGame(**kwargs)
