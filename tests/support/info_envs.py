"""A gymnasium env that reports a number in its info at an episode's end, for env.info_keys and
``pbt.objective = "info/score"`` (tests/unit/tuning/test_pbt.py)."""
import gymnasium
import numpy as np


class ScoredSteps(gymnasium.Env):
    """Observation: [steps taken / 10]. Action 0 earns reward 1, action 1 nothing; the episode
    terminates at the second action 1, or is truncated after 10 steps. Only its last step's info
    has "score": 100 minus the episode's return, which ranks policies the other way round from
    their returns (and tells which episode a score came from)."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = self.ones = self.episode_return = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(action == 0)
        self.steps += 1
        self.ones += int(action == 1)
        self.episode_return += reward
        terminated, truncated = self.ones == 2, self.steps == 10 and self.ones < 2
        info = {"score": 100.0 - self.episode_return} if terminated or truncated else {}
        return self._obs(), reward, terminated, truncated, info

    def _obs(self):
        return np.array([self.steps / 10], dtype=np.float32)


class Lives(gymnasium.Env):
    """A game of ``lives`` lives of ``life_length`` steps, reward 1 a step, that reports its score
    as Atari's backends do (fastrl.envs.game_return): with ``episodic_life`` each lost life ends an
    episode, a reset continues the game, and the step that ends the game has info["game_return"],
    here 10 a step (the raw score) against the reward's 1 (as if clipped)."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, lives: int = 3, life_length: int = 4, episodic_life: bool = False):
        self.lives, self.life_length, self.episodic_life = lives, life_length, episodic_life
        self.left = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.left == 0:  # the game is over: a new one
            self.left, self.score = self.lives, 0.0
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        self.score += 10.0
        life_lost = self.steps == self.life_length
        if life_lost:
            self.left -= 1
            self.steps = 0
        game_over = life_lost and self.left == 0
        info = {"game_return": self.score} if game_over else {}
        return self._obs(), 1.0, game_over or (life_lost and self.episodic_life), False, info

    def _obs(self):
        return np.array([self.left / self.lives], dtype=np.float32)
