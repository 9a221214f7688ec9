"""Configuration: dataclasses with defaults, profile loading, ``--set`` overrides, validation.

A config has top-level keys (``device``, ``seed``, ...) and four sections (``env``, ``model``,
``learner``, ``replay``). Profiles in ``profiles/*.toml`` use the same shape; ``--set section.key=value``
overrides one key, parsed by the field's declared type. ``RANGES`` holds every numeric key's
allowed values; ``check_section`` checks one section against them (``validate`` every section, then
the cross-key rules, before any process starts).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import tomli_w

DEFAULT_PROFILE = "cartpole-appo"
Q_LEARNERS = ("dqn", "r2d2")  # value-based: epsilon-greedy actors, a replay every batch goes through


class ConfigError(ValueError):
    """A user-facing configuration problem; the message is one line that names the fix."""


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    backend: str = "auto"  # auto | envpool | gymnasium | factory
    num_workers: int = 2  # rollout worker processes
    envs_per_worker: int = 256
    num_splits: int = 2  # double buffering: one split steps while another waits for actions
    async_mode: bool = False  # envpool async send/recv inside each worker
    num_threads: int = 0  # envpool threads per worker; 0 = envpool's default
    thread_affinity: bool = False  # pin envpool threads (helps Atari here, halves CartPole)
    kwargs: dict = field(default_factory=dict)  # passed to envpool.make / gymnasium.make / factory


@dataclass
class ModelConfig:
    kind: str = "auto"  # auto | mlp | nature_cnn | mnih2013_cnn | impala_resnet
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"  # tanh | relu
    normalize_obs: bool = False  # running mean/std of observations (float leaves), kept in the model
    core: str = "none"  # none | lstm | gru: a recurrent core between the encoder and the heads
    core_size: int = 256  # units of each recurrent layer
    core_layers: int = 1
    encode_action_mask: bool = False  # feed a Dict observation's action_mask to the encoder too
    # appo/impala, feed-forward: the value head gets its own encoder (same shape) instead of sharing
    # the policy's, so the value loss does not pull on the policy's features (MuJoCo, README)
    separate_critic: bool = False
    # Box actions: the Gaussian policy's log-std at the start (0: std 1, the action range's width)
    initial_log_std: float = 0.0


@dataclass
class LearnerConfig:
    algo: str = "appo"  # appo (PPO surrogate on V-trace) | impala (V-trace policy gradient) | dqn (Ape-X) | r2d2
    rollout: int = 32  # T: steps per trajectory slot
    batch_size: int = 8192  # env steps per learner batch; a multiple of rollout
    num_epochs: int = 1
    num_minibatches: int = 1
    lr: float = 3e-4
    lr_decay: bool = True  # linear decay to 0 over the run
    adam_eps: float = 1e-5
    gamma: float = 0.99
    vtrace_lambda: float = 1.0
    clip_rho: float = 1.0
    clip_c: float = 1.0
    clip_pg_rho: float = 1.0
    ppo_clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    # appo/impala: divide rewards by the running std of the discounted return (per env stream,
    # pooled over torch.distributed ranks)
    normalize_returns: bool = False
    reward_clip: float = 0.0  # 0 = off; else rewards are clipped to [-reward_clip, reward_clip]
    reward_scale: float = 1.0
    max_policy_lag: int = 100  # transitions acted by older policies are masked out of the loss
    max_consecutive_skips: int = 50  # non-finite updates in a row before the run stops
    burn_in: int = 0  # recurrent cores: first steps of each trajectory only warm the state (no loss)
    torch_threads: int = 1
    # float32 | bfloat16 | auto: appo/impala run the network's encoder under bf16 autocast (the
    # policy and value heads, log-probs, V-trace and the losses stay float32); faster on GPUs with bf16 tensor
    # cores and on CPUs with native bf16. auto: bfloat16 on such a CPU only (fastrl.learner.precision)
    precision: str = "float32"
    # appo/impala on a CPU in float32: a plain MLP actor-critic over discrete actions (CartPole's)
    # runs its forward and backward passes through numpy's BLAS and numba instead of torch ops
    # (fastrl/mlp_policy.py NumpyMLPActorCritic; see the README for the measured gain).
    numpy_mlp: bool = True
    # dqn (Ape-X, Horgan et al. 2018): env i of N acts epsilon-greedily with
    # epsilon_i = epsilon ** (1 + epsilon_alpha * i / (N - 1)).
    epsilon: float = 0.4
    epsilon_alpha: float = 7.0
    target_update_every: int = 2500  # dqn: gradient steps between target-network copies
    double_q: bool = True  # dqn, r2d2: the online network picks the bootstrap action, the target rates it


@dataclass
class ReplaySettings:
    """The learner's replay memory: storage, prioritized sampling, how much. fastrl.replay's
    TransitionReplay and SequenceReplay take it as it is; what the learner decides (gamma, the
    sequence length) they take as arguments."""

    capacity: int = 1_000_000  # records (env steps) kept, over all envs of this learner
    min_fill: int = 50_000  # records stored before the first replayed batch
    alpha: float = 0.6  # priority exponent (0 = uniform)
    beta: float = 0.4  # importance-weight exponent
    n_step: int = 3  # dqn: steps summed before bootstrapping
    frame_stack: int = 1  # frames stacked on axis 0 of the observation (Atari: 4); each stored once
    compress: str = ""  # "" | "lz4" (pip install fastrl[replay])
    memmap_dir: str = ""  # a directory: raw frames in a scratch file there (beyond RAM); "" keeps them in RAM
    threads: int = 2  # threads that copy / (de)compress frames
    batch_size: int = 512  # dqn: transitions per gradient step
    replay_ratio: float = 1.0  # dqn: transitions sampled per env step added
    vtrace_fraction: float = 0.0  # appo/impala: share of each batch drawn from replayed trajectories
    sequence_length: int = 80  # r2d2: steps per replayed sequence; sequences start every learner.rollout steps
    burn_in: int = 40  # r2d2: first steps of each sequence only warm the recurrent state (no loss, no gradient)


@dataclass
class EvalSettings:
    """Evaluation during training: its own envs, the latest published weights, off the hot path."""

    every_s: float = 0.0  # seconds between evaluations; 0 = off
    episodes: int = 10  # complete episodes per evaluation
    deterministic: bool = True  # argmax / mean actions (a Q-learner always acts greedily)
    num_envs: int = 10  # evaluation envs (at most eval.episodes are used), stepped by the evaluator alone
    video_every_s: float = 0.0  # seconds between short clips sent to TensorBoard / W&B; 0 = off


@dataclass
class InferenceSettings:
    """The inference batcher's policy."""

    # Pad each batch to one of a few sizes and run the policy through torch.compile (CUDA graphs
    # on a GPU): fewer kernel launches per batch; the first batches of each size pay the compile.
    compile: bool = False
    # Where the batcher runs the policy: "" = the run's `device`; cpu, or cuda:N (one process, not
    # under torchrun) to keep its small batches off the learner's GPU (README: one GPU or two).
    device: str = ""
    # On a CPU, a plain MLP policy over discrete actions (CartPole's) acts through numpy's BLAS
    # and numba instead of torch ops: infer() of 768 CartPole rows 250 -> 139 us here
    # (fastrl/mlp_policy.py).
    numpy_mlp: bool = True
    # Each rollout worker runs the policy on its own CPU for its own batches, and no batcher
    # process runs: no round trip through pipes and another process per batch. For small
    # networks whose batches are already large (CartPole's 512 envs a request), where the round
    # trip and the batcher's loop cost more than the forward pass (README: CartPole ratios).
    # Serial mode (everything in one process) acts inline either way.
    in_workers: bool = False


