"""GPU placement without a GPU: each rank's device under torchrun (torch.cuda's queries patched),
the learner process choosing its GPU before it builds the model, and a user's model checked on
the device it already lives on. Then every CUDA code path on a real GPU, against the CPU: the
learners, the staged batcher, the compiled batcher, weight publication and bf16 (skipped without
a CUDA device). Every test here is marked ``gpu``: ``python scripts/bench.py gpu`` runs them."""
import copy

import gymnasium
import numpy as np
import pytest
import torch
from torch import nn

from fastrl.config import ConfigError, build_config
from fastrl.distributed.process_group import DistInfo
from fastrl.ipc.weights import WeightBuffer
from fastrl.learner import DQNLearner, LearnerRuntime, R2D2Learner, VTraceLearner, process
from fastrl.learner import policy_set as policies
from fastrl.models.networks import build_model, num_state_values, state_to_flat
from fastrl.run.training import RunError, resolve_device, train
from fastrl.sampling.batcher import InferenceBatcher, batch_buckets
from tests.support.small_learners import dqn_config, stream_batches
from tests.unit.learner.test_r2d2 import r2d2_config, state_batch
from tests.unit.learner.test_vtrace_learner import random_batch
from tests.unit.sampling.test_batcher import act, small_run

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
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
    monkeypatch.setattr(process, "configure_child", lambda retain_freed_memory: None)
    monkeypatch.setattr(process.Arena, "attach", classmethod(lambda cls, layout, name: None))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: events.append(("set_device", device)))

    def make_learner(*args, **kwargs):
        events.append(("make_learner", kwargs["device"]))
        raise BuildStarted

    monkeypatch.setattr(policies, "make_learner", make_learner)  # the learner process builds each policy's there
    with pytest.raises(BuildStarted):
        process.learner_process(build_config("cartpole-appo"), None, "arena", (OBS_SPACE, ACTION_SPACE), None,
                                "cuda:1", ([], []), None, None)
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


# On a real GPU. The CPU runs the device path too (device_path=True: torch V-trace, staging
# buffers), so each CUDA result is compared with the same computation on the CPU.


def exact_float32(monkeypatch) -> None:
    """float32 matmuls in full precision: a CUDA learner turns on TF32 when it is built (10 bits of
    mantissa, about 1e-3 relative), which the CPU never uses. Call it after building learners."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def assert_same_stats(got: dict, expected: dict, rel: float = 1e-3) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=rel, abs=1e-5), key


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-4) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-3, atol=atol)


@needs_cuda
@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_a_v_trace_learner_on_cuda_learns_what_its_device_path_learns_on_the_cpu(algo, monkeypatch):
    cfg = build_config("cartpole-appo", {"learner.algo": algo, "learner.vtrace_lambda": 0.9})
    learners = []
    for device in (CPU, CUDA):
        torch.manual_seed(0)
        learners.append(VTraceLearner(cfg, OBS_SPACE, ACTION_SPACE, device=device, device_path=True))
    exact_float32(monkeypatch)
    for seed in range(3):
        batch = random_batch(seed=seed)
        cpu_stats = learners[0].train(batch)
        assert_same_stats(learners[1].train(batch), cpu_stats)
    assert next(learners[1].model.parameters()).is_cuda
    assert_same_weights(*(learner.model for learner in learners))


@needs_cuda
def test_dqn_on_cuda_replays_and_steps_as_its_device_path_does_on_the_cpu(monkeypatch):
    cfg = dqn_config()
    learners = []
    for device in (CPU, CUDA):
        torch.manual_seed(0)
        learners.append(DQNLearner(cfg, OBS_SPACE, ACTION_SPACE, device=device, device_path=True))
    exact_float32(monkeypatch)
    for batch, env_ids in stream_batches(4):
        stats = [learner.train(batch, env_ids=env_ids) for learner in learners]
        assert_same_stats(stats[1], stats[0])
    assert learners[1].updates == learners[0].updates > 0
    assert_same_weights(*(learner.model for learner in learners))


@needs_cuda
def test_r2d2_on_cuda_takes_the_gradient_steps_its_device_path_takes_on_the_cpu(monkeypatch):
    cfg = r2d2_config(**{"replay.replay_ratio": 1.0})
    learners = []
    for device in (CPU, CUDA):
        torch.manual_seed(0)
        learner = R2D2Learner(cfg, gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32), ACTION_SPACE, device=device,
                              device_path=True)
        learner.model.core.use_kernel = learner.target.core.use_kernel = False  # the CPU's LSTM as torch ops
        learners.append(learner)
    exact_float32(monkeypatch)
    T, B = cfg.learner.rollout, 4
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        batch = state_batch(T, B, learners[0].model.state_size, g)
        stats = [learner.train(batch, env_ids=np.arange(B)) for learner in learners]
        assert_same_stats(stats[1], stats[0])
    assert learners[1].updates == learners[0].updates > 0
    assert_same_weights(*(learner.model for learner in learners))


def sharpened(model: nn.Module) -> nn.Module:
    """The model with its policy head scaled up, so that most of its choices are near-certain. The
    head starts at gain 0.01; scaling every weight alike by 30 left logits within one of each
    other, and the GPU then sampled other actions than the CPU."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("policy."):
                p.mul_(1e4)
    return model


