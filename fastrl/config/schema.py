"""The config schema: every key declared once (default, allowed values, who reads it, help) in
dataclasses per section, and the table of keys built from them."""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import typing
from dataclasses import MISSING, dataclass, field

DEFAULT_PROFILE = "cartpole-appo"
# Limits the processes' shared structures set, declared here so that the config stays a leaf:
# a request travels as one byte (fastrl.ipc.slots), and half its 256 values keep two generation
# tags, so that a restarted worker ignores replies meant for the one it replaced; the arena holds
# one row of game counts per evaluation opponent (fastrl.ipc.arena).
MAX_SPLITS = 128
MAX_EVAL_OPPONENTS = 8
ALGOS = ("appo", "impala", "dqn", "r2d2", "sac")
VTRACE = ("appo", "impala")  # actor-critics learning from fresh trajectories through V-trace
Q_LEARNERS = ("dqn", "r2d2")  # value-based: epsilon-greedy actors, a replay every batch goes through
REPLAY_LEARNERS = (*Q_LEARNERS, "sac")  # every batch goes through the in-learner replay
BF16_LEARNERS = (*VTRACE, "dqn")  # may run their encoder under bf16 autocast (learner.precision)


class ConfigError(ValueError):
    """A user-facing configuration problem; the message is one line that names the fix."""