@dataclass
class LoggingSettings:
    wandb: bool = False  # log metrics, config, evaluations and videos to Weights & Biases (the [wandb] extra)
    wandb_project: str = "fastrl"
    wandb_entity: str = ""  # "" = your default W&B entity
    wandb_group: str = ""  # "" = no group


@dataclass
class ExpectSettings:
    """What a profile promises: ``metric`` (a metrics.jsonl key) reaches ``threshold`` within
    ``budget_env_steps`` env steps or ``budget_seconds`` of wall time on ``hardware``.
    scripts/bench_learning.py checks it; training never reads it. All empty: no promise."""

    metric: str = ""
    threshold: float = 0.0
    budget_env_steps: int = 0
    budget_seconds: float = 0.0
    hardware: str = ""  # what the budget holds on; required with budget_seconds (wall time depends on it)

    @property
    def stated(self) -> bool:
        return self != ExpectSettings()


@dataclass
class Config:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    train_for_env_steps: int = 1_000_000
    train_for_seconds: float = 0.0  # 0 = no time limit
    slots_per_env: int = 3  # trajectory slots per env: one filling, the rest queued for the learner
    report_every_s: float = 5.0
    checkpoint_every_s: float = 300.0
    keep_checkpoints: int = 3
    max_worker_restarts: int = 10  # rollout worker crashes tolerated within restart_window_s
    restart_window_s: float = 300.0
    dist_timeout_s: float = 120.0  # torch.distributed collectives wait this long for a peer, then fail
    serial: bool = False  # everything in one process, for debugging
    sample_only: bool = False  # profiling: the learner hands slots straight back without training
    # Child processes keep freed heap blocks for their next batch (fastrl.allocator): no page
    # faults per batch, resident memory stays at its peak.
    retain_freed_memory: bool = True
    # Added to the rollout workers' and the batcher's niceness (os.nice), so that when cores are
    # short the learner comes first; the actors still take any core it leaves idle. It pays where
    # a CPU learner bounds training (atari-appo on a CPU: 1.23x) and costs where the actors'
    # round trips do (atari-appo-cpu, cartpole-appo): see fastrl.process_utils.configure_child.
    actor_niceness: int = 0
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    inference: InferenceSettings = field(default_factory=InferenceSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    expect: ExpectSettings = field(default_factory=ExpectSettings)

    @property
    def trajectories_per_batch(self) -> int:
        return self.learner.batch_size // self.learner.rollout

    @property
    def total_envs(self) -> int:
        return self.env.num_workers * self.env.envs_per_worker

    @property
    def num_slots(self) -> int:
        return self.total_envs * self.slots_per_env

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {"env": EnvConfig, "model": ModelConfig, "learner": LearnerConfig, "replay": ReplaySettings,
            "eval": EvalSettings, "inference": InferenceSettings, "logging": LoggingSettings, "expect": ExpectSettings}
CHOICES = {
    "device": None,  # checked in validate(): auto, cpu, cuda, cuda:N
    "env.backend": ("auto", "envpool", "gymnasium", "factory"),
    "model.kind": ("auto", "mlp", "nature_cnn", "mnih2013_cnn", "impala_resnet"),
    "model.activation": ("tanh", "relu"),
    "model.core": ("none", "lstm", "gru"),
    "learner.algo": ("appo", "impala", "dqn", "r2d2"),
    "learner.precision": ("float32", "bfloat16", "auto"),
    "replay.compress": ("", "lz4"),
}


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


POSITIVE, NON_NEGATIVE, AT_LEAST_1, UNIT = Range(0, low_open=True), Range(0), Range(1), Range(0, 1)
# A duration beyond any run; the bound keeps datetime.timedelta (dist_timeout_s) from overflowing.
SECONDS = Range(0, 10**9, low_open=True)
# Units of one layer: beyond this, one layer's weight matrix alone outgrows any host (65536^2
# float32 is 16 GiB).
LAYER_WIDTH = Range(1, 65536)
# Every numeric key's allowed values (for a list key: each entry's), checked by check_section().
RANGES = {
    "seed": Range(0, 2**32 - 1),  # numpy's np.random.seed takes 32 bits
    "train_for_env_steps": NON_NEGATIVE,  # 0 = no step limit
    "train_for_seconds": Range(0, 10**9),  # 0 = no time limit
    "slots_per_env": Range(2),  # one filling, at least one queued for the learner
    "report_every_s": SECONDS,
    "checkpoint_every_s": SECONDS,
    "keep_checkpoints": AT_LEAST_1,
    "max_worker_restarts": NON_NEGATIVE,
    "restart_window_s": SECONDS,
    "dist_timeout_s": SECONDS,
    "actor_niceness": Range(0, 19),  # Linux's range; an unprivileged process may only raise it
    "env.num_workers": AT_LEAST_1,
    "env.envs_per_worker": AT_LEAST_1,
    # A worker sends generation_tag * num_splits + request in one byte (fastrl.rollout): at most
    # 128 splits leave two tags, so a restarted worker ignores replies meant for the one it replaced.
    "env.num_splits": Range(1, 128),
    "env.num_threads": NON_NEGATIVE,  # 0 = envpool's default
    "model.hidden_sizes": LAYER_WIDTH,
    "model.core_size": LAYER_WIDTH,
    "model.core_layers": AT_LEAST_1,
    "model.initial_log_std": Range(-5.0, 2.0, low_open=True, high_open=True),  # inside fastrl.heads.LOG_STD_RANGE
    "learner.rollout": AT_LEAST_1,
    "learner.batch_size": AT_LEAST_1,
    "learner.num_epochs": AT_LEAST_1,
    "learner.num_minibatches": AT_LEAST_1,
    "learner.lr": POSITIVE,
    "learner.adam_eps": POSITIVE,
    "learner.gamma": UNIT,
    "learner.vtrace_lambda": UNIT,
    "learner.clip_rho": POSITIVE,
    "learner.clip_c": POSITIVE,
    "learner.clip_pg_rho": POSITIVE,
    "learner.ppo_clip": POSITIVE,
    "learner.value_coef": NON_NEGATIVE,
    "learner.entropy_coef": NON_NEGATIVE,
    # clip_grad_norm_ scales gradients by max_grad_norm / norm: 0 zeroes them, < 0 flips them.
    "learner.max_grad_norm": POSITIVE,
    "learner.reward_clip": NON_NEGATIVE,  # 0 = off
    "learner.reward_scale": POSITIVE,
    "learner.max_policy_lag": NON_NEGATIVE,
    "learner.max_consecutive_skips": AT_LEAST_1,
    "learner.burn_in": NON_NEGATIVE,
    "learner.torch_threads": AT_LEAST_1,
    "learner.epsilon": UNIT,
    "learner.epsilon_alpha": NON_NEGATIVE,
    "learner.target_update_every": AT_LEAST_1,
    "replay.capacity": AT_LEAST_1,
    "replay.min_fill": NON_NEGATIVE,
    "replay.alpha": NON_NEGATIVE,  # 0 = uniform sampling
    "replay.beta": NON_NEGATIVE,
    "replay.n_step": AT_LEAST_1,
    "replay.sequence_length": AT_LEAST_1,
    "replay.burn_in": NON_NEGATIVE,
    "replay.frame_stack": AT_LEAST_1,
    "replay.threads": AT_LEAST_1,
    "replay.batch_size": AT_LEAST_1,
    "replay.replay_ratio": NON_NEGATIVE,  # > 0 for dqn, checked in _validate_replay
    "replay.vtrace_fraction": Range(0, 1, high_open=True),
    "eval.every_s": Range(0, 10**9),  # 0 = off
    "eval.episodes": AT_LEAST_1,
    "eval.num_envs": AT_LEAST_1,
    "eval.video_every_s": Range(0, 10**9),  # 0 = off
    "expect.threshold": Range(-math.inf),
    "expect.budget_env_steps": NON_NEGATIVE,
    "expect.budget_seconds": Range(0, 10**9),
}
# Keys only dqn reads: appo/impala ignore them, so there any finite value passes.
DQN_ONLY = ("learner.epsilon", "learner.epsilon_alpha", "learner.target_update_every")
FINITE = Range(-math.inf)


def _field_types(cls) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _known_keys() -> list[str]:
    keys = [k for k in _field_types(Config) if k not in SECTIONS]
    for section, cls in SECTIONS.items():
        keys += [f"{section}.{k}" for k in _field_types(cls)]
    return keys


def _unknown_key_error(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, _known_keys(), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ConfigError(f"unknown config key '{key}'{hint}; run `fastrl-train --list-keys` for all keys")


def _coerce(key: str, value, annotation):
    """Return ``value`` converted to ``annotation`` (from TOML or a --set string), or raise."""
    origin = typing.get_origin(annotation)
    from_string = isinstance(value, str) and annotation is not str
    try:
        if annotation is bool:
            if from_string:
                lowered = value.strip().lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return lowered in ("true", "1", "yes")
            if isinstance(value, bool):
                return value
            raise ValueError
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError
            if from_string:
                value = float(value.replace("_", "")) if "e" in value.lower() else int(value.replace("_", ""))
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                value = int(value)
            if not isinstance(value, int):
                raise ValueError
            return value
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value.replace("_", "")) if from_string else float(value)
        if annotation is str:
            if not isinstance(value, str):
                raise ValueError
            return value
        if origin is list:
            (item_type,) = typing.get_args(annotation)
            if from_string:
                value = [v for v in value.strip("[] ").split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise ValueError
            return [_coerce(key, v.strip() if isinstance(v, str) else v, item_type) for v in value]
        if annotation is dict or origin is dict:
            if from_string:
                value = tomllib.loads(f"v = {value}")["v"]
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (ValueError, TypeError, tomllib.TOMLDecodeError):
        pass
    type_name = getattr(annotation, "__name__", str(annotation))
    raise ConfigError(f"config key '{key}' expects {type_name}, got {value!r}")


def set_key(cfg: Config, key: str, value) -> None:
    """Set ``section.key`` (or a top-level key) on ``cfg``, type-checked."""
    parts = key.split(".")
    if len(parts) == 1 and parts[0] in _field_types(Config) and parts[0] not in SECTIONS:
        target, name = cfg, parts[0]
    elif len(parts) == 2 and parts[0] in SECTIONS and parts[1] in _field_types(SECTIONS[parts[0]]):
        target, name = getattr(cfg, parts[0]), parts[1]
    else:
        raise _unknown_key_error(key)
    setattr(target, name, _coerce(key, value, _field_types(type(target))[name]))


def apply_dict(cfg: Config, data: dict, prefix: str = "") -> None:
    """Apply a nested dict (a parsed profile or config.toml) onto ``cfg``."""
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix and key in SECTIONS:
            apply_dict(cfg, value, prefix=f"{key}.")
        else:
            set_key(cfg, full, value)


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got '{text}' (example: --set learner.lr=1e-3)")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def available_profiles() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in resources.files("fastrl.profiles").iterdir()
                  if p.name.endswith(".toml"))


def load_profile(name: str) -> Config:
    """Load a named profile (profiles/NAME.toml) or a path to a TOML file."""
    path = Path(name)
    if path.suffix == ".toml" and path.exists():
        source = path
    else:
        source = resources.files("fastrl.profiles") / f"{name}.toml"
        if not source.is_file():
            close = difflib.get_close_matches(name, available_profiles(), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"unknown profile '{name}': {hint}available: {', '.join(available_profiles())}")
    return config_from_toml(source, f"profile '{name}'")


def config_from_toml(source, label: str, ignored: tuple[str, ...] = ()) -> Config:
    """The config in ``source`` (a Path or a package resource), top-level keys ``ignored`` left
    out; ConfigError naming ``label`` (and, for a TOML error, the line) for a file that is not
    TOML in UTF-8 or holds a key or value that no config takes."""
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label} is not valid TOML: {exc}; correct it") from None
    for key in ignored:
        data.pop(key, None)
    cfg = Config()
    try:
        apply_dict(cfg, data)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    return cfg


