"""fastrl.profiler: breakdown arithmetic, diagnosis rules, a real CartPole profile, autotune, CLI errors."""
import sys
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch

from fastrl import profiler
from fastrl.cli import profile_main
from fastrl.config import build_config
from fastrl.envs.spaces import ActionLayout
from fastrl.profiler import sampling

# cartpole-appo, small: 2 workers x 32 envs, batches of 1024 env steps.
# The batcher process acting, as most profiles run: its figures are among those checked.
SMALL = {"device": "cpu", "env.envs_per_worker": "32", "learner.batch_size": "1024", "inference.in_workers": "false"}
MASKED_CUE_GAME = {"env.id": "pettingzoo:tests.support.pettingzoo_envs",
                   "env.kwargs": {"num_agents": 3, "masked": True},
                   "env.envs_per_worker": 12, "env.num_workers": 1, "learner.rollout": 8, "learner.batch_size": 96,
                   "device": "cpu"}


# --- breakdown: two reports -> shares of wall time ------------------------------------------


def report(wall_time, env_steps, **cumulative):
    out = {"wall_time": wall_time, "env_steps": env_steps, "frames": 4 * env_steps, "learner_updates": 0,
           "policy_lag_mean": 1.5, "policy_lag_min": 0.0, "policy_lag_max": 4.0}
    out.update({key.replace("__", "/"): value for key, value in cumulative.items()})
    return out


def test_breakdown_turns_cumulative_seconds_into_shares_of_the_window():
    a = report(10.0, 1_000, rollout__env_step_s=2.0, rollout__obs_copy_s=1.0, inference__inference_forward_s=3.0,
               inference__inference_batches=100, inference__inference_requests=200, learner__forward_backward_s=1.0)
    b = report(20.0, 11_000, rollout__env_step_s=16.0, rollout__obs_copy_s=3.0, rollout__wait_actions_s=2.0,
               rollout__wait_slots_s=1.0, inference__inference_forward_s=9.0, inference__weight_refresh_s=1.0,
               inference__wait_requests_s=2.0, inference__inference_batches=1_100, inference__inference_requests=2_700,
               learner__forward_backward_s=6.0, learner__vtrace_s=1.0, learner__optimizer_s=1.0, learner__wait_s=1.0,
               learner_updates=50)
    bd = profiler.breakdown(a, b, num_workers=2)
    assert bd["window_s"] == 10.0
    assert bd["env_steps_per_s"] == 1_000 and bd["frames_per_s"] == 4_000
    # Rollout seconds are summed over the 2 workers: shares are per worker.
    assert bd["rollout/env_step"] == pytest.approx(0.7) and bd["rollout/obs_copy"] == pytest.approx(0.1)
    assert bd["rollout/wait_actions"] == pytest.approx(0.1) and bd["rollout/wait_slots"] == pytest.approx(0.05)
    assert bd["rollout/busy"] == pytest.approx(0.8) and bd["rollout/other"] == pytest.approx(0.05)
    assert bd["inference/forward"] == pytest.approx(0.6) and bd["inference/busy"] == pytest.approx(0.7)
    assert bd["inference/wait_requests"] == pytest.approx(0.2) and bd["inference/other"] == pytest.approx(0.1)
    assert bd["inference/batches_per_s"] == 100 and bd["inference/requests_per_batch"] == 2.5
    assert bd["learner/forward_backward"] == pytest.approx(0.5) and bd["learner/busy"] == pytest.approx(0.7)
    assert bd["learner/wait"] == pytest.approx(0.1) and bd["learner/updates_per_s"] == 5
    assert bd["policy_lag_mean"] == 1.5 and bd["policy_lag_max"] == 4.0


def test_breakdown_of_a_group_without_timings_is_all_zero():
    bd = profiler.breakdown(report(0.0, 0), report(5.0, 5_000), num_workers=1)
    assert bd["learner/busy"] == 0 and bd["learner/other"] == 0 and bd["inference/requests_per_batch"] == 0


# --- diagnosis rules on synthetic breakdowns ------------------------------------------------