@dataclass(frozen=True)
class Range:
    """The values a numeric key allows: ``low`` to ``high``, each end included unless open.
    NaN and infinities are never inside (no key means infinity)."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value) -> bool:
        if not (isinstance(value, int) or math.isfinite(value)):
            return False
        above = self.low < value if self.low_open else self.low <= value
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.low == -math.inf and self.high == math.inf:
            return "finite"
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class Choices:
    """The values a string key allows: one of ``names``."""

    names: tuple[str, ...]

    def __contains__(self, value) -> bool:
        return value in self.names

    def __str__(self) -> str:
        return f"one of {', '.join(self.names)}"


@dataclass(frozen=True)
class DeviceNames:
    """The device names a key allows: ``names`` and ``cuda:N`` for any N; ``text`` says them."""

    names: tuple[str, ...]
    text: str

    def __contains__(self, value) -> bool:
        return isinstance(value, str) and (value in self.names or (value.startswith("cuda:") and value[5:].isdigit()))

    def __str__(self) -> str:
        return self.text


# The score of a whole Atari game: the backends put it in the info of the step a game ends
# (fastrl.envs.game_return), and under env.kwargs episodic_life, where a lost life ends the
# learner's episode, every episode records it (Config.info_keys): info/game_return.
GAME_RETURN_KEY = "game_return"
POLICY_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a policy's name is part of metric keys and file names
POSITIVE, NON_NEGATIVE, AT_LEAST_1, UNIT = Range(0, low_open=True), Range(0), Range(1), Range(0, 1)
FINITE = Range(-math.inf)
# A duration beyond any run; the bound keeps datetime.timedelta (dist_timeout_s) from overflowing.
SECONDS = Range(0, 10**9, low_open=True)
SECONDS_OR_OFF = Range(0, 10**9)
# Units of one layer: beyond this, one layer's weight matrix alone outgrows any host (65536^2
# float32 is 16 GiB).
LAYER_WIDTH = Range(1, 65536)
# The smallest side the image encoders read, and below which [C, H, W] with W <= 4 would look
# channels-last; the largest beyond an 8K screen.
IMAGE_SIDE = Range(7, 8192)
# Sizes and counts: each bound is far beyond any real run, so that a slip of the keyboard
# (env.frame_stack=1000000000) is refused here in one line rather than as a MemoryError while the
# env is probed, before the memory checks (fastrl.run.resources) can size the run.
THREADS = Range(1, 1024)  # processes or threads on one machine: more than any has cores
ENV_COUNT = Range(1, 2**16)  # envs one process steps
FRAMES = Range(1, 256)  # frames skipped or stacked per observation
STEPS = Range(1, 2**16)  # env steps of one trajectory or replayed sequence
BATCH = Range(1, 2**24)  # env steps or transitions in one batch
EPISODES = Range(1, 10**6)  # episodes one evaluation plays or one objective averages
REPLAY_RECORDS = Range(1, 10**9)  # records in a replay: 500 times Ape-X's 2 million
ANY_ACTION = Range(-2**31, 2**31 - 1)  # a Discrete space's values: the env's space bounds them further
SERIAL_REPORT_BATCHES = 10  # a serial run reports every this many learner batches by default
RUN_DEVICES = DeviceNames(("auto", "cpu", "cuda"), "auto, cpu, cuda or cuda:N")


def declare(default, *, help: str, allowed: Range | Choices | DeviceNames | None = None,
            algos: tuple[str, ...] = ALGOS, unread: Range | None = None, saved_default=MISSING):
    """A config field declared once: its ``default``, the ``allowed`` values (for a list, each
    entry's), the ``algos`` that read it, and its ``help``. ``unread``, if given, is what is allowed
    instead under an algorithm that does not read the key (else ``allowed`` holds everywhere).
    ``saved_default``, if given, is what a saved config (a run's config.toml, a checkpoint's) that
    lacks the key stands for: runs from before the key did otherwise than ``default``."""
    metadata = {"allowed": allowed, "algos": algos, "help": help, "unread": unread, "saved_default": saved_default}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class EnvConfig:
    """The environments: which, made by which backend, and how they are spread over the rollout
    worker processes."""

    id: str = declare("CartPole-v1", help="envpool task id, gymnasium id, `module:callable` factory of one env, or "
                                "`pettingzoo:MODULE` (a PettingZoo ParallelEnv module, or a turn-based AEC one)")
    backend: str = declare("auto", allowed=Choices(("auto", "envpool", "gymnasium", "factory")),
                           help="who makes the envs; auto tries an envpool task, a gymnasium id, then "
                                "`module:callable`")
    num_workers: int = declare(2, allowed=THREADS, help="rollout worker processes")
    envs_per_worker: int = declare(256, allowed=ENV_COUNT,
                                   help="envs each worker steps; a multiple of env.num_splits; for a multi-agent env, "
                                        "agent rows (a split holds whole games; a turn-based game of n seats needs "
                                        "env.num_splits a multiple of n)")
    num_splits: int = declare(2, allowed=Range(1, MAX_SPLITS),
                              help="double buffering: the worker steps one split of its envs while another waits for "
                                   "actions")
    async_mode: bool = declare(False, help="envpool's async send/recv inside each worker")
    num_threads: int = declare(0, allowed=Range(0, THREADS.high),
                               help="envpool threads per worker; 0 = envpool's default")
    thread_affinity: bool = declare(False, help="pin envpool's threads to cores (helps Atari, halves CartPole)")
    kwargs: dict = declare({}, help="keyword arguments of envpool.make, gymnasium.make or the factory")
    info_keys: list[str] = declare([], help="numbers the env reports in its info at an episode's end, averaged per "
                                            "report as info/<key> (per member member/<k>/info/<key>); gymnasium "
                                            "and factory envs, and Atari's game_return on envpool")
    actions: list[int] = declare([], allowed=ANY_ACTION,
                                 help="the Discrete env's actions the policy chooses among, as the env numbers them "
                                      "(a minimal action set); [] = all of them")
    # Image preprocessing of gymnasium and factory envs (fastrl.envs.wrappers.image_preprocessing); envpool's
    # Atari takes its own options in env.kwargs (frame_skip, img_height, img_width, gray_scale, stack_num).
    frame_skip: int = declare(1, allowed=FRAMES,
                              help="repeat each action this many env frames, rewards summed, never past an episode's "
                                   "end; frames = env steps x frame_skip")
    resize: list[int] = declare([], allowed=IMAGE_SIDE, help="[height, width] of image observations (cv2 INTER_AREA); "
                                                              "[] keeps their size")
    grayscale: bool = declare(False, help="image observations as one luminance channel (cv2 RGB2GRAY)")
    frame_stack: int = declare(1, allowed=FRAMES,
                               help="the last n frames of an image observation stacked along channels (CHW, oldest "
                                    "first); an episode's first frame fills the stack")
    image_keys: list[str] = declare([],
                                    help="the leaves of a Dict observation preprocessed as images (key paths joined by"
                                         " '.'); [] = every uint8 [height, width, channels] leaf, channels 1, 3 or 4")


@dataclass
class ModelConfig:
    """The network: its encoder, an optional recurrent core, and the heads the algorithm needs."""

    kind: str = declare("auto", allowed=Choices(("auto", "mlp", "nature_cnn", "mnih2013_cnn", "convnet_simple",
                                                 "impala_resnet", "board_cnn")),
                        help="the encoder; auto: an MLP for vectors, a small CNN for images; board_cnn: a board "
                             "game's planes through one convolution of 4 x 4 windows (a line of four), then the "
                             "MLP of model.hidden_sizes")
    hidden_sizes: list[int] = declare([64, 64], allowed=LAYER_WIDTH,
                                      help="units of each MLP layer (not read after CNNs unless model.image_trunk=mlp)")
    activation: str = declare("tanh", allowed=Choices(("tanh", "relu")), help="the MLP's activation")
    normalize_obs: bool = declare(False, help="running mean/std normalization of float observations, kept in the model")
    core: str = declare("none", allowed=Choices(("none", "lstm", "gru")), algos=("appo", "impala", "r2d2"),
                        help="a recurrent core between the encoder and the heads (dqn refuses one: use r2d2)")
    core_size: int = declare(256, allowed=LAYER_WIDTH, algos=("appo", "impala", "r2d2"),
                             help="units of each recurrent layer")
    core_layers: int = declare(1, allowed=Range(1, 64), algos=("appo", "impala", "r2d2"), help="recurrent layers")
    core_memory_steps: int = declare(64, allowed=AT_LEAST_1, algos=("appo", "impala", "r2d2"),
                                     help="the horizon a new core keeps memories for (chrono initialization: each "
                                          "unit's forget / update gate bias log U(1, steps - 1)); 1 zeroes the biases, "
                                          "which halves a memory every step")
    image_trunk: str = declare("relu", allowed=Choices(("relu", "mlp")), saved_default="mlp",
                               help="a Dict observation with image leaves (or code grids) read by CNNs: relu joins "
                                    "their features and the other leaves in one ReLU layer as wide as the CNNs' "
                                    "features; mlp in the MLP of model.hidden_sizes and model.activation (what a "
                                    "saved run without this key reads as)")
    encode_action_mask: bool = declare(False, help="feed a Dict observation's action_mask to the encoder too")
    # The value loss then does not pull on the policy's features (MuJoCo: docs/results.md).
    separate_critic: bool = declare(False, algos=VTRACE,
                                    help="feed-forward only: the value head gets its own encoder (same shape) instead "
                                         "of sharing the policy's")
    # Inside fastrl.models.heads.LOG_STD_RANGE, which clamps the log-std the network outputs.
    initial_log_std: float = declare(0.0, allowed=Range(-5.0, 2.0, low_open=True, high_open=True), algos=VTRACE,
                                     help="Box actions: the Gaussian policy's log-std at the start (0: std 1, the "
                                          "action range's width)")


@dataclass
class LearnerConfig:
    """The learning algorithm and its hyperparameters."""

    algo: str = declare("appo", allowed=Choices(ALGOS),
                        help="appo (PPO surrogate on V-trace), impala (V-trace policy gradient), dqn (Ape-X), r2d2 "
                             "(recurrent Ape-X) or sac (soft actor-critic on the replay, continuous actions)")
    rollout: int = declare(32, allowed=STEPS,
                           help="T: env steps per trajectory slot (r2d2: replayed sequences start every rollout steps)")
    batch_size: int = declare(8192, allowed=BATCH, help="env steps per learner batch; a multiple of learner.rollout")
    num_epochs: int = declare(1, allowed=Range(1, 1000), algos=VTRACE, help="passes over each batch")
    num_minibatches: int = declare(1, allowed=AT_LEAST_1, algos=VTRACE,
                                   help="minibatches each pass splits the batch's trajectories into")
    lr: float = declare(3e-4, allowed=POSITIVE, help="Adam's learning rate")
    lr_decay: bool = declare(True, help="decay the learning rate linearly to 0 over the run's budget")
    adam_eps: float = declare(1e-5, allowed=POSITIVE, help="Adam's epsilon")
    gamma: float = declare(0.99, allowed=UNIT, help="discount factor")
    vtrace_lambda: float = declare(1.0, allowed=UNIT, algos=VTRACE, help="V-trace's lambda (trace decay)")
    clip_rho: float = declare(1.0, allowed=POSITIVE, algos=VTRACE, help="V-trace's rho-bar: clips the value target's "
                                                                       "importance weights")
    clip_c: float = declare(1.0, allowed=POSITIVE, algos=VTRACE, help="V-trace's c-bar: clips the traces")
    clip_pg_rho: float = declare(1.0, allowed=POSITIVE, algos=VTRACE,
                                 help="clips the policy gradient's importance weights")
    ppo_clip: float = declare(0.2, allowed=POSITIVE, algos=("appo",), help="PPO's surrogate clip range")
    # PPO as textbooks (and CleanRL) write it computes the advantages and value targets once per
    # batch and clips the value loss; APPO's default re-derives both at every gradient step
    # (docs/results.md#appo-and-textbook-ppo).
    targets: str = declare("minibatch", allowed=Choices(("minibatch", "batch")), algos=VTRACE,
                           help="when the V-trace value targets and advantages are computed: minibatch, before "
                                "every gradient step from the current network; batch, once per batch before its "
                                "first step, kept through every epoch and minibatch (PPO's way)")
    value_clip: float = declare(0.0, allowed=NON_NEGATIVE, algos=("appo",),
                                help="0 = off; else PPO's value clipping: the value loss takes the larger of the "
                                     "squared errors of V and of V's start-of-batch value moved by at most this")
    value_coef: float = declare(0.5, allowed=NON_NEGATIVE, algos=VTRACE, help="weight of the value loss")
    entropy_coef: float = declare(0.01, allowed=NON_NEGATIVE, algos=VTRACE, help="weight of the entropy bonus")
    uniform_kl_coef: float = declare(0.0, allowed=NON_NEGATIVE, algos=VTRACE,
                                     help="weight of KL(uniform over the legal actions || policy), discrete actions "
                                          "only: keeps every legal action's probability off zero where the entropy "
                                          "bonus's pull vanishes (docs/selfplay.md#exploration-that-does-not-die)")
    # clip_grad_norm_ scales gradients by max_grad_norm / norm: 0 zeroes them, < 0 flips them.
    max_grad_norm: float = declare(0.5, allowed=POSITIVE, help="gradients are clipped to this global norm")
    normalize_advantages: bool = declare(True, algos=("appo",),
                                         help="advantages to zero mean and unit std over each minibatch's valid steps")
    normalize_returns: bool = declare(False, algos=VTRACE,
                                      help="divide rewards by the running std of the discounted return (per env "
                                           "stream, pooled over torch.distributed ranks)")
    reward_clip: float = declare(0.0, allowed=NON_NEGATIVE,
                                 help="0 = off; else rewards are clipped to [-reward_clip, reward_clip]")
    reward_scale: float = declare(1.0, allowed=POSITIVE, help="rewards are multiplied by this")
    max_policy_lag: int = declare(100, allowed=NON_NEGATIVE, algos=VTRACE,
                                  help="transitions acted by a policy this many updates older are masked out of the "
                                       "loss")
    max_consecutive_skips: int = declare(50, allowed=AT_LEAST_1,
                                         help="non-finite updates in a row before the run stops")
    burn_in: int = declare(0, allowed=NON_NEGATIVE, algos=VTRACE,
                           help="recurrent cores: the first steps of each trajectory only warm the state (no loss)")
    torch_threads: int = declare(1, allowed=THREADS, help="torch's intra-op threads in the learner")
    # Faster on GPUs with bf16 tensor cores and on some CPUs with native bf16: auto times it
    # (fastrl.learner.precision).
    precision: str = declare("float32", allowed=Choices(("float32", "bfloat16", "auto")),
                             help="bfloat16: appo/impala/dqn run the encoder under bf16 autocast (heads, log-probs, "
                                  "targets and losses stay float32); auto: bfloat16 on a CPU with native bf16 where "
                                  "it times faster than float32")
    # Forward and backward through numpy's BLAS and numba instead of torch ops (fastrl/sampling/numpy_mlp.py
    # NumpyMLPActorCritic; docs/results.md has the measured gain).
    numpy_mlp: bool = declare(True, algos=VTRACE,
                              help="on a CPU in float32, a plain MLP actor-critic over discrete actions trains through "
                                   "numpy and numba")
    # Ape-X (Horgan et al. 2018): env i of N acts epsilon-greedily with
    # epsilon_i = epsilon ** (1 + epsilon_alpha * i / (N - 1)).
    epsilon: float = declare(0.4, allowed=UNIT, algos=Q_LEARNERS, unread=FINITE,
                             help="the base exploration rate: env i of N acts with epsilon ** (1 + epsilon_alpha * i / "
                                  "(N - 1))")
    epsilon_alpha: float = declare(7.0, allowed=NON_NEGATIVE, algos=Q_LEARNERS, unread=FINITE,
                                   help="how fast the exploration rate falls over the envs")
    # DQN's schedule (Mnih et al. 2015; CleanRL, Tianshou): explore fully at first, while the
    # Q-values mean nothing, then settle. With epsilon_alpha = 0 every env shares one epsilon.
    epsilon_decay_steps: int = declare(0, allowed=Range(0, 10**12), algos=Q_LEARNERS,
                                       help="0 = off; else every env's exploration rate starts at 1 and falls "
                                            "linearly to its Ape-X rate over the run's first this many env steps")
    # A second, smaller rate once the policy scores: a rate small enough for the end of a Pong run
    # (0.002) keeps an unskilled policy in long scoreless rallies for ~1M env steps when set from the
    # start (docs/results.md#atari-dqn-cpu), while 0.01 throughout caps the training return below 20.
    epsilon_late: float = declare(0.0, allowed=UNIT, algos=Q_LEARNERS,
                                  help="the base exploration rate from learner.epsilon_late_after_steps on (env i of "
                                       "N acts with epsilon_late ** (1 + epsilon_alpha * i / (N - 1)))")
    epsilon_late_after_steps: int = declare(0, allowed=Range(0, 10**12), algos=Q_LEARNERS,
                                            help="0 = off; else from the run's this many env steps on (at least "
                                                 "learner.epsilon_decay_steps), learner.epsilon_late replaces "
                                                 "learner.epsilon")
    # Whether the policy scores is read from its returns, not guessed from a step count: the env step
    # at which Pong's training return first passes 15 ranged from 0.5M to 1.4M over seeds and hosts.
    epsilon_late_return_episodes: int = declare(0, allowed=Range(0, 10**6), algos=Q_LEARNERS,
                                                help="0 = off; else the late rate waits, past "
                                                     "learner.epsilon_late_after_steps, until the mean return of "
                                                     "this rank's newest this many episodes reaches "
                                                     "learner.epsilon_late_min_return (the episodes "
                                                     "episode_return_mean averages); begun, it stays, over "
                                                     "resumes too")
    epsilon_late_min_return: float = declare(0.0, allowed=FINITE, algos=Q_LEARNERS,
                                             help="the mean return that starts the late rate, with "
                                                  "learner.epsilon_late_return_episodes > 0")
    target_update_every: int = declare(2500, allowed=AT_LEAST_1, algos=Q_LEARNERS, unread=FINITE,
                                       help="gradient steps between target-network copies")
    double_q: bool = declare(True, algos=Q_LEARNERS,
                             help="the online network picks the bootstrap action, the target network rates it")
    # SAC (Haarnoja et al. 2018): the entropy temperature alpha, learned towards a target entropy
    # of -target_entropy_scale * |A| (their -|A| at 1), and the target critics' Polyak rate.
    temperature: float = declare(1.0, allowed=POSITIVE, algos=("sac",),
                                 help="SAC's entropy temperature alpha: its start value, or its value throughout with "
                                      "learner.learn_temperature=false")
    learn_temperature: bool = declare(True, algos=("sac",),
                                      help="learn alpha towards the target entropy -target_entropy_scale * action dims")
    target_entropy_scale: float = declare(1.0, allowed=FINITE, algos=("sac",),
                                          help="the target entropy is -target_entropy_scale * action dims (of the "
                                               "squashed action in [-1, 1])")
    tau: float = declare(0.005, allowed=Range(0, 1, low_open=True), algos=("sac",),
                         help="Polyak rate: each update moves the target critics this share of the way to the critics")


@dataclass
class ReplayConfig:
    """The learner's replay memory: storage, prioritized sampling, how much. fastrl.replay.buffer's
    TransitionReplay and SequenceReplay take it as it is; what the learner decides (gamma, the
    sequence length) they take as arguments. dqn and r2d2 replay every batch; appo and impala
    replay when replay.vtrace_fraction > 0."""

    capacity: int = declare(1_000_000, allowed=REPLAY_RECORDS,
                            help="records (env steps) kept, over all envs of this learner")
    min_fill: int = declare(50_000, allowed=Range(0, REPLAY_RECORDS.high),
                            help="records stored before the first replayed batch; sac's actors act uniformly at random "
                                 "for this many env steps")
    alpha: float = declare(0.6, allowed=NON_NEGATIVE, help="priority exponent (0 = uniform sampling)")
    beta: float = declare(0.4, allowed=NON_NEGATIVE, help="importance-weight exponent")
    n_step: int = declare(3, allowed=Range(1, 1000), algos=REPLAY_LEARNERS, help="steps summed before bootstrapping")
    frame_stack: int = declare(1, allowed=FRAMES,
                               help="frames stacked on axis 0 of the observation (Atari: 4); each stored once")
    compress: str = declare("", allowed=Choices(("", "lz4")), help="\"\" or lz4 (pip install 'fastrl[replay]')")
    memmap_dir: str = declare("", help="a directory: raw frames in a scratch file there (beyond RAM); "
                                       "\"\" keeps them in RAM")
    threads: int = declare(2, allowed=THREADS, help="threads that copy and (de)compress frames")
    batch_size: int = declare(512, allowed=BATCH, algos=REPLAY_LEARNERS,
                              help="transitions (r2d2: sequences) per gradient step")
    # The learner holds it whichever side is faster (fastrl/learner/qlearning.py; docs/offpolicy.md).
    replay_ratio: float = declare(1.0, allowed=NON_NEGATIVE, algos=REPLAY_LEARNERS,
                                  help="transitions sampled per env step added (r2d2: trained steps); > 0; gradient "
                                       "steps per env step = replay_ratio / replay.batch_size")
    # td runs two forward passes over every arriving step; max spends that time on gradient steps,
    # as R2D2 and SAC do (atari-dqn-cpu: 1.05x the env steps/s, docs/results.md#atari-dqn-cpu).
    arrival_priority: str = declare("td", allowed=Choices(("td", "max")), algos=("dqn",),
                                    help="a new step's priority: td (its n-step TD error under the current networks, "
                                         "as Ape-X's actors compute it) or max (the largest priority seen, as PER)")
    vtrace_fraction: float = declare(0.0, allowed=Range(0, 1, high_open=True), algos=VTRACE,
                                     help="share of each batch drawn from replayed trajectories")
    checkpoint: bool = declare(False, help="save the replay's contents beside each checkpoint (only the newest "
                                           "checkpoint's is kept) and load them on --resume; off, a resumed run "
                                           "refills the replay to min_fill")
    sequence_length: int = declare(80, allowed=STEPS, algos=("r2d2",), help="steps per replayed sequence")
    burn_in: int = declare(40, allowed=NON_NEGATIVE, algos=("r2d2",),
                           help="first steps of each sequence only warm the recurrent state (no loss, no gradient)")


@dataclass
class EvalConfig:
    """Evaluation during training: its own envs, the latest published weights, off the hot path."""

    every_s: float = declare(0.0, allowed=SECONDS_OR_OFF, help="seconds between evaluations; 0 = off")
    episodes: int = declare(10, allowed=EPISODES, help="complete episodes per evaluation")
    deterministic: bool = declare(True, algos=(*VTRACE, "sac"),
                                  help="argmax / mean actions (a Q-learner always acts greedily)")
    num_envs: int = declare(10, allowed=ENV_COUNT,
                            help="evaluation envs (at most eval.episodes are used), stepped by the evaluator alone")
    video_every_s: float = declare(0.0, allowed=SECONDS_OR_OFF,
                                   help="seconds between short clips sent to TensorBoard / W&B; 0 = off")
    opponents: list[str] = declare([], help=f"a multi-agent game's scripted opponents (random, "
                                            f"connect_four_one_ply, tictactoe_minimax or MODULE:CALLABLE, as "
                                            f"fastrl-eval --opponent), each played eval.episodes episodes an "
                                            f"evaluation by the first policy, every seat in turn: "
                                            f"eval/<opponent>/win_rate, draw_rate, loss_rate, episodes; at most "
                                            f"{MAX_EVAL_OPPONENTS}")
    # Self-play keeps a zero-sum game's return near 0 whatever the policy's strength: there the
    # results against fixed opponents say which weights are best.
    best_by: str = declare("auto", allowed=Choices(("auto", "return", "opponents")),
                           help="what checkpoints/best.pt keeps the best of: return (eval_return_mean), opponents "
                                "(the score against eval.opponents: wins + draws / 2 over games, averaged over the "
                                "opponents), auto (opponents when eval.opponents is set and no population, else "
                                "return)")
    # The evaluation that beats the best so far is the luckiest of many noisy ones: its own figure
    # overstates the weights, and with 100 games a round a worse checkpoint can win the title.
    confirm_best: bool = declare(False, help="an evaluation that beats best.pt's figure is played again on other "
                                             "seeds, and best.pt takes the weights only if that second round beats "
                                             "it too, keeping the second round's figure "
                                             "(docs/evaluation.md#evaluation-during-training)")


@dataclass
class InferenceConfig:
    """The inference batcher's policy."""

    compile: bool = declare(False, help="pad each batch to one of a few sizes and run the policy through torch.compile "
                                        "(CUDA graphs on a GPU); the first batches of each size pay the compile")
    device: str = declare("", allowed=DeviceNames(("", "cpu"), "'' (the run's device), cpu or cuda:N"),
                          help="where the batcher runs the policy; cuda:N (one process, not under torchrun) keeps its "
                               "small batches off the learner's GPU")
    numpy_mlp: bool = declare(True, algos=(*VTRACE, "sac"),
                              help="on a CPU, a plain MLP policy (discrete actions, or sac's squashed Gaussian) acts "
                                   "through numpy and numba instead of torch ops")
    # For small networks whose batches are already large (CartPole's 512 envs a request), where
    # the round trip and the batcher's loop cost more than the forward pass.
    in_workers: bool = declare(False, help="each rollout worker runs the policy on its own CPU and no batcher process "
                                           "runs (serial mode acts inline either way)")


@dataclass
class LoggingConfig:
    """Where metrics go besides metrics.jsonl and TensorBoard."""

    wandb: bool = declare(False,
                          help="log metrics, config, evaluations and videos to Weights & Biases (the [wandb] extra)")
    wandb_project: str = declare("fastrl", help="the W&B project")
    wandb_entity: str = declare("", help="the W&B entity; \"\" = your default")
    wandb_group: str = declare("", help="the W&B group; \"\" = no group")


@dataclass
class PoliciesConfig:
    """The run's policies and which one acts for, and trains on, each agent's rows
    (docs/multiagent.md). Each policy has its own weights, learner, checkpoints and metrics."""

    names: list[str] = declare(["main"],
                               help="the run's policies; with mapping=per_agent or by_kind leave it at the default: "
                                    "each policy is named after its agent, or its agents' kind (by_kind also takes "
                                    "the kinds listed, in the order wanted: the first is evaluated in training)")
    mapping: str = declare("shared",
                           help="agent -> policy: shared (every agent -> the first of policies.names), per_agent (one "
                                "policy per agent), by_kind (one per agent name without its _N: adversary_0 and "
                                "adversary_1 -> adversary), or module:fn, fn(agent_id) -> a policy name")


@dataclass
class SelfPlayConfig:
    """Self-play against a league of frozen snapshots of the policy (docs/selfplay.md): per game
    the policy plays one seat drawn at random and a snapshot every other seat; snapshot rows are
    never trained on."""

    enabled: bool = declare(False, help="play against the league of the policy's own snapshots (a multi-agent env, "
                                        "one policy)")
    snapshot_every: int = declare(100, allowed=AT_LEAST_1, help="learner updates between snapshots")
    max_snapshots: int = declare(8, allowed=Range(1, 64), help="snapshots kept in the league; the oldest goes first")
    latest_prob: float = declare(0.5, allowed=UNIT, help="chance a game's opponent is the newest snapshot; otherwise "
                                                         "one of the others, drawn by prioritized fictitious self-play")
    pfsp_power: float = declare(2.0, allowed=NON_NEGATIVE,
                                help="PFSP weights each older snapshot (1 - win rate against it) ** pfsp_power "
                                     "(0: uniform)")
    pfsp_window: int = declare(100, allowed=AT_LEAST_1,
                               help="PFSP's win rate against a snapshot counts the policy's latest games against "
                                    "it, at most this many (a policy that improves leaves its early losses behind)")
    # Snapshots alone can drift to lines that beat each other and lose to plain play: fixed
    # opponents kept in the league hold the policy to them.
    scripted_opponents: list[str] = declare([], help="scripted opponents kept in the league (random, "
                                                     "connect_four_one_ply, tictactoe_minimax or MODULE:CALLABLE, as "
                                                     "fastrl-eval --opponent), played in the rollout workers: "
                                                     "league/scripted/<opponent>/win_rate, draw_rate, loss_rate, games")
    scripted_prob: float = declare(0.0, allowed=UNIT,
                                   help="chance a game's opponent is one of selfplay.scripted_opponents (uniformly) "
                                        "instead of a snapshot, once the league holds one")


# What pbt.objective may name besides "info/<key>", an env info number (INFO_PREFIX + the key).
PBT_OBJECTIVES = ("episode_return_mean", "eval_return_mean")
INFO_PREFIX = "info/"
INFO_KEY = re.compile(r"[A-Za-z0-9_.-]+")  # an info key is part of metric keys: info/<key>


def objective_info_key(objective: str) -> str | None:
    """The env info key a pbt.objective of the form info/<key> names; None for any other."""
    return objective[len(INFO_PREFIX):] if objective.startswith(INFO_PREFIX) else None


# What PBT may perturb: keys a member's learner reads at every update, by algorithm.
VTRACE_PBT_MUTABLE = ("learner.lr", "learner.entropy_coef", "learner.value_coef", "learner.ppo_clip",
                      "learner.max_grad_norm", "learner.gamma", "learner.uniform_kl_coef")
# SAC's replay fixes each transition's n-step discount when it is stored: gamma is not among them.
SAC_PBT_MUTABLE = ("learner.lr", "learner.tau", "learner.max_grad_norm")
PBT_MUTABLE = tuple(dict.fromkeys(VTRACE_PBT_MUTABLE + SAC_PBT_MUTABLE))
# What members may start apart in (pbt.start): keys only a member's own learner reads. The
# workers, the batcher and the arena follow the run's config, and a copy needs equal shapes.
VTRACE_PBT_MEMBER_KEYS = VTRACE_PBT_MUTABLE + (
    "learner.num_epochs", "learner.lr_decay", "learner.adam_eps", "learner.vtrace_lambda", "learner.clip_rho",
    "learner.clip_c", "learner.clip_pg_rho", "learner.normalize_advantages", "learner.reward_clip",
    "learner.reward_scale", "learner.max_policy_lag", "learner.targets", "learner.value_clip")
# A SAC member's replay is its own, so it may start with its own gamma.
SAC_PBT_MEMBER_KEYS = SAC_PBT_MUTABLE + ("learner.lr_decay", "learner.adam_eps", "learner.gamma",
                                         "learner.reward_scale", "learner.temperature", "learner.target_entropy_scale")
PBT_MEMBER_KEYS = tuple(dict.fromkeys(VTRACE_PBT_MEMBER_KEYS + SAC_PBT_MEMBER_KEYS))


@dataclass
class PBTConfig:
    """Population-based training (docs/pbt.md): ``population`` members share the rollout workers,
    each game acted and trained by one member with its own learner and hyperparameters; every
    ``period_env_steps`` the bottom members copy a top member and perturb its hyperparameters."""

    population: int = declare(0, allowed=Range(0, 64), help="members; 0 = no population-based training")
    period_env_steps: int = declare(1_000_000, allowed=AT_LEAST_1, help="env steps (all members) between exploits")
    warmup_env_steps: int = declare(1_000_000, allowed=NON_NEGATIVE,
                                    help="env steps before the first exploit (at the later of this and "
                                         "pbt.period_env_steps)")
    fraction: float = declare(0.25, allowed=Range(0, 0.5, low_open=True),
                              help="the bottom fraction copies the top fraction (at least one member each)")
    margin_relative: float = declare(0.05, allowed=NON_NEGATIVE,
                                     help="a bottom member copies only when the top one leads by this share of "
                                          "the top's |objective| ...")
    margin_absolute: float = declare(0.0, allowed=NON_NEGATIVE, help="... and by at least this much")
    objective: str = declare("episode_return_mean",
                             help="what ranks members: episode_return_mean (their episodes' mean return since their "
                                  "last copy, at most the newest pbt.objective_episodes), eval_return_mean (their "
                                  "latest evaluation, eval.every_s) or info/<key> (an env info number at their "
                                  "episodes' end, averaged as the return is)")
    objective_episodes: int = declare(100, allowed=EPISODES, help="a member's newest episodes its objective averages")
    mutable: list[str] = declare(list(VTRACE_PBT_MUTABLE[:5]),
                                 help=f"hyperparameters perturbed after a copy (any of {', '.join(PBT_MUTABLE)})")
    perturb: list[float] = declare([0.8, 1.25], allowed=POSITIVE, help="a mutable value is multiplied by one of "
                                                                        "these, drawn uniformly")
    reset_prob: float = declare(0.05, allowed=UNIT, help="chance a mutable value goes back to its start value instead")
    control: bool = declare(False, help="member 0 never copies nor mutates: a control run inside the population")
    jitter: float = declare(0.0, allowed=Range(0, 1, high_open=True),
                            help="members 1.. start each mutable value not set in pbt.start multiplied by "
                                 "exp(u), u uniform in [-jitter, jitter]")
    start: dict = declare({}, help="start values per member: {\"learner.lr\" = [v0, v1, ...]} (one value per member); "
                                   "on the command line --set pbt.start.learner.lr=[v0,v1,...]")


@dataclass
class ExpectConfig:
    """What a profile promises: ``metric`` (a metrics.jsonl key) stands at ``threshold`` or above
    at the end of ``budget_env_steps`` env steps or ``budget_seconds`` of wall time on
    ``hardware``: its mean over the run's last ``final_stretch`` of the budget. scripts/bench.py
    learning checks it, with the first report that crossed the threshold beside it; training
    never reads it. All empty: no promise."""

    metric: str = declare("", help="the metrics.jsonl key the promise is about")
    threshold: float = declare(0.0, allowed=FINITE, help="the value the metric stands at when the budget is spent")
    budget_env_steps: int = declare(0, allowed=NON_NEGATIVE, help="within this many env steps (or budget_seconds)")
    budget_seconds: float = declare(0.0, allowed=SECONDS_OR_OFF,
                                    help="within this much wall time (or budget_env_steps)")
    hardware: str = declare("", help="what the budget holds on; required with budget_seconds")
    # A first good report says little of the policy a user ends with (a self-play policy's strength
    # swings from report to report): a promise is judged on where the run ends.
    final_stretch: float = declare(0.1, allowed=Range(0.0, 1.0, low_open=True),
                                   help="the fraction of the budget, at the run's end, over which the metric's mean "
                                        "must reach the threshold (env steps; wall time for a time budget); where no "
                                        "report in it has the metric, the last report that has it")

    @property
    def stated(self) -> bool:
        return self != ExpectConfig()


@dataclass
class Config:
    """A run: where it trains, for how long, how it keeps going; and one section per table."""

    device: str = declare("auto", allowed=RUN_DEVICES,
                          help="where the learner (and the batcher, unless inference.device) runs; auto: a GPU if one "
                               "is visible")
    seed: int = declare(0, allowed=Range(0, 2**32 - 1), help="seeds envs, networks and samplers (numpy takes 32 bits)")
    train_for_env_steps: int = declare(1_000_000, allowed=NON_NEGATIVE,
                                       help="stop at this many env steps, a resumed run's earlier ones included (on "
                                            "one node the workers stop there and the learner trains on the "
                                            "batches they filled; several ranks stop at the first report past "
                                            "it); 0 = no step limit")
    train_for_seconds: float = declare(0.0, allowed=SECONDS_OR_OFF, help="stop after this many seconds of training; "
                                                                         "0 = no time limit")
    slots_per_env: int = declare(3, allowed=Range(2, 256),
                                 help="trajectory slots per env: one filling, the rest queued for the learner")
    report_every_s: float = declare(5.0, allowed=SECONDS, help="seconds between status lines and metrics records")
    # A serial run's steps do not depend on the clock, its reports would: by env steps, two runs
    # with one seed write the same metrics.jsonl (docs/reproducibility.md). Parallel ranks report
    # in step by the clock (a collective), so only serial runs take it.
    report_every_env_steps: int = declare(0, allowed=NON_NEGATIVE,
                                          help="serial runs report at the first step at or past each multiple of "
                                               "this many env steps, in place of report_every_s; 0 = every 10 "
                                               "learner batches (10 x learner.batch_size); parallel runs report by "
                                               "the clock")
    checkpoint_every_s: float = declare(300.0, allowed=SECONDS, help="seconds between checkpoints")
    keep_checkpoints: int = declare(3, allowed=AT_LEAST_1, help="checkpoints kept; older ones are deleted")
    max_worker_restarts: int = declare(10, allowed=NON_NEGATIVE,
                                       help="rollout worker crashes tolerated within restart_window_s")
    restart_window_s: float = declare(300.0, allowed=SECONDS, help="the window max_worker_restarts counts crashes in")
    dist_timeout_s: float = declare(120.0, allowed=SECONDS,
                                    help="torch.distributed collectives wait this long for a peer, then fail (a rank "
                                         "silent in torchrun's store for half of it, at most 10 s, is named as gone); "
                                         "an elastic restart waits this long for rank 0's decision, and rank 0 half "
                                         "of it for the dead attempt's last process")
    serial: bool = declare(False, help="everything in one process, in lockstep: a seed repeats the run, and the "
                                       "learner trains on batches its current policy acted (no policy lag, for runs "
                                       "the learner bounds); parallel runs are faster where the envs bound the run")
    sample_only: bool = declare(False, help="profiling: the learner hands slots straight back without training")
    retain_freed_memory: bool = declare(True,
                                        help="child processes keep freed heap blocks for their next batch "
                                             "(fastrl.ipc.allocator): no page faults per batch, resident memory stays "
                                             "at its peak")
    # Linux's range; an unprivileged process may only raise it. It pays where a CPU learner bounds
    # training (atari-appo on a CPU: 1.23x) and costs where the actors' round trips do
    # (atari-appo-cpu, cartpole-appo): see fastrl.ipc.child.configure_child.
    actor_niceness: int = declare(0, allowed=Range(0, 19),
                                  help="added to the rollout workers' and the batcher's niceness, so that when cores "
                                       "are short the learner comes first")
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    expect: ExpectConfig = field(default_factory=ExpectConfig)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    pbt: PBTConfig = field(default_factory=PBTConfig)

    @property
    def info_keys(self) -> tuple[str, ...]:
        """The env info keys recorded at every episode's end: env.info_keys, the one a
        population's pbt.objective names (info/<key>), and under Atari's episodic_life the
        game's score (GAME_RETURN_KEY)."""
        objective = objective_info_key(self.pbt.objective) if self.pbt.population else None
        game = [GAME_RETURN_KEY] if self.env.kwargs.get("episodic_life") else []
        return tuple(dict.fromkeys([*self.env.info_keys, *([objective] if objective else []), *game]))

    @property
    def best_by_opponents(self) -> bool:
        """Whether best.pt keeps the best score against eval.opponents (eval.best_by resolved)."""
        best_by = self.eval.best_by
        return best_by == "opponents" or (best_by == "auto" and bool(self.eval.opponents) and self.pbt.population <= 1)

    @property
    def serial_report_every_env_steps(self) -> int:
        """A serial run's report period in env steps: the key's, or 10 learner batches."""
        return self.report_every_env_steps or SERIAL_REPORT_BATCHES * self.learner.batch_size

    @property
    def serial_evaluate_every_reports(self) -> int:
        """A serial run evaluates in line at every this-many-th report: the clock would put its
        figures into other reports on each run. eval.every_s over report_every_s, at least 1."""
        return max(1, round(self.eval.every_s / self.report_every_s))

    @property
    def trajectories_per_batch(self) -> int:
        return self.learner.batch_size // self.learner.rollout

    @property
    def total_envs(self) -> int:
        return self.env.num_workers * self.env.envs_per_worker

    @property
    def num_slots(self) -> int:
        return self.total_envs * self.slots_per_env

    @property
    def slots_per_worker(self) -> int:
        """The block of slots each rollout worker owns (fastrl.ipc.slots)."""
        return self.env.envs_per_worker * self.slots_per_env

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {"env": EnvConfig, "model": ModelConfig, "learner": LearnerConfig, "replay": ReplayConfig,
            "eval": EvalConfig, "inference": InferenceConfig, "logging": LoggingConfig, "expect": ExpectConfig,
            "policies": PoliciesConfig, "selfplay": SelfPlayConfig, "pbt": PBTConfig}


@dataclass(frozen=True)
class Key:
    """One config key as declared with :func:`declare`; ``name`` is ``section.field`` (``field`` at the top level)."""

    name: str
    type: typing.Any
    default: typing.Any
    allowed: Range | Choices | DeviceNames | None
    algos: tuple[str, ...]
    help: str
    unread: Range | None
    saved_default: typing.Any = MISSING

    @property
    def default_when_saved(self):
        """What a saved config that lacks this key stands for."""
        return self.default if self.saved_default is MISSING else self.saved_default

    def allowed_under(self, algo: str | None):
        """The values allowed when ``algo`` runs (None: as if an algorithm that reads the key)."""
        if self.unread is not None and algo is not None and algo not in self.algos:
            return self.unread
        return self.allowed

    def check(self, value, algo: str | None = None) -> None:
        """Raise ConfigError (one line: the key, what it allows, the value) for a value outside it."""
        allowed = self.allowed_under(algo)
        if allowed is None:
            return
        if isinstance(value, list):
            if not all(v in allowed for v in value):
                raise ConfigError(f"config key '{self.name}' entries must be {allowed}, got {value!r}")
        elif value not in allowed:
            shown = f"'{value}'" if isinstance(value, str) else repr(value)
            raise ConfigError(f"config key '{self.name}' must be {allowed}, got {shown}")


def _declared_keys(cls, prefix: str) -> dict[str, Key]:
    hints = typing.get_type_hints(cls)
    keys = {}
    for f in dataclasses.fields(cls):
        if cls is Config and f.name in SECTIONS:
            continue
        if "help" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with fastrl.config.schema.declare()")
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        keys[prefix + f.name] = Key(prefix + f.name, hints[f.name], default, f.metadata["allowed"],
                                    f.metadata["algos"], f.metadata["help"], f.metadata["unread"],
                                    f.metadata["saved_default"])
    return keys


# Every config key, top-level keys first, then section by section in declaration order.
KEYS = {**_declared_keys(Config, ""),
        **{name: k for section, cls in SECTIONS.items() for name, k in _declared_keys(cls, f"{section}.").items()}}
# Every numeric key's allowed values (for a list key: each entry's).
RANGES = {name: k.allowed for name, k in KEYS.items() if isinstance(k.allowed, Range)}
