"""Policies as a dimension of a run (issue 41 item 2): ``[policies]`` mapped onto a game's agents,
each policy's rows acted with its own weights (one forward pass per weight set) and trained by its
own learner only, checkpointed, reported and resumed together; bad mappings refused in one line."""
import copy

import numpy as np
import pytest
import torch

from fastrl.cli import train_main
from fastrl.config import ConfigError, build_config
from fastrl.envs import probe_env
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.ipc.arena import Arena
from fastrl.ipc.slots import serial_slots
from fastrl.ipc.weights import WeightBuffer
from fastrl.models.networks import build_model, num_state_values, state_to_flat
from fastrl.multiagent.policy_map import policy_map
from fastrl.reporting.metrics import WorkerTiming
from fastrl.run.plan import RunError
from fastrl.run.preflight import arena_layout, run_policies
from fastrl.run.training import train
from fastrl.sampling.batcher import InferenceBatcher
from fastrl.sampling.rollout_worker import RolloutWorker, make_worker_env
from tests.support import user_modules
from tests.support.same_state import assert_same_state
from tests.support.training import read_metrics

GAMES = "fastrl.envs.toy:AgreementGames"
OWN_ACTION = 3  # AgreementGames' observation (t, k, g, a_k, m): the action the agent played last


def team(agent: str) -> str:
    """A mapping callable (``tests.unit.learner.test_policy_set:team``): agent_1 plays for blue, the others for red."""
    return "blue" if agent == "agent_1" else "red"


def single(agent: str) -> str:
    """Names the one agent of a single-agent env."""
    return "solo" if agent == "agent" else f"not {agent}"


def broken(agent: str) -> str:
    raise KeyError(agent)


NOT_CALLABLE = 3