def shares(rollout=0.3, wait_actions=0.1, wait_slots=0.0, inference=0.3, learner=0.3):
    return {"rollout/busy": rollout, "rollout/wait_actions": wait_actions, "rollout/wait_slots": wait_slots,
            "inference/busy": inference, "learner/busy": learner}


@pytest.mark.parametrize("bd, cores, bottleneck, says", [
    (shares(wait_slots=0.41, learner=0.97), None, "learner",
     "learner-bound: learner busy 97%, workers waiting for slots 41% -> raise learner.batch_size or use a GPU"),
    ({**shares(wait_slots=0.5, learner=0.98), "learner/replay": 0.2}, None, "learner",
     "-> lower replay.replay_ratio (fewer gradient steps per env step) or use a GPU"),
    # The learner rule wins over inference evidence: backpressure is the stronger signal.
    (shares(wait_slots=0.3, learner=0.8, wait_actions=0.5, inference=0.9), None, "learner", "learner-bound"),
    (shares(wait_slots=0.4, learner=0.2), None, "slots", "raise slots_per_env or lower learner.batch_size"),
    (shares(wait_actions=0.5, inference=0.85), None, "inference",
     "inference-bound: batcher busy 85%, workers waiting for actions 50% -> raise env.num_splits"),
    (shares(rollout=0.9), None, "env", "env-bound: workers stepping 90% -> add env.num_workers"),
    (shares(rollout=0.9), (1.0, 2), "env", "env-bound"),
    (shares(rollout=0.9), (1.9, 2), "cpu", "cpu-bound: the run uses 1.90 of 2 cores"),
    (shares(rollout=0.4, inference=0.4, learner=0.5), (3.5, 4), "cpu", "cpu-bound"),
    (shares(wait_actions=0.5, inference=0.2), None, "latency",
     "latency-bound: workers waiting for actions 50% while the batcher is busy 20% -> raise env.num_splits"),
    (shares(rollout=0.3, inference=0.2, learner=0.5), (1.0, 2), "balanced", "busiest is learner 50%"),
])
def test_diagnosis_rules(bd, cores, bottleneck, says):
    used, count = cores or (None, None)
    diagnosis = profiler.diagnose(bd, used, count)
    assert diagnosis.bottleneck == bottleneck
    assert says in diagnosis.message
    assert "\n" not in diagnosis.message and "->" in diagnosis.message


def acting_shares(stepping, acting, learner=0.3, wait_slots=0.0):
    """A breakdown of a run whose workers act for themselves (inference.in_workers): no batcher."""
    return {**shares(rollout=stepping + acting, wait_actions=0.0, wait_slots=wait_slots, inference=0.0,
                     learner=learner), "rollout/inference": acting}


@pytest.mark.parametrize("bd, cores, bottleneck, says", [
    (acting_shares(stepping=0.3, acting=0.6), None, "inference",
     "inference-bound: workers acting 60%, stepping 30% -> raise env.envs_per_worker"),
    (acting_shares(stepping=0.6, acting=0.3), None, "env",
     "env-bound: workers busy 90% (stepping 60%, acting 30%) -> add"),
    (acting_shares(stepping=0.5, acting=0.45), (1.95, 2), "cpu",
     "(workers stepping 50%, acting 45%, learner 30%)"),
    (acting_shares(stepping=0.2, acting=0.3, learner=0.1), None, "balanced", "busiest is workers acting 30%"),
    (acting_shares(stepping=0.3, acting=0.6, wait_slots=0.4, learner=0.9), None, "learner", "learner-bound"),
])
def test_diagnosis_of_workers_that_act_names_their_acting_not_a_batcher(bd, cores, bottleneck, says):
    used, count = cores or (None, None)
    diagnosis = profiler.diagnose(bd, used, count)
    assert diagnosis.bottleneck == bottleneck
    assert says in diagnosis.message and "batcher" not in diagnosis.message


