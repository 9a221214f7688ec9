"""Checkpoints: no code runs on load, corrupt or unfitting files fall back, writes leave nothing behind,
RNG states (the learner GPU's included) come back."""
import errno
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastrl.files import checkpoint
from fastrl.files.checkpoint import (
    CheckpointError,
    capture_rng,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    load_model_state,
    model_fit_check,
    restore_rng,
    save_checkpoint,
)
from fastrl.learner import restore_learner


def minimal_state(model: torch.nn.Module, steps: int = 0) -> dict:
    return {"learner": {"model": model.state_dict()}, "counters": {"env_steps": steps}, "rng": capture_rng(),
            "config": {"env": {"id": "CartPole-v1"}}}


class RunsCodeWhenUnpickled:
    """What a crafted checkpoint holds: unpickling it would create ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"learner": {}, "counters": {}, "payload": RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(CheckpointError, match="evil.pt"):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_crafted_newest_checkpoint_falls_back_to_the_previous_one_with_one_warning(tmp_path, capsys):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, minimal_state(model, 100), 100, keep=3)
    marker = tmp_path / "code-ran"
    torch.save({"learner": {}, "counters": {}, "payload": RunsCodeWhenUnpickled(marker)},
               tmp_path / "checkpoints" / "ckpt_000000000200.pt")
    path, state = load_latest_checkpoint(tmp_path)
    assert path.name == "ckpt_000000000100.pt" and state["counters"]["env_steps"] == 100
    out, err = capsys.readouterr()
    assert out == "" and err.count("falling back") == 1 and "ckpt_000000000200.pt" in err
    assert not marker.exists()


@pytest.mark.parametrize("counters", [{}, {"env_steps": None}, {"env_steps": "100"}, [100]])
def test_a_newest_checkpoint_without_an_env_step_count_falls_back_to_the_previous_one(tmp_path, capsys, counters):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, minimal_state(model, 100), 100, keep=3)
    save_checkpoint(tmp_path, {**minimal_state(model), "counters": counters}, 200, keep=3)
    path, state = load_latest_checkpoint(tmp_path)
    assert path.name == "ckpt_000000000100.pt" and state["counters"]["env_steps"] == 100
    err = capsys.readouterr().err
    assert err.count("falling back") == 1 and "ckpt_000000000200.pt' has no env step count" in err


def test_rng_states_survive_a_weights_only_round_trip(tmp_path):
    torch.manual_seed(3)
    np.random.seed(4)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's legacy state
    save_checkpoint(tmp_path, minimal_state(torch.nn.Linear(2, 2)), 1, keep=1)
    expected_np, expected_torch = np.random.standard_normal(5), torch.rand(5)
    np.random.seed(0)
    torch.manual_seed(0)
    restore_rng(load_latest_checkpoint(tmp_path)[1]["rng"])
    np.testing.assert_array_equal(np.random.standard_normal(5), expected_np)
    assert torch.equal(torch.rand(5), expected_torch)


def fake_gpu_generator(monkeypatch) -> list:
    """torch.cuda's RNG calls on a machine without a GPU; returns the log of restores."""
    restored = []
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda device: torch.tensor([7, torch.device(device).index], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((state, device)))
    return restored


def test_the_learners_gpu_generator_is_saved_and_restored_to_the_learners_gpu(tmp_path, monkeypatch):
    restored = fake_gpu_generator(monkeypatch)
    assert "cuda" not in capture_rng()  # a CPU learner has no GPU generator to save
    state = {**minimal_state(torch.nn.Linear(2, 2)), "rng": capture_rng(torch.device("cuda:1"))}
    save_checkpoint(tmp_path, state, 1, keep=1)
    rng = load_latest_checkpoint(tmp_path)[1]["rng"]  # weights_only: the state is a plain tensor
    restore_rng(rng, "cpu")
    assert restored == []  # resumed on the CPU: nothing to restore it to
    learner = SimpleNamespace(device=torch.device("cuda:0"), load_state_dict=lambda state: None)
    restore_learner(learner, {"learner": {}, "rng": rng})  # resumed on another GPU: that GPU's generator
    (saved, device), = restored
    assert saved.tolist() == [7, 1] and device == torch.device("cuda:0")


def test_weights_that_do_not_fit_the_model_fall_back_then_fail_clearly(tmp_path, capsys):
    save_checkpoint(tmp_path, minimal_state(torch.nn.Linear(3, 2), 10), 10, keep=3)
    save_checkpoint(tmp_path, minimal_state(torch.nn.Linear(5, 2), 20), 20, keep=3)
    model = torch.nn.Linear(3, 2)
    path, _ = load_latest_checkpoint(tmp_path, check=model_fit_check(model))
    assert path.name == "ckpt_000000000010.pt"
    assert "does not fit this model" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="does not fit this model"):
        load_model_state(torch.nn.Linear(7, 1), {"learner": {"model": torch.nn.Linear(3, 2).state_dict()}})
    with pytest.raises(CheckpointError, match="no checkpoint .* is usable"):
        load_latest_checkpoint(tmp_path, check=model_fit_check(torch.nn.Linear(9, 9)))


def test_a_full_disk_names_the_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    def disk_full(obj, f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(CheckpointError, match=r"ckpt_000000000007\.pt: No space left on device"):
        save_checkpoint(tmp_path, {"learner": {}, "counters": {}}, 7, keep=2)
    assert os.listdir(tmp_path / "checkpoints") == []


def test_saves_never_write_through_a_planted_symlink(tmp_path):
    target = tmp_path / "outside"
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    # The old code wrote to the predictable ckpt_<steps>.tmp<pid>: a link there redirected the write.
    (directory / f"ckpt_000000000005.tmp{os.getpid()}").symlink_to(target)
    save_checkpoint(tmp_path, minimal_state(torch.nn.Linear(2, 2), 5), 5, keep=2)
    assert not target.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000000005.pt"]


def test_checkpoints_skipped_on_resume_are_set_aside_so_pruning_keeps_the_new_ones(tmp_path):
    from fastrl.files.checkpoint import set_aside_newer_checkpoints

    model = torch.nn.Linear(2, 2)
    for steps in (10, 20):
        save_checkpoint(tmp_path, minimal_state(model, steps), steps, keep=3)
    newest = list_checkpoints(tmp_path)[-1]
    newest.write_bytes(b"truncated")
    chosen, _ = load_latest_checkpoint(tmp_path, warn=lambda message: None)
    set_aside_newer_checkpoints(tmp_path, chosen)
    save_checkpoint(tmp_path, minimal_state(model, 15), 15, keep=1)  # the resumed run's first save
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000000015.pt"]
    assert (tmp_path / "checkpoints" / "ckpt_000000000020.pt.bad").exists()