def games_config(agents: int = 2, **overrides):
    """AgreementGames of ``agents`` agents, four games a worker in two splits, one policy per agent."""
    settings = {"env.id": GAMES, "env.kwargs": {"agents": agents, "length": 6}, "env.num_workers": 1,
                "env.envs_per_worker": 4 * agents, "env.num_splits": 2, "learner.rollout": 4,
                "learner.batch_size": 16, "slots_per_env": 4, "model.hidden_sizes": [16],
                "policies.mapping": "per_agent", "inference.in_workers": False, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("agents, mapping, names, expected_names, expected_rows", [
    (3, "shared", ["main"], ("main",), [0, 0, 0, 0, 0, 0]),
    (3, "shared", ["hero"], ("hero",), [0, 0, 0, 0, 0, 0]),
    (3, "per_agent", ["main"], ("agent_0", "agent_1", "agent_2"), [0, 1, 2, 0, 1, 2]),
    (2, "per_agent", ["agent_0", "agent_1"], ("agent_0", "agent_1"), [0, 1, 0, 1]),
    (3, "tests.unit.learner.test_policy_set:team", ["red", "blue"], ("red", "blue"), [0, 1, 0, 0, 1, 0]),
    (3, "tests.unit.learner.test_policy_set:team", ["blue", "red"], ("blue", "red"), [1, 0, 1, 1, 0, 1]),
])
def test_a_mapping_sends_each_agent_row_to_its_policy(agents, mapping, names, expected_names, expected_rows):
    cfg = games_config(agents, **{"policies.mapping": mapping, "policies.names": names})
    policies = run_policies(cfg, probe_env(cfg))
    assert policies.names == expected_names and policies.agents == tuple(f"agent_{k}" for k in range(agents))
    np.testing.assert_array_equal(policies.row_policies(len(expected_rows)), expected_rows)
    for p, name in enumerate(policies.names):
        assert policies.agents_of(p) == [a for a, q in zip(policies.agents, expected_rows) if q == p]


def test_a_single_agent_env_is_one_agent_named_agent():
    cfg = build_config("cartpole-appo", {"env.id": "fastrl.envs.toy:make_countdown", "policies.names": ["solo"],
                                         "policies.mapping": "tests.unit.learner.test_policy_set:single",
                                         "device": "cpu"})
    policies = run_policies(cfg, probe_env(cfg))
    assert policies.names == ("solo",) and policies.agents == ("agent",)
    np.testing.assert_array_equal(policies.row_policies(4), [0, 0, 0, 0])


@pytest.mark.parametrize("settings, message", [
    ({"policies.names": []}, "policies.names is empty"),
    ({"policies.names": ["a b"]}, "policies.names 'a b': a policy name is letters, digits"),
    ({"policies.names": ["a/b"]}, "policies.names 'a/b'"),
    ({"policies.names": ["red", "red"], "policies.mapping": "tests.unit.learner.test_policy_set:team"},
     "lists a policy twice"),
    ({"policies.mapping": "bogus"}, "policies.mapping='bogus': use shared, per_agent, by_kind or module:fn"),
    ({"policies.mapping": "shared", "policies.names": ["red", "blue"]},
     "policies.mapping=shared sends every agent to 'red', leaving blue unused"),
    ({"policies.mapping": "per_agent", "selfplay.enabled": True}, "selfplay.enabled plays one policy"),
    ({"policies.mapping": "tests.unit.learner.test_policy_set:team", "policies.names": ["red", "blue"],
      "selfplay.enabled": True},
     "selfplay.enabled plays one policy"),
])
def test_bad_policies_are_refused_by_the_config_in_one_line(settings, message):
    with pytest.raises(ConfigError) as error:
        games_config(**settings)
    assert message in one_line(error)


@pytest.mark.parametrize("agents, settings, message", [
    (3, {"policies.mapping": "tests.unit.learner.test_policy_set:team", "policies.names": ["red", "green"]},
     "sends agent 'agent_1' to 'blue', which is not one of policies.names (red, green)"),
    (3, {"policies.mapping": "tests.unit.learner.test_policy_set:team", "policies.names": ["red", "blue", "green"]},
     "sends no agent to green"),
    (2, {"policies.mapping": "per_agent", "policies.names": ["red", "blue"]},
     "per_agent names each policy after its agent (agent_0, agent_1)"),
    (2, {"policies.mapping": "no_such_module:fn"}, "policies.mapping 'no_such_module:fn': cannot import "
                                                   "'no_such_module'"),
    (2, {"policies.mapping": "tests.unit.learner.test_policy_set:no_such_fn"},
     "policies.mapping 'tests.unit.learner.test_policy_set:no_such_fn': "
     "module 'tests.unit.learner.test_policy_set' has no 'no_such_fn'"),
    (2, {"policies.mapping": "tests.unit.learner.test_policy_set:NOT_CALLABLE"}, "is not callable (type int)"),
    (2, {"policies.mapping": "tests.unit.learner.test_policy_set:broken"},
     "policies.mapping tests.unit.learner.test_policy_set:broken failed for agent 'agent_0' (KeyError: 'agent_0')"),
    # Two policies each waiting for 5 of their own trajectories while the envs queue 8 at once.
    (2, {"slots_per_env": 2, "learner.batch_size": 20},
     "2 policies each need 5 trajectories a batch, and the envs can queue only 8 at once"),
])
def test_mappings_that_cannot_work_on_the_env_are_refused_in_one_line(agents, settings, message):
    cfg = games_config(agents, **settings)
    with pytest.raises(ConfigError) as error:
        run_policies(cfg, probe_env(cfg))
    assert message in one_line(error)


TAG = "pettingzoo:mpe2.simple_tag_v3"  # adversary_0..2 observe 16 values, agent_0 14


def tag_config(**overrides):
    settings = {"env.id": TAG, "env.num_workers": 1, "env.envs_per_worker": 8, "env.num_splits": 2,
                "learner.rollout": 4, "learner.batch_size": 16, "slots_per_env": 4, "policies.mapping": "by_kind",
                "eval.every_s": 0.0, "device": "cpu"}
    settings.update(overrides)
    return build_config("cartpole-appo", settings)


def test_by_kind_gives_each_kind_of_agent_its_policy_over_padded_rows():
    cfg = tag_config()
    spec = probe_env(cfg)
    policies = run_policies(cfg, spec)
    assert policies.names == ("adversary", "agent")
    assert policies.agent_policy == (0, 0, 0, 1)
    np.testing.assert_array_equal(policies.row_policies(8), [0, 0, 0, 1, 0, 0, 0, 1])
    assert spec.observation_space.shape == (16,)
    assert [space.shape for space in spec.agent_spaces] == [(16,), (16,), (16,), (14,)]
    prey_first = run_policies(tag_config(**{"policies.names": ["agent", "adversary"]}), spec)
    assert prey_first.names == ("agent", "adversary") and prey_first.agent_policy == (1, 1, 1, 0)


@pytest.mark.parametrize("settings, message", [
    ({"policies.mapping": "shared"},
     "policy 'main' would act for agents with different observation spaces (adversary_0, adversary_1, "
     "adversary_2: Box(-inf, inf, (16,), float32); agent_0: Box(-inf, inf, (14,), float32)); give agents of each "
     "space their own policy: policies.mapping=by_kind"),
    ({"policies.mapping": "shared", "pbt.population": 2, "env.envs_per_worker": 8},
     "members each play every agent: set pbt.population=0"),
    ({"policies.names": ["hunters", "prey"]}, "by_kind names each policy after its agents' kind (adversary, agent): "
                                               "leave policies.names at its default, or list those kinds"),
])
def test_agents_of_different_spaces_under_one_policy_are_refused_in_one_line(settings, message):
    cfg = tag_config(**settings)
    with pytest.raises(ConfigError) as error:
        run_policies(cfg, probe_env(cfg))
    assert message in one_line(error)


def test_evaluation_during_training_without_opponents_is_refused_where_spaces_differ(tmp_path):
    with pytest.raises(ConfigError) as error:
        train(tag_config(**{"eval.every_s": 60.0}), run_dir=tmp_path / "run", quiet=True)
    assert ("evaluation during training (eval.every_s) without eval.opponents plays one policy in every seat"
            in one_line(error))
    assert "set eval.opponents" in one_line(error) and "or eval.every_s=0" in one_line(error)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("module, message", user_modules.BROKEN)
def test_a_mapping_module_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, module, message):
    user_modules.install(tmp_path, monkeypatch)
    cfg = games_config(2, **{"policies.mapping": f"{module}:fn"})
    with pytest.raises(ConfigError) as error:
        run_policies(cfg, probe_env(cfg))
    assert one_line(error).startswith(f"policies.mapping '{module}:fn': ") and message in one_line(error)


