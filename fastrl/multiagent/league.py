"""Self-play's league: frozen snapshots of the policy that play the seats it does not.

Three parts, one per process that holds them:

- League (learner): every ``selfplay.snapshot_every`` updates the policy's weights become a
  snapshot, published in a weight set of the arena (after the policies' sets) and written to
  ``RUN_DIR/league/snapshot-<version>.pt``, so that ``--resume`` finds the league again. At most
  ``selfplay.max_snapshots`` are kept; the oldest goes first. Before a run starts,
  ``prepare_league`` leaves it only what it may restore (see there).
- SelfPlaySeats (rollout worker): when a game starts, draws its opponent (one of
  ``selfplay.scripted_opponents`` with probability ``selfplay.scripted_prob``; otherwise the
  newest snapshot with probability ``selfplay.latest_prob``, or an older one by the weights the
  runner publishes) and the seat the policy plays (uniformly); the other seats' rows are acted by
  the snapshot, or by the scripted opponent in the worker, and never trained on.
- LeagueRecord (runner): the policy's results against each snapshot, from the episodes the
  workers record, rated with openskill (a maintained rating library) and turned into the PFSP
  weights ``(1 - win rate) ** selfplay.pfsp_power``, the win rate over the latest
  ``selfplay.pfsp_window`` games against that snapshot; kept in ``RUN_DIR/league/record.json``.
  A snapshot is a copy of the policy: it enters the ratings at the policy's rating.

A game's result, for the policy's seat: its episode return > 0 a win, 0 a draw, < 0 a loss (the
classic zero-sum games' convention). An episode is tagged with its opponent: a snapshot's version
(>= 0), NO_OPPONENT, or ``scripted_tag(k)`` for the k-th of ``selfplay.scripted_opponents``.
"""
from __future__ import annotations

import json
import math
import re
from collections import deque
from pathlib import Path

import numpy as np
import torch

from ..config import ConfigError, SelfPlayConfig
from ..files.checkpoint import CheckpointError, warn, write_checkpoint_file
from ..files.run_dir import make_dir, write_atomic
from ..ipc.arena import Arena
from ..ipc.weights import WeightBuffer
from .opponents import checked_action

SNAPSHOT_FILE = re.compile(r"snapshot-(\d+)\.pt")
SET_ASIDE = ".bad"  # a league file a run must not restore, renamed, not deleted
RECORD_FILE = "record.json"
UNPLAYED_WIN_RATE = 0.5  # a snapshot not played yet: neither favoured nor avoided by PFSP
NO_OPPONENT = -1  # an episode's opponent tag: none (the other seats played by the policy itself)


def scripted_tag(k: int) -> int:
    """The opponent tag of the k-th of selfplay.scripted_opponents (below NO_OPPONENT)."""
    return NO_OPPONENT - 1 - k


def outcome_rates(prefix: str, signs: np.ndarray) -> dict:
    """``prefix``win_rate, draw_rate and loss_rate of games whose results are ``signs`` (1 a
    win, 0 a draw, -1 a loss); NaN for no games."""
    return {f"{prefix}{key}": float((signs == sign).mean()) if len(signs) else math.nan
            for key, sign in (("win_rate", 1), ("draw_rate", 0), ("loss_rate", -1))}


def require_rating_library() -> None:
    """ConfigError naming the extra when openskill is missing: checked before a run starts."""
    try:
        import openskill.models  # noqa: F401
    except ImportError:
        raise ConfigError("selfplay.enabled rates the league with openskill, which is not installed: "
                         "pip install 'fastrl[multiagent]'") from None


def league_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "league"


def snapshot_path(run_dir: Path, version: int) -> Path:
    return league_dir(run_dir) / f"snapshot-{version:012d}.pt"


