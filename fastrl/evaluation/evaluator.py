"""Evaluation during training: complete episodes on the evaluator's own envs with the latest
published weights, every ``eval.every_s`` seconds, off the training hot path.

The evaluator reads the weights the learner publishes, as the batcher does (fastrl.ipc.weights),
plays ``eval.episodes`` episodes with ``fastrl.evaluation.episodes.evaluate_policy`` (not counted as training
env steps, not in the training episode statistics), records the result in the arena's
``eval_stats`` for the runner's next report, and keeps ``checkpoints/best.pt``: the weights with
the best evaluated mean return. In a multi-agent game it then plays ``eval.episodes`` episodes
against each scripted opponent of ``eval.opponents`` (``fastrl.evaluation.episodes.evaluate_against``, the
policy's seat rotating), whose win, draw and loss rates go to ``eval_opponent_stats``, a row per
opponent. The weights evaluated are the first policy's; with a population (fastrl.tuning.pbt) every
member's, each on the same episode seeds, into ``eval_member_stats`` (a row per member, what
``pbt.objective = "eval_return_mean"`` ranks by), and best.pt keeps the best member's. In its own
process it runs at a lower CPU priority: on a machine with fewer cores than processes it takes
what the actors and the learner leave.

It is the run's most expendable process: whatever stops it (an env that fails only in evaluation,
a kill, a full disk under best.pt) never stops training. It says why in one line through its
``failures`` pipe; the runner restarts it up to MAX_RESTARTS times, then trains on without it.
The serial run, which evaluates in line, treats a failed evaluation alike: a new Evaluator (new
envs) up to MAX_RESTARTS times, then training without evaluation.
"""
from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

from ..config import Config, ConfigError
from ..envs import EnvSpec
from ..envs.multiagent.pettingzoo_backend import is_pettingzoo_id
from ..files.checkpoint import CheckpointError, best_checkpoint_path, load_checkpoint, write_checkpoint_file
from ..files.run_dir import make_dir
from ..ipc.arena import Arena, total_env_steps
from ..ipc.child import WAIT_TIMEOUT_S, ProcessExit, check_alive, configure_child
from ..ipc.weights import WeightReader
from ..models.networks import build_model
from ..multiagent.opponents import OpponentError, find_opponent, make_opponent
from ..reporting.metrics import OPPONENT_STATS
from .episodes import (
    check_every_seat_playable,
    check_opponent_seats,
    evaluate_against,
    evaluate_policy,
    policy_seats,
    seated_spec,
)
from .video import VideoError, remove_partial_videos, write_video  # imageio itself is imported only to write

EVAL_NICENESS = 10  # an observer: the actors and the learner come first when cores are short
SEED_OFFSET = 1_000_003  # evaluation episodes never replay the training envs' seeds
CONFIRM_SEED_OFFSET = 2**29  # eval.confirm_best's second round: seeds no evaluation of a run reaches
# A run of a week can lose its evaluator to a stray kill or two; one that fails on every
# evaluation (an env that breaks only there) is given up after these, with one notice.
MAX_RESTARTS = 3


class EvalStats:
    """Indices into ``arena.eval_stats``. ``SEQ`` is odd while the evaluator writes a result and
    counts finished evaluations (two per result), so a reader never takes a torn one."""

    SEQ = 0
    WEIGHTS_VERSION = 1
    AT_ENV_STEPS = 2  # training env steps when the evaluated weights were taken
    RETURN_MEAN = 3
    RETURN_STD = 4
    LENGTH_MEAN = 5
    EPISODES = 6
    ENV_STEPS = 7  # env steps played by every evaluation of this session so far
    SECONDS = 8  # how long the last evaluation took
    BEST = 9  # the best evaluation's figure by eval.best_by: the one checkpoints/best.pt holds
    CLIP_AT = 10  # AT_ENV_STEPS of the newest clip (eval.video_every_s), -1 before the first
    SIZE = 11


class MemberEvalStats:
    """Columns of ``arena.eval_member_stats``: a population member's part of the latest evaluation
    (a row per member), written under EvalStats.SEQ."""

    RETURN_MEAN = 0
    LENGTH_MEAN = 1
    WEIGHTS_VERSION = 2
    AT_ENV_STEPS = 3  # training env steps read before the member's weights were loaded


