"""Env backends: NEXT_STEP autoreset, batch ordering, seeding, errors, Atari preprocessing."""

import warnings

import envpool
import gymnasium
import numpy as np
import pytest

from fastrl.cli import train_main
from fastrl.envs import make_vec_env, resolve_backend
from fastrl.envs.backends.atari import ENVPOOL_ATARI_DEFAULTS
from fastrl.envs.backends.envpool_backend import DirectPoolIO, _PublicPoolIO
from tests.e2e.test_cli_errors import one_line_error
from tests.support import user_modules
from tests.support.fault_envs import make_nan_obs, make_raises_at

COUNTDOWN = "fastrl.envs.toy:make_countdown"
COUNTDOWN_GYM_ID = "fastrl-test/Countdown-v0"
if COUNTDOWN_GYM_ID not in gymnasium.registry:
    gymnasium.register(COUNTDOWN_GYM_ID, entry_point="fastrl.envs.toy:CountdownEnv")


def run_steps(env, num_recvs, policy=None):
    """async_reset, then `num_recvs` recv/send rounds; returns per-env lists of
    (obs, reward, terminated, truncated) in the order each env produced them."""
    policy = policy or (lambda obs: np.zeros(len(obs), dtype=np.int64))
    streams = {i: [] for i in range(env.num_envs)}
    env.async_reset()
    for _ in range(num_recvs):
        obs, rewards, terminated, truncated, env_ids = env.recv()
        for row, env_id in enumerate(env_ids):
            streams[int(env_id)].append(
                (obs[row].copy(), float(rewards[row]), bool(terminated[row]), bool(truncated[row]))
            )
        env.send(policy(obs), env_ids)
    return streams


def parity_policy(obs):
    """Deterministic but irregular CartPole actions, so episodes end at varied times."""
    return (np.abs(obs[:, 0] * 1e4).astype(np.int64) % 2).astype(np.int32)


@pytest.mark.parametrize("async_mode", [False, True])
def test_envpool_space_cast_warning_is_not_shown_to_users(async_mode):
    # envpool's float64 bounds on float32 Boxes made gymnasium warn in every worker of every run.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make_vec_env("CartPole-v1", 8, 4, seed=0, async_mode=async_mode) as env:
            run_steps(env, 4)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("async_mode", [False, True])
def test_envpool_cartpole_step_after_done_is_reset(async_mode):
    with make_vec_env("CartPole-v1", 8, 4, seed=0, async_mode=async_mode) as env:
        streams = run_steps(env, 120)
    resets_checked = 0
    for stream in streams.values():
        assert stream[0][1:] == (0.0, False, False)
        for (_, _, term, trunc), (obs, reward, next_term, next_trunc) in zip(stream, stream[1:]):
            if term or trunc:
                assert (reward, next_term, next_trunc) == (0.0, False, False)
                assert np.all(np.abs(obs) <= 0.05)  # CartPole's reset state
                resets_checked += 1
    assert resets_checked >= 8


def test_envpool_truncation_is_not_termination():
    with make_vec_env("CartPole-v1", 2, 2, seed=0, env_kwargs={"max_episode_steps": 3}) as env:
        streams = run_steps(env, 9, policy=lambda obs: np.arange(len(obs)) % 2)
    flags = [(term, trunc) for _, _, term, trunc in streams[0]]
    assert flags == [(False, False), (False, False), (False, False), (False, True)] * 2 + [
        (False, False)
    ]


@pytest.mark.parametrize("env_id", [COUNTDOWN, COUNTDOWN_GYM_ID])
@pytest.mark.parametrize(
    "kwargs, ends",
    [
        ({"length": 3}, "terminated"),
        ({"length": 5, "time_limit": 2}, "truncated"),
    ],
)
def test_gymnasium_countdown_exact_sequence(env_id, kwargs, ends):
    with make_vec_env(env_id, 4, 2, seed=0, env_kwargs=kwargs) as env:
        assert env.frame_skip == 1
        streams = run_steps(env, 2 * 8)
    episode_len = kwargs.get("time_limit") or kwargs["length"]
    expected = []
    for _ in range(3):
        expected.append((0.0, 0.0, False, False))  # reset step: reward 0, action ignored
        expected += [(float(t), 1.0, False, False) for t in range(1, episode_len)]
        done = (ends == "terminated", ends == "truncated")
        expected.append((float(episode_len), 1.0, *done))
    for stream in streams.values():
        got = [(float(obs[0]), reward, term, trunc) for obs, reward, term, trunc in stream]
        assert got == expected[: len(got)]