def test_diagnosis_thresholds_are_inclusive():
    at = shares(wait_slots=profiler.WAIT, learner=profiler.BUSY)
    assert profiler.diagnose(at).bottleneck == "learner"
    below = shares(wait_slots=profiler.WAIT - 0.01, learner=profiler.BUSY)
    assert profiler.diagnose(below).bottleneck != "learner"


def synthetic_result(in_workers: bool) -> "profiler.ProfileResult":
    """A ProfileResult from two synthetic reports per run, as fastrl-profile would measure them."""
    a = report(10.0, 1_000, rollout__env_step_s=2.0, inference__inference_batches=0)
    b = report(20.0, 11_000, rollout__env_step_s=12.0, rollout__inference_s=6.0, learner__forward_backward_s=3.0,
               learner_updates=50)
    if not in_workers:
        b.update({"rollout/inference_s": 0.0, "inference/inference_forward_s": 6.0,
                  "inference/inference_batches": 500, "inference/inference_requests": 1_000})
    bd = profiler.breakdown(a, b, num_workers=2)
    return profiler.ProfileResult(
        profile="cartpole-appo", env_id="CartPole-v1", overrides={}, seconds=10.0, warmup_seconds=1.0, frame_skip=1,
        env_fps=2_000.0, sample_fps=1_500.0, train_fps=1_000.0, env_frames_per_s=2_000.0,
        sample_frames_per_s=1_500.0, train_frames_per_s=1_000.0, sample_ratio=0.75, train_ratio=0.5,
        window_s={"env": 10.0, "sample": 10.0, "train": 10.0}, startup_s={"sample": 2.0, "train": 2.0},
        breakdown={"sample": bd, "train": bd}, policy_lag={"mean": 1.5, "min": 0.0, "max": 4.0},
        processes={"env": [], "sample": [], "train": []}, cores_used={"env": 1.0, "sample": 2.0, "train": 2.0},
        gpus=None, bottleneck="env", diagnosis="env-bound", sample_diagnosis="env-bound",
        hardware={"cpu_count": 2, "cpu_model": "test", "gpus": []},
        config={"device": "cpu", "env": {"num_workers": 2, "envs_per_worker": 8, "num_splits": 2},
                "inference": {"in_workers": in_workers}})


def test_report_of_workers_that_act_has_no_batcher_rows(tmp_path):
    table = profiler.format_report(synthetic_result(in_workers=True))
    acting = next(line for line in table.splitlines() if line.strip().startswith("rollout/inference"))
    assert acting.split()[1:] == ["30.0%", "30.0%"]  # 6 s over 2 workers x 10 s, sampling and training
    assert "inference/" not in table and "no batcher process" in table
    with_batcher = profiler.format_report(synthetic_result(in_workers=False))
    assert "inference/forward" in with_batcher and "inference/requests_per_batch" in with_batcher
    assert "no batcher process" not in with_batcher
    pytest.importorskip("matplotlib")
    profiler.plot_profile(synthetic_result(in_workers=True), tmp_path / "prof.png")
    assert (tmp_path / "prof.png").read_bytes()[:4] == b"\x89PNG"


# --- steady state and GPU parsing -----------------------------------------------------------


def test_steady_window_skips_start_up_and_warm_up():
    reports = [report(t, steps, learner_updates=updates)
               for t, steps, updates in [(1, 0, 0), (2, 500, 0), (3, 2_000, 1), (4, 4_000, 3), (5, 6_000, 5),
                                         (6, 8_000, 7)]]
    first, last = profiler.steady_window(reports, warmup_s=1.0, training=True)
    assert first["wall_time"] == 4 and last["wall_time"] == 6
    first, _ = profiler.steady_window(reports, warmup_s=1.0, training=False)
    assert first["wall_time"] == 3
    with pytest.raises(profiler.LateStart, match="started flowing at 3.0 s") as late:
        profiler.steady_window(reports, warmup_s=2.5, training=True)
    assert late.value.allowance() == pytest.approx(3.0 * profiler.STARTUP_MARGIN)
    with pytest.raises(profiler.LateStart, match="never") as late:
        profiler.steady_window(reports[:2], warmup_s=1.0, training=True)
    assert late.value.allowance() == 4.0  # twice the run that never flowed


