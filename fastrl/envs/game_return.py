"""The score of a whole Atari game, beside the learner's episodes.

With ``env.kwargs = {episodic_life = true}`` a lost life ends the learner's episode (the value
target stops there, and the next life starts with FIRE pressed), so ``episode_return`` counts
one life's points. Published Atari figures count whole games: every life, unclipped. Both Atari
backends therefore put ``info["game_return"]`` (``GAME_RETURN_KEY``) on the step that ends a game
(its last life lost, or its time limit), and Config.info_keys records it with every episode under
episodic_life, reported as ``info/game_return``.

The envpool backend reads the game's end and its raw reward from the pool (``info:terminated``,
``info:reward``) through :class:`GameReturns`; the gymnasium backend's Atari wrapper
(fastrl.envs.backends.atari) sums them itself.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fastrl.config import GAME_RETURN_KEY

__all__ = ["GAME_RETURN_KEY", "GameReturns"]


class GameReturns:
    """Running game scores of ``num_envs`` envs, read one batch at a time."""

    def __init__(self, num_envs: int) -> None:
        self.totals = np.zeros(num_envs, dtype=np.float64)

    def batch_info(self, env_ids: np.ndarray, raw_rewards: np.ndarray, game_over: np.ndarray,
                   truncated: np.ndarray) -> Mapping[str, np.ndarray]:
        """gymnasium's vector info of a batch (rows ``env_ids``): ``game_return`` at the rows whose
        game ended on this step (``game_over`` or ``truncated``), NaN and unmasked elsewhere. A
        reset step brings reward 0, so the totals need no separate reset."""
        totals = self.totals
        totals[env_ids] += raw_rewards
        ended = np.asarray(game_over, dtype=bool) | np.asarray(truncated, dtype=bool)
        values = np.where(ended, totals[env_ids], np.nan)
        totals[env_ids[ended]] = 0.0
        return {GAME_RETURN_KEY: values, "_" + GAME_RETURN_KEY: ended}

    def read(self, io, env_ids: np.ndarray, truncated: np.ndarray) -> Mapping[str, np.ndarray]:
        """batch_info from a pool reader's ``last_game`` (game over, raw reward); empty where the
        reader has none."""
        if io.last_game is None:
            return {}
        game_over, raw_rewards = io.last_game
        return self.batch_info(env_ids, raw_rewards, game_over, truncated)