@pytest.mark.parametrize("env_id", ["CartPole-v1", COUNTDOWN])
def test_sync_splits_are_returned_oldest_first(env_id):
    with make_vec_env(env_id, 12, 4, seed=0) as env:
        env.async_reset()
        first = [env.recv()[-1] for _ in range(3)]
        assert [ids.tolist() for ids in first] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        assert all(ids.dtype == np.int32 for ids in first)
        actions = np.zeros(4, dtype=np.int64)
        env.send(actions, first[1])
        env.send(actions, first[0])
        assert env.recv()[-1].tolist() == [4, 5, 6, 7]
        with pytest.raises(RuntimeError):
            env.send(actions, first[0])  # sent already and not received since
        for mixed in ([4, 5, 6, 8], [4, 5, 6, 3]):  # split 1's batch with an id of another split
            with pytest.raises(RuntimeError):
                env.send(actions, np.array(mixed, dtype=np.int32))
        env.send(actions, first[1])
        env.send(actions, first[2])
        assert [env.recv()[-1][0] for _ in range(3)] == [0, 4, 8]
        with pytest.raises(RuntimeError):
            env.recv()  # nothing pending: would wait forever


def test_envpool_async_returns_each_sent_env_once_and_keeps_streams():
    num_envs = 8
    with make_vec_env("CartPole-v1", num_envs, 2, seed=3, async_mode=True) as env:
        env.async_reset()
        pending = set(range(num_envs))
        streams = {i: [] for i in range(num_envs)}
        for _ in range(200):
            obs, rewards, terminated, truncated, env_ids = env.recv()
            ids = env_ids.tolist()
            assert len(set(ids)) == 2 and set(ids) <= pending
            pending -= set(ids)
            for row, env_id in enumerate(ids):
                streams[env_id].append(
                    (obs[row].copy(), float(rewards[row]), bool(terminated[row]),
                     bool(truncated[row]))
                )
            # Send one env at a time, so later batches mix envs of different sends.
            actions = parity_policy(obs)
            env.send(actions[:1], env_ids[:1])
            env.send(actions[1:], env_ids[1:])
            pending |= set(ids)
        with pytest.raises(RuntimeError):
            env.send(actions[:1], env_ids[:1])  # already sent
    # Each env's stream depends only on its seed and its own actions: sync splits agree.
    with make_vec_env("CartPole-v1", num_envs, 4, seed=3) as env:
        sync_streams = run_steps(env, 200, policy=parity_policy)
    for env_id, stream in streams.items():
        n = min(len(stream), len(sync_streams[env_id]))
        assert n > 10
        for (obs_a, *rest_a), (obs_b, *rest_b) in zip(stream[:n], sync_streams[env_id][:n]):
            np.testing.assert_array_equal(obs_a, obs_b)
            assert rest_a == rest_b


def test_seeds_differ_across_envs_and_splits_and_follow_seed():
    def reset_obs(env_id, seed):
        with make_vec_env(env_id, 8, 4, seed=seed) as env:
            env.async_reset()
            return np.concatenate([env.recv()[0], env.recv()[0]])

    for env_id in ["CartPole-v1", "fastrl.envs.toy:make_target"]:
        obs = reset_obs(env_id, seed=0)
        assert len(np.unique(obs, axis=0)) == 8
        np.testing.assert_array_equal(obs, reset_obs(env_id, seed=0))
        assert not np.array_equal(obs, reset_obs(env_id, seed=100))


