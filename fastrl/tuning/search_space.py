"""What fastrl-sweep searches and what it scores: the ``--param`` distributions over config keys,
and the ``--objective`` metric, each checked against the config before any trial starts.

A ``--param`` is ``KEY=DISTRIBUTION:ARGS``:

- ``uniform:LOW:HIGH[:STEP]`` and ``loguniform:LOW:HIGH`` for a float key (loguniform needs LOW > 0);
- ``int:LOW:HIGH[:STEP]`` and ``intlog:LOW:HIGH`` for an integer key, both ends included;
- ``choice:A,B,...`` for any key, each value written as ``--set`` takes it (a list in brackets,
  ``choice:[64,64],[128,128]``).

Each becomes the Optuna distribution of the same name (FloatDistribution, IntDistribution,
CategoricalDistribution). A trial's value goes to its run as ``--set KEY=VALUE``, so a sampled
value means exactly what the same ``--set`` would.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from ..config import INFO_PREFIX, KEYS, PBT_START, Config, ConfigError, Range, get_value, set_user_value, validate
from ..evaluation.evaluator import OPPONENT_STATS
from ..reporting.metrics import (
    EVALUATION,
    INFERENCE_TIMINGS,
    LEAGUE,
    LEARNER_STATS,
    POLICY,
    PROMOTED_LEARNER_STATS,
    REPORT,
    WORKER_TIMINGS,
)

DISTRIBUTIONS = ("uniform", "loguniform", "int", "intlog", "choice")
NUMERIC = {"uniform": float, "loguniform": float, "int": int, "intlog": int}

# The budget and the trial's place are the sweep's to set.
SWEEP_OWNED_KEYS = ("train_for_env_steps", "train_for_seconds")

# The numeric metrics.jsonl keys, from their declaration in fastrl.reporting.metrics.
REPORT_KEYS = tuple(REPORT)
EVAL_KEYS = tuple(EVALUATION)
POLICY_KEYS = tuple(POLICY)
LEAGUE_KEYS = tuple(LEAGUE)


@dataclass(frozen=True)
class Param:
    """One ``--param``: a config key and the distribution its trials draw from.

    ``choices`` holds each choice's text as ``--set`` takes it; ``values`` the same choices as
    Optuna stores them (the key's number or bool where it is one, else the text)."""

    key: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    choices: tuple[str, ...] = ()
    values: tuple = ()

    @property
    def spec(self) -> str:
        """The ``--param`` text this parameter is, written one way (a study records it)."""
        if self.kind == "choice":
            return f"{self.key}=choice:{','.join(self.choices)}"
        step = "" if self.step is None else f":{self.step:g}"
        return f"{self.key}={self.kind}:{self.low:g}:{self.high:g}{step}"

    def distribution(self):
        """The Optuna distribution of this parameter."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "choice":
            return CategoricalDistribution(self.values)
        log = self.kind in ("loguniform", "intlog")
        if NUMERIC[self.kind] is int:
            return IntDistribution(int(self.low), int(self.high), log=log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=log, step=self.step)

    def set_text(self, value) -> str:
        """``value`` (as Optuna gives it) as the text of ``--set KEY=...``."""
        if self.kind == "choice":
            return self.choices[self.values.index(value)]
        return str(int(value)) if NUMERIC[self.kind] is int else repr(float(value))

    def endpoints(self) -> tuple[str, ...]:
        """The texts of the values that bound this parameter: both ends of a range, every choice."""
        if self.kind == "choice":
            return self.choices
        return self.set_text(self.low), self.set_text(self.high)


def parse_param(text: str) -> Param:
    """A ``--param KEY=DISTRIBUTION:ARGS`` (see the module docstring); ConfigError for bad input."""
    usage = "(e.g. --param learner.lr=loguniform:1e-5:1e-2)"
    key, eq, spec = text.partition("=")
    key, spec = key.strip(), spec.strip()
    if not eq or not key or not spec:
        raise ConfigError(f"--param expects KEY=DISTRIBUTION:ARGS, got '{text}' {usage}")
    kind, _, args = spec.partition(":")
    kind = kind.strip()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"--param {key}: unknown distribution '{kind}'; use one of {', '.join(DISTRIBUTIONS)} "
                          f"{usage}")
    if kind == "choice":
        choices = tuple(c.strip() for c in _split_choices(args))
        if not choices or not all(choices):
            raise ConfigError(f"--param {key}=choice: needs values separated by commas, got '{args}' "
                              f"(e.g. --param learner.batch_size=choice:1024,2048)")
        if len(set(choices)) != len(choices):
            raise ConfigError(f"--param {key}=choice: lists a value twice: '{args}'")
        return Param(key, kind, choices=choices)
    parts = args.split(":")
    with_step = kind in ("uniform", "int")
    if len(parts) not in ((2, 3) if with_step else (2,)):
        form = f"{kind}:LOW:HIGH" + ("[:STEP]" if with_step else "")
        raise ConfigError(f"--param {key}={spec}: expected {form}")
    number = NUMERIC[kind]
    try:
        low, high, *step = (_number(part, number) for part in parts)
    except ValueError:
        raise ConfigError(f"--param {key}={spec}: {kind} takes {number.__name__} bounds, got '{args}'") from None
    if not low < high:
        raise ConfigError(f"--param {key}={spec}: the range is {'empty' if low == high else 'inverted'}; "
                          f"give LOW < HIGH")
    if kind in ("loguniform", "intlog") and low <= 0:
        raise ConfigError(f"--param {key}={spec}: a log scale needs LOW > 0")
    step_value = step[0] if step else None
    if step_value is not None and not step_value > 0:
        raise ConfigError(f"--param {key}={spec}: STEP must be > 0")
    return Param(key, kind, low, high, step_value)


def _number(text: str, number: type) -> float:
    value = float(text.strip().replace("_", ""))
    if not math.isfinite(value) or (number is int and not value.is_integer()):
        raise ValueError(text)
    return number(value)


def _split_choices(text: str) -> list[str]:
    """``a,b,[1,2],{x=1,y=2}`` -> ``['a', 'b', '[1,2]', '{x=1,y=2}']``: commas inside brackets,
    braces or quotes belong to the value."""
    parts, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def check_params(params: list[Param], cfg: Config, overrides: list[str]) -> list[Param]:
    """``params`` as the sweep will draw them, checked against ``cfg`` (the profile with every
    ``--set``): each key exists, is not set by ``--set`` or owned by the sweep, takes its
    distribution's type, and every bound is a value the config accepts. ConfigError otherwise."""
    seen, set_keys = set(), {text.partition("=")[0].strip() for text in overrides}
    checked = []
    for param in params:
        key = KEYS.get(param.key)
        if param.key.startswith(PBT_START):
            raise ConfigError(f"--param {param.key}: pbt.start gives each member a value and a trial draws one; sweep "
                              f"{param.key[len(PBT_START):]} (every member starts from it, pbt.jitter spreads them) "
                              f"or give pbt.start with --set")
        if key is None:
            set_user_value(cfg, param.key, None)  # raises the config's unknown-key error, with its suggestions
        if param.key in seen:
            raise ConfigError(f"--param {param.key} is given twice: keep one")
        if param.key in set_keys:
            raise ConfigError(f"{param.key} is both a --param and a --set: drop one")
        if param.key in SWEEP_OWNED_KEYS:
            raise ConfigError(f"--param {param.key}: the sweep sets each trial's budget; use --budget-env-steps "
                              f"or --budget-seconds")
        seen.add(param.key)
        if param.kind == "choice":
            param = _typed_choices(param, cfg)
        elif not (key.type is float or (key.type is int and NUMERIC[param.kind] is int)):
            fits = "int or intlog" if key.type is int else "choice" if key.type is not float else ""
            raise ConfigError(f"--param {param.spec}: {param.key} is {getattr(key.type, '__name__', key.type)}: "
                              f"use {fits or 'uniform, loguniform, int or intlog'}")
        if isinstance(key.allowed, Range) and param.kind != "choice":
            for end in (param.low, param.high):
                if end not in key.allowed:
                    raise ConfigError(f"--param {param.spec}: {param.key} must be {key.allowed}, and {end:g} is "
                                      f"not; narrow the range")
        for text in param.endpoints():
            try:
                configured(cfg, [(param.key, text)])
            except ConfigError as exc:
                raise ConfigError(f"--param {param.spec}: with {param.key}={text}: {exc}") from None
        checked.append(param)
    return checked


def configured(cfg: Config, values) -> Config:
    """A copy of ``cfg`` with ``values`` set, ``(key, value)`` pairs (a value as ``--set`` or TOML
    gives it), and validated. ConfigError, one line, for a value the config refuses, and for one
    of a type a check did not expect (its TypeError): a sweep refuses it as it refuses the rest."""
    cfg = copy.deepcopy(cfg)
    try:
        for key, value in values:
            set_user_value(cfg, key, value)
        validate(cfg)
    except TypeError as exc:
        raise ConfigError(f"a value of a type the config's checks do not take ({exc}): check the types of the "
                          f"--set and --param values") from None
    return cfg


def _typed_choices(param: Param, cfg: Config) -> Param:
    """The choices as the key's values: numbers and bools as Optuna can plot them, other types
    (strings, lists, tables) as their text."""
    values = []
    for text in param.choices:
        probe = copy.deepcopy(cfg)
        try:
            set_user_value(probe, param.key, text)
        except ConfigError as exc:
            raise ConfigError(f"--param {param.spec}: {exc}") from None
        value = get_value(probe, param.key)
        values.append(value if isinstance(value, (bool, int, float)) else text)
    if len(set(values)) != len(values):
        raise ConfigError(f"--param {param.spec}: two choices are the same value; keep one")
    return Param(param.key, param.kind, choices=param.choices, values=tuple(values))


def check_objective(objective: str, cfg: Config) -> None:
    """ConfigError unless ``objective`` is a number fastrl writes into metrics.jsonl for ``cfg``
    (the run's headline figures, learner/*, rollout/*, inference/*, eval_* with evaluation,
    eval/<opponent>/*, info/<key> for Config.info_keys, policy/<name>/* with several policies,
    member/<k>/* with a population, league/* with self-play)."""
    if objective in objective_keys(cfg):
        return
    if objective in EVAL_KEYS:
        raise ConfigError(f"--objective {objective} needs evaluation during training: add --set eval.every_s=60 "
                          f"(or another period)")
    parts = objective.split("/")
    if parts[0] == "policy" and len(parts) >= 3 and ("/".join(parts[2:]) in POLICY_KEYS
                                                      or "/".join(parts[2:]) in _learner_keys()):
        if len(cfg.policies.names) > 1 or cfg.policies.mapping != "shared":
            return  # names are the agents' (or their kinds') or a callable's: known once the env is made
        raise ConfigError(f"--objective {objective}: policy/<name>/ figures are written with several policies "
                          f"([policies]); use {'/'.join(parts[2:])}")
    if parts[0] == "member" and len(parts) >= 3 and cfg.pbt.population < 2:
        raise ConfigError(f"--objective {objective}: member/<k>/ figures are written by population-based training: "
                          f"set pbt.population (or use {'/'.join(parts[2:])})")
    if parts[0] == "league" and not cfg.selfplay.enabled and len(parts) == 2 and parts[1] in LEAGUE_KEYS:
        raise ConfigError(f"--objective {objective} is written with self-play: set selfplay.enabled=true")
    if parts[0] == "eval" and len(parts) == 3 and parts[2] in OPPONENT_STATS:
        raise ConfigError(f"--objective {objective}: no opponent '{parts[1]}' in eval.opponents "
                          f"{cfg.eval.opponents}; add it (and eval.every_s)")
    raise ConfigError(f"--objective {objective} is not a metrics.jsonl key fastrl writes; use one such as "
                      f"episode_return_mean, eval_return_mean (with eval.every_s) or learner/entropy")


def _learner_keys() -> set[str]:
    return {f"learner/{stat}" for stat in LEARNER_STATS if stat not in PROMOTED_LEARNER_STATS}


def objective_keys(cfg: Config) -> set[str]:
    """The numeric metrics.jsonl keys of every report a run of ``cfg`` writes, and those of its
    evaluations (eval_*, eval/<opponent>/*) when it evaluates; not the per-policy figures, whose
    names may depend on the env (a population's members are numbered: they are here)."""
    keys = {*REPORT_KEYS, *_learner_keys(), *(f"rollout/{k}" for k in WORKER_TIMINGS),
            *(f"inference/{k}" for k in INFERENCE_TIMINGS)}
    if cfg.eval.every_s:
        keys.update(EVAL_KEYS)
        keys.update(f"eval/{name}/{stat}" for name in cfg.eval.opponents for stat in OPPONENT_STATS)
    if cfg.selfplay.enabled:
        keys.update(f"league/{k}" for k in LEAGUE_KEYS)
    info = tuple(f"{INFO_PREFIX}{key}" for key in cfg.info_keys)
    keys.update(info)
    if cfg.pbt.population > 1:
        evaluated = ("eval_return_mean", "eval_length_mean") if cfg.eval.every_s else ()
        keys.update(f"member/{k}/{figure}" for k in range(cfg.pbt.population)
                    for figure in (*POLICY_KEYS, *_learner_keys(), *info, *evaluated))
    return keys