def member_evaluations(arena: Arena) -> np.ndarray | None:
    """A copy of ``arena.eval_member_stats`` ``[members, 4]`` as of the latest complete
    evaluation; None before the first one, or when one landed during the copy."""
    seq = int(arena.eval_stats[EvalStats.SEQ])
    if seq == 0 or seq % 2:
        return None
    rows = arena.eval_member_stats.copy()
    return rows if int(arena.eval_stats[EvalStats.SEQ]) == seq else None


# OPPONENT_STATS (fastrl.reporting.metrics) are the columns of a row of ``arena.eval_opponent_stats``: the
# evaluated policy's games against one of eval.opponents (the row's index there), written under
# EvalStats.SEQ; NaN rates: no outcome.


CLIP_FRAMES = 900  # 30 s at the video's 30 fps: a clip, not the whole of a long Atari episode


def clip_path(at_env_steps: int) -> str:
    """A training clip's path inside the run directory."""
    return f"videos/eval_{at_env_steps:012d}.mp4"


def opponent_score(rates: Sequence[dict]) -> float:
    """The score against eval.opponents that eval.best_by = opponents ranks by: each opponent's
    win rate plus half its draw rate, averaged over the opponents (NaN rates: no games, left
    out; NaN if none has games)."""
    scores = [r["win_rate"] + 0.5 * r["draw_rate"] for r in rates
              if r["win_rate"] is not None and not math.isnan(r["win_rate"])]
    return float(np.mean(scores)) if scores else math.nan


class EvalResults:
    """The runner's side: the newest evaluation since the last call, as metrics keys; against
    each of ``opponents`` (eval.opponents) ``eval/<opponent>/win_rate``, ``draw_rate``,
    ``loss_rate`` and ``episodes``, and their ``eval_opponent_score``; each of a population's
    ``members`` ``member/<k>/eval_return_mean`` and ``eval_length_mean``. The best so far is
    ``eval_best_opponent_score`` when ``best_by_opponents`` (Config.best_by_opponents), else
    ``eval_best_return``."""

    def __init__(self, arena: Arena, opponents: Sequence[str] = (), members: int = 0,
                 best_by_opponents: bool = False):
        self.best_key = "eval_best_opponent_score" if best_by_opponents else "eval_best_return"
        self.stats = arena.eval_stats
        self.opponent_stats = arena.eval_opponent_stats
        self.member_stats = arena.eval_member_stats[:members]
        self.opponents = tuple(opponents)
        self.seen = int(self.stats[EvalStats.SEQ])
        self.clip_seen = -1

    def new(self) -> dict:
        seq = int(self.stats[EvalStats.SEQ])
        if seq == self.seen or seq % 2:
            return {}
        s = self.stats.copy()
        against = self.opponent_stats.copy()
        members = self.member_stats.copy()
        if int(self.stats[EvalStats.SEQ]) != seq:
            return {}  # a result landed during the copy: take it next report
        self.seen = seq
        clip = int(s[EvalStats.CLIP_AT])
        new_clip = {"eval_video": clip_path(clip)} if clip >= 0 and clip != self.clip_seen else {}
        self.clip_seen = clip
        return {**new_clip, "eval_return_mean": float(s[EvalStats.RETURN_MEAN]),
                "eval_return_std": float(s[EvalStats.RETURN_STD]),
                "eval_length_mean": float(s[EvalStats.LENGTH_MEAN]), "eval_episodes": int(s[EvalStats.EPISODES]),
                "eval_env_steps": int(s[EvalStats.ENV_STEPS]),
                "eval_weights_version": int(s[EvalStats.WEIGHTS_VERSION]),
                "eval_at_env_steps": int(s[EvalStats.AT_ENV_STEPS]), "eval_seconds": float(s[EvalStats.SECONDS]),
                self.best_key: float(s[EvalStats.BEST]),
                **({"eval_opponent_score": opponent_score([dict(zip(OPPONENT_STATS, row))
                                                           for row in against[:len(self.opponents)]])}
                   if self.opponents else {}),
                **{f"eval/{name}/{key}": (int(value) if key == "episodes" else float(value))
                   for name, row in zip(self.opponents, against) for key, value in zip(OPPONENT_STATS, row)},
                **{f"member/{k}/{key}": float(row[column]) for k, row in enumerate(members)
                   for key, column in (("eval_return_mean", MemberEvalStats.RETURN_MEAN),
                                       ("eval_length_mean", MemberEvalStats.LENGTH_MEAN))}}


