"""Self-play against a league of the policy's snapshots (issue 41 item 3): per game one seat is the
policy's and the others a snapshot's, whose rows are never trained on; snapshots never change once
taken, at most max_snapshots are kept, and the league and its record survive --resume; the opponent
is the newest snapshot with latest_prob, else an older one by PFSP weights."""
import json

import numpy as np
import pytest
import torch

from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.files.checkpoint import write_checkpoint_file
from fastrl.ipc.arena import Arena
from fastrl.ipc.slots import PolicyQueues, serial_slots
from fastrl.ipc.weights import WeightBuffer
from fastrl.models.networks import build_model, num_state_values
from fastrl.multiagent.league import (
    NO_OPPONENT,
    League,
    LeagueRecord,
    SelfPlaySeats,
    league_dir,
    saved_snapshots,
    scripted_tag,
    snapshot_path,
)
from fastrl.multiagent.policy_map import policy_map
from fastrl.reporting.metrics import WorkerTiming
from fastrl.run.preflight import arena_layout
from fastrl.run.training import train
from fastrl.sampling.batcher import InferenceBatcher
from fastrl.sampling.rollout_worker import RolloutWorker, make_worker_env, worker_policies
from tests.unit.learner.test_policy_set import forced_policy_weights, games_config

COUNT_GAME = "pettingzoo:tests.support.turn_based_envs"
POLICY_VERSION = 50


def selfplay_games(agents: int = 3, **overrides):
    return games_config(agents, **{"policies.mapping": "shared", "selfplay.enabled": True,
                                   "selfplay.max_snapshots": 3, "selfplay.snapshot_every": 10, **overrides})


def selfplay_arena(cfg, num_weights: int) -> Arena:
    arena = Arena(arena_layout(cfg, probe_env(cfg), num_weights), shared=False)
    arena.weight_version[:] = -1
    return arena


def selfplay_worker(cfg, arena, policies):
    """Worker 0 of ``cfg``, started, wired to the learner's queue as the serial run wires them
    (slots with no trained step are dropped); the worker and the queue."""
    E = cfg.env.envs_per_worker
    [slots], full = serial_slots(arena, 1, cfg.slots_per_worker, cfg.trajectories_per_batch,
                                 lambda w: WorkerTiming.cell(arena, w, WorkerTiming.WAIT_SLOTS),
                                 np.zeros(E, np.int16), drop_untrained=True)
    env = make_worker_env(cfg, 0)
    worker = RolloutWorker(0, cfg, arena, env, slots.take(E), slots.take, slots.emit,
                           *worker_policies(cfg, arena, policies, env, 0))
    worker.start()
    return worker, full


def answer(worker, batcher, full, ready) -> None:
    """The batcher's and the learner's parts for the worker's ``ready`` requests: act on them,
    then release every full slot."""
    batcher.refresh_weights()
    batcher.infer(np.zeros(len(ready), np.int64), np.array(ready))
    for request in ready:
        worker.act(request)
    while (batch := full.next_batch()) is not None:
        full.release(batch[1])