def build_config(profile: str = DEFAULT_PROFILE, overrides: dict | None = None) -> Config:
    """A profile with ``overrides`` ({"learner.lr": 1e-3, ...}) applied, validated."""
    cfg = load_profile(profile)
    for key, value in (overrides or {}).items():
        set_key(cfg, key, value)
    validate(cfg)
    return cfg


def check_section(settings, section: str) -> None:
    """Raise ConfigError for the first key of one section outside its CHOICES or RANGES.

    ``settings`` is a section's dataclass (``section`` "env", "model", "learner" or "replay"), or
    a whole Config with ``section = ""`` for its top-level keys. validate() checks every section
    with it; classes that take a section directly (fastrl.replay's replays take a ReplaySettings)
    check theirs with it too, so research code that builds one by hand gets the same errors.
    """
    prefix = f"{section}." if section else ""
    for name in _field_types(type(settings)):
        key = prefix + name
        if key in SECTIONS:
            continue
        value = getattr(settings, name)
        choices = CHOICES.get(key)
        if choices is not None and value not in choices:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(choices)}, got '{value}'")
        allowed = RANGES.get(key)
        if allowed is None:
            continue
        if key in DQN_ONLY and settings.algo != "dqn":
            allowed = FINITE
        if isinstance(value, list):
            if not all(v in allowed for v in value):
                raise ConfigError(f"config key '{key}' entries must be {allowed}, got {value!r}")
        elif value not in allowed:
            raise ConfigError(f"config key '{key}' must be {allowed}, got {value!r}")


