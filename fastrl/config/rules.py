"""The rules between keys: what a Config must satisfy beyond each key's own range."""
from __future__ import annotations

import dataclasses

from .schema import (
    BF16_LEARNERS,
    INFO_KEY,
    KEYS,
    MAX_EVAL_OPPONENTS,
    PBT_MUTABLE,
    PBT_OBJECTIVES,
    POLICY_NAME,
    Q_LEARNERS,
    REPLAY_LEARNERS,
    RUN_DEVICES,
    SAC_PBT_MEMBER_KEYS,
    SAC_PBT_MUTABLE,
    SECTIONS,
    VTRACE,
    VTRACE_PBT_MEMBER_KEYS,
    VTRACE_PBT_MUTABLE,
    Config,
    ConfigError,
    ExpectConfig,
    objective_info_key,
)


def check_section(settings, section: str, algo: str | None = None) -> None:
    """Raise ConfigError for the first key of one section outside the values it allows.

    ``settings`` is a section's dataclass (``section`` "env", "model", "learner", ...), or a whole
    Config with ``section = ""`` for its top-level keys; ``algo`` is the run's learner.algo (a key
    declared with ``unread`` allows that instead under an algorithm that does not read it), None
    to check every key as read. validate() checks every section with it; classes that take a
    section directly (fastrl.replay.buffer's replays take a ReplayConfig) check theirs with it too, so
    research code that builds one by hand gets the same errors.
    """
    prefix = f"{section}." if section else ""
    for f in dataclasses.fields(settings):
        declared = KEYS.get(prefix + f.name)
        if declared is not None:  # None: a section of Config, checked on its own
            declared.check(getattr(settings, f.name), algo)


def is_device_name(name: str) -> bool:
    """auto (a GPU if one is visible), cpu, cuda or cuda:N: the devices a run or an evaluation takes."""
    return name in RUN_DEVICES


def validate(cfg: Config) -> None:
    """Raise ConfigError for values that cannot work, before any process starts."""
    check_section(cfg, "", cfg.learner.algo)
    for section in SECTIONS:
        check_section(getattr(cfg, section), section, cfg.learner.algo)
    if cfg.train_for_env_steps == 0 and cfg.train_for_seconds == 0:
        raise ConfigError("set train_for_env_steps or train_for_seconds (both are 0: the run would never end)")
    if cfg.report_every_env_steps and not cfg.serial:
        raise ConfigError("report_every_env_steps is for serial runs (parallel runs report every report_every_s): "
                          "set serial=true or report_every_env_steps=0")
    if cfg.env.envs_per_worker % cfg.env.num_splits:
        raise ConfigError(
            f"env.envs_per_worker ({cfg.env.envs_per_worker}) must be divisible by env.num_splits "
            f"({cfg.env.num_splits})")
    if cfg.env.resize and len(cfg.env.resize) != 2:
        raise ConfigError(f"env.resize is [height, width] (or [] to keep the size), got {cfg.env.resize!r}")
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
    if cfg.learner.precision == "bfloat16" and cfg.learner.algo not in BF16_LEARNERS:
        raise ConfigError(f"learner.precision={cfg.learner.precision} is for {'/'.join(BF16_LEARNERS)}; "
                          f"{cfg.learner.algo} trains in float32: set learner.precision=float32 (or auto)")
    if cfg.learner.normalize_returns and cfg.learner.algo in REPLAY_LEARNERS:
        raise ConfigError(f"learner.normalize_returns is for appo/impala; {cfg.learner.algo} keeps rewards in its "
                          f"replay as they arrived: set learner.normalize_returns=false (learner.reward_scale scales "
                          f"them)")
    if cfg.inference.compile and cfg.serial:
        raise ConfigError("inference.compile serves the inference process; serial mode runs the policy eagerly: "
                          "set serial=false or inference.compile=false")
    if cfg.inference.in_workers and (cfg.inference.compile or cfg.inference.device not in ("", "cpu")):
        raise ConfigError("inference.in_workers runs the policy eagerly on each worker's CPU: set "
                          "inference.compile=false and inference.device='' (or in_workers=false for the batcher)")
    _validate_exploration(cfg)
    if cfg.eval.video_every_s and not cfg.eval.every_s:
        raise ConfigError("eval.video_every_s records clips of evaluations: set eval.every_s > 0 too "
                          "(e.g. --set eval.every_s=60)")
    _validate_eval_opponents(cfg)
    _validate_policies(cfg)
    _validate_info_keys(cfg)
    _validate_pbt(cfg)
    # The learner collects a batch while every env keeps one slot filling: more trajectories per
    # batch than the queued slots can ever hold would deadlock the run.
    queued = cfg.total_envs * (cfg.slots_per_env - 1)
    if cfg.trajectories_per_batch > queued:
        raise ConfigError(
            f"learner.batch_size needs {cfg.trajectories_per_batch} trajectories but the envs can queue "
            f"only {queued} (num_workers x envs_per_worker x (slots_per_env - 1)); lower learner.batch_size "
            f"to <= {queued * cfg.learner.rollout} or add envs/slots")


