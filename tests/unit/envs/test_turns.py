"""Turn-based PettingZoo (AEC) games, every seat a row whose trajectory holds only its own turns
(fastrl/envs/multiagent/pettingzoo_turns.py)."""
import contextlib
import io
import json
from collections import Counter

import numpy as np
import pytest
import torch
from pettingzoo.classic import tictactoe_v3

from fastrl.cli import eval_main
from fastrl.config import build_config
from fastrl.envs import make_vec_env, probe_env
from fastrl.envs.spaces import MASK_KEY, ObsLayout, UnsupportedSpace
from fastrl.learner.losses import vtrace_targets
from fastrl.run.training import train
from tests.support.turn_based_envs import move_rewards
from tests.unit.sampling.test_rollout_worker import run_worker

COUNT_GAME = "pettingzoo:tests.support.turn_based_envs"


def count_config(seats=2, target=5, max_turns=None, **overrides):
    settings = {"env.id": COUNT_GAME, "env.kwargs": {"seats": seats, "target": target, "max_turns": max_turns},
                "env.num_workers": 1, "env.envs_per_worker": 2 * seats, "env.num_splits": seats,
                "learner.rollout": 4, "learner.batch_size": 8 * seats, "slots_per_env": 10,
                "learner.reward_scale": 1.0, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def reference_reports(seat, seats, target, max_turns, games):
    """Brute force: what seat ``seat``'s row reports, game after game, when every move adds 1:
    ``(turn observed, reward, terminated, truncated)``, one per turn it plays and a final one."""
    length = target if max_turns is None else min(target, max_turns)
    won = length == target

    def received(start, stop):  # the seat's rewards from the moves start .. stop - 1
        return sum(move_rewards(j, j % seats, seats, target if won else -1)[seat] for j in range(start, stop))

    reports = []
    for _ in range(games):
        own = [m for m in range(length) if m % seats == seat]
        reports.append((own[0], 0.0, False, False))  # the reset step: nothing received before its first turn
        reports += [(m, received(prev, m), False, False) for prev, m in zip(own, own[1:])]
        # Cut short, a seat not to move bootstraps from its last turn: the value its trajectory trains.
        final_turn = length if won or length % seats == seat else own[-1]
        reports.append((final_turn, received(own[-1], length), won, not won))
    return reports


@pytest.mark.parametrize("seats, target, max_turns", [(2, 5, None), (2, 4, None), (2, 6, 3), (3, 7, None)],
                         ids=["first-seat-wins", "second-seat-wins", "truncated", "three-seats"])
def test_a_seats_trajectory_holds_exactly_its_own_turns(seats, target, max_turns):
    cfg = count_config(seats, target, max_turns)
    T = cfg.learner.rollout
    arena, full = run_worker(cfg, steps_per_env=40)
    assert len(full) >= 2 * cfg.env.envs_per_worker
    emitted = {row: 0 for row in range(cfg.env.envs_per_worker)}
    for slot in full:
        row = int(arena.slot_env[slot])
        game, seat = divmod(row, seats)
        reports = reference_reports(seat, seats, target, max_turns, games=40)
        window = reports[emitted[row] * T:emitted[row] * T + T + 1]  # the slot's T + 1 observations
        emitted[row] += 1
        obs = arena.obs[slot]  # [T + 1, 4]: seat, turn, count, game
        np.testing.assert_array_equal(obs[:, 0], seat)
        np.testing.assert_array_equal(obs[:, 1], [turn for turn, *_ in window])
        np.testing.assert_array_equal(obs[:, 2], obs[:, 1])  # every move adds 1
        np.testing.assert_array_equal(obs[:, 3], (cfg.seed * 1_000_003) % 2**31 + game * seats)
        np.testing.assert_allclose(arena.rewards[slot], [reward for _, reward, *_ in window[1:]], rtol=1e-6)
        np.testing.assert_array_equal(arena.terminated[slot], [term for *_, term, _ in window[1:]])
        np.testing.assert_array_equal(arena.truncated[slot], [trunc for *_, trunc in window[1:]])
        # Only the step after a final one (its reset step) is invalid: no waiting turn is a step.
        np.testing.assert_array_equal(arena.valid[slot], [not (term or trunc) for *_, term, trunc in window[:-1]])
    assert min(emitted.values()) >= 2


def test_a_game_lost_on_the_opponents_move_ends_the_losers_last_turn_with_its_loss():
    cfg = count_config(2, 5)  # player_0 plays moves 0, 2, 4 and wins on move 4
    arena, full = run_worker(cfg, steps_per_env=12)
    loser = [slot for slot in full if arena.slot_env[slot] == 1][0]
    obs = arena.obs[loser]
    # Turns 1 and 3, then the end after the opponent's winning move: 2 steps, the second one lost.
    np.testing.assert_array_equal(obs[:3, 1], [1, 3, 5])
    np.testing.assert_allclose(arena.rewards[loser, :2], [0.03, 0.05 - 1.0], rtol=1e-6)
    np.testing.assert_array_equal(arena.terminated[loser, :2], [False, True])
    count, lengths, returns = arena.episode_count[0], arena.episode_length[0], arena.episode_return[0]
    episodes = {(int(n), round(float(r), 4)) for n, r in zip(lengths[:count], returns[:count])}
    assert episodes == {(3, round(0.02 + 0.04 + 1.0, 4)), (2, round(0.03 + 0.05 - 1.0, 4))}


def test_a_seat_that_never_plays_a_game_has_no_step_in_it_and_its_episode_is_reported():
    # Three seats and the count reaches 2 on move 1: player_2 never plays, every game.
    env = make_vec_env(COUNT_GAME, num_envs=6, batch_size=2, seed=0, env_kwargs={"seats": 3, "target": 2})
    env.async_reset()
    seen, unplayed = [], []
    for _ in range(12):
        obs, rewards, terminated, truncated, ids = env.recv()
        seen += ids.tolist()
        rows, returns = env.last_unplayed
        unplayed.append(sorted(zip(rows.tolist(), np.round(returns, 6).tolist())))
        env.send(np.zeros(len(ids), np.int64), ids)
    env.close()
    assert set(seen) == {0, 1, 3, 4}
    assert seen[:8] == [0, 3, 1, 4, 0, 3, 1, 4]  # turns, then each seat's final step, then the next game
    # Its episode of each game, reported with the game's first final step: every reward it got
    # (it waited on moves 0 and 1, and player_1 won on move 1).
    lost = round(0.01 + 0.02 - 1.0, 6)
    assert unplayed == [[], [], [(2, lost), (5, lost)], []] * 3


def test_seats_with_different_spaces_cannot_share_the_policy():
    with pytest.raises(UnsupportedSpace) as error:
        make_vec_env(COUNT_GAME, num_envs=4, batch_size=2, seed=0, env_kwargs={"uneven": True})
    message = str(error.value)
    assert "\n" not in message and "player_0: Box" in message and "player_1: Box" in message


def test_splits_must_be_a_multiple_of_the_seats():
    cfg = count_config(2, 5, **{"env.envs_per_worker": 6, "env.num_splits": 3, "learner.batch_size": 24})
    with pytest.raises(ValueError, match=r"turn-based game of 2 seats: .* env.num_splits \(3\) must be a multiple "
                                         r"of 2") as error:
        probe_env(cfg)
    assert "\n" not in str(error.value)


def check_self_play_trains_and_evaluates(tmp_path, env_id, serial, env_steps, turns):
    """Two groups of two games a worker (two batches in flight) train ``env_steps`` serial (with
    evaluation during training) or with processes, and fastrl-eval evaluates; each seat plays
    ``turns`` (min, max) turns of a game."""
    cfg = build_config("cartpole-appo", {
        "env.id": env_id, "env.num_workers": 1 if serial else 2, "env.envs_per_worker": 8,
        "env.num_splits": 4, "learner.rollout": 8, "learner.batch_size": 64, "train_for_env_steps": env_steps,
        "report_every_s": 0.5, "serial": serial, "inference.in_workers": False, "device": "cpu",
        "eval.every_s": 0.05 if serial else 0.0, "eval.episodes": 4})
    result = train(cfg, run_dir=tmp_path, quiet=True)
    assert result.final["env_steps"] >= env_steps and result.final["learner_updates"] > 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    returns = [r["episode_return_mean"] for r in records if r["episode_return_mean"] is not None]
    lengths = [r["episode_length_mean"] for r in records if r["episode_length_mean"] is not None]
    # Self-play: every game a win and a loss (or two draws).
    assert returns and all(abs(r) <= 1.0 for r in returns)
    assert lengths and all(turns[0] <= n <= turns[1] for n in lengths)
    if serial:
        assert any(r.get("eval_episodes") == 4 for r in records)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert eval_main([str(tmp_path), "--episodes", "4"]) == 0
    evaluated = json.loads(printed.getvalue())
    assert evaluated["episodes"] == 4 and turns[0] <= evaluated["episode_length_mean"] <= turns[1]


TIC_TAC_TOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def played_streams(cfg, steps_per_env: int, seed: int = 0):
    """Random legal moves through one worker (the batcher's part played by hand, as run_worker
    does): each row's stream from its full slots, in order (packed observations ``[n + 1]``,
    actions, rewards, flags and valid ``[n]``), and the worker's finished episodes."""
    rng = np.random.default_rng(seed)
    layout = ObsLayout(probe_env(cfg).observation_space)

    def choose(obs):
        masks = layout.unpack(torch.as_tensor(obs))[MASK_KEY].numpy()
        return [rng.choice(np.flatnonzero(mask)) if mask.any() else 0 for mask in masks]

    arena, full = run_worker(cfg, steps_per_env, choose)
    streams = {row: {"obs": [], "actions": [], "rewards": [], "terminated": [], "truncated": [], "valid": []}
               for row in range(cfg.env.envs_per_worker)}
    for slot in full:
        stream = streams[int(arena.slot_env[slot])]
        stream["obs"] += list(arena.obs[slot, 0 if not stream["obs"] else 1:])
        for key in ("actions", "rewards", "terminated", "truncated", "valid"):
            stream[key] += list(getattr(arena, key)[slot])
    count = int(arena.episode_count[0])
    episodes = sorted(zip(arena.episode_return[0, :count].tolist(), arena.episode_length[0, :count].tolist()))
    return layout, streams, episodes


def referee(actions: list[list[int]], layout):
    """Brute force: the games the seats' ``actions`` make in a plain tictactoe_v3, played through
    PettingZoo's own loop (``agent_iter`` / ``last``). Per seat, what it sees at each of its
    records: ``(packed observation, reward since its last action, terminated, truncated)``, the
    action it takes at a record ending its game being ignored; and the finished episodes
    ``(return, turns)``. Stops where a seat's actions run out."""
    game = tictactoe_v3.env()
    records, episodes, cursor = [[] for _ in actions], [], [0] * len(actions)
    while True:
        game.reset()
        returns, turns = [0.0] * len(actions), [0] * len(actions)
        for agent in game.agent_iter():
            seat = game.possible_agents.index(agent)
            observation, reward, terminated, truncated, _ = game.last()
            records[seat].append((layout.pack({k: v[None] for k, v in observation.items()}, 1)[0], float(reward),
                                  terminated, truncated))
            returns[seat] += reward
            if cursor[seat] == len(actions[seat]):
                return records, episodes
            ended = terminated or truncated
            turns[seat] += not ended
            game.step(None if ended else int(actions[seat][cursor[seat]]))
            cursor[seat] += 1
        episodes += list(zip(returns, turns))


def test_tic_tac_toe_trajectories_are_the_games_played_draws_included():
    cfg = count_config(**{"env.id": TIC_TAC_TOE, "env.kwargs": {}, "env.envs_per_worker": 16, "env.num_splits": 4,
                          "learner.rollout": 8, "learner.batch_size": 128, "slots_per_env": 60})
    layout, streams, episodes = played_streams(cfg, steps_per_env=200)
    mask_bytes = layout.leaves[0].nbytes if layout.leaves[0].name == MASK_KEY else None
    assert mask_bytes == 36 and layout.leaves[1].offset == 40  # the mask first, then the board
    expected_episodes, outcomes = [], []
    for game in range(cfg.env.envs_per_worker // 2):
        seats = [streams[2 * game + k] for k in range(2)]
        records, played = referee([seat["actions"] for seat in seats], layout)
        expected_episodes += played
        for seat, expected in zip(seats, records):
            n = min(len(seat["obs"]), len(expected))  # the other seat's actions may run out first
            assert n >= len(seat["obs"]) - 6 and n > 40
            obs, want = np.stack(seat["obs"][:n]), np.stack([record[0] for record in expected[:n]])
            final = np.array([terminated or truncated for *_, terminated, truncated in expected[:n]])
            np.testing.assert_array_equal(obs[:, 40:], want[:, 40:])  # the board, from the seat's side
            # The legal moves at every turn; not at a final observation, whose action is ignored
            # (PettingZoo shows the moves of the seat selected next, fastrl the seat's own view then).
            np.testing.assert_array_equal(obs[~final, :mask_bytes], want[~final, :mask_bytes])
            np.testing.assert_array_equal(seat["rewards"][:n - 1], [r for _, r, *_ in expected[1:n]])
            np.testing.assert_array_equal(seat["terminated"][:n - 1], final[1:])
            np.testing.assert_array_equal(seat["truncated"][:n - 1], False)
            np.testing.assert_array_equal(seat["valid"][:n - 1], ~final[:-1])  # the step after a final one
            outcomes += [r for (_, r, *_), end in zip(expected[1:n], final[1:]) if end]
            check_targets_are_outcomes(seat, final[:n - 1], n - 1)
    # Every outcome occurs, draws as reward 0 for both seats; the episodes the worker counted
    # are the referee's (those it finished by the last full slot, and a few after).
    assert {-1.0, 0.0, 1.0} <= set(outcomes)
    assert sum(o == 0.0 for o in outcomes) >= 0.05 * len(outcomes)
    assert set(episodes) <= {(1.0, n) for n in range(3, 6)} | {(-1.0, n) for n in range(2, 5)} | {(0.0, 4), (0.0, 5)}
    assert len(expected_episodes) <= len(episodes) <= len(expected_episodes) + cfg.env.envs_per_worker
    counted = Counter(episodes)
    assert all(counted[e] >= k for e, k in Counter(expected_episodes).items())


def check_targets_are_outcomes(seat: dict, final: np.ndarray, n: int) -> None:
    """V-trace's value targets (gamma 1, zero values, on-policy) along a seat's first ``n`` steps
    are, at each of its turns, the outcome of that turn's game for the seat: the loss a seat
    suffers on the other's move reaches its last turn. ``final[t]``: observation t ends a game."""
    terminated = torch.as_tensor(np.array(seat["terminated"][:n], dtype=bool))[:, None]
    rewards = torch.as_tensor(np.array(seat["rewards"][:n], dtype=np.float32))[:, None]
    valid = torch.as_tensor(np.array(seat["valid"][:n], dtype=bool))[:, None]
    zeros = torch.zeros(n, 1)
    vs, _ = vtrace_targets(zeros, zeros, torch.zeros(n + 1, 1), rewards, 1.0 - terminated.float(), valid)
    ends = np.flatnonzero(terminated[:, 0].numpy())
    turns = np.flatnonzero(~final)
    assert len(ends) > 5
    for t in turns[turns <= ends[-1]]:
        end = ends[ends >= t][0]  # the step that ends the game of turn t
        assert vs[t, 0] == rewards[end, 0], (t, end)