@pytest.mark.parametrize("settings, num_policies", [
    ({"slots_per_env": 2, "learner.batch_size": 20, "policies.mapping": "shared"}, 1),  # one batch of 5 in 8
    ({"slots_per_env": 2, "learner.batch_size": 16}, 2),  # 2 x (4 - 1) + 1 = 7 queued complete a batch
])
def test_slot_pools_that_hold_every_policys_batch_are_accepted(settings, num_policies):
    cfg = games_config(2, **settings)
    assert run_policies(cfg, probe_env(cfg)).num_policies == num_policies


def test_selfplay_on_a_single_agent_env_is_refused_in_one_line():
    cfg = build_config("cartpole-appo", {"env.id": "fastrl.envs.toy:make_countdown", "selfplay.enabled": True,
                                         "device": "cpu"})
    with pytest.raises(ConfigError) as error:
        run_policies(cfg, probe_env(cfg))
    assert "selfplay.enabled needs a multi-agent env" in one_line(error)


def test_fastrl_train_says_a_bad_mapping_in_one_line(tmp_path, capsys):
    code = train_main(["--env", GAMES, "--set", "env.kwargs={agents=3}", "--set",
                       "policies.mapping=tests.unit.learner.test_policy_set:team", "--set", 'policies.names=["red"]',
                       "--serial", "--run-dir", str(tmp_path / "run"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "sends agent 'agent_1' to 'blue', which is not one of policies.names (red)" in err
    assert not (tmp_path / "run" / "config.toml").exists()


def forced_policy_weights(model: torch.nn.Module, action: int) -> np.ndarray:
    """Flat weights of ``model`` with a policy head that picks ``action`` (probability ~1)."""
    forced = copy.deepcopy(model)
    with torch.no_grad():
        forced.policy.weight.zero_()
        forced.policy.bias.fill_(-30.0)
        forced.policy.bias[action] = 30.0
    return state_to_flat(forced, torch.empty(num_state_values(forced))).numpy()


def route_rows(cfg, rounds: int, numpy_mlp: bool):
    """Workers, batcher and the learner's queues wired as the serial run does, each policy p's
    weights (version 10 + p) playing action p. Returns the policies, the batches the learner's
    queues hand out as (policy, slot rows, actions, versions, observations) and, per batcher call,
    the (weight set, rows) of each forward pass and of each policy the call held rows of."""
    spec = probe_env(cfg)
    policies = policy_map(cfg, spec.agents)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    arena = Arena(arena_layout(cfg, spec, num_state_values(model)), shared=False)
    arena.weight_version[:] = -1
    for p in range(policies.num_policies):
        WeightBuffer(arena, p).publish(forced_policy_weights(model, p), 10 + p)
    batcher = InferenceBatcher(arena, model, spec.action_space, torch.device("cpu"), numpy_mlp=numpy_mlp)
    assert len(batcher.weight_sets) == policies.num_policies
    forwards: list[list[tuple[int, int]]] = []
    act = batcher.act

    def counted_act(weight_set, slots, *rest):
        forwards[-1].append((batcher.weight_sets.index(weight_set), len(slots)))
        act(weight_set, slots, *rest)

    batcher.act = counted_act
    W, E = cfg.env.num_workers, cfg.env.envs_per_worker
    row_policy = np.tile(policies.row_policies(E), W)
    worker_slots, full = serial_slots(arena, W, cfg.slots_per_worker, cfg.trajectories_per_batch,
                                      lambda w: WorkerTiming.cell(arena, w, WorkerTiming.WAIT_SLOTS),
                                      row_policy)
    workers = [RolloutWorker(w, cfg, arena, make_worker_env(cfg, w), slots.take(E), slots.take, slots.emit,
                             policies.row_policies(E)) for w, slots in enumerate(worker_slots)]
    batches, expected = [], []
    for worker in workers:
        worker.start()
    for _ in range(rounds):
        ready = [(w, worker.recv_batch()) for w, worker in enumerate(workers) for _ in iter(worker.can_recv, False)]
        assert batcher.refresh_weights()
        forwards.append([])
        requested = np.concatenate([w * E + arena.request_envs[w, r] for w, r in ready])
        counts = np.bincount(row_policy[requested], minlength=policies.num_policies)
        expected.append([(k, int(n)) for k, n in enumerate(counts) if n])
        batcher.infer(np.array([w for w, _ in ready]), np.array([r for _, r in ready]))
        for w, request in ready:
            workers[w].act(request)
        while (batch := full.next_batch()) is not None:
            p, ids = batch
            batches.append((p, arena.slot_env[ids].copy(), arena.actions[ids].copy(), arena.version[ids].copy(),
                            arena.obs[ids].copy()))
            full.release(ids)
    for worker in workers:
        worker.env.close()
    return policies, batches, forwards, expected


@pytest.mark.parametrize("numpy_mlp", [False, True], ids=["torch", "numpy_mlp"])
@pytest.mark.parametrize("agents, mapping, names", [(2, "per_agent", ["main"]),
                                                    (3, "tests.unit.learner.test_policy_set:team", ["red", "blue"])])
def test_each_policy_acts_for_and_trains_on_its_own_agents_rows_only(agents, mapping, names, numpy_mlp):
    cfg = games_config(agents, **{"policies.mapping": mapping, "policies.names": names, "env.num_workers": 2})
    policies, batches, forwards, expected = route_rows(cfg, rounds=40, numpy_mlp=numpy_mlp)
    row_policy = np.tile(policies.row_policies(cfg.env.envs_per_worker), cfg.env.num_workers)
    trained = {p: 0 for p in range(policies.num_policies)}
    for p, rows, actions, versions, obs in batches:
        trained[p] += 1
        assert len(rows) == cfg.trajectories_per_batch
        np.testing.assert_array_equal(row_policy[rows], p)  # the policy's own agents' slots, of both workers
        np.testing.assert_array_equal(actions, p)  # every step acted by the policy's own weights
        np.testing.assert_array_equal(versions, 10 + p)
        played = obs[:, 1:, OWN_ACTION]  # what the env received: the action, or -1 on a reset observation
        assert set(np.unique(played).tolist()) <= {p, -1.0} and (played == p).any()
    assert all(count >= 3 for count in trained.values()), trained
    assert {rows[0] // cfg.env.envs_per_worker for _, rows, *_ in batches} == {0, 1}
    # One forward pass per weight set a batcher call holds rows of, with exactly those rows.
    assert forwards == expected
    assert all(len(passes) == policies.num_policies for passes in forwards)


def check_two_policy_run(run_dir):
    """The checkpoint holds both policies apart, and the metrics report each."""
    state = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert list(state["policies"]) == ["agent_0", "agent_1"]
    first, second = (state["policies"][name] for name in ("agent_0", "agent_1"))
    assert_same_state(state["learner"]["model"], first["learner"]["model"], "learner = agent_0's")
    assert first["learner"]["updates"] > 0 and second["learner"]["updates"] > 0
    assert first["trained_env_steps"] == state["counters"]["trained_env_steps"] > 0
    assert second["trained_env_steps"] > 0
    assert not all(torch.equal(first["learner"]["model"][k], second["learner"]["model"][k])
                   for k in first["learner"]["model"])
    records = read_metrics(run_dir)
    for name in ("agent_0", "agent_1"):
        assert any(r[f"policy/{name}/episodes_recent"] > 0 for r in records)
        returns = [r[f"policy/{name}/episode_return_mean"] for r in records
                   if r[f"policy/{name}/episode_return_mean"] is not None]
        assert returns and all(0.0 <= v <= 6.0 for v in returns)  # 6 steps of reward in [0, 1]
        assert records[-1][f"policy/{name}/learner/learner_updates"] > 0
    assert records[-1]["policy/agent_0/episode_length_mean"] == 6.0
    return state


def test_two_policies_train_checkpoint_report_and_resume_together(tmp_path):
    cfg = games_config(**{"serial": True, "train_for_env_steps": 1_500, "report_every_s": 0.2})
    train(cfg, run_dir=tmp_path, quiet=True)
    before = check_two_policy_run(tmp_path)
    # Resumed at its budget, the run trains nothing: its last checkpoint is the state it restored.
    train(cfg, run_dir=tmp_path, resume=True, quiet=True)
    restored = load_checkpoint(list_checkpoints(tmp_path)[-1])
    for name in ("agent_0", "agent_1"):
        assert_same_state(before["policies"][name], restored["policies"][name], name)  # weights, optimizer, steps
    assert restored["counters"]["trained_env_steps"] == before["counters"]["trained_env_steps"]
    # Resumed further, both policies go on from there.
    train(games_config(**{"serial": True, "train_for_env_steps": 2_500, "report_every_s": 0.2}), run_dir=tmp_path,
          resume=True, quiet=True)
    after = load_checkpoint(list_checkpoints(tmp_path)[-1])
    for name in ("agent_0", "agent_1"):
        was, now = before["policies"][name], after["policies"][name]
        assert now["learner"]["updates"] > was["learner"]["updates"]
        assert now["trained_env_steps"] > was["trained_env_steps"]


@pytest.mark.parametrize("settings, message", [
    ({"policies.mapping": "shared"}, "trained policies agent_0, agent_1 (this run has main)"),
    ({"policies.mapping": "tests.unit.learner.test_policy_set:team", "policies.names": ["red", "blue"],
      "env.kwargs": {"agents": 2, "length": 6}}, "trained policies agent_0, agent_1 (this run has red, blue)"),
])
def test_resuming_with_other_policies_is_refused_in_one_line(tmp_path, settings, message):
    cfg = games_config(**{"serial": True, "train_for_env_steps": 200})
    train(cfg, run_dir=tmp_path, quiet=True)
    saved = list_checkpoints(tmp_path)
    with pytest.raises(RunError) as error:
        train(games_config(**{"serial": True, "train_for_env_steps": 400, **settings}), run_dir=tmp_path,
              resume=True, quiet=True)
    assert message in one_line(error) and "policies.names and policies.mapping" in str(error.value)
    assert list_checkpoints(tmp_path) == saved


def test_a_single_policy_run_cannot_resume_as_two(tmp_path, capsys):
    train(games_config(**{"serial": True, "train_for_env_steps": 200, "policies.mapping": "shared"}),
          run_dir=tmp_path, quiet=True)
    code = train_main(["--resume", "--run-dir", str(tmp_path), "--set", "policies.mapping=per_agent", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "trained one policy (this run has agent_0, agent_1)" in err