def test_box_actions_are_clipped_to_bounds():
    with make_vec_env("fastrl.envs.toy:make_target", 4, 4, seed=0) as env:
        assert isinstance(env.action_space, gymnasium.spaces.Box)
        env.async_reset()
        target, *_, env_ids = env.recv()
        actions = np.array([[100.0], [-100.0], [0.25], [-3.0]])
        env.send(actions, env_ids)
        _, rewards, *_ = env.recv()
    clipped = np.array([[1.0], [-1.0], [0.25], [-1.0]])
    np.testing.assert_allclose(rewards, -((clipped - target) ** 2).sum(axis=1), rtol=1e-6)


def test_unknown_env_id_error_suggests_close_matches_and_factories():
    with pytest.raises(ValueError) as info:
        make_vec_env("CartPol-v1", 2, 2, seed=0)
    message = str(info.value)
    assert "\n" not in message
    assert "CartPole-v1" in message and "module:callable" in message
    with pytest.raises(ValueError, match="env.id 'no_such_module:make': cannot import 'no_such_module'"):
        make_vec_env("no_such_module:make", 2, 2, seed=0)
    with pytest.raises(ValueError, match="not a envpool id"):
        resolve_backend("ALE/Pong-v5", "envpool")


def test_backend_resolution_order():
    assert resolve_backend("CartPole-v1") == "envpool"
    assert resolve_backend("ALE/Pong-v5") == "gymnasium"
    assert resolve_backend(COUNTDOWN) == "factory"


@pytest.mark.parametrize("module, message", user_modules.BROKEN)
@pytest.mark.parametrize("backend", ["auto", "factory"])
def test_a_factory_module_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, module, message, backend):
    user_modules.install(tmp_path, monkeypatch)
    with pytest.raises(ValueError) as error:
        make_vec_env(f"{module}:fn", 2, 2, seed=0, backend=backend)
    text = str(error.value)
    assert text.startswith(f"env.id '{module}:fn': ") and message in text and "\n" not in text, text


def test_train_refuses_an_env_module_that_raises_at_import_in_one_line(tmp_path, monkeypatch, capsys):
    user_modules.install(tmp_path, monkeypatch)
    run_dir = tmp_path / "run"
    one_line_error(capsys, train_main(["--env", "fastrl_test_raises:fn", "--run-dir", str(run_dir), "--serial"]), 2,
                   "fastrl-train", "env.id 'fastrl_test_raises:fn': importing 'fastrl_test_raises' failed "
                                   "(RuntimeError: boom at import)")
    assert not (run_dir / "config.toml").exists()  # refused before the run began


def test_factory_must_return_a_gymnasium_env():
    with pytest.raises(ValueError, match="returned dict, not a gymnasium.Env: make it return the env"):
        make_vec_env("builtins:dict", 2, 2, seed=0)


@pytest.mark.parametrize("env_id, backend", [("CartPole-v1", "envpool"), ("CartPole-v1", "gymnasium"),
                                             (COUNTDOWN, "factory"), (COUNTDOWN_GYM_ID, "gymnasium")])
def test_an_env_kwarg_the_env_does_not_take_is_named_with_the_env(env_id, backend):
    with pytest.raises(ValueError, match=f"env.kwargs: '{env_id}' takes no argument 'lenght'; remove it"):
        make_vec_env(env_id, 2, 2, seed=0, backend=backend, env_kwargs={"lenght": 5})


def test_a_type_error_of_the_env_itself_is_not_taken_for_an_unknown_kwarg():
    with pytest.raises(TypeError):
        make_vec_env(COUNTDOWN, 2, 2, seed=0, env_kwargs={"length": "five"})


def pool_ios(env):
    return env._io if isinstance(env._io, list) else [env._io]