def is_device_name(name: str) -> bool:
    """auto (a GPU if one is visible), cpu, cuda or cuda:N: the devices a run or an evaluation takes."""
    return name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())


def validate(cfg: Config) -> None:
    """Raise ConfigError for values that cannot work, before any process starts."""
    dev = cfg.device
    if not is_device_name(dev):
        raise ConfigError(f"config key 'device' must be auto, cpu, cuda or cuda:N, got '{dev}'")
    dev = cfg.inference.device
    if not (dev in ("", "cpu") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ConfigError(f"config key 'inference.device' must be '' (the run's device), cpu or cuda:N, got '{dev}'")
    check_section(cfg, "")
    for section in SECTIONS:
        check_section(getattr(cfg, section), section)
    if cfg.train_for_env_steps == 0 and cfg.train_for_seconds == 0:
        raise ConfigError("set train_for_env_steps or train_for_seconds (both are 0: the run would never end)")
    if cfg.env.envs_per_worker % cfg.env.num_splits:
        raise ConfigError(
            f"env.envs_per_worker ({cfg.env.envs_per_worker}) must be divisible by env.num_splits "
            f"({cfg.env.num_splits})")
    if cfg.learner.batch_size % cfg.learner.rollout:
        raise ConfigError(
            f"learner.batch_size ({cfg.learner.batch_size}) must be a multiple of learner.rollout "
            f"({cfg.learner.rollout})")
    if cfg.trajectories_per_batch % cfg.learner.num_minibatches:
        raise ConfigError(
            f"learner.batch_size / learner.rollout ({cfg.trajectories_per_batch} trajectories) must be "
            f"divisible by learner.num_minibatches ({cfg.learner.num_minibatches})")
    _validate_replay(cfg)
    _validate_core(cfg)
    _validate_expect(cfg.expect)
    if cfg.learner.precision == "bfloat16" and cfg.learner.algo in Q_LEARNERS:
        raise ConfigError(f"learner.precision={cfg.learner.precision} is for appo/impala; {cfg.learner.algo} trains "
                          f"in float32: set learner.precision=float32 (or auto)")
    if cfg.learner.normalize_returns and cfg.learner.algo in Q_LEARNERS:
        raise ConfigError(f"learner.normalize_returns is for appo/impala; {cfg.learner.algo} keeps rewards in its "
                          f"replay as they arrived: set learner.normalize_returns=false (learner.reward_scale scales "
                          f"them)")
    if cfg.inference.compile and cfg.serial:
        raise ConfigError("inference.compile serves the inference process; serial mode runs the policy eagerly: "
                          "set serial=false or inference.compile=false")
    if cfg.inference.in_workers and (cfg.inference.compile or cfg.inference.device not in ("", "cpu")):
        raise ConfigError("inference.in_workers runs the policy eagerly on each worker's CPU: set "
                          "inference.compile=false and inference.device='' (or in_workers=false for the batcher)")
    if cfg.eval.video_every_s and not cfg.eval.every_s:
        raise ConfigError("eval.video_every_s records clips of evaluations: set eval.every_s > 0 too "
                          "(e.g. --set eval.every_s=60)")
    # The learner collects a batch while every env keeps one slot filling: more trajectories per
    # batch than the queued slots can ever hold would deadlock the run.
    queued = cfg.total_envs * (cfg.slots_per_env - 1)
    if cfg.trajectories_per_batch > queued:
        raise ConfigError(
            f"learner.batch_size needs {cfg.trajectories_per_batch} trajectories but the envs can queue "
            f"only {queued} (num_workers x envs_per_worker x (slots_per_env - 1)); lower learner.batch_size "
            f"to <= {queued * cfg.learner.rollout} or add envs/slots")


def _validate_core(cfg: Config) -> None:
    model, lcfg = cfg.model, cfg.learner
    if lcfg.algo == "r2d2" and model.core == "none":
        raise ConfigError("learner.algo=r2d2 needs a recurrent core: set model.core=lstm or gru")
    if lcfg.algo == "r2d2" and cfg.replay.burn_in >= cfg.replay.sequence_length:
        raise ConfigError(f"replay.burn_in ({cfg.replay.burn_in}) must be < replay.sequence_length "
                          f"({cfg.replay.sequence_length}): burn-in steps carry no loss")
    if lcfg.algo == "r2d2" and lcfg.burn_in:
        raise ConfigError("learner.burn_in is for appo/impala; r2d2 burns in replay.burn_in steps of each sequence")
    if model.core != "none" and lcfg.algo == "dqn":
        raise ConfigError(f"model.core={model.core} needs a sequence learner: use learner.algo=r2d2 (recurrent "
                          f"Ape-X DQN) instead of dqn, or model.core=none")
    if lcfg.burn_in and model.core == "none":
        raise ConfigError(f"learner.burn_in={lcfg.burn_in} only warms a recurrent state: set model.core=lstm or "
                          f"gru, or learner.burn_in=0")
    if lcfg.burn_in >= lcfg.rollout:
        raise ConfigError(f"learner.burn_in ({lcfg.burn_in}) must be < learner.rollout ({lcfg.rollout}): burn-in "
                          f"steps carry no loss, so some step of each trajectory must")
    if model.separate_critic and lcfg.algo in Q_LEARNERS:
        raise ConfigError(f"model.separate_critic is for learner.algo=appo or impala; {lcfg.algo}'s dueling "
                          f"Q-network has no critic: set model.separate_critic=false")
    if model.separate_critic and model.core != "none":
        raise ConfigError(f"model.separate_critic needs a feed-forward model; with model.core={model.core} the "
                          f"policy and value share the core: set model.separate_critic=false or model.core=none")


def _validate_expect(expect: ExpectSettings) -> None:
    """A promise, when a profile states one, names its metric, one budget, and the hardware a
    wall-time budget holds on."""
    if not expect.stated:
        return
    fields = "[expect] metric, threshold, budget_env_steps or budget_seconds, hardware"
    if not expect.metric:
        raise ConfigError(f"expect.metric is empty: name the metrics key the promise is about ({fields})")
    if bool(expect.budget_env_steps) == bool(expect.budget_seconds):
        raise ConfigError(f"[expect] needs exactly one budget, budget_env_steps or budget_seconds, got "
                          f"{expect.budget_env_steps} and {expect.budget_seconds} ({fields})")
    if expect.budget_seconds and not expect.hardware:
        raise ConfigError("expect.budget_seconds is wall time: say which hardware it holds on with expect.hardware "
                          "(e.g. \"2-core CPU\")")


def _validate_replay(cfg: Config) -> None:
    replay, lcfg = cfg.replay, cfg.learner
    uses_replay = lcfg.algo in Q_LEARNERS or replay.vtrace_fraction > 0
    if replay.vtrace_fraction > 0 and lcfg.algo in Q_LEARNERS:
        raise ConfigError(f"replay.vtrace_fraction is for learner.algo=appo or impala; {lcfg.algo} replays every batch")
    if lcfg.algo in Q_LEARNERS and replay.replay_ratio <= 0:
        raise ConfigError(f"config key 'replay.replay_ratio' must be > 0 for {lcfg.algo}, got {replay.replay_ratio}")
    # The replay gives every env an equal share: capacity rounds down to a multiple of the envs.
    held = replay.capacity // cfg.total_envs * cfg.total_envs
    if uses_replay and replay.min_fill > held:
        raise ConfigError(f"replay.min_fill ({replay.min_fill}) exceeds the {held} records replay.capacity "
                          f"({replay.capacity}) holds for {cfg.total_envs} envs: sampling could never start; "
                          f"lower replay.min_fill")
    if uses_replay:
        horizon = {"dqn": replay.n_step, "r2d2": replay.sequence_length}.get(lcfg.algo, lcfg.rollout)
        per_env = replay.capacity // cfg.total_envs
        if per_env < replay.frame_stack + horizon:
            raise ConfigError(
                f"replay.capacity {replay.capacity} leaves {per_env} records per env for {cfg.total_envs} envs; "
                f"each needs >= frame_stack + {dict(dqn='n_step', r2d2='replay.sequence_length').get(lcfg.algo, 'learner.rollout')} = "
                f"{replay.frame_stack + horizon}: raise replay.capacity")


def to_toml(cfg: Config) -> str:
    """The full resolved config as TOML: top-level keys first, then one table per section.
    tomli_w quotes keys and escapes strings, so any env.kwargs made of TOML values round-trips."""
    try:
        return tomli_w.dumps(cfg.to_dict())
    except TypeError as exc:  # only env.kwargs can hold values TOML has no type for (None, objects)
        raise ConfigError(f"config.toml cannot hold env.kwargs {cfg.env.kwargs!r}: {exc}; use strings, "
                          f"numbers, booleans, lists and tables") from None


def flat_config(config: dict) -> dict:
    """{"learner": {"lr": 0.001}} -> {"learner.lr": 0.001}; tables inside a section (env.kwargs)
    stay one value, as they are one setting."""
    flat = {}
    for key, value in config.items():
        if key in SECTIONS:
            flat.update({f"{key}.{name}": setting for name, setting in value.items()})
        else:
            flat[key] = value
    return flat


# Config keys a checkpoint's weights depend on: a resumed or evaluated run must keep them.
WEIGHTS_KEY_SECTIONS = ("model",)
WEIGHTS_KEYS = ("env.id", "env.kwargs", "learner.algo")


def weights_mismatch(saved: dict, cfg: Config) -> str:
    """``key: saved -> asked`` for every key that shapes the weights and differs between
    ``saved`` (a checkpoint's config, as Config.to_dict() wrote it) and ``cfg``; "" if none."""
    before, now = flat_config(saved), flat_config(cfg.to_dict())
    keys = [k for k in now if k in WEIGHTS_KEYS or k.split(".")[0] in WEIGHTS_KEY_SECTIONS]
    return ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in keys if before.get(k) != now[k])


def load_run_config(run_dir: Path) -> Config:
    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise ConfigError(f"no config.toml in '{run_dir}': pass the run directory that fastrl-train wrote")
    # Older run directories hold the promise as a line of text, `expected`: documentation that
    # never changed a run, so it is not carried over.
    return config_from_toml(path, f"'{path}'", ignored=("expected",))