def _validate_exploration(cfg: Config) -> None:
    lcfg = cfg.learner
    if lcfg.algo not in Q_LEARNERS:
        return
    late_after, decay, gate = lcfg.epsilon_late_after_steps, lcfg.epsilon_decay_steps, lcfg.epsilon_late_return_episodes
    if late_after and late_after < decay:
        raise ConfigError(f"learner.epsilon_late_after_steps ({late_after}) must be >= learner.epsilon_decay_steps "
                          f"({decay}): the late rate follows the decay; raise it or set it to 0 (off)")
    if gate and not late_after:
        raise ConfigError("learner.epsilon_late_return_episodes gates the late rate, which is off: set "
                          "learner.epsilon_late_after_steps (>= learner.epsilon_decay_steps) or set it to 0")
    if lcfg.epsilon_late_min_return and not gate:
        raise ConfigError("learner.epsilon_late_min_return is read with learner.epsilon_late_return_episodes > 0: "
                          "set that (e.g. 16) or leave the return at 0")


def _validate_core(cfg: Config) -> None:
    model, lcfg = cfg.model, cfg.learner
    if lcfg.algo == "r2d2" and model.core == "none":
        raise ConfigError("learner.algo=r2d2 needs a recurrent core: set model.core=lstm or gru")
    if lcfg.algo == "r2d2" and cfg.replay.burn_in >= cfg.replay.sequence_length:
        raise ConfigError(f"replay.burn_in ({cfg.replay.burn_in}) must be < replay.sequence_length "
                          f"({cfg.replay.sequence_length}): burn-in steps carry no loss")
    if lcfg.algo == "r2d2" and lcfg.burn_in:
        raise ConfigError("learner.burn_in is for appo/impala; r2d2 burns in replay.burn_in steps of each sequence")
    if model.core != "none" and lcfg.algo == "sac":
        raise ConfigError(f"model.core={model.core}: learner.algo=sac trains a feed-forward actor and critics on "
                          f"single transitions; set model.core=none")
    if model.core != "none" and lcfg.algo == "dqn":
        raise ConfigError(f"model.core={model.core} needs a sequence learner: use learner.algo=r2d2 (recurrent "
                          f"Ape-X DQN) instead of dqn, or model.core=none")
    if lcfg.burn_in and model.core == "none":
        raise ConfigError(f"learner.burn_in={lcfg.burn_in} only warms a recurrent state: set model.core=lstm or "
                          f"gru, or learner.burn_in=0")
    if lcfg.burn_in >= lcfg.rollout:
        raise ConfigError(f"learner.burn_in ({lcfg.burn_in}) must be < learner.rollout ({lcfg.rollout}): burn-in "
                          f"steps carry no loss, so some step of each trajectory must")
    if model.separate_critic and lcfg.algo in REPLAY_LEARNERS:
        networks = ("twin critics have encoders of their own" if lcfg.algo == "sac"
                    else "dueling Q-network has no critic")
        raise ConfigError(f"model.separate_critic is for learner.algo=appo or impala; {lcfg.algo}'s {networks}: set "
                          f"model.separate_critic=false")
    if model.separate_critic and model.core != "none":
        raise ConfigError(f"model.separate_critic needs a feed-forward model; with model.core={model.core} the "
                          f"policy and value share the core: set model.separate_critic=false or model.core=none")


# An opponent plays the game's own actions, which env.actions would renumber.
OPPONENT_ACTIONS = ("{option} plays the game's own actions, and env.actions narrows the policy's to some of "
                    "them: set env.actions = [] to play against an opponent")