@pytest.mark.parametrize("env_id, async_mode, policy", [
    ("CartPole-v1", False, parity_policy),
    ("CartPole-v1", True, parity_policy),
    ("HalfCheetah-v5", False, lambda obs: np.tanh(obs[:, :6] * 3.0)),  # float64 Box actions
])
def test_envpool_direct_io_steps_as_envpools_public_calls(env_id, async_mode, policy):
    # DirectPoolIO skips envpool's Python wrapper; with the same seeds and actions every env's
    # stream (observations, rewards, terminations and time-limit truncations) must be the same.
    def streams(direct):
        with make_vec_env(env_id, 8, 4, seed=5, async_mode=async_mode, env_kwargs={"max_episode_steps": 25}) as env:
            ios = pool_ios(env)
            assert all(type(io) is DirectPoolIO for io in ios)
            if not direct:
                public = [_PublicPoolIO(io._pool) for io in ios]
                env._io = public if isinstance(env._io, list) else public[0]
            return run_steps(env, 120, policy)

    direct, public = streams(True), streams(False)
    assert any(trunc for stream in direct.values() for *_, trunc in stream)
    if env_id == "CartPole-v1":
        assert any(term for stream in direct.values() for _, _, term, _ in stream)
    for env in public:
        if async_mode:
            # Async envpool hands back whichever envs finish first: how many of the 120 batches
            # each env is in is a race (docs/reproducibility.md); its stream, step for step, is not.
            assert abs(len(direct[env]) - len(public[env])) <= 2 and min(len(direct[env]), len(public[env])) > 0
        else:
            assert len(direct[env]) == len(public[env]) > 0
        for got, want in zip(direct[env], public[env]):
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1:] == want[1:]


def test_envpool_pools_of_another_layout_keep_the_public_calls():
    # Cleaner's observation is a dict ("obs:grid", "obs:action_mask", ...): not the one "obs"
    # array DirectPoolIO reads.
    with make_vec_env("Cleaner-v0", 4, 4, seed=0) as env:
        assert [type(io) for io in pool_ios(env)] == [_PublicPoolIO]
    assert DirectPoolIO.of(object()) is None


def test_num_envs_must_be_a_multiple_of_batch_size():
    with pytest.raises(ValueError, match="multiple of batch_size"):
        make_vec_env(COUNTDOWN, 6, 4, seed=0)


def test_envpool_integer_box_actions_are_multidiscrete():
    # jumanji's Cleaner declares Box(0, 3, (3,), int32) (one move per agent) and a (3, 4) mask:
    # one categorical per component, which the per-component mask fits.
    with make_vec_env("Cleaner-v0", 4, 4, seed=0) as env:
        assert env.action_space == gymnasium.spaces.MultiDiscrete([4, 4, 4])
        env.async_reset()
        obs, _, _, _, env_ids = env.recv()
        legal = obs["action_mask"].astype(bool)  # [B, 3, 4]
        env.send(legal.argmax(-1).astype(np.int64), env_ids)
        _, rewards, terminated, _, _ = env.recv()
    assert rewards.shape == (4,) and not terminated.any()


def test_atari_defaults_match_envpool():
    config = envpool.make_spec("Pong-v5").config
    assert {key: getattr(config, key) for key in ENVPOOL_ATARI_DEFAULTS} == ENVPOOL_ATARI_DEFAULTS


@pytest.mark.parametrize("env_id", ["Pong-v5", "ALE/Pong-v5"])
def test_atari_time_limit_truncates_in_agent_steps(env_id):
    if env_id.startswith("ALE/"):
        pytest.importorskip("cv2", reason="Atari on gymnasium needs opencv-python-headless")
    kwargs = {"max_episode_steps": 4, "reward_clip": True}
    with make_vec_env(env_id, 1, 1, seed=0, env_kwargs=kwargs) as env:
        stream = run_steps(env, 7)[0]
    assert [(term, trunc) for *_, term, trunc in stream] == [(False, False)] * 4 + [
        (False, True),
        (False, False),
        (False, False),
    ]


def test_fault_injection_envs():
    env = make_raises_at(3)
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    with pytest.raises(RuntimeError, match="injected"):
        env.step(0)
    env = make_nan_obs(every=2)
    env.reset(seed=0)
    assert not np.isnan(env.step(0)[0]).any()
    assert np.isnan(env.step(0)[0]).all()
