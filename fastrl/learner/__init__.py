"""The learner family. Imports point one way:

- process shell: :mod:`.process` (the learner process loop and how ranks agree to stop),
  :mod:`.runtime` (arena slots in; weights, statistics and checkpoints out), :mod:`.policy_set`
  (a runtime per policy, stepped in turn) and :mod:`.staging` (full slots into staging buffers)
- algorithms: :mod:`.factory` picks one by ``learner.algo``; :mod:`.vtrace` (APPO, IMPALA),
  :mod:`.dqn` (Ape-X DQN), :mod:`.r2d2` (recurrent Ape-X), :mod:`.sac` (soft actor-critic) on
  :mod:`.qlearning` (the replay-ratio loop; the Q-learners' target network and prioritized step);
  all build on :mod:`.base` (optimizer, counters, schedule, reward transform, lag statistics,
  gradient step, state dict), with :mod:`.precision` and :mod:`.return_scale`
- pieces: :mod:`.losses` (pure loss functions), :mod:`.batch` (the time-major batch type),
  :mod:`.replay_feed` (batches into a replay's streams), then fastrl.replay.buffer,
  fastrl.models.networks and fastrl.kernels.
"""
from .base import BaseLearner
from .batch import Trajectories
from .dqn import PRIORITY_EPS, DQNLearner
from .factory import LEARNERS, make_learner
from .losses import appo_loss, impala_loss, td_loss, vtrace_targets
from .process import learner_process
from .r2d2 import R2D2Learner
from .replay_feed import add_trajectories
from .runtime import LearnerRuntime, NonFiniteTraining, restore_learner
from .sac import SACLearner
from .staging import gather_trajectories
from .vtrace import VTraceLearner

__all__ = ["BaseLearner", "DQNLearner", "LEARNERS", "LearnerRuntime", "NonFiniteTraining", "PRIORITY_EPS",
           "R2D2Learner", "SACLearner", "Trajectories", "VTraceLearner", "add_trajectories", "appo_loss",
           "gather_trajectories", "impala_loss", "learner_process", "make_learner", "restore_learner", "td_loss",
           "vtrace_targets"]