def assert_draws_from_the_same_policy(got: tuple, expected: tuple) -> None:
    """Two devices draw from different random streams, so equal actions can only be asked where the
    policy is sure. Each action either side drew must carry the log-probability the other side's
    policy gives it (CartPole has two actions: the other one's is log(1 - p)), and where the
    expected side was sure of its action (p > 1 - 1e-6) the other must have drawn it too."""
    (actions, logp, _), (want_actions, want_logp, _) = got, expected
    drawn = ~np.isnan(want_logp)
    np.testing.assert_array_equal(drawn, ~np.isnan(logp))  # the same slots written
    same = drawn & (actions == want_actions)
    np.testing.assert_allclose(logp[same], want_logp[same], atol=1e-4)
    other = drawn & (actions != want_actions)
    with np.errstate(divide="ignore"):  # a sure action's other one: log(0)
        np.testing.assert_allclose(logp[other], np.log1p(-np.exp(want_logp[other])), atol=1e-3)
    sure = drawn & (want_logp > -1e-6)
    assert sure.sum() >= drawn.sum() // 2, "too few sure choices for the actions to be compared"
    np.testing.assert_array_equal(actions[sure], want_actions[sure])


def act_fresh(arena, batcher, seed: int = 1, start_state=None) -> tuple:
    """One batch from a cleared arena: unwritten log-probs read NaN, the recurrent state restarts."""
    if start_state is not None:
        arena.env_state[:] = start_state
    arena.actions[:] = 0
    arena.behaviour_logp[:] = np.nan
    return act(arena, batcher, [0, 1, 1], [1, 0, 1], seed=seed)


def test_the_device_comparison_allows_another_random_stream_and_no_other_policy():
    """The CPU half of the CUDA batcher tests: another seed on the same device passes; the policy
    with its two actions swapped, or one slot's action changed, fails."""
    _, spec, model, arena = small_run("none")
    sharpened(model)
    WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 0)
    expected = act_fresh(arena, InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, CPU), seed=1)
    for seed in (2, 3, 4):
        got = act_fresh(arena, InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, CPU), seed=seed)
        assert_draws_from_the_same_policy(got, expected)
    swapped = copy.deepcopy(model)
    with torch.no_grad():
        swapped.policy.weight.copy_(swapped.policy.weight.flip(0))
    # The batcher acts with the weights published in the arena.
    WeightBuffer(arena).publish(state_to_flat(swapped, torch.empty(num_state_values(swapped))).numpy(), 1)
    got = act_fresh(arena, InferenceBatcher(arena, swapped, spec.action_space, CPU), seed=1)
    with pytest.raises(AssertionError):
        assert_draws_from_the_same_policy(got, expected)
    actions, logp, state = expected
    sure = np.flatnonzero(logp.ravel() > -1e-6)[0]
    actions = actions.copy()
    actions.flat[sure] = 1 - actions.flat[sure]
    with pytest.raises(AssertionError):
        assert_draws_from_the_same_policy((actions, logp, state), expected)


def acts_as_the_cpu(core: str, compile: bool, monkeypatch) -> None:
    exact_float32(monkeypatch)  # a learner built earlier in this process may have turned TF32 on
    _, spec, model, arena = small_run(core)
    sharpened(model)
    WeightBuffer(arena).publish(state_to_flat(model, torch.empty(num_state_values(model))).numpy(), 0)
    start_state = arena.env_state.copy() if core != "none" else None
    expected = act_fresh(arena, InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, CPU),
                         start_state=start_state)
    buckets = batch_buckets(4, 4) if compile else ()
    gpu = InferenceBatcher(arena, copy.deepcopy(model), spec.action_space, CUDA, buckets=buckets, compile=compile)
    assert gpu.transfer.staged  # the default on CUDA: one copy each way per batch
    got = act_fresh(arena, gpu, start_state=start_state)
    assert_draws_from_the_same_policy(got, expected)
    if core != "none":
        # The recurrent state does not depend on the action drawn.
        np.testing.assert_allclose(got[2], expected[2], rtol=1e-3, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("core", ["none", "lstm"])
def test_the_staged_batcher_on_cuda_acts_as_the_cpu(core, monkeypatch):
    acts_as_the_cpu(core, False, monkeypatch)


@needs_cuda
def test_the_compiled_batcher_on_cuda_acts_as_the_cpu(monkeypatch):
    """inference.compile: batches padded to their bucket, the policy through torch.compile."""
    acts_as_the_cpu("none", True, monkeypatch)


@needs_cuda
def test_a_cuda_learner_publishes_the_weights_it_holds():
    cfg, spec, _, arena = small_run()
    learner = VTraceLearner(cfg, spec.observation_space, spec.action_space, device=CUDA)
    learner.train(random_batch(T=cfg.learner.rollout))
    runtime = LearnerRuntime(cfg, arena, learner)
    assert runtime.device_flat.is_cuda and runtime.publish()
    expected = state_to_flat(learner.model, torch.empty(num_state_values(learner.model), device=CUDA)).cpu().numpy()
    np.testing.assert_array_equal(arena.weights[0, learner.version % 2], expected)


@needs_cuda
def test_bfloat16_on_cuda_trains_close_to_float32():
    results = []
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(0)
        cfg = build_config("cartpole-appo", {"learner.precision": precision})
        learner = VTraceLearner(cfg, OBS_SPACE, ACTION_SPACE, device=CUDA)
        assert learner.precision == precision
        results.append(learner.train(random_batch(T=16)))
    full, half = results
    assert half["value_loss"] != full["value_loss"]  # the network did run in bfloat16
    for key in ("loss", "policy_loss", "value_loss", "entropy", "grad_norm"):
        assert half[key] == pytest.approx(full[key], rel=0.05, abs=2e-3), key
