"""GPU placement without a GPU: each rank's device under torchrun (torch.cuda's queries patched),
the learner process choosing its GPU before it builds the model, and a user's model checked on
the device it already lives on."""
import gymnasium
import numpy as np
import pytest
import torch
from torch import nn

from fastrl.config import ConfigError, build_config
from fastrl.distributed.process_group import DistInfo
from fastrl.learner import policy_set as policies
from fastrl.learner import process
from fastrl.models.networks import build_model
from fastrl.run.training import RunError, resolve_device, train

OBS_SPACE = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gymnasium.spaces.Discrete(2)


def visible_gpus(monkeypatch, count: int, cuda_visible_devices: str | None = None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if cuda_visible_devices is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible_devices)


def ranks(world_size: int) -> list[DistInfo]:
    """The ranks of one node running ``world_size`` of them."""
    return [DistInfo(rank, world_size, rank, world_size) for rank in range(world_size)]


def test_each_rank_of_a_node_gets_its_own_gpu(monkeypatch):
    visible_gpus(monkeypatch, 4)
    assert [resolve_device("cuda", info) for info in ranks(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [resolve_device("auto", info) for info in ranks(2)] == ["cuda:0", "cuda:1"]
    assert resolve_device("cuda") == "cuda:0"


def test_a_launcher_that_shows_each_rank_one_gpu_puts_every_rank_on_cuda_0(monkeypatch):
    visible_gpus(monkeypatch, 1, cuda_visible_devices="3")
    assert [resolve_device("cuda", info) for info in ranks(4)] == ["cuda:0"] * 4


def one_line_error(name: str, info: DistInfo) -> str:
    with pytest.raises(RunError) as caught:
        resolve_device(name, info)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_explicit_gpu_under_torchrun_is_refused_on_every_rank(monkeypatch):
    visible_gpus(monkeypatch, 4)
    for info in ranks(2):
        assert one_line_error("cuda:1", info) == (
            "device='cuda:1' under torchrun (WORLD_SIZE=2) would put every rank on one GPU; use device='cuda' "
            "(each rank takes cuda:LOCAL_RANK)")


def test_more_ranks_than_gpus_on_a_node_is_refused_on_every_rank(monkeypatch):
    visible_gpus(monkeypatch, 2)
    for info in ranks(3):  # rank 2 has no GPU; ranks 0 and 1 must not wait for it in NCCL's set-up
        assert "3 ranks on this node but 2 GPUs are visible" in one_line_error("cuda", info)
        assert "--nproc-per-node 2" in one_line_error("auto", info)
    # LOCAL_WORLD_SIZE unknown (launched by hand): LOCAL_RANK alone still shows the overflow.
    assert "LOCAL_RANK 2 has no GPU" in one_line_error("cuda", DistInfo(2, 3, 2))


def test_ranks_sharing_a_nodes_only_gpu_are_refused(monkeypatch):
    visible_gpus(monkeypatch, 1)
    for info in ranks(2):
        assert "2 ranks on this node, which has one GPU" in one_line_error("cuda", info)


def test_an_explicit_gpu_must_exist(monkeypatch):
    visible_gpus(monkeypatch, 2)
    assert resolve_device("cuda:1") == "cuda:1"
    assert "'cuda:2' but 2 GPU(s) are visible (cuda:0 to cuda:1)" in one_line_error("cuda:2", DistInfo())


def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused(monkeypatch):
    visible_gpus(monkeypatch, 0)
    assert resolve_device("auto", ranks(2)[1]) == "cpu"
    assert resolve_device("cpu", ranks(2)[1]) == "cpu"
    assert "CUDA is not available; use --set device=cpu" in one_line_error("cuda", DistInfo())


def test_torchrun_variables_are_read_with_the_nodes_rank_count(monkeypatch):
    for key, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)
    assert DistInfo.from_env() == DistInfo(5, 8, 1, 4)


def test_train_refuses_an_explicit_gpu_under_torchrun_before_anything_is_written(monkeypatch, tmp_path):
    visible_gpus(monkeypatch, 2)
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RunError, match="use device='cuda'"):
        train(build_config("cartpole-appo", {"device": "cuda:0"}), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # the refused run removes the directory it made


class BuildStarted(Exception):
    pass


def test_the_learner_process_selects_its_gpu_before_building_the_model(monkeypatch):
    events = []
    monkeypatch.setattr(process, "configure_child", lambda parent_pid, retain_freed_memory: None)
    monkeypatch.setattr(process.Arena, "attach", classmethod(lambda cls, layout, name: None))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: events.append(("set_device", device)))

    def make_learner(*args, **kwargs):
        events.append(("make_learner", kwargs["device"]))
        raise BuildStarted

    monkeypatch.setattr(policies, "make_learner", make_learner)  # the learner process builds each policy's there
    with pytest.raises(BuildStarted):
        process.learner_process(build_config("cartpole-appo"), None, "arena", (OBS_SPACE, ACTION_SPACE), None,
                                "cuda:1", ([], []), 0, None, None)
    assert events == [("set_device", torch.device("cuda:1")), ("make_learner", "cuda:1")]


class TinyPolicy(nn.Module):
    def __init__(self, num_params: int = 2):
        super().__init__()
        self.body = nn.Linear(4, num_params + 1)

    def forward(self, obs):
        out = self.body(obs.float())
        return out[:, :-1], out[:, -1]


def test_a_user_model_is_checked_on_the_device_it_lives_on():
    cfg = build_config("cartpole-appo")
    # "meta" stands in for a GPU: a sample left on the CPU fails there on the device, not the contract.
    model = TinyPolicy().to("meta")
    assert build_model(OBS_SPACE, ACTION_SPACE, cfg.model, model) is model
    with pytest.raises(ValueError, match=r"returned params \(2, 3\) and value \(2,\); expected params \(2, 2\)"):
        build_model(OBS_SPACE, ACTION_SPACE, cfg.model, TinyPolicy(num_params=3).to("meta"))


def test_the_batcher_runs_where_inference_device_says(monkeypatch, tmp_path):
    """inference.device: cpu beside a GPU learner, a second GPU in one process; under torchrun a
    named GPU is refused like `device`'s (every rank would share it)."""
    visible_gpus(monkeypatch, 2)
    started = {}
    monkeypatch.setattr("fastrl.run.training.run_parallel",
                        lambda plan, console: started.update(learner=plan.device, inference=plan.inference_device)
                        or "ran")
    for inference, expected in (("", "cuda:0"), ("cpu", "cpu"), ("cuda:1", "cuda:1")):
        assert train(build_config("cartpole-appo", {"device": "cuda", "inference.device": inference,
                                                     "inference.in_workers": False})) == "ran"
        assert started == {"learner": "cuda:0", "inference": expected}
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RunError, match="would put every rank on one GPU"):
        train(build_config("cartpole-appo", {"device": "cuda", "inference.device": "cuda:1",
                                             "inference.in_workers": False}), run_dir=tmp_path / "r")


@pytest.mark.parametrize("value", ["gpu", "cuda", "auto", "cuda:x"])
def test_inference_device_values_are_checked(value):
    with pytest.raises(ConfigError, match="inference.device' must be '' \\(the run's device\\), cpu or cuda:N"):
        build_config("cartpole-appo", {"inference.device": value})
