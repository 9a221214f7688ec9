"""Two ranks with gloo on loopback, launched by torchrun, as a user would."""
import contextlib
import io

import pytest

from fastrl.config import build_config
from fastrl.distributed.process_group import DistInfo, attempt_prefix
from fastrl.envs import probe_env
from fastrl.files.checkpoint import CheckpointError, checkpoint_dir, save_checkpoint
from fastrl.run.plan import RunError
from fastrl.run.preflight import RESUME_KEY, build_template, check_request, load_resume_state, run_policies


def test_digests_travel_as_tensors_never_as_pickled_objects(tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist

    from fastrl.distributed import process_group as distributed

    def refuse(*args, **kwargs):
        raise AssertionError("a pickled object was exchanged between ranks")

    for name in ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
        monkeypatch.setattr(dist, name, refuse)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 3)
        assert distributed.gather_digests(model) == [distributed.parameter_digest(model)]
    finally:
        dist.destroy_process_group()


def saved_run(tmp_path, steps=(1000, 2000)):
    """A run directory with checkpoints of an untrained CartPole model: (config, model, run dir, policy names)."""
    cfg = build_config("cartpole-appo", {"device": "cpu"})
    spec = probe_env(cfg)
    template = build_template(cfg, spec)
    run_dir = tmp_path / "run"
    for n in steps:
        save_checkpoint(run_dir, {"learner": {"model": template.state_dict()}, "counters": {"env_steps": n},
                                  "config": cfg.to_dict()}, n, keep=10)
    return cfg, template, run_dir, run_policies(cfg, spec).names


def test_only_rank_0_chooses_and_cleans_the_checkpoints_to_resume_the_others_load_its_choice(tmp_path,
                                                                                           agent_store):
    cfg, template, run_dir, names = saved_run(tmp_path)
    folder = checkpoint_dir(run_dir)
    (folder / "ckpt_000000003000.pt").write_bytes(b"truncated")  # unusable: rank 0 sets it aside
    (folder / ".ckpt_000000004000.pt.a1.tmp").write_bytes(b"")  # a save cut short: rank 0 removes it
    with contextlib.redirect_stderr(io.StringIO()):
        assert load_resume_state(run_dir, cfg, template, names, DistInfo(0, 2))["counters"]["env_steps"] == 2000
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt_000000001000.pt", "ckpt_000000002000.pt",
                                                        "ckpt_000000003000.pt.bad"]
    # What rank 1 sees later on the shared file system (a newer save, a temporary file) is not its
    # to choose or clean: it loads rank 0's choice and renames and removes nothing.
    saved_run(tmp_path, steps=(5000,))
    (folder / ".ckpt_000000006000.pt.b2.tmp").write_bytes(b"")
    before = sorted(p.name for p in folder.iterdir())
    assert load_resume_state(run_dir, cfg, template, names, DistInfo(1, 2))["counters"]["env_steps"] == 2000
    assert sorted(p.name for p in folder.iterdir()) == before


def test_the_other_ranks_stop_in_one_line_when_rank_0_has_no_checkpoint_or_they_cannot_see_it(tmp_path,
                                                                                             agent_store):
    cfg, template, run_dir, names = saved_run(tmp_path, steps=(1000,))
    (checkpoint_dir(run_dir) / "ckpt_000000001000.pt").write_bytes(b"truncated")
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(CheckpointError, match="is usable"):
        load_resume_state(run_dir, cfg, template, names, DistInfo(0, 2))
    with pytest.raises(RunError, match="^--resume: rank 0 found no checkpoint to resume; see rank 0's error$"):
        load_resume_state(run_dir, cfg, template, names, DistInfo(1, 2))

    agent_store.set(attempt_prefix(RESUME_KEY), "ckpt_000000009000.pt")  # a file rank 1's disk does not have
    with pytest.raises(RunError, match="rank 0 resumes ckpt_000000009000.pt, which rank 1 does not find in .*: put "
                                       "--run-dir on a file system that every rank shares"):
        load_resume_state(run_dir, cfg, template, names, DistInfo(1, 2))


def test_a_multi_rank_resume_without_torchruns_store_is_refused_in_one_line(tmp_path, monkeypatch):
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with pytest.raises(RunError, match="needs torchrun's store, through which rank 0 tells the other ranks which "
                                       "checkpoint it resumes: launch it with torchrun"):
        check_request(build_config("cartpole-appo", {"device": "cpu"}), tmp_path, resume=True)


def test_a_torchrun_launch_with_replay_checkpoint_is_refused_in_one_line(tmp_path, monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RunError, match="^replay.checkpoint saves one process's replay, and under torchrun each rank "
                                       "keeps its own: set replay.checkpoint=false$"):
        check_request(build_config("cartpole-dqn", {"replay.checkpoint": True}), tmp_path, resume=False)