def test_random_actions_stay_in_the_action_space():
    # The table holds actions as VecEnv.send takes them (flat, zero-based); the env gets them shifted.
    rng = np.random.default_rng(0)
    space = gymnasium.spaces.Discrete(3, start=1)
    discrete = profiler.random_action_table(space, 8, 4, rng)
    assert discrete.shape == (4, 8) and discrete.dtype == np.int64 and set(np.unique(discrete)) == {0, 1, 2}
    assert set(np.unique(ActionLayout(space).to_env(discrete.reshape(-1)))) == {1, 2, 3}
    box = gymnasium.spaces.Box(low=np.array([[-2.0, -np.inf]], np.float32), high=np.array([[2.0, np.inf]], np.float32),
                               dtype=np.float32)
    continuous = profiler.random_action_table(box, 8, 4, rng)
    assert continuous.shape == (4, 8, 2) and continuous.dtype == np.float32
    assert np.abs(continuous[..., 0]).max() <= 2.0 and np.abs(continuous[..., 1]).max() <= 1.0
    assert all(box.contains(action) for action in ActionLayout(box).to_env(continuous.reshape(32, 2)))


def test_random_actions_of_a_masked_env_are_legal_and_cover_every_legal_choice():
    rng = np.random.default_rng(0)
    discrete = ActionLayout(gymnasium.spaces.Discrete(4))
    mask = np.array([[0, 1, 0, 1], [1, 0, 0, 0], [0, 0, 1, 1]], np.int8)
    seen = [set() for _ in mask]
    for _ in range(200):
        actions = profiler.legal_random_actions(discrete, mask, rng.random((3, 4)))
        assert actions.shape == (3,) and mask[np.arange(3), actions].all()
        for row, action in enumerate(actions):
            seen[row].add(int(action))
    assert seen == [{1, 3}, {0}, {2, 3}]
    multi = ActionLayout(gymnasium.spaces.MultiDiscrete([2, 3]))
    flags = np.array([[1, 0, 0, 1, 1], [0, 1, 1, 0, 0]], bool)  # part 0: 2 flags, part 1: 3 flags
    for _ in range(50):
        actions = profiler.legal_random_actions(multi, flags, rng.random((2, 5)))
        assert actions.shape == (2, 2) and flags[np.arange(2), actions[:, 0]].all()
        assert flags[np.arange(2), 2 + actions[:, 1]].all()


def test_nvidia_smi_rows_are_parsed():
    text = "0, NVIDIA H100 80GB HBM3, 37, 1234, 81559\n1, NVIDIA H100 80GB HBM3, [N/A], 0, 81559\n"
    gpus = profiler.parse_nvidia_smi(text)
    assert gpus[0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_percent": 37.0,
                       "memory_used_mib": 1234.0, "memory_total_mib": 81559.0}
    assert gpus[1]["util_percent"] is None


class FakeNVML:
    """pynvml's calls that the profiler makes, for two GPUs; the second reports no utilisation."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.handles = ["gpu0", "gpu1"]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.handles[index]

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3" if handle == "gpu0" else "NVIDIA H200"  # older releases return bytes

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == "gpu1":
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=1234 * 2**20, total=81559 * 2**20, free=0)


def no_cuda_context(monkeypatch):
    """torch.cuda's per-GPU queries open a CUDA context on each GPU: the profiler must not call them."""
    def refuse(*args, **kwargs):
        raise AssertionError("the profiler queried a GPU through torch.cuda")

    for name in ("mem_get_info", "utilization", "get_device_name", "device_count"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_gpus_are_read_through_nvml_without_a_cuda_context(monkeypatch):
    no_cuda_context(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    gpus = profiler.gpu_query()()
    assert gpus == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_percent": 37.0, "memory_used_mib": 1234.0,
                     "memory_total_mib": 81559.0},
                    {"index": 1, "name": "NVIDIA H200", "util_percent": None, "memory_used_mib": 1234.0,
                     "memory_total_mib": 81559.0}]