class Evaluator:
    """Evaluates the newest published weights and keeps best.pt (when ``run_dir`` is set)."""

    def __init__(self, cfg: Config, arena: Arena, model: torch.nn.Module, run_dir: Path | None,
                 device: str = "cpu", keep_going=None):
        self.cfg = cfg
        self.arena = arena
        self.model = model.to(device).eval()
        self.device = device
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.keep_going = keep_going
        # A population's members each on a model of their own: a WeightReader views its model's tensors.
        self.models = [self.model, *(copy.deepcopy(self.model) for _ in range(1, max(cfg.pbt.population, 1)))]
        self.weights = [WeightReader(arena, m, torch.device(device), k) for k, m in enumerate(self.models)]
        self.stats = arena.eval_stats
        # An evaluator killed while writing a result left SEQ odd: back to the last complete one,
        # else every later result would read as being written.
        self.stats[EvalStats.SEQ] -= self.stats[EvalStats.SEQ] % 2
        self.evaluations = 0
        # The first policy's own agents, where a run has several: the seats it plays against eval.opponents.
        several = len(cfg.policies.names) > 1 or cfg.policies.mapping != "shared"
        spec = seated_spec(cfg) if several and cfg.eval.opponents else None
        self.seats = policy_seats(cfg, spec)
        # Agents of different spaces (each kind its own policy): the first policy cannot play every
        # seat, so its evaluation is the one in its own seats against the first of eval.opponents.
        self.seated_only = spec is not None and bool(spec.agent_spaces)
        self.best_by = "opponents" if cfg.best_by_opponents else "return"
        self.best = self._best_so_far()
        self.stats[EvalStats.BEST] = self.best
        self.stats[EvalStats.CLIP_AT] = -1
        # The first evaluation brings a clip, then one every eval.video_every_s.
        self.next_clip = time.monotonic() if cfg.eval.video_every_s and self.run_dir is not None else math.inf
        if self.run_dir is not None:
            remove_partial_videos(self.run_dir / "videos")  # a killed evaluator's unfinished clip

    def _best_so_far(self) -> float:
        """A resumed run keeps its best.pt unless a better evaluation replaces it; one kept by
        another eval.best_by (a best.pt from before the key: by return) is replaced by the next."""
        path = best_checkpoint_path(self.run_dir) if self.run_dir is not None else None
        if path is None or not path.exists():
            return -math.inf
        try:
            saved = load_checkpoint(path)["eval"]
            if saved.get("best_by", "return") != self.best_by:
                return -math.inf
            return float(saved["eval_opponent_score" if self.best_by == "opponents" else "eval_return_mean"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            return -math.inf  # unreadable: the next evaluation writes a good one

    def evaluate(self) -> dict | None:
        """One evaluation of the newest weights (a population's members in turn); None if none
        are published yet."""
        started = time.perf_counter()
        ecfg, seed = self.cfg.eval, self.cfg.seed + SEED_OFFSET + 7919 * self.evaluations
        evaluated = []  # (result, weights version, env steps) of each member
        for model, weights in zip(self.models, self.weights):
            at_env_steps = total_env_steps(self.arena)
            version = weights.load_newest(self.keep_going)
            if version is None:
                return None
            if self.seated_only:
                break
            # The same seeds for every member: their returns differ by their policies, not their luck.
            evaluated.append((evaluate_policy(self.cfg, model, ecfg.episodes, ecfg.deterministic, self.device,
                                              seed=seed, num_envs=ecfg.num_envs, keep_going=self.keep_going),
                              version, at_env_steps))
        against = self._against_opponents(self.model, seed)
        if self.seated_only:
            evaluated.append((against[0], version, at_env_steps))
        result, version, at_env_steps = evaluated[0]
        self.evaluations += 1
        seconds = time.perf_counter() - started
        if self.best_by == "opponents":  # one policy (no population): Config refuses the others
            best, figure = 0, opponent_score(against)
        else:
            best = max(range(len(evaluated)), key=lambda k: evaluated[k][0]["episode_return_mean"])
            figure = evaluated[best][0]["episode_return_mean"]
        kept, kept_against = evaluated[best], against
        if figure > self.best and self.cfg.eval.confirm_best:
            figure, kept, kept_against = self._confirm(best, kept, against, seed + CONFIRM_SEED_OFFSET)
        if figure > self.best:  # NaN (no game against an opponent ended) never is
            self.best = figure
            self._save_best(best, *kept, kept_against)
        clip_at = self._clip(at_env_steps) if time.monotonic() >= self.next_clip else None
        self._record(result, against, version, at_env_steps, seconds, clip_at, evaluated)
        return {**result, "opponents": dict(zip(ecfg.opponents, against))}

    def _against_opponents(self, model: torch.nn.Module, seed: int) -> list[dict]:
        """``model``'s results against each of eval.opponents, its seats in turn."""
        ecfg = self.cfg.eval
        return [evaluate_against(self.cfg, model, opponent, ecfg.episodes, ecfg.deterministic, self.device, seed=seed,
                                 num_envs=ecfg.num_envs, keep_going=self.keep_going, seats=self.seats)
                for opponent in ecfg.opponents]

    def _confirm(self, member: int, evaluated: tuple[dict, int, int], against: list[dict],
                 seed: int) -> tuple[float, tuple[dict, int, int], list[dict]]:
        """eval.confirm_best: the candidate for best.pt (``member``'s weights, still loaded) plays a
        second round on other seeds; returns that round's figure, result and rates, which alone
        decide and describe best.pt. The first round stays the evaluation that is reported."""
        ecfg = self.cfg.eval
        result, version, at_env_steps = evaluated
        model = self.models[member]
        if self.best_by == "opponents" or self.seated_only:
            against = self._against_opponents(model, seed)
            if self.best_by == "opponents":
                return opponent_score(against), evaluated, against
            return against[0]["episode_return_mean"], (against[0], version, at_env_steps), against
        result = evaluate_policy(self.cfg, model, ecfg.episodes, ecfg.deterministic, self.device, seed=seed,
                                 num_envs=ecfg.num_envs, keep_going=self.keep_going)
        return result["episode_return_mean"], (result, version, at_env_steps), against

    def _clip(self, at_env_steps: int) -> int:
        """Write one episode's clip of the evaluated weights (its first CLIP_FRAMES frames)."""
        self.next_clip = time.monotonic() + self.cfg.eval.video_every_s
        path = self.run_dir / clip_path(at_env_steps)
        make_dir(path.parent)  # the clips' folder, never through a link
        write_video(self.cfg, self.model, path, episodes=1,
                    deterministic=self.cfg.eval.deterministic, seed=self.cfg.seed + SEED_OFFSET,
                    max_frames=CLIP_FRAMES, keep_going=self.keep_going)
        return at_env_steps

    def _record(self, result: dict, against: list[dict], version: int, at_env_steps: int, seconds: float,
                clip_at: int | None, members: list[tuple[dict, int, int]]) -> None:
        s = self.stats
        s[EvalStats.SEQ] += 1  # odd: writing
        for row, rates in zip(self.arena.eval_opponent_stats, against):
            row[:] = [math.nan if rates[key] is None else rates[key] for key in OPPONENT_STATS]
        for row, (member, member_version, member_at) in zip(self.arena.eval_member_stats, members):
            row[:] = [member["episode_return_mean"], member["episode_length_mean"], member_version, member_at]
        s[EvalStats.WEIGHTS_VERSION] = version
        s[EvalStats.AT_ENV_STEPS] = at_env_steps
        s[EvalStats.RETURN_MEAN] = result["episode_return_mean"]
        s[EvalStats.RETURN_STD] = result["episode_return_std"]
        s[EvalStats.LENGTH_MEAN] = result["episode_length_mean"]
        s[EvalStats.EPISODES] = result["episodes"]
        s[EvalStats.ENV_STEPS] += result["env_steps_played"]
        s[EvalStats.SECONDS] = seconds
        s[EvalStats.BEST] = self.best
        if clip_at is not None:
            s[EvalStats.CLIP_AT] = clip_at
        s[EvalStats.SEQ] += 1

    def _save_best(self, member: int, result: dict, version: int, at_env_steps: int, against: list[dict]) -> None:
        """best.pt: the weights of ``member`` (0 without a population), evaluated as ``result``
        and, against eval.opponents, as ``against``; ``best_by`` says which figure chose it."""
        if self.run_dir is None:
            return
        state = {
            "learner": {"model": {k: v.detach().cpu() for k, v in self.models[member].state_dict().items()}},
            "counters": {"env_steps": at_env_steps, "weights_version": version},
            "config": self.cfg.to_dict(),
            "eval": {"eval_return_mean": result["episode_return_mean"],
                     "eval_return_std": result["episode_return_std"],
                     "eval_length_mean": result["episode_length_mean"], "eval_episodes": result["episodes"],
                     "deterministic": self.cfg.eval.deterministic, "best_by": self.best_by,
                     **({"eval_opponent_score": opponent_score(against),
                         "opponents": dict(zip(self.cfg.eval.opponents, against))} if against else {}),
                     **({"member": member} if self.cfg.pbt.population else {})},
        }
        write_checkpoint_file(best_checkpoint_path(self.run_dir), state)


def check_run_opponents(cfg: Config, spec: EnvSpec) -> None:
    """ConfigError (one line) for an ``eval.opponents`` or ``selfplay.scripted_opponents`` entry
    that cannot play ``cfg.env`` (probed as ``spec``): one that cannot be found or made for its
    game, or an env whose other seats no opponent can play (one agent, or games that are not
    PettingZoo's); for evaluation during training with no eval.opponents in a game whose agents'
    observation spaces differ, where evaluate_policy would play the first policy in every seat."""
    if cfg.eval.every_s and not cfg.eval.opponents:
        check_every_seat_playable(cfg, spec, "evaluation during training (eval.every_s) without eval.opponents",
                                  "set eval.opponents (e.g. [\"random\"]: the first policy is evaluated in its own "
                                  "seats against them) or eval.every_s=0")
    if cfg.eval.every_s and cfg.eval.video_every_s:
        check_every_seat_playable(cfg, spec, "eval.video_every_s", "set eval.video_every_s=0 and film a policy in its "
                                  "own seats with fastrl-eval RUN --policy NAME --opponent random --video PATH")
    for option, names in (("eval.opponents", cfg.eval.opponents),
                          ("selfplay.scripted_opponents", cfg.selfplay.scripted_opponents)):
        if not names:
            continue
        check_opponent_seats(cfg.env.id, len(spec.agents), is_pettingzoo_id(cfg.env.id), option, f"set {option}=[]")
        for opponent in names:
            try:
                make_opponent(find_opponent(opponent, f"{option} entry"), spec.observation_space,
                              spec.action_space, cfg.seed)
            except OpponentError as exc:
                raise ConfigError(str(exc)) from None


def evaluator_niceness(cfg: Config) -> int:
    """EVAL_NICENESS below the actors (which are ``actor_niceness`` below the learner), in Linux's range."""
    return min(19, cfg.actor_niceness + EVAL_NICENESS)


def evaluator_process(cfg: Config, layout, arena_name: str, spaces, model: torch.nn.Module | None,
                      run_dir: Path | None, failures: Connection) -> None:
    """Main loop of the evaluator process: sleep (blocking, checking the stop flag), evaluate, repeat.

    The first evaluation comes ``eval.every_s`` after start; an evaluation that overruns its
    interval pushes the next one back instead of running back to back. On an error it sends
    one line (failure_line) through ``failures`` and exits with code 1."""
    configure_child(cfg.retain_freed_memory, evaluator_niceness(cfg))
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed + SEED_OFFSET)
    arena = Arena.attach(layout, arena_name)
    control = arena.control

    def keep_going() -> None:
        check_alive(control)

    evaluator = None
    try:
        model = build_model(*spaces, cfg.model, model, cfg.learner.algo)  # weights come from the arena
        evaluator = Evaluator(cfg, arena, model, run_dir, "cpu", keep_going)
        due = time.monotonic() + cfg.eval.every_s
        while True:
            while time.monotonic() < due:
                time.sleep(min(WAIT_TIMEOUT_S, max(0.0, due - time.monotonic())))
                keep_going()
            if evaluator.evaluate() is None:
                due = time.monotonic() + WAIT_TIMEOUT_S  # no weights yet
                continue
            due = max(due + cfg.eval.every_s, time.monotonic() + cfg.eval.every_s / 2)
    except ProcessExit:
        pass
    except Exception as exc:
        failures.send(failure_line(exc))
        sys.exit(1)  # the runner says why, in one line: no traceback
    finally:
        del evaluator  # its views of the arena go first
        arena.close()


def restarted_notice(failure: str, replacement: str, restart: int, limit: int) -> str:
    """The notice for a failed evaluator that is replaced, in either run mode; ``failure`` names
    the evaluator and says why it stopped (failure_line)."""
    return f"[fastrl] {failure}; restarted as {replacement} (restart {restart} of {limit})"


def given_up_notice(failure: str, restarts: int) -> str:
    """The one notice for a failed evaluator that is not replaced again, in either run mode."""
    return (f"[fastrl] {failure} after {restarts} restarts; training goes on without evaluation "
            f"(best.pt keeps the best so far)")


def failure_line(exc: Exception) -> str:
    """Why the evaluator stopped, as the runner's notice says it."""
    if isinstance(exc, VideoError):
        return f"{exc} (turn clips off with --set eval.video_every_s=0)"
    if isinstance(exc, CheckpointError):
        return str(exc)
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first_line}"