def _validate_eval_opponents(cfg: Config) -> None:
    """eval.opponents' form; whether each can play the run's env is preflight's check."""
    opponents = cfg.eval.opponents
    if opponents and not cfg.eval.every_s:
        raise ConfigError("eval.opponents are played in the evaluations during training: set eval.every_s > 0 too "
                          "(e.g. --set eval.every_s=60)")
    if opponents and cfg.env.actions:
        raise ConfigError(OPPONENT_ACTIONS.format(option="eval.opponents"))
    if len(opponents) > MAX_EVAL_OPPONENTS:
        raise ConfigError(f"eval.opponents lists {len(opponents)} opponents and an evaluation plays at most "
                          f"{MAX_EVAL_OPPONENTS}: drop some (fastrl-eval --opponent plays any one after training)")
    if cfg.eval.best_by == "opponents" and not opponents:
        raise ConfigError("eval.best_by=opponents keeps best.pt by the score against eval.opponents, and none are "
                          "set: list them (e.g. --set 'eval.opponents=[\"random\"]') or set eval.best_by=return")
    if cfg.best_by_opponents and cfg.pbt.population > 1:
        raise ConfigError("eval.opponents play a population's first member only, so they cannot rank its members "
                          "for best.pt: set eval.best_by=return")
    if len(set(opponents)) != len(opponents):
        raise ConfigError(f"eval.opponents lists an opponent twice ({opponents}): each is reported under its name "
                          f"(eval/<opponent>/win_rate), so list each once")


def _validate_policies(cfg: Config) -> None:
    """The checks that need no env: names, mapping's form, self-play's one policy; ConfigError."""
    pcfg = cfg.policies
    if not pcfg.names:
        raise ConfigError("policies.names is empty: name at least one policy (the default is [\"main\"])")
    bad = [name for name in pcfg.names if not POLICY_NAME.fullmatch(name)]
    if bad:
        raise ConfigError(f"policies.names {bad[0]!r}: a policy name is letters, digits, '_', '-' and '.' (it names "
                          f"metrics and checkpoint entries)")
    if len(set(pcfg.names)) != len(pcfg.names):
        raise ConfigError(f"policies.names lists a policy twice ({pcfg.names}): give each a name of its own")
    if pcfg.mapping not in ("shared", "per_agent", "by_kind") and ":" not in pcfg.mapping:
        raise ConfigError(f"policies.mapping={pcfg.mapping!r}: use shared, per_agent, by_kind or module:fn "
                          f"(fn(agent_id) returns a policy name)")
    if pcfg.mapping == "shared" and len(pcfg.names) > 1:
        raise ConfigError(f"policies.mapping=shared sends every agent to {pcfg.names[0]!r}, leaving "
                          f"{', '.join(pcfg.names[1:])} unused: set policies.mapping to per_agent, by_kind or "
                          f"module:fn")
    if cfg.selfplay.enabled and (len(pcfg.names) > 1 or pcfg.mapping != "shared"):
        raise ConfigError("selfplay.enabled plays one policy against its own snapshots: keep one policy "
                          "(policies.mapping=shared)")
    _validate_scripted_opponents(cfg)


def _validate_scripted_opponents(cfg: Config) -> None:
    """selfplay.scripted_opponents' form; whether each can play the run's env is preflight's check."""
    sp = cfg.selfplay
    scripted = sp.scripted_opponents
    if (scripted or sp.scripted_prob) and not sp.enabled:
        raise ConfigError("selfplay.scripted_opponents play in self-play's league: set selfplay.enabled=true, or "
                          "play them in evaluations with eval.opponents")
    if sp.scripted_prob and not scripted:
        raise ConfigError(f"selfplay.scripted_prob={sp.scripted_prob:g} draws from selfplay.scripted_opponents, and "
                          f"none are listed: list them (e.g. --set 'selfplay.scripted_opponents=[\"random\"]')")
    if scripted and not sp.scripted_prob:
        raise ConfigError("selfplay.scripted_opponents would play no game with selfplay.scripted_prob = 0: set it "
                          "(e.g. --set selfplay.scripted_prob=0.2)")
    if scripted and cfg.env.actions:
        raise ConfigError(OPPONENT_ACTIONS.format(option="selfplay.scripted_opponents"))
    if len(set(scripted)) != len(scripted):
        raise ConfigError(f"selfplay.scripted_opponents lists an opponent twice ({scripted}): each is reported under "
                          f"its name (league/scripted/<opponent>/win_rate), so list each once")


def _validate_info_keys(cfg: Config) -> None:
    bad = [k for k in cfg.env.info_keys if not INFO_KEY.fullmatch(k)]
    if bad:
        raise ConfigError(f"env.info_keys {bad[0]!r}: name a key of the env's info dict (letters, digits, '_', '-' "
                          f"and '.'; it names the metric info/<key>)")
    if len(set(cfg.env.info_keys)) != len(cfg.env.info_keys):
        raise ConfigError(f"env.info_keys lists a key twice ({cfg.env.info_keys}): list each once")