def test_without_nvml_gpus_come_from_nvidia_smi_or_not_at_all(monkeypatch):
    no_cuda_context(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: importing it raises ImportError
    monkeypatch.setattr(sampling.shutil, "which", lambda name: None)
    assert profiler.gpu_query() is None
    rows = [{"index": 0, "name": "NVIDIA H100", "util_percent": 1.0, "memory_used_mib": 2.0, "memory_total_mib": 3.0}]
    monkeypatch.setattr(sampling.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sampling, "_nvidia_smi_query", lambda: rows)
    assert profiler.gpu_query()() == rows
    monkeypatch.setattr(sampling, "_nvidia_smi_query", lambda: [])  # nvidia-smi present, no driver or no GPU
    assert profiler.gpu_query() is None


def test_nvml_without_a_driver_falls_back_to_nvidia_smi(monkeypatch):
    nvml = FakeNVML()

    def no_driver():
        raise nvml.NVMLError("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    rows = [{"index": 0, "name": "NVIDIA H100", "util_percent": 1.0, "memory_used_mib": 2.0, "memory_total_mib": 3.0}]
    monkeypatch.setattr(sampling.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sampling, "_nvidia_smi_query", lambda: rows)
    assert profiler.gpu_query()() == rows


# --- the real thing: CartPole ---------------------------------------------------------------


def test_autotune_tries_acting_in_the_workers_and_in_the_batcher():
    cfg = build_config("cartpole-appo", SMALL)
    assert "inference.in_workers" in profiler.tuned_keys(cfg)
    assert profiler.candidate_values(cfg, "inference.in_workers", 2) == [True]
    assert profiler.candidate_values(build_config("cartpole-appo", {}), "inference.in_workers", 2) == [False]


def test_autotune_keeps_a_reserve_for_a_last_trial_that_stops_slower_than_any_before(monkeypatch):
    """A fake clock: every trial starts in 1 s and trains 2.5 s; it stops in 1 s until the machine gets
    loaded 23 s in, then in 1.9 s, past the 1.2 s the estimate allows. Without the reserve the
    trial admitted at 27 s ends at 32.4 s of a 32 s budget; with it, none starts after 22.5 s."""
    from fastrl.profiler import tuning

    clock = [0.0]
    monkeypatch.setattr(tuning, "time", SimpleNamespace(time=lambda: clock[0]))
    cfg = build_config("cartpole-appo", SMALL)
    monkeypatch.setattr(tuning, "tuned_keys", lambda cfg: ("learner.batch_size",))
    monkeypatch.setattr(tuning, "candidate_values", lambda cfg, key, cores: [1024] * 20)

    def fake_measure_run(cfg, seconds, warmup_s, sample_only, startup_s):
        stop = 1.9 if clock[0] >= 23.0 else 1.0
        trained = 1.0 + warmup_s + seconds
        clock[0] += trained + stop
        return SimpleNamespace(startup_s=1.0, trained_s=trained, env_steps_per_s=1000.0, frames_per_s=1000.0,
                               diagnosis=SimpleNamespace(bottleneck="env"))

    monkeypatch.setattr(tuning, "measure_run", fake_measure_run)
    result = profiler.autotune(cfg, budget_s=32.0, trial_seconds=2.0, warmup_s=0.5, log=lambda message: None)
    assert not result.complete  # the budget, not the candidates, ended the search
    assert len(result.trials) == 6 and result.elapsed_s == 27.0 <= 32.0
    tuner = tuning.Autotuner(cfg, 32.0, 2.0, 0.5, log=None)
    assert tuner.reserve() == 0.05 * 32.0
    tuner.measured_overheads = [1.0, 3.0]
    assert tuner.reserve() == 2.0  # the spread of the measured trials' stops, when wider
    tuner.overheads = [-3.0, 1.0, 3.0]  # a trial that failed at once: no stop to learn from
    assert tuner.reserve() == 2.0


def test_autotune_lets_a_slow_first_start_take_what_the_budget_leaves(monkeypatch):
    """A fake clock on a loaded machine: every run flows 10.7 s after its start, past the 8 s
    STARTUP_ESTIMATE_S. The base trial may take what the 24 s budget leaves beyond its estimated
    cost (15.5 s) and the reserve (1.2 s), so it is measured at once; with the estimate alone it
    would start late, and a retry with the 12.8 s it learned would no longer fit."""
    from fastrl.profiler import tuning
    from fastrl.profiler.diagnosis import LateStart

    clock = [0.0]
    allowed = []
    monkeypatch.setattr(tuning, "time", SimpleNamespace(time=lambda: clock[0]))
    cfg = build_config("cartpole-appo", SMALL)
    monkeypatch.setattr(tuning, "tuned_keys", lambda cfg: ("learner.batch_size",))
    monkeypatch.setattr(tuning, "candidate_values", lambda cfg, key, cores: [1024])

    def fake_measure_run(cfg, seconds, warmup_s, sample_only, startup_s):
        allowed.append(startup_s)
        if startup_s < 10.7:
            clock[0] += startup_s + warmup_s + 0.5
            raise LateStart(None, startup_s + warmup_s, warmup_s)
        trained = 10.7 + warmup_s + seconds
        clock[0] += trained + 0.5
        return SimpleNamespace(startup_s=10.7, trained_s=trained, env_steps_per_s=1000.0, frames_per_s=1000.0,
                               diagnosis=SimpleNamespace(bottleneck="env"))

    monkeypatch.setattr(tuning, "measure_run", fake_measure_run)
    result = profiler.autotune(cfg, budget_s=24.0, trial_seconds=2.0, warmup_s=0.5, log=lambda message: None)
    assert allowed[0] == pytest.approx(24.0 - 15.5 - 1.2 + 8.0)
    assert result.trials[0].status == "ok" and result.base_fps == 1000.0
    assert result.elapsed_s <= 24.0 and len(result.trials) == 1  # a second trial (learned 12.8 s) cannot fit
    assert not result.complete


# --- bad input: exit code 2, one line -------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--profile", "cartpol-appo"], "did you mean cartpole-appo"),
    (["--set", "env.num_wrkers=2"], "did you mean env.num_workers"),
    (["--set", "learner.batch_size=10000000"], "lower learner.batch_size"),
    (["--budget-seconds", "60"], "add --autotune"),
    (["--autotune", "--budget-seconds", "5"], "cannot fit one trial"),
    (["--seconds", "0.1"], "--seconds must be >= 0.5"),
    (["--json", "/nonexistent/dir/out.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, message, capsys):
    assert profile_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastrl-profile: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plot_without_matplotlib_fails_before_measuring(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert profile_main(["--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'fastrl[plot]'" in err and len(err.strip().splitlines()) == 1


def test_a_late_start_is_tried_once_more_with_twice_its_start_up(monkeypatch):
    """measure_run_patiently: the retry, the last try, allows twice the start-up the late run showed
    (or its own allowance if that is longer); a second late start is the error."""
    from fastrl.profiler import measure

    allowed, logged = [], []

    def late_run(cfg, seconds, warmup_s, sample_only, startup_s):
        allowed.append(startup_s)
        raise profiler.LateStart(9.3 if len(allowed) == 1 else None, startup_s + 1.5, warmup_s)

    monkeypatch.setattr(measure, "measure_run", late_run)
    with pytest.raises(profiler.LateStart, match="never"):
        measure.measure_run_patiently(None, 1.0, 0.5, True, 8.0, logged.append)
    assert allowed == [8.0, pytest.approx(18.6)] and "once more with 19 s" in logged[0]
    allowed.clear()

    def late_then_measured(*args):
        if not allowed:
            late_run(*args)
        allowed.append(args[-1])
        return "measured"

    monkeypatch.setattr(measure, "measure_run", late_then_measured)
    assert measure.measure_run_patiently(None, 1.0, 0.5, True, 30.0, logged.append) == "measured"
    assert allowed == [30.0, 30.0]  # never less than the first try's own allowance
