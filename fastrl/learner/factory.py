"""The one place that maps ``learner.algo`` to a learner class."""
from __future__ import annotations

import torch
from torch import nn

from ..config import Config
from .base import BaseLearner
from .dqn import DQNLearner
from .r2d2 import R2D2Learner
from .sac import SACLearner
from .vtrace import VTraceLearner

LEARNERS: dict[str, type[BaseLearner]] = {"appo": VTraceLearner, "impala": VTraceLearner, "dqn": DQNLearner,
                                          "r2d2": R2D2Learner, "sac": SACLearner}


def make_learner(cfg: Config, observation_space, action_space, model: nn.Module | None = None,
                 device: torch.device | str = "cpu") -> BaseLearner:
    """The learner ``cfg.learner.algo`` names (see ``LEARNERS``)."""
    return LEARNERS[cfg.learner.algo](cfg, observation_space, action_space, model=model, device=device)