def _validate_pbt(cfg: Config) -> None:
    pbt = cfg.pbt
    info_key = objective_info_key(pbt.objective)
    if pbt.objective not in PBT_OBJECTIVES and not (info_key and INFO_KEY.fullmatch(info_key)):
        raise ConfigError(f"pbt.objective={pbt.objective!r} is not an objective: use {' or '.join(PBT_OBJECTIVES)}, "
                          f"or info/<key> for a number the env reports in its info at an episode's end")
    if pbt.population == 1:
        raise ConfigError("pbt.population=1 is a single run: set 2 or more members, or 0 for no population")
    if pbt.population == 0:
        if pbt.start:
            raise ConfigError("pbt.start sets members' start values: set pbt.population too")
        return
    algo = cfg.learner.algo
    if algo not in (*VTRACE, "sac"):
        raise ConfigError(f"pbt trains appo, impala or sac members; learner.algo={algo} is not supported "
                          f"with pbt.population yet: set learner.algo=appo")
    if cfg.policies.names != ["main"] or cfg.policies.mapping != "shared" or cfg.selfplay.enabled:
        raise ConfigError("pbt makes its members the run's policies: leave [policies] at its defaults and "
                          "selfplay.enabled=false")
    unknown = [k for k in pbt.mutable if k not in PBT_MUTABLE]
    if unknown:
        raise ConfigError(f"pbt.mutable {unknown[0]!r} cannot be perturbed; pick from {', '.join(PBT_MUTABLE)}")
    # A perturbed value the members' updates never read would only relabel them.
    readable = SAC_PBT_MUTABLE if algo == "sac" else VTRACE_PBT_MUTABLE
    unread = [k for k in pbt.mutable if k not in readable]
    if unread:
        raise ConfigError(f"pbt.mutable {unread[0]!r} is not read by learner.algo={algo}'s updates: perturb "
                          f"{', '.join(readable)} (e.g. --set 'pbt.mutable=[\"learner.lr\"]')")
    member_keys = SAC_PBT_MEMBER_KEYS if algo == "sac" else VTRACE_PBT_MEMBER_KEYS
    unread = [k for k in pbt.start if k not in member_keys]
    if unread:
        raise ConfigError(f"pbt.start.{unread[0]} is not read by learner.algo={algo}'s members: start them apart in "
                          f"{', '.join(member_keys)}")
    if not pbt.perturb:
        raise ConfigError("pbt.perturb is empty: give the factors a mutable value is multiplied by, e.g. [0.8, 1.25]")
    for key, values in pbt.start.items():
        if len(values) != pbt.population:
            raise ConfigError(f"pbt.start.{key} has {len(values)} values for {pbt.population} members: give one "
                              f"per member")
    if pbt.objective == "eval_return_mean" and not cfg.eval.every_s:
        raise ConfigError("pbt.objective=eval_return_mean ranks members by their evaluations during training, which "
                          "are off: set eval.every_s > 0 (e.g. --set eval.every_s=60)")


def _validate_expect(expect: ExpectConfig) -> None:
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
    uses_replay = lcfg.algo in REPLAY_LEARNERS or replay.vtrace_fraction > 0
    if replay.vtrace_fraction > 0 and lcfg.algo in REPLAY_LEARNERS:
        raise ConfigError(f"replay.vtrace_fraction is for learner.algo=appo or impala; {lcfg.algo} replays every batch")
    if replay.checkpoint and not uses_replay:
        raise ConfigError(f"replay.checkpoint saves the replay, and learner.algo={lcfg.algo} keeps none unless "
                          f"replay.vtrace_fraction > 0: set replay.checkpoint=false")
    if lcfg.algo in REPLAY_LEARNERS and replay.replay_ratio <= 0:
        raise ConfigError(f"config key 'replay.replay_ratio' must be > 0 for {lcfg.algo}, got {replay.replay_ratio}")
    # The replay gives every env an equal share: capacity rounds down to a multiple of the envs.
    held = replay.capacity // cfg.total_envs * cfg.total_envs
    if uses_replay and replay.min_fill > held:
        raise ConfigError(f"replay.min_fill ({replay.min_fill}) exceeds the {held} records replay.capacity "
                          f"({replay.capacity}) holds for {cfg.total_envs} envs: sampling could never start; "
                          f"lower replay.min_fill")
    if uses_replay:
        horizon = {"dqn": replay.n_step, "sac": replay.n_step, "r2d2": replay.sequence_length}.get(lcfg.algo,
                                                                                                    lcfg.rollout)
        horizon_key = {"dqn": "n_step", "sac": "n_step", "r2d2": "replay.sequence_length"}.get(lcfg.algo,
                                                                                                "learner.rollout")
        per_env = replay.capacity // cfg.total_envs
        if per_env < replay.frame_stack + horizon:
            raise ConfigError(
                f"replay.capacity {replay.capacity} leaves {per_env} records per env for {cfg.total_envs} envs; "
                f"each needs >= frame_stack + {horizon_key} = "
                f"{replay.frame_stack + horizon}: raise replay.capacity")
