"""The tests of tests/unit/learner/test_sac.py's subject that train in this process."""

import copy
import shutil

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from fastrl.learner import SACLearner, make_learner
from fastrl.run.training import train
from tests.support.small_learners import E, T, stream_batches
from tests.support.training import read_metrics
from tests.unit.learner.test_sac import ACTION_SPACE, PROFILE, sac_config

OBS_SPACE = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)

def continuous_batches(num_batches, seed=0):
    """stream_batches with actions ``[T, E, 2]`` inside ACTION_SPACE."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for batch, env_ids in stream_batches(num_batches, seed=seed):
        low, high = torch.as_tensor(ACTION_SPACE.low), torch.as_tensor(ACTION_SPACE.high)
        batch.actions = low + (high - low) * torch.rand(T, E, 2, generator=g)
        out.append((batch, env_ids))
    return out

def test_one_update_per_env_step_trains_every_network_and_moves_the_targets_by_tau():
    torch.manual_seed(0)
    learner = make_learner(sac_config(), OBS_SPACE, ACTION_SPACE)
    assert isinstance(learner, SACLearner) and learner.target_entropy == -2.0
    batches = continuous_batches(4)
    for batch, env_ids in batches[:2]:  # 64 records: min_fill reached, no update owed yet
        learner.train(batch, env_ids=env_ids)
    actor = [p.clone() for p in learner.model.parameters()]
    critic = [p.clone() for p in learner.critic.parameters()]
    target = [p.clone() for p in learner.target_critic.parameters()]
    alpha = learner.temperature
    batch, env_ids = batches[2]
    stats = learner.train(batch, env_ids=env_ids)
    assert learner.updates == learner.replayed_batches == T * E  # replay_ratio 16 / batch 16: one per env step
    assert all(not torch.equal(a, b) for a, b in zip(actor, learner.model.parameters()))
    assert all(not torch.equal(a, b) for a, b in zip(critic, learner.critic.parameters()))
    assert learner.temperature != alpha and stats["temperature"] == pytest.approx(learner.temperature)
    # After k updates the target is (1 - tau)^k old + the rest from the critics: never a copy.
    assert all(not torch.equal(a, b) for a, b in zip(target, learner.target_critic.parameters()))
    assert {"critic_loss", "actor_loss", "temperature_loss", "q_mean", "entropy"} <= stats.keys()
    assert learner.achieved_ratio(3 * T * E) == pytest.approx(16.0)

def test_a_fixed_temperature_stays_and_has_no_optimizer_group():
    learner = make_learner(sac_config(**{"learner.learn_temperature": False, "learner.temperature": 0.05}),
                           OBS_SPACE, ACTION_SPACE)
    for batch, env_ids in continuous_batches(3):
        stats = learner.train(batch, env_ids=env_ids)
    assert learner.updates > 0 and learner.temperature == pytest.approx(0.05) and "temperature_loss" not in stats
    assert len(learner.optimizer.param_groups) == 2

def test_a_resumed_learner_continues_the_temperature_optimizers_and_counters():
    torch.manual_seed(0)
    cfg = sac_config()
    first = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    for batch, env_ids in continuous_batches(4):
        first.train(batch, env_ids=env_ids)
    state = first.state_dict()
    second = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    second.load_state_dict(state)
    assert second.temperature == first.temperature != cfg.learner.temperature
    assert (second.updates, second.version) == (first.updates, first.version) and second.updates > 0
    for name in ("critic", "target_critic"):
        a, b = getattr(first, name).state_dict(), getattr(second, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    moments = [s for s in second.optimizer.state_dict()["state"].values()]
    assert len(moments) == len(first.optimizer.state_dict()["state"]) == sum(
        len(g["params"]) for g in first.optimizer.param_groups)
    for a, b in zip(first.optimizer.state_dict()["state"].values(), moments):
        assert all(torch.equal(a[k], b[k]) for k in a)
    # The same next update from the same sample: the optimizers' moments and the temperature carry on.
    sample = first.replay.sample(16, rng=1)
    torch.manual_seed(5)
    loss_first = first.loss(sample)[0]
    torch.manual_seed(5)
    loss_second = second.loss(sample)[0]
    assert loss_first.item() == loss_second.item()

def test_n_step_prioritized_sac_stores_its_td_as_priorities_and_weights_its_samples():
    """replay.n_step = 3 and replay.alpha = 0.6, which the profile leaves at 1 and 0: the sample's
    discounts are gamma^3 mid-episode, an update writes |td| + eps of its own batch as priorities,
    and the next samples carry importance weights below 1."""
    from fastrl.learner.qlearning import PRIORITY_EPS

    torch.manual_seed(0)
    cfg = sac_config(**{"replay.n_step": 3, "replay.alpha": 0.6, "replay.beta": 0.4})
    learner = make_learner(cfg, OBS_SPACE, ACTION_SPACE)
    assert learner.prioritized
    for batch, env_ids in continuous_batches(3):
        learner.train(batch, env_ids=env_ids)
    sample = learner.replay.sample(16, rng=1)
    assert np.isclose(sample.discounts, cfg.learner.gamma ** 3).any()
    torch.manual_seed(7)
    expected = learner.loss(sample)[2].double().numpy() + PRIORITY_EPS
    written = []
    update_priorities = learner.replay.update_priorities
    learner.replay.update_priorities = lambda *args: written.append(args) or update_priorities(*args)
    learner.sample = lambda: sample
    torch.manual_seed(7)
    assert learner.update() is not None
    [(indices, generations, priorities)] = written
    assert np.array_equal(indices, sample.indices) and np.array_equal(generations, sample.generations)
    np.testing.assert_allclose(priorities, expected, rtol=1e-5)
    assert len(np.unique(priorities)) > 1
    weights = learner.replay.sample(64, rng=2).weights
    assert weights.max() <= 1.0 + 1e-6 and weights.min() < 0.99


def pendulum_config(**overrides):
    """Small networks and batches: Pendulum is solved in about 10K env steps at one update each."""
    return build_config(PROFILE, {
        "env.id": "Pendulum-v1", "device": "cpu", "learner.torch_threads": 1, "report_every_s": 2.0,
        "eval.every_s": 0.0,
        "model.hidden_sizes": [64, 64], "replay.min_fill": 1_000, "replay.batch_size": 64,
        "replay.replay_ratio": 64.0, **overrides})


def test_a_sac_run_evaluates_its_mean_action_films_it_and_fastrl_eval_plays_best_pt(tmp_path, capsys):
    """Evaluation during training (deterministic: the mean action), clips of it, best.pt from its
    best evaluation, and fastrl-eval --best --video on that file: the paths every learner shares,
    with SAC's actor behind them (Pendulum renders through pygame)."""
    pytest.importorskip("imageio_ffmpeg")
    import json

    from fastrl.cli import eval_main
    from fastrl.files.checkpoint import best_checkpoint_path, load_checkpoint

    # Steps, not seconds: a serial run evaluates at its reports, which come by env steps, and a slow
    # host took fewer than one report's steps in 6 s. Four reports of 256 env steps, each evaluated,
    # and a quarter of an update per env step: what is tested is evaluation, not learning.
    cfg = pendulum_config(**{"serial": True, "train_for_env_steps": 1_024, "report_every_env_steps": 256,
                             "replay.replay_ratio": 16.0,
                             "replay.min_fill": 200, "report_every_s": 0.5, "eval.every_s": 0.5,
                             "eval.episodes": 1, "eval.deterministic": True, "eval.video_every_s": 1.5})
    run_dir = tmp_path / "run"
    train(cfg, run_dir=run_dir, quiet=True)
    rows = read_metrics(run_dir)
    evaluated = [r for r in rows if "eval_return_mean" in r]
    assert evaluated and rows[-1]["learner_updates"] > 0
    assert all(-2_000 < r["eval_return_mean"] <= 0 for r in evaluated)  # Pendulum's 200 steps, each in [-16.3, 0]
    clips = [run_dir / r["eval_video"] for r in rows if "eval_video" in r]
    assert clips and all(clip.read_bytes()[4:8] == b"ftyp" for clip in clips)
    best = load_checkpoint(best_checkpoint_path(run_dir))
    assert best["eval"]["eval_return_mean"] == pytest.approx(max(r["eval_return_mean"] for r in evaluated))
    capsys.readouterr()
    assert eval_main([str(run_dir), "--best", "--episodes", "1", "--deterministic",
                      "--video", str(tmp_path / "best.mp4")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 1 and result["video_frames"] == 201 and (tmp_path / "best.mp4").stat().st_size > 0


# An eighth of an update per env step where the envs are slow, one where they are fast: a few
# seconds of updates at ~3 ms each (~8 ms on a slow AVX2 host) for the 1,200-1,800 env steps past
# min_fill.
@pytest.mark.parametrize("step_s, replay_ratio, replay_batch, budget, who_waits", [
    (0.005, 2.0, 16, 1_400, "learner/wait_s"),  # envs much slower than the learner: the learner waits
    (0.0, 32.0, 32, 2_000, "rollout/wait_slots_s"),  # envs much faster: the actors wait for free slots
])
def test_the_replay_ratio_holds_whichever_side_is_faster(tmp_path, step_s, replay_ratio, replay_batch, budget,
                                                         who_waits):
    cfg = build_config(PROFILE, {
        "env.id": "tests.support.paced_envs:make_paced_target", "env.kwargs": {"step_s": step_s}, "device": "cpu",
        "learner.torch_threads": 1,
        "env.num_workers": 1, "env.envs_per_worker": 4, "env.num_splits": 1, "learner.rollout": 4,
        "learner.batch_size": 16, "slots_per_env": 2, "replay.min_fill": 200, "replay.batch_size": replay_batch,
        "replay.replay_ratio": replay_ratio, "model.hidden_sizes": [16, 16], "train_for_env_steps": budget,
        "report_every_s": 1.0, "eval.every_s": 0.0})
    train(cfg, run_dir=tmp_path, quiet=True)
    records = read_metrics(tmp_path)
    first, last = next(r for r in records if r["env_steps"]), records[-1]
    # The learner is behind the actors by at most the slots' 4 envs x 2 slots x 4 steps = 32 env steps:
    # 1.8-2.7% of the 1,200-1,800 env steps past min_fill (at 800 a loaded machine missed 5% by 0.6%).
    assert last["learner/replay_ratio_achieved"] == pytest.approx(replay_ratio, rel=0.05)
    # And at every report on the way, not only at the end (where the learner trains what the budget
    # left): the env steps its updates stand for trail the actors' by at most what the slots hold
    # plus the batch in training (32 + 16; 48 at most in a trial run of each case). One rollout more
    # for the two counters being read a moment apart.
    for r in records:
        if r["env_steps"] > cfg.replay.min_fill:
            behind = r["env_steps"] - cfg.replay.min_fill - r["learner_updates"] * replay_batch / replay_ratio
            assert -16 <= behind <= 48 + 16, (r["env_steps"], r["learner_updates"])
    # The faster side waits, and more than the slower one. With envs at 5 ms a step and an update
    # per env step, CI runs on a slow host saw the learner wait 14% of the time, and 2.5 s against
    # the actors' 1.5 s; at half an update per env step a slower host saw 2.6 s against 2.6 s. An
    # eighth of one gives the learner four times that slack.
    waited = {key: last[key] - first[key] for key in ("learner/wait_s", "rollout/wait_slots_s")}
    other = next(key for key in waited if key != who_waits)
    assert waited[who_waits] > 0.1 * (last["wall_time"] - first["wall_time"])
    assert waited[who_waits] > 2 * waited[other], waited


def test_a_population_member_copies_the_sac_learner_and_keeps_its_own_replay():
    from fastrl.envs import EnvSpec
    from fastrl.ipc.arena import Arena
    from fastrl.learner.policy_set import PolicyRuntimes, make_policy_learners
    from fastrl.models.networks import num_state_values
    from fastrl.multiagent.policy_map import policy_map
    from fastrl.run.preflight import arena_layout
    from tests.support.same_state import assert_same_state
    from tests.unit.tuning.test_pbt import finish_episodes

    cfg = sac_config(**{"pbt.population": 2, "pbt.mutable": ["learner.lr", "learner.tau"], "pbt.perturb": [1.0],
                        "pbt.warmup_env_steps": 0, "pbt.period_env_steps": 1, "pbt.margin_relative": 0.0,
                        "pbt.reset_prob": 0.0, "pbt.start.learner.lr": [1e-4, 2e-3],
                        "pbt.start.learner.tau": [0.01, 0.05], "pbt.start.learner.temperature": [1.0, 0.2]})
    torch.manual_seed(0)
    learners = make_policy_learners(cfg, (OBS_SPACE, ACTION_SPACE), None, "cpu", 2)
    arena = Arena(arena_layout(cfg, EnvSpec(OBS_SPACE, ACTION_SPACE, 1), num_state_values(learners[0].model)),
                  shared=False)
    for k, learner in enumerate(learners):  # member 1 sees one batch more, and other data
        for batch, env_ids in continuous_batches(3 + k, seed=10 * k):
            learner.train(batch, env_ids=env_ids)
    copier, parent = learners
    assert (len(copier.replay), len(parent.replay)) == (3 * T * E, 4 * T * E)
    replayed = copier.replayed_batches
    runtimes = PolicyRuntimes(cfg, arena, learners, policy_map(cfg, ()))
    before = {"parent": copy.deepcopy(parent.state_dict()), "copier": copy.deepcopy(copier.state_dict())}
    finish_episodes(arena, {0: [-900.0], 1: [-200.0]})

    assert runtimes.population.step(env_steps=100) == [(0, 1)]

    state = copier.state_dict()
    for key in ("model", "critic", "target_critic", "optimizer"):
        assert_same_state(state[key], before["parent"][key], key)
    assert copier.temperature == pytest.approx(parent.temperature) != pytest.approx(1.0)
    assert state["updates"] == before["copier"]["updates"]  # its own counters
    # Its replay and its replay-ratio account stay its own: what its own actors added.
    assert len(copier.replay) == 3 * T * E and copier.replayed_batches == replayed
    assert (copier.lcfg.lr, copier.lcfg.tau) == (2e-3, 0.05)
    target = [p.clone() for p in copier.target_critic.parameters()]
    batch, env_ids = continuous_batches(4, seed=99)[0]
    stats = copier.train(batch, env_ids=env_ids)
    assert stats["lr"] == pytest.approx(2e-3) and copier.updates > before["copier"]["updates"]
    # One update moves the targets tau = 0.05 of the way: after k updates 1 - 0.95^k of it.
    assert not all(torch.equal(a, b) for a, b in zip(target, copier.target_critic.parameters()))


@pytest.mark.parametrize("settings, message", [
    ({}, "pbt.mutable 'learner.entropy_coef' is not read by learner.algo=sac's updates: perturb learner.lr, "
         "learner.tau, learner.max_grad_norm"),
    ({"pbt.mutable": ["learner.gamma"]}, "pbt.mutable 'learner.gamma' is not read by learner.algo=sac's updates"),
    ({"pbt.mutable": ["learner.lr"], "pbt.start.learner.num_epochs": [1, 2]},
     "pbt.start.learner.num_epochs is not read by learner.algo=sac's members"),
])
def test_sac_population_settings_its_updates_never_read_are_refused_in_one_line(settings, message):
    from fastrl.config import ConfigError
    base = {"pbt.population": 2, "pbt.mutable": build_config("cartpole-appo").pbt.mutable}
    with pytest.raises(ConfigError) as error:
        sac_config(**{**base, **settings})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_resumed_run_keeps_its_replay_and_its_ratio_with_replay_checkpoint(tmp_path, capfd):
    """replay.checkpoint: the replay is saved beside each checkpoint (only the newest one's kept)
    and a resume goes on with it and with the ratio's counts, where without it the replay would
    refill from empty; a changed ratio neither stalls nor bursts; a missing replay is said in one
    line and refills; turned off, the saved replays are removed."""
    from fastrl.replay.snapshot import replay_dir

    settings = {"serial": True, "replay.checkpoint": True, "replay.min_fill": 300, "model.hidden_sizes": [16, 16],
                "replay.replay_ratio": 16.0, "replay.batch_size": 16, "learner.rollout": 8,
                "learner.batch_size": 64, "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 1}
    run_dir = tmp_path / "run"

    def run_to(env_steps, **overrides):
        before = read_metrics(run_dir)[-1] if (run_dir / "metrics.jsonl").exists() else None
        train(pendulum_config(**{**settings, **overrides}, train_for_env_steps=env_steps), run_dir=run_dir,
              resume=before is not None, quiet=True)
        after = [r for r in read_metrics(run_dir) if before is None or r["env_steps"] > before["env_steps"]]
        return before, after, capfd.readouterr().err

    def batches_per_env_step(before, after):
        return ((after["learner/replayed_batches"] - before["learner/replayed_batches"])
                / (after["env_steps"] - before["env_steps"]))

    _, first, _ = run_to(1_200)
    steps = first[-1]["env_steps"]
    assert [p.name for p in (run_dir / "checkpoints").glob("replay_*")] == [replay_dir(run_dir, steps).name]
    before, resumed, err = run_to(1_800)
    # Kept: at its first report the replay holds more than the saved records (a refill would hold
    # fewer than the 600 steps taken since), the updates go on at one per env step (no burst of
    # owed ones), and the ratio over the whole run holds.
    assert resumed[0]["learner/replay_size"] > before["learner/replay_size"]
    assert batches_per_env_step(before, resumed[-1]) == pytest.approx(1.0, abs=0.1)
    assert resumed[-1]["learner/replay_ratio_achieved"] == pytest.approx(16.0, rel=0.05)
    assert "replay" not in err and len(list((run_dir / "checkpoints").glob("replay_*"))) == 1

    # Half the ratio from here: half a batch per env step, neither a stall nor a burst, and so
    # again after one more resume at that ratio.
    for end in (2_400, 2_800):
        before, halved, _ = run_to(end, **{"replay.replay_ratio": 8.0})
        assert batches_per_env_step(before, halved[-1]) == pytest.approx(0.5, abs=0.1)

    # Without the saved replay, the resume says so in one line and refills.
    for saved in (run_dir / "checkpoints").glob("replay_*"):
        shutil.rmtree(saved)
    _, _, err = run_to(3_200)
    said = [line for line in err.splitlines() if "replay refills" in line]
    assert len(said) == 1 and "no replay was saved with the checkpoint at" in said[0]

    # Turned off, the replays saved earlier are removed at the next checkpoint, and said.
    assert len(list((run_dir / "checkpoints").glob("replay_*"))) == 1
    _, _, err = run_to(3_500, **{"replay.checkpoint": False})
    assert not list((run_dir / "checkpoints").glob("replay_*"))
    assert "replay.checkpoint is off now" in err


def test_a_population_members_ratio_counts_the_env_steps_of_its_own_games(tmp_path):
    """Each member's replay is fed by its own games, half of the run's envs here: the achieved
    ratio counts those env steps (counted against all of them it would read half the ratio)."""
    cfg = pendulum_config(**{"serial": True, "pbt.population": 2, "env.num_workers": 1, "env.envs_per_worker": 8,
                             "env.num_splits": 1, "learner.rollout": 8, "learner.batch_size": 32,
                             "replay.min_fill": 200, "replay.replay_ratio": 16.0, "replay.batch_size": 16,
                             "model.hidden_sizes": [16, 16], "train_for_env_steps": 1_600})
    train(cfg, run_dir=tmp_path, quiet=True)
    last = read_metrics(tmp_path)[-1]
    assert last["learner/replay_ratio_achieved"] == pytest.approx(16.0, rel=0.1)