def saved_snapshots(run_dir: Path | None) -> list[tuple[int, Path]]:
    """(version, path) of the snapshots on disk, oldest first."""
    if run_dir is None or not league_dir(run_dir).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in league_dir(run_dir).iterdir() if (m := SNAPSHOT_FILE.fullmatch(p.name))]
    return sorted(found)


def load_snapshot(path: Path, num_values: int) -> torch.Tensor:
    """Snapshot ``path``'s flat weights ``[num_values]``; CheckpointError (one line naming the
    file) for one that is corrupt, not a snapshot, or of another model."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, a pickle that weights_only refuses, ...
        raise CheckpointError(f"league snapshot '{path}' is corrupt or truncated, or holds more than tensors "
                              f"({type(exc).__name__})") from None
    flat = state.get("weights") if isinstance(state, dict) else None
    if not isinstance(flat, torch.Tensor) or flat.ndim != 1 or flat.numel() != num_values:
        raise CheckpointError(f"league snapshot '{path}' holds no weights of this run's model ({num_values} "
                              f"values)")
    return flat


def prepare_league(run_dir: Path, resumed_version: int | None, num_values: int) -> None:
    """Leave in ``run_dir``'s league only what the run starting there may restore; call before
    it starts. Temporary files of snapshots never finished go. A new run (``resumed_version``
    None) restores nothing: every snapshot and the record are set aside (``*.bad``). A resumed
    one sets aside the snapshots taken after its checkpoint's weights (version >
    ``resumed_version``: the run takes them again as it goes on, and their results leave the
    record) and those that do not load (one warning each, as for checkpoints)."""
    directory = league_dir(run_dir)
    if not directory.is_dir():
        return
    for tmp in directory.glob(".snapshot-*.tmp"):
        tmp.unlink(missing_ok=True)
    record = directory / RECORD_FILE
    for version, path in saved_snapshots(run_dir):
        if resumed_version is not None and version <= resumed_version:
            try:
                load_snapshot(path, num_values)
                continue
            except CheckpointError as exc:
                warn(f"[fastrl] warning: {exc}: set aside as {path.name}{SET_ASIDE}; the league goes on without it\n")
        path.replace(path.with_name(path.name + SET_ASIDE))
    if resumed_version is None and record.exists():
        record.replace(record.with_name(record.name + SET_ASIDE))
    elif resumed_version is not None:
        forget_results_after(record, resumed_version)


def forget_results_after(record: Path, version: int) -> None:
    """Drop the results and ratings of snapshots newer than ``version`` from ``record`` (a record
    that does not read is LeagueRecord's to start again)."""
    try:
        data = json.loads(record.read_text())
        kept = {key: {v: r for v, r in data.get(key, {}).items() if int(v) <= version} for key in ("results", "recent")}
        kept["ratings"] = {name: r for name, r in data.get("ratings", {}).items()
                           if not name.startswith("snapshot-") or int(name.rsplit("-", 1)[1]) <= version}
    except (OSError, ValueError, AttributeError):
        return
    write_atomic(record, json.dumps(kept))


class League:
    """The learner's side: snapshots taken, published and saved (``run_dir`` None: not saved,
    a distributed rank other than 0). ``first_set`` is the first snapshot weight set."""

    def __init__(self, arena: Arena, first_set: int, settings: SelfPlayConfig, run_dir: Path | None):
        self.buffers = [WeightBuffer(arena, first_set + j) for j in range(settings.max_snapshots)]
        self.settings = settings
        self.run_dir = run_dir
        self.versions = [-1] * settings.max_snapshots  # the version each set holds; -1 empty
        self.last = -1  # the newest snapshot's version

    def restore(self, num_values: int) -> None:
        """Publish the newest saved snapshots (a resumed run's league)."""
        for version, path in saved_snapshots(self.run_dir)[-len(self.buffers):]:
            self._publish(version, load_snapshot(path, num_values).numpy())

    def after_update(self, version: int, flat: np.ndarray) -> None:
        """Take a snapshot of the weights ``flat`` of ``version`` when one is due (the first at once)."""
        due = self.last < 0 or version - self.last >= self.settings.snapshot_every
        if due and np.isfinite(flat).all():  # non-finite weights are never published, nor kept
            self._save(version, flat)
            self._publish(version, flat)

    def _publish(self, version: int, flat: np.ndarray) -> None:
        empty = [j for j, v in enumerate(self.versions) if v < 0]
        j = empty[0] if empty else int(np.argmin(self.versions))
        dropped = self.versions[j]
        self.buffers[j].publish(flat, version)
        self.versions[j] = version
        self.last = max(self.last, version)
        if dropped >= 0 and self.run_dir is not None:
            snapshot_path(self.run_dir, dropped).unlink(missing_ok=True)

    def _save(self, version: int, flat: np.ndarray) -> None:
        if self.run_dir is None:
            return
        write_checkpoint_file(snapshot_path(self.run_dir, version),
                              {"version": version, "weights": torch.from_numpy(flat.copy())})


class SelfPlaySeats:
    """A rollout worker's side: per game, the opponent and the policy's seat (see the module).

    ``num_agents`` seats a game (consecutive rows), ``num_policies`` the weight sets before the
    snapshots'. Until the learner publishes its first snapshot, the other seats are played by the
    policy's current weights (still not trained on), and no scripted opponent is drawn.

    ``scripted``: the opponents of ``selfplay.scripted_opponents``, made for the game (callables
    ``fn(observation, agent) -> action``, fastrl.multiagent.opponents). A scripted seat's row is
    still acted by the newest snapshot's weight set, so that its episodes are no policy's and the
    batcher's work stays one pass per set; ``play_scripted`` replaces those actions before they
    are sent."""

    def __init__(self, arena: Arena, num_envs: int, num_agents: int, num_policies: int, settings: SelfPlayConfig,
                 seed, scripted: list | None = None):
        self.num_agents = num_agents
        self.num_policies = num_policies
        self.settings = settings
        self.snapshot_versions = arena.weight_version[num_policies:]
        self.draw_weights = arena.league_weights
        self.rng = np.random.default_rng(seed)
        self.scripted = list(scripted or [])
        self.row_scripted = np.full(num_envs, -1, np.int64)  # the scripted opponent acting for each row, -1 none
        games = num_envs // num_agents
        self.game_episode = np.zeros(games, np.int64)  # the game's resets at its last draw
        self.game_seat = np.zeros(games, np.int64)
        self.game_actor = np.zeros(games, np.int64)  # the weight set of the other seats
        self.game_opponent = np.full(games, NO_OPPONENT, np.int64)  # the opponent's tag (see the module)
        self.game_scripted = np.full(games, -1, np.int64)  # the scripted opponent's index, -1 none

    def start_rows(self, rows: np.ndarray, episodes_begun: np.ndarray, row_actor: np.ndarray,
                   row_trained: np.ndarray, row_opponent: np.ndarray) -> None:
        """Rows ``rows`` are in their game's episode ``episodes_begun[game]`` (the env's resets of
        each game, VecEnv.episodes_begun): set who acts for each, whether it trains and against
        whom (the per-row arrays of fastrl.sampling.rollout_worker's _record_steps). A game's seats are drawn once
        per reset, by the game's own count: a seat that missed a game (it ended before the seat's
        first turn) counts no episode of its own, and must not put its game out of step."""
        n = self.num_agents
        for r in rows.tolist():
            g = r // n
            if episodes_begun[g] > self.game_episode[g]:
                self.game_episode[g] = episodes_begun[g]
                self._draw(g)
            if r % n == self.game_seat[g]:
                row_actor[r], row_trained[r], row_opponent[r] = 0, 1, self.game_opponent[g]
                self.row_scripted[r] = -1
            else:
                row_actor[r], row_trained[r], row_opponent[r] = self.game_actor[g], 0, NO_OPPONENT
                self.row_scripted[r] = self.game_scripted[g]

    def play_scripted(self, env, rows: np.ndarray, actions: np.ndarray, done: np.ndarray) -> None:
        """Replace ``actions`` (``[B, ...]``, as env.send takes them) of the ``rows`` a scripted
        opponent plays by its moves on their observations; rows whose step is ``done`` are left
        as they are (the env ignores an action on a final observation). OpponentError (one line)
        for a move the game does not allow."""
        for i in np.flatnonzero((self.row_scripted[rows] >= 0) & ~done):
            row = int(rows[i])
            k = int(self.row_scripted[row])
            agent, observation = env.agents[row % self.num_agents], env.agent_observation(row)
            move = checked_action(self.settings.scripted_opponents[k], self.scripted[k](observation, agent),
                                  observation, agent, env.action_space)
            actions[i] = env.action_layout.encode(move)

    def _draw(self, g: int) -> None:
        self.game_seat[g] = self.rng.integers(self.num_agents)
        versions = self.snapshot_versions
        filled = np.flatnonzero(versions >= 0)
        self.game_scripted[g] = -1
        if not len(filled):
            self.game_actor[g], self.game_opponent[g] = 0, NO_OPPONENT
            return
        newest = filled[np.argmax(versions[filled])]
        if self.scripted and self.rng.random() < self.settings.scripted_prob:
            k = int(self.rng.integers(len(self.scripted)))
            self.game_actor[g] = self.num_policies + newest  # acts for none of the policy's episodes
            self.game_opponent[g], self.game_scripted[g] = scripted_tag(k), k
            return
        older = filled[filled != newest]
        j = newest
        if len(older) and self.rng.random() >= self.settings.latest_prob:
            weights = np.maximum(self.draw_weights[older], 0.0)
            total = weights.sum()
            j = older[self.rng.choice(len(older), p=weights / total)] if total > 0 else self.rng.choice(older)
        self.game_actor[g] = self.num_policies + j
        self.game_opponent[g] = versions[j]


class LeagueRecord:
    """The runner's side: results and ratings of the policy against each snapshot (see the module)."""

    def __init__(self, arena: Arena, num_policies: int, settings: SelfPlayConfig, run_dir: Path | None,
                 policy_name: str):
        from openskill.models import PlackettLuce  # the [multiagent] extra; preflight checks it

        self.model = PlackettLuce()
        self.snapshot_versions = arena.weight_version[num_policies:]
        self.draw_weights = arena.league_weights
        self.settings = settings
        self.path = league_dir(run_dir) / RECORD_FILE if run_dir is not None else None
        self.policy_name = policy_name
        saved = self._load()
        self.results: dict[int, list[int]] = {int(v): list(r) for v, r in saved.get("results", {}).items()}
        # The latest outcomes (1 win, 0 draw, -1 loss) against each snapshot, which PFSP weighs by.
        self.recent = {int(v): deque(r, maxlen=settings.pfsp_window) for v, r in saved.get("recent", {}).items()}
        self.ratings = {name: self.model.rating(mu=mu, sigma=sigma, name=name)
                        for name, (mu, sigma) in saved.get("ratings", {}).items()}
        self.draw_weights[:] = 1.0
        self.update_draw_weights()

    def _load(self) -> dict:
        if self.path is None or not self.path.exists():
            return {}
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # a record cut short: ratings start again, the snapshots are on disk

    def rating(self, name: str):
        """``name``'s rating; a snapshot not rated yet starts at the policy's, which it copies."""
        if name not in self.ratings:
            start = self.ratings.get(self.policy_name) if name != self.policy_name else None
            self.ratings[name] = self.model.rating(name=name) if start is None else \
                self.model.rating(mu=start.mu, sigma=start.sigma, name=name)
        return self.ratings[name]

    def record(self, opponents: np.ndarray, returns: np.ndarray) -> dict:
        """The policy's games of one report (``opponents`` their opponent tags, see the module;
        ``returns`` its returns): results and ratings against snapshots updated, draw weights
        published; the report's league keys, those of the scripted opponents' games included."""
        report = self._record_scripted(opponents, returns)
        snapshot_games = opponents >= 0
        opponents, returns = opponents[snapshot_games], returns[snapshot_games]
        outcomes = np.sign(returns).astype(np.int64)  # 1 win, 0 draw, -1 loss
        live = [int(v) for v in sorted(self.snapshot_versions[self.snapshot_versions >= 0])]
        for version in live:  # a snapshot taken since the last report: rated as the policy is now
            self.rating(f"snapshot-{version}")
        for version, outcome in zip(opponents.tolist(), outcomes.tolist()):
            counts = self.results.setdefault(version, [0, 0, 0])
            counts[1 - outcome] += 1  # [wins, draws, losses]
            self.recent.setdefault(version, deque(maxlen=self.settings.pfsp_window)).append(outcome)
            ours, theirs = self.rating(self.policy_name), self.rating(f"snapshot-{version}")
            ranks = [1, 1] if outcome == 0 else ([1, 2] if outcome > 0 else [2, 1])
            [[ours], [theirs]] = self.model.rate([[ours], [theirs]], ranks=ranks)
            self.ratings[self.policy_name], self.ratings[f"snapshot-{version}"] = ours, theirs
        self.update_draw_weights()
        games = len(outcomes)
        report |= {
            "league/games": games,
            **outcome_rates("league/", outcomes),
            "league/snapshots": len(live),
            "league/rating": float(self.rating(self.policy_name).ordinal()),
            "league/snapshot_ratings": {str(v): float(self.rating(f"snapshot-{v}").ordinal()) for v in live},
        }
        self._save()
        return report

    def _record_scripted(self, opponents: np.ndarray, returns: np.ndarray) -> dict:
        """league/scripted/<opponent>/<key> for each of selfplay.scripted_opponents: its games
        of this report and the policy's win, draw and loss rates in them (NaN for none)."""
        report = {}
        for k, name in enumerate(self.settings.scripted_opponents):
            signs = np.sign(returns[opponents == scripted_tag(k)])
            report |= {f"league/scripted/{name}/games": len(signs), **outcome_rates(f"league/scripted/{name}/", signs)}
        return report

    def win_rate(self, version: int) -> float:
        """The policy's win rate over its latest games against ``version``, draws counting half."""
        recent = self.recent.get(version)
        return (sum(recent) / len(recent) + 1.0) / 2.0 if recent else UNPLAYED_WIN_RATE

    def update_draw_weights(self) -> None:
        """PFSP: each snapshot weighted by how often the policy fails to beat it."""
        for j, version in enumerate(self.snapshot_versions.tolist()):
            if version >= 0:
                self.draw_weights[j] = (1.0 - self.win_rate(version)) ** self.settings.pfsp_power

    def _save(self) -> None:
        if self.path is None:
            return
        # Results against snapshots that left the league steer no draw: the record stays bounded.
        # The oldest go first, so those are the versions older than every live one; with none live
        # yet (a resumed run whose learner has not restored the league) nothing has left.
        live = self.snapshot_versions[self.snapshot_versions >= 0]
        oldest = int(live.min()) if len(live) else -1
        self.results = {v: r for v, r in self.results.items() if v >= oldest}
        self.recent = {v: r for v, r in self.recent.items() if v >= oldest}
        data = {"results": {str(v): r for v, r in self.results.items()},
                "recent": {str(v): list(r) for v, r in self.recent.items()},
                "ratings": {name: [r.mu, r.sigma] for name, r in self.ratings.items()
                            if name == self.policy_name or int(name.rsplit("-", 1)[1]) >= oldest}}
        make_dir(self.path.parent)
        write_atomic(self.path, json.dumps(data))