def test_snapshot_rows_are_never_trained_on_and_every_game_has_one_policy_seat(monkeypatch):
    # The policy plays action 0; snapshot 20 plays 1 and snapshot 30 plays 2: the action says who acted.
    cfg = selfplay_games(3, **{"selfplay.latest_prob": 0.5})
    spec = probe_env(cfg)
    policies = policy_map(cfg, spec.agents)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    arena = selfplay_arena(cfg, num_state_values(model))
    WeightBuffer(arena, 0).publish(forced_policy_weights(model, 0), POLICY_VERSION)
    league = League(arena, 1, cfg.selfplay, None)
    league.after_update(20, forced_policy_weights(model, 1))
    league.after_update(30, forced_policy_weights(model, 2))
    arena.league_weights[:] = 1.0
    batcher = InferenceBatcher(arena, model, spec.action_space, torch.device("cpu"))
    put = PolicyQueues.put
    emitted = []

    def recorded_put(queues, slot_ids):
        contents = [arena.valid[slot_ids].copy(), arena.actions[slot_ids].copy(), arena.version[slot_ids].copy(),
                    arena.obs[slot_ids].copy()]
        put(queues, slot_ids)
        emitted.append((*contents, arena.slot_queued[slot_ids] == 1))

    monkeypatch.setattr(PolicyQueues, "put", recorded_put)
    E, n = cfg.env.envs_per_worker, len(spec.agents)
    worker, full = selfplay_worker(cfg, arena, policies)
    delivered, seats, opponents = [], set(), set()
    for _ in range(120):
        ready = [worker.recv_batch() for _ in iter(worker.can_recv, False)]
        actors = arena.env_actor[0].reshape(E // n, n)
        np.testing.assert_array_equal((actors == 0).sum(axis=1), 1)  # one policy seat per game
        assert set(np.unique(actors).tolist()) <= {0, 1, 2}  # the others: a snapshot's weight set
        seats.update(np.argmax(actors == 0, axis=1).tolist())
        opponents.update(np.unique(actors[actors > 0]).tolist())
        batcher.refresh_weights()
        batcher.infer(np.zeros(len(ready), np.int64), np.array(ready))
        for request in ready:
            worker.act(request)
        while (batch := full.next_batch()) is not None:
            _, ids = batch
            delivered.append(arena.valid[ids].copy())
            full.release(ids)
    worker.env.close()
    assert seats == {0, 1, 2} and opponents == {1, 2}
    for valid, actions, versions, obs, queued in emitted:
        policy_acted = actions == 0
        np.testing.assert_array_equal(versions, np.where(policy_acted, POLICY_VERSION, 10 * (actions + 1)))
        autoreset = obs[:, 1:, 0] == 0  # the step's new observation is a reset one (t = 0)
        np.testing.assert_array_equal(valid, policy_acted & ~autoreset)  # the policy's own steps only
        np.testing.assert_array_equal(queued, valid.any(axis=1))  # no valid step: released, never queued
    dropped = sum(int((~queued).sum()) for *_, queued in emitted)
    assert dropped > 0 and delivered and all(valid.any(axis=1).all() for valid in delivered)
    # Each finished episode is tagged with who played it; the policy's with its opponent's version.
    count = int(arena.episode_count[0])
    actor, opponent = arena.episode_actor[0, :count], arena.episode_opponent[0, :count]
    assert set(opponent[actor == 0].tolist()) == {20, 30} and set(opponent[actor > 0].tolist()) == {-1}


def test_every_fold_game_has_one_policy_seat_against_its_drawn_snapshot_and_counts_for_both_seats():
    # The fold game, the first mover drawn per game. The policy calls; snapshot 20 folds (a game
    # over before the policy's first turn when it moves first) and snapshot 30 calls.
    cfg = build_config("cartpole-appo", {
        "env.id": COUNT_GAME, "env.kwargs": {"game": "fold"}, "env.num_workers": 1, "env.envs_per_worker": 8,
        "env.num_splits": 4, "learner.rollout": 4, "learner.batch_size": 16, "slots_per_env": 4,
        "model.hidden_sizes": [16], "selfplay.enabled": True, "selfplay.max_snapshots": 2,
        "selfplay.latest_prob": 0.5, "inference.in_workers": False, "device": "cpu"})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    arena = selfplay_arena(cfg, num_state_values(model))
    WeightBuffer(arena, 0).publish(forced_policy_weights(model, 1), POLICY_VERSION)
    league = League(arena, 1, cfg.selfplay, None)
    league.after_update(20, forced_policy_weights(model, 0))
    league.after_update(30, forced_policy_weights(model, 1))
    arena.league_weights[:] = 1.0
    batcher = InferenceBatcher(arena, model, spec.action_space, torch.device("cpu"))
    E, n = cfg.env.envs_per_worker, 2
    worker, full = selfplay_worker(cfg, arena, policy_map(cfg, spec.agents))
    played = {}  # (game, episode) -> {seat: (actor, trained, opponent)} at each seat's episode end
    for _ in range(150):
        ready = []
        while worker.can_recv():
            request = worker.recv_batch()
            ready.append(request)
            ids = arena.request_envs[0][request]
            ended = ids[(arena.env_final[0][ids] == 1) & (arena.env_start[0][ids] == 0)]
            for row in [*ended.tolist(), *worker.env.last_unplayed[0].tolist()]:
                game = row // n
                seats = played.setdefault((game, int(worker.env.episodes_begun[game])), {})
                assert row % n not in seats  # one episode per seat and game
                seats[row % n] = (int(worker.row_actor[row]), int(worker.row_trained[row]),
                                  int(worker.row_opponent[row]))
        answer(worker, batcher, full, ready)
    worker.env.close()
    finished = [seats for seats in played.values() if len(seats) == n]
    assert len(finished) >= len(played) - E // n and len(finished) > 100  # at most the last game of each open
    for seats in finished:
        policy = [s for s, (actor, trained, _) in seats.items() if actor == 0]
        assert len(policy) == 1 and seats[policy[0]][1] == 1  # exactly one seat the policy's, trained
        (snapshot, untrained, none), = [tags for s, tags in seats.items() if s != policy[0]]
        assert snapshot > 0 and untrained == 0 and none == -1
        assert arena.weight_version[snapshot] == seats[policy[0]][2]  # the snapshot recorded is the one that played
    # Every finished game is an episode of both seats: a fold before the policy's first turn is its win.
    count = int(arena.episode_count[0])
    actor, opponent = arena.episode_actor[0, :count], arena.episode_opponent[0, :count]
    returns, lengths = arena.episode_return[0, :count], arena.episode_length[0, :count]
    assert count == sum(len(seats) for seats in played.values())
    assert (actor == 0).sum() == sum(any(a == 0 for a, *_ in seats.values()) for seats in played.values())
    folded = (actor == 0) & (lengths == 0)
    assert folded.any() and (returns[folded] == 1.0).all() and set(opponent[folded].tolist()) == {20}


def read_snapshot(path) -> np.ndarray:
    return torch.load(path, weights_only=True)["weights"].numpy()


def published(arena, index: int, size: int) -> tuple[int, np.ndarray]:
    out = np.empty(size, np.float32)
    version = WeightBuffer(arena, index).read_into(out)
    assert version is not None
    return version, out


def test_snapshots_are_taken_every_k_updates_kept_bounded_and_never_change(tmp_path):
    cfg = selfplay_games()
    arena = selfplay_arena(cfg, 6)
    league = League(arena, 1, cfg.selfplay, tmp_path)
    rng = np.random.default_rng(0)
    taken = {}
    for version in range(75):
        flat = rng.normal(size=6).astype(np.float32)
        league.after_update(version, flat)
        if version % 10 == 0:
            taken[version] = flat.copy()
        flat[:] = np.nan  # the learner's buffer goes on changing
        live = [v for v in arena.weight_version[1:].tolist() if v >= 0]
        assert sorted(live) == sorted(taken)[-3:]
        for j in np.flatnonzero(arena.weight_version[1:] >= 0):
            v, weights = published(arena, 1 + j, 6)
            np.testing.assert_array_equal(weights, taken[v])
        on_disk = saved_snapshots(tmp_path)
        assert [v for v, _ in on_disk] == sorted(taken)[-3:]  # the oldest deleted
        for v, path in on_disk:
            np.testing.assert_array_equal(read_snapshot(path), taken[v])
    league.after_update(80, np.full(6, np.inf, np.float32))  # non-finite weights: no snapshot
    assert [v for v, _ in saved_snapshots(tmp_path)] == [50, 60, 70]
    league.after_update(81, np.ones(6, np.float32))
    assert [v for v, _ in saved_snapshots(tmp_path)] == [60, 70, 81]
    # A resumed run's league: the saved snapshots, published as they were.
    resumed = selfplay_arena(cfg, 6)
    restored = League(resumed, 1, cfg.selfplay, tmp_path)
    restored.restore(6)
    taken[81] = np.ones(6, np.float32)
    assert sorted(resumed.weight_version[1:].tolist()) == [60, 70, 81]
    for j in range(3):
        v, weights = published(resumed, 1 + j, 6)
        np.testing.assert_array_equal(weights, taken[v])
    restored.after_update(90, np.zeros(6, np.float32))
    assert [v for v, _ in saved_snapshots(tmp_path)] == [60, 70, 81]  # 9 updates since the newest
    restored.after_update(91, np.zeros(6, np.float32))
    assert [v for v, _ in saved_snapshots(tmp_path)] == [70, 81, 91]


@pytest.mark.parametrize("power", [2.0, 1.0, 0.0])
def test_pfsp_weights_follow_the_win_rate_against_each_snapshot(tmp_path, power):
    cfg = selfplay_games(**{"selfplay.pfsp_power": power})
    arena = selfplay_arena(cfg, 6)
    arena.weight_version[1:] = [10, 20, 30]
    record = LeagueRecord(arena, 1, cfg.selfplay, tmp_path, "main")
    np.testing.assert_allclose(arena.league_weights, [0.5 ** power] * 3)  # unplayed: neither sought nor avoided
    # Against 10: four wins (rate 1); against 20: a win, two draws, a loss (0.5); against 30: two losses (0).
    opponents = np.array([10, 10, 10, 10, 20, 20, 20, 20, 30, 30])
    returns = np.array([1.0, 0.3, 2.0, 1.0, 1.0, 0.0, 0.0, -1.0, -1.0, -0.2])
    report = record.record(opponents, returns)
    np.testing.assert_allclose(arena.league_weights, [0.0 ** power, 0.5 ** power, 1.0 ** power])
    assert report["league/games"] == 10 and report["league/snapshots"] == 3
    assert report["league/win_rate"] == pytest.approx(0.5) and report["league/draw_rate"] == pytest.approx(0.2)
    assert report["league/loss_rate"] == pytest.approx(0.3)
    ratings = report["league/snapshot_ratings"]
    assert set(ratings) == {"10", "20", "30"} and ratings["30"] > ratings["20"] > ratings["10"]
    assert np.isfinite(report["league/rating"])
    # The record is kept in the run directory: a new runner carries on from it.
    saved = json.loads((league_dir(tmp_path) / "record.json").read_text())
    assert saved["results"] == {"10": [4, 0, 0], "20": [1, 2, 1], "30": [0, 0, 2]}
    arena.league_weights[:] = -1.0
    again = LeagueRecord(arena, 1, cfg.selfplay, tmp_path, "main")
    assert again.results == {10: [4, 0, 0], 20: [1, 2, 1], 30: [0, 0, 2]}
    np.testing.assert_allclose(arena.league_weights, [0.0 ** power, 0.5 ** power, 1.0 ** power])
    assert again.rating("snapshot-30").mu == pytest.approx(record.rating("snapshot-30").mu)


def test_the_record_keeps_its_results_until_their_snapshot_leaves_the_league(tmp_path):
    cfg = selfplay_games()
    arena = selfplay_arena(cfg, 6)
    arena.weight_version[1:] = [10, 20, 30]
    LeagueRecord(arena, 1, cfg.selfplay, tmp_path, "main").record(np.array([10, 20, 30]), np.array([1.0, -1.0, 0.0]))
    # A resumed run: the runner reports before the learner has restored the league.
    resumed = selfplay_arena(cfg, 6)
    record = LeagueRecord(resumed, 1, cfg.selfplay, tmp_path, "main")
    record.record(np.array([], np.int64), np.array([]))
    assert json.loads((league_dir(tmp_path) / "record.json").read_text())["results"] == {
        "10": [1, 0, 0], "20": [0, 0, 1], "30": [0, 1, 0]}
    resumed.weight_version[1:] = [40, 20, 30]  # 10, the oldest, has left
    record.record(np.array([40]), np.array([1.0]))
    saved = json.loads((league_dir(tmp_path) / "record.json").read_text())
    assert saved["results"] == {"20": [0, 0, 1], "30": [0, 1, 0], "40": [1, 0, 0]}
    assert set(saved["ratings"]) == {"main", "snapshot-20", "snapshot-30", "snapshot-40"}


def test_the_draw_picks_the_newest_with_latest_prob_and_older_ones_by_pfsp_weight():
    cfg = selfplay_games(3, **{"selfplay.max_snapshots": 4, "selfplay.latest_prob": 0.3})
    arena = selfplay_arena(cfg, 6)
    arena.weight_version[1:] = [5, 15, 10, -1]  # set 2 (version 15) is the newest; set 4 is empty
    arena.league_weights[:] = [0.1, 5.0, 0.6, 9.0]  # the newest's and the empty set's weights play no part
    games, n = 100, 3
    seats = SelfPlaySeats(arena, games * n, n, 1, cfg.selfplay, seed=7)
    rows = np.arange(games * n)
    actor, trained, opponent = np.zeros(games * n, np.int16), np.ones(games * n, np.uint8), np.zeros(games * n)
    drawn_seats, drawn = [], []
    for episode in range(1, 21):
        seats.start_rows(rows, np.full(games, episode), actor, trained, opponent)
        by_game = actor.reshape(games, n)
        np.testing.assert_array_equal((by_game == 0).sum(axis=1), 1)
        np.testing.assert_array_equal(trained, actor == 0)
        seat = np.argmax(by_game == 0, axis=1)
        versions = opponent.reshape(games, n)[np.arange(games), seat]
        others = by_game[by_game > 0].reshape(games, n - 1)
        assert (arena.weight_version[others] == versions[:, None]).all()  # they play that snapshot
        assert (opponent.reshape(games, n)[by_game > 0] == -1).all()
        drawn_seats.extend(seat.tolist())
        drawn.extend(versions.tolist())
    drawn, total = np.array(drawn), len(drawn)  # 2,000 games
    assert set(drawn.tolist()) == {5, 10, 15}
    newest = (drawn == 15).mean()
    assert abs(newest - 0.3) < 4 * np.sqrt(0.3 * 0.7 / total)
    older = drawn[drawn != 15]
    p5 = 0.1 / 0.7
    assert abs((older == 5).mean() - p5) < 4 * np.sqrt(p5 * (1 - p5) / len(older))
    for k in range(n):
        share = np.mean(np.array(drawn_seats) == k)
        assert abs(share - 1 / 3) < 4 * np.sqrt(2 / 9 / total)


def count_game_config(steps: int, **overrides):
    settings = {"env.id": COUNT_GAME, "env.kwargs": {"seats": 2, "target": 5}, "env.num_workers": 1,
                "env.envs_per_worker": 8, "env.num_splits": 4, "learner.rollout": 4, "learner.batch_size": 16,
                "slots_per_env": 4, "model.hidden_sizes": [16], "selfplay.enabled": True,
                "selfplay.snapshot_every": 5, "selfplay.max_snapshots": 3, "train_for_env_steps": steps,
                "report_every_s": 0.2, "serial": True, "inference.in_workers": False, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def test_pfsp_counts_the_latest_games_and_a_new_snapshot_starts_at_the_policys_rating(tmp_path):
    cfg = selfplay_games(**{"selfplay.pfsp_window": 4, "selfplay.pfsp_power": 1.0})
    arena = selfplay_arena(cfg, 6)
    arena.weight_version[1:] = [10, -1, -1]
    record = LeagueRecord(arena, 1, cfg.selfplay, tmp_path, "main")
    record.record(np.full(10, 10), np.full(10, -1.0))  # ten losses to snapshot 10 ...
    assert arena.league_weights[0] == pytest.approx(1.0)
    record.record(np.full(4, 10), np.full(4, 1.0))  # ... then four wins: the latest four count
    assert record.win_rate(10) == 1.0 and arena.league_weights[0] == pytest.approx(0.0)
    assert record.results[10] == [4, 0, 10]  # the totals stay in the record
    policy = record.ratings["main"]
    arena.weight_version[2] = 20  # a snapshot of the policy taken since: rated as the policy is
    report = record.record(np.zeros(0, np.int64), np.zeros(0))
    assert (record.ratings["snapshot-20"].mu, record.ratings["snapshot-20"].sigma) == (policy.mu, policy.sigma)
    assert report["league/snapshot_ratings"]["20"] == pytest.approx(report["league/rating"])
    again = LeagueRecord(arena, 1, cfg.selfplay, tmp_path, "main")  # the window is kept on disk
    assert again.win_rate(10) == 1.0 and list(again.recent[10]) == [1, 1, 1, 1]


def league_files(run_dir):
    return sorted(path.name for path in league_dir(run_dir).iterdir())


def watch_league_starts(monkeypatch, record_view=lambda record: {v: list(r) for v, r in record.results.items()}):
    """What each start of a league restores: the snapshot versions (one sorted list per start)
    and ``record_view`` of the record it begins with (one per start), filled as runs start."""
    restored, started = [], []
    restore, record_init = League.restore, LeagueRecord.__init__

    def restore_seen(league, num_values):
        restore(league, num_values)
        restored.append(sorted(v for v in league.versions if v >= 0))

    def record_seen(record, *args, **kwargs):
        record_init(record, *args, **kwargs)
        started.append(record_view(record))

    monkeypatch.setattr(League, "restore", restore_seen)
    monkeypatch.setattr(LeagueRecord, "__init__", record_seen)
    return restored, started


def test_a_new_run_never_restores_a_league_it_finds(tmp_path, monkeypatch):
    restored, started = watch_league_starts(monkeypatch)
    # An earlier run's league, and no run marker beside it (it was killed before its first checkpoint).
    cfg = count_game_config(300)
    spec = probe_env(cfg)
    size = num_state_values(build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo))
    for version in (1_000, 2_000):
        write_checkpoint_file(snapshot_path(tmp_path, version), {"version": version, "weights": torch.zeros(size)})
    (league_dir(tmp_path) / "record.json").write_text(json.dumps({"results": {"1000": [5, 0, 0]}, "ratings": {}}))
    train(cfg, run_dir=tmp_path, quiet=True)
    assert started == [{}] and restored == [[]]
    names = league_files(tmp_path)
    assert {"snapshot-000000001000.pt.bad", "snapshot-000000002000.pt.bad", "record.json.bad"} <= set(names)
    assert all(v < 1_000 for v, _ in saved_snapshots(tmp_path))


TIC_TAC_TOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def test_scripted_opponents_in_the_league_play_their_own_moves_and_are_reported_apart(tmp_path):
    # Tic-tac-toe, every game against a scripted opponent once a snapshot is in the league: the
    # perfect player or random moves. The policy's rows are the only ones trained, the scripted
    # seat's moves are the opponent's (a perfect player never loses), and the runner's record
    # reports those games under the opponent's name, not as games against snapshots.
    cfg = build_config("cartpole-appo", {
        "env.id": TIC_TAC_TOE, "env.num_workers": 1, "env.envs_per_worker": 16, "env.num_splits": 4,
        "learner.rollout": 4, "learner.batch_size": 32, "slots_per_env": 4, "model.hidden_sizes": [16],
        "selfplay.enabled": True, "selfplay.max_snapshots": 2, "selfplay.scripted_prob": 1.0,
        "selfplay.scripted_opponents": ["tictactoe_minimax", "random"], "inference.in_workers": False,
        "device": "cpu"})
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    arena = selfplay_arena(cfg, num_state_values(model))
    WeightBuffer(arena, 0).publish(forced_policy_weights(model, 0), POLICY_VERSION)
    League(arena, 1, cfg.selfplay, None).after_update(20, forced_policy_weights(model, 0))
    arena.league_weights[:] = 1.0
    batcher = InferenceBatcher(arena, model, spec.action_space, torch.device("cpu"))
    worker, full = selfplay_worker(cfg, arena, policy_map(cfg, spec.agents))
    for _ in range(100):
        ready = [worker.recv_batch() for _ in iter(worker.can_recv, False)]
        answer(worker, batcher, full, ready)
    worker.env.close()
    count = int(arena.episode_count[0])
    actor, opponent = arena.episode_actor[0, :count], arena.episode_opponent[0, :count]
    returns = arena.episode_return[0, :count]
    ours = actor == 0
    assert set(opponent[ours].tolist()) <= {scripted_tag(0), scripted_tag(1)}  # no game against the snapshot
    assert set(opponent[~ours].tolist()) == {NO_OPPONENT} and set(actor[~ours].tolist()) == {1}
    against_minimax, against_random = returns[ours & (opponent == scripted_tag(0))], \
        returns[ours & (opponent == scripted_tag(1))]
    assert len(against_minimax) > 15 and len(against_random) > 15
    # The policy plays cell 0 while it is free, then random legal cells (forced weights, masked): the perfect player
    # wins or draws every game, and random moves lose some.
    assert (against_minimax <= 0).all() and (against_minimax < 0).mean() > 0.5
    assert (against_random > 0).any()

    record = LeagueRecord(arena, 1, cfg.selfplay, tmp_path, "main")
    report = record.record(opponent[ours], returns[ours])
    assert report["league/games"] == 0 and report["league/scripted/tictactoe_minimax/games"] == len(against_minimax)
    assert report["league/scripted/tictactoe_minimax/win_rate"] == 0.0
    assert report["league/scripted/random/win_rate"] == pytest.approx((against_random > 0).mean())
    assert sum(report[f"league/scripted/random/{k}"] for k in ("win_rate", "draw_rate", "loss_rate")) == \
        pytest.approx(1.0)


def test_no_scripted_opponent_is_drawn_before_the_first_snapshot_nor_past_its_probability():
    cfg = selfplay_games(2, **{"selfplay.scripted_opponents": ["random"], "selfplay.scripted_prob": 0.25})
    arena = selfplay_arena(cfg, 6)
    seats = SelfPlaySeats(arena, 2 * 400, 2, 1, cfg.selfplay, seed=3, scripted=[lambda observation, agent: 0])
    for g in range(400):
        seats._draw(g)
    assert (seats.game_scripted == -1).all() and (seats.game_opponent == NO_OPPONENT).all()
    arena.weight_version[1:] = [10, -1, -1]
    for g in range(400):
        seats._draw(g)
    scripted = seats.game_scripted == 0
    assert 0.18 < scripted.mean() < 0.32
    assert (seats.game_opponent[scripted] == scripted_tag(0)).all() and (seats.game_actor[scripted] == 1).all()
    assert (seats.game_opponent[~scripted] == 10).all()


@pytest.mark.parametrize("overrides, message", [
    ({"selfplay.enabled": False, "selfplay.scripted_opponents": ["random"], "selfplay.scripted_prob": 0.2},
     "selfplay.scripted_opponents play in self-play's league: set selfplay.enabled=true"),
    ({"selfplay.scripted_prob": 0.2}, "selfplay.scripted_prob=0.2 draws from selfplay.scripted_opponents, and none "
                                      "are listed"),
    ({"selfplay.scripted_opponents": ["random"]}, "would play no game with selfplay.scripted_prob = 0"),
    ({"selfplay.scripted_opponents": ["random", "random"], "selfplay.scripted_prob": 0.2},
     "selfplay.scripted_opponents lists an opponent twice"),
])
def test_scripted_opponents_that_would_play_nothing_or_twice_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        count_game_config(1_000, **overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_scripted_opponent_that_cannot_play_the_game_is_refused_before_the_run_starts(tmp_path):
    cfg = count_game_config(1_000, **{"env.id": TIC_TAC_TOE, "env.kwargs": {},
                                      "selfplay.scripted_opponents": ["connect_four_one_ply"],
                                      "selfplay.scripted_prob": 0.5})
    with pytest.raises(ConfigError, match="connect_four_one_ply plays PettingZoo's connect_four_v3"):
        train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
