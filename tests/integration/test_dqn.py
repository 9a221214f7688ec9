"""The tests of tests/unit/learner/test_dqn.py's subject that train in this process."""
import copy
import math

import torch

from fastrl.replay.buffer import ReplayRatio
from tests.support.small_learners import (
    E,
    T,
    make_dqn,
    same_weights,
    stream_batches,
)


def test_replay_ratio_sets_the_number_of_gradient_steps():
    learner = make_dqn()
    cfg = learner.cfg
    ratio = ReplayRatio(cfg.replay.replay_ratio / cfg.replay.batch_size, start=cfg.replay.min_fill)
    for k, (batch, env_ids) in enumerate(stream_batches(6)):
        stats = learner.train(batch, env_ids=env_ids)
        added = (k + 1) * T * E
        assert learner.replay.added == added and len(learner.replay) == stats["replay_size"] == added
        expected = ratio.allowed_batches(added, 0)
        assert expected == max(0, (added - 64) * 2 // 32)
        assert learner.updates == learner.replayed_batches == stats["learner_updates"] == expected
        assert learner.version == stats["version"] == k + 1
        if expected:
            assert math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])
    assert learner.updates == 8 and learner.skipped_updates == 0

def test_target_network_is_refreshed_every_target_update_every_steps():
    learner = make_dqn()
    for batch, env_ids in stream_batches(2):  # 64 records: min_fill reached, no step taken yet
        learner.train(batch, env_ids=env_ids)
    assert learner.updates == 0 and same_weights(learner.model, learner.target)
    initial = copy.deepcopy(learner.target.state_dict())
    target_before = initial
    for step in range(1, 10):
        assert learner.update() is not None
        assert learner.updates == step
        refreshed = step % 3 == 0
        assert same_weights(learner.model, learner.target) == refreshed, step
        target_now = copy.deepcopy(learner.target.state_dict())
        unchanged = all(torch.equal(target_before[k], target_now[k]) for k in target_now)
        assert unchanged != refreshed, step  # the target moves at a refresh and only then
        target_before = target_now

def test_a_skipped_update_never_refreshes_the_target():
    learner = make_dqn()
    for batch, env_ids in stream_batches(2):
        learner.train(batch, env_ids=env_ids)
    for _ in range(3):
        learner.update()
    assert learner.updates == 3 and same_weights(learner.model, learner.target)
    target_before = copy.deepcopy(learner.target.state_dict())
    with torch.no_grad():
        learner.model.value.bias.fill_(float("nan"))  # every loss from now on is NaN
    assert learner.update() is not None
    assert (learner.updates, learner.skipped_updates, learner.consecutive_skips) == (3, 1, 1)
    assert all(torch.equal(target_before[k], v) for k, v in learner.target.state_dict().items())

def test_target_observation_statistics_change_only_at_a_target_refresh():
    learner = make_dqn(**{"model.normalize_obs": True})
    online, target = learner.model.normalizer, learner.target.normalizer

    def snapshot():
        return {key: value.clone() for key, value in target.state_dict().items()}

    initial = snapshot()
    refreshes = 0
    for k, (batch, env_ids) in enumerate(stream_batches(8, seed=2)):
        before = snapshot()
        learner.train(batch, env_ids=env_ids)  # statistics update, then 2 gradient steps from the 3rd batch on
        if learner.updates // 3 > refreshes:  # refreshed (every 3 steps) after this batch's statistics update
            refreshes = learner.updates // 3
            assert same_weights(online, target), k
        else:
            assert all(torch.equal(before[key], value) for key, value in target.state_dict().items()), k
            assert not same_weights(online, target), k  # while the online statistics moved on
    assert refreshes == 4 and learner.updates == 12 and learner.skipped_updates == 0
    assert not all(torch.equal(initial[key], value) for key, value in target.state_dict().items())


def test_a_begun_late_exploration_stage_is_reported_and_kept_over_a_resume(tmp_path):
    """learner.epsilon_late_return_episodes on a real run: the stage begins once past its step and
    its gate, the report and the checkpoint name the step, and a resumed run keeps the stage from
    its first report (not after n new episodes)."""
    import json

    from fastrl.config import build_config, load_run_config
    from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
    from fastrl.run.training import train

    settings = {"serial": True, "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2,
                "learner.batch_size": 64, "learner.rollout": 8, "replay.min_fill": 200,
                "train_for_env_steps": 3_000, "report_every_s": 0.5, "learner.epsilon_decay_steps": 500,
                "learner.epsilon_late": 0.0, "learner.epsilon_late_after_steps": 1_000,
                "learner.epsilon_late_return_episodes": 4, "learner.epsilon_late_min_return": 1.0}
    run_dir = tmp_path / "run"
    train(build_config("cartpole-dqn", settings), run_dir=run_dir, quiet=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    began = records[-1]["epsilon_late_at_env_steps"]  # every CartPole episode returns >= 1
    assert 1_000 <= began < 3_000
    assert all(r.get("epsilon_late_at_env_steps", began) == began for r in records)
    assert load_checkpoint(list_checkpoints(run_dir)[-1])["counters"]["epsilon_late_at_env_steps"] == began
    cfg = load_run_config(run_dir)
    cfg.train_for_env_steps = 4_000
    train(cfg, run_dir=run_dir, resume=True, quiet=True)
    resumed = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][len(records):]
    assert resumed and all(r["epsilon_late_at_env_steps"] == began for r in resumed)
